"""Scattered layouts in one pass: every array equal to the general path's (groups, then panels by length)."""

import dataclasses

import numpy as np
import pytest
import torch

from sparta_explore.kernels import SparseLinear
from sparta_explore.kernels import fp32_layouts as layouts_module
from sparta_explore.kernels.bsr_codegen import ROWS_IO, TileConfig, _chunks
from sparta_explore.kernels.groups import SHORT_SEGMENTS, plan_groups, unit_segments
from sparta_explore.kernels.panels import by_length, cut_panels
from sparta_explore.kernels.scattered import is_scattered, scattered_groups, scattered_panels


def assert_same(a, b) -> None:
    """Every field equal, arrays in value and dtype."""
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), f.name
        else:
            assert x == y, f.name


def general_groups(kept: np.ndarray, short: float):
    return unit_segments(plan_groups(kept, 1, 4), 1, short)


def random_mask(rng: np.random.Generator, n: int, k: int, density: float, empty_rows: int = 0) -> np.ndarray:
    kept = rng.random((n, k)) < density
    kept[rng.choice(n, size=min(n, empty_rows), replace=False)] = False
    return kept


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("density", [0.02, 0.1, 0.3])
@pytest.mark.parametrize("short", [SHORT_SEGMENTS, np.inf])
def test_scattered_groups_equal_the_general_path(seed, density, short):
    rng = np.random.default_rng(seed)
    kept = random_mask(rng, int(rng.integers(1, 70)), int(rng.integers(1, 400)), density, empty_rows=seed)
    groups = scattered_groups(kept, short)
    want = general_groups(kept, short)
    if groups is None:  # a row with long runs keeps its loop: not scattered, the general path serves it
        assert not is_scattered(want)
        return
    assert_same(groups, want)
    assert is_scattered(groups)


def test_a_row_of_long_runs_is_not_scattered_and_short_inf_always_splits():
    kept = np.zeros((3, 64), dtype=bool)
    kept[0, [1, 7, 30]] = True
    kept[2, 8:40] = True  # one run of 32: averages more than SHORT_SEGMENTS words
    assert scattered_groups(kept, SHORT_SEGMENTS) is None
    assert not is_scattered(general_groups(kept, SHORT_SEGMENTS))
    assert_same(scattered_groups(kept, np.inf), general_groups(kept, np.inf))


def test_runs_do_not_cross_rows():
    # row 0 ends kept and row 1 starts kept: flat positions follow each other, but they are two runs
    kept = np.zeros((2, 4), dtype=bool)
    kept[0, 3] = kept[1, 0] = kept[1, 1] = True
    assert_same(scattered_groups(kept, 3.0), general_groups(kept, 3.0))


def test_empty_and_all_empty_masks():
    for kept in (np.zeros((5, 7), dtype=bool), np.zeros((0, 7), dtype=bool)):
        groups = scattered_groups(kept, SHORT_SEGMENTS)
        assert groups is not None and len(groups.row0) == 0 and groups.seg_ptr.tolist() == [0]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("rows", [1, 4, 16, 64, 256, 1000])
def test_scattered_panels_equal_cut_panels_then_by_length(seed, rows):
    rng = np.random.default_rng(100 + seed)
    n, k = int(rng.integers(1, 90)), int(rng.integers(1, 700))
    kept = random_mask(rng, n, k, float(rng.choice([0.03, 0.1, 0.2])), empty_rows=seed % 4)
    groups = scattered_groups(kept, np.inf)
    if not len(groups.seg_k0):
        return
    chunk_g0 = _chunks(groups, n, np.flatnonzero(~kept.any(axis=1)))[0]
    want, want_order = by_length(cut_panels(groups, k, rows, chunk_g0), chunk_g0, groups.rows)
    got, order = scattered_panels(groups, k, rows, chunk_g0)
    assert_same(got, want)
    assert order.dtype == want_order.dtype and np.array_equal(order, want_order)


def test_layout_takes_the_one_pass_path_and_the_kernel_matches_the_reference(monkeypatch):
    rng = np.random.default_rng(7)
    weight = torch.from_numpy(rng.standard_normal((67, 300)).astype(np.float32))
    kept = torch.from_numpy(random_mask(rng, 67, 300, 0.1, empty_rows=3))
    weight[kept & (torch.rand(67, 300) < 0.2)] = 0.0  # zero weights among the kept ones
    calls = []
    monkeypatch.setattr(layouts_module, "plan_groups", lambda *a, **kw: calls.append(a) or plan_groups(*a, **kw))
    op = SparseLinear(weight, torch.randn(67), kept, tile=TileConfig(rows=4, vectors=3, single_vectors=3, panel=True))
    assert not calls, "a scattered pattern went the general way"
    assert op.fallback_reason is None
    for m in (1, 5, 47, 130):
        x = torch.randn(m, 300)
        torch.testing.assert_close(op(x), op.reference(x), rtol=1e-4, atol=1e-4)


def test_layout_tables_and_packed_weights_equal_the_general_path(monkeypatch):
    rng = np.random.default_rng(3)
    weight = rng.standard_normal((130, 520)).astype(np.float32)
    kept = random_mask(rng, 130, 520, 0.1, empty_rows=5)
    cfg = TileConfig(rows=4, vectors=3, single_vectors=3, panel=True)
    fast, fast_packed = layouts_module._rows_layout(weight, kept, 1, cfg, 16, "gelu", "k", ROWS_IO, True)
    monkeypatch.setattr(layouts_module, "scattered_groups", lambda kept, short: None)
    monkeypatch.setattr("sparta_explore.kernels.bsr_codegen.is_scattered", lambda groups: False)
    slow, slow_packed = layouts_module._rows_layout(weight, kept, 1, cfg, 16, "gelu", "k", ROWS_IO, True)
    assert fast.text == slow.text
    assert np.array_equal(fast_packed, slow_packed)
    assert fast.tables.scalars == slow.tables.scalars
    assert [(name, ctype) for name, _, ctype in fast.tables.arrays] == [(n, c) for n, _, c in slow.tables.arrays]
    assert all(np.array_equal(a, b) for (_, a, _), (_, b, _) in zip(fast.tables.arrays, slow.tables.arrays))
