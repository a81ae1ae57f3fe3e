"""Compile in place: kernels swapped into the user's own module tree, and the same object handed back.

`compile(model, table, x, config=CompileConfig(inplace=True))` keeps what the user's model
is: a Hugging Face model keeps `generate` (its KV cache included), `config` and hooks,
because it *is* still that model (`se.save` writes the compiled form). Steps:

1. capture (for planning and the checks only: a generative model's KV cache is off in the
   captured forward, `tracing/kv_cache.py`) and plan on the captured graph;
2. choose each op's kernel as `compile` does (built, checked on the op's real input, timed),
   for ops that are the model's own `nn.Linear`, `nn.Conv2d` or Hugging Face `Conv1D`
   modules called once; functional weights and shared modules stay as they are;
3. zero the table's pruned elements in the model's own tensors, then put each chosen kernel
   at its module's path (the activation after it stays the model's own op);
4. check the model against the captured graph masked with the user's table (and the table
   propagation started from); a failed check puts the model's own modules back;
5. guard: the model with its kernels timed against the same model with its own (masked)
   modules; the faster stays.

Graph passes and kernel fusions rewrite the graph, so they do not run here: the report lists
them as skipped. `model.sparta_compiled` holds the report (`InPlaceCompile`).

Example:
    >>> model = compile(model, table, x, config=CompileConfig(inplace=True))   # doctest: +SKIP
    >>> print(model.sparta_compiled.summary())                                  # doctest: +SKIP
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd
from torch import nn

from sparta_explore.compile.choose import CompileWarning, choose, same_as_masked, tolerance
from sparta_explore.compile.config import CompileConfig
from sparta_explore.compile.lowering import LowerContext
from sparta_explore.compile.prepare import offered, prepare
from sparta_explore.compile.record import CompileRecord, summary_text
from sparta_explore.compile.recorded_inputs import record_run
from sparta_explore.compile.table_reference import table_reference
from sparta_explore.compile.timing import alternating_ms
from sparta_explore.compile.verify import check_row, model_error
from sparta_explore.errors import ConfigError, TeSANameError
from sparta_explore.graph import Graph
from sparta_explore.kernels.compiled_op import CompiledOp
from sparta_explore.masking import apply_table
from sparta_explore.module_tree import clone_module, put_module, set_module
from sparta_explore.plan import ExecutionPlan, OpPlan
from sparta_explore.plan.execution_plan import ORIGINAL
from sparta_explore.prunable import is_prunable
from sparta_explore.tracing.kv_cache import kv_cache_off

ATTRIBUTE = "sparta_compiled"  # where the model keeps its InPlaceCompile
SKIPPED = "in place: the model keeps its own module tree, and this pass rewrites the graph"
KERNEL_PASSES = ("fuse_pairs", "fuse_epilogue")


@dataclass(frozen=True)
class InPlaceCompile:
    """What an in-place compile did: `plan` (choices, times), `checks`, `passes` (all skipped, and why),
    `guard` (the model with kernels vs with its own masked modules), `swapped` (the module paths that now
    hold kernels), `seconds`, and the `record` a package needs (graph, tables, example call, tolerance).
    A model loaded from a package has no plan: its saved per-op table is `record.report`."""

    plan: ExecutionPlan | None
    checks: pd.DataFrame
    passes: pd.DataFrame
    guard: dict | None
    seconds: float
    swapped: tuple[str, ...]
    record: CompileRecord

    @property
    def report(self) -> pd.DataFrame:
        """One row per planned op, as `CompiledModel.report` (a loaded model's saved table)."""
        return self.plan.table() if self.plan is not None else self.record.report

    @property
    def max_error(self) -> float:
        """The largest relative error of the checks against the masked model (NaN when none ran).

        Example:
            >>> model.sparta_compiled.max_error < 1e-4   # doctest: +SKIP
            True
        """
        errors = pd.to_numeric(self.checks.get("error", pd.Series([], dtype=float)), errors="coerce").dropna()
        return float(errors.max()) if len(errors) else float("nan")

    @property
    def capped(self) -> int:
        """How many ops were chosen by the device profile's prediction because compile reached its time cap.

        Example:
            >>> model.sparta_compiled.capped   # doctest: +SKIP
            0
        """
        return sum(op.capped for op in self.plan.ops.values()) if self.plan is not None else 0

    def summary(self) -> str:
        """Passes (skipped), per-op choices, checks and the guard as plain text.

        Example:
            >>> print(model.sparta_compiled.summary())   # doctest: +SKIP
        """
        return summary_text(self.report, self.passes, self.checks, self.guard, self.record.notes)


def _why_not_in_place(root: nn.Module, graph: Graph, op: OpPlan) -> str | None:
    """Why `op`'s kernel cannot take its module's place in the user's tree, or None."""
    target = op.site.module_target
    if target is None:
        return "in place: a functional weight (not a module) stays as it is"
    if len(graph.module_nodes(target)) > 1:
        return "module called more than once: left as is"
    try:
        module = root.get_submodule(target)
    except AttributeError:
        return f"in place: the model has no module {target!r} (the captured graph renamed it)"
    if not is_prunable(module):
        return f"in place: {target!r} is a {type(module).__name__}, not a Linear, Conv2d or Conv1D"
    return None


def _own_names(root: nn.Module, table: Mapping[str, Any]) -> None:
    present = {n for n, _ in root.named_parameters(remove_duplicate=False)}
    present |= {n for n, _ in root.named_buffers(remove_duplicate=False)}
    foreign = sorted(n for n in table if "." in n and n not in present)
    if foreign:
        raise TeSANameError(f"compiling in place needs a table of the model's own parameters; {foreign[0]!r} "
                            f"(and {len(foreign) - 1} more) are not parameters of {type(root).__name__}")


def _choose(working: Graph, execution: ExecutionPlan, root: nn.Module, config: CompileConfig) -> dict[str, nn.Module]:
    planned = list(execution.ops.values())
    op_inputs = record_run(working, planned, one_item=True).inputs
    chosen: dict[str, nn.Module] = {}
    for op in planned:
        why = _why_not_in_place(root, working, op)
        if why is not None:
            op.fell_back(why)
            op.chosen = ORIGINAL
            continue
        if op.activation != "none":
            op.notes.append(f"in place: its {op.activation} stays the model's own op (not fused)")
        op.activation, op.activation_node = "none", None
        ctx = LowerContext(op.site.as_module(working.module), "none", op.m, config.cache_dir, tune=False,
                           in_shape=op_inputs.shape(op.op), few_rows=config.few_rows)
        module = choose(op, ctx, op_inputs[op.op], config.choose, config.runs, tune=config.tune,
                        given=dict(config.choices).get(op.op))
        if module is None:
            continue
        if same_as_masked(op):
            op.notes.append("dense fp32 chosen: the model's own masked module stays")
            continue
        module.label = op.op
        chosen[op.site.module_target] = module
    return chosen


def _skipped_passes(config: CompileConfig) -> pd.DataFrame:
    names = [n for n in (*config.graph_passes(), *KERNEL_PASSES) if config.runs_pass(n)]
    return pd.DataFrame([{"pass": n, "changed": "skipped", "seconds": 0.0, "notes": SKIPPED} for n in names],
                        columns=["pass", "changed", "seconds", "notes"])


def _guard(graph: Graph, root: nn.Module, originals: Mapping[str, nn.Module], runs: int) -> dict:
    """The model with its kernels against a view of it holding its own (masked) modules, calls alternating."""
    own = clone_module(root)
    for target, module in originals.items():
        set_module(own, target, module)  # copies the parents on the path: `root` keeps its kernels
    dense_ms, compiled_ms = alternating_ms(graph, [own, root], runs)
    runs_what = "compiled" if compiled_ms <= dense_ms else "model as given, masked"
    return {"dense_ms": dense_ms, "compiled_ms": compiled_ms, "runs": runs_what,
            "x_dense": dense_ms / min(dense_ms, compiled_ms)}


def check_not_compiled(root: Any) -> None:
    """A `ConfigError` when `root` already holds kernels (compiled in place before): compile a fresh copy.

    Example:
        >>> check_not_compiled(nn.Linear(2, 2))
    """
    if getattr(root, ATTRIBUTE, None) is not None or (
            isinstance(root, nn.Module) and any(isinstance(m, CompiledOp) for m in root.modules())):
        raise ConfigError(f"{type(root).__name__} already holds compiled kernels: compile a fresh copy of the model "
                          "(CompileConfig.inplace)")


def compile_in_place(root: nn.Module, graph: Graph, table: Any, config: CompileConfig,
                     plan: ExecutionPlan | None = None) -> nn.Module:
    """Compile `root` (the model `graph` was captured from) in place; see the module docstring. Returns `root`.

    Example:
        >>> model = compile_in_place(model, capture(model, x), table, CompileConfig(inplace=True))  # doctest: +SKIP
    """
    check_not_compiled(root)
    start = time.perf_counter()
    prepared = prepare(graph, table, config, plan)
    usable, input_table = prepared.usable, prepared.input_table
    _own_names(root, usable)
    execution = offered(prepared.working, usable, prepared, plan)
    chosen = _choose(prepared.working, execution, root, config)
    # built before the model is masked with the table, which may prune further than the input table
    references = [("table", prepared.trusted)] + ([("input table", table_reference(graph, input_table)[0])]
                                                  if input_table is not None else [])
    apply_table(root, usable)  # what stays the model's own computes the table's numbers too
    originals = {target: root.get_submodule(target) for target in chosen}
    for target, module in chosen.items():
        put_module(root, target, module)
    tol = tolerance([execution.ops[m.label] for m in chosen.values()])
    rows, guard = [], None
    with kv_cache_off(root):
        for name, ref in references:
            error = model_error(graph, root, ref) if config.verify else float("nan")
            rows.append(check_row(name, error, tol))
            if config.verify and not error <= tol and originals:
                warnings.warn(f"the model compiled in place differs from the model masked with the {name} by "
                              f"{error:.3g} (> {tol:g}); its own (masked) modules are put back", CompileWarning,
                              stacklevel=3)
                for op in execution.ops.values():
                    op.fell_back(f"{name} check failed ({error:.2e}): the model's own module runs")
                _restore(root, originals)
                originals = {}
        if config.guard and originals:
            guard = _guard(graph, root, originals, config.runs)
            if guard["runs"] != "compiled":
                _restore(root, originals)
                originals = {}
    notes = tuple(("capture", n) for n in graph.notes)
    record = CompileRecord(graph=graph, table=usable, input_table=input_table,
                           example=(tuple(graph.call_args), dict(graph.call_kwargs)), tolerance=tol, notes=notes)
    result = InPlaceCompile(execution, pd.DataFrame(rows), _skipped_passes(config), guard,
                            time.perf_counter() - start, tuple(originals), record)
    object.__setattr__(root, ATTRIBUTE, result)
    return root


def _restore(root: nn.Module, originals: Mapping[str, nn.Module]) -> None:
    for target, module in originals.items():
        put_module(root, target, module)

