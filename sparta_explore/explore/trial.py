"""One exploration trial: params in, one measured results row out.

`run_trial(params)` runs the whole flow on an embedded digits model: load (or train) it,
prune, quantize, propagate, optionally calibrate bits, fine-tune under the masks, compile,
verify, measure the compiled and the dense model's latency on this machine, and score the
compiled model's accuracy on the held-out digits.

`TrialResult.as_row()` is one flat, JSON-able row with these columns (`ROW_COLUMNS`):

* key, params_json: the sweep key (hash) and canonical JSON of the params as given;
* the params as run (NNI issue 5726: the echo is what ran): model, pruner, sparsity,
  layer_sparsity ("layers.0:0.9;layers.1:0.5", empty without overrides), scope, block
  ("32x32" or ""), bits, quantizer, calibrate, calibrate_threshold, finetune_epochs,
  batch (resolved), seed, objective, target;
* accuracy (the compiled model), finetuned_accuracy (masked fp32 model after fine-tuning),
  masked_accuracy (after propagation, before fine-tuning), dense_accuracy;
* latency_ms, latency_p10_ms, latency_p90_ms (compiled), dense_latency_ms (PyTorch dense,
  timed in the same trial, call by call alternating with the compiled model),
  speedup (dense / compiled), latency_ratio (compiled / dense);
* dense_flops, effective_flops (nonzero weights only; 2 per MAC), flops_ratio;
* sparsity_pruned / sparsity_propagated: share of prunable weights pruned by the pruner /
  after propagation; mean_bits: mean bit width of the kept weights;
* peak_memory_mb, weight_bytes (compiled module), dense_weight_bytes, compressed_weight_bytes
  (kept weights at their bits, no index overhead);
* max_error (compiled vs reference, from compile), kernel_choices ("op:choice;..."),
  fallbacks (ops where compile rejected a kernel or left the op as is; see compile_report notes);
* runs, threads, compile_s, wall_s, score (`objectives.score` for params.objective / target).

Example:
    >>> result = run_trial({"sparsity": 0.75, "block": "32x32", "bits": 8})  # doctest: +SKIP
    >>> result.as_row()["latency_ms"], result.score                          # doctest: +SKIP
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import nn

from sparta_explore.errors import ConfigError
from sparta_explore.explore.objectives import score as objective_score
from sparta_explore.explore.params import FLOAT_BITS, TrialParams, format_block
from sparta_explore.tesa_table import TeSATable
from sparta_explore.zoo.registry import classifier_head

CALIBRATION_BITS = (16, 8, 4)  # the rungs distillation calibration steps down through
ROW_COLUMNS = (
    "key", "params_json", "model", "pruner", "sparsity", "layer_sparsity", "scope", "block", "bits", "quantizer",
    "calibrate", "calibrate_threshold",
    "finetune_epochs", "batch", "seed", "objective", "target",
    "accuracy", "finetuned_accuracy", "masked_accuracy", "dense_accuracy",
    "latency_ms", "latency_p10_ms", "latency_p90_ms", "dense_latency_ms", "speedup", "latency_ratio",
    "dense_flops", "effective_flops", "flops_ratio", "sparsity_pruned", "sparsity_propagated", "mean_bits",
    "peak_memory_mb", "weight_bytes", "dense_weight_bytes", "compressed_weight_bytes",
    "max_error", "kernel_choices", "fallbacks", "runs", "threads", "compile_s", "wall_s", "score",
)


@dataclass(frozen=True)
class TrialResult:
    """What one trial measured; `as_row()` flattens it into a results row (see `ROW_COLUMNS`).

    `table` (the propagated TeSATable) and `compile_report` (one row per op) stay out of
    the row but are kept for inspection.

    Example:
        >>> r = TrialResult(TrialParams(model="digits-mlp", batch=8), **dict.fromkeys(METRIC_FIELDS, 1.0))
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
    table: TeSATable | None = field(default=None, repr=False, compare=False)
    compile_report: pd.DataFrame | None = field(default=None, repr=False, compare=False)

    @property
    def score(self) -> float:
        """The params' objective at the params' target (what an NNI tuner maximizes).

        Example:
            >>> TrialResult(TrialParams(model="digits-mlp"), **dict.fromkeys(METRIC_FIELDS, 1.0)).score
            0.0
        """
        return objective_score(self._metrics(), self.params.objective, self.params.target)

    def _metrics(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in METRIC_FIELDS}
        out["kernel_choices"], out["fallbacks"] = self.kernel_choices, int(self.fallbacks)
        return out

    def as_row(self) -> dict[str, Any]:
        """One flat, JSON-able results row with the columns of `ROW_COLUMNS`, in that order.

        Example:
            >>> row = TrialResult(TrialParams(model="digits-mlp"), **dict.fromkeys(METRIC_FIELDS, 2.0)).as_row()
            >>> list(row) == list(ROW_COLUMNS), row["batch"]
            (True, 64)
        """
        p = self.params
        echo = p.to_dict()
        echo["block"] = format_block(p.block)
        echo["batch"] = resolved_batch(p)
        echo["layer_sparsity"] = ";".join(f"{name}:{s:g}" for name, s in p.layer_sparsity)  # flat for CSV
        m = self._metrics()
        m["speedup"] = _ratio(m["dense_latency_ms"], m["latency_ms"])
        m["latency_ratio"] = _ratio(m["latency_ms"], m["dense_latency_ms"])
        m["flops_ratio"] = _ratio(m["effective_flops"], m["dense_flops"])
        m["score"] = self.score
        row = {"key": p.key, "params_json": p.canonical_json(), **echo, **m}
        return {c: row[c] for c in ROW_COLUMNS}


METRIC_FIELDS = ("accuracy", "finetuned_accuracy", "masked_accuracy", "dense_accuracy", "latency_ms",
                 "latency_p10_ms", "latency_p90_ms", "dense_latency_ms", "dense_flops", "effective_flops",
                 "sparsity_pruned", "sparsity_propagated", "mean_bits", "peak_memory_mb", "weight_bytes",
                 "dense_weight_bytes", "compressed_weight_bytes", "max_error", "runs", "threads", "compile_s",
                 "wall_s")


def _ratio(a: float, b: float) -> float:
    return float(a) / float(b) if b else math.nan


def resolved_batch(params: TrialParams) -> int:
    """The latency batch a trial runs: `params.batch`, or the model's default batch.

    Example:
        >>> resolved_batch(TrialParams(model="digits-ffn")), resolved_batch(TrialParams(batch=8))
        (256, 8)
    """
    from sparta_explore.zoo.registry import get_spec

    return params.batch if params.batch is not None else get_spec(params.model).default_batch


def prune_config(params: TrialParams, model: nn.Module) -> tuple[Any, tuple[str, ...]]:
    """The pruner config `params` asks for, and the modules left dense (the classifier head).

    Example:
        >>> cfg, exclude = prune_config(TrialParams(block=(1, 32)), nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)))
        >>> cfg.block, exclude
        ((1, 32), ('1',))
    """
    from sparta_explore.pruners import BlockPruneConfig, NMPruneConfig, NNIPruneConfig, get_pruner

    exclude = tuple(filter(None, [classifier_head(model)]))
    name = get_pruner(params.pruner).name
    if name == "block":
        if params.block is None:
            raise ConfigError("the block pruner needs a block shape (block=None asks for the pruner's default)")
        return BlockPruneConfig(params.sparsity, params.block, exclude_op_names=exclude, scope=params.scope), exclude
    if name == "nm":
        m = params.block[1] if params.block is not None else 4
        n = m * (1.0 - params.sparsity)
        if abs(n - round(n)) > 1e-9 or round(n) < 1:
            raise ConfigError(f"N:M pruning keeps n of every m={m} weights: sparsity {params.sparsity} gives "
                              f"n={n:g}, not a positive integer (block=(1, m) sets m)")
        return NMPruneConfig(round(n), m, exclude_op_names=exclude), exclude
    has_bn = any(isinstance(mod, nn.BatchNorm2d) for mod in model.modules())
    op_types = ("BatchNorm2d",) if name == "slim" and has_bn else ("Linear", "Conv2d")
    cfg = NNIPruneConfig(params.sparsity, op_types=op_types, exclude_op_names=exclude,
                         granularity="default" if params.block is None else params.block)
    if params.scope == "global":
        # NNI ranks every target of one global group together: one sparsity over all layers
        return [{**entry, "global_group_id": 0} for entry in cfg.to_config_list()], exclude
    return cfg, exclude


def prune_configs(params: TrialParams, model: nn.Module) -> tuple[list[Any], tuple[str, ...]]:
    """Like `prune_config`, with `params.layer_sparsity` overrides: the configs to prune with, in turn.

    Block pruner: one config for the layers at `sparsity` plus one per overridden layer
    (their tables merge). NNI pruners: one config list holding an entry per overridden
    layer, so training-aware pruners still prune everything in one pass.

    Example:
        >>> m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2))
        >>> cfgs, _ = prune_configs(TrialParams.from_dict({"block": "1x4", "sparsity@1": 0.75}), m)
        >>> [(c.sparsity, c.op_names, c.exclude_op_names) for c in cfgs]
        [(0.5, None, ('2', '1')), (0.75, ('1',), ())]
    """
    base, exclude = prune_config(params, model)
    if not params.layer_sparsity:
        return [base], exclude
    from sparta_explore.pruners import NNIPruneConfig, get_pruner

    layers = dict(params.layer_sparsity)
    known = {name for name, mod in model.named_modules() if isinstance(mod, (nn.Linear, nn.Conv2d))}
    bad = sorted(set(layers) - known)
    if bad:
        raise ConfigError(f"layer_sparsity names {bad}, not Linear/Conv2d modules of {params.model!r}; "
                          f"choose from {sorted(known)}")
    if params.scope == "global":
        raise ConfigError("layer_sparsity and scope='global' conflict: global ranking picks each layer's sparsity")
    rest = (*exclude, *layers)
    base_left = bool(known - set(rest))  # some layer still takes `sparsity` (every one may be overridden)
    name = get_pruner(params.pruner).name
    if name == "block":
        return [*([dataclasses.replace(base, exclude_op_names=rest)] if base_left else []),
                *(dataclasses.replace(base, sparsity=s, op_names=(layer,), exclude_op_names=()) for layer, s
                  in layers.items())], exclude
    if not isinstance(base, NNIPruneConfig):
        raise ConfigError(f"pruner {params.pruner!r} does not take per-layer sparsity")
    entries = dataclasses.replace(base, exclude_op_names=rest).to_config_list() if base_left else []
    for layer, s in layers.items():
        entries += dataclasses.replace(base, sparsity=s, op_names=(layer,), exclude_op_names=()).to_config_list()
    return [entries], exclude


def quant_config(params: TrialParams, exclude: tuple[str, ...]) -> Any:
    """The quantizer config for `params.bits` (weights and layer inputs), head left fp32.

    Example:
        >>> quant_config(TrialParams(bits=4), ("head",)).weight_bits
        4
    """
    from sparta_explore.quantizers import NNIQuantConfig, UniformQuantConfig, get_quantizer

    if get_quantizer(params.quantizer).name == "uniform":
        # the int8 kernels quantize weights and activations symmetrically (fake_quant)
        return UniformQuantConfig(weight_bits=params.bits, activation_bits=params.bits, activation_fmt="int",
                                  exclude_op_names=exclude)
    return NNIQuantConfig(weight_bits=params.bits, activation_bits=params.bits, exclude_op_names=exclude)


def weight_stats(table: Mapping[str, Any], names: list[str]) -> tuple[float, float, float]:
    """(pruned share, mean kept bits, compressed bytes) over the weights `names`.

    Example:
        >>> from sparta_explore.tesa import TeSA
        >>> t = {"w": TeSA.from_mask(torch.tensor([1, 1, 0, 0]), bits=8)}
        >>> weight_stats(t, ["w"])
        (0.5, 8.0, 2.0)
    """
    total = sum(table[n].numel for n in names)
    pruned = sum(int(table[n].pruned.sum()) for n in names)
    bits = sum(float(table[n].bits.double().sum()) for n in names)
    kept = total - pruned
    return pruned / max(total, 1), bits / max(kept, 1), bits / 8.0


def latency_inputs(x: torch.Tensor, batch: int) -> tuple[torch.Tensor]:
    """`batch` real examples (the test images, repeated if there are fewer): real data for timing.

    Example:
        >>> latency_inputs(torch.arange(3.0).reshape(3, 1), 5)[0].flatten().tolist()
        [0.0, 1.0, 2.0, 0.0, 1.0]
    """
    reps = -(-batch // len(x))
    return (x.repeat(reps, *([1] * (x.dim() - 1)))[:batch].contiguous(),)


def run_trial(params: TrialParams | Mapping[str, Any], *, cache_dir: str | os.PathLike | None = None,
              data: Any = None, runs: int = 20, warmup: int = 3, compile_kwargs: Mapping[str, Any] | None = None,
              echo: Callable[[str], None] | None = None) -> TrialResult:
    """Prune, quantize, propagate, (calibrate,) fine-tune, compile, verify and measure one setting.

    `params` is a `TrialParams` or a dict of its fields (NNI parameters). `data` defaults
    to the bundled digits split; `runs` / `warmup` are the timed / untimed forward calls
    per latency measurement; `compile_kwargs` go to `compile` (e.g. a `device` profile,
    `tune=False`); `echo` receives one line per stage (pruned + propagated, fine-tuned,
    calibrated if asked, compiled, measured).

    Example:
        >>> r = run_trial({"model": "digits-mlp", "block": "1x32", "sparsity": 0.75})  # doctest: +SKIP
        >>> r.accuracy, r.latency_ms, r.dense_latency_ms  # doctest: +SKIP
    """
    from sparta_explore.explore.timing import interleaved_measure
    from sparta_explore.graph import capture
    from sparta_explore.masking import apply_table, masked_copy
    from sparta_explore.measure import count_flops
    from sparta_explore.propagation import run_propagation
    from sparta_explore.pruners import get_pruner, prune, prune_dependent_norms
    from sparta_explore.quantizers import get_quantizer, quantize
    from sparta_explore.zoo import TrainConfig, evaluate, load_digits_split, pretrained, train

    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ConfigError(f"runs must be an int >= 1 (timed calls per latency measurement), got {runs!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ConfigError(f"warmup must be an int >= 0, got {warmup!r}")
    start = time.perf_counter()
    say = echo or (lambda line: None)
    params = TrialParams.from_dict(params)
    get_pruner(params.pruner)  # bad names fail before any training
    get_quantizer(params.quantizer)
    batch = resolved_batch(params)
    data = data if data is not None else load_digits_split()
    torch.manual_seed(params.seed)

    dense, dense_acc = pretrained(params.model, cache_dir=cache_dir, data=data)
    graph = capture(dense, (data.test_x[:1],))
    prune_cfgs, exclude = prune_configs(params, dense)
    model = copy.deepcopy(dense)  # pruners that train (Taylor, Movement...) must not touch `dense`
    table = prune(model, prune_cfgs[0], pruner=params.pruner, evaluator=data, graph=graph)
    for cfg in prune_cfgs[1:]:
        table = table.merge(prune(model, cfg, pruner=params.pruner, evaluator=data, graph=graph))
    if params.bits != FLOAT_BITS:
        qcfg = quant_config(params, exclude)
        table = table.merge(quantize(model, qcfg, quantizer=params.quantizer, evaluator=data, graph=graph))
    table = prune_dependent_norms(graph, table)
    propagated = run_propagation(graph, table).table
    weights = [n for n, p in model.named_parameters() if n.endswith("weight") and p.dim() > 1]
    pruned_share, _, _ = weight_stats(table, weights)
    prop_share, _, _ = weight_stats(propagated, weights)
    say(f"{params.pruner} {params.sparsity:g} {format_block(params.block) or 'default'} {params.bits}b: "
        f"{pruned_share:.1%} of weights pruned, {prop_share:.1%} after propagation")

    tuned = masked_copy(model, propagated)
    masked_acc = evaluate(tuned, data.test_x, data.test_y)
    tuned_acc = masked_acc
    if params.finetune_epochs:
        # masks are re-applied after every step, so fine-tuning never revives a pruned weight
        tuned_acc = train(tuned, data, TrainConfig(epochs=params.finetune_epochs, lr=1e-3, seed=params.seed),
                          after_step=lambda m: apply_table(m, propagated))
    say(f"fine-tuned {params.finetune_epochs} epoch(s) under the masks: test accuracy {masked_acc:.4f} -> "
        f"{tuned_acc:.4f}")
    if params.calibrate:
        # after fine-tuning: calibration tunes quantization scales that further training would undo
        propagated = calibrate_trial(tuned, propagated, data, params, graph)
    _, mean_bits, packed = weight_stats(propagated, weights)
    if params.calibrate:
        say(f"calibrated bits: mean {mean_bits:.2f} bits per kept weight")

    from sparta_explore.compile import compile as compile_model  # the latest stage a trial uses

    x = latency_inputs(data.test_x, batch)
    t0 = time.perf_counter()
    compiled = compile_model(tuned, propagated, x, cache_dir=cache_dir, **dict(compile_kwargs or {}))
    compile_s = time.perf_counter() - t0
    say(f"compiled in {compile_s:.1f} s, max error {compiled.max_error:.2g}")
    accuracy = evaluate(compiled, data.test_x, data.test_y, batch_size=batch)
    base, mine = interleaved_measure([dense, compiled], x, runs=runs, warmup=warmup)
    dense_flops, effective_flops = count_flops(tuned, x)  # what a FLOPs-guided search believes
    report = compiled.report
    choices, fallbacks = _choices(report)
    say(f"measured ({choices}): accuracy {accuracy:.4f}, {mine.median_ms:.2f} ms vs dense {base.median_ms:.2f} ms")
    return TrialResult(
        params=params, accuracy=accuracy, finetuned_accuracy=tuned_acc, masked_accuracy=masked_acc,
        dense_accuracy=dense_acc, latency_ms=mine.median_ms, latency_p10_ms=mine.p10_ms, latency_p90_ms=mine.p90_ms,
        dense_latency_ms=base.median_ms, dense_flops=dense_flops, effective_flops=effective_flops,
        sparsity_pruned=pruned_share, sparsity_propagated=prop_share, mean_bits=mean_bits,
        peak_memory_mb=mine.peak_memory_mb, weight_bytes=mine.weight_bytes, dense_weight_bytes=base.weight_bytes,
        compressed_weight_bytes=packed, max_error=float(compiled.max_error), runs=runs,
        threads=mine.threads, compile_s=compile_s, wall_s=time.perf_counter() - start, kernel_choices=choices,
        fallbacks=fallbacks, table=propagated, compile_report=report)


def _choices(report: pd.DataFrame) -> tuple[str, int]:
    # an op with notes had a candidate rejected (build, check or fusion failed) or was left as is
    if len(report) == 0:
        return "", 0
    choices = ";".join(f"{op}:{choice}" for op, choice in zip(report["op"], report["choice"]))
    notes = report["notes"].fillna("").astype(str) if "notes" in report else pd.Series([], dtype=str)
    return choices, int((notes != "").sum())


def calibration_ladder(bits: int) -> tuple[int, ...]:
    """The widths calibration may lower a tensor to, starting from `bits`.

    Example:
        >>> calibration_ladder(32), calibration_ladder(8), calibration_ladder(6)
        ((16, 8, 4), (8, 4), (6, 4))
    """
    below = [b for b in CALIBRATION_BITS if b < bits]
    return tuple(sorted({*below, bits} - {FLOAT_BITS}, reverse=True))


def calibrate_trial(model: nn.Module, table: TeSATable, data: Any, params: TrialParams, graph: Any) -> TeSATable:
    """Lower bits by distillation calibration; tunes `model`'s weights in place; returns the new table.

    Bits are chosen on training digits only (the first 256 as calibration input, the last
    384 to score accuracy), so the test split reported by the trial never picks them.

    Example:
        >>> table = calibrate_trial(model, table, load_digits_split(), TrialParams(bits=8), graph)  # doctest: +SKIP
    """
    from sparta_explore.quantizers.calibrate import calibrate
    from sparta_explore.quantizers.calibrate_config import CalibrationConfig
    from sparta_explore.zoo import evaluate

    val_x, val_y = data.train_x[-384:], data.train_y[-384:]
    config = CalibrationConfig(bits=calibration_ladder(params.bits), threshold=params.calibrate_threshold,
                               progress=False)
    result = calibrate(model, table, data.train_x[:256], lambda m: evaluate(m, val_x, val_y), config, graph=graph)
    result.apply_weights(model)
    return result.table
