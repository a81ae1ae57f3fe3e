"""What one trial measured, and the flat results row it becomes.

`TrialResult` holds the values `run_trial` (`trial.run`) takes from the stages;
`TrialResult.as_row()` is one flat, JSON-able row with these columns (`ROW_COLUMNS`):

* key, params_json: the sweep key (hash) and canonical JSON of the params as given;
* the params as run (NNI issue 5726: the echo is what ran): workload, pruner, sparsity,
  layer_sparsity ("layers.0:0.9;layers.1:0.5", empty without overrides), scope, block
  ("32x32" or ""), bits, act_bits (empty unless the inputs' width differs), quantizer,
  calibrate, calibrate_threshold, finetune_epochs, batch (resolved), seed, objective, target;
* metric_name (the workload's, e.g. "accuracy" or "perplexity"), higher_is_better (its
  direction), and that metric in accuracy (the compiled model), finetuned_accuracy (masked
  fp32 model after fine-tuning), masked_accuracy (after propagation, before fine-tuning),
  dense_accuracy; quality: the compiled model's metric as a number to maximize
  (`sparta_explore.quality`: the metric, or dense_accuracy / accuracy when lower is better),
  what fronts, objectives, tuners and picks rank by;
* latency_ms, latency_p10_ms, latency_p90_ms (compiled), dense_latency_ms (PyTorch dense,
  timed in the same trial, call by call alternating with the compiled model),
  speedup (dense / compiled), latency_ratio (compiled / dense);
* dense_flops, effective_flops (nonzero weights only; 2 per MAC), flops_ratio;
* sparsity_pruned / sparsity_propagated: share of weights pruned by the pruner /
  after propagation; mean_bits: mean bit width of the kept weights;
* peak_memory_mb, weight_bytes (compiled module), dense_weight_bytes, compressed_weight_bytes
  (kept weights at their bits, no index overhead);
* max_error (compiled vs its reference ops, or vs the table where compile did not run that check),
  kernel_choices ("op:choice;..."),
  fallbacks (ops where compile rejected a kernel or left the op as is; see compile_report notes);
* runs, threads; machine, cpu_model, cpu_flags (`sparta_explore.machine`: where it was measured);
* compile_s, wall_s, score (`objectives.score` for params.objective / target);
* compile_capped: ops whose kernel the device profile chose untimed because compile reached
  its time cap (`CompileConfig.max_seconds`; 0 without a cap).

Example:
    >>> r = TrialResult(TrialParams(workload="digits-mlp"), **dict.fromkeys(METRIC_FIELDS, 2.0))
    >>> r.as_row()["speedup"], len(r.as_row()) == len(ROW_COLUMNS)
    (1.0, True)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from sparta_explore.errors import ConfigError
from sparta_explore.explore.trial.objectives import score as objective_score
from sparta_explore.explore.trial.params import TrialParams, format_block, format_layer_sparsity
from sparta_explore.quality import quality
from sparta_explore.tesa_table import TeSATable

ROW_COLUMNS = (
    "key", "params_json", "workload", "pruner", "sparsity", "layer_sparsity", "scope", "block", "bits", "act_bits",
    "quantizer", "calibrate", "calibrate_threshold",
    "finetune_epochs", "batch", "seed", "objective", "target",
    "metric_name", "higher_is_better", "accuracy", "finetuned_accuracy", "masked_accuracy", "dense_accuracy",
    "quality",
    "latency_ms", "latency_p10_ms", "latency_p90_ms", "dense_latency_ms", "speedup", "latency_ratio",
    "dense_flops", "effective_flops", "flops_ratio", "sparsity_pruned", "sparsity_propagated", "mean_bits",
    "peak_memory_mb", "weight_bytes", "dense_weight_bytes", "compressed_weight_bytes",
    "max_error", "kernel_choices", "fallbacks", "runs", "threads", "machine", "cpu_model", "cpu_flags",
    "compile_s", "wall_s", "score", "compile_capped",
)


@dataclass(frozen=True)
class TrialResult:
    """What one trial measured; `as_row()` flattens it into a results row (see `ROW_COLUMNS`).

    `table` (the propagated TeSATable) and `compile_report` (one row per op) stay out of
    the row but are kept for inspection.

    Example:
        >>> r = TrialResult(TrialParams(workload="digits-mlp", batch=8), **dict.fromkeys(METRIC_FIELDS, 1.0))
        >>> r.as_row()["speedup"], r.as_row()["block"]
        (1.0, '32x32')
    """

    params: TrialParams
    accuracy: float
    finetuned_accuracy: float
    masked_accuracy: float
    dense_accuracy: float
    latency_ms: float
    latency_p10_ms: float
    latency_p90_ms: float
    dense_latency_ms: float
    dense_flops: float
    effective_flops: float
    sparsity_pruned: float
    sparsity_propagated: float
    mean_bits: float
    peak_memory_mb: float | None
    weight_bytes: float
    dense_weight_bytes: float
    compressed_weight_bytes: float
    max_error: float
    runs: float
    threads: float
    compile_s: float
    wall_s: float
    kernel_choices: str = ""
    fallbacks: int = 0
    compile_capped: int = 0
    metric_name: str = "accuracy"
    higher_is_better: bool = True
    machine: Mapping[str, str] = field(default_factory=dict)  # `Machine.columns()` of where it was measured
    table: TeSATable | None = field(default=None, repr=False, compare=False)
    compile_report: pd.DataFrame | None = field(default=None, repr=False, compare=False)

    @property
    def score(self) -> float:
        """The params' objective at the params' target (what an NNI tuner maximizes).

        Example:
            >>> TrialResult(TrialParams(workload="digits-mlp"), **dict.fromkeys(METRIC_FIELDS, 1.0)).score
            0.0
        """
        return objective_score(self._metrics(), self.params.objective, self.params.target)

    def _metrics(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in METRIC_FIELDS}
        out["kernel_choices"], out["fallbacks"] = self.kernel_choices, int(self.fallbacks)
        out["compile_capped"] = int(self.compile_capped)
        out["metric_name"], out["higher_is_better"] = self.metric_name, bool(self.higher_is_better)
        out["quality"] = quality(self.accuracy, self.higher_is_better, self.dense_accuracy)
        return out

    def as_row(self) -> dict[str, Any]:
        """One flat, JSON-able results row with the columns of `ROW_COLUMNS`, in that order.

        Example:
            >>> row = TrialResult(TrialParams(workload="digits-mlp"), **dict.fromkeys(METRIC_FIELDS, 2.0)).as_row()
            >>> list(row) == list(ROW_COLUMNS), row["batch"]
            (True, 64)
        """
        p = self.params
        echo = p.to_dict()
        echo["block"] = format_block(p.block)
        echo["batch"] = resolved_batch(p)
        echo["act_bits"] = p.act_bits
        echo["layer_sparsity"] = format_layer_sparsity(p.layer_sparsity)  # flat for CSV
        m = self._metrics()
        m["speedup"] = _ratio(m["dense_latency_ms"], m["latency_ms"])
        m["latency_ratio"] = _ratio(m["latency_ms"], m["dense_latency_ms"])
        m["flops_ratio"] = _ratio(m["effective_flops"], m["dense_flops"])
        m["score"] = self.score
        where = {"machine": "", "cpu_model": "", "cpu_flags": "", **self.machine}
        row = {"key": p.key, "params_json": p.canonical_json(), **echo, **m, **where}
        return {c: row[c] for c in ROW_COLUMNS}


METRIC_FIELDS = ("accuracy", "finetuned_accuracy", "masked_accuracy", "dense_accuracy", "latency_ms",
                 "latency_p10_ms", "latency_p90_ms", "dense_latency_ms", "dense_flops", "effective_flops",
                 "sparsity_pruned", "sparsity_propagated", "mean_bits", "peak_memory_mb", "weight_bytes",
                 "dense_weight_bytes", "compressed_weight_bytes", "max_error", "runs", "threads", "compile_s",
                 "wall_s")


def _ratio(a: float, b: float) -> float:
    return float(a) / float(b) if b else math.nan


def resolved_batch(params: TrialParams) -> int | None:
    """The latency batch a trial runs: `params.batch`, or the workload's default (None: its example inputs).

    Example:
        >>> resolved_batch(TrialParams(workload="digits-ffn")), resolved_batch(TrialParams(batch=8))
        (256, 8)
    """
    from sparta_explore.workload import is_reference, load_workload
    from sparta_explore.zoo.registry import get_spec

    if params.batch is not None:
        return params.batch
    if not is_reference(params.workload):  # a zoo model: no need to build the model to know
        try:
            return get_spec(params.workload).default_batch
        except ConfigError:  # a registered workload of its own (the LLMs): loaded once per process
            pass
    return load_workload(params.workload).default_batch
