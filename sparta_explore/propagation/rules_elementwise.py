"""Rules for elementwise ops: add/sub/mul/div with broadcasting, activations, dropout.

Zero-preserving activations (f(0) = 0: relu, gelu, silu, tanh, hardswish, ...) carry pruned
zeros forward; the others (sigmoid, exp, ...) turn a zero into a constant, so nothing is
pruned forward through them. Backward, an elementwise op's input matters only where its
output does. Only relu and identity-like ops are passive (bits flow through them).
"""

from __future__ import annotations

import operator
from numbers import Number

import torch
import torch.nn.functional as F
from torch import nn

from sparta_explore.compact import both, either, spread
from sparta_explore.propagation.algebra import any_to, multilinear
from sparta_explore.propagation.registry import OpUpdate, OpView, Unsupported, register_rule
from sparta_explore.tesa import TeSA


def _unary_update(op: OpView, zero_preserving: bool, passive: bool) -> OpUpdate:
    x = op.arg(0, "input")
    if not isinstance(x, TeSA):
        raise Unsupported("elementwise op on a non-tensor")
    # a passive op's output holds the input's values, so the input's bits flow through
    passes = passive and x.shape == op.output.shape
    out = x if passes else (x.kept if zero_preserving else None)
    return OpUpdate(output=out, args={op.slot_of(0, "input"): any_to(op.output.kept, x.shape)})


def _register_unary(targets: tuple, zero_preserving: bool, passive: bool = False) -> None:
    def rule(op: OpView) -> OpUpdate:
        return _unary_update(op, zero_preserving, passive)
    rule.__name__ = f"{'zero_preserving' if zero_preserving else 'nonzero_at_zero'}_unary"
    register_rule(*targets, passive=passive)(rule)


_register_unary((nn.ReLU, F.relu, torch.relu, "relu", "relu_", F.relu_), zero_preserving=True, passive=True)
_register_unary((nn.ReLU6, F.relu6, nn.GELU, F.gelu, nn.SiLU, F.silu, nn.Tanh, torch.tanh,
                 "tanh", nn.Hardswish, F.hardswish, nn.LeakyReLU, F.leaky_relu, nn.ELU, F.elu, nn.Mish,
                 F.mish, nn.Softsign, F.softsign, nn.Tanhshrink, torch.abs, "abs", torch.sin,
                 "sin", torch.neg, operator.neg, "neg", nn.CELU, nn.SELU, F.selu, nn.Hardshrink, nn.Softshrink),
                zero_preserving=True)
_register_unary((nn.Sigmoid, torch.sigmoid, "sigmoid", nn.Softplus, F.softplus, torch.exp, "exp",
                 torch.cos, "cos", nn.Hardsigmoid, F.hardsigmoid), zero_preserving=False)
_register_unary((nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, F.dropout, nn.Identity,
                 "contiguous", "clone", "detach", torch.clone), zero_preserving=True, passive=True)
_register_unary(("float", "to", "type", "double", "half"), zero_preserving=True)


def _operands(op: OpView) -> tuple:
    a, b = op.arg(0, "input"), op.arg(1, "other")
    if not isinstance(a, (TeSA, Number)) or not isinstance(b, (TeSA, Number)):
        raise Unsupported("elementwise op with a non-tensor, non-number operand")
    return a, b


def _full(op: OpView, value: bool) -> torch.Tensor:
    return spread(torch.full((1,) * len(op.output.shape), value, dtype=torch.bool), op.output.shape)


def _as_kept(op: OpView, v: TeSA | Number) -> torch.Tensor:
    return v.kept if isinstance(v, TeSA) else _full(op, v != 0)


@register_rule(operator.add, operator.sub, torch.add, torch.sub, torch.subtract, "add", "sub", torch.rsub)
def add_rule(op: OpView) -> OpUpdate:
    # a + b may be non-zero where either side is kept; each side matters where the sum does
    a, b = _operands(op)
    alpha = op.kwargs.get("alpha", 1)
    if isinstance(b, TeSA):
        kb = _as_kept(op, b) if alpha != 0 else _full(op, False)
    else:
        kb = _full(op, b != 0 and alpha != 0)
    # on broadcast cores (compact): a residual add of two batch-invariant masks stays one row
    out = torch.broadcast_to(either(_as_kept(op, a), kb), op.output.shape)
    args = {}
    for slot, v in ((op.slot_of(0, "input"), a), (op.slot_of(1, "other"), b)):
        if isinstance(v, TeSA):
            args[slot] = any_to(both(op.output.kept, out), v.shape)
    return OpUpdate(output=out, args=args)


@register_rule(operator.mul, torch.mul, torch.multiply, "mul")
def mul_rule(op: OpView) -> OpUpdate:
    a, b = _operands(op)
    if isinstance(a, TeSA) and isinstance(b, TeSA):
        out, (ka, kb) = multilinear(torch.mul, [a, b], op.output)
        return OpUpdate(output=out, args={op.slot_of(0, "input"): ka, op.slot_of(1, "other"): kb})
    tensor_slot, t, c = (op.slot_of(0, "input"), a, b) if isinstance(a, TeSA) else (op.slot_of(1, "other"), b, a)
    if c == 0:  # x * 0 is zero everywhere, and x no longer matters
        return OpUpdate(output=_full(op, False), args={tensor_slot: torch.zeros(t.shape, dtype=torch.bool)})
    return OpUpdate(output=t.kept, args={tensor_slot: any_to(op.output.kept, t.shape)})


@register_rule(operator.truediv, torch.div, torch.true_divide, "div", "true_divide")
def div_rule(op: OpView) -> OpUpdate:
    # a / b is zero where a is; b is never pruned by this rule (a zero divisor changes the output)
    a, b = _operands(op)
    if isinstance(a, TeSA):
        return OpUpdate(output=torch.broadcast_to(a.kept, op.output.shape),
                        args={op.slot_of(0, "input"): any_to(op.output.kept, a.shape)})
    return OpUpdate(output=_full(op, False) if a == 0 else None)


@register_rule(operator.pow, torch.pow, "pow")
def pow_rule(op: OpView) -> OpUpdate:
    a, b = _operands(op)
    if not isinstance(a, TeSA) or not isinstance(b, Number):
        raise Unsupported("pow with a tensor exponent")
    out = a.kept if b > 0 else None  # 0 ** p = 0 for p > 0; x ** 0 = 1
    return OpUpdate(output=out, args={op.slot_of(0, "input"): any_to(op.output.kept, a.shape)})


@register_rule(nn.Hardtanh, F.hardtanh)
def hardtanh_rule(op: OpView) -> OpUpdate:
    # clamp(0, lo, hi) is 0 only when lo <= 0 <= hi
    if op.module is not None:
        lo, hi = op.module.min_val, op.module.max_val
    else:
        lo, hi = op.arg(1, "min_val", -1.0), op.arg(2, "max_val", 1.0)
    return _unary_update(op, zero_preserving=lo <= 0 <= hi, passive=False)
