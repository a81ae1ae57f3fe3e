"""Dense and shrunk convolutions, and summed sub-operators, against the masked PyTorch ops."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sparta_explore.fake_quant import fake_quantize_rows, quantized_conv2d
from sparta_explore.kernels.dense import DenseConv2d, DenseLinear, ShrunkConv2d, SummedParts


def masked_conv(conv, kept, x):
    return F.conv2d(x, conv.weight * kept, conv.bias, conv.stride, conv.padding, conv.dilation, conv.groups)


@pytest.mark.parametrize("prune", ["none", "rows", "cols", "both", "all"])
@pytest.mark.parametrize("bias", [True, False])
def test_shrunk_conv_matches_the_masked_conv(prune, bias):
    conv = nn.Conv2d(6, 8, 3, stride=2, padding=1, bias=bias)
    kept = torch.rand(8, 6, 3, 3, generator=torch.Generator().manual_seed(0)) > 0.3
    if prune in ("rows", "both"):
        kept[1::2] = False
    if prune in ("cols", "both"):
        kept[:, :3] = False
    if prune == "all":
        kept[:] = False
    op = ShrunkConv2d(conv, conv.weight * kept, kept)
    x = torch.randn(2, 6, 9, 7)
    want = masked_conv(conv, kept, x)
    assert torch.allclose(op(x), want, atol=1e-5)
    assert torch.allclose(op.reference(x), want, atol=1e-5)
    assert op.empty == (prune == "all")


@pytest.mark.parametrize("cls", [DenseConv2d, ShrunkConv2d])
def test_convs_with_8_bit_inputs_quantize_each_whole_image_before_dropping_channels(cls):
    conv = nn.Conv2d(6, 8, 3, padding=1)
    kept = torch.ones(8, 6, 3, 3, dtype=torch.bool)
    kept[:, :2] = False  # the dropped channels still set the image's scale
    x = torch.randn(2, 6, 5, 5)
    x[0, 0] *= 50
    with torch.no_grad():
        want = quantized_conv2d(x, conv.weight * kept, conv.bias, padding=(1, 1), weight_bits=8, act_bits=4)
        op = cls(conv, fake_quantize_rows((conv.weight * kept).reshape(8, -1), 8).reshape(8, 6, 3, 3), kept,
                 act_bits=4)
        torch.testing.assert_close(op(x), want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(op.reference(x), want, rtol=1e-4, atol=1e-4)
        assert not torch.allclose(op(x), masked_conv(conv, kept, x), atol=1e-2)  # 4-bit inputs really are rounded


def test_grouped_convs_run_dense_and_refuse_to_shrink():
    conv = nn.Conv2d(4, 4, 3, padding=1, groups=4)
    full = torch.ones(4, 1, 3, 3, dtype=torch.bool)
    x = torch.randn(1, 4, 5, 5)
    assert torch.allclose(DenseConv2d(conv, conv.weight, full)(x), conv(x), atol=1e-6)
    full[0] = False
    with pytest.raises(ValueError, match="grouped"):
        ShrunkConv2d(conv, conv.weight, full)


def test_summed_parts_apply_bias_and_activation_once():
    w = torch.randn(6, 5)
    upper, lower = w.clone(), w.clone()
    upper[3:], lower[:3] = 0, 0
    b = torch.randn(6)
    op = SummedParts([DenseLinear(upper, None), DenseLinear(lower, None)], b, activation="relu")
    x = torch.randn(4, 5)
    assert torch.allclose(op(x), F.relu(F.linear(x, w, b)), atol=1e-6)
    assert torch.allclose(op.reference(x), op(x))
    assert op.density == 1.0  # the parts' nonzeros add up to the whole weight
