"""Scattered patterns (unstructured sparsity) laid out in one pass: the tables the general path makes, sooner.

On a scattered pattern every row is its own group and every kept weight its own one-k segment
(`unit_segments`), and K panels then order each panel's entries by length (`by_length`). The
general path gets there through multi-row groups, runs, a stable sort by panel and two rounds
of gathers: about 22 ms per BERT-base FFN weight at 90%, 0.85 s of a 72-op compile (issue 27).
Here the same tables come from counts per (row, panel): one flat scan of the mask, then one
scatter of the kept k's into their place, with no sort over the kept weights. Both functions
return exactly what the general path returns (tests compare every array), or None where the
pattern is not scattered, and the caller then takes the general path.

Example:
    >>> kept = np.array([[1, 0, 1, 0], [0, 0, 0, 0], [0, 1, 0, 0]], dtype=bool)
    >>> g = scattered_groups(kept, 8.0)
    >>> g.row0.tolist(), g.seg_k0.tolist(), g.seg_ptr.tolist()
    ([0, 2], [0, 2, 1], [0, 2, 3])
"""

from __future__ import annotations

import numpy as np

from sparta_explore.kernels.groups import Groups, _exclusive_cumsum
from sparta_explore.kernels.panels import ONE_WORD, Panels


def scattered_groups(kept: np.ndarray, short: float) -> Groups | None:
    """`unit_segments(plan_groups(kept, 1), 1, short)` where that splits every row (each row's runs of kept k average
    fewer than `short`), else None: one-row groups of the non-empty rows, one segment per kept k.

    Example:
        >>> scattered_groups(np.ones((2, 16), dtype=bool), 8.0) is None   # one run of 16 a row keeps its loop
        True
    """
    kept = np.asarray(kept, dtype=bool)
    n, k = kept.shape
    at = np.flatnonzero(kept)
    row = at // k
    counts = np.bincount(row, minlength=n)
    starts = np.ones(at.size, dtype=bool)  # a run starts where a kept k does not follow the last, or a row starts
    starts[1:] = (np.diff(at) != 1) | (at[1:] - row[1:] * k == 0)
    runs = np.bincount(row[starts], minlength=n)
    live = np.flatnonzero(counts)
    # unit_segments splits a group when its k count < short * its runs (one word = one k here)
    if not bool((counts[live] < short * runs[live]).all()):
        return None
    seg_ptr = _exclusive_cumsum(counts[live])
    ones = np.ones(at.size, dtype=np.int64)
    return Groups(live.astype(np.int64), np.ones(live.size, dtype=np.int64), seg_ptr, at - row * k, ones, seg_ptr[:-1])


def is_scattered(groups: Groups) -> bool:
    """Whether every group is one row and every segment one k (what `scattered_groups` returns).

    Example:
        >>> is_scattered(scattered_groups(np.eye(3, dtype=bool), 8.0))
        True
    """
    return bool((groups.rows == 1).all()) and bool((groups.seg_len == 1).all())


def scattered_panels(groups: Groups, n_in: int, rows: int, chunk_g0: list[int]) -> tuple[Panels, np.ndarray]:
    """`by_length(cut_panels(groups, n_in, rows, chunk_g0), chunk_g0, groups.rows)` for scattered groups
    (`is_scattered`): entries ordered by (panel, chunk, piece count, group), pieces and words in that order.

    Counting sort: a piece's place is its entry's start in the new order plus its rank among its entry's pieces,
    which in row-major order are consecutive (one row, one panel, k ascending).

    Example:
        >>> g = scattered_groups(np.array([[1, 0, 1, 0, 1, 0], [0, 0, 0, 1, 0, 0]], dtype=bool), 8.0)
        >>> p, index = scattered_panels(g, 6, 6, [0])
        >>> p.e_group.tolist(), p.p_k0.tolist(), index.tolist()
        ([1, 0], [3, 0, 2, 4], [3, 0, 1, 2])
    """
    n_groups = len(groups.row0)
    n_panels = max(1, -(-n_in // rows))
    n_pieces = len(groups.seg_k0)
    owner = np.repeat(np.arange(n_groups, dtype=np.int64), np.diff(groups.seg_ptr))
    panel = groups.seg_k0 // rows
    cell = owner * n_panels + panel  # (group, panel): non-decreasing in row-major order
    counts = np.bincount(cell, minlength=n_groups * n_panels).reshape(n_groups, n_panels)
    first_in_cell = _exclusive_cumsum(counts.reshape(-1))[:-1]
    # entries: the (group, panel) cells with pieces, ordered by panel, chunk, piece count, then group
    e_panel, e_group = np.nonzero(counts.T)
    e_count = counts[e_group, e_panel]
    chunk = np.searchsorted(np.asarray(chunk_g0, dtype=np.int64), e_group, side="right") - 1
    order = np.lexsort((e_group, e_count, chunk, e_panel))
    e_panel, e_group, e_count, chunk = e_panel[order], e_group[order], e_count[order], chunk[order]
    e_start = _exclusive_cumsum(e_count)
    new_start = np.zeros(n_groups * n_panels, dtype=np.int64)
    new_start[e_group * n_panels + e_panel] = e_start[:-1]
    dest = new_start[cell] + np.arange(n_pieces, dtype=np.int64) - first_in_cell[cell]
    p_k0 = np.empty(n_pieces, dtype=np.int64)
    p_k0[dest] = groups.seg_k0
    word_order = np.empty(n_pieces, dtype=np.int64)
    word_order[dest] = np.arange(n_pieces, dtype=np.int64)  # a piece is one word, in groups' order its segment's
    has = counts > 0  # first and last panel a group has pieces in
    lo = np.argmax(has, axis=1)
    hi = n_panels - 1 - np.argmax(has[:, ::-1], axis=1)
    e_flags = ((e_panel == lo[e_group]) * 1 | (e_panel == hi[e_group]) * 2 | ONE_WORD).astype(np.int64)
    per_panel = len(chunk_g0) + 1
    e_ptr = np.searchsorted(e_panel * per_panel + chunk, np.arange(n_panels * per_panel, dtype=np.int64))
    piece0 = e_start[:-1]  # one word per piece: an entry's first piece is its first word too
    return Panels(rows, e_group.astype(np.int64), piece0.copy(), e_start[1:].copy(), piece0.copy(), e_flags, p_k0,
                  np.ones(n_pieces, dtype=np.int64), e_ptr.astype(np.int64), n_panels), word_order
