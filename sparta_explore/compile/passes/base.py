"""What a graph pass is: a function from a `Graph` and its TeSAs to a rewritten `Graph`, its TeSAs and what changed.

Passes are registered by name (`register_pass`; `pipeline.ORDER` is their run order), each
with the phase it belongs to: "graph" passes rewrite the captured model before planning (fold,
constant channels, shrink, attention); "kernels" passes work on the model once its ops
have kernels (fused output stages, fused int8 pairs) and live beside `compile`. A pass
never edits the graph it is given: it builds a new GraphModule that shares every module
and tensor it does not change (`graph_edit.editable`).

This module is the registry only: every pass module imports it to register, so it never
imports them (nor `pipeline`, which imports them all). `PASSES` is complete once `pipeline`
is imported; `pipeline.check_pass_names` checks names against it.

Example:
    >>> @register_pass("my_pass")                         # doctest: +SKIP
    ... def my_pass(graph, table, options):
    ...     return PassResult(graph, table, {"nodes changed": 0})
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sparta_explore.graph import Graph
from sparta_explore.tesa import TeSA

Table = Mapping[str, TeSA]


@dataclass(frozen=True)
class PassOptions:
    """What passes may need besides the graph: timing rounds for measured choices, the kernel cache."""

    runs: int = 5
    cache_dir: str | None = None


@dataclass(frozen=True)
class PassResult:
    """A pass's output: the rewritten graph, the table keyed to it, counts of what it changed, notes.

    Example:
        >>> PassResult(None, {}, {"batchnorms folded": 2, "dropouts removed": 0}).summary()
        'batchnorms folded 2'
    """

    graph: Graph
    table: Table
    changes: Mapping[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return any(self.changes.values())

    def summary(self) -> str:
        """The non-zero counts as one line ("nothing" when the pass changed nothing)."""
        said = [f"{what} {n}" for what, n in self.changes.items() if n]
        return ", ".join(said) if said else "nothing"


GraphPassFn = Callable[[Graph, Table, PassOptions], PassResult]


@dataclass(frozen=True)
class GraphPass:
    """One registered pass: its name, phase ("graph" or "kernels"), function (None for kernel passes) and doc.

    `cuts_channels`: the pass removes channels an op reads (or folds them into a bias). An op
    whose input is quantized puts each input row on a grid scaled by the row's largest value,
    over every channel, so such a pass would change that op's scales: `run_passes` skips it
    for tables that quantize an op's input.
    """

    name: str
    phase: str
    fn: GraphPassFn | None
    doc: str
    cuts_channels: bool = False


PASSES: dict[str, GraphPass] = {}
PHASES = ("graph", "kernels")


def register_pass(name: str, phase: str = "graph", *, cuts_channels: bool = False
                  ) -> Callable[[GraphPassFn], GraphPassFn]:
    """Register a graph pass under `name` (`pipeline.ORDER` says when it runs).

    Example:
        >>> "fold_batchnorm" in PASSES   # doctest: +SKIP
        True
    """
    if phase not in PHASES:
        raise ValueError(f"pass phase must be one of {PHASES}, got {phase!r}")

    def add(fn: GraphPassFn) -> GraphPassFn:
        if name in PASSES:
            raise ValueError(f"pass {name!r} is already registered")
        PASSES[name] = GraphPass(name, phase, fn, (fn.__doc__ or "").strip().splitlines()[0], cuts_channels)
        return fn
    return add


def declare_kernel_pass(name: str, doc: str) -> None:
    """Name a pass that `compile` runs once kernels are chosen (its code lives with compile), so configs list it."""
    if name not in PASSES:
        PASSES[name] = GraphPass(name, "kernels", None, doc)
