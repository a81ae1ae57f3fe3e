"""What the `shrink` pass tracks as it walks a graph: which channels each value holds (`Present`), and the walk itself.

Its own module so that the pass (`shrink.py`) and the rules it calls (`shrink_rules.py`,
`shrink_layout_rules.py`) can all import it: the pass imports the rules, which read and
change a `ShrinkWalk`.

Example:
    >>> import torch
    >>> p = Present(axis=1, index=torch.tensor([0, 2]), size=4)
    >>> p.positions_in(Present(axis=1, index=torch.tensor([0, 1, 2]), size=4)).tolist()
    [0, 2]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.fx as fx
from torch import nn

from sparta_explore.compile.passes.base import Table
from sparta_explore.compile.passes.graph_edit import add_module, carried
from sparta_explore.compile.passes.shrink_ops import ExpandChannels
from sparta_explore.graph import Graph
from sparta_explore.tesa import TeSA

T = TypeVar("T")
OPS = "sparta_shrink"  # where the ops this pass adds are registered


@dataclass(frozen=True)
class Present:
    """A value that holds only the channels `index` (sorted, original numbering) of `size` along `axis`."""

    axis: int
    index: torch.Tensor
    size: int
    origin: str | None = None  # the linear / conv whose cut rows these are, while only reshapes and permutes followed

    def positions_in(self, other: Present) -> torch.Tensor:
        """Where this value's channels sit among `other`'s (every one of ours must be in `other`)."""
        lookup = torch.full((self.size,), -1, dtype=torch.long)
        lookup[other.index] = torch.arange(len(other.index))
        return lookup[self.index]


class ShrinkWalk:
    """One walk of the shrink pass over an editable copy: what each value holds, and the table for the result.

    Rules read `present`, `kept`, `rank` and `shape`; they change nodes through `set_present`,
    `materialize`, `add_op` and `entries` (the TeSAs of weights they resized).
    """

    def __init__(self, graph: Graph, gm: fx.GraphModule, table: Table, keep_rows: frozenset[str] = frozenset(),
                 made: dict | None = None) -> None:
        self.graph, self.gm, self.table = graph, gm, table
        self.keep_rows = keep_rows  # ops whose rows are not cut: nothing but reshapes would have read them cut
        self.made = {} if made is None else made  # shared by the pass's walks: see `reused`
        self.wasted: set[str] = set()
        self.states: dict[str, Present] = {}
        self.entries: dict[str, TeSA] = {}
        self.expanded: dict[str, fx.Node] = {}
        self.renames: dict[str, str] = {}  # an op a rule replaced -> the node that computes its value now
        self.counts = {"ops shrunk": 0, "channels removed": 0, "expansions": 0}

    def present(self, value: object) -> Present | None:
        return self.states.get(value.name) if isinstance(value, fx.Node) else None

    def shape(self, value: object) -> tuple[int, ...] | None:
        info = self.graph.tensors.get(value.name) if isinstance(value, fx.Node) else None
        return info.shape if info is not None else None

    def rank(self, value: object) -> int | None:
        shape = self.shape(value)
        return None if shape is None else len(shape)

    def kept(self, node: fx.Node, axis: int) -> torch.Tensor | None:
        """The indices of `node`'s channels along `axis` that its TeSA keeps, or None when it keeps them all."""
        tesa = self.table.get(node.name)
        if tesa is None:
            return None
        kept = tesa.channels_kept(axis)
        if bool(kept.all()):
            return None
        index = kept.nonzero().flatten()
        return index if len(index) else torch.zeros(1, dtype=torch.long)  # an op keeps one channel, never none

    def kept_within(self, node: fx.Node, p: Present) -> bool:
        """Whether every channel `node`'s TeSA keeps along `p.axis` is among `p`'s (so the others may read as 0)."""
        tesa = self.table.get(node.name)
        kept = tesa.channels_kept(p.axis) if tesa is not None else torch.ones(p.size, dtype=torch.bool)
        if len(kept) != p.size:
            return False
        kept = kept.clone()
        kept[p.index] = False
        return not bool(kept.any())

    def set_present(self, node: fx.Node, p: Present | None, *, layout: bool = False) -> None:
        """Record what `node`'s value holds; `layout` for ops that only move axes (the cut rows' origin stays)."""
        if p is not None and len(p.index) < p.size:
            self.states[node.name] = p if layout or p.origin is None else dataclasses.replace(p, origin=None)

    def add_op(self, name: str, module: nn.Module, args: tuple, before: fx.Node) -> fx.Node:
        """A call of `module` (registered under `sparta_shrink`) inserted before `before`."""
        target = add_module(self.gm, OPS, name, module)
        with self.gm.graph.inserting_before(before):
            return self.gm.graph.call_module(target, args)

    def materialize(self, user: fx.Node, value: object) -> None:
        """Give `user` the full-width `value` (cut channels as zeros): shrinking stops at `user` for this input."""
        p = self.present(value)
        if p is None:
            return
        if p.origin is not None:  # cut rows that nothing but reshapes read: cutting them only added this expand
            self.wasted.add(p.origin)
        full = self.expanded.get(value.name)
        if full is None:
            full = self.add_op(f"expand_{value.name}", ExpandChannels(p.axis, p.index, p.size), (value,), user)
            self.expanded[value.name] = full
            self.counts["expansions"] += 1
        user.replace_input_with(value, full)

    def opaque(self, node: fx.Node) -> None:
        """An op no rule holds channels through: every shrunk input comes back at full width."""
        for value in list(node.all_input_nodes):
            self.materialize(node, value)

    def reused(self, key: tuple, make: Callable[[], T]) -> T:
        """`make()`, or what it made for `key` in an earlier walk of this pass: a walk again (`shrink.MAX_WALKS`) slices
        the same weights but those of the rows it no longer cuts (BERT-base 32x32: 60 slices in two walks, 7 ms
        each, half of them again)."""
        if key not in self.made:
            self.made[key] = make()
        return self.made[key]

    def shrunk_weight(self, name: str, rows: torch.Tensor | None, cols: torch.Tensor | None) -> None:
        """Slice the TeSA of parameter `name` like the parameter (rows: dim 0, cols: dim 1)."""
        tesa = self.table.get(name)
        if tesa is None:
            return
        if rows is not None:
            tesa = tesa.select(0, rows)
        if cols is not None and len(tesa.shape) > 1:
            tesa = tesa.select(1, cols)
        self.entries[name] = tesa

    def table_out(self, new: Graph) -> dict[str, TeSA]:
        """The table keyed to the shrunk graph: shrunk values' TeSAs sliced, resized weights' replaced."""
        out = dict(self.table)
        old_name = {new_name: old for old, new_name in self.renames.items()}
        for name, p in self.states.items():
            tesa = self.table.get(old_name.get(name, name))
            if tesa is not None:
                out[old_name.get(name, name)] = tesa.select(p.axis, p.index)
        out.update(self.entries)
        return carried(out, new, self.renames)
