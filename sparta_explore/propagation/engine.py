"""The propagation engine: a worklist over the graph until no TeSA changes.

Two kinds of facts flow, and they combine differently:

* forward facts ("this output element is always zero", "it holds 8-bit values") come from
  the op that produces a tensor and combine with the TeSA meet;
* backward facts ("this input element does not matter to me") come from each op that
  reads a tensor. An element is irrelevant only if it is irrelevant to *every* reader,
  so readers' relevance masks combine with logical or. A reader not yet visited, one
  whose rule could not decide, the graph output and any value-reading non-tensor op
  count as needing everything.

A tensor's TeSA is its forward TeSA with the elements no reader needs pruned. Both parts
only shrink (each reader's relevance is intersected with its previous proposal), so the
worklist terminates.
"""

from __future__ import annotations

import logging
import operator
import time
from collections import deque
from collections.abc import Collection, Mapping
from typing import Any

import torch
from torch import fx

from sparta_explore.compact import both, either, equal, keep_where
from sparta_explore.errors import TeSANameError
from sparta_explore.graph import Graph
from sparta_explore.propagation.builtin_rules import default_rules
from sparta_explore.propagation.registry import (
    OpUpdate,
    OpView,
    Rule,
    RuleEntry,
    RuleSet,
    Slot,
    Target,
    Unsupported,
)
from sparta_explore.propagation.report import PropagationReport, PropagationResult
from sparta_explore.propagation.scramble import scramble
from sparta_explore.tesa import TeSA
from sparta_explore.tesa_table import TeSATable

log = logging.getLogger("sparta_explore.propagation")

_OPS = ("call_module", "call_function", "call_method")
_SHAPE_ONLY_METHODS = {"size", "dim", "numel", "ndimension", "nelement"}
_SHAPE_ONLY_ATTRS = {"shape", "dtype", "device", "ndim", "is_cuda", "requires_grad"}
_EVERYTHING = "<all>"  # a reader that needs every element


class _Missing(Exception):
    """An argument's value was not recorded at capture, so the op cannot be replayed."""


class _State:
    """Forward TeSAs, readers' relevance masks, and the resulting current TeSAs."""

    def __init__(self, graph: Graph, table: Mapping[str, TeSA]) -> None:
        self.graph = graph
        self.base: dict[str, TeSA] = {}
        shapes = {graph.canonical(n): info.shape for n, info in graph.tensors.items()}
        for node_name, parts in graph.tuple_shapes.items():
            shapes.update({f"{node_name}#{j}": s for j, s in enumerate(parts)})
        for name, shape in shapes.items():
            self.base[name] = TeSA.dense(shape)
        given: set[str] = set()
        for name, tesa in table.items():
            key = graph.canonical(name)
            if key not in self.base:
                raise TeSANameError(f"TeSA {name!r} names no tensor of the captured graph")
            tesa.check_fits(shapes[key], name)
            # dense at MAX_BITS is the meet's identity: a tensor's first TeSA is taken as it is (no copy of its key;
            # keys are never written in place), a second one for the same tensor (an alias) is met with it
            self.base[key] = (self.base[key].merge(tesa) if key in given else tesa).expand(shapes[key])
            given.add(key)
        self.relevance: dict[str, dict[str, torch.Tensor | None]] = {n: {} for n in self.base}
        self.current: dict[str, TeSA] = dict(self.base)

    def add_reader(self, name: str, reader: str) -> None:
        self.relevance[name].setdefault(reader, None)

    def recompute(self, name: str) -> bool:
        readers = self.relevance[name].values()
        tesa = self.base[name]
        if readers and all(r is not None for r in readers):
            tesa = TeSA._from_key(keep_where(tesa._key, _union(list(readers))), tesa.group)
        elif not readers:
            tesa = TeSA.dense(tesa.shape, bits=0)  # nobody reads it
        changed = not equal(tesa._key, self.current[name]._key)
        self.current[name] = tesa
        return changed


def _union(masks: list[torch.Tensor]) -> torch.Tensor:
    """The elements any of `masks` keeps (readers' needs); one mask is returned as is: most tensors have one reader."""
    needed = masks[0]
    for r in masks[1:]:
        needed = either(needed, r)
    return needed


def _label(graph: Graph, node: fx.Node) -> str:
    if node.op == "call_module":
        return type(graph.module.get_submodule(node.target)).__name__
    if node.op == "call_method":
        return f".{node.target}"
    return getattr(node.target, "__name__", str(node.target))


def _target(graph: Graph, node: fx.Node) -> Target:
    return type(graph.module.get_submodule(node.target)) if node.op == "call_module" else node.target


class _Engine:
    def __init__(self, graph: Graph, table: Mapping[str, TeSA], rules: RuleSet, scramble_trials: int) -> None:
        self.graph = graph
        self.rules = rules
        self.trials = scramble_trials
        self.state = _State(graph, table)
        self.report = PropagationReport()
        self.producer: dict[str, fx.Node] = {}
        self.readers: dict[str, set[fx.Node]] = {n: set() for n in self.state.base}
        self.ops: list[fx.Node] = []
        self._wire()

    # ---- wiring: who produces and who reads each tensor ------------------------------
    def _names_in(self, value: Any) -> list[str]:
        found: list[str] = []
        fx.node.map_arg(value, lambda n: found.extend(self._node_tensors(n)) or n)
        return found

    def _node_tensors(self, n: fx.Node) -> list[str]:
        if n.name in self.graph.tuple_shapes:
            return [f"{n.name}#{j}" for j in range(len(self.graph.tuple_shapes[n.name]))]
        name = self.graph.canonical(self.graph.tensor_name(n))
        return [name] if name in self.state.base else []

    def _is_tensor_op(self, node: fx.Node) -> bool:
        return node.op in _OPS and (node.name in self.graph.tensors or node.name in self.graph.tuple_shapes)

    def _shape_only(self, node: fx.Node) -> bool:
        if node.op == "call_method" and node.target in _SHAPE_ONLY_METHODS:
            return True
        return (node.op == "call_function" and node.target in (getattr, operator.getitem) and len(node.args) > 1
                and isinstance(node.args[1], str) and node.args[1] in _SHAPE_ONLY_ATTRS)

    def _wire(self) -> None:
        g = self.graph
        for node in g.module.graph.nodes:
            if self._is_tensor_op(node):
                self.ops.append(node)
                for name in self._node_tensors(node):
                    self.producer[name] = node
                inputs = self._names_in((node.args, node.kwargs))
                if node.op == "call_module":
                    inputs += [g.canonical(fqn) for fqn in g.params_of(node).values() if g.canonical(fqn) in
                               self.state.base]
                for name in inputs:
                    self.readers[name].add(node)
                    self.state.add_reader(name, node.name)
            elif node.op == "output" or (node.op in _OPS and not self._shape_only(node)):
                # the graph output, or an op we cannot see into (e.g. a module returning (tensor, None)):
                # it needs every element it reads, its module's parameters included
                inputs = self._names_in((node.args, node.kwargs))
                if node.op == "call_module":
                    inputs += [g.canonical(fqn) for fqn in g.params_of(node).values()
                               if g.canonical(fqn) in self.state.base]
                for name in inputs:
                    self.state.add_reader(name, _EVERYTHING)
        for name in self.state.base:
            self.state.recompute(name)

    # ---- one op --------------------------------------------------------------------
    def _resolve(self, value: Any, names: dict, slot_path: tuple) -> Any:
        if isinstance(value, fx.Node):
            tensors = self._node_tensors(value)
            if value.name in self.graph.tuple_shapes:
                for j, t in enumerate(tensors):
                    names[slot_path + (j,)] = t
                return tuple(self.state.current[t] for t in tensors)
            if tensors:
                names[slot_path] = tensors[0]
                return self.state.current[tensors[0]]
            if value.name in self.graph.constants:
                return self.graph.constants[value.name]
            raise _Missing(f"value of {value.name!r} was not recorded")
        if isinstance(value, slice):  # bounds computed in the graph (export's symbolic sizes): recorded values
            return slice(*(self._resolve(v, names, slot_path) for v in (value.start, value.stop, value.step)))
        if isinstance(value, (list, tuple)):
            return type(value)(self._resolve(v, names, slot_path + (i,)) for i, v in enumerate(value))
        if isinstance(value, dict):
            return {k: self._resolve(v, names, slot_path + (k,)) for k, v in value.items()}
        return value

    def _view(self, node: fx.Node) -> tuple[OpView, dict[Slot, str], dict[str, str]]:
        names: dict[tuple, str] = {}
        args = tuple(self._resolve(a, names, (i,)) for i, a in enumerate(node.args))
        kwargs = {k: self._resolve(v, names, (k,)) for k, v in node.kwargs.items()}
        slot_names: dict[Slot, str] = {}
        for path, name in names.items():
            slot_names[path[0] if len(path) == 1 else (path[0], path[1])] = name
        module, params, param_names = None, {}, {}
        if node.op == "call_module":
            module = self.graph.module.get_submodule(node.target)
            for local, fqn in self.graph.params_of(node).items():
                key = self.graph.canonical(fqn)
                if key in self.state.current:
                    params[local] = self.state.current[key]
                    param_names[local] = key
        outs = self._node_tensors(node)
        output = tuple(self.state.current[o] for o in outs) if node.name in self.graph.tuple_shapes \
            else self.state.current[outs[0]]
        dtypes = {slot: self._dtype(name) for slot, name in slot_names.items()}
        return OpView(node, args, kwargs, params, output, module, dtypes), slot_names, param_names

    def _dtype(self, name: str) -> torch.dtype:
        info = self.graph.tensors.get(name)  # tuple items ("split#0") are not in the graph's table
        return info.dtype if info is not None else torch.float32

    def _apply_rule(self, node: fx.Node, view: OpView) -> tuple[OpUpdate, str]:
        entry = self.rules.lookup(_target(self.graph, node))
        if entry is None:
            self.report.scrambled.add(node.name)
            log.info("no rule for %s (%s): tensor scrambling", node.name, _label(self.graph, node))
            return scramble(view, self.trials, seed=len(self.report.events)), "scramble"
        return entry.fn(view), entry.name

    def visit(self, node: fx.Node) -> tuple[list[str], list[str]]:
        """Apply `node`'s rule: the tensors whose TeSA changed, and those it asked for that did not change."""
        try:
            view, slot_names, param_names = self._view(node)
            update, rule_name = self._apply_rule(node, view)
        except (Unsupported, _Missing) as e:
            self.report.unsupported[node.name] = str(e)
            return [], []
        except Exception as e:  # a faulty (user) rule must not give a wrong table: leave the op as it is
            self.report.unsupported[node.name] = f"rule error: {type(e).__name__}: {e}"
            log.warning("rule for %s (%s) failed, op left unchanged: %s", node.name, _label(self.graph, node), e)
            return [], []
        changed: list[str] = []
        asked: list[str] = []
        self.report.visits += 1
        outs = self._node_tensors(node)
        out_updates = update.output if isinstance(update.output, tuple) else (update.output,)
        for name, value in zip(outs, out_updates):
            if value is not None:
                self._forward(node, rule_name, name, value, changed)
        proposals: dict[str, torch.Tensor] = {}
        for slot, value in update.args.items():
            if value is not None and slot in slot_names:
                self._propose(proposals, slot_names[slot], value)
        for local, value in update.params.items():
            if value is not None and local in param_names:
                self._propose(proposals, param_names[local], value)
        for name, mask in proposals.items():
            previous = self.state.relevance[name].get(node.name)
            if previous is not None and equal(previous, mask):
                continue  # a revisit that asks for what it asked before: nothing to recompute
            self.state.relevance[name][node.name] = mask if previous is None else both(previous, mask)
            if not self._note(node, rule_name, name, "backward", changed):
                asked.append(name)
        return changed, asked

    def _held_back(self, name: str) -> bool:
        """Whether `name` could shrink but for readers whose need is unknown (not yet visited, none of them
        needing everything)."""
        needs = self.state.relevance[name]
        if _EVERYTHING in needs or all(r is not None for r in needs.values()):
            return False
        asked = _union([r for r in needs.values() if r is not None])
        kept = self.state.current[name].kept
        return not equal(either(asked, kept), asked)

    def _propose(self, proposals: dict[str, torch.Tensor], name: str, value: torch.Tensor | TeSA) -> None:
        shape = self.state.base[name].shape
        mask = value.kept if isinstance(value, TeSA) else value
        mask = torch.broadcast_to(mask, shape)  # a view: masks are never written in place
        proposals[name] = either(proposals[name], mask) if name in proposals else mask

    def _forward(self, node: fx.Node, rule: str, name: str, value: torch.Tensor | TeSA, changed: list[str]) -> None:
        base = self.state.base[name]
        if isinstance(value, TeSA):
            new = base.merge(value.expand(base.shape) if value.shape != base.shape else value)
        else:
            new = TeSA._from_key(keep_where(base._key, torch.broadcast_to(value, base.shape)), base.group)
        if equal(new._key, base._key):
            return  # the op's forward fact is already known
        self.state.base[name] = new
        self._note(node, rule, name, "forward", changed)

    def _note(self, node: fx.Node, rule: str, name: str, direction: str, changed: list[str]) -> bool:
        before = self.state.current[name]
        if not self.state.recompute(name):
            return False
        after = self.state.current[name]
        self.report.record(node.name, _label(self.graph, node), rule, name, direction, before, after)
        changed.append(name)
        return True

    # ---- the worklist -----------------------------------------------------------------
    def run(self, max_visits: int | None, start: Collection[str] | None = None) -> None:
        queue = deque(self.ops if start is None else [n for n in self.ops if n.name in start])
        queued, seen = set(queue), set()
        while queue:
            node = queue.popleft()
            queued.discard(node)
            seen.add(node)
            changed, asked = self.visit(node)
            neighbours: set[fx.Node] = set()
            for name in changed:
                neighbours.update(self.readers.get(name, ()))
                if name in self.producer:
                    neighbours.add(self.producer[name])
            for name in asked:  # with a `start`: readers never run may be all that keeps this tensor whole
                waiting = [r for r in self.readers.get(name, ()) if r not in seen and r not in queued]
                if waiting and self._held_back(name):
                    neighbours.update(waiting)
            for other in neighbours:
                if other not in queued:
                    queue.append(other)
                    queued.add(other)
            if max_visits is not None and self.report.visits >= max_visits:
                self.report.stopped_early = True
                break

    def table(self) -> TeSATable:
        out = TeSATable(shapes=self.graph.shapes())
        for name in self.graph.tensors:
            out[name] = self.state.current[self.graph.canonical(name)]
        return out


def run_propagation(graph: Graph, table: Mapping[str, TeSA], *,
                    rules: RuleSet | Mapping[Target, Rule | RuleEntry] | None = None, scramble_trials: int = 16,
                    max_visits: int | None = None, check: bool = True, tolerance: float = 1e-4,
                    start: Collection[str] | None = None) -> PropagationResult:
    """Propagate `table` through `graph`; returns the new table and a report of what each rule did.

    With `check` (default), the result is checked on the example inputs: any tensor whose
    new pruning changes the output keeps its input TeSA, and `result.check` (and a
    `PropagationWarning`) names it with the op and rule at fault (see `self_check`).

    `start` (node names): the worklist starts there, not at every op, for a `table` that is
    already propagated but for what an edit changed around those nodes (a graph pass's
    rewrite): only ops a change reaches run (and the other readers of a tensor one of them
    would shrink). As sound as a full run (every tensor starts at its `table` entry either
    way); a tensor no change reaches keeps its entry, even where a full run would prune more.

    Example:
        >>> result = run_propagation(capture(model, x), prune(model, cfg))  # doctest: +SKIP
        >>> result.report.per_op(), result.check.passed                   # doctest: +SKIP
    """
    from sparta_explore.propagation.self_check import SelfCheck, checked_table

    ruleset = default_rules() if rules is None else default_rules().with_overrides(rules)
    began = time.perf_counter()
    engine = _Engine(graph, table, ruleset, scramble_trials)
    before = engine.table()
    engine.run(max_visits, start)
    engine.report.nodes = len(engine.ops)
    out = engine.table()
    outcome = SelfCheck(tolerance=tolerance)
    if check and graph.example_inputs:
        out, outcome = checked_table(graph, before, out, engine.report, tolerance=tolerance)
    engine.report.seconds = time.perf_counter() - began
    return PropagationResult(table=out, before=before, report=engine.report, check=outcome, input_table=table)


def propagate(graph: Graph, table: Mapping[str, TeSA], *,
              rules: RuleSet | Mapping[Target, Rule | RuleEntry] | None = None, scramble_trials: int = 16,
              max_visits: int | None = None, check: bool = True) -> TeSATable:
    """Tighten every TeSA in `table` until no rule changes anything (checked on the example inputs).

    `rules` overrides built-in rules for this call ({target: rule}); ops with no rule
    use tensor scrambling with `scramble_trials` random runs.

    Example:
        >>> t = propagate(capture(model, (x,)), prune(model, cfg))  # doctest: +SKIP
    """
    return run_propagation(graph, table, rules=rules, scramble_trials=scramble_trials, max_visits=max_visits,
                           check=check).table
