"""compile(): a model plus its TeSAs become a CompiledModel whose ops run the kernels that measured fastest.

Steps: capture the model; plan (candidates with predicted times) unless a plan is given;
record every planned op's real input on the example inputs; build each candidate, check
it against its reference on that input and time it (the latency feedback); keep the
fastest, fuse the activation that follows it, and swap it into a copy of the traced
model. Finally the whole compiled model is checked against the same model with every op
computed by its PyTorch reference (masked, and fake-quantized where bits < 32).

Example:
    >>> cm = compile(model, table, (x,))           # doctest: +SKIP
    >>> print(cm.report[["op", "choice", "meas_ms", "dense_ms"]])  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import os
import time
import warnings
from collections.abc import Collection, Mapping, Sequence

import pandas as pd
import torch
import torch.fx as fx
from torch import nn

from sparta_explore.callable_module import make_callable
from sparta_explore.device import DeviceProfile, fastest_ms
from sparta_explore.graph import capture
from sparta_explore.kernels.build import compiler_available, warn_compiler_missing
from sparta_explore.lowering import LowerContext, lower
from sparta_explore.masking import apply_table
from sparta_explore.plan import Candidate, ExecutionPlan, OpPlan
from sparta_explore.plan import plan as make_plan
from sparta_explore.plan.execution_plan import FP32, ORIGINAL
from sparta_explore.tesa import TeSA

# Allowed max |compiled - reference| relative to (1 + max |reference|), by the narrowest bits involved:
# fp32 kernels differ from MKL only in summation order; int8 ones can flip one rounding step of a
# quantized activation when upstream fp32 sums differ in their last bit.
TOLERANCE = {FP32: 1e-3, 8: 2e-2}
OP_TOLERANCE = {FP32: 1e-4, 8: 1e-3}


class CompileWarning(UserWarning):
    """A planned op could not use a faster kernel (build, check or fusion failed) and runs dense."""


class _Reference(nn.Module):
    """Runs a compiled op's PyTorch reference instead of its kernel."""

    def __init__(self, op: nn.Module) -> None:
        super().__init__()
        self.op = op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op.reference(x)


class CompiledModel(nn.Module):
    """The traced model with planned ops swapped for kernels; `report` says what each op runs.

    Attributes: `plan` (ExecutionPlan with measured times and choices), `report` (DataFrame,
    one row per planned op), `max_error` (vs the reference model, relative), `seconds`.

    Example:
        >>> cm = compile(model, table, (x,)); y = cm(x)  # doctest: +SKIP
    """

    def __init__(self, module: fx.GraphModule, plan: ExecutionPlan, max_error: float, fp32_error: float,
                 seconds: float) -> None:
        super().__init__()
        self.module = module
        self.plan = plan
        self.max_error = max_error
        self.fp32_error = fp32_error
        self.seconds = seconds

    @property
    def report(self) -> pd.DataFrame:
        return self.plan.table()

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def _as_tuple(example_inputs) -> tuple:
    return tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)


def _record_inputs(gm: fx.GraphModule, targets: Sequence[str], inputs: tuple) -> dict[str, torch.Tensor]:
    seen: dict[str, torch.Tensor] = {}
    handles = []
    for target in targets:
        def grab(module, args, target=target):
            seen.setdefault(target, args[0].detach())
        handles.append(gm.get_submodule(target).register_forward_pre_hook(grab))
    try:
        with torch.inference_mode():
            gm(*inputs)
    finally:
        for h in handles:
            h.remove()
    return seen


def _narrowest(candidate: Candidate) -> int:
    return min((min(p.weight_bits, p.act_bits) for p in candidate.parts if p.kernel == "int8"), default=FP32)


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max()) / (1.0 + float(want.abs().max())) if want.numel() else 0.0


def _fell_back(module: nn.Module) -> str | None:
    for m in module.modules():
        if getattr(m, "fallback_reason", None):
            return m.fallback_reason
    return None


def _try_candidate(op: OpPlan, candidate: Candidate, ctx: LowerContext, x: torch.Tensor
                   ) -> tuple[nn.Module | None, str | None]:
    """(module, None), or (None, why it cannot be used): built, and checked on the op's real input."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a kernel falling back is reported below, once, by the compiler
            module = lower(candidate, ctx)
    except (ValueError, OSError, RuntimeError) as e:
        return None, f"{candidate.name}: build failed ({e})"
    why = _fell_back(module)
    if why is not None and candidate.name != "dense":
        return None, f"{candidate.name}: kernel unusable ({why})"
    try:
        with torch.inference_mode():
            err = _relative_error(module(x), module.reference(x))
    except (RuntimeError, ValueError, IndexError) as e:
        return None, f"{candidate.name}: failed on the example input ({e})"
    tol = OP_TOLERANCE[FP32 if _narrowest(candidate) == FP32 else 8]
    if not err <= tol:
        return None, f"{candidate.name}: error {err:.2e} over {tol:.0e} on the example input"
    return module, None


def _timed(modules: dict[str, nn.Module], x: torch.Tensor, runs: int) -> dict[str, float]:
    with torch.inference_mode():
        return fastest_ms(modules, x, runs)


def _choose(op: OpPlan, ctx: LowerContext, x: torch.Tensor, choose: str, runs: int) -> nn.Module | None:
    if choose == "predicted":
        best = op.best_predicted()
        order = [best] + ([op.candidate("dense")] if best.name != "dense" else [])
    else:
        order = sorted(op.candidates, key=lambda c: c.predicted_ms)
    built: dict[str, nn.Module] = {}
    for candidate in order:
        module, why = _try_candidate(op, candidate, ctx, x)
        if why is not None:
            op.notes.append(why)
            warnings.warn(f"op {op.op!r}: {why}", CompileWarning, stacklevel=3)
            continue
        built[candidate.name] = module
        if choose == "predicted":
            break
    if not built:  # not even dense could run: the op keeps its own (masked) module, never a crash
        op.chosen = ORIGINAL
        op.notes.append("no candidate could run: the op's own module runs, masked")
        warnings.warn(f"op {op.op!r}: no candidate could run; its own module runs, masked", CompileWarning,
                      stacklevel=3)
        return None
    op.measured_ms.update(_timed(built, x, runs))  # interleaved: a burst of load hits every candidate alike
    op.chosen = min(built, key=op.measured_ms.get)
    if ctx.tune and any(p.kernel == "sparse" for p in op.candidate(op.chosen).parts):
        tuned_ctx = LowerContext(ctx.module, ctx.activation, ctx.m, ctx.cache_dir, tune=True)
        module, why = _try_candidate(op, op.candidate(op.chosen), tuned_ctx, x)
        if module is not None:
            times = _timed({"untuned": built[op.chosen], "tuned": module}, x, runs)
            if times["tuned"] < times["untuned"]:
                built[op.chosen] = module
            op.measured_ms[op.chosen] = min(times.values())
    return built[op.chosen]


def _fuse(gm: fx.GraphModule, op: OpPlan) -> None:
    if op.activation_node is None:
        return
    nodes = {n.name: n for n in gm.graph.nodes}
    act, linear = nodes[op.activation_node], nodes[op.op]
    act.replace_all_uses_with(linear)
    gm.graph.erase_node(act)


def _flatten(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flatten(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _flatten(o)]
    return []


def _model_error(a: nn.Module, b: nn.Module, inputs: tuple) -> float:
    with torch.inference_mode():
        outs = list(zip(_flatten(a(*inputs)), _flatten(b(*inputs))))
    return max((_relative_error(x.float(), y.float()) for x, y in outs), default=0.0)


def _reference_model(gm: fx.GraphModule, compiled: Mapping[str, nn.Module]) -> fx.GraphModule:
    """The compiled graph with each compiled op computed by its PyTorch reference (sharing the modules)."""
    graph = copy.deepcopy(gm.graph)
    owners: dict[str, object] = {}
    for node in graph.nodes:
        if node.op == "call_module":
            owners[node.target] = _Reference(compiled[node.target]) if node.target in compiled else \
                gm.get_submodule(node.target)
        elif node.op == "get_attr":
            owners[node.target] = gm.get_parameter(node.target) if node.target in dict(gm.named_parameters()) \
                else _get_attr(gm, node.target)
    return fx.GraphModule(owners, graph)


def _get_attr(module: nn.Module, target: str) -> object:
    for part in target.split("."):
        module = getattr(module, part)
    return module


def compile(model: nn.Module, table: Mapping[str, TeSA], example_inputs, *, plan: ExecutionPlan | None = None,
            device: DeviceProfile | None = None, choose: str = "measured", tune: bool = True, runs: int = 5,
            kernels: Collection[str] | None = None, cache_dir: str | os.PathLike | None = None) -> CompiledModel:
    """Compile `model` with the pruning and bits of `table` into kernels, verified; see the module docstring.

    `choose="measured"` builds and times every candidate (default); `"predicted"` trusts the
    profile and builds only its favourite (plus dense if that fails). `tune` runs the tile
    search for the chosen fp32 sparse kernels. `kernels` limits the kernel families tried
    (e.g. {"dense", "shrink"}; dense is always kept). `model` itself is not modified.

    Example:
        >>> cm = compile(model, table, (x,))   # doctest: +SKIP
        >>> torch.allclose(cm(x), masked_copy(model, table)(x), atol=1e-3)  # doctest: +SKIP
        True
    """
    if choose not in ("measured", "predicted"):
        raise ValueError(f"choose must be 'measured' or 'predicted', got {choose!r}")
    start = time.perf_counter()
    inputs = _as_tuple(example_inputs)
    graph = capture(model, inputs)
    if not compiler_available():  # one warning, then PyTorch's own kernels only
        warn_compiler_missing()
        kernels = {"dense", "shrink"}
    device = device or DeviceProfile.load_or_measure(cache_dir=cache_dir)
    execution = plan if plan is not None else make_plan(graph, table, device)
    if kernels is not None:
        for op in execution.ops.values():
            op.candidates = [c for c in op.candidates
                             if c.name == "dense" or all(p.kernel in kernels for p in c.parts)]
    gm = copy.deepcopy(graph.module)
    apply_table(gm, {k: v for k, v in table.items() if "." in k})
    masked = copy.deepcopy(gm)
    op_inputs = _record_inputs(gm, [op.target for op in execution.ops.values()], inputs)
    compiled: dict[str, nn.Module] = {}
    for op in execution.ops.values():
        if len(graph.module_nodes(op.target)) > 1:
            op.notes.append("module called more than once: left as is")
            continue
        ctx = LowerContext(gm.get_submodule(op.target), op.activation, op.m, cache_dir, tune=False)
        module = _choose(op, ctx, op_inputs[op.target], choose, runs)
        if module is not None:
            module.label = op.target
            compiled[op.target] = module
    for op in execution.ops.values():
        if op.target in compiled:
            gm.set_submodule(op.target, compiled[op.target])
            _fuse(gm, op)
    gm.graph.lint()
    gm.recompile()
    narrowest = min((_narrowest(op.candidate(op.chosen)) for op in execution.ops.values()
                     if op.chosen and op.chosen != ORIGINAL), default=FP32)
    reference = _reference_model(gm, compiled)
    max_error = _model_error(gm, reference, inputs)
    tol = TOLERANCE[FP32 if narrowest == FP32 else 8]
    if not max_error <= tol:  # never a wrong answer: every op runs its PyTorch reference instead
        warnings.warn(f"compiled model differs from its reference by {max_error:.3g} (> {tol:g}); running the "
                      "reference ops instead. This is a kernel bug: please report it with the plan table",
                      CompileWarning, stacklevel=2)
        for op in execution.ops.values():
            op.notes.append(f"whole-model check failed ({max_error:.2e}): reference op runs")
        gm, max_error = reference, 0.0
    return CompiledModel(gm, execution, max_error, _model_error(gm, masked, inputs), time.perf_counter() - start)


make_callable(__name__, "compile")
