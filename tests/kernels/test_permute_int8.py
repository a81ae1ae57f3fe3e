"""The permute int8 kernel: exact against the quantized reference, emulated on any CPU, native where VBMI is."""

import copy

import numpy as np
import pytest
import torch

from sparta_explore.kernels import Int8SparseLinear, set_target_isa, target_isa
from sparta_explore.kernels.build import cpu_flags
from sparta_explore.kernels.permute_int8 import (
    FIXED,
    NEEDS,
    PermutedInt8Linear,
    has_permute,
    live_quads,
    plan_steps,
    prefers_permute,
)

from .grids import pairwise
from .test_sparse_linear import block_mask, check, same_after_copies

native = pytest.mark.skipif(not has_permute(), reason=f"needs {' and '.join(sorted(NEEDS))} (AVX-512 VBMI + VNNI)")
MODES = [pytest.param(True, id="emulated"), pytest.param(False, id="native", marks=native)]


def _loop_steps(wq, kept):
    """plan_steps as plain loops: per block of 16 rows, its non-empty windows by step count (most first, then by
    window), each needing as many steps as its fullest row needs quads; runs of equal counts."""
    n, k = kept.shape
    blocks, windows = -(-n // 16), max(1, -(-k // 64))
    ks, ws, cell_windows, runs, block_runs = [], [], [], [], [0]
    for b in range(blocks):
        cells = []
        for w in range(windows):
            lists = [[c for c in range(w * 64, min(k, w * 64 + 64)) if r < n and kept[r, c]]
                     for r in range(b * 16, b * 16 + 16)]
            count = -(-max(len(cols) for cols in lists) // 4)
            if count:
                cells.append((-count, w, lists))
        for negative, w, lists in sorted(cells, key=lambda c: c[:2]):
            if not runs or block_runs[-1] == len(runs) or runs[-1][0] != -negative:
                runs.append([-negative, 0, len(ks), len(cell_windows)])
            runs[-1][1] += 1
            cell_windows.append(w)
            for s in range(-negative):
                kb, wb = np.zeros(64, np.uint8), np.zeros(64, np.int8)
                for i, cols in enumerate(lists):
                    for j, c in enumerate(cols[4 * s:4 * s + 4]):
                        kb[4 * i + j], wb[4 * i + j] = c % 64, wq[b * 16 + i, c]
                ks.append(kb), ws.append(wb)
        block_runs.append(len(runs))
    return (np.array(ks, np.uint8).reshape(-1, 64), np.array(ws, np.int8).reshape(-1, 64),
            np.array(cell_windows, np.int32), np.array(runs, np.int64).reshape(-1, 4), np.array(block_runs, np.int64))


@pytest.mark.parametrize("shape,density", [((40, 130), 0.15), ((16, 64), 1.0), ((5, 3), 0.5), ((33, 200), 0.0)])
def test_steps_equal_the_loop_over_blocks_and_windows(shape, density):
    g = np.random.default_rng(sum(shape))
    kept = g.random(shape) < density
    wq = np.where(kept, g.integers(-127, 128, shape), 0).astype(np.int8)
    for got, want in zip(plan_steps(wq, kept), _loop_steps(wq, kept)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("emulate, shape, density", pairwise(
    MODES,
    [(96, 128), (70, 45), (13, 300), (33, 64)],  # rows and k ragged to 16 and 64
    [0.0, 0.1, 0.4, 1.0]))  # all-zero weights ... a full window (16 steps)
def test_permute_kernel_matches_the_quantized_reference(tmp_path, emulate, shape, density):
    n, k = shape
    layer = PermutedInt8Linear(torch.randn(n, k), torch.randn(n), block_mask(n, k, (1, 1), density, seed=n),
                               emulate_dot=emulate, cache_dir=tmp_path)
    assert layer.fallback_reason is None and layer.variant == "permute"
    assert layer.dot_path == "avx512_vbmi permute" + (" (emulated)" if emulate else "")
    for m in (1, 17, 130):  # within a tile of 16, ragged, and enough tiles that blocks are not split
        check(layer, m, k, seed=m)


@pytest.mark.parametrize("emulate", MODES)
def test_every_run_body_and_the_chunk_loop(tmp_path, emulate):
    # block b's fullest row needs b + 1 steps in windows 0 and 2 (a run of two cells), fewer in window 1, and
    # up to 2 in the ragged last window (8 k): every unrolled count 1..FIXED, the chunk loop past it (with a
    # chunk remainder), runs of one and two cells; the last block keeps nothing, one row keeps zero weights
    blocks, k = FIXED + 4, 200
    kept = torch.zeros(16 * blocks + 5, k, dtype=torch.bool)  # and 5 rows in a ragged block
    for b in range(blocks - 1):
        row = 16 * b + b % 16
        for window, count in ((0, b + 1), (2, b + 1), (1, max(1, b - 1))):
            kept[row, window * 64:window * 64 + min(64, 4 * count - b % 4)] = True
        kept[16 * b + 3, 192:192 + min(8, 1 + b)] = True
    kept[-3, ::7] = True
    counts = {int(c) for c in plan_steps(np.ones_like(kept.numpy(), np.int8), kept.numpy()).runs[:, 0]}
    assert set(range(1, FIXED + 1)) <= counts and max(counts) > FIXED
    weight = torch.randn(kept.shape)
    weight[16] = 0  # a row of zero weights where the pattern keeps some
    layer = PermutedInt8Linear(weight, torch.randn(kept.shape[0]), kept, emulate_dot=emulate, cache_dir=tmp_path)
    assert layer.fallback_reason is None
    for m in (1, 17, 130):
        check(layer, m, k, seed=m)


@pytest.mark.parametrize("emulate", MODES)
@pytest.mark.parametrize("activation", ["gelu", "relu", "silu"])
def test_activations_bits_and_leading_dims(tmp_path, emulate, activation):
    layer = PermutedInt8Linear(torch.randn(48, 100) * 5, None, torch.rand(48, 100) < 0.2, activation=activation,
                               weight_bits=4, act_bits=6, emulate_dot=emulate, cache_dir=tmp_path)
    x = torch.randn(2, 9, 100) * 4
    with torch.no_grad():
        got, want = layer(x), layer.reference(x)
    assert got.shape == (2, 9, 48)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4 * (1 + float(want.abs().max())))
    zero = torch.zeros(3, 100)  # rows of zeros: scale 1, every level 128
    torch.testing.assert_close(layer(zero), layer.reference(zero))


@pytest.mark.parametrize("shape,density", [((40, 130), 0.15), ((16, 64), 1.0), ((5, 3), 0.5), ((33, 202), 0.0),
                                           ((7, 9), 0.3)])
def test_live_quads_count_the_quads_holding_a_kept_weight(shape, density):
    kept = np.random.default_rng(sum(shape)).random(shape) < density
    pad = np.zeros((shape[0], -(-shape[1] // 4) * 4), dtype=bool)  # k ragged to 4: the last quad is partial
    pad[:, :shape[1]] = kept
    assert live_quads(kept) == int(pad.reshape(shape[0], -1, 4).any(axis=2).sum())


def test_the_pattern_picks_the_kernel():
    g = torch.Generator().manual_seed(0)
    assert prefers_permute((torch.rand(3072, 768, generator=g) < 0.1).numpy())  # unstructured 90%
    assert not prefers_permute(block_mask(3072, 768, (1, 32), 0.1).numpy())  # runs of 32: full quads
    assert not prefers_permute(block_mask(3072, 768, (1, 4), 0.1).numpy())  # whole quads: the two within 2%
    assert not prefers_permute(block_mask(3072, 768, (4, 4), 0.1).numpy())
    assert prefers_permute(block_mask(3072, 768, (1, 2), 0.1).numpy())  # half quads: 4.3 vs 9.1 ms (Zen 5)
    assert prefers_permute(block_mask(3072, 768, (2, 2), 0.1).numpy())
    assert prefers_permute(block_mask(768, 3072, (32, 32), 0.1).numpy())  # 16 rows of a block: full steps


@native
def test_the_permute_and_quad_kernels_agree(tmp_path):
    # the same quantized product by two kernels (their speeds: benchmarks/peers.py)
    kept = torch.rand(256, 768) < 0.1
    w, b = torch.randn(256, 768), torch.randn(256)
    x = torch.randn(64, 768)
    quads = Int8SparseLinear(w, b, kept, cache_dir=tmp_path)
    permute = PermutedInt8Linear(w, b, kept, cache_dir=tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(permute(x), quads(x), rtol=1e-5, atol=1e-4 * (1 + float(quads(x).abs().max())))


def test_copies_pickles_and_rebuilds_where_vbmi_is_missing(tmp_path):
    layer = PermutedInt8Linear(torch.randn(40, 90), torch.randn(40), torch.rand(40, 90) < 0.2, emulate_dot=True,
                               cache_dir=tmp_path)
    x = torch.randn(20, 90)
    same_after_copies(layer, x)
    with torch.no_grad():
        want = layer(x)
    native_layer = copy.deepcopy(layer)
    native_layer.emulate_dot = False
    before = target_isa()
    set_target_isa("avx2")  # no AVX-512 flags: the permute kernel cannot run, the quad kernel computes the same
    try:
        assert not has_permute()
        rebuilt = native_layer.rebuilt(tmp_path)
    finally:
        set_target_isa(before)
    if "avx2" in cpu_flags():
        assert type(rebuilt) is Int8SparseLinear and rebuilt.fallback_reason is None
        with torch.no_grad():
            torch.testing.assert_close(rebuilt(x), want, rtol=1e-5, atol=1e-4 * (1 + float(want.abs().max())))


def test_without_vbmi_a_native_build_falls_back_with_the_reason(tmp_path):
    before = target_isa()
    set_target_isa("avx2")
    try:
        with pytest.warns(UserWarning, match="needs avx512_vnni and avx512vbmi"):
            layer = PermutedInt8Linear(torch.randn(16, 64), None, torch.rand(16, 64) < 0.2, cache_dir=tmp_path)
    finally:
        set_target_isa(before)
    assert layer.dot_path == "reference"
    x = torch.randn(3, 64)
    torch.testing.assert_close(layer(x), layer.reference(x))
