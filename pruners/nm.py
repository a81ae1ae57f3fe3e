"""N:M pruning: in every group of M consecutive input weights, keep the N largest |w|.

Groups run along the reduction dim of the GEMM view (out, in*kh*kw), as 2:4 sparse
tensor cores and our kernels expect. A ragged last group of r < M weights keeps min(N, r).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from sparta_explore.errors import ConfigError
from sparta_explore.pruners.registry import Masks, register_pruner
from sparta_explore.pruners.selection import as_matrix_shape, select_modules


@dataclass(frozen=True)
class NMPruneConfig:
    """Keep `n` of every `m` consecutive weights (2:4 by default).

    Example:
        >>> NMPruneConfig(1, 4).sparsity
        0.75
    """

    n: int = 2
    m: int = 4
    op_types: tuple[str, ...] = ("Linear", "Conv2d")
    op_names: tuple[str, ...] | None = None
    exclude_op_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not (isinstance(self.n, int) and isinstance(self.m, int) and 0 < self.n <= self.m):
            raise ConfigError(f"N:M needs integers 0 < n <= m, got n={self.n!r}, m={self.m!r}")

    @property
    def sparsity(self) -> float:
        return 1.0 - self.n / self.m


def nm_mask(weight: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """0/1 mask of `weight`'s shape keeping the `n` largest |w| of each group of `m`.

    Example:
        >>> nm_mask(torch.tensor([[4., 1., 3., 2.]]), 2, 4)
        tensor([[1., 0., 1., 0.]])
    """
    rows, cols = as_matrix_shape(weight.shape)
    groups = -(-cols // m)
    # padding scores -1 sit below every |w|, so they are chosen only in a ragged group, then cropped
    scores = torch.nn.functional.pad(weight.detach().reshape(rows, cols).abs().float(), (0, groups * m - cols),
                                     value=-1.0).reshape(rows, groups, m)
    top = scores.topk(n, dim=-1).indices
    keep = torch.zeros_like(scores).scatter_(-1, top, 1.0).reshape(rows, groups * m)[:, :cols]
    return keep.reshape(weight.shape).to(weight.dtype)


@register_pruner("nm", config_type=NMPruneConfig)
def nm_masks(model: nn.Module, config: NMPruneConfig, evaluator: object = None) -> Masks:
    """Masks ({module: {"weight": 0/1 tensor}}) with an N:M pattern on every selected weight.

    Example:
        >>> masks = nm_masks(model, NMPruneConfig(2, 4))  # doctest: +SKIP
    """
    modules = select_modules(model, config.op_types, config.op_names, config.exclude_op_names)
    return {name: {"weight": nm_mask(mod.weight, config.n, config.m)} for name, mod in modules.items()}
