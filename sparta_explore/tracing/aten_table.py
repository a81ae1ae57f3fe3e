"""ATen overloads of an exported graph rewritten to the torch-level calls the rest of the pipeline knows.

`torch.export` records `torch.ops.aten.linear.default(x, w, b)`; the propagation rules,
the planner and the tests speak `F.linear`. This table maps each ATen overload that has
an exact torch-level equivalent to a rewrite of the node's target and arguments; the
rewritten graph computes the same values (a test replays exported models before and after).
Overloads not in the table stay as they are (propagation falls back to tensor scrambling).

Example:
    >>> target, args, kwargs = rewrite(torch.ops.aten.embedding.default, (w, ids), {})  # doctest: +SKIP
    >>> target is F.embedding, args == (ids, w)                                         # doctest: +SKIP
    (True, True)
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

aten = torch.ops.aten
Rewrite = Callable[[tuple, dict], tuple[Any, tuple, dict]]
REWRITES: dict[Any, Rewrite] = {}


def _same(target: Any, keep: tuple[str, ...] = ()) -> Rewrite:
    """The same positional arguments, the keyword arguments named in `keep`."""
    def rewrite(args: tuple, kwargs: dict) -> tuple[Any, tuple, dict]:
        return target, args, {k: v for k, v in kwargs.items() if k in keep}
    return rewrite


def _first(target: Any, n: int) -> Rewrite:
    """The first `n` positional arguments (the rest are ATen-only flags)."""
    def rewrite(args: tuple, kwargs: dict) -> tuple[Any, tuple, dict]:
        return target, tuple(args[:n]), {}
    return rewrite


def _register(rewrite: Rewrite, *overloads: Any) -> None:
    for overload in overloads:
        REWRITES[overload] = rewrite


def _embedding(args: tuple, kwargs: dict) -> tuple[Any, tuple, dict]:
    return F.embedding, (args[1], args[0]), {}  # aten takes (weight, indices)


def _dropout(args: tuple, kwargs: dict) -> tuple[Any, tuple, dict]:
    return F.dropout, (args[0],), {"p": args[1], "training": args[2]}


def _gelu(args: tuple, kwargs: dict) -> tuple[Any, tuple, dict]:
    return F.gelu, args[:1], {"approximate": kwargs.get("approximate", "none")}


def _softmax(args: tuple, kwargs: dict) -> tuple[Any, tuple, dict]:
    return torch.softmax, (args[0], args[1]), {}


def _slice(args: tuple, kwargs: dict) -> tuple[Any, tuple, dict]:
    x, dim = args[0], args[1] if len(args) > 1 else kwargs.get("dim", 0)
    start = args[2] if len(args) > 2 else kwargs.get("start")
    end = args[3] if len(args) > 3 else kwargs.get("end")
    step = args[4] if len(args) > 4 else kwargs.get("step", 1)
    if not isinstance(dim, int) or dim < 0:
        return aten.slice.Tensor, args, kwargs  # a negative or symbolic dim: leave it to scrambling
    return operator.getitem, (x, (slice(None),) * dim + (slice(start, end, step),)), {}


def _to(args: tuple, kwargs: dict) -> tuple[Any, tuple, dict]:
    dtype = kwargs.get("dtype")
    if dtype is None:
        positional = [a for a in args[1:] if isinstance(a, torch.dtype)]
        dtype = positional[0] if positional else None
    return "to", (args[0],) if dtype is None else (args[0], dtype), {}


def _alias(args: tuple, kwargs: dict) -> tuple[Any, tuple, dict]:
    return operator.getitem, (args[0], Ellipsis), {}


def _squeeze_dims(args: tuple, kwargs: dict) -> tuple[Any, tuple, dict]:
    dims = args[1]
    return torch.squeeze, (args[0], tuple(dims) if isinstance(dims, list) else dims), {}


_register(_same(F.linear), aten.linear.default)
_register(_same(F.conv1d), aten.conv1d.default)
_register(_same(F.conv2d), aten.conv2d.default)
_register(_embedding, aten.embedding.default)
_register(_first(F.layer_norm, 5), aten.layer_norm.default)
_register(_first(F.group_norm, 5), aten.group_norm.default)
_register(_gelu, aten.gelu.default)
_register(_same(torch.relu), aten.relu.default, aten.relu_.default)
_register(_same(torch.tanh), aten.tanh.default)
_register(_same(torch.sigmoid), aten.sigmoid.default)
_register(_same(F.silu), aten.silu.default)
_register(_same(torch.neg), aten.neg.default)
_register(_same(F.hardtanh), aten.hardtanh.default)
_register(_dropout, aten.dropout.default)
_register(_same(torch.add, ("alpha",)), aten.add.Tensor, aten.add.Scalar)
_register(_same(torch.sub, ("alpha",)), aten.sub.Tensor, aten.sub.Scalar)
_register(_same(torch.rsub, ("alpha",)), aten.rsub.Scalar)
_register(_same(torch.mul), aten.mul.Tensor, aten.mul.Scalar)
_register(_same(torch.div), aten.div.Tensor, aten.div.Scalar)
_register(_same(torch.pow), aten.pow.Tensor_Scalar)
_register(_same(torch.matmul), aten.matmul.default)
_register(_same(torch.bmm), aten.bmm.default)
_register(_same(torch.mm), aten.mm.default)
_register(_same(torch.addmm, ("beta", "alpha")), aten.addmm.default)
_register(_softmax, aten.softmax.int)
_register(_same(F.scaled_dot_product_attention, ("scale", "enable_gqa")), aten.scaled_dot_product_attention.default)
_register(_same(torch.reshape), aten.view.default, aten.reshape.default, aten._unsafe_view.default)
_register(_same(torch.transpose), aten.transpose.int)
_register(_same(torch.permute), aten.permute.default)
_register(_same(torch.t), aten.t.default)
_register(_same(torch.unsqueeze), aten.unsqueeze.default)
_register(_same(torch.squeeze), aten.squeeze.dim, aten.squeeze.default)
_register(_squeeze_dims, aten.squeeze.dims)
_register(_same(torch.select), aten.select.int)
_register(_same(torch.flatten), aten.flatten.using_ints)
_register(_same("unflatten"), aten.unflatten.int)
_register(_first("expand", 2), aten.expand.default)
_register(_first("contiguous", 1), aten.contiguous.default)
_register(_first(torch.clone, 1), aten.clone.default)
_register(_slice, aten.slice.Tensor)
_register(_same(torch.split), aten.split.Tensor, aten.split_with_sizes.default)
_register(_same(torch.chunk), aten.chunk.default)
_register(_same(torch.cat), aten.cat.default)
_register(_same(torch.stack), aten.stack.default)
_register(_to, aten.to.dtype_layout, aten.to.dtype, aten.to.device, aten._to_copy.default)
_register(_alias, aten.alias.default)
_register(_same(F.adaptive_avg_pool2d), aten.adaptive_avg_pool2d.default)
_register(_same(F.max_pool2d), aten.max_pool2d.default)
_register(_same(F.avg_pool2d), aten.avg_pool2d.default)

# ops with no value and no effect on the result: checks export inserted, removed once shapes are known
SIDE_CHECKS = frozenset({aten._assert_tensor_metadata.default, aten._assert_scalar.default,
                         aten.sym_constrain_range_for_size.default})


def rewrite(target: Any, args: tuple, kwargs: dict) -> tuple[Any, tuple, dict] | None:
    """The torch-level (target, args, kwargs) of an ATen call, or None when the table has no entry.

    A string target means a tensor method (`x.unflatten(...)`), called with the tensor first.

    Example:
        >>> rewrite(torch.ops.aten.relu.default, ("x",), {})[0] is torch.relu
        True
        >>> rewrite(torch.ops.aten.sort.default, ("x",), {}) is None
        True
    """
    entry = REWRITES.get(target)
    return None if entry is None else entry(args, kwargs)
