"""A pruned float32 weight as its kept values and a bitmask: the decode step's `s32` layout.

A pruned weight's zeros cost a decode step as many bytes as its kept values when held as
float32 rows. In `s32` each row keeps only its nonzero values, in column order, and one bit a
column says which columns they are: at half the weights pruned, 4.125 bytes per two columns
instead of 8. The kernel (`templates/decode_rows.c`, `row_s32`) reads a row 8 columns at a
time: the mask byte says how many values follow and where they go (`vexpandps` with AVX-512,
a permute from a 256-entry table without), so the products are the dense row's, zeros skipped.

Layout: `values` (every row's kept values one after another, then `PAD` zeros so an 8-wide load
past the last row stays inside), `mask` (n, k / 8) uint8, bit b of byte j for column 8j + b,
`starts` (n + 1) int32, row i's first value at `values[starts[i]]`.

Example:
    >>> values, mask, starts = bitmask_rows(torch.tensor([[0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 3.0]]))
    >>> values[:2].tolist(), mask.tolist(), starts.tolist()
    ([2.0, 3.0], [[130]], [0, 2])
"""

from __future__ import annotations

import torch

PAD = 8  # zeros after the last value: a kernel's 8-float load at the last kept value stays in the tensor
COLUMNS = 8  # columns a mask byte covers
MAX_DENSITY = 0.8  # kept share up to which the bitmask rows are chosen over dense float32 rows (fewer bytes and
# cheap enough to expand; above it the dense rows' plain loads win)


def bitmask_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(values, mask, starts) of the (n, k) float32 `w`, k a multiple of 8 (module docstring).

    Example:
        >>> bitmask_rows(torch.zeros(2, 8))[2].tolist()
        [0, 0, 0]
    """
    n, k = w.shape
    if k % COLUMNS:
        raise ValueError(f"bitmask rows need a multiple of {COLUMNS} columns, got {k}")
    w = w.detach().float().contiguous()
    kept = w != 0
    weights = 1 << torch.arange(COLUMNS, dtype=torch.int32)
    mask = (kept.reshape(n, k // COLUMNS, COLUMNS).to(torch.int32) * weights).sum(dim=2).to(torch.uint8)
    starts = torch.zeros(n + 1, dtype=torch.int32)
    starts[1:] = kept.sum(dim=1).cumsum(0).to(torch.int32)
    values = torch.cat([w[kept], torch.zeros(PAD)])  # row-major order: each row's values in column order
    return values.contiguous(), mask.contiguous(), starts


def dense_rows(values: torch.Tensor, mask: torch.Tensor, starts: torch.Tensor, k: int) -> torch.Tensor:
    """The (n, k) float32 weight that `bitmask_rows` laid out.

    Example:
        >>> w = torch.tensor([[0.0, 1.5, 0.0, -2.0, 0.0, 0.0, 0.0, 0.0]])
        >>> torch.equal(dense_rows(*bitmask_rows(w), k=8), w)
        True
    """
    n = mask.shape[0]
    bits = (mask.to(torch.int32)[..., None] >> torch.arange(COLUMNS, dtype=torch.int32)) & 1
    kept = bits.reshape(n, k).bool()
    w = torch.zeros(n, k, dtype=torch.float32)
    w[kept] = values[: int(starts[-1])]
    return w


def density(w: torch.Tensor) -> float:
    """The share of nonzero values of `w`.

    Example:
        >>> density(torch.tensor([[0.0, 1.0]]))
        0.5
    """
    return float((w != 0).sum()) / max(w.numel(), 1)


def fits_bitmask(w: torch.Tensor) -> bool:
    """Whether the decode step reads `w` (n, k) as bitmask rows rather than dense float32 rows: k a multiple of
    8 and at most `MAX_DENSITY` of its values kept.

    Example:
        >>> fits_bitmask(torch.zeros(4, 16)), fits_bitmask(torch.ones(4, 16))
        (True, False)
    """
    return w.dim() == 2 and w.shape[1] % COLUMNS == 0 and density(w) <= MAX_DENSITY
