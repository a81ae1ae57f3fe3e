"""Sparse convolution (implicit GEMM over the sparse linear kernels) against PyTorch's convolution."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sparta_explore.kernels import Int8SparseLinear, SparseLinear
from sparta_explore.kernels.build import cpu_flags
from sparta_explore.kernels.sparse_conv import SparseConv2d

from .test_sparse_linear import block_mask

needs_avx2 = pytest.mark.skipif("avx2" not in cpu_flags(), reason="int8 kernels need AVX2")

GEOMETRIES = [  # (kernel, stride, padding, dilation, padding_mode)
    (1, 1, 0, 1, "zeros"),      # pointwise: no im2col
    (3, 1, 1, 1, "zeros"),
    (3, 2, 1, 1, "zeros"),
    (5, 1, 2, 2, "zeros"),
    ((3, 1), (2, 1), (1, 0), 1, "zeros"),
    (3, 1, 1, 1, "reflect"),
    (1, 2, 0, 1, "zeros"),      # 1x1 with stride: im2col path
]


def _conv(geometry, c_in=6, c_out=20):
    k, s, p, d, mode = geometry
    torch.manual_seed(0)
    return nn.Conv2d(c_in, c_out, k, stride=s, padding=p, dilation=d, padding_mode=mode)


@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("block,density", [((1, 1), 0.1), ((4, 9), 0.3), ((1, 1), 0.0), ((1, 1), 1.0)])
def test_fp32_sparse_conv_matches_the_masked_convolution(tmp_path, geometry, block, density):
    conv = _conv(geometry)
    w2d = conv.weight.detach().reshape(conv.out_channels, -1)
    kept = block_mask(*w2d.shape, block, density)  # all-zero, empty blocks, ragged K (6 * 9 = 54)
    op = SparseConv2d(conv, SparseLinear(w2d * kept, conv.bias.detach(), kept, block_rows=block[0],
                                         cache_dir=tmp_path))
    masked = conv.weight.detach() * kept.reshape(conv.weight.shape)
    for shape in ((2, 6, 7, 9), (1, 6, 5, 6)):  # ragged spatial sizes, a batch of one
        x = torch.randn(shape)
        if conv.padding_mode != "zeros":
            ph, pw = conv.padding
            want = F.conv2d(F.pad(x, (pw, pw, ph, ph), mode=conv.padding_mode), masked, conv.bias, conv.stride, 0,
                            conv.dilation)
        else:
            want = F.conv2d(x, masked, conv.bias, conv.stride, conv.padding, conv.dilation)
        with torch.no_grad():
            got = op(x)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(op.reference(x), want, rtol=1e-4, atol=1e-4)


@needs_avx2
@pytest.mark.parametrize("geometry", GEOMETRIES[:3])
def test_int8_inner_kernel_matches_its_quantized_reference(tmp_path, geometry):
    conv = _conv(geometry)
    w2d = conv.weight.detach().reshape(conv.out_channels, -1)
    kept = block_mask(*w2d.shape, (1, 1), 0.2)
    op = SparseConv2d(conv, Int8SparseLinear(w2d * kept, conv.bias.detach(), kept, cache_dir=tmp_path))
    x = torch.randn(2, 6, 7, 9)
    with torch.no_grad():
        torch.testing.assert_close(op(x), op.reference(x), rtol=1e-5, atol=1e-4)


def test_gradients_flow_through_the_reference_and_bad_inputs_are_refused(tmp_path):
    conv = _conv(GEOMETRIES[1])
    w2d = conv.weight.detach().reshape(conv.out_channels, -1)
    kept = block_mask(*w2d.shape, (1, 1), 0.3)
    op = SparseConv2d(conv, SparseLinear(w2d * kept, None, kept, cache_dir=tmp_path))
    x = torch.randn(1, 6, 5, 5, requires_grad=True)
    op(x).sum().backward()
    want = torch.autograd.grad(F.conv2d(x, conv.weight.detach() * kept.reshape(conv.weight.shape), None, 1, 1).sum(),
                               x)[0]
    torch.testing.assert_close(x.grad, want)
    with pytest.raises(ValueError, match="features in dimension 1"):
        op(torch.randn(1, 5, 5, 5))
    with pytest.raises(ValueError, match="groups=1"):
        SparseConv2d(nn.Conv2d(4, 4, 3, groups=2), SparseLinear(torch.ones(4, 18), None, torch.ones(4, 18).bool()))


def test_sparse_conv_deepcopies_and_pickles(tmp_path):
    import copy
    import pickle

    conv = _conv(GEOMETRIES[1])
    w2d = conv.weight.detach().reshape(conv.out_channels, -1)
    kept = block_mask(*w2d.shape, (1, 1), 0.2)
    op = SparseConv2d(conv, SparseLinear(w2d * kept, conv.bias.detach(), kept, cache_dir=tmp_path))
    x = torch.randn(2, 6, 7, 9)
    with torch.no_grad():
        want = op(x)
        for other in (copy.deepcopy(op), pickle.loads(pickle.dumps(op))):
            torch.testing.assert_close(other(x), want)
