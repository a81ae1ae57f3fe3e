"""Row groups, segments, panels and packed weights: the array code equals a plain loop over the pattern.

The loops below are the first, per-segment implementations (one Python step per segment,
too slow at BERT sizes); the kernels now plan with whole-array code (`kernels/groups.py`,
`kernels/panels.py`), which must give the same tables and the same packed weights on every
pattern: block, 1xK, unstructured, empty rows and columns, all-zero, ragged shapes.
"""

import math

import numpy as np
import pytest

from sparta_explore.kernels.groups import (
    Groups,
    align_segments,
    pack_weights,
    plan_groups,
    runs,
    shared_rows,
    unit_segments,
    word_index,
)
from sparta_explore.kernels.int8_codegen import pack_pairs
from sparta_explore.kernels.lowbit_codegen import pack_quads
from sparta_explore.kernels.panels import ONE_WORD, cut_panels


def _runs(cols):
    padded = np.concatenate([[False], cols, [False]])
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    return [(int(a), int(b - a)) for a, b in zip(edges[0::2], edges[1::2])]


def loop_plan_groups(kept, block_rows, max_rows):
    n = kept.shape[0]
    row0, rows, seg_ptr, seg_k0, seg_len, w_off, offset = [], [], [0], [], [], [], 0
    for b0 in range(0, n, block_rows):
        b1 = min(b0 + block_rows, n)
        for g0 in range(b0, b1, max_rows):
            g1 = min(g0 + max_rows, b1)
            segs = _runs(kept[g0:g1].any(axis=0))
            if not segs:
                continue
            row0.append(g0)
            rows.append(g1 - g0)
            w_off.append(offset)
            for k0, length in segs:
                seg_k0.append(k0)
                seg_len.append(length)
                offset += length * (g1 - g0)
            seg_ptr.append(len(seg_k0))
    return Groups(*(np.asarray(v, dtype=np.int64) for v in (row0, rows, seg_ptr, seg_k0, seg_len, w_off)))


def loop_unit_segments(groups, unit, short, uniform=None):
    k0s, lens, seg_ptr = [], [], [0]
    for g in range(len(groups.row0)):
        a, b = int(groups.seg_ptr[g]), int(groups.seg_ptr[g + 1])
        split = b > a and groups.seg_len[a:b].mean() < short * unit
        if split and uniform is not None and groups.seg_len[a:b].mean() >= 2 * unit:
            words = [-(-int(n) // unit) for n in groups.seg_len[a:b]]
            split = max(words.count(w) for w in words) / len(words) < uniform  # one length mostly: keeps its loop
        for s in range(a, b):
            k0, length = int(groups.seg_k0[s]), int(groups.seg_len[s])
            for k, n in ([(k, unit) for k in range(k0, k0 + length, unit)] if split else [(k0, length)]):
                k0s.append(k)
                lens.append(n)
        seg_ptr.append(len(k0s))
    return Groups(groups.row0, groups.rows, *(np.asarray(v, dtype=np.int64) for v in (seg_ptr, k0s, lens)),
                  groups.w_off)


def loop_align_segments(groups, multiple):
    k0s, lens, seg_ptr, w_off, offset = [], [], [0], [], 0
    for g in range(len(groups.row0)):
        w_off.append(offset)
        merged = []
        for s in range(int(groups.seg_ptr[g]), int(groups.seg_ptr[g + 1])):
            a = int(groups.seg_k0[s]) // multiple * multiple
            b = -(-(int(groups.seg_k0[s]) + int(groups.seg_len[s])) // multiple) * multiple
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        for a, b in merged:
            k0s.append(a)
            lens.append(b - a)
            offset += (b - a) // multiple * int(groups.rows[g])
        seg_ptr.append(len(k0s))
    return Groups(groups.row0, groups.rows, *(np.asarray(v, dtype=np.int64) for v in (seg_ptr, k0s, lens, w_off)))


def loop_blocks(weights, groups):
    for g in range(len(groups.row0)):
        r0, r = int(groups.row0[g]), int(groups.rows[g])
        for s in range(int(groups.seg_ptr[g]), int(groups.seg_ptr[g + 1])):
            k0, length = int(groups.seg_k0[s]), int(groups.seg_len[s])
            yield weights[r0:r0 + r, k0:k0 + length]


def loop_cut_panels(groups, rows, chunk_g0, word):
    n_in = int((groups.seg_k0 + groups.seg_len).max(initial=1))
    n_panels = max(1, -(-n_in // rows))
    per_panel = [[] for _ in range(n_panels)]
    for g in range(len(groups.row0)):
        r, done, by_panel = int(groups.rows[g]), 0, {}
        for s in range(int(groups.seg_ptr[g]), int(groups.seg_ptr[g + 1])):
            k0, left = int(groups.seg_k0[s]), int(groups.seg_len[s])
            while left > 0:
                p = k0 // rows
                length = min(left, (p + 1) * rows - k0)
                by_panel.setdefault(p, []).append((k0, length, int(groups.w_off[g]) + done // word * r))
                done, k0, left = done + length, k0 + length, left - length
        order = sorted(by_panel)
        for i, p in enumerate(order):
            one = all(length == word for _, length, _ in by_panel[p])
            per_panel[p].append((g, by_panel[p], (i == 0) * 1 | (i == len(order) - 1) * 2 | one * ONE_WORD))
    out = {k: [] for k in ("e_group", "e_piece0", "e_piece1", "e_woff", "e_flags", "p_k0", "p_len", "e_ptr")}
    bounds = list(chunk_g0) + [len(groups.row0)]
    for entries in per_panel:
        start = len(out["e_group"])
        out["e_ptr"] += [start + int(np.searchsorted([g for g, _, _ in entries], b)) for b in bounds]
        for g, pieces, flags in entries:
            out["e_group"].append(g)
            out["e_piece0"].append(len(out["p_k0"]))
            out["e_woff"].append(pieces[0][2])
            out["e_flags"].append(flags)
            for k0, length, _ in pieces:
                out["p_k0"].append(k0)
                out["p_len"].append(length)
            out["e_piece1"].append(len(out["p_k0"]))
    return n_in, out


def pattern(kind, n, k, seed):
    rng = np.random.default_rng(seed)
    if kind == "unstructured":
        kept = rng.random((n, k)) < 0.1
    elif kind == "dense":
        kept = np.ones((n, k), dtype=bool)
    elif kind == "zero":
        kept = np.zeros((n, k), dtype=bool)
    else:
        br, bc = kind
        blocks = rng.random((-(-n // br), -(-k // bc))) < 0.3
        kept = np.kron(blocks, np.ones((br, bc), dtype=bool))[:n, :k].astype(bool)
    kept[rng.integers(0, n)] = False  # an empty row
    return kept


PATTERNS = ["unstructured", "dense", "zero", (1, 32), (32, 32), (4, 4), (16, 1)]
SHAPES = [(37, 53), (64, 96), (5, 300)]


def same(a: Groups, b: Groups):
    for field in ("row0", "rows", "seg_ptr", "seg_k0", "seg_len", "w_off"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)


@pytest.mark.parametrize("kind", PATTERNS, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("block_rows, max_rows", [(1, 4), (32, 4), (4, 3), (7, 2)])
def test_groups_and_packing_equal_the_loops(kind, shape, block_rows, max_rows):
    kept = pattern(kind, *shape, seed=hash((str(kind), shape)) % 1000)
    weight = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    groups = plan_groups(kept, block_rows, max_rows)
    same(groups, loop_plan_groups(kept, block_rows, max_rows))
    for unit, short, uniform in ((1, 2.0, None), (1, math.inf, None), (2, 2.0, None), (4, 2.0, None),
                                 (1, 8.0, None), (2, 8.0, 0.8), (4, 8.0, 0.8), (4, 8.0, 0.5)):
        base = groups if unit == 1 else align_segments(groups, unit)
        same(unit_segments(base, unit, short, uniform), loop_unit_segments(base, unit, short, uniform))
    for multiple in (2, 4):
        same(align_segments(groups, multiple), loop_align_segments(groups, multiple))
    want = [b.T.reshape(-1) for b in loop_blocks(np.where(kept, weight, 0.0).astype(np.float32), groups)]
    np.testing.assert_array_equal(pack_weights(weight, kept, unit_segments(groups, 1)),
                                  np.concatenate(want) if want else np.zeros(1, np.float32))
    wq = np.random.default_rng(1).integers(-127, 128, shape).astype(np.int8)
    pairs = align_segments(groups, 2)
    wpad = np.zeros((shape[0], shape[1] + 1), dtype=np.int32)
    wpad[:, :shape[1]] = wq
    want = [((b[:, 0::2] & 0xFFFF) | (b[:, 1::2] << 16)).T.reshape(-1).astype(np.int32)
            for b in loop_blocks(wpad, pairs)]
    np.testing.assert_array_equal(pack_pairs(wq, pairs), np.concatenate(want) if want else np.zeros(1, np.int32))
    quads = align_segments(groups, 4)
    qpad = np.zeros((shape[0], shape[1] + 3), dtype=np.int8)
    qpad[:, :shape[1]] = wq
    want = [np.ascontiguousarray(b).view(np.int32).T.reshape(-1) for b in loop_blocks(qpad, quads)]
    np.testing.assert_array_equal(pack_quads(wq, quads), np.concatenate(want) if want else np.zeros(1, np.int32))


@pytest.mark.parametrize("kind", PATTERNS, ids=str)
@pytest.mark.parametrize("rows, word", [(16, 1), (32, 2), (64, 4), (1000, 1)])
def test_panels_equal_the_loop(kind, rows, word):
    kept = pattern(kind, 61, 250, seed=7)
    groups = plan_groups(kept, 4, 4)
    groups = unit_segments(align_segments(groups, word) if word > 1 else groups, word)
    chunk_g0 = sorted({0, len(groups.row0) // 3, len(groups.row0) // 2})
    n_in, want = loop_cut_panels(groups, rows, chunk_g0, word)
    got = cut_panels(groups, n_in, rows, chunk_g0, word)
    for field, values in want.items():
        np.testing.assert_array_equal(getattr(got, field), np.asarray(values, dtype=np.int64), err_msg=field)


def test_word_index_lists_every_kept_weight_once():
    kept = pattern("unstructured", 40, 70, seed=3)
    rows, ks = word_index(plan_groups(kept, 1, 4))
    assert len(set(zip(rows.tolist(), ks.tolist()))) == len(rows) >= kept.sum()
    assert kept[rows, ks].sum() == kept.sum()


@pytest.mark.parametrize("shape", [(5, 9), (1, 1), (0, 4), (3, 0), (64, 33)])
@pytest.mark.parametrize("density", [0.0, 0.1, 0.3, 0.9, 1.0])  # under 0.3 kept: the sparse walk
def test_runs_equal_a_loop_over_rows(shape, density):
    kept = np.random.default_rng(7).random(shape) < density
    want = [(r, k0, len(seg)) for r in range(shape[0]) for k0, seg in _runs_of(kept[r])]
    got = list(zip(*(a.tolist() for a in runs(kept))))
    assert got == want


def _runs_of(row):
    out, k = [], 0
    while k < len(row):
        if row[k]:
            start = k
            while k < len(row) and row[k]:
                k += 1
            out.append((start, row[start:k]))
        else:
            k += 1
    return out


def _chunk_cuts_loop(groups, chunks):
    per_group = np.zeros(len(groups.row0))
    for g in range(len(groups.row0)):
        per_group[g] = sum(groups.seg_len[s] * groups.rows[g] for s in range(groups.seg_ptr[g], groups.seg_ptr[g + 1]))
    total, cuts, acc = per_group.sum(), [0], 0.0
    for g, work in enumerate(per_group):
        acc += work
        if len(cuts) < chunks and acc >= total * len(cuts) / chunks and g + 1 < len(per_group):
            cuts.append(g + 1)
    return cuts + [len(per_group)]


@pytest.mark.parametrize("kind", PATTERNS, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_row_chunks_split_the_work_as_the_loop_did(kind, shape):
    from sparta_explore.kernels.bsr_codegen import CHUNKS, _chunks

    kept = pattern(kind, *shape, seed=5)
    groups = plan_groups(kept, 4)
    g0, g1, *_ = _chunks(groups, shape[0], np.array([], dtype=np.int64))
    assert g0 + [g1[-1]] == _chunk_cuts_loop(groups, CHUNKS)


def loop_shared_rows(kept, block_rows, most=32):
    height = 1
    for h in (2, 4, 8, 16, 32):
        if h > most or len(kept) <= height:
            break
        if any((kept[i] != kept[i - i % h]).any() for i in range(len(kept))):
            break
        height = h
    return max(block_rows, height)


@pytest.mark.parametrize("block", [(1, 1), (2, 4), (8, 8), (16, 1), (32, 32), (64, 2)])
@pytest.mark.parametrize("n", [1, 31, 64, 100])
def test_shared_rows_is_the_block_height_the_rows_really_have(block, n):
    rng = np.random.default_rng(n + block[0])
    tiles = rng.random((-(-n // block[0]), -(-40 // block[1]))) < 0.3
    kept = np.repeat(np.repeat(tiles, block[0], axis=0), block[1], axis=1)[:n, :40]
    got = shared_rows(kept)
    assert got == loop_shared_rows(kept, 1)
    assert got >= min(block[0], 32) or n < block[0]  # blocks of h rows: at least h (a ragged last one counts)
    assert shared_rows(kept, block_rows=64) == 64  # never below what the caller says
    assert shared_rows(np.zeros((0, 4), dtype=bool)) == 1


def test_runs_of_one_length_keep_their_loop_unless_one_word():
    # 1x8 blocks in quads: every run 2 words, uniform: kept whole with `uniform`, split without; runs averaging
    # under 2 words are split however uniform; runs of mixed length are split
    blocks = np.zeros((4, 64), dtype=bool)
    blocks[:, 0:8] = blocks[:, 24:32] = blocks[:, 48:56] = True
    quads = align_segments(plan_groups(blocks, 1, 1), 4)
    assert unit_segments(quads, 4, 8.0).seg_len.tolist() == [4] * 24
    assert unit_segments(quads, 4, 8.0, uniform=0.8).seg_len.tolist() == [8] * 12
    short = np.zeros((1, 64), dtype=bool)
    short[0, [0, 8, 16, 24, 32, 33, 36, 37]] = True  # runs of 1, 1, 1, 1 and 2 quads: 80% one length, mean 1.2
    ones = align_segments(plan_groups(short, 1, 1), 4)
    assert ones.seg_len.tolist() == [4, 4, 4, 4, 8]
    assert unit_segments(ones, 4, 8.0, uniform=0.8).seg_len.tolist() == [4] * 6
    mixed = np.zeros((1, 64), dtype=bool)
    mixed[0, [0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43]] = True
    runs = align_segments(plan_groups(mixed, 1, 1), 4)
    assert runs.seg_len.tolist() == [8, 4, 12]
    assert unit_segments(runs, 4, 8.0, uniform=0.8).seg_len.tolist() == [4] * 6
