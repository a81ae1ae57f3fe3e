"""fake_quant_model: each weighted op computes what its compiled kernel computes."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sparta_explore.errors import ConfigError
from sparta_explore.fake_quant import fake_quantize_rows, quantize_rows
from sparta_explore.graph import capture
from sparta_explore.quantizers.fake_quant_model import FakeQuantOp, fake_quant_model, tensor_bits, weighted_ops
from sparta_explore.tesa import TeSA


def _linear_op(weight_bits, act_bits, clip=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    lin = nn.Linear(48, 40)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(40, 48, generator=g))
        lin.bias.copy_(torch.randn(40, generator=g))
    kept = torch.rand(40, 48, generator=g) > 0.4
    op = FakeQuantOp(lin, kept, weight_bits=weight_bits, act_bits=act_bits)
    op.clip.fill_(clip)
    return op, kept


@pytest.mark.parametrize("weight_bits,act_bits", [(8, 8), (4, 8), (8, 4), (3, 6)])
def test_int8_path_matches_the_compiled_kernel(tmp_path, weight_bits, act_bits):
    from sparta_explore.kernels import Int8SparseLinear

    op, kept = _linear_op(weight_bits, act_bits, clip=0.8)
    assert op.runs_int8
    # the compiler builds its kernel from the stored (effective) weights: clipped values carry the tuned scale
    kernel = Int8SparseLinear(op.effective_weight().detach(), op.inner.bias.detach(), kept,
                              weight_bits=weight_bits, act_bits=act_bits, cache_dir=tmp_path)
    assert kernel.fallback_reason is None
    x = torch.randn(33, 48)
    with torch.no_grad():
        ours, theirs = op(x), kernel(x)
    assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    # the kernel's scale is the learned one: clip * max|kept row| / qmax
    row_max = (op.inner.weight.detach() * kept).abs().amax(dim=1)
    expected_scale = 0.8 * row_max / (2 ** (weight_bits - 1) - 1)
    assert torch.allclose(kernel.weight_scale, expected_scale, rtol=1e-6)


def test_weight_only_quantization_runs_fp32_on_fake_quantized_weights():
    op, kept = _linear_op(4, 32)
    assert not op.runs_int8
    x = torch.randn(7, 48)
    w = fake_quantize_rows(op.inner.weight.detach() * kept, 4)
    with torch.no_grad():
        assert torch.equal(op(x), F.linear(x, w, op.inner.bias))
        # the activation is not quantized on this path: a tiny input change changes the output
        assert not torch.equal(op(x), op(x + 1e-4))


@pytest.mark.parametrize("bits", [16, 32])
def test_wide_widths_are_exact_fp32(bits):
    op, kept = _linear_op(bits, bits)
    x = torch.randn(5, 48)
    with torch.no_grad():
        assert torch.equal(op(x), F.linear(x, op.inner.weight * kept, op.inner.bias))


def test_conv_weights_quantize_per_output_channel_and_inputs_stay_fp32():
    conv = nn.Conv2d(3, 6, 3, padding=1)
    op = FakeQuantOp(conv, torch.ones(6, 3, 3, 3, dtype=torch.bool), weight_bits=4, act_bits=4)
    assert not op.runs_int8  # no integer conv kernel, whatever the input's bits
    x = torch.randn(2, 3, 5, 5)
    w = fake_quantize_rows(conv.weight.detach().reshape(6, -1), 4).reshape(conv.weight.shape)
    with torch.no_grad():
        assert torch.equal(op(x), F.conv2d(x, w, conv.bias, padding=1))
    levels, _ = quantize_rows(op.quantized_weight().reshape(6, -1), 4)
    assert int(levels.abs().max()) == 7


def test_pruned_weights_stay_zero_and_bits_below_2_are_refused():
    op, kept = _linear_op(8, 8)
    assert bool((op.effective_weight()[~kept] == 0).all()) and bool((op.quantized_weight()[~kept] == 0).all())
    with pytest.raises(ConfigError, match="1 bits"):
        FakeQuantOp(nn.Linear(4, 4), torch.ones(4, 4, dtype=torch.bool), weight_bits=1)


def test_model_reads_bits_from_the_table_and_leaves_the_model_alone():
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3)).eval()
    x = torch.randn(4, 6)
    graph = capture(model, x)
    mask = torch.rand(5, 6) > 0.5
    table = {"0.weight": TeSA.from_mask(mask, bits=4), "_1": TeSA.dense((1, 5), bits=8),
             "2.weight": TeSA.dense((3, 5), bits=8)}
    before = model[0].weight.detach().clone()
    gm, ops = fake_quant_model(graph, table)
    assert (ops["_0"].weight_bits, ops["_0"].act_bits, ops["_0"].runs_int8) == (4, 32, False)
    assert (ops["_2"].weight_bits, ops["_2"].act_bits, ops["_2"].runs_int8) == (8, 8, True)
    assert torch.equal(model[0].weight, before)  # a copy was wrapped
    h = torch.relu(F.linear(x, fake_quantize_rows(before * mask, 4), model[0].bias))
    with torch.no_grad():
        expected = ops["_2"](h)
        assert torch.allclose(gm(x), expected, atol=1e-6)


def test_weighted_ops_are_topological_and_skip_reused_modules():
    class Reuse(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.shared, self.conv = nn.Linear(4, 4), nn.Linear(4, 4), nn.Conv1d(1, 2, 3)

        def forward(self, x):
            y = self.shared(self.shared(self.a(x)))
            return self.conv(y.unsqueeze(1))

    graph = capture(Reuse(), torch.randn(2, 4))
    ops = weighted_ops(graph)
    assert [op.module for op in ops] == ["a", "conv"]
    assert [op.linear for op in ops] == [True, False]
    assert ops[0].weight == "a.weight" and ops[0].bias == "a.bias" and ops[0].input == "x"


def test_tensor_bits_is_the_widest_kept_element():
    assert tensor_bits(TeSA(torch.tensor([0, 4, 8, 2], dtype=torch.uint8))) == 8
    assert tensor_bits(TeSA(torch.zeros(3, dtype=torch.uint8))) == 32  # all pruned: nothing to quantize
