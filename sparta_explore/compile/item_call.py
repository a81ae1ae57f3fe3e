"""The example's last item as a call of its own: what a large model's table checks run their references on.

A table check compares the compiled model with the user's model masked by the table. That reference runs
the dense model's arithmetic, so on a large model it was the largest fixed cost of a compile (BERT-base at
8 x 128: 1.1 s of a 4 s compile with a warm cache). When the model's dense call at capture took
`ITEM_CHECK_SECONDS` or more, the references run on the example's last item only, and the compiled model's
own whole-example output is cut to that item to compare. Soundness rests on three things:

* the compiled model still runs the whole example (its kernels, their tile tails and thread splits, on the
  sizes it was built for), and the last item holds the ragged tail of every row-tiled kernel;
* every kernel was checked against its op's reference on full-size inputs before (`choose.py`);
* a comparison that fails on the item is redone on the whole example before anything falls back, so only a
  pass is ever decided on one item (a model that mixes its batch fails on the item and is checked whole).

Where the inputs share no batch size over 1, or an output does not split along dim 0 into the items, the
whole example is compared.

Example:
    >>> import torch
    >>> call = ItemCall.of((torch.zeros(4, 3),), {"mask": torch.ones(4, 2)})
    >>> call.args[0].shape, call.kwargs["mask"].shape, call.label
    (torch.Size([1, 3]), torch.Size([1, 2]), 'item 4 of 4')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from sparta_explore.tracing.inputs import batch_size

# a whole-example dense call at least this long (seconds, timed at capture): its references run on one item
ITEM_CHECK_SECONDS = 0.25


@dataclass(frozen=True)
class ItemCall:
    """The example's last item: the call's positional and keyword inputs cut to it along dim 0."""

    batch: int
    args: tuple
    kwargs: dict[str, Any]

    @property
    def label(self) -> str:
        """How a check row names what it compared on."""
        return f"item {self.batch} of {self.batch}"

    @classmethod
    def of(cls, args: Sequence[Any], kwargs: Mapping[str, Any]) -> ItemCall | None:
        """The last item of a call with `args` and `kwargs`; None unless every tensor in them (any nesting) has a
        dim 0 of one size over 1 (the batch).

        Example:
            >>> ItemCall.of((torch.zeros(4, 3), torch.zeros(2, 3)), {}) is None
            True
        """
        batch = batch_size((tuple(args), dict(kwargs)))
        if not batch:
            return None
        cut = lambda v: v[batch - 1:] if isinstance(v, torch.Tensor) else v  # noqa: E731
        return cls(batch, pytree.tree_map(cut, tuple(args)), pytree.tree_map(cut, dict(kwargs)))

    def cut(self, whole: Sequence[torch.Tensor], item: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
        """`whole` (a whole-example call's output tensors) cut to this item, leaf by leaf like `item` (the same
        module's call on the item); None where a leaf does not split along dim 0 into `batch` equal parts, one of
        `item`'s shape (the outputs are then only comparable whole).

        Example:
            >>> call = ItemCall.of((torch.zeros(4, 3),), {})
            >>> call.cut([torch.arange(8.).view(8, 1)], [torch.zeros(2, 1)])[0].flatten().tolist()
            [6.0, 7.0]
            >>> call.cut([torch.zeros(3, 1)], [torch.zeros(1, 1)]) is None
            True
        """
        if len(whole) != len(item):
            return None
        out = []
        for w, i in zip(whole, item):
            rows = i.shape[0] if i.dim() else 0
            if w.dim() != i.dim() or rows == 0 or w.shape[0] != self.batch * rows or w.shape[1:] != i.shape[1:]:
                return None
            out.append(w[(self.batch - 1) * rows:])
        return out
