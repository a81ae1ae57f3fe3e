"""A picked trial rebuilt from its row and saved as a package, its metric checked against what the row says.

The trial's stages run again from its parameters and seed (training is seeded and
single-threaded: the fine-tuned weights come back bit for bit on the machine that ran it),
compile builds the kernels the row recorded (`CompileConfig.choices`), and the compiled
model is scored and timed against dense as the trial was. Every difference from the row is
named with its likely cause: another machine, other kernels than recorded, the guard
choosing another variant. The package's manifest keeps the trial's parameters, the row's
figures and the reproduced ones (``metadata``).

Example:
    >>> result = export_trial(row, "best.sparta")   # doctest: +SKIP
    >>> result.reproduced, result.metric, result.latency_ms   # doctest: +SKIP
    (True, 0.9722, 0.41)
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparta_explore.compile.config import CompileConfig
from sparta_explore.errors import ConfigError
from sparta_explore.explore.trial.params import TrialParams
from sparta_explore.explore.trial.stages import TrialSetup, calibrate, compile_stage, compress, finetune, measure


@dataclass(frozen=True)
class ExportResult:
    """What `export_trial` wrote and measured: the package, the metric and latency now and in the row, and every
    difference from the row, named (empty when the metric reproduced exactly)."""

    path: Path
    key: str
    params: TrialParams
    metric_name: str
    metric: float
    row_metric: float
    finetuned_metric: float
    row_finetuned_metric: float
    latency_ms: float
    dense_latency_ms: float
    row_latency_ms: float
    differences: tuple[str, ...]

    @property
    def reproduced(self) -> bool:
        """Whether the compiled and the fine-tuned metric both equal the row's exactly."""
        return self.metric == self.row_metric and self.finetuned_metric == self.row_finetuned_metric

    def lines(self) -> list[str]:
        """What the command line prints: the package, the metric, the latency, the differences.

        Example:
            >>> print("\\n".join(result.lines()))   # doctest: +SKIP
        """
        same = "reproduced exactly" if self.reproduced else f"row: {self.row_metric:.6g}"
        return [f"wrote {self.path} (trial {self.key})",
                f"{self.metric_name} {self.metric:.6g} ({same}); fine-tuned {self.finetuned_metric:.6g}",
                f"latency {self.latency_ms:.4g} ms vs dense {self.dense_latency_ms:.4g} ms "
                f"({self.dense_latency_ms / self.latency_ms:.2f}x; row: {self.row_latency_ms:.4g} ms)",
                *(f"difference: {d}" for d in self.differences)]


def _number(row: Mapping[str, Any], column: str) -> float:
    try:
        value = float(row.get(column))
    except (TypeError, ValueError):
        return math.nan
    return value


def _choices(text: Any) -> dict[str, str]:
    if not isinstance(text, str) or not text:
        return {}
    return dict(item.rsplit(":", 1) for item in text.split(";") if ":" in item)


def _differences(row: Mapping[str, Any], *, metric: float, finetuned: float, choices: str, guard: Any,
                 machine: str) -> list[str]:
    """Each way the rebuilt trial differs from its row, with why it can."""
    said = []
    row_machine = str(row.get("machine") or "")
    other_machine = bool(row_machine) and row_machine != machine
    if other_machine:
        said.append(f"the row was measured on machine {row_machine} ({row.get('cpu_model')}), this is {machine}: "
                    "its latency figures are not this machine's")
    row_finetuned = _number(row, "finetuned_accuracy")
    if finetuned != row_finetuned:
        why = ("float rounding in training differs between CPUs" if other_machine else
               "training did not repeat bit for bit on the same machine (a nondeterministic op in the workload?)")
        said.append(f"the fine-tuned model scores {finetuned:.6g}, the row {row_finetuned:.6g}: {why}")
    row_metric = _number(row, "accuracy")
    if metric != row_metric:
        was, now = _choices(row.get("kernel_choices")), _choices(choices)
        changed = [f"{op}: {was.get(op)} -> {c}" for op, c in now.items() if was.get(op) != c]
        reason = (f"other kernels than the row's ({', '.join(changed[:4])}) round differently" if changed else
                  "the same kernels; the whole-model guard ran "
                  f"{(guard or {}).get('runs', 'the compiled model')}, whose float rounding differs from the "
                  "variant the trial timed")
        said.append(f"the compiled model scores {metric:.6g}, the row {row_metric:.6g} "
                    f"(fine-tuned {'equal' if finetuned == row_finetuned else 'differs too'}): {reason}")
    return said


def _plain(value: Any) -> Any:
    """A manifest value: JSON without NaN."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if hasattr(value, "item"):
        return _plain(value.item())
    return value


def export_trial(row: Mapping[str, Any], out: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None,
                 runs: int = 20, source: str | None = None, echo: Callable[[str], None] | None = None
                 ) -> ExportResult:
    """Rebuild the trial of results row `row`, save its compiled model to `out`, compare with the row.

    `runs`: timed calls of the latency measurement; `source`: where the row came from (kept in
    the manifest); `echo` gets the stages' progress lines.

    Example:
        >>> export_trial(pick_trial(load_trials("results/sweep"), trial="3f2a"), "m.sparta").lines()  # doctest: +SKIP
    """
    from sparta_explore.machine import this_machine

    if not math.isfinite(_number(row, "accuracy")) or not math.isfinite(_number(row, "latency_ms")):
        raise ConfigError(f"trial {row.get('key')} did not finish (its row has no metric or latency): nothing to "
                          "export")
    try:
        params = TrialParams.from_dict(json.loads(str(row.get("params_json"))))
    except (ValueError, TypeError) as e:
        raise ConfigError(f"trial {row.get('key')}: its params_json is not readable ({e})") from None
    recorded = row.get("kernel_choices")
    config = CompileConfig(cache_dir=cache_dir, choices=recorded if isinstance(recorded, str) else ())
    setup = TrialSetup.start(params, cache_dir=cache_dir, echo=echo, compile_config=config, runs=runs)
    compressed = compress(setup)
    tuned = finetune(setup, compressed)
    calibrated = calibrate(setup, compressed, tuned)
    compiled = compile_stage(setup, calibrated)
    measured = measure(setup, calibrated, compiled)
    report = compiled.info.report
    choices = ";".join(f"{op}:{choice}" for op, choice in zip(report["op"], report["choice"])) if len(report) else ""
    machine = this_machine(int(measured.compiled.threads)).key
    differences = tuple(_differences(row, metric=measured.metric, finetuned=tuned.metric, choices=choices,
                                     guard=compiled.info.guard, machine=machine))
    figures = {"metric_name": setup.workload.metric_name, "metric": measured.metric,
               "row_metric": _number(row, "accuracy"), "finetuned_metric": tuned.metric,
               "row_finetuned_metric": _number(row, "finetuned_accuracy"),
               "latency_ms": measured.compiled.median_ms, "dense_latency_ms": measured.dense.median_ms,
               "row_latency_ms": _number(row, "latency_ms")}
    metadata = {"trial": {"key": str(row.get("key")), "params": params.to_dict(), "source": source,
                          "row_machine": _plain(row.get("machine")), "kernel_choices": choices},
                **{k: _plain(v) for k, v in figures.items()}, "differences": list(differences)}
    from sparta_explore.compile.package.save import save

    path = save(compiled.model, out, metadata=metadata)  # a CompiledModel, or a model compiled in place
    return ExportResult(path, str(row.get("key")), params, differences=differences, **figures)
