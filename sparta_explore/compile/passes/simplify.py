"""The `simplify` pass: drop what computes nothing (eval dropout, identities, no-op reshapes, x * 1), fold constants.

Each op that can be the identity has a predicate in `IDENTITIES` (keyed by fx target: module
class, function, or method name) saying, from the node and the recorded shapes, whether it
returns its input unchanged; such a node's readers read its input instead. Nodes that depend
on no input and no parameter (buffers and literals only) and draw no random numbers are
computed once and become buffers (`constants folded`). Nodes nobody reads go when the
graph is finished.

Example:
    >>> simplify(graph, table, PassOptions()).changes   # doctest: +SKIP
    {'dropouts removed': 12, 'identities removed': 3, 'no-op reshapes removed': 2, 'constants folded': 0}
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from sparta_explore.compile.passes.base import PassOptions, PassResult, Table, register_pass
from sparta_explore.compile.passes.graph_edit import carried, editable, finished, module_of
from sparta_explore.graph import Graph

Identity = Callable[[Graph, fx.Graph, fx.Node], str | None]  # the counter it falls under, or None
IDENTITIES: dict[object, Identity] = {}


def register_identity(*targets: object) -> Callable[[Identity], Identity]:
    """Register a predicate telling when an op of these targets returns its first argument unchanged."""
    def add(fn: Identity) -> Identity:
        for t in targets:
            IDENTITIES[t] = fn
        return fn
    return add


def _arg(node: fx.Node, i: int, name: str, default: object = None) -> object:
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


@register_identity(nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.Identity)
def _dropout_module(graph: Graph, _: fx.Graph, node: fx.Node) -> str | None:
    module = graph.module.get_submodule(node.target)
    if isinstance(module, nn.Identity):
        return "identities removed"
    return "dropouts removed" if not module.training or module.p == 0 else None


@register_identity(F.dropout, F.dropout1d, F.dropout2d, F.alpha_dropout, torch.dropout, "dropout")
def _dropout_function(graph: Graph, _: fx.Graph, node: fx.Node) -> str | None:
    training = _arg(node, 2, "training", node.op == "call_method")
    p = _arg(node, 1, "p", 0.5)
    return "dropouts removed" if training is False or p == 0 else None


def _same_shape(graph: Graph, node: fx.Node) -> bool:
    src = node.args[0] if node.args else None
    a = graph.tensors.get(src.name) if isinstance(src, fx.Node) else None
    b = graph.tensors.get(node.name)
    return a is not None and b is not None and a.shape == b.shape and a.dtype == b.dtype


def _sizes(node: fx.Node) -> list[object]:
    rest = list(node.args[1:]) or list(node.kwargs.get("shape", node.kwargs.get("size", ())))
    return list(rest[0]) if len(rest) == 1 and isinstance(rest[0], (tuple, list, torch.Size)) else rest


def _dim_of(src: fx.Node, value: object) -> int | None:
    """The dim `value` reads off `src`'s shape (`src.size(d)`, `src.shape[d]`), else None."""
    if not isinstance(value, fx.Node):
        return None
    if value.op == "call_method" and value.target == "size" and value.args[0] is src and len(value.args) > 1:
        return value.args[1]
    if value.op == "call_function" and value.target in (operator.getitem, torch.ops.aten.sym_size.int) \
            and isinstance(value.args[0], fx.Node):
        shape_of = value.args[0]
        if value.target is torch.ops.aten.sym_size.int and shape_of is src:
            return value.args[1]
        if (shape_of.op == "call_function" and shape_of.target is getattr and shape_of.args == (src, "shape")) or \
                (shape_of.op == "call_method" and shape_of.target == "size" and shape_of.args == (src,)):
            return value.args[1] if isinstance(value.args[1], int) else None
    return None


@register_identity("view", "reshape", torch.reshape, "expand")
def _no_op_reshape(graph: Graph, _: fx.Graph, node: fx.Node) -> str | None:
    # a reshape to the shape it already has, whatever the input sizes: every requested dim is the
    # input's own size there, the literal the model always uses, or one -1 with the rest matched
    if not _same_shape(graph, node):
        return None
    src = node.args[0]
    shape = graph.tensors[src.name].shape
    sizes = _sizes(node)
    if len(sizes) != len(shape) or sum(1 for s in sizes if s == -1) > 1:
        return None
    for d, s in enumerate(sizes):
        if s == -1 or _dim_of(src, s) in (d, d - len(shape)):
            continue
        if not (isinstance(s, int) and s == shape[d]) or (d == 0 and len(shape) > 1):
            return None  # a literal batch size: the model itself breaks on other batches, keep it saying so
    return "no-op reshapes removed"


@register_identity("flatten", torch.flatten)
def _no_op_flatten(graph: Graph, _: fx.Graph, node: fx.Node) -> str | None:
    return "no-op reshapes removed" if _same_shape(graph, node) else None


@register_identity("to", "type_as", "float")
def _no_op_cast(graph: Graph, _: fx.Graph, node: fx.Node) -> str | None:
    if node.target == "to" and any(isinstance(a, (str, torch.device)) for a in node.args[1:]):
        return None  # a device move: not ours to drop
    return "identities removed" if _same_shape(graph, node) else None


def _scalar_identity(unit: float) -> Identity:
    def check(graph: Graph, _: fx.Graph, node: fx.Node) -> str | None:
        if len(node.args) == 2 and not node.kwargs and isinstance(node.args[1], (int, float)) \
                and node.args[1] == unit and isinstance(node.args[0], fx.Node) and _same_shape(graph, node):
            return "identities removed"
        return None
    return check


register_identity(operator.mul, operator.truediv, torch.mul, torch.div, "mul", "div")(_scalar_identity(1.0))
register_identity(operator.add, operator.sub, torch.add, torch.sub, "add", "sub")(_scalar_identity(0.0))

_RANDOM = ("rand", "dropout", "bernoulli", "normal", "uniform", "multinomial", "poisson")


def _identity_of(graph: Graph, fx_graph: fx.Graph, node: fx.Node) -> str | None:
    module = module_of(graph.module, node)
    key: object = type(module) if module is not None else node.target
    try:
        check = IDENTITIES.get(key)
    except TypeError:  # unhashable targets
        return None
    if check is None or not node.args or not isinstance(node.args[0], fx.Node):
        return None
    return check(graph, fx_graph, node)


def _constant_nodes(graph: Graph, fx_graph: fx.Graph) -> list[fx.Node]:
    """Nodes computed from buffers and literals only (no input, no parameter, nothing random), outermost first."""
    params = {n for n, _ in graph.module.named_parameters(remove_duplicate=False)}
    constant: set[fx.Node] = set()
    for node in fx_graph.nodes:
        if node.op == "get_attr":
            if node.target not in params:
                constant.add(node)
            continue
        if node.op not in ("call_function", "call_method"):
            continue
        name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
        if any(word in name for word in _RANDOM):
            continue
        if all(a in constant for a in node.all_input_nodes) and node.all_input_nodes:
            constant.add(node)
    # fold where a constant meets the rest of the graph; its constant inputs go with it
    return [n for n in constant if n.op != "get_attr" and n.name in graph.tensors
            and any(u not in constant for u in n.users)]


def constant_values(gm: fx.GraphModule, nodes: list[fx.Node]) -> dict[str, Any]:
    """The values of constant nodes of `gm` (`_constant_nodes`): only they and their ancestors run, not the model.

    Example:
        >>> constant_values(gm, _constant_nodes(graph, gm.graph))  # doctest: +SKIP
    """
    needed: set[fx.Node] = set()
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if node not in needed:
            needed.add(node)
            stack.extend(node.all_input_nodes)
    interpreter = fx.Interpreter(gm)
    with torch.inference_mode():
        for node in gm.graph.nodes:  # graph order: every input before its readers
            if node in needed:
                interpreter.env[node] = interpreter.run_node(node)
    return {n.name: interpreter.env[n] for n in nodes}


def _fold_constants(graph: Graph, gm: fx.GraphModule) -> int:
    nodes = _constant_nodes(graph, gm.graph)
    if not nodes:
        return 0
    values = constant_values(gm, nodes)
    folded = 0
    for node in nodes:
        value = values.get(node.name)
        if not isinstance(value, torch.Tensor):
            continue
        target = f"_folded_{node.name}"
        gm.register_buffer(target, value.clone())
        with gm.graph.inserting_before(node):
            attr = gm.graph.get_attr(target)
        node.replace_all_uses_with(attr)
        folded += 1
    return folded


@register_pass("simplify")
def simplify(graph: Graph, table: Table, options: PassOptions) -> PassResult:
    """Drop eval dropout, identities and no-op reshapes; compute constant subexpressions once.

    Example:
        >>> simplify(graph, table, PassOptions()).summary()   # doctest: +SKIP
        'dropouts removed 24'
    """
    gm = editable(graph)
    counts = {"dropouts removed": 0, "identities removed": 0, "no-op reshapes removed": 0, "constants folded": 0}
    renames: dict[str, str] = {}
    for node in list(gm.graph.nodes):
        if node.op not in ("call_module", "call_function", "call_method"):
            continue
        what = _identity_of(graph, gm.graph, node)
        if what is None or node.name in graph.outputs:
            continue
        src = node.args[0]
        if len(src.users) == 1:
            renames[node.name] = src.name  # its readers are the input's only readers: they keep their TeSA
        elif not _same_bits(table, src.name, node.name):
            continue  # the input's other readers take it at other bits: the node keeps them apart
        node.replace_all_uses_with(src)
        gm.graph.erase_node(node)
        counts[what] += 1
    counts["constants folded"] = _fold_constants(graph, gm)
    new = finished(graph, gm, same_values=True)  # identities gone, constants folded: no value changed
    return PassResult(new, carried(table, new, renames), counts)


def _same_bits(table: Table, a: str, b: str) -> bool:
    ta, tb = table.get(a), table.get(b)
    bits = lambda t: t.kept_bits() if t is not None else [32]  # noqa: E731
    return bits(ta) == bits(tb)
