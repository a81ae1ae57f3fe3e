"""The small ops a shrunk graph runs where tensors of different channel sets meet.

A shrunk value holds only some channels of its full width along one axis (`index`, in the
original numbering; the others are zero or irrelevant by the table). `ExpandChannels` puts
it back at full width with zeros elsewhere (where shrinking stops), `SelectChannels` takes a
full-width value's channels at `index` (to meet a shrunk one), and `AlignedAdd` adds two
values that hold different channel sets into their union, e.g. a residual stream and a block
output whose pruned rows were cut.

Example:
    >>> x = torch.ones(2, 3)
    >>> ExpandChannels(1, torch.tensor([0, 2]), 4)(x[:, :2]).tolist()
    [[1.0, 0.0, 1.0, 0.0], [1.0, 0.0, 1.0, 0.0]]
"""

from __future__ import annotations

import torch
from torch import nn


class ExpandChannels(nn.Module):
    """`x` (holding channels `index` along `axis`) at full width `size`, zeros in the channels it lacks."""

    def __init__(self, axis: int, index: torch.Tensor, size: int) -> None:
        super().__init__()
        self.axis, self.size = axis, size
        self.register_buffer("index", index.to(torch.long).clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = list(x.shape)
        shape[self.axis] = self.size
        return x.new_zeros(shape).index_copy_(self.axis, self.index, x)

    def extra_repr(self) -> str:
        return f"axis={self.axis}, {len(self.index)} -> {self.size}"


class SelectChannels(nn.Module):
    """The channels `index` of a full-width `x` along `axis`.

    Example:
        >>> SelectChannels(0, torch.tensor([2]))(torch.arange(3.0)).tolist()
        [2.0]
    """

    def __init__(self, axis: int, index: torch.Tensor) -> None:
        super().__init__()
        self.axis = axis
        self.register_buffer("index", index.to(torch.long).clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.index_select(self.axis, self.index)

    def extra_repr(self) -> str:
        return f"axis={self.axis}, keep {len(self.index)}"


class AlignedAdd(nn.Module):
    """a + alpha * b where a and b hold different channels of one axis; the result holds their union.

    `at_a` / `at_b` say where a's and b's channels sit in the result (None: the operand
    already holds exactly the result's channels, in order).

    Example:
        >>> add = AlignedAdd(1, 3, None, torch.tensor([1]))
        >>> add(torch.zeros(1, 3), torch.ones(1, 1)).tolist()
        [[0.0, 1.0, 0.0]]
    """

    def __init__(self, axis: int, size: int, at_a: torch.Tensor | None, at_b: torch.Tensor | None,
                 alpha: float = 1.0) -> None:
        super().__init__()
        self.axis, self.size, self.alpha = axis, size, alpha
        self.register_buffer("at_a", None if at_a is None else at_a.to(torch.long).clone())
        self.register_buffer("at_b", None if at_b is None else at_b.to(torch.long).clone())

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.at_a is None and self.at_b is None:
            return torch.add(a, b, alpha=self.alpha)
        if self.at_a is None:
            return torch.index_add(a, self.axis, self.at_b, b, alpha=self.alpha)
        shape = list(a.shape)
        shape[self.axis] = self.size
        if self.at_b is None:
            base = b if self.alpha == 1 else b * self.alpha
            return torch.index_add(base, self.axis, self.at_a, a)
        out = a.new_zeros(shape).index_add_(self.axis, self.at_a, a)
        return out.index_add_(self.axis, self.at_b, b, alpha=self.alpha)

    def extra_repr(self) -> str:
        n = lambda t: "all" if t is None else len(t)  # noqa: E731
        return f"axis={self.axis}, size={self.size}, a={n(self.at_a)}, b={n(self.at_b)}, alpha={self.alpha}"
