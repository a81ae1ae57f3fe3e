"""fake_quant: the symmetric per-row grids the int8 kernels use."""

import pytest
import torch
import torch.nn.functional as F

from sparta_explore.fake_quant import (
    fake_quantize_rows,
    qmax,
    quantize_rows,
    quantized_conv2d,
    quantized_linear,
    row_scales,
)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_levels_stay_on_the_grid_and_hit_the_row_max(bits):
    x = torch.randn(6, 50)
    q, scale = quantize_rows(x, bits)
    assert torch.equal(q, q.round()) and int(q.abs().max()) == qmax(bits)
    assert torch.equal(q.abs().amax(dim=-1), torch.full((6,), float(qmax(bits))))
    err = (fake_quantize_rows(x, bits) - x).abs()
    assert bool((err <= scale / 2 + 1e-6).all())  # rounding error at most half a step per row


def test_quantized_linear_error_shrinks_with_bits():
    x, w = torch.randn(32, 64), torch.randn(16, 64)
    exact = F.linear(x, w)
    errs = [float((quantized_linear(x, w, weight_bits=b, act_bits=b) - exact).abs().mean()) for b in (3, 5, 8)]
    assert errs[0] > errs[1] > errs[2]


def test_row_scales_take_the_largest_magnitude_of_either_sign():
    x = torch.tensor([[1.0, -3.0, 2.0], [4.0, -1.0, 0.0], [0.0, 0.0, 0.0]])
    assert row_scales(x, 8).flatten().tolist() == pytest.approx([3 / 127, 4 / 127, 1.0])


def test_quantized_conv2d_is_the_convolution_of_the_grids_with_one_scale_per_image():
    x, w = torch.randn(3, 4, 6, 6), torch.randn(5, 4, 3, 3)
    x[1] *= 100  # a loud image does not coarsen the others' grids
    want = F.conv2d(fake_quantize_rows(x.reshape(3, -1), 6).reshape(x.shape),
                    fake_quantize_rows(w.reshape(5, -1), 4).reshape(w.shape), None, 1, 1)
    got = quantized_conv2d(x, w, None, padding=(1, 1), weight_bits=4, act_bits=6)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)
    exact = F.conv2d(x, w, None, 1, 1)
    assert float((got[0] - exact[0]).abs().max()) < 0.2 * float(exact[0].abs().max())


def test_bits_outside_the_int8_range_name_the_limit():
    with pytest.raises(ValueError, match="2..8"):
        qmax(16)
