"""K panels: the work of every row group cut at panel boundaries, so X's panel stays in L1.

Without panels a one-row group streams every x vector it uses from L2 (one vector per
FMA: at 32 B/cycle that caps it near half of peak). Processing all groups panel by panel
keeps the panel of the packed X tile in L1; accumulators go to the tile's output buffer
between panels (`first` starts from zero, `last` adds bias and activation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sparta_explore.kernels.bsr_codegen import Groups

ONE_WORD = 4  # entry flag beside 1 (first) and 2 (last): every piece is one word, so kernels run one flat loop
L1_BUDGET = 24 * 1024  # bytes of packed X per panel: most of a 32 KiB L1 data cache


@dataclass(frozen=True)
class Panels:
    """Entries (one per group and panel it touches) and their pieces of k."""

    rows: int              # k rows per panel
    e_group: np.ndarray    # group of each entry
    e_piece0: np.ndarray   # first piece of each entry
    e_piece1: np.ndarray   # one past its last piece
    e_woff: np.ndarray     # packed-weight offset of the entry's first k
    e_flags: np.ndarray    # 1: first entry of its group, 2: last, ONE_WORD: every piece is one word
    p_k0: np.ndarray       # first k of each piece
    p_len: np.ndarray      # k count of each piece
    e_ptr: np.ndarray      # [panel * (chunks + 1) + c]: first entry of panel with group >= chunk c's first
    count: int             # panels


def panel_rows(tile_bytes: int, word: int = 1) -> int:
    """k rows per panel for `tile_bytes` bytes of packed X per k (a multiple of `word`, at least 16).

    Example:
        >>> panel_rows(4 * 48), panel_rows(96, word=4)
        (128, 256)
    """
    return max(16, L1_BUDGET // tile_bytes // word * word)


def cut_panels(groups: Groups, n_in: int, rows: int, chunk_g0: list[int], word: int = 1) -> Panels:
    """Cut every group's segments at multiples of `rows`; entries ordered by (panel, group).

    `word` is how many k one packed weight holds (1 fp32, 2 int16 pairs, 4 int8 quads): weight
    offsets count words, `rows` must be a multiple of it so no word straddles two panels, and
    entries whose pieces are all one word are flagged `ONE_WORD` (kernels run them as one flat loop).

    Example:
        >>> from sparta_explore.kernels.bsr_codegen import plan_groups
        >>> cut_panels(plan_groups(np.ones((1, 8), dtype=bool), 1), 8, 4, [0], word=4).e_woff.tolist()
        [0, 1]
    """
    if rows % word:
        raise ValueError(f"panel rows {rows} must be a multiple of the packed word ({word} k)")
    n_panels = max(1, -(-n_in // rows))
    per_panel: list[list[tuple]] = [[] for _ in range(n_panels)]
    for g in range(len(groups.row0)):
        r, done = int(groups.rows[g]), 0
        by_panel: dict[int, list[tuple[int, int, int]]] = {}
        for s in range(int(groups.seg_ptr[g]), int(groups.seg_ptr[g + 1])):
            k0, left = int(groups.seg_k0[s]), int(groups.seg_len[s])
            while left > 0:
                p = k0 // rows
                length = min(left, (p + 1) * rows - k0)
                by_panel.setdefault(p, []).append((k0, length, int(groups.w_off[g]) + done // word * r))
                done += length
                k0 += length
                left -= length
        order = sorted(by_panel)
        for i, p in enumerate(order):
            one_word = all(length == word for _, length, _ in by_panel[p])
            flags = (1 if i == 0 else 0) | (2 if i == len(order) - 1 else 0) | (ONE_WORD if one_word else 0)
            per_panel[p].append((g, by_panel[p], flags))
    e_group, e_p0, e_p1, e_woff, e_flags, p_k0, p_len, e_ptr = [], [], [], [], [], [], [], []
    bounds = list(chunk_g0) + [len(groups.row0)]
    for entries in per_panel:
        start = len(e_group)
        groups_here = [g for g, _, _ in entries]
        e_ptr += [start + int(np.searchsorted(groups_here, b)) for b in bounds]
        for g, pieces, flags in entries:
            e_group.append(g)
            e_p0.append(len(p_k0))
            e_woff.append(pieces[0][2])
            e_flags.append(flags)
            for k0, length, _ in pieces:
                p_k0.append(k0)
                p_len.append(length)
            e_p1.append(len(p_k0))
    as_i = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
    return Panels(rows, as_i(e_group), as_i(e_p0), as_i(e_p1), as_i(e_woff), as_i(e_flags), as_i(p_k0),
                  as_i(p_len), as_i(e_ptr), n_panels)
