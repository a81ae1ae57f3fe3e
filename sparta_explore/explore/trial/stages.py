"""A trial as five plain stage functions, each taking and returning frozen values.

    setup = TrialSetup.start(params)                  # the workload, its model captured once
    compressed = compress(setup)                      # prune, quantize, propagate
    tuned = finetune(setup, compressed)               # masked by the propagated table, fine-tuned
    calibrated = calibrate(setup, compressed, tuned)  # bits lowered, if the params ask
    compiled = compile_stage(setup, calibrated)       # kernels, verified against both tables
    measured = measure(setup, calibrated, compiled)   # metric, latency against dense, FLOPs

`run_trial` runs all five and turns their values into one results row; the demo runs the
first two. No stage changes a value an earlier one returned: calibration works on a copy of
the fine-tuned model, compile on a graph captured from the calibrated one.

Example:
    >>> setup = TrialSetup.start(TrialParams(workload="digits-mlp"))  # doctest: +SKIP
    >>> finetune(setup, compress(setup)).metric                        # doctest: +SKIP
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from sparta_explore.compile.config import CompileConfig
from sparta_explore.errors import ConfigError
from sparta_explore.explore.trial.params import FLOAT_BITS, TrialParams, format_block
from sparta_explore.graph import Graph
from sparta_explore.tesa_table import TeSATable
from sparta_explore.workload import Workload, load_workload

if TYPE_CHECKING:  # the compiler and propagation load when their stage runs, not at import
    from sparta_explore.compile.compiled_model import CompiledModel
    from sparta_explore.compile.inplace import InPlaceCompile
    from sparta_explore.measure import Measurement
    from sparta_explore.propagation.report import PropagationResult

CALIBRATION_BITS = (16, 8, 4)


def _silent(line: str) -> None:
    """Drop a stage's progress line (the default `say`)."""


@dataclass(frozen=True)
class TrialSetup:
    """What every stage reads and none changes: the params, the workload, its captured graph, the settings.

    Example:
        >>> TrialSetup.start(TrialParams(workload="digits-mlp")).graph.method  # doctest: +SKIP
        'fx'
    """

    params: TrialParams
    workload: Workload
    graph: Graph
    compile_config: CompileConfig
    runs: int = 20
    warmup: int = 3
    say: Callable[[str], None] = _silent

    @classmethod
    def start(cls, params: TrialParams, *, workload: Workload | None = None,
              cache_dir: str | os.PathLike | None = None, echo: Callable[[str], None] | None = None,
              compile_config: CompileConfig | None = None, runs: int = 20, warmup: int = 3) -> TrialSetup:
        """Load the workload (unless given), seed everything from `params.seed`, capture the model once.

        Example:
            >>> TrialSetup.start(TrialParams(workload="digits-mlp")).workload.name  # doctest: +SKIP
            'digits-mlp'
        """
        from sparta_explore.graph import capture

        if not isinstance(params, TrialParams):
            raise ConfigError(f"a trial starts from TrialParams, got {type(params).__name__} "
                              "(use TrialParams.from_dict for a dict)")
        workload = workload if workload is not None else load_workload(params.workload, cache_dir=cache_dir)
        torch.manual_seed(params.seed)
        graph = capture(workload.dense_model(), workload.inputs, **dict(workload.capture))
        return cls(params, workload, graph, compile_config or CompileConfig(cache_dir=cache_dir), runs, warmup,
                   echo or _silent)

    def weights(self) -> list[str]:
        """The weight matrices of the model (what sparsity and bits statistics count).

        Example:
            >>> TrialSetup.start(TrialParams(workload="digits-mlp")).weights()  # doctest: +SKIP
            ['layers.0.weight', 'layers.1.weight', 'head.weight']
        """
        return [n for n, p in self.workload.dense_model().named_parameters() if n.endswith("weight") and p.dim() > 1
                and n in self.graph.tensors]


@dataclass(frozen=True)
class Compressed:
    """What `compress` returns: the pruner's (and quantizer's) table, its propagation, the model they ran on."""

    table: TeSATable                 # what the pruner and quantizer said
    propagation: PropagationResult   # the table propagated through the graph, self-checked
    trained: nn.Module               # pruners that train (Taylor, Movement...) leave their weights here
    sparsity_pruned: float
    sparsity_propagated: float


@dataclass(frozen=True)
class FineTuned:
    """What `finetune` returns: the model masked by the propagated table and fine-tuned, and its metrics."""

    model: nn.Module
    dense_metric: float
    masked_metric: float             # masked, before fine-tuning
    metric: float                    # after fine-tuning (the masked metric if it did not train)


@dataclass(frozen=True)
class Calibrated:
    """What `calibrate` returns: the propagation at the bits compile runs, and the model with those weights."""

    propagation: PropagationResult
    model: nn.Module


@dataclass(frozen=True)
class Compiled:
    """What `compile_stage` returns: the compiled model, the graph it was timed on, and how long compile took.

    `model` is a `CompiledModel`, or for a workload compiled in place (`Workload.compile_inplace`)
    a copy of the calibrated model holding the kernels; `info` is what compile reported either way.
    """

    model: CompiledModel | nn.Module
    timing_graph: Graph
    seconds: float

    @property
    def info(self) -> CompiledModel | InPlaceCompile:
        """The compile's report, checks, max_error and capped: the `CompiledModel`, or the model's `sparta_compiled`."""
        from sparta_explore.compile.inplace import ATTRIBUTE

        return getattr(self.model, ATTRIBUTE, self.model)


@dataclass(frozen=True)
class Measured:
    """What `measure` returns: the compiled model's metric, both latencies (timed alternately), FLOPs."""

    metric: float
    dense: Measurement
    compiled: Measurement
    dense_flops: float
    effective_flops: float


def weight_stats(table: Mapping[str, Any], names: list[str]) -> tuple[float, float, float]:
    """(pruned share, mean kept bits, compressed bytes) over the weights `names`.

    Example:
        >>> from sparta_explore.tesa import TeSA
        >>> t = {"w": TeSA.from_mask(torch.tensor([1, 1, 0, 0]), bits=8)}
        >>> weight_stats(t, ["w"])
        (0.5, 8.0, 2.0)
    """
    names = [n for n in names if n in table]
    total = sum(table[n].numel for n in names)
    pruned = sum(int(table[n].pruned.sum()) for n in names)
    bits = sum(float(table[n].bits.double().sum()) for n in names)
    kept = total - pruned
    return pruned / max(total, 1), bits / max(kept, 1), bits / 8.0


def compress(setup: TrialSetup) -> Compressed:
    """Prune (and quantize) a fresh copy of the model, extend pruning to dependent norms, propagate.

    Example:
        >>> compress(TrialSetup.start(TrialParams(workload="digits-mlp"))).sparsity_pruned  # doctest: +SKIP
        0.5
    """
    from sparta_explore.propagation import run_propagation
    from sparta_explore.pruners import PruneRequest, get_pruner, prune, prune_dependent_norms

    p, w = setup.params, setup.workload
    entry = get_pruner(p.pruner)
    # the workload is the evaluator of compressors that train (train_batches) or calibrate (calibration_inputs)
    evaluator = w if w.can_train or w.calibration_inputs is not None else None
    if entry.needs_evaluator and evaluator is None:
        raise ConfigError(f"pruner {p.pruner!r} trains or calibrates, and workload {w.name!r} has neither "
                          "train_batches / loss nor calibration_inputs")
    model = w.fresh_model()  # pruners that train must not touch the dense model
    layers = w.prunable_modules(model)
    request = PruneRequest(p.sparsity, layers, p.layer_sparsity, p.block, p.scope)
    table = None
    for config in entry.configs_for(request, model):
        part = prune(model, config, pruner=p.pruner, evaluator=evaluator, graph=setup.graph)
        table = part if table is None else table.merge(part)
    if table is None:
        from sparta_explore.pruners.registry import parameter_table

        table = parameter_table(setup.graph)
    if p.bits != FLOAT_BITS:
        table = table.merge(_quantize(setup, model, layers, evaluator))
    table = prune_dependent_norms(setup.graph, table)
    propagation = run_propagation(setup.graph, table)
    pruned, _, _ = weight_stats(table, setup.weights())
    propagated, _, _ = weight_stats(propagation.table, setup.weights())
    setup.say(f"{p.pruner} {p.sparsity:g} {format_block(p.block) or 'default'} {p.bits}b: {pruned:.1%} of weights "
              f"pruned, {propagated:.1%} after propagation")
    return Compressed(table, propagation, model, pruned, propagated)


def _quantize(setup: TrialSetup, model: nn.Module, layers: tuple[str, ...], evaluator: Any) -> TeSATable:
    from sparta_explore.quantizers import QuantRequest, get_quantizer, quantize

    entry = get_quantizer(setup.params.quantizer)
    if entry.needs_evaluator and evaluator is None:
        raise ConfigError(f"quantizer {setup.params.quantizer!r} trains or calibrates, and workload "
                          f"{setup.workload.name!r} has neither train_batches / loss nor calibration_inputs")
    table = None
    for config in entry.configs_for(QuantRequest(setup.params.bits, layers, act_bits=setup.params.act_bits), model):
        part = quantize(model, config, quantizer=setup.params.quantizer, evaluator=evaluator, graph=setup.graph)
        table = part if table is None else table.merge(part)
    return table


def finetune(setup: TrialSetup, compressed: Compressed) -> FineTuned:
    """A copy of the pruned model masked by the propagated table, fine-tuned under the masks.

    Example:
        >>> setup = TrialSetup.start(TrialParams(workload="digits-mlp"))  # doctest: +SKIP
        >>> finetune(setup, compress(setup)).masked_metric                  # doctest: +SKIP
    """
    from sparta_explore.masking import apply_table, masked_copy

    p, w = setup.params, setup.workload
    propagated = compressed.propagation.table
    dense = w.evaluate(w.dense_model())
    tuned = masked_copy(compressed.trained, propagated)
    masked = w.evaluate(tuned)
    metric = masked
    if p.finetune_epochs and w.can_train:
        # masks are re-applied after every step, so fine-tuning never revives a pruned weight
        w.train(tuned, p.finetune_epochs, seed=p.seed, after_step=lambda m: apply_table(m, propagated))
        metric = w.evaluate(tuned)
    elif p.finetune_epochs:
        setup.say(f"workload {w.name!r} cannot train: fine-tuning skipped")
    setup.say(f"fine-tuned {p.finetune_epochs} epoch(s) under the masks: {w.metric_name} {masked:.4f} -> "
              f"{metric:.4f}")
    return FineTuned(tuned, dense, masked, metric)


def calibration_ladder(bits: int) -> tuple[int, ...]:
    """The widths calibration may lower a tensor to, starting from `bits`.

    Example:
        >>> calibration_ladder(32), calibration_ladder(8), calibration_ladder(6)
        ((16, 8, 4), (8, 4), (6, 4))
    """
    below = [b for b in CALIBRATION_BITS if b < bits]
    return tuple(sorted({*below, bits} - {FLOAT_BITS}, reverse=True))


def calibrate(setup: TrialSetup, compressed: Compressed, tuned: FineTuned) -> Calibrated:
    """If the params ask: lower bits by distillation calibration on the workload's validation metric.

    Without `params.calibrate` the propagation and the fine-tuned model pass through unchanged.

    Example:
        >>> calibrate(setup, compressed, tuned).propagation is compressed.propagation  # doctest: +SKIP
        True
    """
    if not setup.params.calibrate:
        return Calibrated(compressed.propagation, tuned.model)
    from sparta_explore.propagation.report import PropagationResult
    from sparta_explore.quantizers.calibrate_config import CalibrationConfig
    from sparta_explore.quantizers.calibrate_split import calibrate_workload

    config = CalibrationConfig(bits=calibration_ladder(setup.params.bits), threshold=setup.params.calibrate_threshold,
                               progress=False)
    model = copy.deepcopy(tuned.model)  # the fine-tuned model stays what finetune returned
    prop = compressed.propagation
    result = calibrate_workload(model, prop.table, setup.workload, config, graph=setup.graph)
    result.apply_weights(model)
    propagation = PropagationResult(result.table, prop.before, prop.report, prop.check,
                                    _with_calibrated_bits(prop.input_table, result.table))
    _, mean_bits, _ = weight_stats(result.table, setup.weights())
    setup.say(f"calibrated bits: mean {mean_bits:.2f} bits per kept weight")
    return Calibrated(propagation, model)


def _with_calibrated_bits(user: Mapping[str, Any] | None, calibrated: TeSATable) -> TeSATable | None:
    """The user's table (their pruning) at the widths calibration chose: what compile verifies against."""
    from sparta_explore.quantizers.calibrate import lowered
    from sparta_explore.quantizers.fake_quant_model import tensor_bits

    if user is None:
        return None
    out = TeSATable()
    for name, tesa in calibrated.items():
        source = user.get(name)
        width = tensor_bits(tesa)
        out[name] = tesa if source is None else (lowered(source, width) if width < FLOAT_BITS else source)
    return out


def compile_stage(setup: TrialSetup, calibrated: Calibrated) -> Compiled:
    """Compile the calibrated model on a graph captured at the latency batch (verified against both tables).

    A workload with `compile_inplace` gets a copy of the calibrated model compiled in place
    instead (its metric runs other shapes than the timed ones); the calibrated model stays as it is.

    Example:
        >>> compile_stage(setup, calibrated).info.checks  # doctest: +SKIP
    """
    from sparta_explore.compile import compile as compile_model
    from sparta_explore.graph import capture

    start = time.perf_counter()
    w = setup.workload
    inputs = w.timing_inputs(setup.params.batch or w.default_batch)
    config, model = setup.compile_config, calibrated.model
    if w.compile_inplace:
        config, model = config.with_options(inplace=True), copy.deepcopy(model)
    graph = capture(model, inputs, **dict(w.capture))
    compiled = Compiled(compile_model(graph, calibrated.propagation, config=config), graph, 0.0)
    seconds = time.perf_counter() - start
    checks = ", ".join(f"{r.check} {r.error:.2g}" for r in compiled.info.checks.itertuples())
    setup.say(f"compiled{' in place' if w.compile_inplace else ''} in {seconds:.1f} s, checks: {checks}")
    return Compiled(compiled.model, graph, seconds)


def measure(setup: TrialSetup, calibrated: Calibrated, compiled: Compiled) -> Measured:
    """The compiled model's metric, its latency against the dense model (calls alternating), and FLOPs.

    Example:
        >>> measure(setup, calibrated, compiled).compiled.median_ms  # doctest: +SKIP
    """
    from sparta_explore.explore.trial.timing import interleaved_measure
    from sparta_explore.measure import count_flops

    w = setup.workload
    metric = w.evaluate(compiled.model)
    base, mine = interleaved_measure([w.dense_model(), compiled.model], compiled.timing_graph, runs=setup.runs,
                                     warmup=setup.warmup)
    dense_flops, effective_flops = count_flops(calibrated.model, compiled.timing_graph)
    setup.say(f"measured {w.metric_name} {metric:.4f}, {mine.median_ms:.2f} ms vs dense {base.median_ms:.2f} ms")
    return Measured(metric, base, mine, dense_flops, effective_flops)
