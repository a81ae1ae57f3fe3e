"""The segment layout: rows regrouped per K panel by their kept pattern, exact on every pattern."""

import numpy as np
import pytest
import torch

from sparta_explore.kernels import SparseLinear
from sparta_explore.kernels.bsr_codegen import TileConfig
from sparta_explore.kernels.segment_codegen import pack_segment_weights, panel_width, plan_segments, row_chunks, sharing
from sparta_explore.kernels.tuning import MIN_SHARING, candidates, default_tile

from .grids import pairwise
from .test_sparse_linear import block_mask, check

SEGMENT_TILES = [TileConfig(6, 2, 6, layout="segments"), TileConfig(2, 4, 8, layout="segments"),
                 TileConfig(4, 3, 3, layout="segments"), TileConfig(6, 2, 2, layout="segments")]


SHAPES = [(96, 128), (70, 45), (20, 300)]  # ragged edges; K > N takes the panel-outer order


def case_id(value) -> str:
    return f"{value.rows}x{value.vectors}/{value.single_vectors}" if isinstance(value, TileConfig) else str(value)


CASES = (pairwise(SEGMENT_TILES[:1], [(1, 32), (32, 32), (1, 64), (4, 8), (1, 1)], SHAPES,
                  [0.0, 0.1, 0.5, 1.0], ids=case_id)  # all-zero ... fully dense
         + pairwise(SEGMENT_TILES[1:], [(1, 32), (4, 8)], SHAPES, [0.5], ids=case_id))


@pytest.mark.parametrize("tile, block, shape, density", CASES)
def test_segment_layout_matches_reference(tmp_path, tile, block, shape, density):
    n, k = shape
    w, b = torch.randn(n, k), torch.randn(n)
    layer = SparseLinear(w, b, block_mask(n, k, block, density), block_rows=block[0], tile=tile, cache_dir=tmp_path)
    assert layer.fallback_reason is None
    for m in (1, 5, 49, 130):
        check(layer, m, k)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_segment_layout_fuses_activation_and_empty_rows_get_act_of_bias(tmp_path, activation):
    kept = block_mask(40, 64, (1, 32), 0.3)
    kept[8:16] = False
    layer = SparseLinear(torch.randn(40, 64), torch.randn(40), kept, activation=activation,
                         tile=SEGMENT_TILES[0], cache_dir=tmp_path)
    check(layer, 33, 64)
    y = layer(torch.randn(3, 64))
    act = torch.relu if activation == "relu" else torch.nn.functional.gelu
    assert torch.allclose(y[:, 8:16], act(layer.bias[8:16]).expand(3, 8), atol=1e-6)


def test_rows_with_the_same_panel_pattern_share_an_entry():
    kept = np.zeros((8, 64), dtype=bool)
    kept[[0, 3, 5], :32] = True   # three rows, one pattern in panel 0
    kept[[1, 3], 32:] = True      # two rows in panel 1; row 3 is in both
    plan = plan_segments(kept, max_rows=4)
    assert plan.panel == 32
    assert sorted(plan.e_nrows.tolist()) == [2, 3]
    entries = {tuple(plan.e_rows[e, :plan.e_nrows[e]]) for e in range(len(plan.e_nrows))}
    assert entries == {(0, 3, 5), (1, 3)}


def test_buckets_are_cut_at_the_tile_height_and_weights_follow_the_entries():
    kept = np.zeros((16, 32), dtype=bool)
    kept[:, 4:12] = True  # one bucket of 16 rows, one 8-wide piece
    plan = plan_segments(kept, max_rows=6)
    assert plan.e_nrows.tolist() == [6, 2, 6, 2]  # two chunks of 8 rows, each cut into 6 + 2
    assert plan.p_k0.tolist() == [4] * 4 and plan.p_len.tolist() == [8] * 4
    weight = np.arange(16 * 32, dtype=np.float32).reshape(16, 32)
    packed = pack_segment_weights(weight, kept, plan)
    rows = plan.e_rows[0, :6]
    assert np.array_equal(packed[:6 * 8], weight[rows, 4:12].T.reshape(-1))


def test_panel_width_follows_the_pattern_granularity():
    assert panel_width(block_mask(64, 256, (1, 64), 0.5).numpy()) == 64
    assert panel_width(block_mask(64, 256, (1, 32), 0.5).numpy()) == 32
    assert panel_width(block_mask(64, 256, (1, 1), 0.5).numpy()) == 32


def test_row_chunks_are_balanced_multiples_of_eight():
    kept = np.zeros((100, 16), dtype=bool)
    kept[:50] = True
    bounds = row_chunks(kept, chunks=4)
    assert bounds[0] == 0 and bounds[-1] == 100
    assert all(b % 8 == 0 for b in bounds[:-1]) and np.all(np.diff(bounds) >= 0)
    assert bounds[-2] <= 56  # the kept work sits in the first half: the last chunk is the empty rest


def test_tile_search_offers_segments_only_where_rows_share():
    shared = block_mask(256, 256, (1, 32), 0.1).numpy()
    unshared = block_mask(256, 256, (1, 1), 0.1).numpy()
    assert sharing(shared) >= MIN_SHARING > sharing(unshared)
    assert any(c.layout == "segments" for c in candidates(shared))
    assert all(c.layout == "rows" for c in candidates(unshared))
    assert default_tile(shared, block_rows=1).layout == "segments"
    assert default_tile(unshared, block_rows=1).layout == "rows"
    assert default_tile(shared, block_rows=32).layout == "rows"


def test_unknown_layout_is_one_clear_error():
    with pytest.raises(ValueError, match="layout"):
        TileConfig(layout="columns")


@pytest.mark.parametrize("shape", [(40, 300), (300, 40)])  # K > N: panel-outer order; K <= N: chunk by chunk
@pytest.mark.parametrize("tile", SEGMENT_TILES[:2], ids=case_id)
def test_large_m_runs_one_tile_per_item(tmp_path, shape, tile):
    n, k = shape
    layer = SparseLinear(torch.randn(n, k), torch.randn(n), block_mask(n, k, (1, 32), 0.3), activation="gelu",
                         tile=tile, cache_dir=tmp_path)
    check(layer, 1000, k)  # >= 4 tiles per thread: every item packs its own tile (no shared buffer)


def _loop_sharing(kept, panel):
    pairs = distinct = 0
    for k0 in range(0, kept.shape[1], panel):
        live = kept[:, k0:k0 + panel][kept[:, k0:k0 + panel].any(axis=1)]
        if len(live):
            pairs += len(live)
            distinct += len(np.unique(np.packbits(live, axis=1), axis=0))
    return pairs / distinct if distinct else 0.0


@pytest.mark.parametrize("shape", [(96, 200), (37, 53), (1, 1), (0, 5)])
@pytest.mark.parametrize("density", [0.0, 0.1, 0.5, 1.0])
@pytest.mark.parametrize("panel", [8, 24, 32, 64])
def test_sharing_equals_a_loop_over_panels(shape, density, panel):
    kept = np.random.default_rng(0).random(shape) < density
    if shape[0] > 8:
        kept[: shape[0] // 2] = kept[0]  # rows that share every panel's pattern
    assert sharing(kept, panel) == _loop_sharing(kept, panel)


def _plan_by_loops(kept, max_rows, panel):
    """plan_segments as first written, a loop per panel and chunk (the reference for the array code)."""
    from sparta_explore.kernels.groups import runs

    chunk_n = row_chunks(kept)
    rows, nrows, piece, k0s, lens, woff, e_ptr, offset = [], [], [0], [], [], [], [], 0
    for p0 in range(0, kept.shape[1], panel):
        for c in range(len(chunk_n) - 1):
            e_ptr.append(len(nrows))
            n0, n1 = int(chunk_n[c]), int(chunk_n[c + 1])
            sub = kept[n0:n1, p0:p0 + panel]
            live = np.flatnonzero(sub.any(axis=1))
            if not len(live):
                continue
            _, first, inverse = np.unique(np.packbits(sub[live], axis=1), axis=0, return_index=True,
                                          return_inverse=True)
            for b in range(len(first)):
                members = (live[inverse.reshape(-1) == b] + n0).tolist()
                _, starts, lengths = runs(sub[live[first[b]]][None, :])
                for g0 in range(0, len(members), max_rows):
                    group = members[g0:g0 + max_rows]
                    rows.append(group + [group[0]] * (max_rows - len(group)))
                    nrows.append(len(group))
                    woff.append(offset)
                    for k0, length in zip(starts.tolist(), lengths.tolist()):
                        k0s.append(p0 + k0)
                        lens.append(length)
                        offset += length * len(group)
                    piece.append(len(k0s))
        e_ptr.append(len(nrows))
    return {"e_ptr": e_ptr, "e_rows": np.asarray(rows).reshape(-1, max_rows), "e_nrows": nrows, "e_piece": piece,
            "p_k0": k0s, "p_len": lens, "e_woff": woff}


@pytest.mark.parametrize("shape", [(70, 45), (300, 200), (8, 32), (5, 3), (0, 64)])
@pytest.mark.parametrize("block, density", [((1, 1), 0.1), ((32, 32), 0.3), ((1, 32), 0.3), ((4, 4), 0.0),
                                            ((2, 8), 0.5), ((64, 64), 0.5)])
@pytest.mark.parametrize("max_rows", [1, 2, 6])
def test_array_plan_equals_the_loop_per_panel_and_chunk(shape, block, density, max_rows):
    kept = block_mask(*shape, block, density).numpy() if shape[0] else np.zeros(shape, dtype=bool)
    for panel in (32, 64):
        plan, want = plan_segments(kept, max_rows, panel), _plan_by_loops(kept, max_rows, panel)
        for field, value in want.items():
            assert np.array_equal(np.asarray(getattr(plan, field)).reshape(np.asarray(value).shape), value), field
        weight = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        packed = pack_segment_weights(weight, kept, plan)
        rows, ks = [], []  # the loop's packing order: per entry, per piece, per k, the entry's rows
        for e in range(len(plan.e_nrows)):
            for p in range(int(plan.e_piece[e]), int(plan.e_piece[e + 1])):
                for k in range(int(plan.p_k0[p]), int(plan.p_k0[p] + plan.p_len[p])):
                    rows += plan.e_rows[e, :plan.e_nrows[e]].tolist()
                    ks += [k] * int(plan.e_nrows[e])
        want_packed = np.where(kept[rows, ks], weight[rows, ks], 0) if rows else np.zeros(1)
        assert np.array_equal(packed, want_packed.astype(np.float32))
