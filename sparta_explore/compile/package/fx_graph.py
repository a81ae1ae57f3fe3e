"""An fx graph as data: one record per node (name, op, target, arguments), and how the module is called.

Targets: module paths and attribute names as strings, functions by qualified name
(`package.names`: only trusted code), tensor methods by name (checked to be methods of
`torch.Tensor`). Arguments go through the value codecs, nodes by name. An exported
module's calling convention (its pytree input and output specs, e.g. a Hugging Face
`SequenceClassifierOutput`) is kept as torch's own JSON of the spec, its node types
imported from trusted code before the spec is read.

Example:
    >>> gm = fx.symbolic_trace(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    >>> [n["op"] for n in encode_graph(Encoder(TensorStore()), gm, "m")["nodes"]]
    ['placeholder', 'call_module', 'call_module', 'output']
"""

from __future__ import annotations

import json
import re
from typing import Any

import torch
import torch.fx as fx
from torch import nn  # noqa: F401  (used by the docstring example)
from torch.fx.graph import _PyTreeCodeGen, _PyTreeInfo
from torch.utils import _pytree as pytree

from sparta_explore.compile.package.names import resolve
from sparta_explore.compile.package.tensors import TensorStore  # noqa: F401  (used by the docstring example)
from sparta_explore.compile.package.values import Decoder, Encoder
from sparta_explore.errors import PackageError

MODULE_PATH = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*")
OPS = ("placeholder", "get_attr", "call_module", "call_method", "call_function", "output")


def _codegen(gm: fx.GraphModule, where: str) -> dict[str, Any]:
    codegen = gm.graph._codegen
    if isinstance(codegen, _PyTreeCodeGen):
        info = codegen.pytree_info
        try:
            return {"kind": "pytree", "orig_args": list(info.orig_args),
                    "in_spec": None if info.in_spec is None else pytree.treespec_dumps(info.in_spec),
                    "out_spec": None if info.out_spec is None else pytree.treespec_dumps(info.out_spec)}
        except (TypeError, NotImplementedError) as e:
            raise PackageError(f"{where}: its input/output structure cannot be saved ({e})") from None
    if type(codegen) is not fx.graph.CodeGen:
        raise PackageError(f"{where}: a graph with a custom code generator ({type(codegen).__name__}) cannot be saved")
    return {"kind": "plain"}


def encode_graph(enc: Encoder, gm: fx.GraphModule, where: str) -> dict[str, Any]:
    """The nodes and calling convention of `gm`'s graph as JSON data (tensors go to `enc`'s store).

    Example:
        >>> encode_graph(Encoder(TensorStore()), fx.symbolic_trace(nn.ReLU()), "m")["codegen"]
        {'kind': 'plain'}
    """
    nodes = []
    for node in gm.graph.nodes:
        at = f"{where} node {node.name!r}"
        target = enc.encode(node.target, at) if node.op == "call_function" else node.target
        if not isinstance(target, (str, dict)):
            raise PackageError(f"{at}: target {node.target!r} cannot be saved")
        nodes.append({"name": node.name, "op": node.op, "target": target, "args": enc.encode(tuple(node.args), at),
                      "kwargs": enc.encode(dict(node.kwargs), at)})
    return {"nodes": nodes, "codegen": _codegen(gm, where)}


def _spec(data: str | None, dec: Decoder, where: str) -> pytree.TreeSpec | None:
    if data is None:
        return None
    try:
        types = _spec_types(json.loads(data))
    except (ValueError, TypeError) as e:
        raise PackageError(f"{where}: unreadable input/output spec ({e})") from None
    for name in types:  # their modules register the pytree node types (transformers' ModelOutput classes)
        if not name.startswith("builtins.") and not name.startswith("collections."):
            resolve(name, where, dec.allow)
    try:
        return pytree.treespec_loads(data)
    except (ValueError, TypeError, KeyError, NotImplementedError) as e:
        raise PackageError(f"{where}: unreadable input/output spec ({e})") from None


def _spec_types(data: Any) -> set[str]:
    """The node type names in a serialized TreeSpec (torch's format: [version, {type, context, children_spec}])."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("type"), str):
                found.add(node["type"])
            for child in node.get("children_spec") or ():
                walk(child)

    if isinstance(data, list) and len(data) == 2:
        walk(data[1])
    return found


def _target(node: dict, dec: Decoder, at: str) -> Any:
    op, target = node["op"], node["target"]
    if op == "call_function":
        fn = dec.decode(target, at)
        if not callable(fn):
            raise PackageError(f"{at}: call target {target!r} is not callable")
        return fn
    if not isinstance(target, str):
        raise PackageError(f"{at}: malformed target {target!r}")
    if op == "call_method" and (target.startswith("__") or not callable(getattr(torch.Tensor, target, None))):
        raise PackageError(f"{at}: {target!r} is not a tensor method")
    if op in ("get_attr", "call_module") and not MODULE_PATH.fullmatch(target):
        raise PackageError(f"{at}: malformed module path {target!r}")
    return target


def decode_graph(dec: Decoder, data: Any, root: torch.nn.Module, where: str) -> fx.GraphModule:
    """The GraphModule over `root`'s children and tensors that `data` (from `encode_graph`) describes.

    Example:
        >>> data = encode_graph(Encoder(TensorStore()), fx.symbolic_trace(nn.ReLU()), "m")
        >>> from sparta_explore.compile.package.tensors import TensorTable
        >>> decode_graph(Decoder(TensorTable({}, {}, "m")), data, nn.Module(), "m")(torch.tensor([-1.0])).tolist()
        [0.0]
    """
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list) or not isinstance(data.get("codegen"),
                                                                                                dict):
        raise PackageError(f"{where}: malformed graph")
    graph = fx.Graph()
    nodes: dict[str, fx.Node] = {}
    reader = dec.with_nodes(nodes)
    for node in data["nodes"]:
        if not isinstance(node, dict) or node.get("op") not in OPS or not isinstance(node.get("name"), str):
            raise PackageError(f"{where}: malformed graph node {node!r:.80}")
        at = f"{where} node {node['name']!r}"
        args, kwargs = reader.decode(node.get("args"), at), reader.decode(node.get("kwargs"), at)
        if not isinstance(args, tuple) or not isinstance(kwargs, dict):
            raise PackageError(f"{at}: malformed arguments")
        target = _target(node, reader, at)
        if target is getattr and len(args) > 1 and isinstance(args[1], str) and args[1].startswith("__"):
            raise PackageError(f"{at}: getattr of the private attribute {args[1]!r}")
        nodes[node["name"]] = graph.create_node(node["op"], target, args, kwargs, name=node["name"])
    codegen = data["codegen"]
    if codegen.get("kind") == "pytree":
        names = codegen.get("orig_args")
        if not isinstance(names, list) or not all(isinstance(n, str) and n.isidentifier() for n in names):
            raise PackageError(f"{where}: malformed argument names")
        graph._codegen = _PyTreeCodeGen(_PyTreeInfo(names, _spec(codegen.get("in_spec"), dec, where),
                                                    _spec(codegen.get("out_spec"), dec, where)))
    elif codegen.get("kind") != "plain":
        raise PackageError(f"{where}: unknown calling convention {codegen.get('kind')!r}")
    try:
        graph.lint()
        return fx.GraphModule(root, graph)
    except (RuntimeError, AttributeError, TypeError, ValueError) as e:
        raise PackageError(f"{where}: the stored graph does not fit its modules ({type(e).__name__}: {e})") from None

