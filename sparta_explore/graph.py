"""Capture: a model as a torch.fx graph, with the shape and dtype of every tensor.

`capture` traces the model (fx symbolic tracing, or torch.export for what fx cannot trace;
see `sparta_explore.tracing`), or takes a GraphModule as it is, then runs the graph once on
the example inputs to record each value's shape and dtype. Tensor names are parameter/buffer FQNs for
weights (``"fc1.weight"``) and fx node names for activations (``"relu_1"``); these are the
keys of a `TeSATable`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
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
    call_args: tuple = ()
    call_kwargs: dict[str, Any] = field(default_factory=dict)
    method: str = "fx"
    notes: tuple[str, ...] = ()  # what capture changed to trace the model (e.g. a KV cache switched off)
    dense_seconds: float | None = None  # capture's real run of the example (None for a graph a pass rewrote)
    dense_threads: int = 0  # torch's threads during that run

    @property
    def fx_graph(self) -> fx.Graph:
        return self.module.graph

    def run(self, module: nn.Module | None = None) -> Any:
        """Call `module` (default: the captured module) the way the example inputs call the model.

        Example:
            >>> g.run().shape  # doctest: +SKIP
            torch.Size([2, 3])
        """
        return (module if module is not None else self.module)(*self.call_args, **self.call_kwargs)

    def first_item(self) -> tuple[int, tuple] | None:
        """(the example's batch size, its inputs cut to their first item along dim 0) where every tensor input
        shares a batch size over 1; None otherwise (then only the whole example stands for itself).

        Example:
            >>> g.first_item()[0], g.first_item()[1][0].shape  # doctest: +SKIP
            (2, torch.Size([1, 4]))
        """
        from sparta_explore.tracing.inputs import batch_size

        batch = batch_size(tuple(x for x in self.example_inputs if isinstance(x, torch.Tensor)))
        cut = tuple(x[:1] if isinstance(x, torch.Tensor) else x for x in self.example_inputs)
        return (batch, cut) if batch else None

    def run_first_item(self, interpreter: fx.Interpreter) -> int | None:
        """Run `interpreter` (over this graph's module) on the first item of the example inputs, without autograd;
        the example's batch size, or None where there is no first item (`first_item`) or the forward fails on it.

        Example:
            >>> g.run_first_item(fx.Interpreter(g.module))  # doctest: +SKIP
            2
        """
        first = self.first_item()
        if first is None:
            return None
        try:
            with torch.inference_mode():
                interpreter.run(*first[1])
        except Exception:  # noqa: BLE001  (any failure of a model's forward on one item: the whole example decides)
            return None
        return first[0]

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
        """For a call_module node, every parameter and buffer the module reads: local name -> FQN.

        Children included: a module the graph keeps whole (nn.MultiheadAttention, a user's
        leaf) reads its children's parameters too (local name "out_proj.weight").

        Example:
            >>> g.params_of(next(g.nodes()))  # doctest: +SKIP
            {'weight': '0.weight', 'bias': '0.bias'}
        """
        if node.op != "call_module":
            return {}
        mod = self.module.get_submodule(node.target)
        prefix = f"{node.target}." if node.target else ""
        out = {n: prefix + n for n, _ in mod.named_parameters(remove_duplicate=False)}
        out.update({n: prefix + n for n, b in mod.named_buffers(remove_duplicate=False) if b is not None})
        return out

    def module_nodes(self, fqn: str) -> list[fx.Node]:
        """The call_module nodes that call the submodule `fqn` (more than one if reused)."""
        return [n for n in self.module.graph.nodes if n.op == "call_module" and n.target == fqn]

    def summary(self) -> pd.DataFrame:
        """One row per tensor: name, kind, shape, dtype."""
        return pd.DataFrame([{"name": n, "kind": i.kind, "shape": "x".join(map(str, i.shape)) or "scalar",
                              "dtype": str(i.dtype).replace("torch.", "")} for n, i in self.tensors.items()],
                            columns=["name", "kind", "shape", "dtype"])


class _ShapeRecorder(fx.Interpreter):
    """Runs the graph once, recording each node's output shape; failures name the node."""

    def __init__(self, gm: fx.GraphModule, stand_ins: Any = None) -> None:
        super().__init__(gm)
        self.values: dict[str, Any] = {}
        self.stand_ins = stand_ins  # `tracing.stand_ins.StandIns`: nodes a rewrite left alone do not run
        self.current: fx.Node | None = None

    def run_node(self, n: fx.Node) -> Any:
        self.current = n
        out = self.stand_ins.value(n) if self.stand_ins is not None else None
        stood_in = out is not None
        if not stood_in:
            out = super().run_node(n)
        if self.stand_ins is not None:
            self.stand_ins.record(n, out, stood_in)
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


METHODS = ("auto", "fx", "export", "graph_module")
# modules fx keeps whole although their linears are worth seeing (and whose eval fast path
# ignores NNI's masks): "auto" exports a model that holds one
OPAQUE_TO_FX: tuple[type[nn.Module], ...] = (nn.MultiheadAttention, nn.TransformerEncoderLayer,
                                             nn.TransformerDecoderLayer)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _export(model: Any, args: tuple, kwargs: dict) -> fx.GraphModule:
    from sparta_explore.tracing.export import export_graph_module

    try:
        return export_graph_module(model, args, kwargs)
    except Exception as e:  # export raises many types (UserError, GuardOnDataDependentSymNode, ...)
        hint = (" A KV cache is not a graph output: pass use_cache=False (or leave it out: capture switches a "
                "config's use_cache off by itself)." if "Cache" in str(e) else "")
        raise CaptureError(f"torch.export could not capture {type(model).__name__}: {type(e).__name__}: "
                           f"{_first_line(e)}.{hint} Fix: make the forward exportable (no data-dependent Python "
                           "control flow), or capture with method='fx' and leaf_modules") from None


def _trace(model: Any, args: tuple, kwargs: dict, method: str, leaf_modules: Sequence[type | str],
           concrete_args: Mapping[str, Any] | None) -> tuple[fx.GraphModule, str]:
    from sparta_explore.tracing.fx_trace import trace_fx

    if isinstance(model, torch.export.ExportedProgram):
        return _export(model, args, kwargs), "export"
    if isinstance(model, fx.GraphModule) and method in ("auto", "graph_module"):
        return model, "graph_module"  # taken as it is: never traced again
    if method == "export" or (method == "auto" and any(isinstance(m, OPAQUE_TO_FX) for m in model.modules())):
        return _export(model, args, kwargs), "export"
    try:
        return trace_fx(model, leaf_modules, concrete_args), "fx"
    except CaptureError as fx_error:
        if method == "fx":
            raise
        try:
            return _export(model, args, kwargs), "export"
        except CaptureError as export_error:
            raise CaptureError(f"{fx_error} With method='export': {export_error}") from None


def capture(model: nn.Module | fx.GraphModule | torch.export.ExportedProgram, example_inputs: Any, *,
            kwargs: Mapping[str, Any] | None = None, leaf_modules: Sequence[type | str] = (),
            concrete_args: Mapping[str, Any] | None = None, method: str = "auto") -> Graph:
    """Capture `model` as a graph and record every tensor's shape and dtype on the example inputs.

    `model` is a plain `nn.Module`, an existing `torch.fx.GraphModule` (used as it is, never
    traced again) or a `torch.export.ExportedProgram`. `example_inputs` is a tensor, a tuple
    of positional inputs, or a dict of keyword inputs (e.g. ``input_ids`` and
    ``attention_mask``); `kwargs` adds keyword inputs to positional ones.

    `method`: "fx" (symbolic tracing; `leaf_modules` (classes or FQNs) are kept whole,
    `concrete_args` fix arguments to constants), "export" (`torch.export`, the path for
    Hugging Face models: ATen calls are rewritten to torch calls and leaf modules re-lifted),
    or "auto": fx, unless the model holds torch.nn attention (`OPAQUE_TO_FX`), with export
    as the fallback when fx cannot trace.

    Example:
        >>> g = capture(nn.Sequential(nn.Linear(4, 3), nn.ReLU()), torch.randn(2, 4))
        >>> [n.name for n in g.nodes()], g.method
        (['_0', '_1'], 'fx')
    """
    from sparta_explore.tracing.inputs import as_call, flat_inputs
    from sparta_explore.tracing.kv_cache import kv_cache_off

    if method not in METHODS:
        raise CaptureError(f"method must be one of {list(METHODS)}, got {method!r}")
    if not isinstance(model, (nn.Module, torch.export.ExportedProgram)):
        raise CaptureError(f"capture needs an nn.Module, a GraphModule or an ExportedProgram, got "
                           f"{type(model).__name__}")
    args, call_kwargs = as_call(example_inputs, kwargs)
    with kv_cache_off(model) as note:
        gm, used = _trace(model, args, call_kwargs, method, leaf_modules, concrete_args)
        root = model if isinstance(model, nn.Module) and used in ("fx", "export") else gm
        flat = flat_inputs(root if used == "fx" else gm, gm, args, call_kwargs)
        call_args, call_kw = (args, call_kwargs) if used == "export" else (flat, {})
        return _describe(gm, root, source=gm if used == "export" else root, flat=flat, call_args=tuple(call_args),
                         call_kwargs=dict(call_kw), method=used, notes=() if note is None else (note,))


def _fake_run(gm: fx.GraphModule, flat: tuple, before: Graph | None = None) -> _ShapeRecorder | None:
    """`gm` run on fake tensors shaped like `flat` (shapes and sizes, no arithmetic: BERT-base in a third of a real
    run's second), or None when an op cannot run so (its result depends on values). `before`: the graph `gm`
    rewrites, whose nodes the rewrite left alone keep their shapes without running (`tracing.stand_ins`)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from sparta_explore.tracing.stand_ins import StandIns

    recorder = _ShapeRecorder(gm, StandIns(before, gm) if before is not None else None)
    mode = FakeTensorMode(allow_non_fake_inputs=True)  # the parameters stay real: fake mode reads their shapes
    try:
        with mode, torch.no_grad():
            recorder.run(*(mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for v in flat))
    except Exception:  # noqa: BLE001  (any op fake mode cannot run: the real run below answers, or names the node)
        return None
    return recorder


def _describe(gm: fx.GraphModule, root: nn.Module, *, source: nn.Module, flat: tuple, call_args: tuple,
              call_kwargs: dict, method: str, notes: tuple[str, ...] = (), fake: bool = False,
              before: Graph | None = None) -> Graph:
    """Run `gm` once on `flat` (eval mode, no grad) and record every tensor's shape: the `Graph` of `gm`.
    `fake`: on fake tensors where every op can (`_fake_run`), for shapes of a model captured for real before
    (`before`, where `gm` rewrites that graph's module)."""
    from sparta_explore.tracing.inputs import set_mode

    was_training = set_mode(root, False)
    seconds = None
    try:
        recorder = _fake_run(gm, flat, before) if fake else None
        if recorder is None:
            recorder = _ShapeRecorder(gm)
            start = time.perf_counter()
            with torch.no_grad():
                recorder.run_example(flat)
            seconds = None if fake else time.perf_counter() - start
    finally:
        set_mode(root, was_training)
    fx_graph = gm.graph
    placeholders = [n for n in fx_graph.nodes if n.op == "placeholder"]
    tensors, aliases = _weights(source)
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
    return Graph(module=gm, root=root, tensors=tensors, inputs=[n.name for n in placeholders],
                 outputs=_output_names(fx_graph), aliases=aliases, attr_nodes=attr_nodes, constants=constants,
                 tuple_shapes=tuple_shapes, example_inputs=flat, call_args=call_args,
                 call_kwargs=call_kwargs, method=method, notes=notes, dense_seconds=seconds,
                 dense_threads=torch.get_num_threads())


def _weights(source: nn.Module) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Every parameter's and buffer's shape, and tied names (alias -> first name)."""
    tensors: dict[str, TensorInfo] = {}
    canonical_of: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, p in source.named_parameters(remove_duplicate=False):
        tensors[name] = TensorInfo(tuple(p.shape), p.dtype, "param")
        first = canonical_of.setdefault(id(p), name)
        if first != name:
            aliases[name] = first
    for name, b in source.named_buffers(remove_duplicate=False):
        tensors[name] = TensorInfo(tuple(b.shape), b.dtype, "buffer")
    return tensors, aliases


def relabelled(graph: Graph, gm: fx.GraphModule) -> Graph:
    """The `Graph` of `gm`, an edit of `graph`'s module whose nodes keep the shapes `graph` recorded for them:
    the same nodes on masked weights, or nodes removed and constants folded (`simplify`). No model run (a
    BERT-base run is a second): the nodes left, and the sizes and shapes `graph` recorded as constants, stand.

    Example:
        >>> relabelled(g, fx.GraphModule(g.module, g.module.graph)).tensors == g.tensors  # doctest: +SKIP
        True
    """
    names = {n.name for n in gm.graph.nodes}
    tensors, aliases = _weights(gm)
    tensors.update({n: t for n, t in graph.tensors.items() if t.kind == "activation" and n in names})
    attr_nodes = {n.name: n.target for n in gm.graph.nodes if n.op == "get_attr" and n.target in tensors}
    return Graph(module=gm, root=gm, tensors=tensors, inputs=[n.name for n in gm.graph.nodes if n.op == "placeholder"],
                 outputs=_output_names(gm.graph), aliases=aliases, attr_nodes=attr_nodes,
                 constants={n: v for n, v in graph.constants.items() if n in names},
                 tuple_shapes={n: v for n, v in graph.tuple_shapes.items() if n in names},
                 example_inputs=graph.example_inputs, call_args=graph.call_args, call_kwargs=graph.call_kwargs,
                 method=graph.method, notes=graph.notes)


def rewritten(graph: Graph, gm: fx.GraphModule) -> Graph:
    """The `Graph` of `gm`, a rewrite of `graph`'s module that takes the same inputs (shapes recorded anew).

    A graph pass returns this: the calling convention, example inputs and capture method stay
    `graph`'s; tensor names and shapes are `gm`'s own (its parameters name themselves). Shapes come
    from a run on fake tensors where every op can run so (no arithmetic; the nodes the rewrite left
    alone keep their shapes without running, `tracing.stand_ins`), else from a real run.

    Example:
        >>> g2 = rewritten(g, fx.GraphModule(g.module, g.module.graph))  # doctest: +SKIP
    """
    return _describe(gm, gm, source=gm, flat=graph.example_inputs, call_args=graph.call_args,
                     call_kwargs=graph.call_kwargs, method=graph.method, notes=graph.notes, fake=True, before=graph)


def _is_constant(value: Any) -> bool:
    if isinstance(value, (bool, int, float, str, type(None), torch.Size, torch.dtype, slice)):
        return True
    return isinstance(value, (tuple, list)) and all(_is_constant(v) for v in value)


def _output_names(fx_graph: fx.Graph) -> list[str]:
    out_node = next(n for n in fx_graph.nodes if n.op == "output")
    names: list[str] = []
    fx.node.map_arg(out_node.args, lambda a: names.append(a.name) or a)
    return names
