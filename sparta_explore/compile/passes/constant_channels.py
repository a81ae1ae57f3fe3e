"""The `constant_channels` pass: channels whose value no input can change are folded into their readers' biases.

A conv or linear output channel whose weights are all pruned still carries its bias, then
BatchNorm's shift, then the activation of that constant (and a depthwise conv of it, a map
that differs only at the borders): a value that is the same for every input, so it is not
zero and propagation rightly keeps it. This pass finds such *input-independent* channels
with rules over the graph's structure (never from values, which could be constant by
chance): a linear or groups-1 conv row is independent when every input channel it reads
with a non-zero weight is; per-element ops, pooling, eval BatchNorm and depthwise convs
pass a channel's state on; a binary op with a constant operand passes the other's.

At each linear / groups-1 conv that reads independent channels, their contribution is
computed once from a run on the example's first item (every item holds the same value there;
the whole example runs when the graph cannot take one item) and added to
the bias, or, when it is not the same at every position (a padded conv of a constant
map), added after the op as a map for that input size (`CompiledModel` then runs only
inputs of that size). Those weight columns become zero and pruned in the table; then
propagation runs again on the rewritten graph, so the constant channels, read by nobody
now, are pruned back to the op that made them and `shrink` can cut them out.

Example:
    >>> constant_channels(graph, table, PassOptions()).summary()   # doctest: +SKIP
    'channels folded 412, readers rewritten 16, bias maps 16'
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from sparta_explore.compact import any_true
from sparta_explore.compile.passes.base import PassOptions, PassResult, Table, register_pass
from sparta_explore.compile.passes.channel_ops import (
    ADDS,
    MULS,
    depthwise,
    draws_random,
    elementwise_zero_preserving,
    eval_norm,
    is_pool,
    mixer,
    op_key,
    scalar,
)
from sparta_explore.compile.passes.graph_edit import (
    carried,
    clone_module,
    editable,
    example_values,
    finished,
    first_item_values,
    set_module,
)
from sparta_explore.graph import Graph
from sparta_explore.tesa import TeSA

CONSTANT = "constant"  # the whole tensor is input-independent (a parameter, a buffer, a literal)
SIZE_SPECIALIZED = "sparta_constant_"  # buffers named so hold maps for the example's input size only


@dataclass(frozen=True)
class Independent:
    """Along `axis`, which channels hold a value that does not depend on the model's inputs."""

    axis: int
    mask: torch.Tensor


def _channel_axis(module: nn.Module, rank: int) -> int:
    return 1 if isinstance(module, nn.Conv2d) else rank - 1


def _reads(module: nn.Module) -> torch.Tensor:
    """(out, in) bool: whether output channel o reads input channel c through a non-zero weight."""
    w = module.weight.detach()
    return any_true(w.bool().reshape(w.shape[0], w.shape[1], -1), dim=2)  # bool() is `!= 0`, 8x faster


def _rank(graph: Graph, node: object) -> int | None:
    info = graph.tensors.get(node.name) if isinstance(node, fx.Node) else None
    return len(info.shape) if info is not None else None


def _state_of(states: dict, graph: Graph, value: object) -> object:
    if scalar(value):
        return CONSTANT
    return states.get(value.name) if isinstance(value, fx.Node) else None


def _binary(states: dict, graph: Graph, node: fx.Node) -> object:
    a, b = (_state_of(states, graph, v) for v in node.args[:2])
    if a == CONSTANT and b == CONSTANT:
        return CONSTANT
    if a == CONSTANT or b == CONSTANT:
        other = b if a == CONSTANT else a
        return other if isinstance(other, Independent) else None
    if isinstance(a, Independent) and isinstance(b, Independent) and a.axis == b.axis \
            and a.mask.shape == b.mask.shape:
        return Independent(a.axis, a.mask & b.mask)
    return None


def _independence(graph: Graph, gm: fx.GraphModule) -> tuple[dict, list[tuple[fx.Node, torch.Tensor]]]:
    """Every node's independent channels, and the fold points: (linear / conv node, its independent input channels)."""
    states: dict[str, object] = {}
    folds: list[tuple[fx.Node, torch.Tensor]] = []
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            states[node.name] = CONSTANT
            continue
        if node.op not in ("call_module", "call_function", "call_method") or not node.args:
            continue
        module = gm.get_submodule(node.target) if node.op == "call_module" else None
        key = op_key(gm, node)
        src = _state_of(states, graph, node.args[0])
        rank = _rank(graph, node)
        if mixer(module) and rank is not None:
            reads = _reads(module)
            in_axis = _channel_axis(module, _rank(graph, node.args[0]) or rank)
            if src == CONSTANT:
                continue  # an op on constants: simplify's constant folding, not ours
            indep = src.mask if isinstance(src, Independent) and src.axis == in_axis else \
                torch.zeros(reads.shape[1], dtype=torch.bool)
            out = ~any_true(reads & ~indep, dim=1)
            if any_true(out):
                states[node.name] = Independent(_channel_axis(module, rank), out)
            if any_true(reads & indep) and len(graph.module_nodes(node.target)) == 1:
                folds.append((node, indep & any_true(reads, dim=0)))
        elif module is not None and depthwise(module) and isinstance(src, Independent) and src.axis == 1:
            mult = module.out_channels // module.in_channels
            states[node.name] = Independent(1, src.mask.repeat_interleave(mult))
        elif isinstance(src, Independent) and not draws_random(module, key, tuple(node.args), node.kwargs) and (
                elementwise_zero_preserving(module, key, tuple(node.args)) is not None or is_pool(key)
                or eval_norm(module)):
            states[node.name] = src
        elif key in ADDS or key in MULS:
            state = _binary(states, graph, node)
            if state is not None:
                states[node.name] = state
    return states, folds


def _masked_input(x: torch.Tensor, axis: int, indep: torch.Tensor) -> torch.Tensor:
    shape = [1] * x.dim()
    shape[axis] = -1
    return x[:1] * indep.reshape(shape).to(x.dtype)


def _contribution(module: nn.Module, x0: torch.Tensor) -> torch.Tensor:
    w = module.weight.detach()
    if isinstance(module, nn.Conv2d):
        return F.conv2d(x0, w, None, module.stride, module.padding, module.dilation)
    return F.linear(x0, w)


def _uniform(contribution: torch.Tensor, axis: int) -> torch.Tensor | None:
    """The per-channel value when the contribution is the same at every position, else None."""
    moved = contribution.movedim(axis, -1).reshape(-1, contribution.shape[axis])
    return moved[0] if bool((moved == moved[:1]).all()) else None


def _folded_module(module: nn.Module, dead: torch.Tensor, bias: torch.Tensor | None) -> nn.Module:
    out = clone_module(module)
    w = module.weight.detach().clone()
    w[:, dead] = 0
    out.weight = nn.Parameter(w, requires_grad=False)
    if bias is not None:
        out.bias = nn.Parameter(bias, requires_grad=False)
    return out


def _pruned_columns(tesa: TeSA | None, shape: tuple[int, ...], dead: torch.Tensor) -> TeSA:
    tesa = tesa or TeSA.dense(shape)
    mask = torch.zeros(shape, dtype=torch.bool)
    mask[:, dead] = True
    return tesa.prune(mask)


@register_pass("constant_channels", cuts_channels=True)
def constant_channels(graph: Graph, table: Table, options: PassOptions) -> PassResult:
    """Fold input-independent channels into their readers' biases, prune those weights, propagate again.

    Example:
        >>> result = constant_channels(graph, table, PassOptions())   # doctest: +SKIP
    """
    from sparta_explore.propagation import run_propagation

    gm = editable(graph)
    _, folds = _independence(graph, gm)
    counts = {"channels folded": 0, "readers rewritten": 0, "bias maps": 0}
    if not folds:
        return PassResult(graph, table, counts)
    read = {n.name: n.args[0].name for n, _ in folds}  # before any bias map stands between two fold points
    # input-independent values are alike in every item: one item's run has them (the full example's if it must)
    values = first_item_values(graph, read.values()) or example_values(graph, read.values())
    entries = dict(table)
    notes, readers = [], []
    for node, indep in folds:
        module = gm.get_submodule(node.target)
        x = values[read[node.name]]
        axis = _channel_axis(module, x.dim())
        contribution = _contribution(module, _masked_input(x, axis, indep))
        per_channel = _uniform(contribution, _channel_axis(module, contribution.dim()))
        bias = module.bias.detach() if module.bias is not None else torch.zeros(module.weight.shape[0])
        if per_channel is None and not isinstance(module, nn.Conv2d):
            continue  # a linear whose constant input varies over tokens: left as it is
        new_bias = bias + per_channel if per_channel is not None else None
        set_module(gm, node.target, _folded_module(module, indep, new_bias))
        if per_channel is None:  # a padded conv of a constant map: the same map for every sample of this size
            name = f"{SIZE_SPECIALIZED}{node.name}"
            gm.register_buffer(name, contribution.detach().clone())
            with gm.graph.inserting_after(node):
                bias_map = gm.graph.get_attr(name)
            with gm.graph.inserting_after(bias_map):
                added = gm.graph.call_function(operator.add, (node, bias_map))
            node.replace_all_uses_with(added, delete_user_cb=lambda user, added=added: user is not added)
            counts["bias maps"] += 1
            notes.append(f"{node.name}: constant input channels add a {tuple(contribution.shape[1:])} map: "
                         "compiled for this input size")
        weight = f"{node.target}.weight"
        entries[weight] = _pruned_columns(table.get(weight), tuple(module.weight.shape), indep)
        counts["channels folded"] += int(indep.sum())
        counts["readers rewritten"] += 1
        readers.append(node.name)
    # folding is exact: every node computes what it did, and without a bias map no node is new (no model run)
    new = finished(graph, gm, same_values=counts["bias maps"] == 0)
    # unchecked: propagation's own self-check runs the model twice more (BERT-base: 2 s), and compile checks the
    # result against the user's table anyway (an unsound rule there runs the masked model, never a wrong answer).
    # Only what the folds changed runs, from the readers rewritten (BERT-base 32x32: 341 visits -> 72): the rest
    # keeps its entry, as propagated as it came; every op runs where a bias map now stands before readers
    start = None if counts["bias maps"] else readers
    result = run_propagation(new, carried(entries, new), check=False, start=start)
    return PassResult(new, result.table, counts, tuple(notes))

