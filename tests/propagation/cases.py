"""Conformance cases: one tiny model per registered target (or family), built to exercise its rule.

Every case wraps the op between parametrized layers so random pruning reaches it from both
sides: `pre` feeds it (its pruned rows make zeros flow in), `post` reads it (its pruned
columns make parts of the op's output irrelevant).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Case:
    name: str
    targets: tuple
    build: Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]

    def __str__(self) -> str:
        return self.name


class Chain(nn.Module):
    """pre -> body(self, h) -> post; `op` holds the module under test, if any."""

    def __init__(self, body, pre: nn.Module, post: nn.Module, op: nn.Module | None = None,
                 extra: nn.Parameter | None = None) -> None:
        super().__init__()
        self.pre, self.post, self.op = pre, post, op
        if extra is not None:
            self.extra = extra
        self._body = body

    def forward(self, x):
        return self.post(self._body(self, self.pre(x)))


def _name(t) -> str:
    return t if isinstance(t, str) else getattr(t, "__name__", str(t))


def _case(name, targets, body, pre, post, x_shape, op=None, extra=None, x=None) -> Case:
    def build():
        torch.manual_seed(0)
        model = Chain(body, pre(), post(), op() if op else None, extra() if extra else None).eval()
        return model, (x if x is not None else torch.randn(*x_shape),)
    return Case(name, tuple(targets), build)


def _call(target, h, *args, **kwargs):
    if isinstance(target, str):
        return getattr(h, target)(*args, **kwargs)
    return target(h, *args, **kwargs)


# ---- unary elementwise ------------------------------------------------------------------
UNARY_MODULES = [nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.Tanh, nn.Hardswish, nn.LeakyReLU, nn.ELU, nn.Mish,
                 nn.Softsign, nn.Tanhshrink, nn.CELU, nn.SELU, nn.Hardshrink, nn.Softshrink, nn.Dropout, nn.Dropout1d,
                 nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.Identity, nn.Sigmoid, nn.Softplus, nn.Hardsigmoid]
UNARY_FUNCTIONS = [F.relu, torch.relu, F.relu_, torch.relu_, F.relu6, F.gelu, F.silu, torch.tanh,
                   F.hardswish, F.leaky_relu, F.elu, F.mish, F.softsign, torch.abs, torch.sin, torch.neg, operator.neg,
                   F.selu, torch.clone, torch.sigmoid, F.softplus, torch.exp, torch.cos, F.hardsigmoid]
UNARY_METHODS = ["relu", "relu_", "tanh", "abs", "sin", "neg", "contiguous", "clone", "detach", "sigmoid", "exp", "cos"]


def unary_cases() -> list[Case]:
    cases = []
    for cls in UNARY_MODULES:
        # channel dropouts want (N, C, ...) inputs: h (rows x 8) is reshaped around them
        shape = {nn.Dropout1d: (2, 8, 3), nn.Dropout2d: (2, 8, 3, 3), nn.Dropout3d: (2, 8, 1, 1, 2)}.get(cls, (4, 8))
        rows = int(torch.tensor(shape).prod()) // 8
        cases.append(_case(cls.__name__, [cls], lambda self, h, s=shape: self.op(h.reshape(s)).reshape(h.shape),
                           lambda: nn.Linear(6, 8), lambda: nn.Linear(8, 3), (rows, 6), op=cls))
    for fn in UNARY_FUNCTIONS:
        cases.append(_case(f"F.{_name(fn)}", [fn], lambda self, h, f=fn: f(h), lambda: nn.Linear(6, 8),
                           lambda: nn.Linear(8, 3), (4, 6)))
    for m in UNARY_METHODS:
        cases.append(_case(f".{m}", [m], lambda self, h, m=m: _call(m, h), lambda: nn.Linear(6, 8),
                           lambda: nn.Linear(8, 3), (4, 6)))
    for lo, hi in ((-1.0, 1.0), (0.5, 2.0), (-2.0, -0.5)):  # the last two move 0 away from 0
        cases.append(_case(f"Hardtanh({lo},{hi})", [nn.Hardtanh], lambda self, h: self.op(h), lambda: nn.Linear(6, 8),
                           lambda: nn.Linear(8, 3), (4, 6), op=lambda a=lo, b=hi: nn.Hardtanh(a, b)))
        cases.append(_case(f"F.hardtanh({lo},{hi})", [F.hardtanh], lambda self, h, a=lo, b=hi: F.hardtanh(h, a, b),
                           lambda: nn.Linear(6, 8), lambda: nn.Linear(8, 3), (4, 6)))
    cases.append(_case("F.dropout", [F.dropout], lambda self, h: F.dropout(h, 0.5, False), lambda: nn.Linear(6, 8),
                       lambda: nn.Linear(8, 3), (4, 6)))
    cases.append(_case(".to/.type/.float/.double/.half", ["to", "type", "float", "double", "half"],
                       lambda self, h: h.double().half().float().to(torch.float32).type(torch.float32),
                       lambda: nn.Linear(6, 8), lambda: nn.Linear(8, 3), (4, 6)))
    return cases


# ---- binary elementwise -----------------------------------------------------------------
BINARY = {
    "add": [operator.add, torch.add, "add"],
    "sub": [operator.sub, torch.sub, torch.subtract, "sub"],
    "mul": [operator.mul, torch.mul, torch.multiply, "mul"],
    "div": [operator.truediv, torch.div, torch.true_divide, "div", "true_divide"],
}


def binary_cases() -> list[Case]:
    cases = []
    for family, targets in BINARY.items():
        for t in targets:
            # tensor (x) tensor of the same shape, tensor (x) broadcast parameter, tensor (x) scalar
            cases.append(_case(f"{family}:{_name(t)}:tensor", [t], lambda self, h, t=t: _call(t, h[:, :8], h[:, 8:]),
                               lambda: nn.Linear(6, 16), lambda: nn.Linear(8, 3), (4, 6)))
            cases.append(_case(f"{family}:{_name(t)}:broadcast", [t],
                               lambda self, h, t=t: _call(t, h, self.extra), lambda: nn.Linear(6, 8),
                               lambda: nn.Linear(8, 3), (4, 6), extra=lambda: nn.Parameter(torch.rand(1, 8) + 0.5)))
            cases.append(_case(f"{family}:{_name(t)}:scalar", [t], lambda self, h, t=t: _call(t, h, 2.0),
                               lambda: nn.Linear(6, 8), lambda: nn.Linear(8, 3), (4, 6)))
    cases.append(_case("rsub", [torch.rsub], lambda self, h: torch.rsub(h[:, :8], h[:, 8:]), lambda: nn.Linear(6, 16),
                       lambda: nn.Linear(8, 3), (4, 6)))
    cases.append(_case("mul:zero", [operator.mul], lambda self, h: h * 0.0 + h, lambda: nn.Linear(6, 8),
                       lambda: nn.Linear(8, 3), (4, 6)))
    cases.append(_case("div:scalar-numerator", [operator.truediv], lambda self, h: 1.0 / (h.abs() + 1.0),
                       lambda: nn.Linear(6, 8), lambda: nn.Linear(8, 3), (4, 6)))
    for t in (operator.pow, torch.pow, "pow"):
        cases.append(_case(f"pow:{_name(t)}", [t], lambda self, h, t=t: _call(t, h, 2) + _call(t, h, 0),
                           lambda: nn.Linear(6, 8), lambda: nn.Linear(8, 3), (4, 6)))
    return cases


# ---- products ---------------------------------------------------------------------------
def product_cases() -> list[Case]:
    lin = lambda: nn.Linear(6, 8)  # noqa: E731
    cases = [
        _case("Linear", [nn.Linear], lambda self, h: self.op(h), lin, lambda: nn.Linear(5, 3), (4, 6),
              op=lambda: nn.Linear(8, 5)),
        _case("Linear:3d", [nn.Linear], lambda self, h: self.op(h), lin, lambda: nn.Linear(5, 3), (2, 3, 6),
              op=lambda: nn.Linear(8, 5)),
        _case("F.linear", [F.linear], lambda self, h: F.linear(h, self.extra[:, :8], self.extra[:, 8]), lin,
              lambda: nn.Linear(5, 3), (4, 6), extra=lambda: nn.Parameter(torch.randn(5, 9))),
    ]
    for t in (torch.matmul, operator.matmul, "matmul"):
        cases.append(_case(f"matmul:{_name(t)}", [t],
                           lambda self, h, t=t: _call(t, h.reshape(2, 4, 4),
                                                      h.reshape(2, 4, 4).transpose(1, 2)).reshape(2, 16),
                           lambda: nn.Linear(6, 16), lambda: nn.Linear(16, 3), (2, 6)))
        cases.append(_case(f"matmul:{_name(t)}:param", [t], lambda self, h, t=t: _call(t, h, self.extra),
                           lin, lambda: nn.Linear(5, 3), (4, 6), extra=lambda: nn.Parameter(torch.randn(8, 5))))
    for t in (torch.bmm, "bmm"):
        cases.append(_case(f"bmm:{_name(t)}", [t],
                           lambda self, h, t=t: _call(t, h.reshape(2, 4, 4), h.reshape(2, 4, 4)).reshape(2, 16),
                           lambda: nn.Linear(6, 16), lambda: nn.Linear(16, 3), (2, 6)))
    for t in (torch.mm, "mm"):
        cases.append(_case(f"mm:{_name(t)}", [t], lambda self, h, t=t: _call(t, h, self.extra), lin,
                           lambda: nn.Linear(5, 3), (4, 6), extra=lambda: nn.Parameter(torch.randn(8, 5))))
    cases.append(_case("einsum", [torch.einsum], lambda self, h: torch.einsum("bi,ij->bj", h, self.extra), lin,
                       lambda: nn.Linear(5, 3), (4, 6), extra=lambda: nn.Parameter(torch.randn(8, 5))))
    convs = [(nn.Conv1d, 1, dict(groups=2, stride=2, padding=1, dilation=1)),
             (nn.Conv2d, 2, dict(stride=1, padding=2, dilation=2)),
             (nn.Conv2d, 2, dict(groups=4, padding=1)),  # depthwise: 4 channels, 4 groups
             (nn.Conv2d, 2, dict(padding=1, padding_mode="reflect")),
             (nn.Conv3d, 3, dict(padding=1))]
    for cls, nd, kw in convs:
        spatial = (5,) * nd
        cases.append(_case(f"{cls.__name__}:{kw}", [cls], lambda self, h: self.op(h), lambda: nn.Identity(),
                           lambda: nn.Flatten(), (2, 4, *spatial), op=lambda c=cls, k=kw: c(4, 4, 3, **k)))
    for cls, nd in ((nn.ConvTranspose1d, 1), (nn.ConvTranspose2d, 2), (nn.ConvTranspose3d, 3)):
        cases.append(_case(cls.__name__, [cls], lambda self, h: self.op(h), lambda: nn.Identity(),
                           lambda: nn.Flatten(), (2, 4, *(4,) * nd), op=lambda c=cls: c(4, 3, 3, stride=2)))
    for fn, nd in ((F.conv1d, 1), (F.conv2d, 2), (F.conv3d, 3)):
        cases.append(_case(f"F.{fn.__name__}", [fn],
                           lambda self, h, f=fn: f(h, self.extra, None, 1, 1), lambda: nn.Identity(),
                           lambda: nn.Flatten(), (2, 4, *(4,) * nd),
                           extra=lambda n=nd: nn.Parameter(torch.randn(3, 4, *(3,) * n))))
    ids = torch.tensor([[0, 3, 5, 3], [9, 1, 0, 2]])
    cases.append(_case("Embedding", [nn.Embedding], lambda self, h: self.op(h), lambda: nn.Identity(),
                       lambda: nn.Linear(6, 3), None, op=lambda: nn.Embedding(10, 6), x=ids))
    cases.append(_case("F.embedding", [F.embedding], lambda self, h: F.embedding(h, self.extra), lambda: nn.Identity(),
                       lambda: nn.Linear(6, 3), None, extra=lambda: nn.Parameter(torch.randn(10, 6)), x=ids))
    for causal in (False, True):
        cases.append(_case(f"sdpa:causal={causal}", [F.scaled_dot_product_attention],
                           lambda self, h, c=causal: F.scaled_dot_product_attention(
                               h[..., :4], h[..., 4:8], h[..., 8:], is_causal=c),
                           lambda: nn.Linear(6, 12), lambda: nn.Linear(4, 3), (2, 5, 6)))
    return cases


# ---- normalization and softmax ----------------------------------------------------------
def norm_cases() -> list[Case]:
    cases = []
    for cls, shape in ((nn.BatchNorm1d, (4, 6)), (nn.BatchNorm2d, (2, 6, 3, 3)), (nn.BatchNorm3d, (2, 6, 2, 2, 2))):
        def make(c=cls):
            bn = c(6)
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
            return bn
        cases.append(_case(cls.__name__, [cls], lambda self, h, s=shape: self.op(h.reshape(s)).reshape(h.shape[0], -1),
                           lambda: nn.Identity(), lambda: nn.Flatten(), shape, op=make))
    cases.append(_case("BatchNorm2d:no-affine", [nn.BatchNorm2d], lambda self, h: self.op(h), lambda: nn.Identity(),
                       lambda: nn.Flatten(), (2, 6, 3, 3), op=lambda: nn.BatchNorm2d(6, affine=False)))
    cases.append(_case("LayerNorm", [nn.LayerNorm], lambda self, h: self.op(h), lambda: nn.Linear(6, 8),
                       lambda: nn.Linear(8, 3), (2, 3, 6), op=lambda: nn.LayerNorm(8)))
    cases.append(_case("F.layer_norm", [F.layer_norm],
                       lambda self, h: F.layer_norm(h, (8,), self.extra[0], self.extra[1]), lambda: nn.Linear(6, 8),
                       lambda: nn.Linear(8, 3), (2, 3, 6), extra=lambda: nn.Parameter(torch.randn(2, 8))))
    cases.append(_case("GroupNorm", [nn.GroupNorm], lambda self, h: self.op(h), lambda: nn.Conv2d(3, 6, 1),
                       lambda: nn.Flatten(), (2, 3, 3, 3), op=lambda: nn.GroupNorm(3, 6)))
    softmaxes = [(nn.Softmax, "module"), (nn.LogSoftmax, "module"), (F.softmax, "fn"), (torch.softmax, "fn"),
                 ("softmax", "method"), (F.log_softmax, "fn"), (torch.log_softmax, "fn"), ("log_softmax", "method")]
    for t, kind in softmaxes:
        if kind == "module":
            cases.append(_case(t.__name__, [t], lambda self, h: self.op(h), lambda: nn.Linear(6, 8),
                               lambda: nn.Linear(8, 3), (4, 6), op=lambda c=t: c(dim=-1)))
        else:
            cases.append(_case(f"softmax:{_name(t)}", [t], lambda self, h, t=t: _call(t, h, -1),
                               lambda: nn.Linear(6, 8), lambda: nn.Linear(8, 3), (4, 6)))
    return cases


# ---- pooling and reductions -------------------------------------------------------------
def pool_cases() -> list[Case]:
    cases = []
    for nd in (1, 2, 3):
        x = (2, 3, *(6,) * nd)
        mods = [(getattr(nn, f"MaxPool{nd}d"), dict(kernel_size=2)), (getattr(nn, f"MaxPool{nd}d"),
                dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
                (getattr(nn, f"AvgPool{nd}d"), dict(kernel_size=3, stride=2, padding=1)),
                (getattr(nn, f"AdaptiveAvgPool{nd}d"), dict(output_size=2)),
                (getattr(nn, f"AdaptiveMaxPool{nd}d"), dict(output_size=2))]
        for cls, kw in mods:
            cases.append(_case(f"{cls.__name__}:{kw}", [cls], lambda self, h: self.op(h),
                               lambda n=nd: getattr(nn, f"Conv{n}d")(3, 3, 1), lambda: nn.Flatten(), x,
                               op=lambda c=cls, k=kw: c(**k)))
        for fn in (getattr(F, f"max_pool{nd}d"), getattr(F, f"avg_pool{nd}d")):
            cases.append(_case(f"F.{fn.__name__}", [fn], lambda self, h, f=fn: f(h, 2),
                               lambda n=nd: getattr(nn, f"Conv{n}d")(3, 3, 1), lambda: nn.Flatten(), x))
        fn = getattr(F, f"adaptive_avg_pool{nd}d")
        cases.append(_case(f"F.{fn.__name__}", [fn], lambda self, h, f=fn: f(h, 2),
                           lambda n=nd: getattr(nn, f"Conv{n}d")(3, 3, 1), lambda: nn.Flatten(), x))
    cases.append(_case("MaxPool2d:dilation", [nn.MaxPool2d], lambda self, h: self.op(h), lambda: nn.Conv2d(3, 3, 1),
                       lambda: nn.Flatten(), (2, 3, 7, 7), op=lambda: nn.MaxPool2d(3, 1, 1, dilation=2)))
    for t in (torch.mean, torch.sum, "mean", "sum"):
        cases.append(_case(f"reduce:{_name(t)}", [t], lambda self, h, t=t: _call(t, h, 1), lambda: nn.Linear(6, 8),
                           lambda: nn.Linear(8, 3), (5, 4, 6)))
        cases.append(_case(f"reduce:{_name(t)}:keepdim", [t], lambda self, h, t=t: _call(t, h, -1, keepdim=True),
                           lambda: nn.Linear(6, 8), lambda: nn.Linear(1, 3), (5, 6)))
    return cases


# ---- data movement ----------------------------------------------------------------------
def _parts(xs, n: int) -> torch.Tensor:
    # fx cannot iterate a traced tuple, so parts are taken by index
    return torch.cat([xs[i].reshape(2, -1) for i in range(n)], dim=1)


MOVEMENT = {  # target -> body on h of shape (2, 12); bodies return (2, k) tensors
    "view": lambda h: h.view(2, 3, 4).view(2, 12),
    "reshape": lambda h: h.reshape(2, 4, 3).reshape(2, -1),
    "permute": lambda h: h.view(2, 3, 4).permute(0, 2, 1).reshape(2, 12),
    "transpose": lambda h: h.view(2, 3, 4).transpose(1, 2).reshape(2, 12),
    "flatten": lambda h: h.view(2, 3, 4).flatten(1),
    "unflatten": lambda h: h.unflatten(1, (3, 4)).reshape(2, 12),
    "squeeze": lambda h: h.view(2, 1, 12).squeeze(1),
    "unsqueeze": lambda h: h.unsqueeze(1).reshape(2, 12),
    "expand": lambda h: h[:, :4].unsqueeze(1).expand(2, 3, 4).reshape(2, 12),
    "expand_as": lambda h: h[:, :4].unsqueeze(1).expand_as(h.view(2, 3, 4)).reshape(2, 12),
    "view_as": lambda h: h.view_as(h.view(2, 3, 4)).reshape(2, 12),
    "reshape_as": lambda h: h.reshape_as(h.view(2, 4, 3)).reshape(2, 12),
    "repeat": lambda h: h[:, :4].repeat(1, 3),
    "t": lambda h: h.t().t(),
    "narrow": lambda h: h.narrow(1, 2, 8),
    "select": lambda h: h.view(2, 3, 4).select(1, 1),
    "split": lambda h: _parts(h.split(5, dim=1), 3),
    "chunk": lambda h: _parts(h.chunk(3, dim=1), 2),
    "unbind": lambda h: _parts(h.view(2, 3, 4).unbind(1), 2),
    "flip": lambda h: h.flip(1),
    "roll": lambda h: h.roll(3, 1),
    "movedim": lambda h: h.view(2, 3, 4).movedim(1, 2).reshape(2, 12),
    "swapaxes": lambda h: h.view(2, 3, 4).swapaxes(1, 2).reshape(2, 12),
    "tile": lambda h: h[:, :6].tile((1, 2)),
    torch.flatten: lambda h: torch.flatten(h.view(2, 3, 4), 1),
    torch.reshape: lambda h: torch.reshape(h, (2, 12)),
    torch.permute: lambda h: torch.permute(h.view(2, 3, 4), (0, 2, 1)).reshape(2, 12),
    torch.transpose: lambda h: torch.transpose(h.view(2, 3, 4), 1, 2).reshape(2, 12),
    torch.squeeze: lambda h: torch.squeeze(h.view(2, 1, 12), 1),
    torch.unsqueeze: lambda h: torch.unsqueeze(h, 1).reshape(2, 12),
    torch.cat: lambda h: torch.cat([h[:, 6:], h[:, :3], h[:, :3]], dim=1),
    torch.concat: lambda h: torch.concat([h[:, 6:], h[:, :6]], dim=1),
    torch.stack: lambda h: torch.stack([h[:, :6], h[:, 6:]], dim=1).reshape(2, 12),
    torch.split: lambda h: _parts(torch.split(h, [3, 9], dim=1), 2),
    torch.chunk: lambda h: _parts(torch.chunk(h, 2, dim=1), 1),
    torch.unbind: lambda h: _parts(torch.unbind(h.view(2, 3, 4), 2), 3),
    torch.narrow: lambda h: torch.narrow(h, 1, 1, 6),
    torch.select: lambda h: torch.select(h.view(2, 3, 4), 2, 3),
    torch.flip: lambda h: torch.flip(h, (1,)),
    torch.roll: lambda h: torch.roll(h, 5, 1),
    torch.movedim: lambda h: torch.movedim(h.view(2, 3, 4), 2, 1).reshape(2, 12),
    torch.t: lambda h: torch.t(torch.t(h)),
    torch.swapaxes: lambda h: torch.swapaxes(h.view(2, 3, 4), 2, 1).reshape(2, 12),
    torch.tile: lambda h: torch.tile(h[:, 4:8], (1, 3)),
    operator.getitem: lambda h: h[:, 1:10:2],
}


def movement_cases() -> list[Case]:
    cases = []
    for target, body in MOVEMENT.items():
        out = body(torch.zeros(2, 12)).shape[1]
        cases.append(_case(f"move:{_name(target)}", [target], lambda self, h, b=body: b(h), lambda: nn.Linear(6, 12),
                           lambda o=out: nn.Linear(o, 3), (2, 6)))
    shaped = [(nn.Flatten, lambda: nn.Flatten(), (2, 3, 4)), (nn.Unflatten, lambda: nn.Unflatten(1, (2, 6)), (2, 12)),
              (nn.ChannelShuffle, lambda: nn.ChannelShuffle(2), (2, 4, 3)),
              (nn.PixelShuffle, lambda: nn.PixelShuffle(2), (2, 4, 1, 3)),
              (nn.PixelUnshuffle, lambda: nn.PixelUnshuffle(2), (2, 1, 2, 6))]
    for cls, make, shape in shaped:
        cases.append(_case(cls.__name__, [cls], lambda self, h, s=shape: self.op(h.reshape(s)).reshape(2, -1),
                           lambda: nn.Linear(6, 12), lambda: nn.Linear(12, 3), (2, 6), op=make))
    pads = [(nn.ZeroPad1d, 1), (nn.ZeroPad2d, 2), (nn.ZeroPad3d, 3), (nn.ConstantPad1d, 1), (nn.ConstantPad2d, 2),
            (nn.ConstantPad3d, 3), (nn.ReflectionPad1d, 1), (nn.ReflectionPad2d, 2), (nn.ReflectionPad3d, 3),
            (nn.ReplicationPad1d, 1), (nn.ReplicationPad2d, 2), (nn.ReplicationPad3d, 3), (nn.CircularPad1d, 1),
            (nn.CircularPad2d, 2), (nn.CircularPad3d, 3)]
    for cls, nd in pads:
        make = (lambda c=cls: c(1, 1.5)) if "Constant" in cls.__name__ else (lambda c=cls: c(1))
        x = (2, 2, *(3,) * nd)
        cases.append(_case(cls.__name__, [cls], lambda self, h: self.op(h),
                           lambda n=nd: getattr(nn, f"Conv{n}d")(2, 2, 1), lambda: nn.Flatten(), x, op=make))
    for mode, value in (("constant", 0.0), ("constant", 1.5), ("reflect", None), ("replicate", None)):
        cases.append(_case(f"F.pad:{mode}:{value}", [F.pad],
                           lambda self, h, m=mode, v=value: F.pad(h, (1, 2), m, v) if v is not None
                           else F.pad(h, (1, 2), m), lambda: nn.Conv1d(2, 2, 1), lambda: nn.Flatten(), (2, 2, 4)))
    return cases


def conformance_cases() -> list[Case]:
    return unary_cases() + binary_cases() + product_cases() + norm_cases() + pool_cases() + movement_cases()
