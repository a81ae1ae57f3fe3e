"""BitRounding: every kept element's bits rounded up to a width the device runs.

A TeSA may ask for any width (3 bits here, 12 there); kernels exist for a few (8 and 32
on this machine). Rounding up never loses accuracy. When a tensor's elements round to
more than one width, two options exist: run everything at the widest (one sub-tensor)
or split it into one sub-tensor per width (each runs at its own, cheaper, width).

Example:
    >>> bits = torch.tensor([[0, 3, 12], [8, 8, 32]], dtype=torch.uint8)
    >>> [(o.name, sorted(o.parts)) for o in bit_options(bits, (8, 32))]
    [('uniform', [32]), ('split', [8, 32])]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from sparta_explore.compact import any_true

MIN_GRID_BITS = 2  # the narrowest symmetric integer grid the kernels run (levels -1, 0, 1)


def floor_bits(bits: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """Kept widths below the narrowest grid raised to it (1 -> 2); whether anything was raised.

    A 1-bit TeSA (BNN's +-1 weights) has no symmetric grid with a zero; the 2-bit grid holds
    +-scale exactly, so rounding up keeps binarized weights as they are.

    Example:
        >>> b, raised = floor_bits(torch.tensor([0, 1, 8], dtype=torch.uint8))
        >>> b.tolist(), raised
        ([0, 2, 8], True)
    """
    low = (bits > 0) & (bits < MIN_GRID_BITS)
    if not bool(any_true(low)):
        return bits, False
    return torch.where(low, torch.tensor(MIN_GRID_BITS, dtype=bits.dtype), bits), True


def round_bits(bits: torch.Tensor, widths: Sequence[int]) -> torch.Tensor:
    """Each element's bits rounded up to the narrowest of `widths` holding it; 0 (pruned) stays 0.

    Example:
        >>> round_bits(torch.tensor([0, 1, 8, 9, 32], dtype=torch.uint8), (8, 32)).tolist()
        [0, 8, 8, 32, 32]
    """
    ws = sorted(int(w) for w in widths)
    if not ws:
        raise ValueError("round_bits needs at least one width")
    top = int(bits.max()) if bits.numel() else 0
    if top > ws[-1]:
        raise ValueError(f"bits {top} exceed every width the device runs {tuple(ws)}")
    out = torch.zeros_like(bits)
    for w in reversed(ws):  # narrowest last, so it wins where it fits
        out = torch.where((bits > 0) & (bits <= w), torch.tensor(w, dtype=bits.dtype), out)
    return out


@dataclass(frozen=True)
class BitOption:
    """One way to run a tensor: `parts[width]` is the bool mask of elements run at that width.

    `grid[width]` is the finest grid actually needed inside the part (e.g. 4 for a part of
    4-bit weights run by the 8-bit kernels), so the kernels quantize exactly as asked.
    """

    name: str
    parts: dict[int, torch.Tensor] = field(hash=False)
    grid: dict[int, int] = field(hash=False)


def bit_options(bits: torch.Tensor, widths: Sequence[int], *, kept: torch.Tensor | None = None,
                span: tuple[int, int] | None = None) -> list[BitOption]:
    """'uniform' (all kept at the widest rounded width) and, when widths differ, 'split'. `kept` (`bits > 0`) and
    `span` (the narrowest and widest kept bits), where the caller knows them, save passes over `bits`.

    Example:
        >>> [o.name for o in bit_options(torch.full((2, 2), 8, dtype=torch.uint8), (8, 32))]
        ['uniform']
    """
    kept = bits > 0 if kept is None else kept
    if span is None and not bool(any_true(kept)):
        top = max(int(w) for w in widths)
        return [BitOption("uniform", {top: kept}, {top: top})]
    # the narrowest and widest kept bits decide whether widths differ: a few byte passes, where rounding every
    # element and sorting the kept ones was a third of planning a w8a8 BERT-base
    low, high = span if span is not None else \
        (int(torch.where(kept, bits, torch.iinfo(bits.dtype).max).min()), int(bits.max()))
    edges = round_bits(torch.tensor([low, high], dtype=bits.dtype), widths).tolist()
    options = [BitOption("uniform", {edges[1]: kept}, {edges[1]: high})]
    if edges[0] != edges[1]:
        rounded = round_bits(bits, widths)
        parts = {w: rounded == w for w in sorted({int(w) for w in widths}) if edges[0] <= w <= edges[1]}
        parts = {w: m for w, m in parts.items() if bool(any_true(m))}
        grid = {w: int(bits[m].max()) for w, m in parts.items()}
        options.append(BitOption("split", parts, grid))
    return options
