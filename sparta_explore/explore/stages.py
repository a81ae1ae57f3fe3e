"""A trial as a named sequence of stages over one state: compress, fine-tune, calibrate, compile, measure.

`run_trial` runs all five; the demo runs the first two. Each stage is a plain function
`(TrialState) -> None` that reads what earlier stages left and adds its own result:

* **compress**: capture the workload's model (once), prune with the trial's pruner (its
  registry entry turns the params into configs), quantize if bits < 32, extend pruning
  to dependent BatchNorms, propagate (self-checked);
* **finetune**: the model masked by the propagated table, trained under the masks;
* **calibrate**: distillation calibration of the bits, if the params ask;
* **compile**: compile the graph with the tuned weights (verified against both tables);
* **measure**: the compiled model's metric, and its latency timed call by call against
  the dense model, with dense and effective FLOPs.

Example:
    >>> state = TrialState.start(TrialParams(workload="digits-mlp"))   # doctest: +SKIP
    >>> run_stages(state, ("compress", "finetune")); state.metrics      # doctest: +SKIP
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from sparta_explore.compile.config import CompileConfig
from sparta_explore.errors import ConfigError
from sparta_explore.explore.params import FLOAT_BITS, TrialParams, format_block
from sparta_explore.graph import Graph
from sparta_explore.tesa_table import TeSATable
from sparta_explore.workload import Workload, load_workload

CALIBRATION_BITS = (16, 8, 4)


@dataclass
class TrialState:
    """What the stages share: params, workload, graph, tables, models, metrics, and the output."""

    params: TrialParams
    workload: Workload
    graph: Graph
    say: Callable[[str], None]
    cache_dir: str | os.PathLike | None = None
    compile_config: CompileConfig = field(default_factory=CompileConfig)
    runs: int = 20
    warmup: int = 3
    table: TeSATable | None = None       # what the pruner and quantizer said
    propagation: Any = None              # PropagationResult
    tuned: nn.Module | None = None       # masked by the propagated table, fine-tuned
    compiled: Any = None                 # CompiledModel
    metrics: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)

    @classmethod
    def start(cls, params: TrialParams | Mapping[str, Any], *, cache_dir: str | os.PathLike | None = None,
              echo: Callable[[str], None] | None = None, compile_config: CompileConfig | None = None,
              runs: int = 20, warmup: int = 3) -> TrialState:
        """Load the workload, capture its model once, and seed everything from `params.seed`.

        Example:
            >>> TrialState.start({"workload": "digits-mlp"}).graph.method  # doctest: +SKIP
            'fx'
        """
        from sparta_explore.graph import capture

        params = TrialParams.from_dict(params)
        workload = load_workload(params.workload, cache_dir=cache_dir)
        torch.manual_seed(params.seed)
        graph = capture(workload.dense_model(), workload.inputs, **dict(workload.capture))
        return cls(params, workload, graph, echo or (lambda line: None), cache_dir,
                   compile_config or CompileConfig(cache_dir=cache_dir), runs, warmup)

    @property
    def table_out(self) -> TeSATable:
        """The table compile runs: the propagated one."""
        return self.propagation.table

    def weights(self) -> list[str]:
        """The weight matrices of the model (what sparsity and bits statistics count)."""
        return [n for n, p in self.workload.dense_model().named_parameters() if n.endswith("weight") and p.dim() > 1
                and n in self.graph.tensors]


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


def compress(state: TrialState) -> None:
    """Prune (and quantize), then propagate; sets `table` and `propagation`."""
    from sparta_explore.propagation import run_propagation
    from sparta_explore.pruners import PruneRequest, get_pruner, prune, prune_dependent_norms

    p, w = state.params, state.workload
    entry = get_pruner(p.pruner)
    if entry.needs_evaluator and not w.can_train:
        raise ConfigError(f"pruner {p.pruner!r} trains, and workload {w.name!r} has no train_batches / loss")
    model = w.fresh_model()  # pruners that train (Taylor, Movement...) must not touch the dense model
    layers = w.prunable_modules(model)
    request = PruneRequest(p.sparsity, layers, p.layer_sparsity, p.block, p.scope)
    evaluator = w if w.can_train else None
    table = None
    for config in entry.configs_for(request, model):
        part = prune(model, config, pruner=p.pruner, evaluator=evaluator, graph=state.graph)
        table = part if table is None else table.merge(part)
    if table is None:
        from sparta_explore.pruners.registry import parameter_table

        table = parameter_table(state.graph)
    if p.bits != FLOAT_BITS:
        table = table.merge(_quantize(state, model, layers, evaluator))
    table = prune_dependent_norms(state.graph, table)
    state.table = table
    state.propagation = run_propagation(state.graph, table)
    state.metrics["trained_model"] = model
    pruned, _, _ = weight_stats(table, state.weights())
    propagated, _, _ = weight_stats(state.propagation.table, state.weights())
    state.metrics.update(sparsity_pruned=pruned, sparsity_propagated=propagated)
    state.say(f"{p.pruner} {p.sparsity:g} {format_block(p.block) or 'default'} {p.bits}b: {pruned:.1%} of weights "
              f"pruned, {propagated:.1%} after propagation")


def _quantize(state: TrialState, model: nn.Module, layers: tuple[str, ...], evaluator: Any) -> TeSATable:
    from sparta_explore.quantizers import QuantRequest, get_quantizer, quantize

    entry = get_quantizer(state.params.quantizer)
    if entry.needs_evaluator and evaluator is None:
        raise ConfigError(f"quantizer {state.params.quantizer!r} trains or calibrates, and workload "
                          f"{state.workload.name!r} has no train_batches / loss")
    table = None
    for config in entry.configs_for(QuantRequest(state.params.bits, layers, act_bits=state.params.act_bits), model):
        part = quantize(model, config, quantizer=state.params.quantizer, evaluator=evaluator, graph=state.graph)
        table = part if table is None else table.merge(part)
    return table


def finetune(state: TrialState) -> None:
    """Mask the model with the propagated table and fine-tune it under the masks; sets `tuned`."""
    from sparta_explore.masking import apply_table, masked_copy

    p, w = state.params, state.workload
    propagated = state.propagation.table
    state.metrics["dense_metric"] = w.evaluate(w.dense_model())
    tuned = masked_copy(state.metrics.pop("trained_model", w.dense_model()), propagated)
    masked = w.evaluate(tuned)
    tuned_metric = masked
    if p.finetune_epochs and w.can_train:
        # masks are re-applied after every step, so fine-tuning never revives a pruned weight
        w.train(tuned, p.finetune_epochs, seed=p.seed, after_step=lambda m: apply_table(m, propagated))
        tuned_metric = w.evaluate(tuned)
    elif p.finetune_epochs:
        state.say(f"workload {w.name!r} cannot train: fine-tuning skipped")
    state.tuned = tuned
    state.metrics.update(masked_metric=masked, finetuned_metric=tuned_metric)
    state.say(f"fine-tuned {p.finetune_epochs} epoch(s) under the masks: {w.metric_name} {masked:.4f} -> "
              f"{tuned_metric:.4f}")


def calibration_ladder(bits: int) -> tuple[int, ...]:
    """The widths calibration may lower a tensor to, starting from `bits`.

    Example:
        >>> calibration_ladder(32), calibration_ladder(8), calibration_ladder(6)
        ((16, 8, 4), (8, 4), (6, 4))
    """
    below = [b for b in CALIBRATION_BITS if b < bits]
    return tuple(sorted({*below, bits} - {FLOAT_BITS}, reverse=True))


def calibrate(state: TrialState) -> None:
    """If the params ask: lower bits by distillation calibration on the workload's validation metric."""
    p, w = state.params, state.workload
    if not p.calibrate:
        return
    from sparta_explore.propagation.report import PropagationResult
    from sparta_explore.quantizers.calibrate_config import CalibrationConfig
    from sparta_explore.quantizers.calibrate_split import calibrate_workload

    config = CalibrationConfig(bits=calibration_ladder(p.bits), threshold=p.calibrate_threshold, progress=False)
    result = calibrate_workload(state.tuned, state.propagation.table, w, config, graph=state.graph)
    result.apply_weights(state.tuned)
    prop = state.propagation
    state.propagation = PropagationResult(result.table, prop.before, prop.report, prop.check,
                                          _with_calibrated_bits(prop.input_table, result.table))
    _, mean_bits, _ = weight_stats(result.table, state.weights())
    state.say(f"calibrated bits: mean {mean_bits:.2f} bits per kept weight")


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


def compile_stage(state: TrialState) -> None:
    """Compile the fine-tuned model on the captured graph (verified against both tables)."""
    from sparta_explore.compile import compile as compile_model
    from sparta_explore.graph import capture

    start = time.perf_counter()
    inputs = state.workload.timing_inputs(state.params.batch or state.workload.default_batch)
    graph = capture(state.tuned, inputs, **dict(state.workload.capture))
    state.compiled = compile_model(graph, state.propagation, config=state.compile_config)
    state.metrics["compile_s"] = time.perf_counter() - start
    state.metrics["timing_graph"] = graph
    checks = ", ".join(f"{r.check} {r.error:.2g}" for r in state.compiled.checks.itertuples())
    state.say(f"compiled in {state.metrics['compile_s']:.1f} s, checks: {checks}")


def measure(state: TrialState) -> None:
    """The compiled model's metric, latency against the dense model (interleaved), FLOPs and memory."""
    from sparta_explore.explore.timing import interleaved_measure
    from sparta_explore.measure import count_flops

    w, graph = state.workload, state.metrics["timing_graph"]
    state.metrics["metric"] = w.evaluate(state.compiled)
    base, mine = interleaved_measure([w.dense_model(), state.compiled], graph, runs=state.runs,
                                     warmup=state.warmup)
    dense_flops, effective_flops = count_flops(state.tuned, graph)
    state.metrics.update(dense=base, compiled=mine, dense_flops=dense_flops, effective_flops=effective_flops)
    state.say(f"measured {w.metric_name} {state.metrics['metric']:.4f}, {mine.median_ms:.2f} ms vs dense "
              f"{base.median_ms:.2f} ms")


STAGES: dict[str, Callable[[TrialState], None]] = {
    "compress": compress, "finetune": finetune, "calibrate": calibrate, "compile": compile_stage, "measure": measure}


def run_stages(state: TrialState, names: Iterable[str] | None = None) -> TrialState:
    """Run the named stages (default: all, in order) on `state`; returns it.

    Example:
        >>> run_stages(TrialState.start({"workload": "digits-mlp"}), ["compress"])  # doctest: +SKIP
    """
    for name in (names if names is not None else STAGES):
        if name not in STAGES:
            raise ConfigError(f"unknown trial stage {name!r}; stages: {list(STAGES)}")
        STAGES[name](state)
    return state
