"""compile(): a captured model plus its TeSAs become a CompiledModel: rewritten, with the kernels that measured fastest.

Steps, each a named part of this package:

1. mask a copy of the captured graph with the table (the user's model is never touched;
   `prepare.py`, shared with compiling in place);
2. **graph passes** (`passes/`, `CompileConfig.passes`): simplify, fold BatchNorm, fold
   constant channels (and propagate again), shrink what is pruned whole, fuse attention,
   channels-last where the whole model is faster;
3. **plan** the weight ops still pruned or quantized (candidates with predicted times),
   unless a plan is given (then the graph passes are skipped: the plan names the
   captured graph's ops);
4. **choose**: record every planned op's real input on the example inputs (on its first
   item, repeated, where that serves; `recorded_inputs.py`), build each candidate, check it
   against its reference on that input, time them, keep the fastest and fuse the activation
   that follows a linear;
5. **kernel passes**: chained sparse linears (fp32 or int8) fused tile by tile where faster
   (`kernel_pairs.py`), then the adds / scales / activation after every op fused into its
   output stage (`epilogue.py`);
6. **checks** (`verify.py`): against the reference ops, the table (the captured graph,
   before any pass) and the input table; where propagation pruned further, against the
   input table (the pruner's own), the table checked only to explain a failure; a failed
   check runs that masked reference;
7. **guard** (`guard.py`): the whole compiled model timed against the dense model (and, for
   an fp32 table, against the passes' model without kernels, which computes the same);
   the fastest runs, or the masked reference when even that is slower than dense.

Example:
    >>> cm = compile(graph, result, config=CompileConfig(tune=False))   # doctest: +SKIP
    >>> print(cm.summary())                                              # doctest: +SKIP
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import pandas as pd
import torch
import torch.fx as fx
from torch import nn

from sparta_explore.compile.choose import TOLERANCE, choose, same_as_masked, tolerance
from sparta_explore.compile.compile_times import stage_frame
from sparta_explore.compile.compiled_model import CompiledModel, SizeGuard, floating_dtypes
from sparta_explore.compile.config import CompileConfig
from sparta_explore.compile.epilogue import fuse_epilogues
from sparta_explore.compile.guard import guarded
from sparta_explore.compile.inplace import check_not_compiled, compile_in_place
from sparta_explore.compile.item_call import ITEM_CHECK_SECONDS, ItemCall
from sparta_explore.compile.kernel_pairs import chains, fuse_pairs
from sparta_explore.compile.lowering import LowerContext
from sparta_explore.compile.memory import collecting_temporaries, weakly_owned
from sparta_explore.compile.pair_tiles import first_tiling
from sparta_explore.compile.passes.base import PassOptions
from sparta_explore.compile.passes.constant_channels import SIZE_SPECIALIZED
from sparta_explore.compile.passes.graph_edit import editable
from sparta_explore.compile.passes.pipeline import PassReport, run_passes
from sparta_explore.compile.prepare import offered, prepare
from sparta_explore.compile.record import CompileRecord
from sparta_explore.compile.recorded_inputs import OpInputs, record_run
from sparta_explore.compile.same_references import same_references
from sparta_explore.compile.table_reference import has_grids, table_reference
from sparta_explore.compile.timing import OUT_OF_RACE
from sparta_explore.compile.verify import ModelOutputs, check_row, model_error, verified_module
from sparta_explore.errors import SpartaError
from sparta_explore.graph import Graph, capture
from sparta_explore.masking import apply_table
from sparta_explore.plan import ExecutionPlan, OpPlan
from sparta_explore.plan.execution_plan import FP32, ORIGINAL
from sparta_explore.plan.sites import replace_site
from sparta_explore.tesa import TeSA
from sparta_explore.tracing.copying import deep_copy, owning, tensor_ids

__all__ = ["CompileConfig", "CompiledModel", "compile"]


def _swap(gm: fx.GraphModule, op: OpPlan, module: nn.Module) -> None:
    """Put `module` in place of `op`'s site and fuse the activation that followed it."""
    call = replace_site(gm, op.site, module)
    if op.activation_node is not None:
        act = next(n for n in gm.graph.nodes if n.name == op.activation_node)
        act.replace_all_uses_with(call)
        gm.graph.erase_node(act)


def _pass_frame(reports: list[PassReport], kernel_rows: list[dict]) -> pd.DataFrame:
    rows = [{"pass": r.name, "changed": r.summary, "seconds": round(r.seconds, 3), "notes": "; ".join(r.notes)}
            for r in reports]
    return pd.DataFrame(rows + kernel_rows, columns=["pass", "changed", "seconds", "notes"])


def _choose_all(working: Graph, execution: ExecutionPlan, config: CompileConfig, op_inputs: OpInputs,
                stages: dict[str, float], deadline: float) -> dict[str, nn.Module]:
    """Build, check and time every planned op's candidates on its recorded input; the chosen modules by op.

    Past `deadline` (`time.perf_counter()`; `CompileConfig.max_seconds`) the profile's favourite is taken.
    Adds its own stages' seconds to `stages` (the ops keep theirs in `OpPlan.seconds`)."""
    planned = list(execution.ops.values())
    compiled: dict[str, nn.Module] = {}
    fusing = config.fuse and config.runs_pass("fuse_pairs") and config.choose == "measured"
    first_of = chains(working.module, planned) if fusing else {}
    for op in planned:
        if op.site.module_target is not None and len(working.module_nodes(op.site.module_target)) > 1:
            op.fell_back("module called more than once: left as is")
            op.chosen = ORIGINAL
            continue
        module = op.site.as_module(working.module)
        if _channels_last(module):  # the memory_format pass chose NHWC: kernels reading NCHW would reorder
            op.candidates = [c for c in op.candidates if all(p.kernel in ("dense", "shrink") for p in c.parts)]
            op.notes.append("channels-last model: NCHW conv kernels not offered")
        first = first_of.get(op.op)
        tile = None if first not in compiled else \
            first_tiling(compiled[first], op, op_inputs.shape(first), config.cache_dir)
        if tile is not None:
            op.notes.append(f"sparse built in {first!r}'s tiling: pairs of this class measured faster fused so")
        ctx = LowerContext(module, op.activation, op.m, config.cache_dir, tune=False, searched_tiles=config.tune,
                           in_shape=op_inputs.shape(op.op), tile_for=None if tile is None else ("sparse", tile),
                           masked=True, few_rows=config.few_rows)
        mode, tune = config.choose, config.tune
        if time.perf_counter() > deadline and (mode, tune) != ("predicted", False):
            mode, tune = "predicted", False
            op.capped = True
            op.notes.append(f"compile time cap ({config.max_seconds:g} s) reached: the device profile's favourite "
                            "(no other candidate built or timed, no tile search)")
        module = choose(op, ctx, op_inputs[op.op], mode, config.runs, tune=tune,
                        given=dict(config.choices).get(op.op))
        if module is not None and same_as_masked(op) and op.site.module_target is not None:
            op.notes.append("dense fp32 chosen: the op's own masked module stays (no wrapper)")
        elif module is not None:
            module.label = op.op
            compiled[op.op] = module
    for op in planned:
        if op.op in compiled:
            _swap(working.module, op, compiled[op.op])
    if fusing:
        t0 = time.perf_counter()
        fuse_pairs(working.module, planned, compiled, op_inputs, config.runs, config.cache_dir)
        stages["kernel passes"] = time.perf_counter() - t0
    return compiled


def _channels_last(module: nn.Module) -> bool:
    w = getattr(module, "weight", None)
    return isinstance(w, torch.Tensor) and w.dim() == 4 and not w.is_contiguous() and \
        w.is_contiguous(memory_format=torch.channels_last)


def _eager_model(graph: Graph, table: Mapping[str, TeSA], tol: float) -> nn.Module | None:
    """For an fp32 table the user's own model, masked (no graph, no wrapper: a tiny model's latency is mostly call
    overhead), not yet checked; None when there is none (quantized, or the table names the captured graph only)."""
    if tol != TOLERANCE[FP32] or not isinstance(graph.root, nn.Module) or graph.root is graph.module:
        return None
    try:
        return apply_table(deep_copy(graph.root), table)
    except SpartaError:
        return None  # the table names the captured graph's tensors, not the model's own


def _checked(eager: nn.Module | None, trusted: nn.Module, tol: float, outputs: ModelOutputs) -> nn.Module:
    """What runs when nothing compiled is faster: `eager` where it matches `trusted`, else `trusted`."""
    return eager if eager is not None and outputs.error(eager, trusted) <= tol else trusted


def _fp32_error(graph: Graph, table: Mapping[str, TeSA], run: nn.Module) -> float:
    return model_error(graph, run, table_reference(graph, table, grids=False, share=True)[0])


def _item(graph: Graph, config: CompileConfig) -> ItemCall | None:
    """The item the table checks' references run on (`compile/item_call.py`): where capture's dense call took
    `ITEM_CHECK_SECONDS` or more and `config.verify` is not "whole"; None: they run the whole example."""
    if config.verify == "whole" or graph.dense_seconds is None or graph.dense_seconds < ITEM_CHECK_SECONDS:
        return None
    return ItemCall.of(graph.call_args, graph.call_kwargs)


def _size_specialized(gm: nn.Module) -> bool:
    """Whether a pass baked the example's sizes into `gm` (bias maps)."""
    return any(name.startswith(SIZE_SPECIALIZED) for name, _ in gm.named_buffers())


def _size_guard(graph: Graph, gm: fx.GraphModule, fallback: nn.Module) -> SizeGuard:
    """Inputs of other sizes run `fallback`: a pass baked the example's sizes into `gm` (bias maps)."""
    shapes = tuple(tuple(x.shape[1:]) if isinstance(x, torch.Tensor) else None for x in graph.call_args)
    return SizeGuard(shapes, fallback)


def compile(model: nn.Module | Graph, table: Any, example_inputs: Any = None, config: CompileConfig | None = None,
            *, plan: ExecutionPlan | None = None, **options: Any) -> CompiledModel | nn.Module:
    """Compile a model (or its `Graph`) with the pruning and bits of `table`; see the module docstring.

    `table` is a TeSA mapping or a `PropagationResult` (then both tables are verified).
    `example_inputs` default to the graph's; a model is captured once on them
    (`capture`'s "auto" method). `config` (`CompileConfig`) holds every option; keyword
    `options` override its fields (`compile(model, table, x, tune=False)`). A given `plan`
    is copied, never edited. `model` itself is not modified, unless `config.inplace`: then
    the kernels go into `model`'s own module tree and `model` is returned
    (`compile/inplace.py`).

    Example:
        >>> cm = compile(model, table, (x,))   # doctest: +SKIP
        >>> torch.allclose(cm(x), masked_copy(model, table)(x), atol=1e-3)  # doctest: +SKIP
        True
    """
    with collecting_temporaries():  # its masked references (BERT-base: 417 MB) freed now, not at a full collection
        return _compile(model, table, example_inputs, (config or CompileConfig()).with_options(**options), plan)


def _compile(model: nn.Module | Graph, table: Any, example_inputs: Any, config: CompileConfig,
             plan: ExecutionPlan | None) -> CompiledModel | nn.Module:
    start = time.perf_counter()
    if config.inplace:
        check_not_compiled(model.root if isinstance(model, Graph) else model)
    graph = model if isinstance(model, Graph) else capture(model, example_inputs)
    if config.inplace:  # the user's own module tree gets the kernels (their model is returned)
        if isinstance(model, Graph) and example_inputs is not None:
            graph = capture(graph.root, example_inputs)
        return compile_in_place(graph.root, graph, table, config, plan)
    if isinstance(model, Graph) and example_inputs is not None:
        graph = capture(graph.module, example_inputs, method="graph_module")  # same module, other inputs
    stages = {"capture": time.perf_counter() - start}
    t0 = time.perf_counter()
    prepared = prepare(graph, table, config, plan)
    stages["prepare"] = time.perf_counter() - t0
    table, input_table, usable, unread, trusted = (prepared.table, prepared.input_table, prepared.usable,
                                                   prepared.unread, prepared.trusted)
    names = () if plan is not None else config.graph_passes()
    t0 = time.perf_counter()
    working, work_table, reports = run_passes(prepared.working, usable, names,
                                              PassOptions(config.runs, config.cache_dir))
    t1 = time.perf_counter()
    execution = offered(working, work_table, prepared, plan)
    before_kernels = editable(working)  # the passes' model with no kernels: the guard's other candidate
    stages.update({"graph passes": t1 - t0, "plan": time.perf_counter() - t1})
    deadline = start + config.max_seconds if config.max_seconds is not None else float("inf")
    t0 = time.perf_counter()
    recorded = record_run(working, list(execution.ops.values()), one_item=True)  # a fraction of a run
    stages["record inputs"] = time.perf_counter() - t0
    compiled = _choose_all(working, execution, config, recorded.inputs, stages, deadline)
    gm = working.module
    kernel_rows = []
    if config.runs_pass("fuse_epilogue"):
        t0 = time.perf_counter()
        counts = fuse_epilogues(working, gm, compiled)
        fuse_epilogues(working, before_kernels, {})
        kernel_rows.append({"pass": "fuse_epilogue", "seconds": round(time.perf_counter() - t0, 3), "notes": "",
                            "changed": ", ".join(f"{k} {v}" for k, v in counts.items() if v) or "nothing"})
        stages["kernel passes"] = stages.get("kernel passes", 0.0) + time.perf_counter() - t0
    for module in (gm, before_kernels):
        module.graph.lint()
        module.recompile()
    tol = tolerance([execution.ops[name] for name in compiled])
    t0 = time.perf_counter()
    references, explain = [("table", trusted)], []
    outputs = ModelOutputs(graph, _item(graph, config), tol)
    if input_table is not None and same_references(graph, table, input_table):
        references.append(("input table", trusted))  # propagation changed no weight the example reads: one run
    elif input_table is not None:  # the pruner's own table is what must match; the one compile used only explains
        given = table_reference(graph, input_table, share=True, like=(trusted, table))[0]
        references, explain = [("input table", given)], references
    outputs.on_item(*(module for _, module in references + explain))  # the dense model's arithmetic: one item
    ops_reference = None
    if tol == TOLERANCE[FP32] and recorded.seconds is not None:  # the reference ops' output, from the recording run
        ops_reference = before_kernels
        outputs.given(before_kernels, recorded.output, recorded.seconds)
    run, rows = verified_module(graph, gm, execution, compiled, references, tol, config.verify, outputs,
                                ops_reference, explain)
    checked = references[0][1]  # must match (the user's table where they differ); its call ran unless verify is off
    if unread and execution.ops:
        next(iter(execution.ops.values())).notes.append(
            f"{len(unread)} table entries name parameters the forward never reads: skipped ({unread[0]}, ...)")
    stages["checks"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    record, eager = None, None
    if config.guard and run is gm:
        candidates = {"compiled": gm}
        # first calls made by the checks, and what the others would take (they compute what a checked model did)
        # the dense model ran at capture (no first-call effects left): the masked one's call, same work, stands in
        # (with grids: less its inputs' rounding, the one thing it does beyond the dense model's ops)
        # where the checks ran the reference on one item, capture's call of the dense model stands for it (if it
        # ran on as many threads: else the guard times dense itself); that one was a first call, so it can read
        # high, and it only settles the race where the compiled call is under a third of it
        dense = outputs.dense_seconds(checked)
        from_capture = dense is None and graph.dense_threads == torch.get_num_threads()
        dense = graph.dense_seconds if from_capture else dense
        warm, estimates = {"compiled": outputs.seconds(gm), "dense": dense}, {}
        if tol == TOLERANCE[FP32]:  # fp32: the passes' model without kernels and the masked model compute the same
            if reports:  # it computes what the masked model does, at most as slowly: that call, where it did not run
                candidates["graph passes only"] = before_kernels
                estimates["graph passes only"] = outputs.seconds("ops reference") or dense
            # built only where its estimate (the masked reference's call) keeps it in the race: a copy of the model
            estimate, fastest = dense, outputs.seconds(gm)
            eager = _eager_model(graph, usable, tol) \
                if estimate is None or fastest is None or estimate <= OUT_OF_RACE * fastest else None
            if eager is not None:
                candidates["model as given, masked"] = eager
                estimates["model as given, masked"] = estimate
        # the masked model runs the dense model's ops (and rounds inputs, taken out above): its check call is a
        # dense call (BERT-base w8a8: the guard's own dense call was 1.1 s of a 7 s compile)
        name, run, record = guarded(graph, candidates, checked, config.runs, warm, estimates, warm_exact=True)
        if from_capture and dense is not None and record["dense_ms"] == dense * 1e3:
            record["dense_from"] = "capture"  # no round timed it: the figure is capture's (first) call
        if name in ("graph passes only", "model as given, masked"):
            error, on = outputs.compared(run, checked)
            rows.append(check_row(f"{references[0][0]} ({name})", error, tol, on))
            if not error <= tol:
                run = gm
    stages["guard"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if has_grids(table) or not outputs.ran(trusted):  # a reference without grids, run when first read
        fp32_error: float | Callable[[], float] = partial(_fp32_error, graph, table, run)
    else:  # without grids the trusted reference is that model, run already
        fp32_error = outputs.error(run, trusted)
    stages["checks"] += time.perf_counter() - t0
    size_guard = None
    users = tensor_ids(graph.module, graph.root)  # the references share these: what is handed out copies them
    if run is not eager and run is not trusted and run is not checked and _size_specialized(run):
        fallback = eager if eager is not None else _eager_model(graph, usable, tol)
        if fallback is not None:
            outputs.on_item(fallback)  # the masked model's arithmetic, checked as the references are
        size_guard = _size_guard(graph, run, weakly_owned(owning(_checked(fallback, checked, tol, outputs), users)))
    run = owning(run, users)
    kept = CompileRecord(graph=graph, table=usable, input_table=input_table,
                         example=(tuple(graph.call_args), dict(graph.call_kwargs)), tolerance=tol)
    total = time.perf_counter() - start
    # freed the moment the caller drops it (a sweep's trials), not at the next full collection
    return weakly_owned(CompiledModel(run, execution, pd.DataFrame(rows), total, unread, fp32_error,
                                      passes=_pass_frame(reports, kernel_rows), guard=record, size_guard=size_guard,
                                      input_dtypes=floating_dtypes(graph.call_args, graph.call_kwargs), record=kept,
                                      compile_times=stage_frame(stages, execution.ops.values(), total)))
