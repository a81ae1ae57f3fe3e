"""One exploration trial: params in, the five stages in order, one measured `TrialResult` out.

`run_trial(params)` runs `trial.stages` on the params' workload (an embedded digits model
by default, or the user's): prune, quantize, propagate, fine-tune under the masks,
optionally calibrate bits, compile, verify, measure the compiled and the dense model's
latency on this machine, and score the compiled model with the workload's metric.

Example:
    >>> result = run_trial({"sparsity": 0.75, "block": "32x32", "bits": 8})  # doctest: +SKIP
    >>> result.as_row()["latency_ms"], result.score                          # doctest: +SKIP
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd

from sparta_explore.compile.config import CompileConfig
from sparta_explore.errors import ConfigError
from sparta_explore.explore.trial.params import TrialParams
from sparta_explore.explore.trial.result import TrialResult
from sparta_explore.explore.trial.stages import (
    Calibrated,
    Compiled,
    Compressed,
    FineTuned,
    Measured,
    TrialSetup,
    calibrate,
    compile_stage,
    compress,
    finetune,
    measure,
    weight_stats,
)


def _check_counts(runs: Any, warmup: Any) -> None:
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ConfigError(f"runs must be an int >= 1 (timed calls per latency measurement), got {runs!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ConfigError(f"warmup must be an int >= 0, got {warmup!r}")


def run_trial(params: TrialParams | Mapping[str, Any], *, cache_dir: str | os.PathLike | None = None,
              runs: int = 20, warmup: int = 3, compile_config: CompileConfig | None = None,
              compile_kwargs: Mapping[str, Any] | None = None,
              echo: Callable[[str], None] | None = None) -> TrialResult:
    """Compress, fine-tune, (calibrate,) compile, verify and measure one setting on its workload.

    `params` is a `TrialParams` or a dict of its fields (NNI parameters). `runs` / `warmup`
    are the timed / untimed forward calls per latency measurement; `compile_config` (or
    `compile_kwargs`, fields of `CompileConfig`, e.g. a `device` profile, `tune=False`)
    configures compile; `echo` receives one line per stage.

    Example:
        >>> r = run_trial({"workload": "digits-mlp", "block": "1x32", "sparsity": 0.75})  # doctest: +SKIP
        >>> r.accuracy, r.latency_ms, r.dense_latency_ms  # doctest: +SKIP
    """
    from sparta_explore.pruners import get_pruner
    from sparta_explore.quantizers import get_quantizer

    _check_counts(runs, warmup)
    params = TrialParams.from_dict(params)
    get_pruner(params.pruner)  # bad names fail before any training
    get_quantizer(params.quantizer)
    config = (compile_config or CompileConfig(cache_dir=cache_dir)).with_options(**dict(compile_kwargs or {}))
    started = time.perf_counter()
    setup = TrialSetup.start(params, cache_dir=cache_dir, echo=echo, compile_config=config, runs=runs,
                             warmup=warmup)
    compressed = compress(setup)
    tuned = finetune(setup, compressed)
    calibrated = calibrate(setup, compressed, tuned)
    compiled = compile_stage(setup, calibrated)
    measured = measure(setup, calibrated, compiled)
    return trial_result(setup, compressed, tuned, calibrated, compiled, measured,
                        wall_s=time.perf_counter() - started)


def trial_result(setup: TrialSetup, compressed: Compressed, tuned: FineTuned, calibrated: Calibrated,
                 compiled: Compiled, measured: Measured, *, wall_s: float) -> TrialResult:
    """The stages' values as one `TrialResult` (the last step of `run_trial`).

    Example:
        >>> trial_result(setup, compressed, tuned, calibrated, compiled, measured, wall_s=3.0).speedup  # doctest: +SKIP
    """
    from sparta_explore.machine import this_machine

    _, mean_bits, packed = weight_stats(calibrated.propagation.table, setup.weights())
    base, mine, cm = measured.dense, measured.compiled, compiled.info
    choices, fallbacks = kernel_choices(cm.report)
    return TrialResult(
        params=setup.params, accuracy=measured.metric, finetuned_accuracy=tuned.metric,
        masked_accuracy=tuned.masked_metric, dense_accuracy=tuned.dense_metric, latency_ms=mine.median_ms,
        latency_p10_ms=mine.p10_ms, latency_p90_ms=mine.p90_ms, dense_latency_ms=base.median_ms,
        dense_flops=measured.dense_flops, effective_flops=measured.effective_flops,
        sparsity_pruned=compressed.sparsity_pruned, sparsity_propagated=compressed.sparsity_propagated,
        mean_bits=mean_bits, peak_memory_mb=mine.peak_memory_mb, weight_bytes=mine.weight_bytes,
        dense_weight_bytes=base.weight_bytes, compressed_weight_bytes=packed, max_error=float(cm.max_error),
        runs=setup.runs, threads=mine.threads, compile_s=compiled.seconds, wall_s=wall_s, kernel_choices=choices,
        fallbacks=fallbacks, compile_capped=cm.capped, metric_name=setup.workload.metric_name,
        higher_is_better=setup.workload.higher_is_better,
        machine=this_machine(int(mine.threads)).columns(), table=calibrated.propagation.table,
        compile_report=cm.report)


def kernel_choices(report: pd.DataFrame) -> tuple[str, int]:
    """("op:choice;...", how many ops fell back) from a compile report.

    An op fell back when compile rejected a kernel for it (build or check failed) or left it
    as is; the report's ``fallback`` column says so per op. A fusion that worked, or one
    measured slower and kept apart, is a choice, not a fallback.

    Example:
        >>> kernel_choices(pd.DataFrame({"op": ["fc1", "fc2"], "choice": ["bsr", "dense"],
        ...                              "fallback": [False, True]}))
        ('fc1:bsr;fc2:dense', 1)
    """
    if len(report) == 0:
        return "", 0
    choices = ";".join(f"{op}:{choice}" for op, choice in zip(report["op"], report["choice"]))
    fell_back = report["fallback"].fillna(False).astype(bool) if "fallback" in report else pd.Series([], dtype=bool)
    return choices, int(fell_back.sum())
