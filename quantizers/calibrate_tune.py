"""Fine-tune one quantized op so its output matches the fp32 model's (the distillation step).

What is learned, and why it survives compilation:

* the weight scale, per output row, as a clip ratio ``c`` in [min_clip, 1]: the kernels
  compute the scale as max|row| / qmax from the stored values, so a learned scale
  ``c * max|row| / qmax`` is made representable by storing the row clipped to
  ``+-c * max|row|`` (`FakeQuantOp.effective_weight`). Scales can only shrink this way
  (clipping outliers), which is where the MSE gains are; a larger scale is not representable.
  A coarse grid over ``c`` picks the start, then Adam refines it per row with a
  straight-through estimator (LSQ-style gradient through the rounding);
* optionally (`tune_weights`) the weights' rounding: each kept weight learns whether to
  round down or up (AdaRound's soft rounding with a regularizer that drives it to 0 or 1),
  at the scale chosen above, with the row maxima pinned to +-qmax; then the bias gets the
  MSE-optimal correction. The result is new weight values already on the grid, so
  re-quantizing them with `quantize_rows` gives exactly the levels learned. Pruned
  elements stay zero. (Plain straight-through fine-tuning of the weights was tried and
  made the MSE worse: it drives every weight to a rounding boundary, where it flips.)

Activation scales are not learned: the kernels take them dynamically per row from the
values, so no stored parameter could carry a tuned one. There are no zero-points (the
kernels are symmetric). The forward value of the estimator is the kernels' own
`fake_quantize_rows`; only its gradient is a surrogate. A tuning result is kept only if
the op's exact output MSE improved.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn  # noqa: F401  (used by the docstring examples)

from sparta_explore.fake_quant import fake_quantize_rows, qmax
from sparta_explore.quantizers.calibrate_config import CalibrationConfig
from sparta_explore.quantizers.fake_quant_model import FakeQuantOp, is_int_bits, op_mse

CLIP_GRID = 6  # grid points over [min_clip, 1] that choose where Adam starts


@dataclass(frozen=True)
class TuneOutcome:
    """Op output MSE against the fp32 output before and after tuning; `note` says what changed."""

    mse_before: float
    mse_after: float
    note: str = ""


def surrogate_weight(op: FakeQuantOp, weight: torch.Tensor, clip: torch.Tensor) -> torch.Tensor:
    """The op's quantized weight: forward value exactly `fake_quantize_rows`, gradient straight through.

    Example:
        >>> op = FakeQuantOp(nn.Linear(8, 4), torch.ones(4, 8, dtype=torch.bool), weight_bits=4)
        >>> torch.equal(surrogate_weight(op, op.inner.weight, op.clip), op.quantized_weight())
        True
    """
    w = op.effective_weight(weight, clip)
    rows = w.reshape(w.shape[0], -1)
    level = float(qmax(op.weight_bits))
    amax = rows.abs().amax(dim=1, keepdim=True)
    scale = torch.where(amax > 0, amax / level, torch.ones_like(amax))
    v = rows / scale
    sur = (v + (torch.round(v) - v).detach()) * scale
    exact = fake_quantize_rows(rows.detach(), op.weight_bits)
    return (exact + (sur - sur.detach())).reshape(w.shape)  # x - x is exactly 0: the value stays exact


def _surrogate_output(op: FakeQuantOp, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      clip: torch.Tensor) -> torch.Tensor:
    wq = surrogate_weight(op, weight, clip)
    b = op.effective_bias(bias)
    if op.runs_int8:  # the input's quantization does not depend on anything learned: apply it once, outside
        return F.linear(fake_quantize_rows(x, op.act_bits), wq, b)
    return op.call_with(x, wq, b)


def _state(op: FakeQuantOp) -> tuple[torch.Tensor, ...]:
    bias = op.inner.bias
    return (op.clip.clone(), op.inner.weight.detach().clone(), None if bias is None else bias.detach().clone())


def _load(op: FakeQuantOp, state: tuple[torch.Tensor, ...]) -> None:
    clip, weight, bias = state
    with torch.no_grad():
        op.clip.copy_(clip)
        op.inner.weight.copy_(weight * op.weight_kept)
        if bias is not None:
            op.inner.bias.copy_(bias * op.bias_kept)


def tune_op(op: FakeQuantOp, x: torch.Tensor, target: torch.Tensor, config: CalibrationConfig) -> TuneOutcome:
    """Tune `op`'s weight clip (and weight rounding and bias, if configured) to bring `op(x)` close to `target`.

    Leaves `op` in the best state found, judged by the exact output MSE (its state before
    tuning if nothing helped). Ops whose weights run in fp32 have nothing to tune.

    Example:
        >>> op = FakeQuantOp(nn.Linear(16, 8), torch.ones(8, 16, dtype=torch.bool), weight_bits=3)
        >>> x = torch.randn(64, 16)
        >>> out = tune_op(op, x, F.linear(x, op.inner.weight, op.inner.bias), CalibrationConfig(steps=10))
        >>> out.mse_after <= out.mse_before
        True
    """
    x, target = x.detach(), target.detach()
    mse0 = op_mse(op, x, target)
    if not is_int_bits(op.weight_bits):
        return TuneOutcome(mse0, mse0, "fp32 weights: nothing to tune")
    if not (config.tune_scales or config.tune_weights):
        return TuneOutcome(mse0, mse0, "tuning off")
    best, best_mse = _state(op), mse0
    stages: list[str] = []

    def keep_if_better(stage: str) -> None:
        nonlocal best, best_mse
        mse = op_mse(op, x, target)
        if mse < best_mse:
            best, best_mse = _state(op), mse
            stages.append(stage)
        _load(op, best)

    if config.tune_scales:
        for c in torch.linspace(1.0, config.min_clip, CLIP_GRID).tolist():
            op.clip.fill_(c)
            keep_if_better("clip")
        if config.steps:
            _load(op, _adam_clip(op, x, target, config))
            keep_if_better("clip")
    if config.tune_weights and config.round_steps:
        _learn_rounding(op, x, target, config)
        _correct_bias(op, x, target)
        keep_if_better("rounding+bias")
    note = f"tuned {'+'.join(dict.fromkeys(stages))}" if stages else "tuning did not lower the MSE; kept as quantized"
    return TuneOutcome(mse0, best_mse, note)


def _adam_clip(op: FakeQuantOp, x: torch.Tensor, target: torch.Tensor,
               config: CalibrationConfig) -> tuple[torch.Tensor, ...]:
    """`config.steps` Adam steps on the per-row clip through the straight-through surrogate."""
    clip = op.clip.clone().requires_grad_(True)
    weight = op.inner.weight.detach()
    opt = torch.optim.Adam([clip], lr=config.clip_lr)
    for _ in range(config.steps):
        loss = F.mse_loss(_surrogate_output(op, x, weight, None, clip), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            clip.clamp_(config.min_clip, 1.0)
    state = _state(op)
    return (clip.detach(), *state[1:])


# Rectified sigmoid of AdaRound (Nagel et al. 2020): h(V) in [0, 1], reaching both ends exactly.
_ZETA, _GAMMA = 1.1, -0.1


def _soft(v: torch.Tensor) -> torch.Tensor:
    return (torch.sigmoid(v) * (_ZETA - _GAMMA) + _GAMMA).clamp(0.0, 1.0)


def _learn_rounding(op: FakeQuantOp, x: torch.Tensor, target: torch.Tensor, config: CalibrationConfig) -> None:
    """Learn, per kept weight, whether to round down or up (AdaRound), at the op's current scale.

    The grid stays the one the kernels derive: the row maxima keep their level +-qmax, so
    max|row| / qmax is unchanged, and the learned levels times the scale are stored as the
    new weight values (clip reset to 1: the values are already clipped and on the grid).
    """
    w = op.effective_weight().detach()
    rows = w.reshape(w.shape[0], -1)
    level = float(qmax(op.weight_bits))
    amax = rows.abs().amax(dim=1, keepdim=True)
    scale = torch.where(amax > 0, amax / level, torch.ones_like(amax))
    v = rows / scale
    floor = torch.floor(v)
    frac = (v - floor).clamp(1e-4, 1 - 1e-4)
    logits = (-torch.log((_ZETA - _GAMMA) / (frac - _GAMMA) - 1)).requires_grad_(True)  # h(logits) = frac
    opt = torch.optim.Adam([logits], lr=config.round_lr)
    xq = fake_quantize_rows(x, op.act_bits) if op.runs_int8 else x
    bias = op.effective_bias()
    bias = None if bias is None else bias.detach()
    with torch.no_grad():
        norm = max(float(F.mse_loss(_output(op, xq, op.quantized_weight(), bias), target)), 1e-30)
    warmup = config.round_steps // 5  # reconstruct freely first, then push every h to 0 or 1
    for i in range(config.round_steps):
        h = _soft(logits)
        soft_w = (scale * (floor + h).clamp(-level, level)).reshape(w.shape) * op.weight_kept
        loss = F.mse_loss(_output(op, xq, soft_w, bias), target) / norm
        if i >= warmup:
            beta = 20.0 - 18.0 * (i - warmup) / max(config.round_steps - warmup - 1, 1)  # anneal 20 -> 2
            loss = loss + config.round_lambda * (1 - (2 * h - 1).abs().pow(beta)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        levels = (floor + (_soft(logits) >= 0.5).float()).clamp(-level, level)
        levels = torch.where(rows.abs() >= amax, torch.round(v), levels)  # pin the row max: the scale stays
        op.inner.weight.copy_((levels * scale).reshape(w.shape) * op.weight_kept)
        op.clip.fill_(1.0)


def _output(op: FakeQuantOp, xq: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The op on an already quantized input (int8 path) or the plain input, with `weight` swapped in."""
    return F.linear(xq, weight, bias) if op.runs_int8 else op.call_with(xq, weight, bias)


def _correct_bias(op: FakeQuantOp, x: torch.Tensor, target: torch.Tensor) -> None:
    """Add the mean output error per channel to the (kept) bias: the MSE-optimal bias for the fixed weights."""
    if op.inner.bias is None:
        return
    with torch.no_grad():
        err = target - op(x)
        channel = -1 if op.linear else 1
        dims = [d for d in range(err.dim()) if d != channel % err.dim()]
        op.inner.bias.add_(err.mean(dim=dims) * op.bias_kept)
