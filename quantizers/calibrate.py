"""Distillation-based bit calibration: SparTA's rule for lowering precision one tensor at a time.

For every weighted op in topological order, and for its weight and then its input
activation, `calibrate` lowers the tensor one rung of the bit ladder (e.g. 32 -> 16 -> 8
-> 4), tunes the op so its output matches the fp32 model's on the calibration batch
(`calibrate_tune`), and keeps the new width only if the whole model's accuracy drop
stays within the threshold; otherwise it restores the op and stops lowering that tensor.

* Numerics: the model evaluated is `fake_quant_model`, which computes what the compiled
  kernels compute (same grids, same int8 / fp32 decisions), so the accuracy measured here is
  the compiled model's accuracy, provided the tuned weights (`CalibrationResult.weights`)
  are the ones compiled.
* Calibration data: op i reads its input from the *partially quantized* model (upstream
  ops at their final bits) and its target from the fp32 model, both via one lockstep
  pass (`ActivationCache`); tuning thus also absorbs the error upstream quantization left.
  Op forward calls grow linearly with the number of ops; only `eval_fn` sees whole models.
* Activations are lowered only where they would run on the int8 kernel: at the first
  linear consumer whose weight is at <= 8 bits. Conv inputs are not lowered (no int conv kernel).
* Pruned elements stay pruned: new widths are merged (TeSA meet) into the input table.

Example:
    >>> model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    >>> x = torch.randn(64, 8)
    >>> agree = lambda m: float((m(x).argmax(1) == model(x).argmax(1)).float().mean())
    >>> t = calibrate_bits(model, None, x, agree, threshold=0.05, update_weights=False, progress=False)
    >>> t["0.weight"].kept_bits() in ([4], [8])
    True
"""

from __future__ import annotations

import difflib
import math
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from torch import nn
from tqdm.auto import tqdm

from sparta_explore.errors import ConfigError, TeSANameError
from sparta_explore.graph import Graph, capture
from sparta_explore.quantizers.activation_cache import ActivationCache, OpData
from sparta_explore.quantizers.calibrate_config import CalibrationConfig, CalibrationStep, log_frame
from sparta_explore.quantizers.calibrate_tune import TuneOutcome, tune_op
from sparta_explore.quantizers.fake_quant_model import (
    FakeQuantOp,
    WeightedOp,
    fake_quant_model,
    is_int_bits,
    op_mse,
    reference_model,
    tensor_bits,
    weighted_ops,
)
from sparta_explore.tesa import TeSA
from sparta_explore.tesa_table import TeSATable

EvalFn = Callable[[nn.Module], float]


@dataclass(frozen=True)
class CalibrationResult:
    """What `calibrate` found.

    * `table`: the input table with the accepted widths merged in.
    * `log`: one `CalibrationStep` per width tried (and per tensor left alone, with why).
    * `weights`: parameter FQN -> tuned weight values (masked, clipped to the learned scale;
      biases too if weights were tuned). Compile these, not the original weights, to get the
      accuracy measured here: `apply_weights(model)` writes them into a model.
    * `model`: the calibrated fake-quantized model (computes what the compiled model computes).
    * `accuracy_before` (fp32, pruned), `accuracy_start` (starting widths), `accuracy_after`:
      `eval_fn` of each; `seconds`: wall time of the whole calibration.
    """

    table: TeSATable
    log: tuple[CalibrationStep, ...]
    weights: dict[str, torch.Tensor]
    model: nn.Module
    accuracy_before: float
    accuracy_start: float
    accuracy_after: float
    seconds: float

    def log_frame(self) -> pd.DataFrame:
        """The log as a DataFrame (one row per step).

        Example:
            >>> result.log_frame()[["tensor", "bits", "accepted"]]  # doctest: +SKIP
        """
        return log_frame(self.log)

    def assignment(self) -> dict[str, int]:
        """Final width (widest kept element) of every tensor calibration visited, in visiting order.

        Example:
            >>> result.assignment()  # doctest: +SKIP
            {'fc1.weight': 4, 'flatten': 8, 'fc2.weight': 8, 'relu_2': 8}
        """
        return {s.tensor: tensor_bits(self.table.get(s.tensor)) for s in self.log}

    def apply_weights(self, model: nn.Module) -> nn.Module:
        """Copy the tuned weights into `model` in place (by parameter FQN); returns `model`.

        Example:
            >>> result.apply_weights(model)  # doctest: +SKIP
        """
        params = dict(model.named_parameters(remove_duplicate=False))
        missing = [n for n in self.weights if n not in params]
        if missing:
            raise TeSANameError(f"apply_weights: {type(model).__name__} has no parameters {missing}")
        with torch.no_grad():
            for name, value in self.weights.items():
                params[name].copy_(value)
        return model


def _as_inputs(calib_data: Any) -> tuple[torch.Tensor, ...]:
    inputs = (calib_data,) if isinstance(calib_data, torch.Tensor) else calib_data
    if not isinstance(inputs, (tuple, list)) or not inputs or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise ConfigError(f"calib_data must be a tensor or a tuple of tensors (the model's inputs), "
                          f"got {type(calib_data).__name__}")
    return tuple(inputs)


def _check_names(names: Iterable[str], graph: Graph, key: str) -> None:
    for name in names:
        if name not in graph.tensors:
            close = difflib.get_close_matches(name, list(graph.tensors), n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise TeSANameError(f"{key} names {name!r}, which is not a tensor of the model{hint}")


def start_table(graph: Graph, model: nn.Module, table: Mapping[str, TeSA] | None) -> TeSATable:
    """A table bound to `graph` with every parameter (32-bit unless `table` says otherwise) and `table`'s entries.

    An entry naming no tensor of the graph is a `TeSANameError` naming it.

    Example:
        >>> g = capture(nn.Linear(2, 2), torch.randn(1, 2))
        >>> start_table(g, g.root, {"weight": TeSA.dense((2, 2), bits=8)})["bias"].kept_bits()
        [32]
    """
    out = TeSATable({n: TeSA.dense(p.shape) for n, p in model.named_parameters(remove_duplicate=False)},
                    shapes=graph.shapes())
    for name, tesa in (table or {}).items():
        out[name] = tesa
    return out


def lowered(tesa: TeSA, bits: int) -> TeSA:
    """`tesa` with every kept element at no more than `bits` (int format at <= 8 bits); pruned stays pruned.

    Example:
        >>> lowered(TeSA.from_mask(torch.tensor([1, 0, 1])), 8).bit_histogram()
        {0: 1, 8: 2}
    """
    return tesa.merge(tesa.with_bits(bits, "int" if is_int_bits(bits) else None))


class _Calibrator:
    """The state of one calibration run: table, log, the fake-quantized model and its ops."""

    def __init__(self, graph: Graph, table: TeSATable, current: nn.Module, wrappers: dict[str, FakeQuantOp],
                 ops: list[WeightedOp], eval_fn: EvalFn, config: CalibrationConfig, accuracy_before: float,
                 accuracy_start: float) -> None:
        self.graph, self.table, self.current, self.wrappers = graph, table, current, wrappers
        self.eval_fn, self.config = eval_fn, config
        self.accuracy_before, self.accuracy = accuracy_before, accuracy_start
        self.log: list[CalibrationStep] = []
        self.consumers: dict[str, list[FakeQuantOp]] = {}  # activation -> linear ops reading it
        for op in ops:
            if op.linear and op.input is not None:
                self.consumers.setdefault(op.input, []).append(wrappers[op.node])
        self.done: set[str] = set()

    def note(self, tensor: str, op: WeightedOp, kind: str, note: str) -> None:
        bits = tensor_bits(self.table.get(tensor))
        self.log.append(CalibrationStep(tensor, op.module, kind, bits, bits, note=note))

    def visit(self, op: WeightedOp, data: OpData) -> None:
        """Lower `op`'s weight, then its input activation if the int8 kernel would read it."""
        if op.weight in self.config.exclude:
            self.note(op.weight, op, "weight", "excluded")
        else:
            self.lower(op, data, op.weight, "weight", [self.wrappers[op.node]])
        x = op.input
        if x is None or x in self.done:
            return
        if not op.linear:
            if x not in self.consumers:
                self.done.add(x)
                self.note(x, op, "activation", "not lowered: conv inputs run in fp32 (no integer conv kernel)")
            return
        if x in self.config.exclude:
            self.done.add(x)
            self.note(x, op, "activation", "excluded")
        elif is_int_bits(self.wrappers[op.node].weight_bits):
            self.done.add(x)  # decided here: later consumers see the width chosen now
            self.lower(op, data, x, "activation", self.consumers[x])

    def finish(self, ops: list[WeightedOp]) -> None:
        """Log the activations no consumer could run in int8 (every linear reading them kept fp32 weights)."""
        for op in ops:
            if op.input in self.consumers and op.input not in self.done:
                self.done.add(op.input)
                self.note(op.input, op, "activation",
                          "not lowered: every linear reading it keeps fp32 weights (no int8 kernel)")

    def _set(self, kind: str, affected: list[FakeQuantOp], bits: int) -> None:
        for w in affected:
            if kind == "weight":
                w.weight_bits = bits
                if not is_int_bits(bits):
                    w.clip.fill_(1.0)  # fp32 weights are never clipped
            else:
                w.act_bits = bits

    def lower(self, op: WeightedOp, data: OpData, tensor: str, kind: str, affected: list[FakeQuantOp]) -> None:
        """Step `tensor` down the ladder while the accuracy drop stays within the threshold."""
        start = tensor_bits(self.table.get(tensor))
        rungs = [b for b in self.config.ladder if b < start]
        if not rungs:
            self.note(tensor, op, kind, f"already at {start} bits")
            return
        wrapper = self.wrappers[op.node]
        for bits in rungs:
            before = tensor_bits(self.table.get(tensor))
            saved = [(w, w.weight_bits, w.act_bits, w.clip.clone(), w.inner.weight.detach().clone(),
                      None if w.inner.bias is None else w.inner.bias.detach().clone()) for w in {*affected, wrapper}]
            self._set(kind, affected, bits)
            if not is_int_bits(bits) and not is_int_bits(before):
                # both widths run in fp32, so the model computes exactly what it did: no need to evaluate it
                mse = op_mse(wrapper, data.input, data.target)
                outcome = TuneOutcome(mse, mse, f"{bits} bits run as fp32: numerics unchanged")
                accuracy = self.accuracy
            else:
                outcome = tune_op(wrapper, data.input, data.target, self.config)
                accuracy = float(self.eval_fn(self.current))
            drop = self.accuracy_before - accuracy
            accepted = math.isfinite(drop) and drop <= self.config.threshold
            self.log.append(CalibrationStep(tensor, op.module, kind, before, bits, outcome.mse_before,
                                            outcome.mse_after, accuracy, drop, accepted, outcome.note))
            if not accepted:
                self._restore(saved)
                return
            self.accuracy = accuracy
            current = self.table.get(tensor)
            self.table[tensor] = lowered(self._dense(tensor) if current is None else current, bits)

    def _dense(self, name: str) -> TeSA:
        shape = self.graph.tensors[name].shape
        return TeSA.dense((1, *shape[1:]) if shape else shape)  # activations: batch dim kept at 1

    @staticmethod
    def _restore(saved: list) -> None:
        with torch.no_grad():
            for w, wb, ab, clip, weight, bias in saved:
                w.weight_bits, w.act_bits = wb, ab
                w.clip.copy_(clip)
                w.inner.weight.copy_(weight)
                if bias is not None:
                    w.inner.bias.copy_(bias)


def calibrate(model: nn.Module, table: Mapping[str, TeSA] | None, calib_data: Any, eval_fn: EvalFn,
              config: CalibrationConfig = CalibrationConfig(), *, graph: Graph | None = None) -> CalibrationResult:
    """Find a mixed-precision assignment whose accuracy drop stays within `config.threshold`.

    `table` holds the starting widths (e.g. what an NNI quantizer emitted, merged with the
    pruning table) or None for 32 bits everywhere; `calib_data` is the model's input on
    the calibration batch; `eval_fn(model) -> accuracy` scores a whole model (use data
    other than the test split). `model` is not modified. `graph` (from `capture`) names the
    tensors; it is captured on `calib_data` if not given.

    Example:
        >>> r = calibrate(model, table, x_calib, accuracy_on(x_val, y_val))  # doctest: +SKIP
        >>> r.accuracy_before - r.accuracy_after <= 0.01  # doctest: +SKIP
        True
    """
    start = time.perf_counter()
    if not callable(eval_fn):
        raise ConfigError(f"eval_fn must be callable (model -> accuracy), got {type(eval_fn).__name__}")
    inputs = _as_inputs(calib_data)
    graph = graph if graph is not None else capture(model, inputs)
    _check_names(config.exclude, graph, "CalibrationConfig.exclude")
    table = start_table(graph, model, table)
    ops = weighted_ops(graph)
    reference = reference_model(graph, model, table)
    current, wrappers = fake_quant_model(graph, table, model, ops)
    accuracy_before, accuracy_start = float(eval_fn(reference)), float(eval_fn(current))
    if accuracy_before - accuracy_start > config.threshold:
        warnings.warn(f"calibrate: the starting widths already drop accuracy by {accuracy_before - accuracy_start:.4f} "
                      f"(> threshold {config.threshold}); widths are never raised, so nothing more will be lowered",
                      stacklevel=2)
    run = _Calibrator(graph, table, current, wrappers, ops, eval_fn, config, accuracy_before, accuracy_start)
    cache = ActivationCache(reference, current, inputs)
    with tqdm(ops, desc="calibrate", unit="op", disable=not config.progress) as bar:
        for op in bar:
            bar.set_postfix_str(op.module)
            run.visit(op, cache.at(op.node))
    run.finish(ops)
    accuracy_after = float(eval_fn(current))
    weights: dict[str, torch.Tensor] = {}
    for op in ops:
        w = wrappers[op.node]
        weights[op.weight] = w.effective_weight().detach().clone()
        if config.tune_weights and op.bias is not None:
            weights[op.bias] = w.effective_bias().detach().clone()
    return CalibrationResult(run.table, tuple(run.log), weights, current, accuracy_before, accuracy_start,
                             accuracy_after, time.perf_counter() - start)


def calibrate_bits(model: nn.Module, table: Mapping[str, TeSA] | None, calib_data: Any, eval_fn: EvalFn,
                   threshold: float = 0.01, bits: tuple[int, ...] = (16, 8, 4), *, graph: Graph | None = None,
                   update_weights: bool = True, progress: bool = True) -> TeSATable:
    """`calibrate` with the default tuning, returning only the table.

    With `update_weights` (default) the weight scales are tuned and the tuned weight values
    are written into `model` in place (pruned ones zeroed), so that compiling `model` with
    the returned table gives the calibrated accuracy. With `update_weights=False` nothing
    is tuned, `model` is left as it is, and the table holds for the kernels' plain
    max|row| / qmax scales.

    Example:
        >>> table = calibrate_bits(model, prune_table, x_calib, accuracy_on(x_val, y_val))  # doctest: +SKIP
    """
    config = CalibrationConfig(bits=tuple(bits), threshold=threshold, tune_scales=update_weights, progress=progress)
    result = calibrate(model, table, calib_data, eval_fn, config, graph=graph)
    if update_weights:
        result.apply_weights(model)
    return result.table
