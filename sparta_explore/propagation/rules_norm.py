"""Rules for normalization and softmax: ops that couple every element of a group.

A normalized element depends on its whole group (mean, variance, or the softmax sum), so
one kept output makes every input of its group matter, and a pruned (zero) input still
yields a non-zero output unless the affine terms that would carry it are pruned too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sparta_explore.compact import any_over, any_true, both, either
from sparta_explore.propagation.algebra import any_to
from sparta_explore.propagation.registry import OpUpdate, OpView, Unsupported, register_rule
from sparta_explore.tesa import TeSA


def _channel(mask_c: torch.Tensor, ndim: int) -> torch.Tensor:
    return mask_c.reshape((1, -1) + (1,) * (ndim - 2))


@register_rule(nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
def batchnorm_rule(op: OpView) -> OpUpdate:
    # eval: y = a_c x + b_c with a_c = gamma_c / sqrt(var_c + eps), b_c = beta_c - mean_c a_c
    x, mod, p = op.args[0], op.module, op.params
    n_ch = x.shape[1]
    ones = torch.ones(n_ch, dtype=torch.bool)
    a_kept = p["weight"].kept if "weight" in p else ones
    beta = p["bias"].kept if "bias" in p else ~ones
    running = mod.track_running_stats and mod.running_mean is not None and not mod.training
    mean = p["running_mean"].kept if running and "running_mean" in p else ones
    b_kept = beta | (mean & a_kept)
    ndim = len(x.shape)
    xk = x.kept
    if running:
        out = (xk & _channel(a_kept, ndim)) | _channel(b_kept, ndim)
    else:  # batch statistics couple a whole channel
        x_any = any_over(xk, [d for d in range(ndim) if d != 1])
        out = _channel(b_kept, ndim) | (_channel(a_kept, ndim) & x_any)
    out = out & op.output.kept
    reduce = tuple(d for d in range(ndim) if d != 1)
    y_any = any_true(out, dim=reduce) if reduce else out
    x_any_c = any_true(xk, dim=reduce) if reduce else xk
    scale_used = y_any & a_kept & (x_any_c | mean)
    x_rel = out & _channel(a_kept, ndim) if running else torch.broadcast_to(_channel(y_any & a_kept, ndim), x.shape)
    params = {"weight": scale_used, "bias": y_any, "running_mean": y_any & a_kept, "running_var": scale_used}
    return OpUpdate(output=out, args={0: x_rel}, params={k: v for k, v in params.items() if k in p})


def _layer_norm(x: TeSA, dims: int, weight: TeSA | None, bias: TeSA | None, output: TeSA) -> tuple:
    group = list(range(len(x.shape) - dims, len(x.shape)))
    norm_shape = x.shape[len(x.shape) - dims:]
    w = weight.kept if weight is not None else torch.ones(norm_shape, dtype=torch.bool)
    b = bias.kept if bias is not None else torch.zeros(norm_shape, dtype=torch.bool)
    x_any = any_over(x.kept, group)  # an all-zero group normalizes to zero, leaving only the bias
    out = both(either(b, both(w, x_any)), output.kept)  # on broadcast cores: batch-invariant stays compact
    x_rel = torch.broadcast_to(any_over(both(out, w), group), x.shape)
    w_rel = any_to(both(out, x_any), norm_shape)
    b_rel = any_to(out, norm_shape)
    return out, x_rel, w_rel, b_rel


@register_rule(nn.LayerNorm)
def layernorm_module(op: OpView) -> OpUpdate:
    p = op.params
    out, x_rel, w_rel, b_rel = _layer_norm(op.args[0], len(op.module.normalized_shape), p.get("weight"),
                                           p.get("bias"), op.output)
    params = {k: v for k, v in (("weight", w_rel), ("bias", b_rel)) if k in p}
    return OpUpdate(output=out, args={0: x_rel}, params=params)


@register_rule(F.layer_norm)
def layernorm_function(op: OpView) -> OpUpdate:
    x, shape = op.arg(0, "input"), op.arg(1, "normalized_shape")
    w, b = op.arg(2, "weight"), op.arg(3, "bias")
    w = w if isinstance(w, TeSA) else None
    b = b if isinstance(b, TeSA) else None
    out, x_rel, w_rel, b_rel = _layer_norm(x, len(tuple(shape)), w, b, op.output)
    args = {op.slot_of(0, "input"): x_rel}
    if w is not None:
        args[op.slot_of(2, "weight")] = w_rel
    if b is not None:
        args[op.slot_of(3, "bias")] = b_rel
    return OpUpdate(output=out, args=args)


@register_rule(nn.GroupNorm)
def groupnorm_rule(op: OpView) -> OpUpdate:
    x, mod, p = op.args[0], op.module, op.params
    n, c = x.shape[0], x.shape[1]
    g = mod.num_groups
    xg = x.kept.reshape(n, g, -1)
    x_any = any_true(xg, dim=-1, keepdim=True).expand_as(xg).reshape(x.shape)
    ones = torch.ones(c, dtype=torch.bool)
    w = p["weight"].kept if "weight" in p else ones
    b = p["bias"].kept if "bias" in p else ~ones
    nd = len(x.shape)
    out = (_channel(b, nd) | (_channel(w, nd) & x_any)) & op.output.kept
    rel = any_true((out & _channel(w, nd)).reshape(n, g, -1), dim=-1, keepdim=True)
    x_rel = rel.expand(n, g, xg.shape[-1]).reshape(x.shape)
    reduce = tuple(d for d in range(nd) if d != 1)
    params = {"weight": any_true(out & x_any, dim=reduce), "bias": any_true(out, dim=reduce)}
    return OpUpdate(output=out, args={0: x_rel}, params={k: v for k, v in params.items() if k in p})


def _softmax_dim(op: OpView) -> int:
    dim = op.module.dim if op.module is not None else op.arg(1, "dim")
    if dim is None:
        raise Unsupported("softmax without an explicit dim")
    return dim


@register_rule(nn.Softmax, nn.LogSoftmax, F.softmax, torch.softmax, "softmax", F.log_softmax, torch.log_softmax,
               "log_softmax")
def softmax_rule(op: OpView) -> OpUpdate:
    # exp(0) = 1: a pruned input still gets probability, so nothing is pruned forward;
    # the row sum couples the row, so any kept output keeps its whole row relevant
    x = op.arg(0, "input")
    rel = torch.broadcast_to(any_over(op.output.kept, [_softmax_dim(op)]), x.shape)
    return OpUpdate(args={op.slot_of(0, "input"): rel})
