"""Shrink rules for ops that move or split axes: reshapes, permutes, attention matmuls, softmax, SDPA, shape reads, cat.

These carry whole heads through attention: a Q/K/V output holding the features of some
heads is split into (heads, head_dim) by a reshape (the rule keeps the heads whose every
feature is held and writes the new head count into the reshape), moved by permutes and
transposes, multiplied batch-wise by the attention matmuls or SDPA (heads are a batch
dim), and merged back by a reshape the output projection reads.

Example:
    >>> RULES["reshape"] is _reshape   # doctest: +SKIP
    True
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from sparta_explore.compile.passes.shrink_ops import SelectChannels
from sparta_explore.compile.passes.shrink_rules import register_shrink_rule
from sparta_explore.compile.passes.shrink_walk import Present, ShrinkWalk


def _size_list(node: fx.Node) -> tuple[list[object], bool]:
    """The requested sizes of a reshape / view, and whether they were given as one tuple argument."""
    rest = list(node.args[1:])
    if not rest and "shape" in node.kwargs:
        return list(node.kwargs["shape"]), True
    if len(rest) == 1 and isinstance(rest[0], (tuple, list, torch.Size)):
        return list(rest[0]), True
    return rest, False


def _with_size(node: fx.Node, position: int, size: int) -> None:
    sizes, packed = _size_list(node)
    if sizes[position] == -1:
        return  # inferred from the new element count
    sizes[position] = size
    if "shape" in node.kwargs:
        node.kwargs = {**node.kwargs, "shape": sizes}
    else:
        node.args = (node.args[0], sizes) if packed else (node.args[0], *sizes)


def _whole_heads(p: Present, head_dim: int) -> torch.Tensor | None:
    """The heads `p` holds every feature of, when it holds whole heads only; else None."""
    heads = torch.unique(p.index // head_dim)
    expected = (heads.reshape(-1, 1) * head_dim + torch.arange(head_dim)).flatten()
    return heads if torch.equal(expected, p.index) else None


@register_shrink_rule("view", "reshape", torch.reshape)
def _reshape(walk: ShrinkWalk, node: fx.Node) -> None:
    x = node.args[0]
    p = walk.present(x)
    if p is None:
        return None
    before, after = walk.shape(x), walk.shape(node)
    sizes, _ = _size_list(node)
    a = p.axis
    if before is None or after is None or len(sizes) != len(after):
        return walk.opaque(node)
    if before == after:
        new = p
    elif len(after) == len(before) + 1 and after[:a] == before[:a] and after[a + 2:] == before[a + 1:] \
            and after[a] * after[a + 1] == before[a]:  # split into (heads, head_dim)
        heads = _whole_heads(p, after[a + 1])
        if heads is None:
            return walk.opaque(node)
        new = Present(a, heads, after[a], p.origin)
    elif len(after) == len(before) - 1 and after[:a] == before[:a] and after[a + 1:] == before[a + 2:] \
            and before[a] * before[a + 1] == after[a]:  # merge (heads, head_dim)
        inner = before[a + 1]
        new = Present(a, (p.index.reshape(-1, 1) * inner + torch.arange(inner)).flatten(), after[a], p.origin)
    elif a == len(before) - 1 and before[-1] == after[-1]:  # leading dims regrouped, channels last
        new = Present(len(after) - 1, p.index, p.size, p.origin)
    else:
        return walk.opaque(node)
    _with_size(node, new.axis, len(new.index))
    walk.set_present(node, new, layout=True)
    return None


def _permuted_axis(node: fx.Node, axis: int, rank: int) -> int | None:
    dims = node.args[1] if len(node.args) == 2 and isinstance(node.args[1], (tuple, list)) else node.args[1:]
    dims = [d % rank for d in (dims or node.kwargs.get("dims", ()))]
    return dims.index(axis) if len(dims) == rank else None


def _transposed_axis(node: fx.Node, axis: int, rank: int) -> int | None:
    if len(node.args) != 3:
        return None
    d0, d1 = node.args[1] % rank, node.args[2] % rank
    return d1 if axis == d0 else d0 if axis == d1 else axis


# permute / transpose move the cut axis: fx target -> where it goes (None: this call cannot be read)
AXIS_MOVES = {"permute": _permuted_axis, torch.permute: _permuted_axis,
              "transpose": _transposed_axis, torch.transpose: _transposed_axis}


@register_shrink_rule(*AXIS_MOVES)
def _move_axis(walk: ShrinkWalk, node: fx.Node) -> None:
    x = node.args[0]
    p, rank = walk.present(x), walk.rank(x)
    if p is None:
        return None
    axis = AXIS_MOVES[node.target](node, p.axis, rank)
    if axis is None:
        return walk.opaque(node)
    walk.set_present(node, Present(axis, p.index, p.size, p.origin), layout=True)
    return None


def _batch_axis(walk: ShrinkWalk, node: fx.Node, operands: list[fx.Node]) -> Present | None:
    """The channels every operand holds along one shared batch axis (heads), or None when they do not meet so."""
    held = [walk.present(o) for o in operands]
    first = next((p for p in held if p is not None), None)
    rank = walk.rank(node)
    if first is None or rank is None or first.axis >= rank - 2:
        return None
    for o, p in zip(operands, held):
        if p is None:
            shape = walk.shape(o)
            if shape is None or len(shape) != rank or shape[first.axis] != 1:
                return None  # a full operand along the heads would need its heads picked
        elif p.axis != first.axis or not torch.equal(p.index, first.index) or walk.rank(o) != rank:
            return None
    return first


@register_shrink_rule(torch.matmul, operator.matmul, "matmul", torch.bmm, "bmm")
def _matmul(walk: ShrinkWalk, node: fx.Node) -> None:
    # attention's matmuls run per head: heads are a batch axis, which both sides must hold alike
    operands = [a for a in node.args[:2] if isinstance(a, fx.Node)]
    if not any(walk.present(o) for o in operands):
        return None
    p = _batch_axis(walk, node, operands) if len(operands) == 2 else None
    if p is None:
        return walk.opaque(node)
    walk.set_present(node, p)
    return None


@register_shrink_rule(F.softmax, torch.softmax, "softmax", nn.Softmax, F.log_softmax, "log_softmax")
def _softmax(walk: ShrinkWalk, node: fx.Node) -> None:
    x = node.args[0]
    p, rank = walk.present(x), walk.rank(x)
    if p is None:
        return None
    if node.op == "call_module":
        dim = walk.gm.get_submodule(node.target).dim
    else:
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    # softmax of a cut (zero) row is uniform, not zero: the cut heads' probabilities must be unread
    if dim is None or dim % rank == p.axis or not walk.kept_within(node, p):
        return walk.opaque(node)
    walk.set_present(node, p)
    return None


@register_shrink_rule(F.scaled_dot_product_attention)
def _sdpa(walk: ShrinkWalk, node: fx.Node) -> None:
    qkv = list(node.args[:3])
    if not any(walk.present(o) for o in qkv):
        return None
    p = _batch_axis(walk, node, qkv) if all(isinstance(o, fx.Node) for o in qkv) else None
    if p is None or p.axis != 1:
        return walk.opaque(node)
    mask = node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")
    if isinstance(mask, fx.Node):
        shape = walk.shape(mask)
        if shape is None:
            return walk.opaque(node)
        dim = 1 - (4 - len(shape))
        if dim >= 0 and shape[dim] != 1:
            picked = walk.add_op(f"select_{node.name}", SelectChannels(dim, p.index), (mask,), node)
            node.replace_input_with(mask, picked)
    walk.set_present(node, p)
    return None


_NOT_SIZES = ("dtype", "device", "ndim", "is_cuda", "requires_grad", "layout")


def _literal_users(node: fx.Node, value: int) -> None:
    for user in list(node.users):
        user.args = fx.node.map_arg(user.args, lambda n: value if n is node else n)
        user.kwargs = fx.node.map_arg(user.kwargs, lambda n: value if n is node else n)


@register_shrink_rule(getattr, "size", torch.ops.aten.sym_size.int)
def _shape_read(walk: ShrinkWalk, node: fx.Node) -> None:
    # a shape read of a cut value answers what the full value would: the cut axis reads its full size
    x = node.args[0]
    p = walk.present(x)
    if p is None:
        return None
    if node.target is getattr and node.args[1] != "shape":
        return None if node.args[1] in _NOT_SIZES else walk.opaque(node)
    dim = node.args[1] if node.target is not getattr and len(node.args) > 1 else None
    if dim is not None:
        if dim % walk.rank(x) == p.axis:
            _literal_users(node, p.size)
        return None
    for user in list(node.users):
        index = user.args[1] if user.op == "call_function" and user.target is operator.getitem else None
        if not isinstance(index, int):
            return walk.materialize(node, x)
    for user in list(node.users):
        if user.args[1] % walk.rank(x) == p.axis:
            _literal_users(user, p.size)
    return None


@register_shrink_rule(torch.cat, "cat", torch.concat)
def _cat(walk: ShrinkWalk, node: fx.Node) -> None:
    parts = node.args[0] if node.args else node.kwargs.get("tensors")
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    held = [walk.present(t) for t in parts] if isinstance(parts, (list, tuple)) else []
    if not any(held):
        return None
    rank = walk.rank(node)
    if rank is None or not all(isinstance(t, fx.Node) and walk.shape(t) is not None for t in parts):
        return walk.opaque(node)
    dim %= rank
    if any(p is not None and p.axis != dim for p in held):
        return walk.opaque(node)
    index, offset = [], 0
    for t, p in zip(parts, held):
        size = walk.shape(t)[dim]
        index.append((p.index if p is not None else torch.arange(size)) + offset)
        offset += size
    walk.set_present(node, Present(dim, torch.cat(index), offset))
    return None
