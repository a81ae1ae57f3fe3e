"""The checks every compiled model passes before it is returned, and what runs when one fails.

* **ops**: the compiled model against the same graph with every compiled op running its
  PyTorch reference (for fp32 kernels: the passes' model before kernels, which computes the
  same, its outputs from the run that recorded the ops' inputs). A failure means a kernel
  bug: every op then runs its reference. Where that reference graph would be a model run of
  its own (quantized ops), it runs only when a table check fails; until then its row reads
  NaN: the table checks already compare the compiled model with the user's.
* **table**: against the model masked with the table it was given (weights on their
  grids where the table asks for <= 8 bits; `table_reference`), i.e. the captured graph
  before any graph pass: passes and kernels together are checked against the user's model.
* **input table**: when given a `PropagationResult`, also against the table propagation
  started from: what the pruner and quantizer said, the reference a user can trust. Where
  propagation pruned further (the two masked models differ), this is the check that must
  pass; the table's check then runs only to explain a failure (its row reads NaN until
  then): a model matching the user's table is right whatever the derived one says.

If a table check fails, the compiled model runs that trusted reference instead (with a
`CompileWarning`): never a wrong answer.

Example:
    >>> gm, rows = verified_module(graph, gm, execution, compiled, references, tol, verify=True)  # doctest: +SKIP
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.utils import _pytree as pytree

from sparta_explore.compile.choose import CompileWarning, relative_error
from sparta_explore.compile.item_call import ItemCall
from sparta_explore.compile.table_reference import InputGrid
from sparta_explore.graph import Graph
from sparta_explore.plan import ExecutionPlan
from sparta_explore.tracing.copying import deep_copy


class ReferenceOp(nn.Module):
    """Runs a compiled op's PyTorch reference instead of its kernel."""

    def __init__(self, op: nn.Module) -> None:
        super().__init__()
        self.op = op

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.op.reference(*args)


def tensor_leaves(out: Any) -> list[torch.Tensor]:
    """The floating-point tensors in a model's output (any nesting)."""
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]


@dataclass(frozen=True)
class _Run:
    """One call of a module made here: its floating outputs, wall seconds and `InputGrid` seconds, and whether it
    ran on the item (`ItemCall`) rather than the whole example."""

    module: nn.Module
    outputs: list[torch.Tensor]
    seconds: float
    rounding: float = 0.0
    on_item: bool = False


class ModelOutputs:
    """Outputs of modules called like `graph`'s model, each module run once: a compile's checks compare the
    compiled model with four references and the guard's picks with the trusted one (BERT-base: 1 s a run).

    `item` (`compile/item_call.py`): modules marked with `on_item` run on that item only, and a comparison
    with a whole-example output cuts that output to the item; one that exceeds `tol` there is redone on the
    whole example (so only a pass is decided on the item).

    Example:
        >>> outputs = ModelOutputs(graph); outputs.error(gm, reference)  # doctest: +SKIP
    """

    def __init__(self, graph: Graph, item: ItemCall | None = None, tol: float = 0.0) -> None:
        self.graph, self.item, self.tol = graph, item, tol
        self._seen: dict[int, _Run] = {}  # by id, the module kept in the run (its id stays unique)
        self._item_ids: set[int] = set()
        self.labels: dict[str, nn.Module] = {}

    def on_item(self, *modules: nn.Module) -> None:
        """Run `modules` on the item (where there is one) when their outputs are first needed for a comparison."""
        if self.item is not None:
            self._item_ids.update(id(m) for m in modules)

    def _run(self, module: nn.Module, on_item: bool) -> _Run:
        call = (self.item.args, self.item.kwargs) if on_item and self.item is not None else \
            (self.graph.call_args, self.graph.call_kwargs)
        with _rounding_clock(module) as rounding:
            start = time.perf_counter()
            with torch.inference_mode():
                out = tensor_leaves(module(*call[0], **call[1]))
            seconds = time.perf_counter() - start
        run = _Run(module, out, seconds, rounding[0], on_item and self.item is not None)
        self._seen[id(module)] = run
        return run

    def _any(self, module: nn.Module) -> _Run:
        """`module`'s run made here, else a new one (on the item where marked and the forward runs on it)."""
        seen = self._seen.get(id(module))
        if seen is not None:
            return seen
        if id(module) in self._item_ids:
            try:
                return self._run(module, True)
            except Exception:  # noqa: BLE001  (a forward that fails on one item, e.g. a size baked in: whole)
                self._item_ids.discard(id(module))
        return self._run(module, False)

    def _whole(self, module: nn.Module) -> _Run:
        seen = self._seen.get(id(module))
        return seen if seen is not None and not seen.on_item else self._run(module, False)

    def of(self, module: nn.Module, label: str | None = None) -> list[torch.Tensor]:
        """The floating outputs of `module` on the graph's example inputs (`label` names it for `seconds`)."""
        if label is not None:
            self.labels[label] = module
        return self._whole(module).outputs

    def given(self, module: nn.Module, output: Any, seconds: float, label: str | None = None) -> None:
        """Take `output` (any nesting), from a call of `module` on the example inputs that took `seconds`, as its
        outputs: `module` is then never run here."""
        self._seen[id(module)] = _Run(module, tensor_leaves(output), seconds)
        if label is not None:
            self.labels[label] = module

    def ran(self, module: nn.Module) -> bool:
        """Whether `module` ran here (on the whole example or the item)."""
        return id(module) in self._seen

    def seconds(self, module: nn.Module | str) -> float | None:
        """Wall seconds of the first whole-example call of `module` (or of the module labelled so), None if it
        made none here."""
        module = self.labels.get(module) if isinstance(module, str) else module
        seen = self._seen.get(id(module)) if module is not None else None
        return None if seen is None or seen.on_item else seen.seconds

    def dense_seconds(self, module: nn.Module) -> float | None:
        """Seconds of the first whole-example call of `module` less the time its `InputGrid` modules took (None if
        it made none here): a table reference's call with its inputs' rounding taken out does the dense model's
        work.

        Example:
            >>> outputs.dense_seconds(reference) <= outputs.seconds(reference)  # doctest: +SKIP
            True
        """
        seen = self._seen.get(id(module))
        return None if seen is None or seen.on_item else max(0.0, seen.seconds - seen.rounding)

    def error(self, a: nn.Module, b: nn.Module) -> float:
        """The largest relative error between the outputs of `a` and `b`."""
        return self.compared(a, b)[0]

    def compared(self, a: nn.Module, b: nn.Module) -> tuple[float, str]:
        """The largest relative error between the outputs of `a` and `b`, and what it was measured on ("whole
        example", or the item's label): on the item where one of them ran there only and the error is within
        `tol`, else on the whole example.

        Example:
            >>> outputs.compared(gm, reference)  # doctest: +SKIP
            (2.1e-07, 'item 8 of 8')
        """
        ra, rb = self._any(a), self._any(b)
        if ra.on_item or rb.on_item:
            pair = _on_item(self.item, ra, rb)
            if pair is not None:
                error = _max_error(*pair)
                if error <= self.tol:
                    return error, self.item.label
        return _max_error(self._whole(a).outputs, self._whole(b).outputs), "whole example"


def _on_item(item: ItemCall, a: _Run, b: _Run) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
    """The two runs' outputs on the item (a whole run's cut to it), None where they do not split so."""
    cut = lambda run, other: run.outputs if run.on_item else item.cut(run.outputs, other.outputs)  # noqa: E731
    x, y = cut(a, b), cut(b, a)
    return None if x is None or y is None else (x, y)


def _max_error(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    return max((relative_error(x.float(), y.float()) for x, y in zip(a, b)), default=0.0)


@contextmanager
def _rounding_clock(module: nn.Module) -> Iterator[list[float]]:
    """Within the block, the seconds `module`'s `InputGrid` modules take, summed into the yielded list's item."""
    total, started, handles = [0.0], [], []

    def start(*_: Any) -> None:
        started.append(time.perf_counter())

    def stop(*_: Any) -> None:
        total[0] += time.perf_counter() - started.pop()

    for m in module.modules():
        if isinstance(m, InputGrid):
            handles += [m.register_forward_pre_hook(start), m.register_forward_hook(stop)]
    try:
        yield total
    finally:
        for h in handles:
            h.remove()


def model_error(graph: Graph, a: nn.Module, b: nn.Module, outputs: ModelOutputs | None = None) -> float:
    """The largest relative error between the outputs of `a` and `b` called like `graph`'s model (outputs reused
    from `outputs` where given)."""
    return (outputs or ModelOutputs(graph)).error(a, b)


def check_row(name: str, error: float, tol: float, on: str = "whole example") -> dict:
    """One row of `CompiledModel.checks`; `on`: what the error was measured on (`ModelOutputs.compared`)."""
    return {"check": name, "error": error, "tolerance": tol, "passed": bool(error <= tol), "on": on}


def _get_attr(module: nn.Module, target: str) -> object:
    for part in target.split("."):
        module = getattr(module, part)
    return module


def reference_module(gm: fx.GraphModule, compiled: Mapping[str, nn.Module]) -> fx.GraphModule:
    """The compiled graph with each compiled op computed by its PyTorch reference (sharing the modules)."""
    graph = deep_copy(gm.graph)
    ids = {id(m) for m in compiled.values()}
    owners: dict[str, object] = {}
    for node in graph.nodes:
        if node.op == "call_module":
            module = gm.get_submodule(node.target)
            owners[node.target] = ReferenceOp(module) if id(module) in ids else module
        elif node.op == "get_attr":
            owners[node.target] = _get_attr(gm, node.target)
    return fx.GraphModule(owners, graph)


def not_run(name: str, tol: float) -> dict:
    """The row of a check that did not need to run (error NaN): one it only explains passed without it.

    Example:
        >>> not_run("table", 1e-3)["passed"]
        True
    """
    return {**check_row(name, float("nan"), tol, on="not run"), "passed": True}


def verified_module(graph: Graph, gm: fx.GraphModule, execution: ExecutionPlan, compiled: Mapping[str, nn.Module],
                    references: Sequence[tuple[str, nn.Module]], tol: float, verify: bool,
                    outputs: ModelOutputs | None = None, ops_reference: nn.Module | None = None,
                    explain: Sequence[tuple[str, nn.Module]] = ()) -> tuple[nn.Module, list[dict]]:
    """The module to run (`gm`, or the reference that a failed check falls back to) and the check rows.

    `ops_reference`: a module computing what `gm` with every compiled op running its reference computes
    (fp32: the passes' model before kernels), its outputs in `outputs` already; default: that graph, built
    and run here, only where a table check fails (it then tells a kernel bug from a pass bug). Until then the
    ops row says it did not run (error NaN): the table checks compare `gm` with the user's model itself, and the
    reference graph of quantized ops was a model run of its own (BERT-base w8a8: 1.3 s). `explain`: references
    checked only when one of `references` fails, likewise (the table compile used, where `references` hold the
    pruner's own table and propagation pruned further).
    """
    outputs = outputs or ModelOutputs(graph)
    later = [not_run(name, tol) for name, _ in explain]
    if ops_reference is None and verify and references:
        rows = [check_row(name, error, tol, on) for name, ref in references
                for error, on in [outputs.compared(gm, ref)]]
        if all(row["passed"] for row in rows):
            return gm, [not_run("ops", tol)] + rows + later
    reference = ops_reference if ops_reference is not None else reference_module(gm, compiled)
    outputs.of(reference, label="ops reference")  # the passes' model at dense speed: the guard's estimate of it
    ops_error, on = outputs.compared(gm, reference)
    rows = [check_row("ops", ops_error, tol, on)]
    run: nn.Module = gm
    if not ops_error <= tol:  # never a wrong answer: every op runs its PyTorch reference instead
        warnings.warn(f"compiled model differs from its reference ops by {ops_error:.3g} (> {tol:g}); running the "
                      "reference ops instead. This is a kernel bug: please report it with the plan table",
                      CompileWarning, stacklevel=4)
        for op in execution.ops.values():
            op.fell_back(f"whole-model check failed ({ops_error:.2e}): reference op runs")
        run = reference
    for name, ref in references:
        error, on = outputs.compared(run, ref) if verify else (float("nan"), "not run")
        rows.append(check_row(name, error, tol, on))
        if verify and not error <= tol:
            warnings.warn(f"compiled model differs from the model masked with the {name} by {error:.3g} (> {tol:g}); "
                          f"it runs that masked model instead. A graph pass, propagation or planning changed what "
                          f"the {name} says: please report it", CompileWarning, stacklevel=4)
            later = [check_row(other, error, tol, on) for other, module in explain
                     for error, on in [outputs.compared(run, module)]]
            run = ref
            for op in execution.ops.values():
                op.fell_back(f"{name} check failed ({error:.2e}): the masked reference runs")
            break
    return run, rows + later
