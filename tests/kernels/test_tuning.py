"""Tile search: every candidate is correct, the winner is cached and reused."""

import json
import time

import pytest
import torch

from sparta_explore.activations import ACTIVATIONS
from sparta_explore.kernels import SparseLinear, bsr_codegen, tuning
from sparta_explore.kernels.panels import fp32_budget, panel_rows
from sparta_explore.kernels.sparse_linear import search
from sparta_explore.kernels.tuning import (
    BLOCK_CANDIDATES,
    CANDIDATES,
    SCATTERED_CANDIDATES,
    SEGMENT_CANDIDATES,
    candidates,
    default_tile,
    m_bucket,
    pattern_class,
    scattered_candidates,
)

from .test_sparse_linear import block_mask, check


def test_every_candidate_tiling_is_correct(tmp_path):
    w, b = torch.randn(70, 51), torch.randn(70)
    kept = block_mask(70, 51, (2, 4), 0.4)
    for cfg in CANDIDATES:
        layer = SparseLinear(w, b, kept, block_rows=2, activation="gelu", tile=cfg, cache_dir=tmp_path)
        assert layer.fallback_reason is None, cfg
        check(layer, 57, 51)


@pytest.mark.parametrize("every_activation", [False, pytest.param(True, marks=pytest.mark.slow)])
@pytest.mark.parametrize("outputs_in_l2", [True, False])  # K panels outer over all chunks, or chunks outer
@pytest.mark.parametrize("width", sorted(SCATTERED_CANDIDATES))
def test_every_scattered_candidate_is_correct_across_panels(tmp_path, monkeypatch, width, outputs_in_l2,
                                                            every_activation):
    if not outputs_in_l2:
        monkeypatch.setattr(bsr_codegen, "cache_bytes", lambda level: 0)
    # K spans several L1 panels with a ragged last one; some rows keep nothing, some keep only zero weights, one
    # keeps a single k at a panel's edge: rows first and last in a panel, or in none
    n, k = 37, 2 * panel_rows(4 * 2 * 16, budget=fp32_budget()) + 13  # the widest panels of them (4x2x2): 3
    w, b = torch.randn(n, k), torch.randn(n)
    kept = block_mask(n, k, (1, 1), 0.1, seed=width)
    kept[3] = False
    w[5] = 0.0
    kept[7] = False
    kept[7, panel_rows(4 * 3 * 16, budget=fp32_budget())] = True
    names = list(ACTIVATIONS)
    for i, cfg in enumerate(SCATTERED_CANDIDATES[width]):
        # on 16 floats, K-panel tilings apply it as a pass over rows (`act_rows`); unless every_activation, each
        # tiling takes two in turn, every activation still met (each build is ~1 s of gcc: 20 of them took 30 s)
        acts = names if every_activation else [names[i % len(names)], names[(i + 2) % len(names)]]
        for act in acts:
            layer = SparseLinear(w, b, kept, activation=act, tile=cfg, cache_dir=tmp_path)
            assert layer.fallback_reason is None, (cfg, act)
            for m in (1, 45, 2000):  # small M: row chunks split over threads; large: a work item runs them all
                check(layer, m, k)


def test_tall_blocks_time_the_few_tilings_that_win_for_them(monkeypatch):
    for block in ((8, 8), (32, 32)):
        kept = block_mask(256, 256, block, 0.1).numpy()  # block rows share their panels: segments too
        for width in (16, 8):
            monkeypatch.setattr(tuning, "vector_width", lambda width=width: width)
            assert candidates(kept, block[0]) == BLOCK_CANDIDATES[width] + SEGMENT_CANDIDATES[:1]
        assert candidates(kept, 4) == CANDIDATES + SEGMENT_CANDIDATES  # shorter blocks: every tiling


def test_tall_blocks_default_to_the_first_tiling_their_searches_time(monkeypatch):
    kept = block_mask(256, 256, (32, 32), 0.1).numpy()
    for width in (16, 8):
        monkeypatch.setattr(tuning, "vector_width", lambda width=width: width)
        first = BLOCK_CANDIDATES[width][0]
        assert first.tile_vectors == 2  # M tiles of 2 vectors: 128 rows are whole tiles, not 2.7 of 48
        assert default_tile(kept, 32, m=128) == first and default_tile(kept, 32) == first  # unknown M: taken as few
        assert default_tile(kept, 32, m=4096) == first
        assert default_tile(kept, 4, m=4096) == tuning.TileConfig()  # short blocks keep the general default
        assert set(BLOCK_CANDIDATES[width]) <= set(candidates(kept, 32))


@pytest.mark.parametrize("block, density", [((8, 8), 0.4), ((32, 32), 0.3), ((16, 16), 1.0), ((8, 8), 0.0)])
def test_every_block_tiling_is_correct(tmp_path, block, density):
    # both widths' tilings on this CPU's vectors; rows and k ragged to the blocks and to every tile (75 = 9 x 8 + 3);
    # a row of zero weights and, at 0.4, empty blocks
    n, k = 75, 70
    w, b = torch.randn(n, k), torch.randn(n)
    w[9] = 0.0
    kept = block_mask(n, k, block, density)
    for i, cfg in enumerate(sorted({c for tiles in BLOCK_CANDIDATES.values() for c in tiles}, key=str)):
        act = list(ACTIVATIONS)[i % len(ACTIVATIONS)]
        layer = SparseLinear(w, b, kept, block_rows=block[0], activation=act, tile=cfg, cache_dir=tmp_path)
        assert layer.fallback_reason is None, cfg
        for m in (1, 33, 130):  # under one tile, ragged past two, several per thread
            check(layer, m, k)


def test_scattered_patterns_time_the_tilings_that_win_for_them(monkeypatch):
    scattered = block_mask(256, 256, (1, 1), 0.1).numpy()
    assert candidates(scattered, 1) == scattered_candidates()
    assert candidates(block_mask(256, 256, (1, 4), 0.1).numpy(), 1)[:len(CANDIDATES)] == CANDIDATES  # runs of 4
    assert candidates(scattered, 2) == CANDIDATES  # two-row blocks: every tiling
    shared = block_mask(256, 256, (1, 32), 0.1).numpy()
    assert candidates(shared, 1)[-2:] == SEGMENT_CANDIDATES  # 1x32 shares
    assert default_tile(shared, 1, m=128) == SEGMENT_CANDIDATES[1] and default_tile(shared, 1) == SEGMENT_CANDIDATES[1]
    assert default_tile(shared, 1, m=4096) == SEGMENT_CANDIDATES[0]  # an M tile of 2 vectors for few rows only
    for width in (16, 8):
        monkeypatch.setattr(tuning, "vector_width", lambda width=width: width)
        assert candidates(scattered, 1) == SCATTERED_CANDIDATES[width]
        assert default_tile(scattered, 1, m=128) == SCATTERED_CANDIDATES[width][0]
        assert default_tile(scattered, 1, m=4096) == SCATTERED_CANDIDATES[width][1 if width == 16 else 0]
        assert default_tile(scattered, 1, m=4096).panel == (width == 16)  # 16 floats: 4x3x3 in K panels


def test_search_is_cached_per_pattern_and_bucket(tmp_path):
    w = torch.randn(64, 64)
    kept = block_mask(64, 64, (8, 8), 0.3)
    best = search(w, None, kept, block_rows=8, activation="none", m=64, cache_dir=tmp_path, repeats=2)
    files = list((tmp_path / "tuning").glob("*.json"))
    offered = candidates(kept.numpy(), 8)
    assert len(files) == 1 and best in offered
    record = json.loads(files[0].read_text())
    assert len(record["seconds"]) == len(offered)
    again = search(w, None, kept, block_rows=8, activation="none", m=100, cache_dir=tmp_path)
    assert again == best and len(list((tmp_path / "tuning").glob("*.json"))) == 1  # same bucket: cache hit
    search(w, None, kept, block_rows=8, activation="none", m=4096, cache_dir=tmp_path, repeats=1)
    assert len(list((tmp_path / "tuning").glob("*.json"))) == 2 and m_bucket(4096) != m_bucket(64)


def test_auto_tile_layer_is_correct(tmp_path):
    kept = block_mask(48, 40, (16, 8), 0.5)
    layer = SparseLinear(torch.randn(48, 40), torch.randn(48), kept, block_rows=16, tile="auto", expected_m=64,
                         cache_dir=tmp_path)
    assert layer.tile in candidates(kept.numpy(), 16)
    check(layer, 70, 40)


def test_masks_drawn_alike_share_one_search_and_others_do_not(tmp_path):
    torch.manual_seed(0)
    w = torch.randn(256, 128)
    first, second = (torch.rand(256, 128) < 0.1 for _ in range(2))
    assert not torch.equal(first, second)
    assert pattern_class(first.numpy(), 1) == pattern_class(second.numpy(), 1)
    for kept in (first, second):
        search(w, None, kept, block_rows=1, activation="none", m=64, cache_dir=tmp_path, repeats=1)
    assert len(list((tmp_path / "tuning").glob("*.json"))) == 1  # one search for the class
    blocks = block_mask(256, 128, (1, 32), 0.3)
    assert pattern_class(blocks.numpy(), 1) != pattern_class(first.numpy(), 1)
    search(w, None, blocks, block_rows=1, activation="none", m=64, cache_dir=tmp_path, repeats=1)
    assert len(list((tmp_path / "tuning").glob("*.json"))) == 2


class _Sleeping:
    """A stand-in layer whose `_run` sleeps: the search's timing logic without kernels."""

    out_features = 1

    def __init__(self, seconds: float) -> None:
        self.seconds, self.calls = seconds, 0

    def _run(self, x, y) -> None:
        self.calls += 1
        time.sleep(self.seconds)


def test_far_tilings_stop_being_timed_and_close_ones_race_on():
    fast, close, far = _Sleeping(0.001), _Sleeping(0.001), _Sleeping(0.006)
    ms = tuning._time_interleaved({"fast": fast, "close": close, "far": far}, torch.zeros(1, 1), repeats=10)
    assert ms["far"] > 2 * max(ms["fast"], ms["close"])
    first_and_warm = 2  # `_time`'s warm-up call and its one timed call
    assert far.calls == first_and_warm + tuning.DROP_AFTER  # dropped after the first rounds
    assert fast.calls == close.calls > far.calls  # within KEEP_WITHIN: every round
