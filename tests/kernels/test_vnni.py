"""The VNNI int8 variant: every dot mode emulated on any CPU, native where the flags are, always exact."""

import numpy as np
import pytest
import torch

from sparta_explore.kernels import Int8SparseLinear
from sparta_explore.kernels import int8_linear as int8_linear_module
from sparta_explore.kernels.build import cpu_flags
from sparta_explore.kernels.int8_codegen import generate_int8_source, prepare_groups
from sparta_explore.kernels.vnni_codegen import DOT_MODES, dot_mode, native_dot_mode

from .grids import pairwise
from .test_sparse_linear import block_mask, check

MODES = sorted(DOT_MODES)
needs_avx2 = pytest.mark.skipif("avx2" not in cpu_flags(), reason="int8 kernels need AVX2")


@needs_avx2
@pytest.mark.parametrize("mode, block, shape, density", pairwise(
    MODES, [(32, 32), (1, 32), (4, 4), (1, 1)],
    [(96, 128), (70, 45), (13, 300)],  # ragged edges, K not a multiple of 4
    [0.0, 0.1, 1.0]))  # all-zero weights, mostly empty blocks, dense
def test_emulated_vnni_kernels_match_the_quantized_reference(tmp_path, mode, block, shape, density):
    n, k = shape
    layer = Int8SparseLinear(torch.randn(n, k), torch.randn(n), block_mask(n, k, block, density),
                             block_rows=block[0], dot=mode, emulate_dot=True, cache_dir=tmp_path)
    assert layer.fallback_reason is None
    if layer.variant == "vnni":
        assert layer.dot_path == f"{mode} (emulated)"
    for m in (1, 49, 130, 1000):  # ragged M tiles; 1000: one tile per work item, no shared pack
        check(layer, m, k)


@needs_avx2
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(70, 45), (13, 300), (40, 768)])
def test_scattered_patterns_run_wide_one_row_tiles_exactly(tmp_path, monkeypatch, mode, shape):
    # unstructured rows step one quad at a time; their one-row tiles cover twice the M (bigger work item)
    from dataclasses import replace

    monkeypatch.setitem(DOT_MODES, mode, replace(DOT_MODES[mode], cost=0.01))  # quads even where pairs win
    n, k = shape
    layer = Int8SparseLinear(torch.randn(n, k), torch.randn(n), block_mask(n, k, (1, 1), 0.08), block_rows=1,
                             dot=mode, emulate_dot=True, cache_dir=tmp_path)
    assert layer.variant == "vnni" and layer.fallback_reason is None
    assert layer.dot.vectors_for(1) == max(DOT_MODES[mode].vectors_for(1), 2 * DOT_MODES[mode].vectors)
    for m in (1, 95, 97, 500):  # around one and two wide tiles
        check(layer, m, k)


@needs_avx2
@pytest.mark.parametrize("mode", MODES)
def test_small_m_keeps_narrow_tiles_on_scattered_patterns(tmp_path, monkeypatch, mode):
    # at M = 128 a wide tile leaves a ragged 32-row tail and one thread idle: the narrow tiles run
    from dataclasses import replace

    from sparta_explore.kernels.vnni_codegen import WIDE_MIN_M

    monkeypatch.setitem(DOT_MODES, mode, replace(DOT_MODES[mode], cost=0.01))
    kept = block_mask(40, 300, (1, 1), 0.08)
    w, b = torch.randn(40, 300), torch.randn(40)
    small = Int8SparseLinear(w, b, kept, dot=mode, emulate_dot=True, cache_dir=tmp_path, expected_m=WIDE_MIN_M - 1)
    large = Int8SparseLinear(w, b, kept, dot=mode, emulate_dot=True, cache_dir=tmp_path, expected_m=WIDE_MIN_M)
    assert small.dot.vectors_for(1) == DOT_MODES[mode].vectors_for(1)
    assert large.dot.vectors_for(1) == max(DOT_MODES[mode].vectors_for(1), 2 * DOT_MODES[mode].vectors)
    for m in (1, 128):
        check(small, m, 300)


@needs_avx2
@pytest.mark.parametrize("mode, act, weight_bits, act_bits",
                         pairwise(MODES, ["relu", "gelu", "silu"], [(8, 8), (4, 8), (8, 4)], spread=(2,)))
def test_emulated_vnni_with_activations_and_narrow_grids(tmp_path, mode, act, weight_bits, act_bits):
    n, k = 64, 96
    layer = Int8SparseLinear(torch.randn(n, k), torch.randn(n), block_mask(n, k, (16, 16), 0.5), block_rows=16,
                             activation=act, weight_bits=weight_bits, act_bits=act_bits, dot=mode,
                             emulate_dot=True, cache_dir=tmp_path)
    assert layer.variant == "vnni" and layer.fallback_reason is None
    check(layer, 77, k)


@needs_avx2
@pytest.mark.parametrize("mode", MODES)
def test_full_8_bit_sums_are_exact_no_int16_saturation(tmp_path, mode):
    """Every activation at +-127 (u8 255 / 1 after the offset) times every weight at +-127: int32 sums only."""
    n, k = 16, 512
    w = torch.ones(n, k)
    w[1::2] = -1.0
    layer = Int8SparseLinear(w, None, torch.ones(n, k, dtype=torch.bool), block_rows=16, dot=mode,
                             emulate_dot=True, cache_dir=tmp_path)
    assert layer.variant == "vnni"
    x = torch.full((50, k), 3.0)
    x[1::2] = -3.0
    want = layer.reference(x)
    assert torch.equal(layer(x), want)
    assert float(want.abs().max()) == pytest.approx(3.0 * k, rel=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_native_vnni_kernels_match_the_reference(tmp_path, mode):
    _native_skip(mode)
    n, k = 70, 45
    for block, density in (((32, 32), 0.1), ((1, 1), 0.5), ((16, 16), 1.0)):
        layer = Int8SparseLinear(torch.randn(n, k), torch.randn(n), block_mask(n, k, block, density),
                                 block_rows=block[0], dot=mode, activation="gelu", cache_dir=tmp_path)
        assert layer.fallback_reason is None
        for m in (1, 49, 1000):
            check(layer, m, k)
    layer = Int8SparseLinear(torch.randn(64, 64), None, torch.ones(64, 64, dtype=torch.bool), dot=mode,
                             cache_dir=tmp_path)
    assert layer.variant == "vnni" and layer.dot_path == mode


def _native_skip(mode: str) -> None:
    missing = sorted(DOT_MODES[mode].needs - cpu_flags())
    if missing:
        pytest.skip(f"{mode} needs CPU flags this machine lacks: {missing}")


def test_native_mode_comes_from_the_cpu_flags():
    assert native_dot_mode(frozenset({"avx2", "fma"})) is None
    assert native_dot_mode(frozenset({"avx2", "avx_vnni"})).name == "avx_vnni"
    assert native_dot_mode(frozenset({"avx2", "avx_vnni", "avx512f", "avx512_vnni"})).name == "avx512_vnni"
    with pytest.raises(ValueError, match="unknown VNNI dot mode 'sse'"):
        dot_mode("sse")


def test_a_named_mode_the_cpu_lacks_is_refused_unless_emulated(monkeypatch, tmp_path):
    monkeypatch.setattr(int8_linear_module, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    with pytest.raises(ValueError, match=r"avx512_vnni.*lacks \(avx512_vnni, avx512f\).*emulate_dot=True"):
        Int8SparseLinear(torch.randn(8, 8), None, torch.ones(8, 8, dtype=torch.bool), dot="avx512_vnni")
    auto = Int8SparseLinear(torch.randn(8, 8), None, torch.ones(8, 8, dtype=torch.bool), cache_dir=tmp_path)
    assert auto.dot is None and auto.variant in ("int16", "u8")


@pytest.mark.parametrize("mode", MODES)
def test_emulated_source_has_no_vnni_instruction_and_native_source_has_it(mode):
    kept = np.ones((16, 64), dtype=bool)
    dot = dot_mode(mode)
    groups, variant = prepare_groups(kept, 16, 8, 8, dot)
    assert variant == "vnni"
    native = generate_int8_source(groups, 16, 64, "none", "f", variant="vnni", dot=dot).text
    emulated = generate_int8_source(groups, 16, 64, "none", "f", variant="vnni", dot=dot, emulate=True).text
    assert "dpbusd" in native and "dpbusd" not in emulated


def test_quads_are_chosen_unless_pairs_fit_the_pattern_exactly():
    dot = dot_mode("avx512_vnni")
    pairs_exact = np.zeros((64, 256), dtype=bool)
    pairs_exact[:, 0::8] = pairs_exact[:, 1::8] = True  # pairs hold no padding, quads hold 2 zeros in 4
    assert prepare_groups(pairs_exact, 1, 8, 8, dot)[1] == "int16"
    # unstructured: quads pad more products, but the kernels are bound by loop steps (measured faster)
    assert prepare_groups(block_mask(64, 256, (1, 1), 0.1).numpy(), 1, 8, 8, dot)[1] == "vnni"
    assert prepare_groups(block_mask(64, 256, (32, 32), 0.3).numpy(), 32, 8, 8, dot)[1] == "vnni"


@pytest.mark.parametrize("pattern", [(1, 1), (1, 32), (32, 32)])
def test_unit_segments_keep_every_k_and_split_only_short_segments(pattern):
    from sparta_explore.kernels.groups import align_segments, plan_groups, unit_segments

    kept = block_mask(48, 200, pattern, 0.05 if pattern == (1, 1) else 0.2).numpy()
    aligned = align_segments(plan_groups(kept, pattern[0], 6), 4)
    split = unit_segments(aligned, 4)
    def covered(groups, g):
        a, b = int(groups.seg_ptr[g]), int(groups.seg_ptr[g + 1])
        return sorted(k for s in range(a, b) for k in range(groups.seg_k0[s], groups.seg_k0[s] + groups.seg_len[s]))

    for g in range(len(aligned.row0)):
        assert covered(split, g) == covered(aligned, g)
    assert np.array_equal(split.w_off, aligned.w_off)
    if pattern == (1, 1):
        assert (split.seg_len == 4).mean() > 0.9 and len(split.seg_len) > len(aligned.seg_len)  # one quad per step
    else:
        assert split.seg_len.max() >= 32  # block runs keep their tight loop


def test_gelu_runs_as_a_wide_pass_on_16_lane_modes_only():
    # 16-lane VNNI kernels apply GELU over the rows in 16-float vectors (8-float stores cost 2.5x)
    kept = np.ones((32, 64), dtype=bool)
    for mode in MODES:
        dot = dot_mode(mode)
        groups, variant = prepare_groups(kept, 32, 8, 8, dot)
        src = generate_int8_source(groups, 32, 64, "gelu", "f", variant=variant, dot=dot, emulate=True).text
        tiles = src[src.index("qtile1("):src.index("void f(")]
        assert ("act_rows(yb" in src) == (dot.lanes == 16)
        assert ("vgelu(" in tiles) == (dot.lanes != 16)
