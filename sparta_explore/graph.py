"""Capture: a model as a torch.fx graph, with the shape and dtype of every tensor.

`capture` traces the model symbolically, then runs the graph once on the example inputs
to record each value's shape and dtype. Tensor names are parameter/buffer FQNs for
weights (``"fc1.weight"``) and fx node names for activations (``"relu_1"``); these are the
keys of a `TeSATable`.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
import torch.fx as fx
from torch import nn

from sparta_explore.errors import CaptureError


@dataclass(frozen=True)
class TensorInfo:
    """Shape and dtype of one tensor of the graph; `kind` is param, buffer or activation."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    kind: str

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass
class Graph:
    """A traced model plus the shape/dtype of every tensor in it.

    Example:
        >>> g = capture(nn.Sequential(nn.Linear(4, 3)), (torch.randn(2, 4),))
        >>> g.tensors["0.weight"].shape, g.tensors["_0"].shape
        ((3, 4), (2, 3))
    """

    module: fx.GraphModule
    root: nn.Module
    tensors: dict[str, TensorInfo]
    inputs: list[str]
    outputs: list[str]
    aliases: dict[str, str] = field(default_factory=dict)
    attr_nodes: dict[str, str] = field(default_factory=dict)
    constants: dict[str, Any] = field(default_factory=dict)
    tuple_shapes: dict[str, list[tuple[int, ...]]] = field(default_factory=dict)
    example_inputs: tuple = ()

    @property
    def fx_graph(self) -> fx.Graph:
        return self.module.graph

    def nodes(self) -> Iterator[fx.Node]:
        """The op nodes (call_module, call_function, call_method) in topological order."""
        return (n for n in self.module.graph.nodes if n.op in ("call_module", "call_function", "call_method"))

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Tensor name -> shape, for binding a `TeSATable` to this graph."""
        return {name: info.shape for name, info in self.tensors.items()}

    def tensor_name(self, node: fx.Node) -> str:
        """The table name of the value `node` produces: the FQN for a get_attr of a parameter."""
        return self.attr_nodes.get(node.name, node.name)

    def canonical(self, name: str) -> str:
        """The canonical name of a tensor that is shared under several FQNs (tied weights)."""
        return self.aliases.get(name, name)

    def params_of(self, node: fx.Node) -> dict[str, str]:
        """For a call_module node, its direct parameters and buffers: local name -> FQN.

        Example:
            >>> g.params_of(next(g.nodes()))  # doctest: +SKIP
            {'weight': '0.weight', 'bias': '0.bias'}
        """
        if node.op != "call_module":
            return {}
        mod = self.module.get_submodule(node.target)
        out = {n: f"{node.target}.{n}" for n, _ in mod.named_parameters(recurse=False, remove_duplicate=False)}
        out.update({n: f"{node.target}.{n}" for n, b in mod.named_buffers(recurse=False) if b is not None})
        return out

    def module_nodes(self, fqn: str) -> list[fx.Node]:
        """The call_module nodes that call the submodule `fqn` (more than one if reused)."""
        return [n for n in self.module.graph.nodes if n.op == "call_module" and n.target == fqn]

    def summary(self) -> pd.DataFrame:
        """One row per tensor: name, kind, shape, dtype."""
        return pd.DataFrame([{"name": n, "kind": i.kind, "shape": "x".join(map(str, i.shape)) or "scalar",
                              "dtype": str(i.dtype).replace("torch.", "")} for n, i in self.tensors.items()],
                            columns=["name", "kind", "shape", "dtype"])


class _Tracer(fx.Tracer):
    """fx tracer that honours extra leaf modules and remembers which module it is inside."""

    def __init__(self, leaf_types: tuple[type, ...], leaf_names: frozenset[str]) -> None:
        super().__init__()
        self.leaf_types = leaf_types
        self.leaf_names = leaf_names
        self.scope_trail: list[tuple[str, str]] = []

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        if qualname in self.leaf_names or (self.leaf_types and isinstance(m, self.leaf_types)):
            return True
        return super().is_leaf_module(m, qualname)

    def call_module(self, m: nn.Module, forward: Any, args: Any, kwargs: Any) -> Any:
        # On failure the stack is left as it was, so the error can name the innermost module.
        self.scope_trail.append((self.path_of_module(m), type(m).__name__))
        out = super().call_module(m, forward, args, kwargs)
        self.scope_trail.pop()
        return out


def _user_frame(exc: BaseException) -> str:
    """The innermost traceback frame outside torch, i.e. the user's line that failed."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "/torch/" not in f.filename.replace("\\", "/") and f.filename != __file__]
    if not frames:
        return ""
    f = frames[-1]
    line = f" `{f.line.strip()}`" if f.line else ""
    return f" at {f.filename}:{f.lineno}{line}"


def _trace_error(exc: Exception, tracer: _Tracer) -> CaptureError:
    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if tracer.scope_trail:
        path, cls = tracer.scope_trail[-1]
        where = f"module {path or '<root>'!r} ({cls})"
        fix = (f"mark it as a leaf so it is kept whole: capture(model, inputs, leaf_modules=[{cls}]) "
               f"or leaf_modules=[{path!r}]" if path else
               "move the untraceable code into a submodule and pass it in leaf_modules")
    else:
        where = "the model's own forward"
        fix = "move the untraceable code into a submodule and pass it in leaf_modules"
    return CaptureError(f"cannot trace {where}{_user_frame(exc)}: {type(exc).__name__}: {first_line}. "
                        f"Fix: {fix}, or remove data-dependent control flow.")


class _ShapeRecorder(fx.Interpreter):
    """Runs the graph once, recording each node's output shape; failures name the node."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.values: dict[str, Any] = {}

        self.current: fx.Node | None = None

    def run_node(self, n: fx.Node) -> Any:
        self.current = n
        out = super().run_node(n)
        self.values[n.name] = out
        return out

    def run_example(self, inputs: tuple) -> None:
        """Run once; a failure becomes a `CaptureError` naming the node (fx's own note dropped)."""
        try:
            self.run(*inputs)
        except Exception as e:
            n = self.current
            target = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))
            first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise CaptureError(f"running the example inputs failed at node {n.name!r} ({n.op} {target}): "
                               f"{type(e).__name__}: {first_line}") from None


def _as_tuple(example_inputs: Any) -> tuple:
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs)
    raise CaptureError(f"example_inputs must be a tensor or a tuple of tensors, got {type(example_inputs).__name__}")


def capture(model: nn.Module, example_inputs: Any, *,
            leaf_modules: Sequence[type | str] = ()) -> Graph:
    """Trace `model` with torch.fx and record every tensor's shape and dtype.

    `leaf_modules` (classes or FQNs) are kept as single ops instead of traced through;
    use it for submodules with data-dependent control flow.

    Example:
        >>> g = capture(nn.Sequential(nn.Linear(4, 3), nn.ReLU()), torch.randn(2, 4))
        >>> [n.name for n in g.nodes()]
        ['_0', '_1']
    """
    if not isinstance(model, nn.Module):
        raise CaptureError(f"capture needs an nn.Module, got {type(model).__name__}")
    inputs = _as_tuple(example_inputs)
    leaf_types = tuple(m for m in leaf_modules if isinstance(m, type))
    leaf_names = frozenset(m for m in leaf_modules if isinstance(m, str))
    unknown = [n for n in leaf_names if n and n not in dict(model.named_modules())]
    if unknown:
        raise CaptureError(f"leaf_modules names {unknown} are not submodules of {type(model).__name__}")
    tracer = _Tracer(leaf_types, leaf_names)
    try:
        fx_graph = tracer.trace(model)
    except Exception as e:  # fx raises many types (TraceError, TypeError, ...)
        raise _trace_error(e, tracer) from None
    gm = fx.GraphModule(tracer.root, fx_graph, type(model).__name__)

    placeholders = [n for n in fx_graph.nodes if n.op == "placeholder"]
    required = [n for n in placeholders if not n.args]  # placeholders with defaults have args
    if not len(required) <= len(inputs) <= len(placeholders):
        raise CaptureError(f"{type(model).__name__}.forward takes {len(required)}..{len(placeholders)} inputs "
                           f"({', '.join(n.name for n in placeholders)}), got {len(inputs)} example inputs")
    recorder = _ShapeRecorder(gm)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            recorder.run_example(inputs)
    finally:
        model.train(was_training)

    tensors: dict[str, TensorInfo] = {}
    canonical_of: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        tensors[name] = TensorInfo(tuple(p.shape), p.dtype, "param")
        first = canonical_of.setdefault(id(p), name)
        if first != name:
            aliases[name] = first
    for name, b in model.named_buffers(remove_duplicate=False):
        tensors[name] = TensorInfo(tuple(b.shape), b.dtype, "buffer")

    attr_nodes: dict[str, str] = {}
    constants: dict[str, Any] = {}
    tuple_shapes: dict[str, list[tuple[int, ...]]] = {}
    for n in fx_graph.nodes:
        value = recorder.values.get(n.name)
        if n.op == "get_attr" and n.target in tensors:
            attr_nodes[n.name] = n.target
        elif n.op == "output":
            continue
        elif isinstance(value, torch.Tensor):
            tensors[n.name] = TensorInfo(tuple(value.shape), value.dtype, "activation")
        elif isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value):
            tuple_shapes[n.name] = [tuple(v.shape) for v in value]
        elif _is_constant(value):
            constants[n.name] = value  # sizes, shapes, dims: what later stages need to replay an op
    return Graph(module=gm, root=model, tensors=tensors, inputs=[n.name for n in placeholders],
                 outputs=_output_names(fx_graph), aliases=aliases, attr_nodes=attr_nodes, constants=constants,
                 tuple_shapes=tuple_shapes, example_inputs=tuple(inputs))


def _is_constant(value: Any) -> bool:
    if isinstance(value, (bool, int, float, str, type(None), torch.Size, torch.dtype, slice)):
        return True
    return isinstance(value, (tuple, list)) and all(_is_constant(v) for v in value)


def _output_names(fx_graph: fx.Graph) -> list[str]:
    out_node = next(n for n in fx_graph.nodes if n.op == "output")
    names: list[str] = []
    fx.node.map_arg(out_node.args, lambda a: names.append(a.name) or a)
    return names
