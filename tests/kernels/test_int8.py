"""Int8SparseLinear: exact integer accumulation, so it matches the same quantization in PyTorch."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sparta_explore.kernels import Int8SparseLinear
from sparta_explore.kernels.int8_codegen import pack_pairs, quantize_rows

from .grids import pairwise
from .test_sparse_linear import block_mask, check


@pytest.mark.parametrize("block, shape, density", pairwise(
    [(32, 32), (1, 32), (16, 16), (1, 1)],
    [(96, 128), (70, 45)],  # odd K exercises the k-pair padding
    [0.0, 0.1, 1.0]))
def test_int8_patterns_match_quantized_reference(tmp_path, block, shape, density):
    n, k = shape
    layer = Int8SparseLinear(torch.randn(n, k), torch.randn(n), block_mask(n, k, block, density),
                             block_rows=block[0], cache_dir=tmp_path)
    assert layer.fallback_reason is None
    for m in (1, 49, 130):
        check(layer, m, k)


@pytest.mark.parametrize("activation", ["relu", "gelu", "relu6", "silu"])
def test_int8_fused_activation_and_accuracy(tmp_path, activation):
    w, b = torch.randn(64, 48), torch.randn(64)
    kept = block_mask(64, 48, (8, 8), 0.5)
    layer = Int8SparseLinear(w, b, kept, block_rows=8, activation=activation, cache_dir=tmp_path)
    x = torch.randn(20, 48)
    check(layer, 20, 48)
    fp32 = {"relu": F.relu, "gelu": F.gelu, "relu6": F.relu6, "silu": F.silu}[activation](F.linear(x, w * kept, b))
    # int8 error against fp32: a few quantization steps, far below the signal
    assert float((layer(x) - fp32).abs().max()) < 0.05 * float(fp32.abs().max())


def test_zero_rows_and_inputs_quantize_safely(tmp_path):
    layer = Int8SparseLinear(torch.randn(16, 16), None, torch.rand(16, 16) > 0.5, cache_dir=tmp_path)
    x = torch.zeros(5, 16)  # max|x| = 0: the scale falls back to 1 instead of dividing by zero
    assert torch.equal(layer(x), torch.zeros(5, 16))


def test_weight_pairs_pack_little_endian():
    wq, scale = quantize_rows(torch.tensor([[127.0, -127.0, 0.0, 63.5]]).numpy(), torch.ones(1, 4).bool().numpy())
    assert wq.tolist() == [[127, -127, 0, 64]] and scale.tolist() == [1.0]
    from sparta_explore.kernels.groups import plan_groups
    from sparta_explore.kernels.int8_codegen import even_segments
    pairs = pack_pairs(wq, even_segments(plan_groups(torch.ones(1, 4).bool().numpy(), 1)))
    assert [(int(p) & 0xFFFF, int(p) >> 16) for p in pairs] == [(127, -127), (0, 64)]


@pytest.mark.parametrize("weight_bits,act_bits", [(4, 8), (8, 4), (2, 6)])
def test_narrow_bit_grids_run_exactly_in_int8(tmp_path, weight_bits, act_bits):
    w, b = torch.randn(40, 36), torch.randn(40)
    kept = block_mask(40, 36, (1, 1), 0.4)
    layer = Int8SparseLinear(w, b, kept, weight_bits=weight_bits, act_bits=act_bits, cache_dir=tmp_path)
    assert layer.fallback_reason is None
    levels = 2 ** (weight_bits - 1) - 1
    assert int(layer.weight_q.abs().max()) == levels  # the row maxima sit on the narrow grid's top level
    check(layer, 33, 36)
    x = torch.randn(7, 36)
    from sparta_explore.fake_quant import quantized_linear
    want = quantized_linear(x, w * kept, b, weight_bits=weight_bits, act_bits=act_bits)
    assert torch.allclose(layer(x), want, atol=1e-4)


def test_unsupported_bits_are_refused():
    with pytest.raises(ValueError, match="2..8"):
        Int8SparseLinear(torch.randn(4, 4), None, torch.ones(4, 4).bool(), weight_bits=12)


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_quantize_rows_reads_only_kept_weights(bits):
    # pruned positions hold NaN, inf and huge values: none of them may reach a scale or a level
    g = torch.Generator().manual_seed(5)
    weight = torch.randn(37, 29, generator=g).numpy()
    kept = (torch.rand(37, 29, generator=g) < 0.3).numpy()
    kept[3] = False  # an all-pruned row: scale 1, levels 0
    noisy = weight.copy()
    noisy[~kept] = np.array([np.nan, np.inf, -1e30])[np.arange((~kept).sum()) % 3]
    q, scale = quantize_rows(noisy, kept, bits)
    w = np.where(kept, weight, 0).astype(np.float32)
    level = 2 ** (bits - 1) - 1
    amax = np.abs(w).max(axis=1)
    want_scale = np.where(amax > 0, amax / np.float32(level), np.float32(1)).astype(np.float32)
    assert np.array_equal(scale, want_scale) and scale[3] == 1
    assert np.array_equal(q, np.clip(np.rint(w / want_scale[:, None]), -level, level).astype(np.int8))
    assert not q[~kept].any() and np.abs(q).max() == level
