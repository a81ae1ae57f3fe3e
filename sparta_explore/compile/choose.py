"""Choosing one op's kernel: build every candidate, check it on the op's real input, time them, keep the fastest.

Timing is interleaved (a burst of load hits every candidate alike) and takes the fastest
run. A candidate that fails to build or to match its reference is dropped with a note and
a `CompileWarning`; if none is left, the op keeps its own masked module (`ORIGINAL`).

Example:
    >>> module = choose(op, ctx, x, "measured", runs=5)  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import time
import warnings

import torch
from torch import nn

from sparta_explore.compile.lowering import LowerContext, lower
from sparta_explore.device import fastest_ms
from sparta_explore.plan import Candidate, OpPlan
from sparta_explore.plan.execution_plan import FP32, ORIGINAL
from sparta_explore.plan.sites import OUT_IN

# Allowed max |compiled - reference| relative to (1 + max |reference|), by the narrowest bits involved:
# fp32 kernels differ from MKL only in summation order; int8 ones can flip one rounding step of a
# quantized activation when upstream fp32 sums differ in their last bit.
TOLERANCE = {FP32: 1e-3, 8: 2e-2}
# A candidate the device profile predicts over FAR times slower than the fastest prediction is built and timed
# only if its prediction is under FAR times the fastest the others measured (BERT-base at 90%: dense, predicted
# 4-7x the sparse kernels, was a third of the candidate timing and reference checks)
FAR = 3.0
OP_TOLERANCE = {FP32: 1e-4, 8: 1e-3}


class CompileWarning(UserWarning):
    """Compile did less than it was asked to; the message says what.

    An op could not use a faster kernel (build, check or fusion failed) and runs dense; a check
    failed and a reference runs; a call with other input sizes runs the reference; or the
    table prunes and quantizes nothing, so there was nothing to compile.
    """


def narrowest(candidate: Candidate) -> int:
    """The narrowest integer grid a part of `candidate` quantizes its input to, or 32 when none does."""
    return min((min(p.weight_bits, p.act_bits) for p in candidate.parts if p.kernel == "int8" or p.act_bits < FP32),
               default=FP32)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / (1 + max |want|).

    Example:
        >>> relative_error(torch.ones(2), torch.zeros(2))
        1.0
    """
    return float((got - want).abs().max()) / (1.0 + float(want.abs().max())) if want.numel() else 0.0


# where compile's time on one op goes, in `OpPlan.seconds` (`CompiledModel.compile_times` sums them)
STEPS = ("tile search", "codegen", "gcc + load", "kernel check", "few-row path", "lowering", "reference check",
         "timing")


def _spend(op: OpPlan, step: str, seconds: float) -> None:
    op.seconds[step] = op.seconds.get(step, 0.0) + max(0.0, seconds)


def _account_build(op: OpPlan, module: nn.Module, seconds: float) -> None:
    """Split `seconds` of lowering `module` into its kernels' own steps and the rest ("lowering")."""
    inner = 0.0
    for m in module.modules():
        for step, s in getattr(m, "build_seconds", {}).items():
            _spend(op, step, s)
            inner += s
    _spend(op, "lowering", seconds - inner)


def _fell_back(module: nn.Module) -> str | None:
    for m in module.modules():
        if getattr(m, "fallback_reason", None):
            return m.fallback_reason
    return None


# rows of the op's real input a candidate is checked on (all of it when fewer): one BERT item, 128 tokens; the
# inputs recorded from one item repeat it, so more rows would check the same rows again (0.15 s of BERT-base)
CHECK_ROWS = 128


def check_sample(x: torch.Tensor) -> torch.Tensor:
    """The leading items of `x` (along dim 0) holding at least `CHECK_ROWS` rows of its last dimension.

    Every kernel checks itself on random rows over whole and ragged tiles when it is built, and the whole
    compiled model is checked against its reference ops; a candidate's check on real rows needs an item's
    worth of them, not all (a w8a8 BERT-base spent 7 of 34 s on references of full inputs).

    Example:
        >>> check_sample(torch.zeros(8, 128, 768)).shape, check_sample(torch.zeros(1000, 64)).shape
        (torch.Size([1, 128, 768]), torch.Size([128, 64]))
    """
    if x.dim() < 2 or not x.numel():
        return x
    per_item = x[0].numel() // max(1, x.shape[-1])  # rows of the last dimension in one item along dim 0
    return x[:max(1, -(-CHECK_ROWS // max(1, per_item)))]


def _try_candidate(op: OpPlan, candidate: Candidate, ctx: LowerContext, x: torch.Tensor
                   ) -> tuple[nn.Module | None, str | None]:
    """(module, None), or (None, why it cannot be used): built, and checked on the op's real input."""
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a kernel falling back is reported below, once, by the compiler
            module = lower(candidate, ctx)
    except (ValueError, OSError, RuntimeError) as e:
        _spend(op, "lowering", time.perf_counter() - start)
        return None, f"{candidate.name}: build failed ({e})"
    _account_build(op, module, time.perf_counter() - start)
    start = time.perf_counter()
    why = _fell_back(module)
    if why is not None and candidate.name != "dense":
        return None, f"{candidate.name}: kernel unusable ({why})"
    try:
        sample = check_sample(x)
        with torch.inference_mode():
            err = relative_error(module(sample), module.reference(sample))
    except (RuntimeError, ValueError, IndexError) as e:
        return None, f"{candidate.name}: failed on the example input ({e})"
    finally:
        _spend(op, "reference check", time.perf_counter() - start)
    tol = OP_TOLERANCE[FP32 if narrowest(candidate) == FP32 else 8]
    if not err <= tol:
        return None, f"{candidate.name}: error {err:.2e} over {tol:.0e} on the example input"
    return module, None


def _built(op: OpPlan, candidates: list[Candidate], ctx: LowerContext, x: torch.Tensor, stop_at_first: bool
           ) -> dict[str, nn.Module]:
    """The candidates that build and pass their check on `x`, by name (each failure noted and warned once)."""
    built: dict[str, nn.Module] = {}
    for candidate in candidates:
        module, why = _try_candidate(op, candidate, ctx, x)
        if why is not None:
            op.fell_back(why)
            warnings.warn(f"op {op.op!r}: {why}", CompileWarning, stacklevel=4)
            continue
        built[candidate.name] = module
        if stop_at_first:
            break
    return built


def _tuned_already(module: nn.Module) -> bool:
    """Whether every tiled kernel in `module` runs the tiling its class's search chose
    (`LowerContext.searched_tiles`)."""
    tiled = [m for m in module.modules() if hasattr(m, "tile_searched")]
    return bool(tiled) and all(m.tile_searched for m in tiled)


def _timed(op: OpPlan, modules: dict[str, nn.Module], x: torch.Tensor, runs: int) -> dict[str, float]:
    start = time.perf_counter()
    with torch.inference_mode():
        times = fastest_ms(modules, x, runs, settle=True)
    _spend(op, "timing", time.perf_counter() - start)
    return times


def choose(op: OpPlan, ctx: LowerContext, x: torch.Tensor, mode: str, runs: int, tune: bool = False,
           given: str | None = None) -> nn.Module | None:
    """The fastest checked module for `op` on its input `x` (recorded in `op`), or None if nothing runs.

    `mode` "measured" builds and times every candidate (those predicted over `FAR` times slower than
    the fastest prediction only if the others measure that slow); "predicted" builds the profile's
    favourite only (and dense if that fails). `given` names the candidate to use (a trial's
    recorded choice): built alone, dense if it cannot run. `tune` then runs the tile search
    for a chosen fp32 sparse kernel and keeps the tuned build if it measures faster.

    Example:
        >>> choose(op, ctx, x, "measured", runs=5)  # doctest: +SKIP
    """
    names = [c.name for c in op.candidates]
    if given is not None and given not in names:
        op.notes.append(f"given choice {given!r} is not a candidate here ({', '.join(names)}): chosen by timing")
        given = None
    if given is not None or mode == "predicted":
        best = op.candidate(given) if given is not None else op.best_predicted()
        order = [best] + ([op.candidate("dense")] if best.name != "dense" else [])
        mode = "predicted"  # the first that runs is used
        if given is not None:
            op.notes.append(f"choice given: {given}")
    else:
        order = sorted(op.candidates, key=lambda c: c.predicted_ms)
    near = [c for c in order if mode == "predicted" or c.predicted_ms <= FAR * order[0].predicted_ms]
    built = _built(op, near, ctx, x, stop_at_first=mode == "predicted")
    if mode == "measured" and built:
        op.measured_ms.update(_timed(op, built, x, runs))  # interleaved: a burst of load hits every candidate alike
        fastest = min(op.measured_ms[name] for name in built)
        # a far candidate is built after all only if the kernels measured slower than predicted by that much
        far = [c for c in order[len(near):] if c.predicted_ms < FAR * fastest]
        skipped = [c for c in order[len(near):] if c not in far]
        if skipped:
            op.notes.append("not built (predicted over " + f"{FAR:g}x the fastest measured, {fastest:.3g} ms): "
                            + ", ".join(f"{c.name} {c.predicted_ms:.3g} ms" for c in skipped))
        more = _built(op, far, ctx, x, stop_at_first=False)
        if more:
            built.update(more)
            op.measured_ms.update(_timed(op, built, x, runs))
    if not built and len(near) < len(order):  # none of the near ones runs: the far ones are all there is
        built = _built(op, order[len(near):], ctx, x, stop_at_first=mode == "predicted")
    if not built:  # not even dense could run: the op keeps its own (masked) module, never a crash
        op.chosen = ORIGINAL
        op.fell_back("no candidate could run: the op's own module runs, masked")
        warnings.warn(f"op {op.op!r}: no candidate could run; its own module runs, masked", CompileWarning,
                      stacklevel=3)
        return None
    if not all(name in op.measured_ms for name in built):
        op.measured_ms.update(_timed(op, built, x, runs))
    op.chosen = min(built, key=op.measured_ms.get)
    if tune and any(p.kernel == "sparse" for p in op.candidate(op.chosen).parts) \
            and not _tuned_already(built[op.chosen]):
        tuned_ctx = dataclasses.replace(ctx, tune=True)
        module, why = _try_candidate(op, op.candidate(op.chosen), tuned_ctx, x)
        if module is not None:
            times = _timed(op, {"untuned": built[op.chosen], "tuned": module}, x, runs)
            if times["tuned"] < times["untuned"]:
                built[op.chosen] = module
            op.measured_ms[op.chosen] = min(times.values())
    return built[op.chosen]


def tolerance(ops: list[OpPlan]) -> float:
    """The relative error a compiled model may show against its references: by the narrowest grid a chosen
    candidate of `ops` quantizes to (fp32 kernels only differ in summation order).

    Example:
        >>> tolerance([])
        0.001
    """
    chosen = [op.candidate(op.chosen) for op in ops if op.chosen not in (None, ORIGINAL)]
    return TOLERANCE[FP32 if min((narrowest(c) for c in chosen), default=FP32) == FP32 else 8]


def same_as_masked(op: OpPlan) -> bool:
    """Whether the chosen candidate computes exactly the site's own masked module (dense, fp32, fp32 input).

    Example:
        >>> same_as_masked(op)  # doctest: +SKIP
        False
    """
    if op.chosen != "dense" or op.activation_node is not None:
        return False
    part = op.candidate("dense").parts[0]
    return part.weight_bits == FP32 and part.act_bits == FP32 and op.site.layout == OUT_IN
