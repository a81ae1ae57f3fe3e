"""Weight sites: the graph nodes that multiply an activation by a weight the planner may specialize.

A site is found by a reader registered per fx target: `nn.Linear` and `nn.Conv2d` modules,
Hugging Face's `Conv1D` (a linear whose weight is stored in x out; matched by class name
so transformers stays optional), and functional `F.linear` on a parameter (what
`torch.export` leaves inside `nn.MultiheadAttention`, or a user's functional code).

`site.as_module(gm)` gives an equivalent plain `nn.Linear` / `nn.Conv2d` over the site's
(possibly masked) parameters, so lowering builds every kernel from one kind of module.

Example:
    >>> [s.weight for s in weight_sites(capture(nn.Sequential(nn.Linear(4, 3)), torch.randn(1, 4)))]
    ['0.weight']
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from sparta_explore.graph import Graph, capture  # noqa: F401  (capture: used by the docstring example)
from sparta_explore.module_tree import set_module
from sparta_explore.plan.bit_rounding import MIN_GRID_BITS
from sparta_explore.tesa import TeSA

FP32 = 32
MAX_INT_BITS = 8

IN_OUT = "in_out"  # weight stored (in_features, out_features): HF Conv1D
OUT_IN = "out_in"


@dataclass(frozen=True)
class WeightSite:
    """One weighted op: its node, kind ("linear" / "conv"), weight and bias FQNs, weight layout, input arg."""

    node: str
    kind: str
    weight: str
    bias: str | None
    layout: str = OUT_IN
    input_index: int = 0
    module_target: str | None = None  # call_module sites: the module's FQN

    def weight_2d(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` (the weight, or its TeSA's mask / bits) as an (out, in) matrix.

        Example:
            >>> WeightSite("n", "linear", "w", None, IN_OUT).weight_2d(torch.zeros(4, 3)).shape
            torch.Size([3, 4])
        """
        flat = tensor.t() if self.layout == IN_OUT else tensor
        return flat.reshape(flat.shape[0], -1)

    def as_module(self, gm: fx.GraphModule) -> nn.Module:
        """An `nn.Linear` / `nn.Conv2d` computing this site with `gm`'s current parameters (shared, not copied
        except where the layout is transposed).

        Example:
            >>> site.as_module(gm)  # doctest: +SKIP
            Linear(in_features=768, out_features=3072, bias=True)
        """
        if self.module_target is not None and self.layout == OUT_IN:
            return gm.get_submodule(self.module_target)
        weight = gm.get_parameter(self.weight)
        bias = gm.get_parameter(self.bias) if self.bias is not None else None
        out = nn.Linear(1, 1, bias=bias is not None)
        w = weight.detach().t().contiguous() if self.layout == IN_OUT else weight
        out.weight = w if isinstance(w, nn.Parameter) else nn.Parameter(w, requires_grad=False)
        out.in_features, out.out_features = out.weight.shape[1], out.weight.shape[0]
        if bias is not None:
            out.bias = bias
        return out


SiteReader = Callable[[Graph, fx.Node], "WeightSite | None"]
MODULE_READERS: dict[type | str, SiteReader] = {}
FUNCTION_READERS: dict[object, SiteReader] = {}


def register_site(*targets: type | str | object) -> Callable[[SiteReader], SiteReader]:
    """Register a reader for module classes (or their qualified names as strings) or functions.

    Example:
        >>> @register_site(MyLinear)  # doctest: +SKIP
        ... def my_linear(graph, node): ...
    """
    def add(fn: SiteReader) -> SiteReader:
        for t in targets:
            (MODULE_READERS if isinstance(t, (type, str)) else FUNCTION_READERS)[t] = fn
        return fn
    return add


def _param_of(graph: Graph, value: object) -> str | None:
    if isinstance(value, fx.Node) and value.op == "get_attr":
        name = graph.attr_nodes.get(value.name)
        if name is not None and graph.tensors[name].kind == "param":
            return graph.canonical(name)
    return None


def _module_site(graph: Graph, node: fx.Node, kind: str, layout: str = OUT_IN) -> WeightSite | None:
    module = graph.module.get_submodule(node.target)
    if not isinstance(getattr(module, "weight", None), torch.Tensor):
        return None
    bias = f"{node.target}.bias" if getattr(module, "bias", None) is not None else None
    return WeightSite(node.name, kind, graph.canonical(f"{node.target}.weight"),
                      None if bias is None else graph.canonical(bias), layout, 0, str(node.target))


@register_site(nn.Linear)
def _linear_module(graph: Graph, node: fx.Node) -> WeightSite | None:
    return _module_site(graph, node, "linear")


@register_site(nn.Conv2d)
def _conv_module(graph: Graph, node: fx.Node) -> WeightSite | None:
    return _module_site(graph, node, "conv")


@register_site("transformers.pytorch_utils.Conv1D")
def _hf_conv1d(graph: Graph, node: fx.Node) -> WeightSite | None:
    return _module_site(graph, node, "linear", IN_OUT)


@register_site(F.linear)
def _functional_linear(graph: Graph, node: fx.Node) -> WeightSite | None:
    weight = _param_of(graph, node.args[1] if len(node.args) > 1 else node.kwargs.get("weight"))
    if weight is None or len(graph.tensors[weight].shape) != 2:
        return None
    bias_arg = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    bias = _param_of(graph, bias_arg)
    if bias_arg is not None and bias is None:
        return None  # a computed bias: not a plain linear on parameters
    return WeightSite(node.name, "linear", weight, bias)


def _module_reader(module: nn.Module) -> SiteReader | None:
    for cls in type(module).__mro__:
        reader = MODULE_READERS.get(cls) or MODULE_READERS.get(f"{cls.__module__}.{cls.__qualname__}")
        if reader is not None:
            return reader
    return None


def site_of(graph: Graph, node: fx.Node) -> WeightSite | None:
    """The weight site `node` is, or None.

    Example:
        >>> site_of(g, next(g.nodes())).kind  # doctest: +SKIP
        'linear'
    """
    if node.op == "call_module":
        reader = _module_reader(graph.module.get_submodule(node.target))
    elif node.op == "call_function":
        try:
            reader = FUNCTION_READERS.get(node.target)
        except TypeError:  # unhashable targets
            reader = None
    else:
        reader = None
    return reader(graph, node) if reader is not None else None


def weight_sites(graph: Graph) -> list[WeightSite]:
    """Every weight site of `graph`, in topological order.

    Example:
        >>> len(weight_sites(g))  # doctest: +SKIP
        72
    """
    return [s for s in (site_of(graph, n) for n in graph.nodes()) if s is not None]


def input_bits(graph: Graph, table: Mapping[str, TeSA], site: WeightSite) -> int:
    """The bits the table asks for the site's input activation: its widest kept element (floor 2), or 32.

    Example:
        >>> input_bits(graph, {"x": TeSA.dense((1, 4), bits=8)}, site)  # doctest: +SKIP
        8
    """
    node = next(n for n in graph.nodes() if n.name == site.node)
    src = node.args[site.input_index] if len(node.args) > site.input_index else None
    tesa = table.get(graph.tensor_name(src)) if isinstance(src, fx.Node) else None
    kept = tesa.kept_bits() if tesa is not None else []
    top = max(kept) if kept else FP32
    return max(top, MIN_GRID_BITS) if top <= MAX_INT_BITS else FP32


COMPILED_OPS = "sparta_ops"  # where modules replacing functional sites are registered


def replace_site(gm: fx.GraphModule, site: WeightSite, module: nn.Module) -> fx.Node:
    """Make `gm` compute `site` with `module` (called on the site's input); returns the node that calls it.

    A Linear / Conv2d module site keeps its node and path; a functional or transposed-layout
    site becomes a call of `module` registered under `sparta_ops.<node name>`.

    Example:
        >>> replace_site(gm, site, DenseLinear(w, b))  # doctest: +SKIP
    """
    node = next(n for n in gm.graph.nodes if n.name == site.node)
    if node.op == "call_module" and site.layout == OUT_IN:
        set_module(gm, node.target, module)  # parents copied: a module tree shared with another graph stays as it is
        return node
    if not hasattr(gm, COMPILED_OPS):
        gm.add_module(COMPILED_OPS, nn.Module())
    set_module(gm, f"{COMPILED_OPS}.{site.node}", module)
    with gm.graph.inserting_before(node):
        call = gm.graph.call_module(f"{COMPILED_OPS}.{site.node}", (node.args[site.input_index],))
    call.meta = dict(node.meta)
    node.replace_all_uses_with(call)
    gm.graph.erase_node(node)
    return call
