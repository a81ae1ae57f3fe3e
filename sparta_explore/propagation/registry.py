"""Rules: one registered function per fx target, and the view of an op a rule sees.

A rule gets an `OpView` (the op's arguments with every tensor replaced by its TeSA,
constants by their recorded values, plus the module's parameters and the output's TeSA)
and returns an `OpUpdate`: tighter attributes for any of them, as bool *kept* masks or as
TeSAs (a TeSA also carries bits, for passive ops). The engine merges updates with `meet`,
so a rule can only ever prune more or lower bits.

Targets are module classes (`nn.Linear`), functions (`F.linear`, `torch.matmul`,
`operator.add`) or tensor-method names (`"view"`).

This module holds the table and the decorator only; the built-in rules register into
`BUILTINS` from their own modules (`rules_*.py`), and `builtin_rules.default_rules()` is
the table with all of them loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn

from sparta_explore.tesa import TeSA

Target = type | Callable[..., Any] | str
Slot = int | str | tuple[int, int]  # positional index, keyword name, or (index, item) in a list arg
Tight = torch.Tensor | TeSA | None  # bool kept mask (broadcastable), a TeSA, or no change


class Unsupported(Exception):
    """Raised by a rule for an argument pattern it cannot reason about; the op is left as it is."""


@dataclass
class OpView:
    """What a rule sees of one op.

    `args`/`kwargs` mirror the call: tensors are `TeSA`s (lists of tensors are lists of
    TeSAs), everything else is the value recorded at capture. `params` holds a module's
    own parameters ("weight", "bias") for call_module ops. `output` is the TeSA of the
    result (a tuple of TeSAs for ops returning several tensors).
    """

    node: fx.Node
    args: tuple
    kwargs: dict[str, Any]
    params: dict[str, TeSA]
    output: TeSA | tuple[TeSA, ...]
    module: nn.Module | None = None
    dtypes: dict[Slot, torch.dtype] = field(default_factory=dict)

    def arg(self, index: int, name: str | None = None, default: Any = None) -> Any:
        """Positional argument `index`, or keyword `name`, or `default`."""
        if index < len(self.args):
            return self.args[index]
        if name is not None and name in self.kwargs:
            return self.kwargs[name]
        return default

    def slot_of(self, index: int, name: str) -> Slot:
        """The slot (positional or keyword) through which argument `index`/`name` was passed."""
        return index if index < len(self.args) else name

    def tensor_slots(self) -> list[tuple[Slot, TeSA]]:
        """Every tensor argument with its slot, lists and tuples of tensors included."""
        out: list[tuple[Slot, TeSA]] = []
        for i, a in enumerate(self.args):
            if isinstance(a, TeSA):
                out.append((i, a))
            elif isinstance(a, (list, tuple)):
                out += [((i, j), t) for j, t in enumerate(a) if isinstance(t, TeSA)]
        out += [(k, v) for k, v in self.kwargs.items() if isinstance(v, TeSA)]
        return out

    def replay(self, values: Mapping[Slot, Any], params: Mapping[str, torch.Tensor] | None = None) -> Any:
        """Call the op again with the tensors in `values` (by slot) and the recorded constants.

        Tensor slots missing from `values` are an error; for call_module ops, `params`
        replaces the module's parameters for this call only.
        """
        def sub(slot: Slot, a: Any) -> Any:
            if isinstance(a, TeSA):
                return values[slot]
            if isinstance(a, (list, tuple)) and any(isinstance(t, TeSA) for t in a):
                return type(a)(values[(slot, j)] if isinstance(t, TeSA) else t for j, t in enumerate(a))
            return a

        args = [sub(i, a) for i, a in enumerate(self.args)]
        kwargs = {k: sub(k, v) for k, v in self.kwargs.items()}
        node = self.node
        if node.op == "call_function":
            return node.target(*args, **kwargs)
        if node.op == "call_method":
            return getattr(args[0], node.target)(*args[1:], **kwargs)
        if params:
            return torch.func.functional_call(self.module, dict(params), tuple(args), kwargs)
        return self.module(*args, **kwargs)


@dataclass
class OpUpdate:
    """Tighter attributes a rule proposes; absent entries are left unchanged."""

    output: Tight | tuple[Tight, ...] = None
    args: dict[Slot, Tight] = field(default_factory=dict)
    params: dict[str, Tight] = field(default_factory=dict)


Rule = Callable[[OpView], OpUpdate]


@dataclass(frozen=True)
class RuleEntry:
    """A registered rule; `passive` ops only move data, so bit widths flow through them."""

    name: str
    fn: Rule
    passive: bool


class RuleSet:
    """Target -> rule. `default_rules()` (builtin_rules.py) holds the built-ins; `with_overrides` layers user rules.

    Example:
        >>> rs = RuleSet()
        >>> rs.add([nn.ReLU], RuleEntry("relu", lambda op: OpUpdate(), passive=True))
        >>> rs.lookup(nn.ReLU).name
        'relu'
    """

    def __init__(self, entries: Mapping[Target, RuleEntry] | None = None) -> None:
        self._entries: dict[Target, RuleEntry] = dict(entries or {})

    def add(self, targets: Iterable[Target], entry: RuleEntry) -> None:
        for t in targets:
            self._entries[t] = entry

    def lookup(self, target: Target) -> RuleEntry | None:
        """The rule for `target`; module classes also match through their base classes."""
        if isinstance(target, type):
            for cls in target.__mro__:
                if cls in self._entries:
                    return self._entries[cls]
            return None
        try:
            return self._entries.get(target)
        except TypeError:  # unhashable callables
            return None

    def targets(self) -> list[Target]:
        return list(self._entries)

    def with_overrides(self, overrides: RuleSet | Mapping[Target, Rule | RuleEntry]) -> RuleSet:
        """A copy in which `overrides` replace the rules for their targets (one call's `rules=`)."""
        out = RuleSet(self._entries)
        items = overrides._entries.items() if isinstance(overrides, RuleSet) else overrides.items()
        for target, rule in items:
            entry = rule if isinstance(rule, RuleEntry) else RuleEntry(getattr(rule, "__name__", "user"), rule, False)
            out._entries[target] = entry
        return out


# the built-ins, filled as each rules module is imported: read it through `builtin_rules.default_rules()`,
# which imports them all first (this module must not: they import it for `register_rule`)
BUILTINS = RuleSet()


def register_rule(*targets: Target, passive: bool = False, rules: RuleSet | None = None) -> Callable[[Rule], Rule]:
    """Decorator registering `fn` as the rule for every target (into the built-ins by default).

    Example:
        >>> @register_rule(MyOp, rules=RuleSet())  # doctest: +SKIP
        ... def my_rule(op: OpView) -> OpUpdate:
        ...     return OpUpdate(output=op.args[0].kept)
    """
    def add(fn: Rule) -> Rule:
        (rules if rules is not None else BUILTINS).add(targets, RuleEntry(fn.__name__, fn, passive))
        return fn
    return add
