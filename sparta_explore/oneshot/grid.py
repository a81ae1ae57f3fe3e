"""Uniform integer grids per group of input columns: what GPTQ (and SparseGPT's joint quantization) round onto.

A weight row's group of `group_size` consecutive input columns shares one grid,
`scale * (q - zero)` with integer codes `q` in `0 .. 2^bits - 1`. Symmetric grids put the
zero point in the middle, `2^(bits-1)`; asymmetric ones fit min..max (both always hold 0,
so a pruned weight stays exactly 0 once quantized).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sparta_explore.errors import ConfigError


@dataclass(frozen=True)
class QuantSpec:
    """How to quantize a weight: `bits` (2..8), `group_size` input columns per grid (None: a row), `sym`.

    Example:
        >>> QuantSpec(4, 128).maxq
        15
    """

    bits: int
    group_size: int | None = None
    sym: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.bits, int) or isinstance(self.bits, bool) or not 2 <= self.bits <= 8:
            raise ConfigError(f"bits must be an int in 2..8, got {self.bits!r}")
        if self.group_size is not None and (not isinstance(self.group_size, int) or self.group_size < 1):
            raise ConfigError(f"group_size must be a positive int or None (one group per row), got "
                              f"{self.group_size!r}")

    @property
    def maxq(self) -> int:
        """The largest code, 2^bits - 1."""
        return 2 ** self.bits - 1

    def groups(self, columns: int) -> int:
        """How many groups an input width of `columns` has."""
        return 1 if self.group_size is None else columns // self.group_size

    def check_fits(self, columns: int, name: str) -> None:
        """A `ConfigError` naming layer `name` unless `group_size` divides its input width."""
        if self.group_size is not None and columns % self.group_size:
            raise ConfigError(f"group_size={self.group_size} does not divide the input width {columns} of "
                              f"{name!r}; choose a divisor of it (or group_size=None, one group per row)")


def fit_grid(w: torch.Tensor, spec: QuantSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (scale, zero) of the min-max grid over the columns of `w`, (rows, cols).

    The range always holds 0. A row of zeros gets the range [-1, 1], so its scale is not 0.

    Example:
        >>> scale, zero = fit_grid(torch.tensor([[-1.0, 0.5, 2.0]]), QuantSpec(2))
        >>> scale, zero
        (tensor([1.]), tensor([1.]))
    """
    xmin = w.min(dim=1).values.clamp(max=0)
    xmax = w.max(dim=1).values.clamp(min=0)
    if spec.sym:
        xmax = torch.maximum(xmin.abs(), xmax)
        xmin = -xmax
    empty = (xmin == 0) & (xmax == 0)
    xmin = torch.where(empty, -torch.ones_like(xmin), xmin)
    xmax = torch.where(empty, torch.ones_like(xmax), xmax)
    scale = (xmax - xmin) / spec.maxq
    zero = torch.full_like(scale, (spec.maxq + 1) / 2) if spec.sym else torch.round(-xmin / scale)
    return scale, zero


def quantize_to_grid(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, maxq: int) -> torch.Tensor:
    """`w` rounded to its grid and de-quantized: `scale * (clamp(round(w / scale) + zero, 0, maxq) - zero)`.

    `scale` and `zero` broadcast against `w` (per row: shape (rows, 1) for an (rows, k) `w`).

    Example:
        >>> quantize_to_grid(torch.tensor([0.4, 0.6, 9.0]), torch.tensor(0.5), torch.tensor(1.0), 3)
        tensor([0.5000, 0.5000, 1.0000])
    """
    q = torch.clamp(torch.round(w / scale) + zero, 0, maxq)
    return scale * (q - zero)


@dataclass(frozen=True)
class GroupGrid:
    """The grids of one quantized (out, in) weight: `scale` and `zero` are (out, groups).

    Group g covers input columns `g * group_size .. (g + 1) * group_size` in the weight's own
    column order (GPTQ's activation order never scatters a group). `codes(w)` gives the
    integer codes, `dequantize(codes)` the weight back; a weight on its grids round-trips.

    Example:
        >>> g = GroupGrid(torch.tensor([[0.5]]), torch.tensor([[1.0]]), bits=2, group_size=2, sym=False)
        >>> g.codes(torch.tensor([[0.5, -0.5]]))
        tensor([[2, 0]], dtype=torch.uint8)
        >>> g.dequantize(g.codes(torch.tensor([[0.5, -0.5]])))
        tensor([[ 0.5000, -0.5000]])
    """

    scale: torch.Tensor
    zero: torch.Tensor
    bits: int
    group_size: int
    sym: bool

    @property
    def maxq(self) -> int:
        """The largest code, 2^bits - 1."""
        return 2 ** self.bits - 1

    def _expand(self, t: torch.Tensor) -> torch.Tensor:
        return t.repeat_interleave(self.group_size, dim=1)

    def codes(self, weight: torch.Tensor) -> torch.Tensor:
        """The integer codes (uint8) of an (out, in) weight on these grids."""
        scale, zero = self._expand(self.scale), self._expand(self.zero)
        q = torch.clamp(torch.round(weight.to(scale.dtype) / scale) + zero, 0, self.maxq)
        return q.to(torch.uint8)

    def dequantize(self, codes: torch.Tensor) -> torch.Tensor:
        """The weight the codes stand for: `scale * (codes - zero)` per group."""
        return self._expand(self.scale) * (codes.to(self.scale.dtype) - self._expand(self.zero))
