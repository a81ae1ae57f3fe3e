"""Activation cache: calibration data for each op from partial inference, one node run at a time.

Calibration visits the weighted ops in topological order. For op i it needs the op's
input and the fp32 model's output of that op on the calibration batch. Recomputing them
from the model input for every op would cost O(ops^2) node runs; instead two cursors walk
the graph once, in lockstep with calibration:

* the *reference* cursor runs the fp32 (masked) model and yields op i's fp32 output, the
  distillation target;
* the *current* cursor runs the partially quantized model and yields op i's input as the
  compiled model will see it, with every upstream op already at its final bits.

Each cursor runs every node exactly once and keeps only values that a later node still
reads, so the cost is linear in the number of ops and memory is the live activations only.
Invariant the caller keeps: once the current cursor has run a node, nothing that node
computes may change (calibration only edits op i and later ops while op i is visited).

Example:
    >>> g = capture(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)), torch.randn(3, 4))
    >>> cache = ActivationCache(g.module, g.module, (torch.randn(3, 4),))
    >>> data = cache.at("_2")
    >>> data.target.shape, data.input.shape, cache.node_runs
    (torch.Size([3, 2]), torch.Size([3, 4]), {'reference': 3, 'current': 2})
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch import nn  # noqa: F401  (used by the docstring example)

from sparta_explore.errors import TeSANameError
from sparta_explore.graph import capture  # noqa: F401  (used by the docstring example)


@dataclass(frozen=True)
class OpData:
    """Calibration data of one op: its input in the current model, the fp32 input, the fp32 output."""

    input: torch.Tensor
    reference_input: torch.Tensor
    target: torch.Tensor


class _Cursor:
    """Runs one GraphModule's nodes in order, up to a position, freeing values no later node reads."""

    def __init__(self, gm: fx.GraphModule, inputs: tuple, last_use: dict[str, int]) -> None:
        self.gm = gm
        self.nodes = list(gm.graph.nodes)
        self.inputs = iter(inputs)
        self.last_use = last_use
        self.env: dict[str, Any] = {}
        self.pos = 0
        self.runs = 0

    def _load(self, args: Any) -> Any:
        return fx.node.map_arg(args, lambda n: self.env[n.name])

    def args_of(self, index: int) -> tuple:
        """The evaluated positional args of node `index` (its inputs must already have run)."""
        return self._load(self.nodes[index].args)

    def run_through(self, index: int) -> Any:
        """Run every node up to and including `index`; return the value of node `index` (if run)."""
        while self.pos <= index:
            node = self.nodes[self.pos]
            self.env[node.name] = self._run(node)
            for used in node.all_input_nodes:
                if self.last_use[used.name] <= self.pos:
                    del self.env[used.name]
            self.pos += 1
        return self.env.get(self.nodes[index].name) if index >= 0 else None

    @torch.no_grad()
    def _run(self, node: fx.Node) -> Any:
        if node.op == "placeholder":
            return next(self.inputs)
        if node.op == "output":
            return self._load(node.args[0])
        self.runs += 1
        args, kwargs = self._load(node.args), self._load(node.kwargs)
        if node.op == "get_attr":
            obj: Any = self.gm
            for part in node.target.split("."):
                obj = getattr(obj, part)
            return obj
        if node.op == "call_module":
            return self.gm.get_submodule(node.target)(*args, **kwargs)
        if node.op == "call_function":
            return node.target(*args, **kwargs)
        return getattr(args[0], node.target)(*args[1:], **kwargs)  # call_method


class ActivationCache:
    """Lockstep partial inference of the fp32 and the current model (see the module docstring).

    `reference` and `current` must share the graph (same node names in the same order).
    """

    def __init__(self, reference: fx.GraphModule, current: fx.GraphModule, inputs: tuple) -> None:
        ref_names = [n.name for n in reference.graph.nodes]
        if ref_names != [n.name for n in current.graph.nodes]:
            raise ValueError("ActivationCache: the reference and current models must share one graph")
        self.index = {name: i for i, name in enumerate(ref_names)}
        last_use: dict[str, int] = {}
        for i, node in enumerate(reference.graph.nodes):
            for used in node.all_input_nodes:
                last_use[used.name] = i
        for i, node in enumerate(reference.graph.nodes):
            last_use.setdefault(node.name, i)  # a value nobody reads is freed as soon as it is made
        self._ref = _Cursor(reference, tuple(inputs), last_use)
        self._cur = _Cursor(current, tuple(inputs), last_use)

    @property
    def node_runs(self) -> dict[str, int]:
        """Op nodes run so far by each cursor (placeholders and the output excluded)."""
        return {"reference": self._ref.runs, "current": self._cur.runs}

    def at(self, node: str) -> OpData:
        """Advance both cursors to op `node` (in topological order; never backwards) and return its data.

        The current cursor stops just before `node`, so the op may still be changed; it runs
        with its final settings when the cache advances past it.

        Example:
            >>> cache.at("fc1").input.shape  # doctest: +SKIP
            torch.Size([256, 512])
        """
        if node not in self.index:
            raise TeSANameError(f"ActivationCache: no node {node!r} in the graph")
        i = self.index[node]
        if self._cur.pos > i:
            raise ValueError(f"ActivationCache: {node!r} was passed already; ops must be visited in topological order")
        self._ref.run_through(i - 1)
        ref_input = self._ref.args_of(i)[0]
        target = self._ref.run_through(i)
        self._cur.run_through(i - 1)
        return OpData(input=self._cur.args_of(i)[0], reference_input=ref_input, target=target)

    def finish(self) -> Any:
        """Run the current model to its output (what the calibrated model returns on the batch).

        Example:
            >>> cache.finish().shape  # doctest: +SKIP
            torch.Size([256, 10])
        """
        return self._cur.run_through(len(self._cur.nodes) - 1)

