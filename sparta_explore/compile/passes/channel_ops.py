"""What the channel passes know about ops: which compute per element, whether they keep zeros, how shapes move axes.

One table, `ELEMENTWISE`, keyed by fx target (module class, function, or method name):
each entry says whether the op maps 0 to 0 (ReLU, GELU, x * 2 do; sigmoid, BatchNorm's
shift, x + 1 do not). `constant_channels` and `shrink` both read it: a channel-wise op
carries a channel's state (input-independent, or cut out) from its input to its output.
`POOLS` are per-channel spatial ops (each output channel reads its own input channel).

Example:
    >>> elementwise_zero_preserving(None, "relu", ())
    True
    >>> elementwise_zero_preserving(None, torch.sigmoid, ())
    False
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

ZeroCheck = Callable[[nn.Module | None, tuple], bool]


def _always(_: nn.Module | None, __: tuple) -> bool:
    return True


def _never(_: nn.Module | None, __: tuple) -> bool:
    return False


def _hardtanh(module: nn.Module | None, args: tuple) -> bool:
    lo, hi = (module.min_val, module.max_val) if module is not None else (
        args[1] if len(args) > 1 else -1.0, args[2] if len(args) > 2 else 1.0)
    return isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and lo <= 0 <= hi


def _clamp(_: nn.Module | None, args: tuple) -> bool:
    lo = args[1] if len(args) > 1 else None
    hi = args[2] if len(args) > 2 else None
    ok = lambda v: v is None or isinstance(v, (int, float))  # noqa: E731
    return ok(lo) and ok(hi) and (lo is None or lo <= 0) and (hi is None or hi >= 0)


# fx target -> does the op map 0 to 0? (a per-element op: the value at each position depends on the input there only)
ELEMENTWISE: dict[object, ZeroCheck] = {}
for _targets, _check in (
    ((nn.ReLU, F.relu, torch.relu, "relu", nn.ReLU6, F.relu6, nn.GELU, F.gelu, nn.SiLU, F.silu, nn.Hardswish,
      F.hardswish, nn.Tanh, torch.tanh, "tanh", nn.LeakyReLU, F.leaky_relu, nn.ELU, F.elu, nn.Mish, F.mish,
      torch.abs, "abs", torch.neg, "neg", operator.neg, nn.Identity, "contiguous", "clone", torch.clone), _always),
    ((nn.Hardtanh, F.hardtanh), _hardtanh),
    ((nn.Dropout, nn.Dropout1d, nn.Dropout2d, F.dropout), _always),  # zero stays zero, even when it draws
    ((torch.clamp, "clamp", "clamp_", torch.clip, "clip"), _clamp),
    ((nn.Sigmoid, torch.sigmoid, "sigmoid", F.sigmoid, nn.Hardsigmoid, F.hardsigmoid, torch.exp, "exp",
      nn.Softplus, F.softplus, torch.cos, "cos"), _never),
):
    for _t in _targets:
        ELEMENTWISE[_t] = _check

POOLS: tuple[object, ...] = (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d, F.max_pool2d,
                             F.avg_pool2d, F.adaptive_avg_pool2d, F.adaptive_max_pool2d)
NORMS: tuple[type, ...] = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
ADDS: tuple[object, ...] = (operator.add, torch.add, "add", operator.sub, torch.sub, "sub")
MULS: tuple[object, ...] = (operator.mul, torch.mul, "mul", operator.truediv, torch.div, "div")


def op_key(gm: fx.GraphModule, node: fx.Node) -> object:
    """What the tables are keyed by: the module's class for call_module, else the function or method name."""
    return type(gm.get_submodule(node.target)) if node.op == "call_module" else node.target


def lookup(table: dict[object, object], key: object) -> object | None:
    """`table[key]`, or None (also for unhashable fx targets)."""
    try:
        return table.get(key)
    except TypeError:
        return None


def elementwise_zero_preserving(module: nn.Module | None, key: object, args: tuple) -> bool | None:
    """None when `key` is not a per-element op; else whether it maps 0 to 0 (for these args).

    Example:
        >>> elementwise_zero_preserving(nn.Hardtanh(0.0, 6.0), nn.Hardtanh, ())
        True
    """
    check = lookup(ELEMENTWISE, key)
    return None if check is None else check(module, args)


def is_pool(key: object) -> bool:
    """Whether `key` is a per-channel spatial op (pooling)."""
    return key in POOLS


def scalar(value: object) -> bool:
    """Whether `value` is a Python number (a scalar operand)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


DROPOUTS: tuple[object, ...] = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, F.dropout)


def draws_random(module: nn.Module | None, key: object, args: tuple, kwargs: dict) -> bool:
    """Whether the op draws random numbers on this call (a dropout that is not the identity)."""
    if key not in DROPOUTS:
        return False
    if module is not None:
        return module.training and module.p > 0
    p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
    training = args[2] if len(args) > 2 else kwargs.get("training", True)
    return bool(training) and p != 0


def eval_norm(module: nn.Module | None) -> bool:
    """A BatchNorm that normalizes with its running statistics (a per-channel affine map, the same for every batch)."""
    return isinstance(module, NORMS) and not module.training and module.track_running_stats \
        and module.running_mean is not None


def depthwise(module: nn.Module) -> bool:
    """A conv whose every output channel reads exactly one input channel (groups == in_channels)."""
    return isinstance(module, nn.Conv2d) and module.groups == module.in_channels and module.groups > 1


def mixer(module: nn.Module | None) -> bool:
    """A Linear, or a Conv2d with groups 1: every output channel reads every input channel."""
    return isinstance(module, nn.Linear) or (isinstance(module, nn.Conv2d) and module.groups == 1)
