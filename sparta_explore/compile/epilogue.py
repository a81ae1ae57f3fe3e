"""The `fuse_epilogue` kernel pass: adds, scales and the activation after an op run in its output stage, in place.

After kernels are chosen, each conv / linear / compiled op whose only reader starts a
chain of elementwise steps (an add of a tensor of its shape or a broadcast map: a residual,
a constant channel's bias map; a multiply or divide by a number; then one activation:
ReLU, ReLU6 / Hardtanh, GELU, SiLU, Hardswish, sigmoid, tanh) becomes one `Epilogue`
module: the op runs, then every step updates its fresh output in place. One call instead
of several, no intermediate tensors, and an activation fused into the op's own module.

The steps are a table (`STEP_ACTIVATIONS`, keyed by fx target) so adding an activation is
one row. With grad enabled and an input that requires grad, the steps run out of place.

Example:
    >>> fused = fuse_epilogues(graph, gm, compiled)   # doctest: +SKIP
    >>> fused["ops fused"]                             # doctest: +SKIP
    32
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from sparta_explore.compile.passes.shrink_ops import AlignedAdd
from sparta_explore.graph import Graph
from sparta_explore.kernels.compiled_op import CompiledOp
from sparta_explore.module_tree import set_module


@dataclass(frozen=True)
class Act:
    """One activation as an epilogue step: in place and out of place."""

    name: str
    inplace: Callable[[torch.Tensor], torch.Tensor]
    outofplace: Callable[[torch.Tensor], torch.Tensor]


def _hardtanh(lo: float, hi: float) -> Act:
    lo, hi = float(lo), float(hi)  # the name holds them exactly: a saved model rebuilds the step from it
    return Act(f"hardtanh({lo!r},{hi!r})", lambda y: y.clamp_(lo, hi), lambda y: y.clamp(lo, hi))


def _gelu(approximate: str) -> Act:
    return Act(f"gelu({approximate})", lambda y: F.gelu(y, approximate=approximate),
               lambda y: F.gelu(y, approximate=approximate))


RELU = Act("relu", torch.relu_, torch.relu)
SILU = Act("silu", lambda y: F.silu(y, inplace=True), F.silu)
HARDSWISH = Act("hardswish", lambda y: F.hardswish(y, inplace=True), F.hardswish)
SIGMOID = Act("sigmoid", torch.sigmoid_, torch.sigmoid)
TANH = Act("tanh", torch.tanh_, torch.tanh)
_FIXED = {a.name: a for a in (RELU, SILU, HARDSWISH, SIGMOID, TANH)}
_WITH_ARGUMENTS = ((re.compile(r"hardtanh\((\S+),(\S+)\)"), lambda lo, hi: _hardtanh(float(lo), float(hi))),
                   (re.compile(r"gelu\((none|tanh)\)"), _gelu))


def act_named(name: str) -> Act:
    """The epilogue activation called `name` (`Act.name`): how a saved model rebuilds its fused steps.

    Example:
        >>> act_named("hardtanh(0.0,6.0)").outofplace(torch.tensor([7.0])).tolist()
        [6.0]
    """
    if name in _FIXED:
        return _FIXED[name]
    for pattern, make in _WITH_ARGUMENTS:
        found = pattern.fullmatch(name)
        if found:
            return make(*found.groups())
    raise ValueError(f"no epilogue activation is called {name!r}")


def _arg(node: fx.Node, i: int, name: str, default: object) -> object:
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


# fx target -> the activation a node of it computes (None when its arguments make it something else)
STEP_ACTIVATIONS: dict[object, Callable[[nn.Module | None, fx.Node], Act | None]] = {}
for _targets, _act in (
    ((nn.ReLU, F.relu, torch.relu, "relu"), lambda m, n: RELU),
    ((nn.SiLU, F.silu, "silu"), lambda m, n: SILU),
    ((nn.Hardswish, F.hardswish), lambda m, n: HARDSWISH),
    ((nn.Sigmoid, torch.sigmoid, "sigmoid"), lambda m, n: SIGMOID),
    ((nn.Tanh, torch.tanh, "tanh"), lambda m, n: TANH),
    ((nn.ReLU6, nn.Hardtanh), lambda m, n: _hardtanh(m.min_val, m.max_val)),
    ((F.relu6,), lambda m, n: _hardtanh(0.0, 6.0)),
    ((F.hardtanh,), lambda m, n: _hardtanh(_arg(n, 1, "min_val", -1.0), _arg(n, 2, "max_val", 1.0))),
    ((nn.GELU,), lambda m, n: _gelu(m.approximate)),
    ((F.gelu,), lambda m, n: _gelu(_arg(n, 1, "approximate", "none"))),
):
    for _t in _targets:
        STEP_ACTIVATIONS[_t] = _act

_ADD = (operator.add, torch.add, "add")
_SCALE = {operator.mul: False, torch.mul: False, "mul": False, operator.truediv: True, torch.div: True, "div": True}


class Epilogue(nn.Module):
    """op(*its inputs), then each step on its output: ("add", i) adds operand i, ("scale", s) multiplies,
    ("act", a) activates. The op takes the first `n_inputs` arguments, the operands follow.

    Example:
        >>> ep = Epilogue(nn.Linear(2, 2), (("add", 0), ("act", RELU)))
        >>> ep(torch.ones(1, 2), torch.zeros(1, 2)).shape
        torch.Size([1, 2])
    """

    def __init__(self, op: nn.Module, steps: tuple[tuple[str, object], ...], n_inputs: int = 1) -> None:
        super().__init__()
        self.op = op
        self.steps = steps
        self.n_inputs = n_inputs
        self.label = getattr(op, "label", None)

    def _apply(self, y: torch.Tensor, operands: tuple[torch.Tensor, ...], inplace: bool) -> torch.Tensor:
        for kind, value in self.steps:
            if kind == "add":
                y = y.add_(operands[value]) if inplace else y + operands[value]
            elif kind == "scale":
                y = y.mul_(value) if inplace else y * value
            else:
                y = value.inplace(y) if inplace else value.outofplace(y)
        return y

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        y = self.op(*args[:self.n_inputs])
        inplace = not (torch.is_grad_enabled() and y.requires_grad)
        return self._apply(y, args[self.n_inputs:], inplace)

    def reference(self, *args: torch.Tensor) -> torch.Tensor:
        """The op's own reference (a compiled op's PyTorch arithmetic), then the steps out of place."""
        inputs = args[:self.n_inputs]
        y = self.op.reference(*inputs) if hasattr(self.op, "reference") else self.op(*inputs)
        return self._apply(y, args[self.n_inputs:], inplace=False)

    def extra_repr(self) -> str:
        said = [f"+operand{v}" if k == "add" else f"*{v:g}" if k == "scale" else v.name for k, v in self.steps]
        return " -> ".join(said)


def _inputs_of(module: nn.Module) -> int | None:
    """How many inputs an op whose output is a fresh tensor takes (what an epilogue may update in place), or None."""
    if isinstance(module, AlignedAdd):
        return 2
    return 1 if isinstance(module, (nn.Conv2d, nn.Linear, CompiledOp)) else None


def _step(graph: Graph, gm: fx.GraphModule, cur: fx.Node, user: fx.Node, shape: tuple[int, ...] | None
          ) -> tuple[str, object] | None:
    """The epilogue step `user` is when it reads `cur` (and only what may join it), else None."""
    if user.op == "call_module":
        module = gm.get_submodule(user.target)
        maker = STEP_ACTIVATIONS.get(type(module))
        return ("act", maker(module, user)) if maker is not None and len(user.args) == 1 else None
    if user.op not in ("call_function", "call_method") or user.kwargs.get("alpha", 1) != 1:
        return None
    try:
        maker = STEP_ACTIVATIONS.get(user.target)
        scale = _SCALE.get(user.target)
    except TypeError:
        return None
    if maker is not None:
        act = maker(None, user)
        return ("act", act) if act is not None and user.args[0] is cur else None
    if len(user.args) != 2:
        return None
    other = user.args[1] if user.args[0] is cur else user.args[0]
    if scale is not None and user.args[0] is cur and isinstance(other, (int, float)) and not isinstance(other, bool):
        return ("scale", 1.0 / other if scale else float(other))
    if user.target in _ADD and isinstance(other, fx.Node) and other is not cur and shape is not None:
        info = graph.tensors.get(other.name)
        if info is not None and info.dtype == torch.float32 and _fits(info.shape, shape) and other not in cur.users:
            return ("add", other)
    return None


def _fits(operand: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether `operand` broadcasts onto `shape` without growing it (so it adds in place)."""
    try:
        return tuple(torch.broadcast_shapes(operand, shape)) == tuple(shape)
    except RuntimeError:
        return False


def fuse_epilogues(graph: Graph, gm: fx.GraphModule, compiled: dict[str, nn.Module]) -> dict[str, int]:
    """Fold the elementwise chain after each op into an `Epilogue` (in `gm`; `compiled` follows); counts.

    Example:
        >>> fuse_epilogues(graph, gm, compiled)["steps fused"]   # doctest: +SKIP
        48
    """
    counts = {"ops fused": 0, "steps fused": 0}
    by_id = {id(m): name for name, m in compiled.items()}
    calls: dict[str, int] = {}
    for n in gm.graph.nodes:
        if n.op == "call_module":
            calls[n.target] = calls.get(n.target, 0) + 1
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or node.kwargs or calls[node.target] != 1:
            continue
        module = gm.get_submodule(node.target)
        if _inputs_of(module) != len(node.args):
            continue
        info = graph.tensors.get(node.name)
        shape = info.shape if info is not None and info.dtype == torch.float32 else None
        steps, operands, chain, cur = [], [], [], node
        while len(cur.users) == 1 and cur.name not in graph.outputs:
            user = next(iter(cur.users))
            step = _step(graph, gm, cur, user, shape)
            if step is None:
                break
            if step[0] == "add":
                operands.append(step[1])
                step = ("add", len(operands) - 1)
            steps.append(step)
            chain.append(user)
            cur = user
            if step[0] == "act":
                break
        if not steps:
            continue
        fused = Epilogue(module, tuple(steps), len(node.args))
        set_module(gm, node.target, fused)
        with gm.graph.inserting_before(cur):
            call = gm.graph.call_module(node.target, (*node.args, *operands))
        cur.replace_all_uses_with(call)
        for done in reversed(chain):
            gm.graph.erase_node(done)
        gm.graph.erase_node(node)
        name = by_id.get(id(module))
        if name is not None:
            compiled[name] = fused
        counts["ops fused"] += 1
        counts["steps fused"] += len(steps)
    return counts
