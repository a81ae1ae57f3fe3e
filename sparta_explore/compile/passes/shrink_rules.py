"""How each op family holds cut channels, for the `shrink` pass: one rule per fx target (or module class).

A rule reads which channels its inputs hold (`walk.present`) and the TeSA of its output
(`walk.kept`), rewrites its node if it must (a smaller module, a new size in a reshape, an
aligned add) and says what its output holds (`walk.set_present`). Where it cannot, it hands
the input back at full width (`walk.materialize`) and shrinking stops there.

Example:
    >>> rule_for(gm, node) is _weighted   # doctest: +SKIP
    True
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable

import torch
import torch.fx as fx
from torch import nn

from sparta_explore.compile.passes.channel_ops import (
    ADDS,
    ELEMENTWISE,
    MULS,
    NORMS,
    POOLS,
    depthwise,
    elementwise_zero_preserving,
    eval_norm,
    lookup,
    op_key,
    scalar,
)
from sparta_explore.compile.passes.graph_edit import clone_module, set_module
from sparta_explore.compile.passes.shrink_ops import AlignedAdd, SelectChannels
from sparta_explore.compile.passes.shrink_walk import Present, ShrinkWalk
from sparta_explore.tesa import TeSA

Rule = Callable[[ShrinkWalk, fx.Node], None]
RULES: dict[object, Rule] = {}


def register_shrink_rule(*targets: object) -> Callable[[Rule], Rule]:
    """Register how ops of these fx targets (module classes, functions, method names) hold cut channels."""
    def add(fn: Rule) -> Rule:
        for t in targets:
            RULES[t] = fn
        return fn
    return add


def rule_for(gm: fx.GraphModule, node: fx.Node) -> Rule | None:
    """The rule for `node` (by its module's class, searched up the class's bases, or its target), or None."""
    if node.op == "call_module":
        for cls in type(gm.get_submodule(node.target)).__mro__:  # by class, or by qualified name (optional deps)
            rule = RULES.get(cls) or RULES.get(f"{cls.__module__}.{cls.__qualname__}")
            if rule is not None:
                return rule
        return None
    return lookup(RULES, node.target)


def _in_out(module: nn.Module) -> bool:
    """Whether the weight is stored (in, out): Hugging Face's Conv1D (GPT-2's linears)."""
    return not isinstance(module, (nn.Linear, nn.Conv2d))


def _module(walk: ShrinkWalk, node: fx.Node) -> nn.Module | None:
    return walk.gm.get_submodule(node.target) if node.op == "call_module" else None


def _sliced(module: nn.Module, rows: torch.Tensor | None, cols: torch.Tensor | None) -> nn.Module:
    out = clone_module(module)
    w = module.weight.detach()
    out_dim, in_dim = (1, 0) if _in_out(module) else (0, 1)
    if rows is not None:
        w = w.index_select(out_dim, rows)
    if cols is not None:
        w = w.index_select(in_dim, cols)
    out.weight = nn.Parameter(w.contiguous(), requires_grad=False)
    if module.bias is not None and rows is not None:
        out.bias = nn.Parameter(module.bias.detach().index_select(0, rows), requires_grad=False)
    if isinstance(module, nn.Linear):
        out.out_features, out.in_features = w.shape[0], w.shape[1]
    elif isinstance(module, nn.Conv2d):
        out.out_channels, out.in_channels = w.shape[0], w.shape[1] * module.groups
    else:
        out.nf = w.shape[1]
    return out


@register_shrink_rule(nn.Linear, nn.Conv2d, "transformers.pytorch_utils.Conv1D")
def _weighted(walk: ShrinkWalk, node: fx.Node) -> None:
    # keeps its kept output rows, reads only the channels its input holds: W[rows][:, cols]
    module = _module(walk, node)
    if len(walk.graph.module_nodes(node.target)) != 1 or len(node.args) != 1 or node.kwargs:
        return walk.opaque(node)
    if isinstance(module, nn.Conv2d) and module.groups != 1:
        return _depthwise(walk, node, module) if depthwise(module) else _grouped(walk, node, module)
    x = node.args[0]
    in_rank, out_rank = walk.rank(x), walk.rank(node)
    if in_rank is None or out_rank is None:
        return walk.opaque(node)
    conv = isinstance(module, nn.Conv2d)
    in_axis, out_axis = (1, 1) if conv else (in_rank - 1, out_rank - 1)
    p = walk.present(x)
    if p is not None and p.axis != in_axis:
        walk.materialize(node, x)
        p = None
    rows = walk.kept(node, out_axis) if node.name not in walk.keep_rows else None
    cols = p.index if p is not None else None
    if rows is None and cols is None:
        return None
    key = ("sliced", node.target, *(None if i is None else i.numpy().tobytes() for i in (rows, cols)))
    set_module(walk.gm, node.target, walk.reused(key, lambda: _sliced(module, rows, cols)))
    stored = (cols, rows) if _in_out(module) else (rows, cols)  # the TeSA is laid out like the weight
    walk.shrunk_weight(f"{node.target}.weight", *stored)
    if module.bias is not None:
        walk.shrunk_weight(f"{node.target}.bias", rows, None)
    walk.counts["ops shrunk"] += 1
    if rows is not None:
        size = module.weight.shape[1 if _in_out(module) else 0]
        walk.counts["channels removed"] += size - len(rows)
        walk.set_present(node, Present(out_axis, rows, size, origin=node.name), layout=True)
    return None


def _conv_rows_kept(walk: ShrinkWalk, node: fx.Node, module: nn.Conv2d, rows: torch.Tensor) -> None:
    # a grouped or depthwise conv now computes `rows` of its outputs: its bias's TeSA, the counts, what it holds
    if module.bias is not None:
        walk.shrunk_weight(f"{node.target}.bias", rows, None)
    walk.counts["ops shrunk"] += 1
    walk.counts["channels removed"] += module.out_channels - len(rows)
    walk.set_present(node, Present(1, rows, module.out_channels))


def _grouped(walk: ShrinkWalk, node: fx.Node, module: nn.Conv2d) -> None:
    # a grouped conv stays grouped only if every group it keeps holds as many input channels and keeps as
    # many output rows as the others (the input's channels come in group order), and a group it drops
    # holds no input channel; else its input comes back at full width
    x = node.args[0]
    p = walk.present(x)
    rows = walk.kept(node, 1)
    if (p is None and rows is None) or (p is not None and p.axis != 1):
        return walk.opaque(node) if p is not None else None
    g, cin, cout = module.groups, module.in_channels // module.groups, module.out_channels // module.groups
    ins = p.index if p is not None else torch.arange(module.in_channels)
    outs = rows if rows is not None else torch.arange(module.out_channels)
    per_in = [ins[(ins >= i * cin) & (ins < (i + 1) * cin)] - i * cin for i in range(g)]
    per_out = [outs[(outs >= i * cout) & (outs < (i + 1) * cout)] for i in range(g)]
    kept = [i for i in range(g) if len(per_out[i])]
    widths = {len(per_in[i]) for i in kept}
    heights = {len(per_out[i]) for i in kept}
    if not kept or len(widths) != 1 or len(heights) != 1 or any(len(per_in[i]) for i in range(g) if i not in kept):
        return walk.opaque(node)
    new_rows = torch.cat([per_out[i] for i in kept])
    w = module.weight.detach()
    weight = torch.cat([w[per_out[i]][:, per_in[i]] for i in kept])
    new = clone_module(module)
    new.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
    if module.bias is not None:
        new.bias = nn.Parameter(module.bias.detach().index_select(0, new_rows), requires_grad=False)
    new.groups, new.in_channels, new.out_channels = len(kept), len(kept) * widths.pop(), len(new_rows)
    set_module(walk.gm, node.target, new)
    tesa = walk.table.get(f"{node.target}.weight")
    if tesa is not None:  # the weight's dim 1 is per group: its TeSA is cut group by group, like the weight
        cut = lambda t: torch.cat([t[per_out[i]][:, per_in[i]] for i in kept])  # noqa: E731
        walk.entries[f"{node.target}.weight"] = TeSA(cut(tesa.bits), cut(tesa.fmt))
    return _conv_rows_kept(walk, node, module, new_rows)


def _depthwise(walk: ShrinkWalk, node: fx.Node, module: nn.Conv2d) -> None:
    # each output channel reads one input channel: the conv keeps the groups whose input is held
    p = walk.present(node.args[0])
    if p is None:
        return None
    if p.axis != 1:
        return walk.opaque(node)
    mult = module.out_channels // module.in_channels
    rows = (p.index.reshape(-1, 1) * mult + torch.arange(mult)).flatten()
    if module.bias is not None:  # a cut input makes its outputs the bias: fine only where that is zero or unread
        cut = torch.ones(module.out_channels, dtype=torch.bool)
        cut[rows] = False
        tesa = walk.table.get(node.name)
        kept = tesa.channels_kept(1) if tesa is not None else torch.ones_like(cut)
        if bool((cut & kept & (module.bias.detach() != 0)).any()):
            return walk.opaque(node)
    new = clone_module(module)
    new.weight = nn.Parameter(module.weight.detach().index_select(0, rows).contiguous(), requires_grad=False)
    if module.bias is not None:
        new.bias = nn.Parameter(module.bias.detach().index_select(0, rows), requires_grad=False)
    new.in_channels, new.out_channels, new.groups = len(p.index), len(rows), len(p.index)
    set_module(walk.gm, node.target, new)
    walk.shrunk_weight(f"{node.target}.weight", rows, None)
    return _conv_rows_kept(walk, node, module, rows)


@register_shrink_rule(*NORMS)
def _norm(walk: ShrinkWalk, node: fx.Node) -> None:
    # eval BatchNorm: per channel y = s x + t; a cut channel would read t, so every kept channel must be held
    module, p = _module(walk, node), walk.present(node.args[0])
    if p is None:
        return None
    if p.axis != 1 or not eval_norm(module) or not walk.kept_within(node, p):
        return walk.opaque(node)
    new = clone_module(module)
    for name in ("weight", "bias"):
        value = getattr(module, name)
        if value is not None:
            setattr(new, name, nn.Parameter(value.detach().index_select(0, p.index), requires_grad=False))
    for name in ("running_mean", "running_var"):
        new._buffers[name] = getattr(module, name).index_select(0, p.index)
    new.num_features = len(p.index)
    set_module(walk.gm, node.target, new)
    walk.set_present(node, p)
    return None


def _elementwise(walk: ShrinkWalk, node: fx.Node) -> None:
    # per element: a cut channel reads as 0, so the op must map 0 to 0 there or that channel must be unread
    x = node.args[0] if node.args else None
    p = walk.present(x)
    if p is None:
        return None
    if any(a is not x for a in node.all_input_nodes):
        return walk.opaque(node)
    module = _module(walk, node)
    zero = elementwise_zero_preserving(module, op_key(walk.gm, node), tuple(node.args))
    if not zero and not walk.kept_within(node, p):
        return walk.materialize(node, x)
    walk.set_present(node, p)
    return None


for _target in ELEMENTWISE:
    register_shrink_rule(_target)(_elementwise)


@register_shrink_rule(*POOLS)
def _pool(walk: ShrinkWalk, node: fx.Node) -> None:
    p = walk.present(node.args[0])
    if p is None:
        return None
    if p.axis != 1 or walk.rank(node.args[0]) != 4 or len(node.all_input_nodes) != 1:
        return walk.opaque(node)
    walk.set_present(node, p)
    return None


def _operand_axis(walk: ShrinkWalk, node: fx.Node, operand: fx.Node, axis: int) -> int | None:
    """The dim of `operand` that broadcasts onto `node`'s `axis`, or None when it has none there."""
    out, shape = walk.rank(node), walk.shape(operand)
    if out is None or shape is None:
        return None
    dim = axis - (out - len(shape))
    return dim if dim >= 0 else None


def _replace(walk: ShrinkWalk, node: fx.Node, name: str, module: nn.Module, args: tuple) -> fx.Node:
    new = walk.add_op(name, module, args, node)
    node.replace_all_uses_with(new)
    walk.renames[node.name] = new.name
    walk.gm.graph.erase_node(node)
    return new


def _sliced_attr(walk: ShrinkWalk, node: fx.Node, operand: fx.Node, dim: int, p: Present) -> bool:
    """Replace a parameter / buffer operand that is full along `dim` by its channels at `p.index`."""
    if operand.op != "get_attr":
        return False
    value = walk.gm
    for part in operand.target.split("."):
        value = getattr(value, part)
    name = f"_shrunk_{node.name}_{operand.name}"
    walk.gm.register_buffer(name, value.detach().index_select(dim, p.index).clone())
    with walk.gm.graph.inserting_before(node):
        node.replace_input_with(operand, walk.gm.graph.get_attr(name))
    return True


@register_shrink_rule(*ADDS)
def _add(walk: ShrinkWalk, node: fx.Node) -> None:
    # a + alpha b: two channel sets meet in their union; a constant operand adds to every channel
    if len(node.args) != 2:
        return walk.opaque(node)
    a, b = node.args
    alpha = node.kwargs.get("alpha", 1) * (-1 if op_key(walk.gm, node) in (operator.sub, torch.sub, "sub") else 1)
    pa, pb = walk.present(a), walk.present(b)
    if pa is None and pb is None:
        return None
    if scalar(a) or scalar(b):
        c = a if scalar(a) else b
        p = pa or pb
        if c != 0 and not walk.kept_within(node, p):
            return walk.opaque(node)
        walk.set_present(node, p)
        return None
    if pa is not None and pb is not None:
        if pa.axis != pb.axis or walk.shape(a) != walk.shape(b):
            return walk.opaque(node)
        if torch.equal(pa.index, pb.index):
            walk.set_present(node, pa)
            return None
        union = Present(pa.axis, torch.unique(torch.cat([pa.index, pb.index])), pa.size)
        at = lambda q: None if len(q.index) == len(union.index) else q.positions_in(union)  # noqa: E731
        new = _replace(walk, node, f"add_{node.name}", AlignedAdd(pa.axis, len(union.index), at(pa), at(pb), alpha),
                       (a, b))
        walk.set_present(new, union)
        return None
    p, small, other = (pa, a, b) if pa is not None else (pb, b, a)
    if other.op != "get_attr" and walk.shape(other) == walk.shape(node):  # it holds every channel: add ours in
        module = AlignedAdd(p.axis, p.size, p.index, None, alpha) if small is a else \
            AlignedAdd(p.axis, p.size, None, p.index, alpha)
        _replace(walk, node, f"add_{node.name}", module, (a, b))
        return None
    dim = _operand_axis(walk, node, other, p.axis)
    if dim is not None and walk.shape(other)[dim] != 1 and not _sliced_attr(walk, node, other, dim, p):
        return walk.opaque(node)
    if not walk.kept_within(node, p):  # the constant lands in cut channels too: they must be unread
        return walk.opaque(node)
    walk.set_present(node, p)
    return None


@register_shrink_rule(*MULS)
def _mul(walk: ShrinkWalk, node: fx.Node) -> None:
    # a * b or a / b: zero stays zero, so a cut channel of a stays cut; b meets a's channels
    if len(node.args) != 2 or node.kwargs:
        return walk.opaque(node)
    a, b = node.args
    divide = op_key(walk.gm, node) in (operator.truediv, torch.div, "div")
    pa, pb = walk.present(a), walk.present(b)
    if pa is None and pb is None:
        return None
    if divide and pb is not None:
        return walk.opaque(node)  # a cut divisor would make its channels inf
    if scalar(a) or scalar(b):
        walk.set_present(node, pa or pb)
        return None
    if pa is not None and pb is not None:
        if pa.axis != pb.axis or not torch.equal(pa.index, pb.index):
            return walk.opaque(node)
        walk.set_present(node, pa)
        return None
    p, other = (pa, b) if pa is not None else (pb, a)
    dim = _operand_axis(walk, node, other, p.axis)
    if dim is not None and walk.shape(other)[dim] != 1 and not _sliced_attr(walk, node, other, dim, p):
        picked = walk.add_op(f"select_{node.name}", SelectChannels(dim, p.index), (other,), node)
        node.replace_input_with(other, picked)
    walk.set_present(node, p)
    return None


def _dims(node: fx.Node, rank: int, names: tuple[str, ...], defaults: tuple[int, ...]) -> list[int]:
    out = []
    for i, (name, default) in enumerate(zip(names, defaults)):
        value = node.args[i + 1] if len(node.args) > i + 1 else node.kwargs.get(name, default)
        out.append(value % rank)
    return out


@register_shrink_rule(torch.flatten, "flatten", nn.Flatten)
def _flatten(walk: ShrinkWalk, node: fx.Node) -> None:
    x = node.args[0]
    p, rank = walk.present(x), walk.rank(x)
    if p is None:
        return None
    module = _module(walk, node)
    if module is not None:
        start, end = module.start_dim % rank, module.end_dim % rank
    else:
        start, end = _dims(node, rank, ("start_dim", "end_dim"), (0, -1))
    if p.axis < start:
        walk.set_present(node, p, layout=True)
    elif p.axis > end:
        walk.set_present(node, Present(p.axis - (end - start), p.index, p.size, p.origin), layout=True)
    elif p.axis == start:
        inner = math.prod(walk.shape(x)[start + 1:end + 1])
        index = (p.index.reshape(-1, 1) * inner + torch.arange(inner)).flatten()
        walk.set_present(node, Present(start, index, p.size * inner, p.origin), layout=True)
    else:
        walk.opaque(node)
    return None
