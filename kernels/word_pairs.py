"""Scattered one-row entries read each kept weight beside its X offset: one 8-byte load per kept weight.

A one-row tile over a scattered entry (every piece one k, `panels.ONE_WORD`) loaded, per kept
weight, its int32 offset into packed X (`P_X`), the weight (a broadcast from memory) and the
tile's vectors of X. The loop is bound by load issue (fp32 FMAs take their X vector from
memory), so here the offset and the weight come as one 64-bit word of the kernel's weight
array: the offset in the low half, the weight's bits in the high half, split in registers.
In a C model of the loop on Zen 4 (one row, three 16-float vectors, 48 KiB of X) that ran
2.57 -> 2.97 FMAs a nanosecond.

`pair_offsets` rewrites a kernel's tables for that: every such entry's words become (offset,
weight) pairs at an even offset of the weight array (`E_WOFF`), its pieces leave `P_X` and
`P_LEN` (its `E_P0`, `E_P1` keep only their difference, the piece count), and every other
entry keeps its words, padded to an even count. The returned `WordMap` says where each word of
the new array comes from: the old array's word `gather[i]`, or the int32 `fill[i]` (an offset,
or zero padding) where `gather[i]` is -1. Where every entry pairs and piece p's weight is word p
(unstructured patterns), `Interleaved` says the same without index arrays.

Example:
    >>> from sparta_explore.kernels.panels import Panels
    >>> p = Panels(rows=4, e_group=np.array([0]), e_piece0=np.array([0]), e_piece1=np.array([2]),
    ...            e_woff=np.array([0]), e_flags=np.array([7]), p_k0=np.array([1, 3]), p_len=np.array([1, 1]),
    ...            e_ptr=np.array([0, 1]), count=1)
    >>> new, p_x, words = pair_offsets(p, np.array([1]), np.array([8, 24], dtype=np.int32))
    >>> w = words.apply(np.array([0.5, 0.25], np.float32))
    >>> w[0::2].view(np.int32).tolist(), w[1::2].tolist(), p_x.size, new.e_piece1.tolist()
    ([8, 24], [0.5, 0.25], 0, [2])
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from sparta_explore.kernels.groups import _exclusive_cumsum
from sparta_explore.kernels.panels import ONE_WORD, Panels


@dataclass(frozen=True)
class WordMap:
    """Word i of a kernel's weight array: the packed word `gather[i]`, or the int32 bits `fill[i]` where that is -1
    (no `fill`: a reordering only, every `gather[i]` a word)."""

    gather: np.ndarray  # int64
    fill: np.ndarray | None = None  # int32

    def apply(self, words: np.ndarray) -> np.ndarray:
        """The kernel's float32 weight array from the words it would read without pairs.

        Example:
            >>> WordMap(np.array([-1, 0]), np.array([5, 0], dtype=np.int32)).apply(np.array([2.5], np.float32))[1]
            np.float32(2.5)
        """
        if self.fill is None:
            return words.take(self.gather)
        out = words.take(np.maximum(self.gather, 0)) if words.size else np.zeros(self.gather.size, np.float32)
        np.copyto(out, self.fill.view(np.float32), where=self.gather < 0)
        return out

    def composed(self, order: np.ndarray | None) -> WordMap:
        """This map over words that were themselves `packed[order]`: a map straight from `packed`."""
        if order is None or not order.size:
            return self
        return WordMap(np.where(self.gather < 0, -1, order[np.maximum(self.gather, 0)]), self.fill)


@dataclass(frozen=True)
class Interleaved:
    """Every entry paired and its words where its pieces are (unstructured patterns): word 2i is the int32
    `offsets[i]`, word 2i + 1 the word `order[i]` (word i where None). `WordMap`'s interface, without its
    index arrays: a BERT-base FFN weight's layout took 7 ms more through them.

    Example:
        >>> Interleaved(np.array([0, 48], np.int32)).apply(np.array([1.5, 2.5], np.float32))[1::2].tolist()
        [1.5, 2.5]
    """

    offsets: np.ndarray  # int32
    order: np.ndarray | None = None

    def apply(self, words: np.ndarray) -> np.ndarray:
        """The kernel's float32 weight array from the words it would read without pairs."""
        out = np.empty(2 * len(self.offsets), dtype=np.float32)
        out[0::2] = self.offsets.view(np.float32)
        out[1::2] = words if self.order is None else words[self.order]
        return out

    def composed(self, order: np.ndarray | None) -> Interleaved:
        """This map over words that were themselves `packed[order]`: a map straight from `packed`."""
        if order is None or not order.size:
            return self
        return Interleaved(self.offsets, order if self.order is None else order[self.order])


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """starts[i] + arange(lengths[i]) for every i, concatenated."""
    lengths = lengths.astype(np.int64)
    total = int(lengths.sum())
    return np.repeat(starts.astype(np.int64) - _exclusive_cumsum(lengths)[:-1], lengths) + np.arange(total)


def pair_offsets(panels: Panels, group_rows: np.ndarray, p_x: np.ndarray, order: np.ndarray | None = None,
                 ) -> tuple[Panels, np.ndarray, WordMap | Interleaved | None]:
    """(panels, P_X) with every scattered one-row entry reading (offset, weight) pairs, and the map of the new weight
    array from the packed weights, which the kernel's words were before as `packed[order]` (`order` None: as
    packed); where no entry pairs, the inputs as they are and `order` as a map (None where None)."""
    e_rows = np.asarray(group_rows, dtype=np.int64)[panels.e_group] if panels.e_group.size else \
        np.zeros(0, np.int64)
    paired = ((panels.e_flags & ONE_WORD) != 0) & (e_rows == 1)
    if not paired.any():
        return panels, p_x, None if order is None or not order.size else WordMap(order)
    p0, p1 = panels.e_piece0.astype(np.int64), panels.e_piece1.astype(np.int64)
    n_pieces = p1 - p0
    if paired.all() and np.array_equal(panels.e_woff, p0):  # piece p's weight is word p: interleave them
        new = replace(panels, e_piece0=np.zeros_like(p0), e_piece1=n_pieces, e_woff=2 * p0,
                      p_k0=panels.p_k0[:0], p_len=panels.p_len[:0])
        return new, p_x[:0], Interleaved(np.ascontiguousarray(p_x, dtype=np.int32)).composed(order)
    new, new_p_x, words = paired_tables(panels, e_rows, paired, p_x)
    return new, new_p_x, words.composed(order)


def paired_tables(panels: Panels, e_rows: np.ndarray, paired: np.ndarray, p_x: np.ndarray) -> tuple[Panels, np.ndarray,
                                                                                                   WordMap]:
    """`pair_offsets` for any mix of entries (`paired`: which read pairs; `e_rows`: each entry's rows).

    Example (a plain entry of one word, padded to two, then a paired entry of one piece):
        >>> from sparta_explore.kernels.panels import Panels
        >>> p = Panels(rows=4, e_group=np.array([0, 1]), e_piece0=np.array([0, 1]), e_piece1=np.array([1, 2]),
        ...            e_woff=np.array([0, 1]), e_flags=np.array([3, 7]), p_k0=np.array([2, 5]),
        ...            p_len=np.array([1, 1]), e_ptr=np.array([0, 2]), count=1)
        >>> new, p_x, words = paired_tables(p, np.array([1, 1]), np.array([False, True]), np.array([96, 240], np.int32))
        >>> words.gather.tolist(), words.fill.tolist(), new.e_woff.tolist(), p_x.tolist()
        ([0, -1, -1, 1], [0, 0, 240, 0], [0, 2], [96])
    """
    p0, p1 = panels.e_piece0.astype(np.int64), panels.e_piece1.astype(np.int64)
    n_pieces = p1 - p0
    k_before = _exclusive_cumsum(panels.p_len)
    e_words = (k_before[p1] - k_before[p0]) * e_rows
    # new lengths: pairs take two words a piece; other entries pad to an even count, so every entry starts even
    new_len = np.where(paired, 2 * n_pieces, e_words + (e_words & 1))
    order = np.argsort(panels.e_woff, kind="stable")  # the old array's order of entries is kept
    new_start = np.empty_like(new_len)
    new_start[order] = _exclusive_cumsum(new_len[order])[:-1]
    total = int(new_len.sum())
    gather = np.full(total, -1, dtype=np.int64)
    fill = np.zeros(total, dtype=np.int32)
    plain = ~paired
    gather[_ranges(new_start[plain], e_words[plain])] = _ranges(panels.e_woff[plain], e_words[plain])
    # piece j of a paired entry: its offset at start + 2j, its weight (the old word woff + j) at start + 2j + 1
    slots = 2 * _ranges(new_start[paired], n_pieces[paired]) - np.repeat(new_start[paired], n_pieces[paired])
    gather[slots + 1] = _ranges(panels.e_woff[paired], n_pieces[paired])
    fill[slots] = p_x[_ranges(p0[paired], n_pieces[paired])]
    # the paired entries' pieces leave the piece tables: E_P0..E_P1 keeps their count, from 0
    keep = np.zeros(len(panels.p_len), dtype=bool)
    keep[_ranges(p0[plain], n_pieces[plain])] = True
    rank = _exclusive_cumsum(keep)
    new_p0 = np.where(paired, 0, rank[p0])
    new_p1 = np.where(paired, n_pieces, rank[p1])
    new = replace(panels, e_piece0=new_p0, e_piece1=new_p1, e_woff=new_start, p_k0=panels.p_k0[keep],
                  p_len=panels.p_len[keep])
    return new, p_x[keep], WordMap(gather, fill)
