"""The input every planned op reads, recorded from one run of the graph: what candidates are checked and timed on.

A run on the example's first item serves (`record_run(..., one_item=True)`): no kernel's speed depends on the
values it reads (fp32 products, int8 rows quantized whatever their range), and a candidate's check compares it
with its own reference on the same input, so each op's input is that item's repeated to the example's batch.
The run costs a fraction of the example's (BERT-base at 8 x 128: 0.15 of 1 s); only the whole example's
output can stand in for the fp32 reference ops' run in the checks. Where the graph's inputs share no batch
size over 1, the graph fails on one item, or an op's input with one item is not its recorded shape divided
along dim 0, the example runs whole.

Example:
    >>> record_run(graph, list(plan.ops.values())).inputs["fc1"].shape  # doctest: +SKIP
    torch.Size([64, 784])
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from sparta_explore.graph import Graph
from sparta_explore.plan import OpPlan


class _InputRecorder(fx.Interpreter):
    """Runs the graph once and keeps the activation each planned op reads (and the node it comes from)."""

    def __init__(self, gm: fx.GraphModule, wanted: Mapping[str, int]) -> None:
        super().__init__(gm)
        self.wanted, self.seen, self.sources = wanted, {}, {}

    def run_node(self, n: fx.Node) -> Any:
        if n.name in self.wanted:
            args, _ = self.fetch_args_kwargs_from_env(n)
            self.seen[n.name] = args[self.wanted[n.name]].detach()
            source = n.args[self.wanted[n.name]] if len(n.args) > self.wanted[n.name] else None
            self.sources[n.name] = source.name if isinstance(source, fx.Node) else None
        return super().run_node(n)


class OpInputs(Mapping[str, torch.Tensor]):
    """Each op's recorded input by op; from a run on one item, that item repeated `batch` times along dim 0, made
    when asked for (the last one kept): holding every op's full input at once was 340 MB of fresh pages in a
    BERT-base compile, a tenth of a second. `shape` answers without making one.

    Example:
        >>> OpInputs({"fc": torch.ones(1, 4)}, batch=3)["fc"].shape
        torch.Size([3, 4])
    """

    def __init__(self, recorded: Mapping[str, torch.Tensor], batch: int = 1) -> None:
        self._recorded, self._batch = dict(recorded), int(batch)
        self._last: tuple[str, torch.Tensor] | None = None

    def __getitem__(self, op: str) -> torch.Tensor:
        x = self._recorded[op]
        if self._batch == 1:
            return x
        if self._last is None or self._last[0] != op:  # ops are asked for one after another: keep one
            self._last = (op, x.repeat(self._batch, *([1] * (x.dim() - 1))))
        return self._last[1]

    def __iter__(self) -> Iterator[str]:
        return iter(self._recorded)

    def __len__(self) -> int:
        return len(self._recorded)

    def shape(self, op: str) -> tuple[int, ...]:
        """The shape of `op`'s input (`self[op].shape`, nothing made)."""
        x = self._recorded[op]
        return (x.shape[0] * self._batch, *x.shape[1:]) if x.dim() else ()


@dataclass(frozen=True)
class RecordedRun:
    """One run of a graph: the input each planned op read (by op), and, from a run on the whole example, the
    model's output and the run's wall seconds (None after a run on one item). For an fp32 table that output is
    what the checks' reference ops compute: a compile takes it from here instead of running the model again."""

    inputs: OpInputs
    output: Any = None
    seconds: float | None = None


def _one_item(graph: Graph, wanted: Mapping[str, int]) -> OpInputs | None:
    """Each op's input from a run on the example's first item, repeated to the example's size; None where that
    run is not the example's with one item (see the module docstring)."""
    recorder = _InputRecorder(graph.module, wanted)
    batch = graph.run_first_item(recorder)
    if batch is None:
        return None
    for op, x in recorder.seen.items():
        info = graph.tensors.get(recorder.sources.get(op) or "")
        if info is None or x.dim() == 0 or tuple(info.shape) != (batch * x.shape[0], *x.shape[1:]):
            return None
    return OpInputs(recorder.seen, batch) if len(recorder.seen) == len(wanted) else None


def record_run(graph: Graph, ops: list[OpPlan], one_item: bool = False) -> RecordedRun:
    """The input each op of `ops` reads when `graph` runs on its example inputs, and the run's output and
    seconds; `one_item`: from a run on the first item where that serves (see the module docstring).

    Example:
        >>> record_run(graph, list(plan.ops.values()), one_item=True).output is None  # doctest: +SKIP
        True
    """
    wanted = {op.op: op.site.input_index for op in ops}
    if one_item and wanted:
        inputs = _one_item(graph, wanted)
        if inputs is not None:
            return RecordedRun(inputs)
    recorder = _InputRecorder(graph.module, wanted)
    start = time.perf_counter()
    with torch.inference_mode():
        output = recorder.run(*graph.example_inputs)
    return RecordedRun(OpInputs(recorder.seen), output, time.perf_counter() - start)
