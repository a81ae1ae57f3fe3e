"""Editing a captured graph without touching it: working copies, module swaps, the table carried along, values.

A pass calls `editable(graph)` for a GraphModule of its own (a copy of the fx graph whose
modules and tensors are shared with `graph`), edits nodes freely, swaps modules with
`set_module` (which copies the parents it walks through, so no shared module is ever
mutated), and returns `finished(graph, gm)`: the new `Graph`, shapes recorded anew on the
same example inputs. `carried(table, new)` keeps the TeSAs that still name a tensor of the
new graph with the same shape.

Example:
    >>> gm = editable(graph)                      # doctest: +SKIP
    >>> set_module(gm, "block.conv", folded)      # doctest: +SKIP
    >>> new = finished(graph, gm)                 # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from sparta_explore.graph import Graph, relabelled, rewritten
from sparta_explore.module_tree import clone_module, set_module  # noqa: F401  (passes import them from here)
from sparta_explore.tesa import TeSA
from sparta_explore.tracing.copying import deep_copy


def editable(graph: Graph) -> fx.GraphModule:
    """A GraphModule over a copy of `graph`'s fx graph, sharing its modules and tensors.

    Example:
        >>> g = capture(nn.Sequential(nn.Linear(2, 2)), torch.zeros(1, 2))   # doctest: +SKIP
        >>> editable(g).get_submodule("0") is g.module.get_submodule("0")     # doctest: +SKIP
        True
    """
    gm = fx.GraphModule(graph.module, deep_copy(graph.module.graph), class_name=type(graph.module).__name__)
    gm.training = False
    return gm


def add_module(gm: fx.GraphModule, prefix: str, name: str, module: nn.Module) -> str:
    """Register `module` under `prefix.<free name>` in `gm` (for ops a pass adds); returns its target.

    Example:
        >>> add_module(gm, "sparta_passes", "expand_relu_1", op)   # doctest: +SKIP
        'sparta_passes.expand_relu_1'
    """
    if not hasattr(gm, prefix):
        gm.add_module(prefix, nn.Module())
    holder = gm.get_submodule(prefix)
    free, i = name, 1
    while hasattr(holder, free):
        free, i = f"{name}_{i}", i + 1
    holder.add_module(free, module)
    return f"{prefix}.{free}"


def finished(graph: Graph, gm: fx.GraphModule, same_values: bool = False) -> Graph:
    """The `Graph` of the edited `gm`: dead nodes and unused modules dropped, recompiled, shapes recorded anew
    (`same_values`: every node left computes what it did, so `graph`'s shapes stand; no model run).

    Example:
        >>> new = finished(graph, gm)   # doctest: +SKIP
    """
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
    gm.delete_all_unused_submodules()
    return relabelled(graph, gm) if same_values else rewritten(graph, gm)


def carried(table: Mapping[str, TeSA], new: Graph, renames: Mapping[str, str] | None = None) -> dict[str, TeSA]:
    """The entries of `table` that name a tensor of `new` (after `renames`: old name -> new name) and fit its shape.

    A renamed entry replaces the entry already under its new name. A TeSA that no longer fits
    (the pass changed that tensor's shape) is left out: whoever changed the shape carries it
    (`TeSA.select`) before calling this.

    Example:
        >>> carried({"fc.weight": t, "bn.weight": t2}, new)   # doctest: +SKIP
        {'fc.weight': ...}
    """
    renames = dict(renames or {})
    out: dict[str, TeSA] = {}
    # renamed entries go last: a node that stands in for another takes over that one's TeSA
    for name, tesa in sorted(table.items(), key=lambda kv: kv[0] in renames):
        name = renames.get(name, name)
        info = new.tensors.get(name)
        fitted = fitted_to(tesa, info.shape) if info is not None else None
        if fitted is not None:
            out[name] = fitted
    return out


def fitted_to(tesa: TeSA, shape: Sequence[int]) -> TeSA | None:
    """`tesa` for a tensor of `shape`: as is if it fits, or collapsed to size 1 along each dim where the sizes
    differ and it says the same for every index (an activation's TeSA from a capture at another batch size);
    None if it cannot describe such a tensor.

    Example:
        >>> fitted_to(TeSA.dense((8, 4), bits=8), (64, 4)).shape
        (1, 4)
        >>> fitted_to(TeSA.from_mask(torch.tensor([[1, 0], [0, 1]])), (3, 2)) is None
        True
    """
    shape = tuple(shape)
    if tesa.fits(shape):
        return tesa
    if len(shape) != len(tesa.shape):
        return None
    for dim, (have, want) in enumerate(zip(tesa.shape, shape)):
        if have in (want, 1):
            continue
        first = tesa.select(dim, torch.zeros(1, dtype=torch.long))  # stays compact (no copy) where it already is
        if not first.expand(tesa.shape).equals(tesa):
            return None
        tesa = first
    return tesa


class _Keeper(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule, wanted: set[str]) -> None:
        super().__init__(gm)
        self.wanted, self.values = wanted, {}

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        if n.name in self.wanted:
            self.values[n.name] = out
        return out


def example_values(graph: Graph, names: Iterable[str]) -> dict[str, Any]:
    """The values of the named nodes when `graph` runs on its example inputs (no grad, eval mode).

    Example:
        >>> example_values(graph, ["relu_1"])["relu_1"].shape   # doctest: +SKIP
        torch.Size([8, 64, 16, 16])
    """
    keeper = _Keeper(graph.module, set(names))
    with torch.inference_mode():
        keeper.run(*graph.example_inputs)
    return keeper.values


def first_item_values(graph: Graph, names: Iterable[str]) -> dict[str, Any] | None:
    """The values of the named nodes when `graph` runs on the first item (along dim 0) of its example inputs,
    or None when that run is not the example's with one item: the inputs do not share a batch size over 1, the
    graph fails on one item, or a named value's shape is not its recorded shape with 1 item.

    For values no input can change (`constant_channels`): every item holds them alike, and one item costs a
    fraction of the example's run (BERT-base at 8 x 128: 0.12 of 1 s).

    Example:
        >>> first_item_values(graph, ["relu_1"])["relu_1"].shape   # doctest: +SKIP
        torch.Size([1, 64, 16, 16])
    """
    names = set(names)
    keeper = _Keeper(graph.module, names)
    batch = graph.run_first_item(keeper)
    if batch is None:
        return None
    for name in names:
        value, info = keeper.values.get(name), graph.tensors.get(name)
        if not isinstance(value, torch.Tensor) or info is None or tuple(info.shape) != (batch, *value.shape[1:]) \
                or value.shape[0] != 1:
            return None
    return keeper.values


def node_named(gm: fx.GraphModule, name: str) -> fx.Node:
    """The node of `gm` called `name` (a `KeyError` naming it if there is none)."""
    for n in gm.graph.nodes:
        if n.name == name:
            return n
    raise KeyError(f"no node {name!r} in the graph")


def module_of(gm: fx.GraphModule, node: fx.Node) -> nn.Module | None:
    """The module a call_module node calls, else None."""
    return gm.get_submodule(node.target) if node.op == "call_module" else None
