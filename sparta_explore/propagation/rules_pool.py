"""Rules for pooling and reductions.

Average pooling, adaptive average pooling, sum and mean are linear with non-negative
weights (`multilinear`). Max pooling picks one element of its window: its output is zero
only if the whole window is, its value (and so its bits) comes from the window, and an
input matters iff a kept output's window covers it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sparta_explore.propagation.algebra import multilinear
from sparta_explore.propagation.registry import OpUpdate, OpView, Unsupported, register_rule
from sparta_explore.tesa import TeSA

_AVG = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
_MAX = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_ADAPTIVE_AVG = {1: F.adaptive_avg_pool1d, 2: F.adaptive_avg_pool2d, 3: F.adaptive_avg_pool3d}
_ADAPTIVE_MAX = {1: F.adaptive_max_pool1d, 2: F.adaptive_max_pool2d, 3: F.adaptive_max_pool3d}


def _spatial(x: TeSA, module: nn.Module | None, n_by_class: dict[type, int]) -> int:
    if module is not None:
        for cls, n in n_by_class.items():
            if isinstance(module, cls):
                return n
    return len(x.shape) - 2


def _keys_pool(fn, x: TeSA) -> TeSA:
    # packed keys as floats (exact below 2^24): the max over a window is 0 only if all are pruned
    return TeSA._from_key(fn(x._key.to(torch.float32)).to(torch.uint8))


def _window_relevance(window_sum, x: TeSA, output: TeSA) -> torch.Tensor:
    _, (rel,) = multilinear(window_sum, [TeSA.dense(x.shape)], output)
    return rel


def _max_pool(op: OpView, x: TeSA, kernel, stride, padding, dilation, ceil_mode: bool, n: int) -> OpUpdate:
    stride = stride if stride not in (None, [], ()) else kernel
    out = _keys_pool(lambda t: _MAX[n](t, kernel, stride, padding, dilation, ceil_mode), x)
    dil = (dilation,) * n if isinstance(dilation, int) else tuple(dilation)
    if all(d == 1 for d in dil):
        def window(t: torch.Tensor) -> torch.Tensor:
            return _AVG[n](t, kernel, stride, padding, ceil_mode, True)
    elif n == 2 and not ceil_mode:
        def window(t: torch.Tensor) -> torch.Tensor:
            cols = F.unfold(t.flatten(0, 1).unsqueeze(1), kernel, dilation, padding, stride)
            return cols.sum(dim=1).reshape(t.shape[0], t.shape[1], *op.output.shape[2:])
    else:
        raise Unsupported("dilated max pooling other than 2-D without ceil_mode")
    return OpUpdate(output=out, args={op.slot_of(0, "input"): _window_relevance(window, x, op.output)})


@register_rule(nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, passive=True)
def max_pool_module(op: OpView) -> OpUpdate:
    m = op.module
    if m.return_indices:
        raise Unsupported("max pooling with return_indices")
    n = _spatial(op.args[0], m, {nn.MaxPool1d: 1, nn.MaxPool2d: 2, nn.MaxPool3d: 3})
    return _max_pool(op, op.args[0], m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode, n)


@register_rule(F.max_pool1d, F.max_pool2d, F.max_pool3d, passive=True)
def max_pool_function(op: OpView) -> OpUpdate:
    x = op.arg(0, "input")
    if op.arg(6, "return_indices", False):
        raise Unsupported("max pooling with return_indices")
    return _max_pool(op, x, op.arg(1, "kernel_size"), op.arg(2, "stride"), op.arg(3, "padding", 0),
                     op.arg(4, "dilation", 1), bool(op.arg(5, "ceil_mode", False)), len(x.shape) - 2)


@register_rule(nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d,
               nn.AdaptiveAvgPool3d)
def avg_pool_module(op: OpView) -> OpUpdate:
    out, (rel,) = multilinear(op.module, [op.args[0]], op.output)
    return OpUpdate(output=out, args={0: rel})


@register_rule(F.avg_pool1d, F.avg_pool2d, F.avg_pool3d, F.adaptive_avg_pool1d, F.adaptive_avg_pool2d,
               F.adaptive_avg_pool3d, torch.mean, torch.sum, "mean", "sum")
def linear_reduce_rule(op: OpView) -> OpUpdate:
    # averages and sums are linear with positive weights
    slot = op.slot_of(0, "input")
    x = op.arg(0, "input")
    if not isinstance(x, TeSA):
        raise Unsupported("reduction of a non-tensor")
    out, (rel,) = multilinear(lambda t: op.replay({slot: t}), [x], op.output)
    return OpUpdate(output=out, args={slot: rel})


@register_rule(nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d, passive=True)
def adaptive_max_pool_module(op: OpView) -> OpUpdate:
    m = op.module
    if m.return_indices:
        raise Unsupported("adaptive max pooling with return_indices")
    x = op.args[0]
    n = _spatial(x, m, {nn.AdaptiveMaxPool1d: 1, nn.AdaptiveMaxPool2d: 2, nn.AdaptiveMaxPool3d: 3})
    out = _keys_pool(lambda t: _ADAPTIVE_MAX[n](t, m.output_size), x)
    rel = _window_relevance(lambda t: _ADAPTIVE_AVG[n](t, m.output_size), x, op.output)
    return OpUpdate(output=out, args={0: rel})
