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
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.utils import _pytree as pytree

from sparta_explore.compile.choose import CompileWarning, relative_error
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


class ModelOutputs:
    """Outputs of modules called like `graph`'s model, each module run once: a compile's checks compare the
    compiled model with four references and the guard's picks with the trusted one (BERT-base: 0.6 s a run).

    Example:
        >>> outputs = ModelOutputs(graph); outputs.error(gm, reference)  # doctest: +SKIP
    """

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        # by id, with the module kept (its id stays unique): outputs and the seconds of that first call
        self._seen: dict[int, tuple[nn.Module, list[torch.Tensor], float]] = {}
        self._rounding: dict[int, float] = {}  # by id: seconds of that call spent in its InputGrid modules
        self.labels: dict[str, nn.Module] = {}

    def of(self, module: nn.Module, label: str | None = None) -> list[torch.Tensor]:
        """The floating outputs of `module` on the graph's example inputs (`label` names it for `seconds`)."""
        if id(module) not in self._seen:
            with _rounding_clock(module) as rounding:
                start = time.perf_counter()
                with torch.inference_mode():
                    out = tensor_leaves(self.graph.run(module))
                self._seen[id(module)] = (module, out, time.perf_counter() - start)
            self._rounding[id(module)] = rounding[0]
        if label is not None:
            self.labels[label] = module
        return self._seen[id(module)][1]

    def given(self, module: nn.Module, output: Any, seconds: float, label: str | None = None) -> None:
        """Take `output` (any nesting), from a call of `module` on the example inputs that took `seconds`, as its
        outputs: `module` is then never run here."""
        self._seen[id(module)] = (module, tensor_leaves(output), seconds)
        if label is not None:
            self.labels[label] = module

    def seconds(self, module: nn.Module | str) -> float | None:
        """Wall seconds of the first call of `module` (or of the module labelled so), None if it never ran here."""
        module = self.labels.get(module) if isinstance(module, str) else module
        seen = self._seen.get(id(module)) if module is not None else None
        return None if seen is None else seen[2]

    def dense_seconds(self, module: nn.Module) -> float | None:
        """Seconds of the first call of `module` less the time its `InputGrid` modules took (None if it never ran
        here): a table reference's call with its inputs' rounding taken out does the dense model's work.

        Example:
            >>> outputs.dense_seconds(reference) <= outputs.seconds(reference)  # doctest: +SKIP
            True
        """
        seen = self.seconds(module)
        return None if seen is None else max(0.0, seen - self._rounding.get(id(module), 0.0))

    def error(self, a: nn.Module, b: nn.Module) -> float:
        """The largest relative error between the outputs of `a` and `b`."""
        return max((relative_error(x.float(), y.float()) for x, y in zip(self.of(a), self.of(b))), default=0.0)


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


def check_row(name: str, error: float, tol: float) -> dict:
    """One row of `CompiledModel.checks`."""
    return {"check": name, "error": error, "tolerance": tol, "passed": bool(error <= tol)}


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
    return {**check_row(name, float("nan"), tol), "passed": True}


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
        rows = [check_row(name, outputs.error(gm, ref), tol) for name, ref in references]
        if all(row["passed"] for row in rows):
            return gm, [not_run("ops", tol)] + rows + later
    reference = ops_reference if ops_reference is not None else reference_module(gm, compiled)
    outputs.of(reference, label="ops reference")  # the passes' model at dense speed: the guard's estimate of it
    ops_error = outputs.error(gm, reference)
    rows = [check_row("ops", ops_error, tol)]
    run: nn.Module = gm
    if not ops_error <= tol:  # never a wrong answer: every op runs its PyTorch reference instead
        warnings.warn(f"compiled model differs from its reference ops by {ops_error:.3g} (> {tol:g}); running the "
                      "reference ops instead. This is a kernel bug: please report it with the plan table",
                      CompileWarning, stacklevel=4)
        for op in execution.ops.values():
            op.fell_back(f"whole-model check failed ({ops_error:.2e}): reference op runs")
        run = reference
    for name, ref in references:
        error = outputs.error(run, ref) if verify else float("nan")
        rows.append(check_row(name, error, tol))
        if verify and not error <= tol:
            warnings.warn(f"compiled model differs from the model masked with the {name} by {error:.3g} (> {tol:g}); "
                          f"it runs that masked model instead. A graph pass, propagation or planning changed what "
                          f"the {name} says: please report it", CompileWarning, stacklevel=4)
            later = [check_row(other, outputs.error(run, module), tol) for other, module in explain]
            run = ref
            for op in execution.ops.values():
                op.fell_back(f"{name} check failed ({error:.2e}): the masked reference runs")
            break
    return run, rows + later
