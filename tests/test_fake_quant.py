"""fake_quant: the symmetric per-row grids the int8 kernels use."""

import pytest
import torch
import torch.nn.functional as F

from sparta_explore.fake_quant import fake_quantize_rows, qmax, quantize_rows, quantized_linear


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


def test_bits_outside_the_int8_range_name_the_limit():
    with pytest.raises(ValueError, match="2..8"):
        qmax(16)
