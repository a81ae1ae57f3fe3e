"""The AVX2 u8 x s8 int8 variant (dot=None: no VNNI): exact on narrow weight grids, never overflowing int16."""

import numpy as np
import pytest
import torch

from sparta_explore.fake_quant import qmax
from sparta_explore.kernels import Int8SparseLinear
from sparta_explore.kernels.groups import align_segments, plan_groups
from sparta_explore.kernels.int8_codegen import prepare_groups
from sparta_explore.kernels.lowbit_codegen import MAX_STEPS, accumulate_steps, offset_correction, pack_quads

from .grids import pairwise
from .test_sparse_linear import block_mask, check


@pytest.mark.parametrize("block, shape, density", pairwise(
    [(32, 32), (1, 32), (16, 16), (4, 8)],
    [(96, 128), (70, 45), (20, 300)],  # ragged edges, odd K, K > N
    [0.0, 0.1, 1.0]))
def test_u8_variant_matches_quantized_reference(tmp_path, block, shape, density):
    n, k = shape
    layer = Int8SparseLinear(torch.randn(n, k), torch.randn(n), block_mask(n, k, block, density),
                             block_rows=block[0], weight_bits=4, dot=None, cache_dir=tmp_path)
    assert layer.fallback_reason is None
    assert layer.variant == ("u8" if density > 0 else layer.variant)
    for m in (1, 49, 130, 1000):  # 1000: one tile per work item, no shared pack
        check(layer, m, k)


@pytest.mark.parametrize("weight_bits,act_bits", [(2, 8), (4, 8), (6, 8), (4, 5)])
def test_worst_case_sums_do_not_saturate(tmp_path, weight_bits, act_bits):
    """Every activation at its top level, every weight at +-top level: the largest possible sums."""
    n, k = 16, 256
    w = torch.ones(n, k)
    w[1::2] = -1.0
    layer = Int8SparseLinear(w, None, torch.ones(n, k, dtype=torch.bool), block_rows=16, weight_bits=weight_bits,
                             act_bits=act_bits, dot=None, cache_dir=tmp_path)
    assert layer.variant == "u8"
    x = torch.full((24, k), 3.0)
    x[1::2] = -3.0
    want = layer.reference(x)
    assert torch.equal(layer(x), want)
    assert float(want.abs().max()) == pytest.approx(3.0 * k, rel=1e-6)


def test_steps_are_the_largest_safe_count():
    for wb in range(2, 7):
        for ab in range(2, 9):
            steps, pair = accumulate_steps(wb, ab), 2 * (128 + qmax(ab)) * qmax(wb)
            assert steps * pair <= 32767
            assert steps == MAX_STEPS or (steps + 1) * pair > 32767
    assert accumulate_steps(8, 8) < 2 and accumulate_steps(7, 8) < 2  # wide grids keep the int16 kernel


def test_wide_grids_and_scattered_patterns_keep_the_int16_variant(tmp_path):
    kept = block_mask(64, 64, (1, 1), 0.1)
    assert prepare_groups(kept.numpy(), 1, weight_bits=4, act_bits=8)[1] == "int16"  # quads would pad ~4x
    assert prepare_groups(block_mask(64, 64, (32, 32), 0.5).numpy(), 32, weight_bits=8, act_bits=8)[1] == "int16"
    layer = Int8SparseLinear(torch.randn(64, 64), None, kept, weight_bits=4, dot=None, cache_dir=tmp_path)
    assert layer.variant == "int16"
    check(layer, 30, 64)


def test_aligned_segments_merge_and_quads_pack_little_endian():
    kept = np.zeros((1, 12), dtype=bool)
    kept[0, [1, 3, 9]] = True
    groups = align_segments(plan_groups(kept, 1), 4)
    assert groups.seg_k0.tolist() == [0, 8] and groups.seg_len.tolist() == [4, 4]
    wq = np.arange(12, dtype=np.int8).reshape(1, 12) * kept
    words = pack_quads(wq, groups)
    assert words.view(np.int8).tolist() == [0, 1, 0, 3, 0, 9, 0, 0]
    assert offset_correction(wq).tolist() == [128 * 13]
