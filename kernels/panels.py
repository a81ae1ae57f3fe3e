"""K panels: the work of every row group cut at panel boundaries, so X's panel stays in L1.

Without panels a one-row group streams every x vector it uses from L2 (one vector per
FMA: at 32 B/cycle that caps it near half of peak). Processing all groups panel by panel
keeps the panel of the packed X tile in L1; accumulators go to the tile's output buffer
between panels (`first` starts from zero, `last` adds bias and activation). A panel is as
large as this machine's L1 data cache (`cache_bytes(1)`): every panel costs each row one
more spill and reload of its accumulators, so panels want to be as few as L1 allows.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sparta_explore.kernels.groups import Groups

ONE_WORD = 4  # entry flag beside 1 (first) and 2 (last): every piece is one word, so kernels run one flat loop
PANEL_BUCKET = 16  # a kernel with its pattern as data loops over a multiple of this many panels (see `bucketed`)
DEFAULT_L1 = 32 * 1024  # an L1 data cache the OS does not report is taken as the common 32 KiB
DEFAULT_L2 = 256 * 1024  # and an unreported L2 as the smallest common one
CPU_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")


def _bytes(size: str) -> int:
    """A sysfs cache size ("48K", "1M", "32768") in bytes."""
    size = size.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
    return int(size.rstrip("KMG")) * scale


# cache level -> the sysconf name that reports it, and the size taken where nothing does
_UNREPORTED = {1: ("SC_LEVEL1_DCACHE_SIZE", DEFAULT_L1), 2: ("SC_LEVEL2_CACHE_SIZE", DEFAULT_L2)}


@functools.cache
def cache_bytes(level: int, cache_dir: Path = CPU_CACHE) -> int:
    """One core's data (or unified) cache of `level` (1 or 2) in bytes: sysfs, else `sysconf`, else a default.

    Example:
        >>> cache_bytes(1) >= 16 * 1024, cache_bytes(2) >= 128 * 1024
        (True, True)
    """
    for index in sorted(cache_dir.glob("index*")):
        try:
            if (index / "level").read_text().strip() == str(level) and (index / "type").read_text().strip() in (
                    "Data", "Unified"):
                return _bytes((index / "size").read_text())
        except (OSError, ValueError):
            continue
    name, default = _UNREPORTED[level]
    try:
        size = os.sysconf(name)
    except (ValueError, OSError, AttributeError):
        size = 0
    return int(size) if size and size > 0 else default


def l1_budget() -> int:
    """Bytes of packed X per int8 K panel: the whole L1 data cache (fp32 kernels: `fp32_budget`).

    Scattered rows touch a tenth of a panel's k rows each, and every panel costs each row a spill and reload of its
    accumulators, so fewer, larger panels win. Measured on a 48 KiB L1 (Zen 5, AVX-512, 90% unstructured, BERT FFN
    shapes, M = 4096, 4x3x3 tiles of 48 floats): 768 -> 3072 in 3 panels 10.7 ms, against 14.4 in 6 (24 KiB
    panels, the old budget) and 11.7 without panels; 3072 -> 768 12.0 ms at 48 KiB, 14.4 at 32, 12.4 at 72, 13.0
    at 96. A 32 KiB L1 gets 32 KiB panels by the same rule (not measured there).
    """
    return cache_bytes(1)


FP32_PANEL_MIN = 48 * 1024  # fp32 K panels hold at least this much packed X, whatever L1 holds (`fp32_budget`)


def fp32_budget() -> int:
    """Bytes of packed X per K panel of an fp32 kernel: L1, and never less than `FP32_PANEL_MIN`.

    On a 32 KiB L1 a panel that fills it lost to one half again as large: the spills and reloads of a panel more
    cost more than the x rows that fall out of L1 and come back from L2 (a row touches a tenth of a panel's rows).
    Zen 4 (32 KiB L1, 90% unstructured, BERT FFN shapes, 4x3x3 tiles of 48 floats, in-process A/B): the fused FFN
    at M = 4096 35.9 -> 33.9 ms with 256-row panels (48 KiB) against 170 (32 KiB), 768 -> 3072 20.9 -> 19.8 ms;
    M = 1024 9.05 -> 8.60 ms; 64 KiB level with 48, 1 MiB (no panels) 39.6. On Zen 5's 48 KiB L1, 48 KiB was
    the best (72 KiB 3% slower: see `l1_budget`), so the floor is a size, not a multiple of L1. int8 kernels keep
    `l1_budget` (48 KiB measured no faster there).

    Example:
        >>> fp32_budget() >= max(l1_budget(), FP32_PANEL_MIN)
        True
    """
    return max(l1_budget(), FP32_PANEL_MIN)


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


def panel_rows(tile_bytes: int, word: int = 1, budget: int | None = None) -> int:
    """k rows per panel for `tile_bytes` bytes of packed X per k (a multiple of `word`, at least 16) in `budget`
    bytes (None: `l1_budget()`).

    Example:
        >>> panel_rows(4 * 48, budget=48 * 1024), panel_rows(96, word=4, budget=24 * 1024)
        (256, 256)
    """
    return max(16, (l1_budget() if budget is None else budget) // tile_bytes // word * word)


def bucketed(e_ptr: np.ndarray, count: int, per_panel: int) -> tuple[np.ndarray, int]:
    """(`e_ptr` padded with empty panels, the padded count): the panels run up to the next multiple of
    `PANEL_BUCKET`, so the loop's literal count is shared by every K of the bucket and a library built for one
    serves them all (a shrink pass leaves BERT-base's 3072-k layers 2400-2900 k: one build per K before). An
    empty panel costs its two pointer reads per chunk. For layouts that cut K into panels (one panel, K whole,
    keeps its literal 1 without this).

    Example:
        >>> e, n = bucketed(np.array([0, 1, 1, 3]), 2, 2); n, e.tolist()[-3:]
        (16, [3, 3, 3])
    """
    padded = -(-max(count, 1) // PANEL_BUCKET) * PANEL_BUCKET
    tail = np.full((padded - count) * per_panel, e_ptr[-1] if len(e_ptr) else 0, dtype=np.int64)
    return np.concatenate([np.asarray(e_ptr, dtype=np.int64), tail]), padded


def cut_panels(groups: Groups, n_in: int, rows: int, chunk_g0: list[int], word: int = 1) -> Panels:
    """Cut every group's segments at multiples of `rows`; entries ordered by (panel, group).

    `word` is how many k one packed weight holds (1 fp32, 2 int16 pairs, 4 int8 quads): weight
    offsets count words, `rows` must be a multiple of it so no word straddles two panels, and
    entries whose pieces are all one word are flagged `ONE_WORD` (kernels run them as one flat loop).

    Example:
        >>> from sparta_explore.kernels.groups import plan_groups
        >>> cut_panels(plan_groups(np.ones((1, 8), dtype=bool), 1), 8, 4, [0], word=4).e_woff.tolist()
        [0, 1]
    """
    if rows % word:
        raise ValueError(f"panel rows {rows} must be a multiple of the packed word ({word} k)")
    n_panels = max(1, -(-n_in // rows))
    n_groups = len(groups.row0)
    owner = groups.owners()
    # every segment cut at panel boundaries: one piece per panel it crosses, in group then k order
    first_panel = groups.seg_k0 // rows
    last_panel = (groups.seg_k0 + groups.seg_len - 1) // rows
    if np.array_equal(first_panel, last_panel):  # no segment crosses a panel edge (one-word pieces): each is a piece
        panel, k0, length, group = first_panel, groups.seg_k0, groups.seg_len, owner
    else:
        count = last_panel - first_panel + 1
        seg_of = np.repeat(np.arange(len(count)), count)
        panel = first_panel[seg_of] + np.arange(seg_of.size) - np.repeat(_starts(count), count)
        k0 = np.maximum(groups.seg_k0[seg_of], panel * rows)
        length = np.minimum(groups.seg_k0[seg_of] + groups.seg_len[seg_of], (panel + 1) * rows) - k0
        group = owner[seg_of]
    before = np.cumsum(length) - length  # k of every piece before this one
    # ... of its own group: pieces are in group order, so a group's first piece is where its number is first found
    done = before - np.append(before, 0)[np.searchsorted(group, np.arange(n_groups))][group]
    woff = groups.w_off[group] + done // word * groups.rows[group]
    # entries: one per (panel, group) with pieces, ordered by panel then group (stable: pieces keep their k order)
    order = np.argsort(panel.astype(np.int32 if n_panels >= 1 << 15 else np.int16), kind="stable")  # a radix sort
    panel, group, k0, length, woff = panel[order], group[order], k0[order], length[order], woff[order]
    key = panel * (n_groups + 1) + group
    new_entry = np.ones(key.size, dtype=bool)
    new_entry[1:] = key[1:] != key[:-1]
    e_piece0 = np.flatnonzero(new_entry)
    e_piece1 = np.append(e_piece0[1:], key.size) if e_piece0.size else e_piece0
    e_key, e_group, e_panel = key[e_piece0], group[e_piece0], panel[e_piece0]
    lo = np.full(n_groups, n_panels, dtype=np.int64)
    hi = np.full(n_groups, -1, dtype=np.int64)
    np.minimum.at(lo, e_group, e_panel)
    np.maximum.at(hi, e_group, e_panel)
    not_one_word = np.add.reduceat((length != word).astype(np.int64), e_piece0) if e_piece0.size else e_piece0
    e_flags = ((e_panel == lo[e_group]) * 1 | (e_panel == hi[e_group]) * 2
               | (not_one_word == 0) * ONE_WORD).astype(np.int64)
    bounds = np.asarray(list(chunk_g0) + [n_groups], dtype=np.int64)
    wanted = (np.arange(n_panels, dtype=np.int64)[:, None] * (n_groups + 1) + bounds[None, :]).reshape(-1)
    e_ptr = np.searchsorted(e_key, wanted).astype(np.int64)
    as_i = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
    return Panels(rows, as_i(e_group), as_i(e_piece0), as_i(e_piece1), as_i(woff[e_piece0]), e_flags, as_i(k0),
                  as_i(length), e_ptr, n_panels)


def _starts(count: np.ndarray) -> np.ndarray:
    """Where each run of `count` items starts in their concatenation."""
    return np.cumsum(count) - count


def by_length(panels: Panels, chunk_g0: list[int], group_rows: np.ndarray) -> tuple[Panels, np.ndarray]:
    """(`panels` with each (panel, chunk)'s entries ordered by their piece count, the gather index of packed words).

    A scattered row's flat loop runs a count of pieces the branch predictor cannot guess: in row order every entry
    mispredicts its loop's exit and its remainder. In order of length, entries with one count follow each other and
    the predictor learns it (90% unstructured, 3 K panels: 4.5% less time in the loops). The pieces and packed words
    are laid out in the new order too (`words = old_words[index]`): read out of order, the weight and offset streams
    lost more than the ordering won (10.6 -> 12.1 ms). Each entry is still one group inside one panel and the panels
    of a chunk still run in order, so `first`, `last` and every sum are as before.

    Example:
        >>> from sparta_explore.kernels.groups import plan_groups
        >>> g = plan_groups(np.array([[1, 0, 1, 0, 1, 0], [0, 0, 0, 1, 0, 0]], dtype=bool), 1)
        >>> p, index = by_length(cut_panels(g, 6, 6, [0]), [0], g.rows)
        >>> p.e_group.tolist(), p.p_k0.tolist(), index.tolist()
        ([1, 0], [3, 0, 2, 4], [3, 0, 1, 2])
    """
    n_entries = len(panels.e_group)
    if not n_entries:
        return panels, np.zeros(0, dtype=np.int64)
    pieces = panels.e_piece1 - panels.e_piece0
    per_panel = len(chunk_g0) + 1  # e_ptr's entries per panel: each chunk's first, and the panel's end
    chunk = np.searchsorted(np.asarray(chunk_g0, dtype=np.int64), panels.e_group, side="right") - 1
    panel = panels.p_k0[panels.e_piece0] // panels.rows
    order = np.lexsort((pieces, chunk, panel))  # stable: entries of one length keep their row order
    new_pieces = pieces[order]
    piece_start = _starts(new_pieces)
    piece_index = np.repeat(panels.e_piece0[order] - piece_start, new_pieces) + np.arange(int(new_pieces.sum()))
    # an entry's packed words are contiguous: its pieces' words times its group's rows, from its offset
    words = np.add.reduceat(panels.p_len, panels.e_piece0)
    span = (words * np.asarray(group_rows, dtype=np.int64)[panels.e_group])[order]
    w_start = _starts(span)
    w_index = np.repeat(panels.e_woff[order] - w_start, span) + np.arange(int(span.sum()))
    key = panel[order] * per_panel + chunk[order]
    e_ptr = np.searchsorted(key, np.arange(panels.count * per_panel, dtype=np.int64))
    return Panels(panels.rows, panels.e_group[order], piece_start, piece_start + new_pieces, w_start,
                  panels.e_flags[order], panels.p_k0[piece_index], panels.p_len[piece_index],
                  e_ptr.astype(np.int64), panels.count), w_index.astype(np.int64)
