"""calibrate_tune: the tuned op is closer to fp32, and what it learned is representable by the kernels."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sparta_explore.fake_quant import fake_quantize_rows, quantize_rows
from sparta_explore.quantizers.calibrate_config import CalibrationConfig
from sparta_explore.quantizers.calibrate_tune import surrogate_weight, tune_op
from sparta_explore.quantizers.fake_quant_model import FakeQuantOp, op_mse

pytestmark = pytest.mark.usefixtures("one_thread")


def _heavy_tailed_op(bits, act_bits=32, seed=0):
    """A layer whose rows have a few large weights: clipping them is where the MSE gain is."""
    g = torch.Generator().manual_seed(seed)
    lin = nn.Linear(64, 32)
    with torch.no_grad():
        w = torch.randn(32, 64, generator=g) * 0.1
        w[torch.arange(32), torch.randint(0, 64, (32,), generator=g)] = 0.6  # one outlier per row
        lin.weight.copy_(w)
        lin.bias.copy_(torch.randn(32, generator=g) * 0.1)
    kept = (torch.rand(32, 64, generator=g) > 0.3) | (lin.weight.detach() == 0.6)
    bias_kept = torch.arange(32) % 4 != 0
    op = FakeQuantOp(lin, kept, bias_kept, weight_bits=bits, act_bits=act_bits)
    x = torch.randn(256, 64, generator=g)
    target = F.linear(x, lin.weight.detach() * kept, lin.bias.detach() * bias_kept)
    return op, x, target


def test_surrogate_forward_is_the_kernel_grid_and_the_clip_gets_a_gradient():
    op, x, target = _heavy_tailed_op(4)
    clip = torch.full((32,), 0.9, requires_grad=True)
    wq = surrogate_weight(op, op.inner.weight.detach(), clip)
    op.clip.fill_(0.9)
    assert torch.equal(wq.detach(), op.quantized_weight())
    F.mse_loss(F.linear(x, wq), target).backward()
    assert clip.grad is not None and float(clip.grad.abs().sum()) > 0


@pytest.mark.parametrize("bits,act_bits,gain", [(3, 32, 0.8), (4, 8, 0.97)])  # coarser grid: more to gain
def test_clip_tuning_lowers_the_mse_and_the_scale_is_what_the_kernel_derives(bits, act_bits, gain):
    op, x, target = _heavy_tailed_op(bits, act_bits)
    config = CalibrationConfig(steps=20)
    out = tune_op(op, x, target, config)
    assert out.mse_after < gain * out.mse_before
    assert out.mse_after == pytest.approx(op_mse(op, x, target))  # the op was left in the state reported
    assert bool((op.clip >= config.min_clip).all()) and bool((op.clip <= 1).all()) and float(op.clip.min()) < 1
    # stored values carry the learned scale: the kernels' max|row| / qmax equals clip * original max / qmax
    stored = op.effective_weight().detach()
    _, scale = quantize_rows(stored, bits)
    original_max = (op.inner.weight.detach() * op.weight_kept).abs().amax(dim=1)
    assert torch.allclose(scale.flatten(), op.clip * original_max / (2 ** (bits - 1) - 1), rtol=1e-6)


def test_learned_rounding_is_on_the_grid_keeps_pruning_and_beats_clip_only():
    op_clip, x, target = _heavy_tailed_op(3)
    clip_only = tune_op(op_clip, x, target, CalibrationConfig(steps=20))
    op, _, _ = _heavy_tailed_op(3)
    out = tune_op(op, x, target, CalibrationConfig(steps=20, tune_weights=True))
    assert out.mse_after < clip_only.mse_after
    stored = op.effective_weight().detach()
    # re-quantizing the stored values gives back the same values: they already sit on the kernel's grid
    assert torch.allclose(fake_quantize_rows(stored, 3), stored, rtol=1e-6, atol=1e-7)
    assert bool((stored[~op.weight_kept] == 0).all())
    assert bool((op.effective_bias()[~op.bias_kept] == 0).all())
    assert out.mse_after == pytest.approx(op_mse(op, x, target))


def test_fp32_weights_and_tuning_off_change_nothing():
    for bits, config in ((16, CalibrationConfig()), (4, CalibrationConfig(tune_scales=False))):
        op, x, target = _heavy_tailed_op(bits)
        before = op.effective_weight().detach().clone()
        out = tune_op(op, x, target, config)
        assert out.mse_before == out.mse_after
        assert torch.equal(op.effective_weight(), before) and bool((op.clip == 1).all())


def test_tuning_never_makes_the_op_worse():
    # 8 bits on a well-behaved layer: the nearest grid is already near-optimal, the tuner must not regress
    lin = nn.Linear(16, 8)
    op = FakeQuantOp(lin, torch.ones(8, 16, dtype=torch.bool), weight_bits=8, act_bits=8)
    x = torch.randn(128, 16)
    target = lin(x).detach()
    before = op_mse(op, x, target)
    out = tune_op(op, x, target, CalibrationConfig(steps=10, tune_weights=True, round_steps=20))
    assert out.mse_after <= before and op_mse(op, x, target) <= before
