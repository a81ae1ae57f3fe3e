"""compile(): a captured model plus its TeSAs become a CompiledModel whose ops run the kernels that measured fastest.

Steps: take the `Graph` (or capture the model, once); plan (candidates with predicted
times) unless a plan is given; record every planned op's real input on the example inputs;
build each candidate, check it against its reference on that input and time it (the
latency feedback); keep the fastest, fuse the activation that follows it, and swap it into
a copy of the graph. Then three checks, reported in `CompiledModel.checks`:

* **ops**: the compiled model against the same graph with every compiled op running its
  PyTorch reference. A failure means a kernel bug: every op then runs its reference.
* **table**: against the model masked with the table it was given (weights on their
  grids where the table asks for <= 8 bits; `table_reference`).
* **input table**: when given a `PropagationResult`, also against the table propagation
  started from: what the pruner and quantizer said, the reference a user can trust.

If a table check fails, the compiled model runs that trusted reference instead (with a
`CompileWarning`): never a wrong answer. Parameters the forward never reads are skipped
with a note.

Example:
    >>> cm = compile(graph, result, config=CompileConfig(tune=False))   # doctest: +SKIP
    >>> print(cm.report[["op", "choice", "meas_ms", "dense_ms"]]); print(cm.checks)   # doctest: +SKIP
"""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Mapping
from typing import Any

import pandas as pd
import torch
import torch.fx as fx
from torch import nn
from torch.utils import _pytree as pytree

from sparta_explore.callable_module import make_callable
from sparta_explore.compile_choose import TOLERANCE, CompileWarning, choose, narrowest, relative_error
from sparta_explore.compile_config import CompileConfig
from sparta_explore.compile_fuse import fuse_pairs
from sparta_explore.device import DeviceProfile
from sparta_explore.graph import Graph, capture
from sparta_explore.kernels.build import compiler_available, warn_compiler_missing
from sparta_explore.lowering import LowerContext
from sparta_explore.masking import apply_table
from sparta_explore.plan import ExecutionPlan, OpPlan
from sparta_explore.plan import plan as make_plan
from sparta_explore.plan.execution_plan import FP32, ORIGINAL
from sparta_explore.plan.sites import replace_site
from sparta_explore.table_reference import split_unread, table_reference
from sparta_explore.tesa import TeSA
from sparta_explore.tracing.inputs import set_mode

__all__ = ["CompileConfig", "CompileWarning", "CompiledModel", "compile"]


class _Reference(nn.Module):
    """Runs a compiled op's PyTorch reference instead of its kernel."""

    def __init__(self, op: nn.Module) -> None:
        super().__init__()
        self.op = op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op.reference(x)


class CompiledModel(nn.Module):
    """The captured model with planned ops swapped for kernels; `report` says what each op runs.

    Attributes: `plan` (the ExecutionPlan with measured times and choices: compile's own copy),
    `report` (DataFrame, one row per planned op), `checks` (DataFrame: check, error,
    tolerance, passed), `max_error` (vs the reference ops), `table_error` (vs the model
    masked with the table, weights on their grids), `fp32_error` (vs the masked model in
    fp32: quantization's own error), `unread` (table names the forward never reads),
    `seconds`. Called like the model.

    Example:
        >>> cm = compile(model, table, (x,)); y = cm(x)  # doctest: +SKIP
    """

    def __init__(self, module: fx.GraphModule, plan: ExecutionPlan, checks: pd.DataFrame, seconds: float,
                 unread: list[str], fp32_error: float) -> None:
        super().__init__()
        self.module = module
        self.plan = plan
        self.checks = checks
        self.seconds = seconds
        self.unread = unread
        self.fp32_error = fp32_error

    @property
    def max_error(self) -> float:
        """Relative error against the graph with each compiled op running its reference."""
        return float(self.checks.set_index("check").loc["ops", "error"])

    @property
    def table_error(self) -> float:
        """Relative error against the model masked with the table (weights on their grids)."""
        return float(self.checks.set_index("check").loc["table", "error"])

    @property
    def report(self) -> pd.DataFrame:
        return self.plan.table()

    def train(self, mode: bool = True) -> CompiledModel:
        # an exported module refuses train()/eval(): its dropout mode was fixed at export
        self.training = mode
        set_mode(self.module, mode)
        return self

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def _tensor_leaves(out: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _model_error(graph: Graph, a: nn.Module, b: nn.Module) -> float:
    with torch.inference_mode():
        outs = list(zip(_tensor_leaves(graph.run(a)), _tensor_leaves(graph.run(b))))
    return max((relative_error(x.float(), y.float()) for x, y in outs), default=0.0)


class _InputRecorder(fx.Interpreter):
    """Runs the graph once and keeps the activation each planned op reads."""

    def __init__(self, gm: fx.GraphModule, wanted: Mapping[str, int]) -> None:
        super().__init__(gm)
        self.wanted, self.seen = wanted, {}

    def run_node(self, n: fx.Node) -> Any:
        if n.name in self.wanted:
            args, _ = self.fetch_args_kwargs_from_env(n)
            self.seen[n.name] = args[self.wanted[n.name]].detach()
        return super().run_node(n)


def _record_inputs(graph: Graph, gm: fx.GraphModule, ops: list[OpPlan]) -> dict[str, torch.Tensor]:
    recorder = _InputRecorder(gm, {op.op: op.site.input_index for op in ops})
    with torch.inference_mode():
        recorder.run(*graph.example_inputs)
    return recorder.seen


def _swap(gm: fx.GraphModule, op: OpPlan, module: nn.Module) -> None:
    """Put `module` in place of `op`'s site and fuse the activation that followed it."""
    call = replace_site(gm, op.site, module)
    if op.activation_node is not None:
        act = next(n for n in gm.graph.nodes if n.name == op.activation_node)
        act.replace_all_uses_with(call)
        gm.graph.erase_node(act)


def _unwrap_table(table: Any) -> tuple[Mapping[str, TeSA], Mapping[str, TeSA] | None]:
    from sparta_explore.propagation.report import PropagationResult

    if isinstance(table, PropagationResult):
        return table.table, table.input_table
    return table, None


def _check_row(name: str, error: float, tol: float) -> dict:
    return {"check": name, "error": error, "tolerance": tol, "passed": bool(error <= tol)}


def compile(model: nn.Module | Graph, table: Any, example_inputs: Any = None, config: CompileConfig | None = None,
            *, plan: ExecutionPlan | None = None, **options: Any) -> CompiledModel:
    """Compile a model (or its `Graph`) with the pruning and bits of `table`; see the module docstring.

    `table` is a TeSA mapping or a `PropagationResult` (then both tables are verified).
    `example_inputs` default to the graph's; a model is captured once on them
    (`capture`'s "auto" method). `config` (`CompileConfig`) holds every option; keyword
    `options` override its fields (`compile(model, table, x, tune=False)`). A given `plan`
    is copied, never edited. `model` itself is not modified.

    Example:
        >>> cm = compile(model, table, (x,))   # doctest: +SKIP
        >>> torch.allclose(cm(x), masked_copy(model, table)(x), atol=1e-3)  # doctest: +SKIP
        True
    """
    config = (config or CompileConfig()).with_options(**options)
    start = time.perf_counter()
    graph = model if isinstance(model, Graph) else capture(model, example_inputs)
    if isinstance(model, Graph) and example_inputs is not None:
        graph = capture(graph.module, example_inputs, method="graph_module")  # same module, other inputs
    table, input_table = _unwrap_table(table)
    kernels = config.kernels
    if not compiler_available():  # one warning, then PyTorch's own kernels only
        warn_compiler_missing()
        kernels = frozenset({"dense", "shrink"})
    device = config.device or DeviceProfile.load_or_measure(cache_dir=config.cache_dir)
    execution = copy.deepcopy(plan) if plan is not None else make_plan(graph, table, device)
    if kernels is not None:
        for op in execution.ops.values():
            op.candidates = [c for c in op.candidates if c.name == "dense" or all(p.kernel in kernels for p in c.parts)]
    trusted, unread = table_reference(graph, table)
    gm = copy.deepcopy(graph.module)
    usable, _ = split_unread(graph, gm, table)
    apply_table(gm, usable)
    planned = list(execution.ops.values())
    op_inputs = _record_inputs(graph, gm, planned)
    compiled: dict[str, nn.Module] = {}
    for op in planned:
        if op.site.module_target is not None and len(graph.module_nodes(op.site.module_target)) > 1:
            op.notes.append("module called more than once: left as is")
            continue
        ctx = LowerContext(op.site.as_module(gm), op.activation, op.m, config.cache_dir, tune=False,
                           in_shape=tuple(op_inputs[op.op].shape))
        module = choose(op, ctx, op_inputs[op.op], config.choose, config.runs, tune=config.tune)
        if module is not None:
            module.label = op.op
            compiled[op.op] = module
    for op in planned:
        if op.op in compiled:
            _swap(gm, op, compiled[op.op])
    if config.fuse and config.choose == "measured":
        fuse_pairs(gm, planned, compiled, op_inputs, config.runs, config.cache_dir)
    gm.graph.lint()
    gm.recompile()
    return _verified(graph, gm, execution, compiled, table, input_table, trusted, unread, config, start)


def _verified(graph: Graph, gm: fx.GraphModule, execution: ExecutionPlan, compiled: dict[str, nn.Module],
              table: Mapping[str, TeSA], input_table: Mapping[str, TeSA] | None, trusted: fx.GraphModule,
              unread: list[str], config: CompileConfig, start: float) -> CompiledModel:
    chosen = [execution.ops[name].candidate(execution.ops[name].chosen) for name in compiled
              if execution.ops[name].chosen not in (None, ORIGINAL)]
    tol = TOLERANCE[FP32 if min((narrowest(c) for c in chosen), default=FP32) == FP32 else 8]
    reference = _reference_module(gm, compiled)
    ops_error = _model_error(graph, gm, reference)
    rows = [_check_row("ops", ops_error, tol)]
    if not ops_error <= tol:  # never a wrong answer: every op runs its PyTorch reference instead
        warnings.warn(f"compiled model differs from its reference ops by {ops_error:.3g} (> {tol:g}); running the "
                      "reference ops instead. This is a kernel bug: please report it with the plan table",
                      CompileWarning, stacklevel=3)
        for op in execution.ops.values():
            op.notes.append(f"whole-model check failed ({ops_error:.2e}): reference op runs")
        gm = reference
    if unread:
        first = next(iter(execution.ops.values()), None)
        note = f"{len(unread)} table entries name parameters the forward never reads: skipped ({unread[0]}, ...)"
        if first is not None:
            first.notes.append(note)
    references = [("table", table, trusted)]
    if input_table is not None:
        references.append(("input table", input_table, table_reference(graph, input_table)[0]))
    for name, _, ref in references:
        error = _model_error(graph, gm, ref) if config.verify else float("nan")
        rows.append(_check_row(name, error, tol))
        if config.verify and not error <= tol:
            warnings.warn(f"compiled model differs from the model masked with the {name} by {error:.3g} (> {tol:g}); "
                          f"it runs that masked model instead. Propagation or planning changed what the {name} "
                          "says: please report it", CompileWarning, stacklevel=3)
            gm = ref
            for op in execution.ops.values():
                op.notes.append(f"{name} check failed ({error:.2e}): the masked reference runs")
            break
    fp32_error = _model_error(graph, gm, table_reference(graph, table, grids=False)[0])
    return CompiledModel(gm, execution, pd.DataFrame(rows), time.perf_counter() - start, unread, fp32_error)


def _reference_module(gm: fx.GraphModule, compiled: Mapping[str, nn.Module]) -> fx.GraphModule:
    """The compiled graph with each compiled op computed by its PyTorch reference (sharing the modules)."""
    graph = copy.deepcopy(gm.graph)
    ids = {id(m) for m in compiled.values()}
    owners: dict[str, object] = {}
    for node in graph.nodes:
        if node.op == "call_module":
            module = gm.get_submodule(node.target)
            owners[node.target] = _Reference(module) if id(module) in ids else module
        elif node.op == "get_attr":
            owners[node.target] = _get_attr(gm, node.target)
    return fx.GraphModule(owners, graph)


def _get_attr(module: nn.Module, target: str) -> object:
    for part in target.split("."):
        module = getattr(module, part)
    return module


make_callable(__name__, "compile")
