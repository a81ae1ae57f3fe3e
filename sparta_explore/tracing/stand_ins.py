"""Shapes of a rewritten graph without running what the rewrite left alone.

A graph pass rewrites a few nodes (a shrunk linear, the GELU after it, an inserted expand)
and hands every other node on as it was. Its new `Graph` records every value's shape from a
run on fake tensors (`graph.rewritten`), but most of that run recomputes shapes the graph
before the pass recorded already (BERT-base: 0.5 s a pass, 500 nodes, 5 of them new per layer).

A node *stands in* for itself when the graph before the pass had a node of that name doing
the same thing (op, target, the very module object, arguments naming the same nodes and
constants) and each node it reads still has its old shape: its old shape and dtype (or its
old constant, a size) come back as an empty tensor of fake mode, no op runs. Every pass is
exact (each value it keeps is the value it was), so a node reading the same values does the
same; nodes with new names, new modules or a changed input run as before.

Example:
    >>> stand_ins = StandIns(before, gm)           # doctest: +SKIP
    >>> stand_ins.value(node) is None              # doctest: +SKIP
    True
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

_OPS = ("call_module", "call_function", "call_method")


def _named(args: Any) -> Any:
    """`args` with every node replaced by its name (comparable across two graphs)."""
    return fx.node.map_arg(args, lambda a: a.name)


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001  (a tensor constant, or a type without a truth value: not known equal)
        return False


def _attr(module: torch.nn.Module, target: str) -> Any:
    for part in target.split("."):
        module = getattr(module, part)
    return module


class StandIns:
    """What each node of `gm` (a rewrite of `before`'s module) may take from `before` instead of running: see the
    module docstring. Call `value` before running a node, `record` after (with what it ran to or stood in for)."""

    def __init__(self, before: Any, gm: fx.GraphModule) -> None:
        self.before, self.gm = before, gm
        self.old = {n.name: n for n in before.module.graph.nodes}
        self.same: set[str] = set()  # nodes whose value has its old shape (so readers may stand in)

    def _same_op(self, node: fx.Node, old: fx.Node) -> bool:
        if old.op != node.op or not (old.target is node.target or _equal(old.target, node.target)):
            return False
        if node.op == "call_module":
            try:
                if self.gm.get_submodule(node.target) is not self.before.module.get_submodule(node.target):
                    return False
            except AttributeError:
                return False
        return _equal(_named((node.args, node.kwargs)), _named((old.args, old.kwargs)))

    def value(self, node: fx.Node) -> Any:
        """The stand-in for `node`'s value, or None: it must run."""
        old = self.old.get(node.name)
        if node.op not in _OPS or old is None or any(a.name not in self.same for a in node.all_input_nodes) \
                or not self._same_op(node, old):
            return None
        info = self.before.tensors.get(node.name)
        if info is not None and info.kind == "activation":
            return torch.empty(info.shape, dtype=info.dtype)  # under fake mode: a fake tensor, nothing allocated
        return self.before.constants.get(node.name)  # a size or a shape (None: none recorded, it runs)

    def record(self, node: fx.Node, value: Any, stood_in: bool) -> None:
        """Note whether `node`'s `value` has the shape it had before the pass."""
        if stood_in or node.op == "placeholder" or self._as_before(node, value):
            self.same.add(node.name)

    def _as_before(self, node: fx.Node, value: Any) -> bool:
        if node.op == "get_attr":
            old = self.old.get(node.name)
            try:
                was = _attr(self.before.module, old.target) if old is not None and old.op == "get_attr" else None
            except AttributeError:
                return False
            return isinstance(value, torch.Tensor) and isinstance(was, torch.Tensor) and \
                value.shape == was.shape and value.dtype == was.dtype
        info = self.before.tensors.get(node.name)
        if isinstance(value, torch.Tensor):
            return info is not None and info.kind == "activation" and tuple(value.shape) == info.shape and \
                value.dtype == info.dtype
        if node.name in self.before.constants:
            return _equal(value, self.before.constants[node.name])
        return False

