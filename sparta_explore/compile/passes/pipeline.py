"""The graph passes in the order they run, and `run_passes`, which runs the chosen ones and reports each.

Order (`ORDER`, the one place that says it; each module registers its pass by name):

1. `simplify`          eval dropout, identities, no-op reshapes out; constant subexpressions computed once
2. `fold_batchnorm`    eval BatchNorm into the conv / linear before it
3. `constant_channels` channels that hold a value no input changes are folded into their readers' biases
                       (their weights there pruned), then propagation runs again on the rewritten graph
4. `shrink`            channels and heads pruned across their whole dependency group are cut out physically
5. `attention`         matmul -> scale -> (mask) -> softmax -> matmul becomes one SDPA call where it measures faster

6. `memory_format`     the whole model in channels-last where that measures faster

Kernel-phase passes (`fuse_pairs`, `fuse_epilogue`) run inside `compile` after kernel choice
(`compile/kernel_pairs.py`, `compile/epilogue.py`).

Example:
    >>> graph2, table2, reports = run_passes(graph, table, ("simplify", "fold_batchnorm"))   # doctest: +SKIP
    >>> [r.summary for r in reports]                                                          # doctest: +SKIP
    ['dropouts removed 2', 'batchnorms folded 4']
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from sparta_explore.compile.passes import (  # noqa: F401  (each registers its pass)
    attention,
    attention_dims,
    constant_channels,
    fold_batchnorm,
    memory_format,
    shrink,
    simplify,
)
from sparta_explore.compile.passes.base import PASSES, PassOptions, Table, declare_kernel_pass
from sparta_explore.errors import ConfigError
from sparta_explore.fake_quant import INT_BITS
from sparta_explore.graph import Graph

declare_kernel_pass("fuse_pairs", "chained sparse linears (fp32 or int8) run tile by tile where that measures faster")
declare_kernel_pass("fuse_epilogue", "adds, scales and the activation after an op run in its output stage")

# the run order: graph passes before planning, then the kernel passes compile runs after choosing kernels
ORDER = ("simplify", "fold_batchnorm", "constant_channels", "shrink", "attention", "attention_dims", "memory_format",
         "fuse_pairs", "fuse_epilogue")


@dataclass(frozen=True)
class PassReport:
    """One pass as it ran: name, what changed (counts and one line), notes, seconds, and the graph it left."""

    name: str
    summary: str
    changes: dict[str, int]
    notes: tuple[str, ...]
    seconds: float
    graph: Graph | None = field(default=None, repr=False, compare=False)


def check_pass_names(names: tuple[str, ...], key: str = "CompileConfig.passes") -> tuple[str, ...]:
    """`names` if every one is a registered pass, else a `ConfigError` naming `key` and the choices.

    Here, not in `base`, because the choices are complete only once every pass module is imported (above).

    Example:
        >>> check_pass_names(("fold",))
        Traceback (most recent call last):
        ...
        sparta_explore.errors.ConfigError: CompileConfig.passes: unknown pass 'fold'; choose from ...
    """
    for name in names:
        if name not in PASSES:
            raise ConfigError(f"{key}: unknown pass {name!r}; choose from {', '.join(PASSES)}")
    return tuple(names)


def graph_pass_names(names: Sequence[str] | None = None) -> tuple[str, ...]:
    """The graph-phase passes among `names` (all of them when None), in run order.

    Example:
        >>> graph_pass_names()
        ('simplify', 'fold_batchnorm', 'constant_channels', 'shrink', 'attention', 'attention_dims', 'memory_format')
    """
    wanted = set(PASSES) if names is None else set(names)
    return tuple(name for name in ORDER if PASSES[name].phase == "graph" and name in wanted)


def quantized_inputs(graph: Graph, table: Table) -> list[str]:
    """The activations the table puts on an integer grid (what quantized ops read), by tensor name.

    Example:
        >>> quantized_inputs(graph, {"relu": TeSA.dense((8, 32), bits=8)})  # doctest: +SKIP
        ['relu']
    """
    out = []
    for name, tesa in table.items():
        info = graph.tensors.get(name)
        kept = tesa.kept_bits()
        if info is not None and info.kind == "activation" and kept and max(kept) in INT_BITS:
            out.append(name)
    return out


def run_passes(graph: Graph, table: Table, names: Sequence[str] | None = None,
               options: PassOptions | None = None, *, keep_graphs: bool = False
               ) -> tuple[Graph, Table, list[PassReport]]:
    """Run the graph passes among `names` (default: all) in order; the last graph and table, and one report each.

    `keep_graphs` keeps each pass's output graph in its report (what a benchmark times
    pass by pass); the graphs share every module a later pass did not replace.

    Example:
        >>> g2, t2, reports = run_passes(graph, table)   # doctest: +SKIP
    """
    options = options or PassOptions()
    reports = []
    for name in graph_pass_names(names):
        start = time.perf_counter()
        quantized = quantized_inputs(graph, table) if PASSES[name].cuts_channels else []
        if quantized:
            reports.append(PassReport(name, "skipped", {}, (
                f"skipped: the table quantizes activations ({', '.join(quantized[:3])}"
                f"{', ...' if len(quantized) > 3 else ''}): their grids are scaled over all their channels",),
                time.perf_counter() - start, graph if keep_graphs else None))
            continue
        result = PASSES[name].fn(graph, table, options)
        graph, table = result.graph, result.table
        reports.append(PassReport(name, result.summary(), dict(result.changes), tuple(result.notes),
                                  time.perf_counter() - start, graph if keep_graphs else None))
    return graph, table, reports
