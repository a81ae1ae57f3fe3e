"""N:M pruning: in every group of M consecutive input weights, keep the N largest |w|.

Groups run along the reduction dim of the GEMM view (out, in*kh*kw), as 2:4 sparse
tensor cores and our kernels expect. A ragged last group of r < M weights keeps min(N, r).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from sparta_explore.errors import ConfigError
from sparta_explore.prunable import PRUNABLE_OP_TYPES
from sparta_explore.pruners.registry import Masks, PruneRequest, register_pruner
from sparta_explore.pruners.selection import as_matrix_shape, gemm_weight, select_modules, stored_mask


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


def nm_configs(request: PruneRequest, model: nn.Module) -> list[NMPruneConfig]:
    """N:M configs for a trial's request: m from `block` (1, m) (default 4), n = m * (1 - sparsity) per group.

    Example:
        >>> [(c.n, c.m) for c in nm_configs(PruneRequest(0.5, ("a",), block=(1, 4)), None)]
        [(2, 4)]
    """
    if request.scope == "global":
        raise ConfigError("N:M pruning keeps n of every m weights in each layer: it has no global scope")
    m = request.block[1] if request.block is not None else 4
    out = []
    for sparsity, layers in request.groups():
        n = m * (1.0 - sparsity)
        if abs(n - round(n)) > 1e-9 or round(n) < 1:
            raise ConfigError(f"N:M pruning keeps n of every m={m} weights: sparsity {sparsity} gives n={n:g}, "
                              "not a positive integer (block=(1, m) sets m)")
        if round(n) < m:
            out.append(NMPruneConfig(round(n), m, op_types=PRUNABLE_OP_TYPES, op_names=layers))
    return out


@register_pruner("nm", config_type=NMPruneConfig, from_request=nm_configs)
def nm_masks(model: nn.Module, config: NMPruneConfig, evaluator: object = None) -> Masks:
    """Masks ({module: {"weight": 0/1 tensor}}) with an N:M pattern on every selected weight.

    Example:
        >>> masks = nm_masks(model, NMPruneConfig(2, 4))  # doctest: +SKIP
    """
    modules = select_modules(model, config.op_types, config.op_names, config.exclude_op_names)
    return {name: {"weight": stored_mask(mod, nm_mask(gemm_weight(mod), config.n, config.m))}
            for name, mod in modules.items()}
