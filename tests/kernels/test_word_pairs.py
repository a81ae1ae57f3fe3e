"""(offset, weight) words for scattered one-row entries: the kernel reads what it read before, and computes it."""

import numpy as np
import pytest
import torch

from sparta_explore.kernels import SparseLinear
from sparta_explore.kernels.bsr_codegen import TileConfig, _chunks
from sparta_explore.kernels.groups import SHORT_SEGMENTS, pack_weights, plan_groups, unit_segments
from sparta_explore.kernels.panels import ONE_WORD, by_length, cut_panels
from sparta_explore.kernels.scattered import scattered_groups, scattered_panels
from sparta_explore.kernels.word_pairs import Interleaved, WordMap, pair_offsets, paired_tables

TILE = 48  # floats a k row of packed X; offsets are multiples of it


def reads(panels, rows, p_x, w, paired: bool):
    """Per entry, what a tile reads: (X offset, the weights of its rows) per k, as the C loops walk them."""
    out = []
    for e in range(len(panels.e_group)):
        r = int(rows[panels.e_group[e]])
        at, p0, p1 = int(panels.e_woff[e]), int(panels.e_piece0[e]), int(panels.e_piece1[e])
        seen = []
        if paired and panels.e_flags[e] & ONE_WORD and r == 1:
            assert at % 2 == 0  # an aligned 8-byte word
            pairs = w[at:at + 2 * (p1 - p0)]
            seen = [(int(pairs[2 * i:2 * i + 1].view(np.int32)[0]), tuple(pairs[2 * i + 1:2 * i + 2]))
                    for i in range(p1 - p0)]
        else:
            for p in range(p0, p1):
                for k in range(int(panels.p_len[p])):
                    seen.append((int(p_x[p]) + k * TILE, tuple(w[at:at + r])))
                    at += r
        out.append(seen)
    return out


def layouts(seed: int, repeated: int, panel_rows: int):
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(1, 60)), int(rng.integers(1, 300))
    kept = rng.random((n, k)) < rng.choice([0.02, 0.1, 0.4])
    if repeated > 1:  # runs of equal rows (multi-row groups) beside one-row groups: paired and plain entries
        kept[: n // 2] = np.repeat(kept[: n // 2: repeated], repeated, axis=0)[: n // 2]
    kept[rng.integers(0, n)] = False
    if seed % 2:  # a one-row group with a run of k: a plain entry of one row, not paired
        kept[-1, : min(k, 40)] = True
    weight = rng.standard_normal((n, k)).astype(np.float32)
    groups = unit_segments(plan_groups(kept, repeated, 3), 1, SHORT_SEGMENTS)  # 4-row blocks: 3 + 1 rows
    chunk_g0 = _chunks(groups, n, np.flatnonzero(~kept.any(axis=1)))[0]
    panels, order = cut_panels(groups, k, panel_rows, chunk_g0), None
    if panels.e_flags.size and bool((panels.e_flags & ONE_WORD).all()):
        panels, order = by_length(panels, chunk_g0, groups.rows)
    packed = pack_weights(weight, kept, groups)
    words = packed if order is None else packed[order]
    return groups, panels, words, packed, order


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("repeated", [1, 4])
@pytest.mark.parametrize("panel_rows", [16, 10_000])
def test_paired_tables_read_what_the_plain_tables_read(seed, repeated, panel_rows):
    groups, panels, words, packed, order = layouts(seed, repeated, panel_rows)
    p_x = (panels.p_k0 * TILE).astype(np.int32)
    new, new_p_x, pairs = pair_offsets(panels, groups.rows, p_x)
    before = reads(panels, groups.rows, p_x, words, paired=False)
    _, _, from_packed = pair_offsets(panels, groups.rows, p_x, order)  # the map straight from the packed weights
    if pairs is None:
        assert not bool((((panels.e_flags & ONE_WORD) != 0) & (groups.rows[panels.e_group] == 1)).any())
        assert (from_packed is None) == (order is None)
        assert from_packed is None or np.array_equal(from_packed.apply(packed), words)
        return
    assert np.array_equal(from_packed.apply(packed).view(np.int32), pairs.apply(words).view(np.int32))
    assert reads(new, groups.rows, new_p_x, pairs.apply(words), paired=True) == before
    # straight from the packed weights through the composed map: the same array
    assert np.array_equal(pairs.composed(order).apply(packed).view(np.int32), pairs.apply(words).view(np.int32))
    plain = ~(((new.e_flags & ONE_WORD) != 0) & (groups.rows[new.e_group] == 1))
    assert len(new_p_x) == int((panels.e_piece1 - panels.e_piece0)[plain].sum())  # paired pieces left P_X


@pytest.mark.parametrize("seed", range(4))
def test_unstructured_patterns_interleave_as_the_general_path_lays_them_out(seed):
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(1, 80)), int(rng.integers(1, 300))
    kept = rng.random((n, k)) < 0.1
    kept[rng.integers(0, n)] = False
    groups = scattered_groups(kept, SHORT_SEGMENTS)
    chunk_g0 = _chunks(groups, n, np.flatnonzero(~kept.any(axis=1)))[0]
    panels, order = scattered_panels(groups, k, 32, chunk_g0)
    packed = rng.standard_normal(int(kept.sum())).astype(np.float32)
    p_x = (panels.p_k0 * TILE).astype(np.int32)
    fast_panels, fast_p_x, fast = pair_offsets(panels, groups.rows, p_x)
    e_rows = groups.rows[panels.e_group].astype(np.int64)
    slow_panels, slow_p_x, slow = paired_tables(panels, e_rows, np.ones(len(e_rows), dtype=bool), p_x)
    assert isinstance(fast, Interleaved) and isinstance(slow, WordMap)
    for name in ("e_piece0", "e_piece1", "e_woff", "p_k0", "p_len"):
        assert np.array_equal(getattr(fast_panels, name), getattr(slow_panels, name)), name
    assert np.array_equal(fast_p_x, slow_p_x)
    assert np.array_equal(fast.composed(order).apply(packed).view(np.int32),
                          slow.composed(order).apply(packed).view(np.int32))


def test_no_scattered_one_row_entry_leaves_the_tables_as_they_are():
    groups, panels, words, packed, order = layouts(2, 1, 16)
    rows = np.full_like(groups.rows, 2)  # as if every group had two rows
    p_x = (panels.p_k0 * TILE).astype(np.int32)
    new, new_p_x, pairs = pair_offsets(panels, rows, p_x)
    assert pairs is None and new is panels and new_p_x is p_x
    # with the by-length order: a reordering map only, no fill
    new, new_p_x, reordered = pair_offsets(panels, rows, p_x, order)
    assert new is panels and new_p_x is p_x and reordered.fill is None
    assert np.array_equal(reordered.apply(packed), packed[order]) and not np.array_equal(packed[order], packed)


def test_word_map_fills_offsets_and_zero_padding():
    words = np.array([1.5, -2.0], dtype=np.float32)
    got = WordMap(np.array([-1, 1, 0, -1]), np.array([96, 0, 0, 0], dtype=np.int32)).apply(words)
    assert got.view(np.int32)[0] == 96 and got[1] == -2.0 and got[2] == 1.5 and got.view(np.int32)[3] == 0
    assert WordMap(np.array([-1]), np.array([7], dtype=np.int32)).apply(np.zeros(0, np.float32)).view(np.int32)[0] == 7


@pytest.mark.parametrize("tile", [TileConfig(rows=4, vectors=3, single_vectors=3, panel=True),
                                  TileConfig(rows=2, vectors=2, single_vectors=4, panel=True),
                                  TileConfig(rows=4, vectors=1, single_vectors=1),
                                  TileConfig(rows=3, vectors=2, single_vectors=6, panel=True)])
@pytest.mark.parametrize("activation", ["none", "gelu"])
def test_kernels_with_paired_and_plain_entries_match_reference(tmp_path, tile, activation):
    # unstructured rows (paired), 4-row blocks of scattered k's (plain one-word entries of four rows), runs of k
    # (plain segments), an empty row and kept zero weights; M ragged against every tile
    g = torch.Generator().manual_seed(11)
    n, k = 61, 230
    kept = torch.rand(n, k, generator=g) < 0.1
    kept[:16] = (torch.rand(4, k, generator=g) < 0.1).repeat_interleave(4, 0)
    kept[20, 30:90] = True
    kept[21] = False
    w = torch.randn(n, k, generator=g)
    w[kept & (torch.rand(n, k, generator=g) < 0.2)] = 0.0
    lin = SparseLinear(w, torch.randn(n, generator=g), kept, block_rows=4, tile=tile, activation=activation,
                       cache_dir=tmp_path)
    assert lin.fallback_reason is None
    for m in (1, 17, 130):
        x = torch.randn(m, k, generator=g)
        want = lin.reference(x)
        assert torch.allclose(lin(x), want, atol=1e-4 * (1 + float(want.abs().max())), rtol=1e-5)


def test_all_empty_and_unstructured_kernels_match_reference(tmp_path):
    g = torch.Generator().manual_seed(5)
    for kept in (torch.zeros(40, 64, dtype=torch.bool), torch.rand(40, 64, generator=g) < 0.05):
        lin = SparseLinear(torch.randn(40, 64, generator=g), None, kept, tile=TileConfig(panel=True),
                           cache_dir=tmp_path)
        assert lin.fallback_reason is None
        x = torch.randn(33, 64, generator=g)
        assert torch.allclose(lin(x), lin.reference(x), atol=1e-4)
