"""Which blocks of a kept mask hold anything: the block grid a TeSA reports for block-sparse kernels."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sparta_explore.errors import TeSAShapeError


def kept_block_mask(kept: torch.Tensor, block: Sequence[int], shape: tuple[int, ...]) -> torch.Tensor:
    """bool tensor over the block grid of `kept`'s trailing dims: True where a block holds a kept element.

    Leading dims are independent rows of blocks; ragged edges form smaller blocks. `shape` names
    the TeSA in errors.

    Example:
        >>> kept_block_mask(torch.eye(4, dtype=torch.bool), (2, 2), (4, 4))
        tensor([[ True, False],
                [False,  True]])
    """
    block = tuple(int(b) for b in block)
    nd = len(block)
    if nd == 0 or nd > kept.dim() or any(b < 1 for b in block):
        raise TeSAShapeError(
            f"block {block} does not fit a TeSA of shape {shape}: need 1..{kept.dim()} "
            "positive sizes for the trailing dims")
    lead, tail = kept.shape[: kept.dim() - nd], kept.shape[kept.dim() - nd:]
    grid = tuple(-(-s // b) for s, b in zip(tail, block))
    pad = []
    for s, b, g in reversed(list(zip(tail, block, grid))):
        pad += [0, g * b - s]
    padded = torch.nn.functional.pad(kept.to(torch.uint8), pad) if any(pad) else kept.to(torch.uint8)
    split = list(lead)
    for g, b in zip(grid, block):
        split += [g, b]
    view = padded.reshape(split)
    block_dims = tuple(len(lead) + 2 * i + 1 for i in range(nd))
    return view.amax(dim=block_dims).bool() if view.numel() else torch.zeros(lead + grid, dtype=torch.bool)
