"""Sparse convolution (implicit GEMM over the sparse linear kernels) against PyTorch's convolution."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sparta_explore.fake_quant import quantized_conv2d
from sparta_explore.kernels import Int8SparseLinear, KernelGradError, KernelInputError, SparseLinear
from sparta_explore.kernels.bsr_codegen import TileConfig
from sparta_explore.kernels.build import cpu_flags
from sparta_explore.kernels.conv_geometry import ConvGeometry
from sparta_explore.kernels.sparse_conv import ImplicitConvLinear, Int8ConvLinear, SparseConv2d

from .test_sparse_linear import block_mask

needs_avx2 = pytest.mark.skipif("avx2" not in cpu_flags(), reason="int8 kernels need AVX2")

SLOW = pytest.mark.slow  # the full matrix runs in `make test-slow`; `make test` keeps a case of each kind

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


def _want(conv, masked, x, act=lambda y: y):
    if conv.padding_mode != "zeros":
        ph, pw = conv.padding
        return act(F.conv2d(F.pad(x, (pw, pw, ph, ph), mode=conv.padding_mode), masked, conv.bias, conv.stride, 0,
                            conv.dilation))
    return act(F.conv2d(x, masked, conv.bias, conv.stride, conv.padding, conv.dilation))


DENSITIES = [((1, 1), 0.1), ((4, 9), 0.3), ((1, 1), 0.0), ((1, 1), 1.0)]
TILES = {"rows": TileConfig(), "segments": TileConfig(6, 2, 6, layout="segments"),
         "panels": TileConfig(4, 3, 6, panel=True)}
IMPLICIT_CASES = ([pytest.param(g, b, d, "rows", marks=() if i < 2 or g is GEOMETRIES[1] else SLOW)
                   for g in GEOMETRIES for i, (b, d) in enumerate(DENSITIES)]
                  + [pytest.param(g, b, d, t, marks=() if g is GEOMETRIES[1] else SLOW)
                     for g in GEOMETRIES[1:4] for b, d in DENSITIES[:2] for t in ("segments", "panels")])


@pytest.mark.parametrize("geometry,block,density,tile", IMPLICIT_CASES)
def test_implicit_gemm_conv_matches_the_masked_convolution(tmp_path, geometry, block, density, tile):
    # the kernel gathers im2col tiles from NCHW itself: every geometry, ragged K (6 x kh x kw) and ragged
    # M tiles (63 pixels per image, tiles crossing images), empty blocks, all-zero and full weights
    conv = _conv(geometry)
    w2d = conv.weight.detach().reshape(conv.out_channels, -1)
    kept = block_mask(*w2d.shape, block, density)
    linear = ImplicitConvLinear(w2d * kept, conv.bias.detach(), kept, ConvGeometry.of(conv, (7, 9)),
                                block_rows=block[0], cache_dir=tmp_path, tile=TILES[tile])
    assert linear.fallback_reason is None
    op = SparseConv2d(conv, linear)
    masked = conv.weight.detach() * kept.reshape(conv.weight.shape)
    for shape in ((2, 6, 7, 9), (1, 6, 7, 9), (3, 6, 5, 6)):  # the built size, a batch of one, another size
        x = torch.randn(shape)
        with torch.no_grad():
            got = op(x)
        want = _want(conv, masked, x)
        assert got.shape == want.shape and got.is_contiguous()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(op.reference(x), want, rtol=1e-4, atol=1e-4)
    assert len(op.sizes) == 1  # the new size got its own build (its padded size as key for reflect)


def test_a_size_first_met_in_inference_mode_builds_ordinary_tensors(tmp_path):
    conv = _conv(GEOMETRIES[1])
    w2d = conv.weight.detach().reshape(conv.out_channels, -1)
    kept = block_mask(*w2d.shape, (1, 1), 0.3)
    op = SparseConv2d(conv, ImplicitConvLinear(w2d * kept, None, kept, ConvGeometry.of(conv, (7, 9)),
                                               cache_dir=tmp_path))
    x = torch.randn(1, 6, 5, 6)
    with torch.inference_mode():
        want = op(x)  # builds the 5x6 kernel
    assert not any(t.is_inference() for t in op.sizes["5x6"].buffers())
    op.load_state_dict(op.state_dict())  # in-place copies into every buffer: refused for inference tensors
    with torch.no_grad():
        torch.testing.assert_close(op(x), want)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_implicit_gemm_conv_fuses_the_activation(tmp_path, activation):
    conv = _conv(GEOMETRIES[2])
    w2d = conv.weight.detach().reshape(conv.out_channels, -1)
    kept = block_mask(*w2d.shape, (1, 1), 0.3)
    op = SparseConv2d(conv, ImplicitConvLinear(w2d * kept, conv.bias.detach(), kept, ConvGeometry.of(conv, (9, 8)),
                                               activation=activation, cache_dir=tmp_path))
    x = torch.randn(2, 6, 9, 8)
    with torch.no_grad():
        got = op(x)
    want = _want(conv, conv.weight.detach() * kept.reshape(conv.weight.shape), x,
                 F.relu if activation == "relu" else F.gelu)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_implicit_gemm_conv_refuses_what_it_was_not_built_for(tmp_path):
    conv = _conv(GEOMETRIES[1])
    w2d = conv.weight.detach().reshape(conv.out_channels, -1)
    kept = block_mask(*w2d.shape, (1, 1), 0.3)
    linear = ImplicitConvLinear(w2d * kept, None, kept, ConvGeometry.of(conv, (7, 9)), cache_dir=tmp_path)
    with pytest.raises(KernelInputError, match=r"built for inputs \(N, 6, 7, 9\)"):
        linear._fast(torch.randn(1, 6, 7, 8))
    with pytest.raises(ValueError, match="does not match the conv"):
        SparseConv2d(_conv(GEOMETRIES[2]), linear)  # stride 2 conv around a stride 1 kernel
    with pytest.raises(ValueError, match="im2col columns 54"):
        ImplicitConvLinear(w2d[:, :50], None, kept[:, :50], ConvGeometry.of(conv, (7, 9)))


UNFOLD_CASES = [pytest.param(g, b, d, marks=() if i < 2 or g is GEOMETRIES[1] else SLOW)
                for g in GEOMETRIES for i, (b, d) in enumerate([((1, 1), 0.1), ((4, 9), 0.3), ((1, 1), 0.0),
                                                                ((1, 1), 1.0)])]


@pytest.mark.parametrize("geometry,block,density", UNFOLD_CASES)
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


@pytest.mark.parametrize("implicit", [False, True])
def test_sparse_conv_deepcopies_and_pickles(tmp_path, implicit):
    import copy
    import pickle

    conv = _conv(GEOMETRIES[1])
    w2d = conv.weight.detach().reshape(conv.out_channels, -1)
    kept = block_mask(*w2d.shape, (1, 1), 0.2)
    linear = (ImplicitConvLinear(w2d * kept, conv.bias.detach(), kept, ConvGeometry.of(conv, (7, 9)),
                                 cache_dir=tmp_path) if implicit
              else SparseLinear(w2d * kept, conv.bias.detach(), kept, cache_dir=tmp_path))
    op = SparseConv2d(conv, linear)
    x = torch.randn(2, 6, 7, 9)
    with torch.no_grad():
        want = op(x)
        for other in (copy.deepcopy(op), pickle.loads(pickle.dumps(op))):
            assert other.implicit == implicit
            torch.testing.assert_close(other(x), want)
            if implicit:
                assert other.linear._fn is not None


INT8_GEOMETRIES = [g for g in GEOMETRIES if g[1] == 1]  # stride 1: shifted windows
INT8_VARIANTS = {"auto": {}, "int16": {"dot": None}, "u8": {"dot": None, "weight_bits": 4},
                 "vnni-emulated": {"dot": "avx512_vnni", "emulate_dot": True}}


INT8_CASES = ([pytest.param(g, 6, (1, 1), 0.1, v, marks=() if v == "auto" or g is INT8_GEOMETRIES[1] else SLOW)
               for g in INT8_GEOMETRIES for v in INT8_VARIANTS]  # 6: channels padded
              + [(INT8_GEOMETRIES[1], c, b, d, "auto") for c in (6, 8) for b, d in DENSITIES]
              + [(INT8_GEOMETRIES[2], 8, (4, 9), 0.3, v) for v in ("int16", "u8", "vnni-emulated")])


@needs_avx2
@pytest.mark.parametrize("geometry,c_in,block,density,variant", INT8_CASES)
def test_int8_implicit_gemm_conv_matches_the_quantized_convolution(tmp_path, geometry, c_in, block, density,
                                                                   variant):
    conv = _conv(geometry, c_in=c_in)
    w2d = conv.weight.detach().reshape(conv.out_channels, -1)
    kept = block_mask(*w2d.shape, block, density)
    options = INT8_VARIANTS[variant]
    # unmasked weights go in: what the mask prunes must not reach the output
    linear = Int8ConvLinear(w2d, conv.bias.detach(), kept, ConvGeometry.of(conv, (7, 9)), block_rows=block[0],
                            cache_dir=tmp_path, **options)
    assert linear.fallback_reason is None
    if variant in ("int16", "u8"):
        assert linear.dot_path in ("avx2 int16", "avx2 u8")
    op = SparseConv2d(conv, linear)
    masked = conv.weight.detach() * kept.reshape(conv.weight.shape)
    bits = options.get("weight_bits", 8)
    for shape in ((2, c_in, 7, 9), (3, c_in, 5, 6))[:2 if variant == "auto" else 1]:  # a new size: a new build
        x = torch.randn(shape) * torch.rand(shape[0], 1, 1, 1) * 4  # images on different scales
        padded = x if conv.padding_mode == "zeros" else F.pad(x, (1, 1, 1, 1), mode=conv.padding_mode)
        padding = conv.padding if conv.padding_mode == "zeros" else (0, 0)
        want = quantized_conv2d(padded, masked, conv.bias.detach(), conv.stride, padding, conv.dilation,
                                weight_bits=bits, act_bits=8)
        with torch.no_grad():
            got = op(x)
            float_conv = _want(conv, masked, x)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * (1 + float(want.abs().max())))
        if density > 0 and bits == 8:  # and it is a close approximation of the float convolution
            assert float((got - float_conv).abs().max()) < 0.05 * (1 + float(float_conv.abs().max()))


@needs_avx2
def test_int8_conv_fuses_activations_pickles_and_refuses_strides(tmp_path):
    import pickle

    conv = _conv(GEOMETRIES[1])
    w2d = conv.weight.detach().reshape(conv.out_channels, -1)
    kept = block_mask(*w2d.shape, (1, 1), 0.3)
    op = SparseConv2d(conv, Int8ConvLinear(w2d, conv.bias.detach(), kept, ConvGeometry.of(conv, (7, 9)),
                                           activation="relu", cache_dir=tmp_path))
    x = torch.randn(2, 6, 7, 9)
    with torch.no_grad():
        got = op(x)
        assert bool((got >= 0).all())
        torch.testing.assert_close(got, op.reference(x), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(pickle.loads(pickle.dumps(op))(x), got)
    with pytest.raises(ValueError, match="stride-1"):
        Int8ConvLinear(w2d, None, kept, ConvGeometry.of(_conv(GEOMETRIES[2]), (7, 9)))
    with pytest.raises(KernelGradError):
        op(x.requires_grad_())
