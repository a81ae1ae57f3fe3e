"""What one-shot compressors gather from a linear layer's calibration inputs.

SparseGPT and GPTQ need the input Hessian of the layer-wise squared error,
`H = 2/n sum_x x x^T` over the n calibration tokens; Wanda needs only its diagonal's
square root, the per-input-channel norms `||X_j||_2`.
"""

from __future__ import annotations

from typing import Protocol

import torch

from sparta_explore.errors import ConfigError

HESSIAN_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def hessian_dtype(name: str) -> torch.dtype:
    """The torch dtype for a config's `hessian_dtype` ("float32" or "float64").

    Example:
        >>> hessian_dtype("float64")
        torch.float64
    """
    if name not in HESSIAN_DTYPES:
        raise ConfigError(f"hessian_dtype must be one of {sorted(HESSIAN_DTYPES)}, got {name!r}")
    return HESSIAN_DTYPES[name]


class InputStatistic(Protocol):
    """Anything that accumulates a linear layer's inputs, `(..., in_features)`, one batch at a time."""

    def add(self, x: torch.Tensor) -> None: ...


class InputHessian:
    """The running `H = 2/n sum_x x x^T` over every calibration token seen so far.

    Kept as a running mean so its scale does not grow with the number of samples
    (dampening is relative to its mean diagonal anyway).

    Example:
        >>> h = InputHessian(2, torch.float64)
        >>> h.add(torch.tensor([[1.0, 0.0], [0.0, 2.0]]))
        >>> h.hessian
        tensor([[1., 0.],
                [0., 4.]], dtype=torch.float64)
    """

    def __init__(self, columns: int, dtype: torch.dtype = torch.float32, device: torch.device | None = None) -> None:
        self.hessian = torch.zeros(columns, columns, dtype=dtype, device=device)
        self.tokens = 0

    def add(self, x: torch.Tensor) -> None:
        x = x.detach().reshape(-1, x.shape[-1]).to(self.hessian.dtype)
        n = x.shape[0]
        self.hessian.mul_(self.tokens / (self.tokens + n))
        self.tokens += n
        x = x * (2.0 / self.tokens) ** 0.5
        self.hessian.addmm_(x.t(), x)


class InputChannelNorms:
    """Running mean of each input channel's squared value, `||X_j||^2 / n` (Wanda's statistic).

    Example:
        >>> s = InputChannelNorms(2)
        >>> s.add(torch.tensor([[3.0, 0.0], [4.0, 1.0]]))
        >>> s.norms
        tensor([3.5355, 0.7071])
    """

    def __init__(self, columns: int, device: torch.device | None = None) -> None:
        self.squares = torch.zeros(columns, dtype=torch.float64, device=device)
        self.tokens = 0

    def add(self, x: torch.Tensor) -> None:
        x = x.detach().reshape(-1, x.shape[-1]).to(torch.float64)
        n = x.shape[0]
        self.squares.mul_(self.tokens / (self.tokens + n))
        self.tokens += n
        self.squares.add_(x.square().sum(0) / self.tokens)

    @property
    def norms(self) -> torch.Tensor:
        """`||X_j||_2` per input channel (normalised by the token count), float32."""
        return self.squares.sqrt().float()

    def scores(self, weight: torch.Tensor) -> torch.Tensor:
        """Wanda's score of each weight of an (out, in) matrix: `|W_ij| * ||X_j||_2`.

        Example:
            >>> s = InputChannelNorms(2)
            >>> s.add(torch.tensor([[1.0, 10.0]]))
            >>> s.scores(torch.tensor([[2.0, -1.0]]))
            tensor([[ 2., 10.]])
        """
        return weight.detach().abs().float() * self.norms.to(weight.device)
