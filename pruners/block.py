"""Block-magnitude pruning: drop whole blocks of a weight with the smallest mean |w|.

NNI has no block pruner; SparTA's kernels need block patterns (32x32, 1x32, ...). Weights
are seen as GEMM matrices (out, in*kh*kw), the layout the kernels run; edge blocks that do
not fill a whole block are scored on their real elements only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from sparta_explore.errors import ConfigError
from sparta_explore.prunable import PRUNABLE_OP_TYPES
from sparta_explore.pruners.registry import Masks, PruneRequest, register_pruner
from sparta_explore.pruners.selection import as_matrix_shape, gemm_weight, select_modules, stored_mask


@dataclass(frozen=True)
class BlockPruneConfig:
    """Prune `sparsity` of each selected weight's blocks (or of all blocks, scope="global").

    Example:
        >>> BlockPruneConfig(sparsity=0.9, block=(1, 32)).block
        (1, 32)
    """

    sparsity: float
    block: tuple[int, int] = (32, 32)
    op_types: tuple[str, ...] = ("Linear", "Conv2d")
    op_names: tuple[str, ...] | None = None
    exclude_op_names: tuple[str, ...] = ()
    scope: str = "layer"

    def __post_init__(self) -> None:
        if not 0.0 <= self.sparsity < 1.0:
            raise ConfigError(f"sparsity must be in [0, 1), got {self.sparsity}")
        if len(self.block) != 2 or any(int(b) < 1 for b in self.block):
            raise ConfigError(f"block must be two positive sizes (rows, cols), got {self.block}")
        if self.scope not in ("layer", "global"):
            raise ConfigError(f"scope must be 'layer' or 'global', got {self.scope!r}")
        object.__setattr__(self, "block", tuple(int(b) for b in self.block))


def block_scores(weight: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """Mean |w| of each block of the GEMM view of `weight`, shape (rows/br, cols/bc) rounded up.

    Example:
        >>> block_scores(torch.ones(4, 6), (2, 4))
        tensor([[1., 1.],
                [1., 1.]])
    """
    rows, cols = as_matrix_shape(weight.shape)
    br, bc = block
    gr, gc = -(-rows // br), -(-cols // bc)
    w = weight.detach().reshape(rows, cols).abs().float()
    pad = (0, gc * bc - cols, 0, gr * br - rows)
    sums = torch.nn.functional.pad(w, pad).reshape(gr, br, gc, bc).sum(dim=(1, 3))
    ones = torch.nn.functional.pad(torch.ones_like(w), pad).reshape(gr, br, gc, bc).sum(dim=(1, 3))
    return sums / ones


def expand_blocks(keep: torch.Tensor, block: tuple[int, int], shape: torch.Size) -> torch.Tensor:
    """Element mask of `shape` from a block grid mask (crops ragged edges)."""
    rows, cols = as_matrix_shape(shape)
    full = keep.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
    return full[:rows, :cols].reshape(shape)


def _keep_lowest_dropped(scores: torch.Tensor, n_prune: int) -> torch.Tensor:
    """All True but the `n_prune` lowest scores; ties at the threshold drop by position (a stable sort's order).

    The threshold is a selection, not a sort: BERT-base's 72 linears took 8 s to sort, 0.2 s to select.

    Example:
        >>> _keep_lowest_dropped(torch.tensor([3.0, 1.0, 1.0, 2.0, 1.0]), 2).tolist()
        [True, False, False, True, True]
    """
    flat = scores.detach().flatten().cpu()
    keep = torch.ones(flat.numel(), dtype=torch.bool)
    if n_prune <= 0:
        return keep.reshape(scores.shape)
    if n_prune >= flat.numel():
        return torch.zeros_like(keep).reshape(scores.shape)
    threshold = float(np.partition(flat.numpy(), n_prune - 1)[n_prune - 1])
    if math.isnan(threshold):  # fewer numbers than drops: NaNs drop too, after every number, by position
        keep[torch.sort(flat, stable=True).indices[:n_prune]] = False
        return keep.reshape(scores.shape)
    below = flat < threshold
    ties = torch.nonzero(flat == threshold).flatten()[:n_prune - int(below.sum())]
    keep[below] = False
    keep[ties] = False
    return keep.reshape(scores.shape)


def block_configs(request: PruneRequest, model: nn.Module) -> list[BlockPruneConfig]:
    """The block pruner's configs for a trial's request: one per sparsity group (or one global ranking).

    Example:
        >>> [c.sparsity for c in block_configs(PruneRequest(0.5, ("a", "b"), (("b", 0.9),), block=(1, 4)), None)]
        [0.5, 0.9]
    """
    if request.block is None:
        raise ConfigError("the block pruner needs a block shape (block=None asks for the pruner's default)")
    if request.scope == "global":
        return [BlockPruneConfig(request.sparsity, request.block, op_types=PRUNABLE_OP_TYPES, op_names=request.layers,
                                 scope="global")]
    return [BlockPruneConfig(s, request.block, op_types=PRUNABLE_OP_TYPES, op_names=layers)
            for s, layers in request.groups()]


@register_pruner("block", config_type=BlockPruneConfig, from_request=block_configs)
def block_magnitude_masks(model: nn.Module, config: BlockPruneConfig, evaluator: object = None) -> Masks:
    """Masks ({module: {"weight": 0/1 tensor}}) that drop the lowest-magnitude blocks.

    Example:
        >>> masks = block_magnitude_masks(model, BlockPruneConfig(0.75, (16, 16)))  # doctest: +SKIP
    """
    modules = select_modules(model, config.op_types, config.op_names, config.exclude_op_names)
    weights = {name: gemm_weight(m) for name, m in modules.items()}  # Conv1D: transposed to (out, in)
    scores = {name: block_scores(w, config.block) for name, w in weights.items()}
    if config.scope == "global":
        flat = torch.cat([s.flatten() for s in scores.values()])
        keep_flat = _keep_lowest_dropped(flat, round(config.sparsity * flat.numel()))
        keeps, start = {}, 0
        for name, s in scores.items():
            keeps[name] = keep_flat[start:start + s.numel()].reshape(s.shape)
            start += s.numel()
    else:
        keeps = {name: _keep_lowest_dropped(s, round(config.sparsity * s.numel())) for name, s in scores.items()}
    return {name: {"weight": stored_mask(m, expand_blocks(keeps[name], config.block, weights[name].shape)
                                         .to(m.weight.dtype))} for name, m in modules.items()}
