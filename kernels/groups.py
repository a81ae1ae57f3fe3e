"""Row groups and k segments of a weight pattern, and the packed-weight order kernels read them in.

Every kernel family starts here: the (N, K) kept mask becomes *row groups* (up to R rows of
one block row that share a k pattern) and each group's kept k's become contiguous
*segments*. All of it is array arithmetic over the whole mask at once: a BERT-base FFN
pattern has a quarter of a million segments, and a Python loop per segment cost seconds per
kernel build (the issue-27 compile-time breakdown: 40 of 55 s of one layer's builds).

Example:
    >>> g = plan_groups(np.array([[1, 1, 0, 1]], dtype=bool), 1)
    >>> g.seg_k0.tolist(), g.seg_len.tolist()
    ([0, 3], [2, 1])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

R_MAX = 4  # output rows per register tile (default)
SHORT_SEGMENTS = 8.0  # a group whose segments average fewer words than this gets one-word segments (see unit_segments)
ALWAYS_SHORT = 2.0  # ... and below this many, whatever `uniform` says


@dataclass(frozen=True)
class Groups:
    """Row groups and k segments of one sparsity pattern, plus the packed-weight offsets."""

    row0: np.ndarray      # first output row of each group
    rows: np.ndarray      # rows in each group (1..R_MAX)
    seg_ptr: np.ndarray   # group g's segments are seg_ptr[g]:seg_ptr[g+1]
    seg_k0: np.ndarray    # first k of each segment
    seg_len: np.ndarray   # k count of each segment
    w_off: np.ndarray     # offset of group g's packed weights

    def owners(self) -> np.ndarray:
        """The group of every segment."""
        return np.repeat(np.arange(len(self.row0), dtype=np.int64), np.diff(self.seg_ptr))


def _i64(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def _exclusive_cumsum(values: np.ndarray) -> np.ndarray:
    out = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(values, out=out[1:])
    return out


def runs(kept: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Contiguous runs of True in every row of a 2-D bool array: (row, start, length), row-major order.

    Example:
        >>> [a.tolist() for a in runs(np.array([[1, 1, 0, 1], [0, 0, 0, 0]], dtype=bool))]
        [[0, 0], [0, 3], [2, 1]]
    """
    kept = np.asarray(kept, dtype=bool)
    n, k = kept.shape
    if np.count_nonzero(kept) < SPARSE_RUNS * kept.size:
        return _sparse_runs(kept)
    padded = np.zeros((n, k + 2), dtype=np.int8)  # a False column each side: no run crosses into the next row
    padded[:, 1:-1] = kept
    # one pass: +1 where a run starts, -1 one past its end, alternating in row-major order
    edges = np.flatnonzero(np.diff(padded, axis=1))
    first, end = edges[0::2], edges[1::2]
    rows = first // (k + 1)
    return _i64(rows), _i64(first - rows * (k + 1)), _i64(end - first)


SPARSE_RUNS = 0.3  # below this share kept, `runs` walks the kept positions (90% unstructured 3072 x 768: 8.4 -> 4.6 ms)


def _sparse_runs(kept: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`runs` from the kept positions: a run starts where a position does not follow the last, or at a row's start."""
    k = kept.shape[1]
    at = np.flatnonzero(kept)
    new = np.ones(at.size, dtype=bool)
    new[1:] = (np.diff(at) != 1) | (at[1:] % k == 0)
    first = np.flatnonzero(new)
    start = at[first]
    rows = start // k
    return _i64(rows), _i64(start - rows * k), _i64(np.diff(np.append(first, at.size)))


def shared_rows(kept: np.ndarray, block_rows: int = 1, most: int = 32) -> int:
    """The block height to plan `kept` with: the largest power of two up to `most` (and at least `block_rows`)
    such that the rows of every aligned group of that many (the last one may be short) are alike.

    A planner may cover a 32x32 block pattern with 1x32 blocks (what its costs predicted); the kernel still runs
    faster knowing the rows agree: its row groups then never straddle two block rows (768 -> 3072 at 90% 32x32,
    M = 1024, fused GELU, Zen 5: 2.5 against 3.0 ms), and the tile search knows the few tilings that win.

    Example:
        >>> shared_rows(np.repeat(np.eye(4, dtype=bool), 8, axis=0)), shared_rows(np.eye(4, dtype=bool))
        (8, 1)
    """
    kept = np.asarray(kept, dtype=bool)
    height = 1
    while height < most and kept.shape[0] > height:
        # groups of `height` are uniform: groups of twice that are if each one's second half starts as its first
        wider = 2 * height
        second = kept[height::wider]
        if not np.array_equal(second, kept[::wider][:len(second)]):
            break
        height = wider
    return max(int(block_rows), height)


def _group_union(kept: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """(groups, K): the OR of each group's rows; rows gathered into a (groups, longest group, K) block, short groups
    padded with an empty row (one `any` over a regular array, 60x faster than `logical_or.reduceat`). Groups of
    one row each (one-row blocks) are their rows."""
    longest = int((ends - starts).max())
    if longest == 1:
        return kept if len(starts) == kept.shape[0] else kept[starts]  # every row a group: the mask itself, read only
    padded = np.zeros((kept.shape[0] + 1, kept.shape[1]), dtype=bool)
    padded[:-1] = kept
    index = starts[:, None] + np.arange(longest)[None, :]
    index = np.where(index < ends[:, None], index, kept.shape[0])  # past a group's end: the empty row
    return padded[index].any(axis=1)


def plan_groups(kept: np.ndarray, block_rows: int, max_rows: int = R_MAX) -> Groups:
    """Split the outputs into row groups of at most `max_rows` rows inside each block row.

    `kept` is the (N, K) bool mask of kept weights; rows of a group share the union of
    their kept columns (exact for block patterns, where rows of a block row agree). A group
    with no kept column is left out: its outputs are bias (or 0).

    Example:
        >>> g = plan_groups(np.eye(4, dtype=bool), 1)
        >>> g.rows.tolist(), g.seg_k0.tolist()
        ([1, 1, 1, 1], [0, 1, 2, 3])
    """
    kept = np.asarray(kept, dtype=bool)
    n = kept.shape[0]
    block_rows = max(1, block_rows)
    every = np.arange(n, dtype=np.int64)
    starts = every[(every % block_rows) % max_rows == 0]  # a group starts every max_rows rows of a block row
    if not len(starts):
        return Groups(*(_i64([]) for _ in range(2)), _i64([0]), _i64([]), _i64([]), _i64([]))
    ends = np.minimum(starts + max_rows, np.minimum((starts // block_rows + 1) * block_rows, n))
    union = _group_union(kept, starts, ends)
    live = union.any(axis=1)
    union, starts, ends = union[live], _i64(starts[live]), _i64(ends[live])
    rows = ends - starts
    owner, k0, length = runs(union)
    seg_ptr = _exclusive_cumsum(np.bincount(owner, minlength=len(starts)))
    w_off = _exclusive_cumsum(union.sum(axis=1) * rows)[:-1]
    return Groups(starts, rows, seg_ptr, k0, length, w_off)


def unit_segments(groups: Groups, unit: int, short: float = SHORT_SEGMENTS, uniform: float | None = None) -> Groups:
    """Each group whose segments average fewer than `short` words of `unit` k gets one segment per word.

    Same k, same packed weights, same offsets: only the loop shape changes. The inner loop
    of a tile then always runs once, which the branch predictor learns; on scattered
    patterns (segments of 1, 2 or 3 words in random order) its mispredicted exits cost more
    than the products (90% unstructured int8 at 3072 x 768, M = 4096, Zen 5: 31.5 -> 20.1 ms
    int16, 36.0 -> 18.0 ms VNNI; 75%: 93 -> 40 and 54 -> 30 ms). Long segments (block
    patterns) keep their tight inner loop. The cut at 8 words, not 2: at 50-80% sparsity the
    groups' runs average 2-8 words of varying length and mispredict as much (3072 x 768, M =
    4096, 2 threads, VNNI quads: 80% unstructured 49.5 -> 13.4 ms, 70% 41.9 -> 16.6, 1x4 blocks
    at 50% 20.0 -> 11.8, 1x8 at 50% 26.6 -> 11.6, 1x16 at 50% 16.9 -> 12.2; fp32, 50%
    unstructured 94 -> 78 ms, 1x4 at 90% in 4x3x3 K panels 14.0 -> 10.7; AVX2 int16 at 70% and
    50% 73 -> 30 and 88 -> 43 ms). `uniform` (int8: `UNIFORM_RUNS`): a group averaging 2 words or more
    whose segments share one length at least that often keeps its loop (1x8 and 1x16 int8 blocks at 90%
    were 5-10% slower one word at a time).

    Example:
        >>> g = plan_groups(np.array([[1, 1, 0, 1, 0, 0, 1, 0]], dtype=bool), 1)
        >>> g.seg_len.tolist(), unit_segments(g, 1).seg_len.tolist()
        ([2, 1, 1], [1, 1, 1, 1])
    """
    counts = np.diff(groups.seg_ptr)
    owner = groups.owners()
    totals = np.bincount(owner, weights=groups.seg_len, minlength=len(counts))
    split = (counts > 0) & (totals < short * unit * np.maximum(counts, 1))  # mean < short * unit, in integers
    if uniform is not None and len(owner):  # runs of one length loop predictably, unless 1-2 words (always split)
        shortest = totals < ALWAYS_SHORT * unit * np.maximum(counts, 1)
        split &= shortest | (_modal_share(owner, -(-groups.seg_len // unit), len(counts)) < uniform)
    seg_split = split[owner]
    pieces = np.where(seg_split, -(-groups.seg_len // unit), 1)
    first = _exclusive_cumsum(pieces)
    seg_of = np.repeat(np.arange(len(pieces)), pieces)
    step = np.arange(first[-1], dtype=np.int64) - first[:-1][seg_of]
    k0 = groups.seg_k0[seg_of] + np.where(seg_split[seg_of], step * unit, 0)
    length = np.where(seg_split[seg_of], unit, groups.seg_len[seg_of])
    seg_ptr = first[groups.seg_ptr]
    return Groups(groups.row0, groups.rows, _i64(seg_ptr), _i64(k0), _i64(length), groups.w_off)


def _modal_share(owner: np.ndarray, words: np.ndarray, n_groups: int) -> np.ndarray:
    """Per group, the share of its segments that have its most common length (0 for a group without any).

    Example:
        >>> _modal_share(np.array([0, 0, 0, 1]), np.array([2, 2, 5, 1]), 3).round(2).tolist()
        [0.67, 1.0, 0.0]
    """
    span = int(words.max()) + 1  # one key per (group, length)
    pairs, count = np.unique(owner * span + words, return_counts=True)
    best = np.zeros(n_groups, dtype=np.int64)
    np.maximum.at(best, pairs // span, count)
    return best / np.maximum(np.bincount(owner, minlength=n_groups), 1)


def align_segments(groups: Groups, multiple: int) -> Groups:
    """Segments widened to start and end on multiples of `multiple` k (extra k carry zero weights).

    Widened neighbours that now touch or overlap are merged, so no k is counted twice.

    Example:
        >>> g = align_segments(plan_groups(np.array([[0, 1, 0, 1, 0, 0, 0, 0]], dtype=bool), 1), 4)
        >>> g.seg_k0.tolist(), g.seg_len.tolist()
        ([0], [4])
    """
    owner = groups.owners()
    a = groups.seg_k0 // multiple * multiple
    b = -(-(groups.seg_k0 + groups.seg_len) // multiple) * multiple
    # segments are sorted in k inside a group, so widened ends only grow: one merges into the run before it
    # when it starts at or before that run's end (the running maximum of ends, reset at every group)
    group_start = np.zeros(len(a), dtype=bool)
    group_start[groups.seg_ptr[:-1][np.diff(groups.seg_ptr) > 0]] = True
    prev_end = np.concatenate([[0], b[:-1]])
    new_run = group_start | (a > prev_end)
    k0 = a[new_run]
    end = np.maximum.reduceat(b, np.flatnonzero(new_run)) if len(b) else _i64([])
    length = end - k0
    run_owner = owner[new_run]
    seg_ptr = _exclusive_cumsum(np.bincount(run_owner, minlength=len(groups.row0)))
    words = np.bincount(run_owner, weights=length // multiple, minlength=len(groups.row0)).astype(np.int64)
    w_off = _exclusive_cumsum(words * groups.rows)[:-1]
    return Groups(groups.row0, groups.rows, seg_ptr, _i64(k0), _i64(length), w_off)


def word_index(groups: Groups, word: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(row, k) of every packed word in kernel order: per group, per segment, per word of `word` k, per row.

    A word's k is its first; the kernel reads k .. k + word - 1 of that row.

    Example:
        >>> [a.tolist() for a in word_index(plan_groups(np.ones((2, 2), dtype=bool), 2))]
        [[0, 1, 0, 1], [0, 0, 1, 1]]
    """
    owner = groups.owners()
    r = groups.rows[owner]
    words = groups.seg_len // word
    if bool((words == 1).all()) and bool((r == 1).all()):  # one-row groups of one-word segments (scattered rows)
        return groups.row0[owner], groups.seg_k0.copy()
    seg_of_word = np.repeat(np.arange(len(words)), words)
    word_step = np.arange(seg_of_word.size, dtype=np.int64) - _exclusive_cumsum(words)[:-1][seg_of_word]
    word_k = groups.seg_k0[seg_of_word] + word_step * word
    per_word = r[seg_of_word]
    word_of_slot = np.repeat(np.arange(len(word_k)), per_word)
    row_step = np.arange(word_of_slot.size, dtype=np.int64) - _exclusive_cumsum(per_word)[:-1][word_of_slot]
    return groups.row0[owner][seg_of_word][word_of_slot] + row_step, word_k[word_of_slot]


def pack_weights(weight: np.ndarray, kept: np.ndarray, groups: Groups) -> np.ndarray:
    """Kept weights in kernel order: per group, per segment, per k, the group's rows (pruned -> 0).

    Example:
        >>> pack_weights(np.arange(4.0).reshape(2, 2), np.ones((2, 2), dtype=bool),
        ...              plan_groups(np.ones((2, 2), dtype=bool), 2)).tolist()
        [0.0, 2.0, 1.0, 3.0]
    """
    rows, ks = word_index(groups)
    if not rows.size:
        return np.zeros(1, dtype=np.float32)
    at = rows * kept.shape[1] + ks  # flat positions: one take per array (2-D fancy indexing gathered 2x slower)
    return np.where(np.take(kept, at), np.take(weight, at), 0.0).astype(np.float32)
