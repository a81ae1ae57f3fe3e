"""The safe DoReFa gradient quantizer: zero gradients stay zero, others keep their scale."""

import torch

from sparta_explore.quantizers.dorefa import dorefa_quantize_gradient


def test_zero_gradient_sample_stays_zero_and_finite():
    g = torch.zeros(3, 5)
    g[1] = torch.linspace(-1, 1, 5)
    q = dorefa_quantize_gradient(g, 8)
    assert torch.isfinite(q).all()
    assert torch.equal(q[0], torch.zeros(5)) and torch.equal(q[2], torch.zeros(5))


def test_quantized_gradient_stays_within_one_level_of_the_input():
    torch.manual_seed(0)
    g = torch.randn(4, 64)
    q = dorefa_quantize_gradient(g, 8)
    peak = g.abs().amax(dim=1, keepdim=True)
    step = 2 * peak / 255
    assert torch.all((q - g).abs() <= step * 1.01)
    assert torch.all(q.abs() <= peak * (1 + 1 / 255))


def test_few_bits_give_few_levels_per_sample():
    torch.manual_seed(1)
    q = dorefa_quantize_gradient(torch.randn(1, 1000), 2)
    assert len(torch.unique(q)) <= 4
