"""Rules for data movement: views, permutes, cat/split/chunk, indexing, padding.

These ops only move elements, so the op itself is replayed on the packed TeSA keys
(forward: each output element carries its source's pruning, bits and format) and on
ones with autograd (backward: an input element matters iff a kept output reads it).
All are passive. Zero padding creates pruned elements; padding with a non-zero value
creates kept ones.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import nn

from sparta_explore.propagation.algebra import moved_back, moved_keys
from sparta_explore.propagation.registry import OpUpdate, OpView, Unsupported, register_rule
from sparta_explore.tesa import MAX_BITS, NumberFormat, TeSA

_METHODS = ("view", "reshape", "permute", "transpose", "flatten", "unflatten", "squeeze", "unsqueeze", "expand",
            "expand_as", "view_as", "reshape_as", "repeat", "t", "narrow", "select", "split", "chunk", "unbind",
            "flip", "roll", "movedim", "swapaxes", "tile")
_FUNCTIONS = (torch.flatten, torch.reshape, torch.permute, torch.transpose, torch.squeeze, torch.unsqueeze, torch.cat,
              torch.concat, torch.stack, torch.split, torch.chunk, torch.unbind, torch.narrow, torch.select,
              torch.flip, torch.roll, torch.movedim, torch.t, torch.swapaxes, torch.tile, operator.getitem)


@register_rule(*_METHODS, *_FUNCTIONS, nn.Flatten, nn.Unflatten, nn.ChannelShuffle, nn.PixelShuffle,
               nn.PixelUnshuffle, passive=True)
def data_movement_rule(op: OpView) -> OpUpdate:
    slots = op.tensor_slots()
    if not slots:
        raise Unsupported("data movement without tensor operands")
    index = op.args[1] if op.node.target is operator.getitem and len(op.args) > 1 else None
    if isinstance(index, TeSA) or (isinstance(index, (tuple, list)) and any(isinstance(i, TeSA) for i in index)):
        raise Unsupported("indexing with a tensor (its values decide which elements move)")
    keys = [s for s, _ in slots]

    def fn(*xs: torch.Tensor):
        return op.replay(dict(zip(keys, xs)))

    tesas = [t for _, t in slots]
    out = moved_keys(fn, tesas)
    back = moved_back(fn, tesas, op.output)
    return OpUpdate(output=out, args=dict(zip(keys, back)))


def _pad_update(op: OpView, x: TeSA, pad_fn, value: float) -> OpUpdate:
    # padding with 0 adds pruned elements; with any other value it adds kept 32-bit floats
    keys = pad_fn(x._key.to(torch.float32))
    if value:
        padded = pad_fn(torch.full(x.shape, value + 1.0)) == value  # interior holds value + 1
        keys = torch.where(padded, torch.full_like(keys, MAX_BITS * 4 + int(NumberFormat.FLOAT)), keys)
    out = TeSA._from_key(keys.to(torch.uint8))
    (rel,) = moved_back(pad_fn, [x], op.output)
    return OpUpdate(output=out, args={op.slot_of(0, "input"): rel})


@register_rule(F.pad, passive=True)
def pad_function(op: OpView) -> OpUpdate:
    x = op.arg(0, "input")
    pad, mode, value = op.arg(1, "pad"), op.arg(2, "mode", "constant"), op.arg(3, "value", None)
    value = 0.0 if value is None else float(value)
    if mode == "constant":
        return _pad_update(op, x, lambda t: F.pad(t, pad, mode, value), value)
    return _pad_update(op, x, lambda t: F.pad(t, pad, mode), 0.0)


@register_rule(nn.ZeroPad1d, nn.ZeroPad2d, nn.ZeroPad3d, nn.ConstantPad1d, nn.ConstantPad2d, nn.ConstantPad3d,
               nn.ReflectionPad1d, nn.ReflectionPad2d, nn.ReflectionPad3d, nn.ReplicationPad1d, nn.ReplicationPad2d,
               nn.ReplicationPad3d, nn.CircularPad1d, nn.CircularPad2d, nn.CircularPad3d, passive=True)
def pad_module(op: OpView) -> OpUpdate:
    mod = op.module
    value = float(getattr(mod, "value", 0.0) or 0.0)
    return _pad_update(op, op.args[0], mod, value)
