"""The `memory_format` pass: run a conv net in channels-last (NHWC) where the whole model measures faster.

oneDNN's convolutions run on NHWC without reordering; on NCHW they reorder input, weight and
output on every call, which on small, shrunk CNNs can cost more than the products (a
24 -> 144 1x1 conv over 8 x 16 x 16: 0.99 ms NCHW, 0.10 ms NHWC on one Zen 5). Residual adds
and other ops may not gain as much, so this is a whole-model choice, measured: a copy of
the graph takes its 4-D inputs to channels-last once at the entry and stores its conv
weights and 4-D constants (constant channels' maps) channels-last; both are timed
alternately on the example inputs and the faster stays. A model whose convs are still
sparse inside their kept rows and columns (unstructured or block pruning, not channel
pruning) stays NCHW without timing: the pattern-specialized conv kernels read NCHW, and
they are that model's speed. It runs last among the graph passes, so kernel choice then
times every candidate on the inputs it will really get.

Example:
    >>> memory_format(graph, table, PassOptions()).summary()   # doctest: +SKIP
    'models in channels-last 1'
"""

from __future__ import annotations

import torch
from torch import nn

from sparta_explore.compact import any_true
from sparta_explore.compile.passes.base import PassOptions, PassResult, Table, register_pass
from sparta_explore.compile.passes.graph_edit import carried, clone_module, editable, finished, set_module
from sparta_explore.compile.timing import alternating_ms
from sparta_explore.graph import Graph
from sparta_explore.tesa import TeSA

CL = torch.channels_last
SPARSE_INSIDE = 0.7  # density inside the kept rows and columns below which a conv is left to the sparse kernels


def _channels_last_conv(module: nn.Conv2d) -> nn.Module:
    out = clone_module(module)
    out.weight = nn.Parameter(module.weight.detach().contiguous(memory_format=CL), requires_grad=False)
    return out


def _attr(gm: nn.Module, target: str) -> object:
    for part in target.split("."):
        gm = getattr(gm, part)
    return gm


def _sparse_inside(tesa: TeSA | None) -> bool:
    """Whether a conv weight is still sparse once its wholly pruned filters and input channels are cut."""
    if tesa is None or tesa.sparsity == 0:
        return False
    kept = tesa.kept.reshape(tesa.shape[0], tesa.shape[1], -1)
    rows, cols = any_true(kept, dim=(1, 2)), any_true(kept, dim=(0, 2))
    inside = kept[rows][:, cols]
    return inside.numel() > 0 and float(inside.float().mean()) < SPARSE_INSIDE


@register_pass("memory_format")
def memory_format(graph: Graph, table: Table, options: PassOptions) -> PassResult:
    """Take 4-D inputs to channels-last at the entry and store conv weights so, where the whole model is faster.

    Example:
        >>> nhwc = memory_format(graph, table, PassOptions()).graph   # doctest: +SKIP
    """
    gm = editable(graph)
    convs = [n for n in gm.graph.nodes if n.op == "call_module" and isinstance(gm.get_submodule(n.target), nn.Conv2d)]
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder" and n.name in graph.tensors
              and len(graph.tensors[n.name].shape) == 4 and graph.tensors[n.name].dtype.is_floating_point]
    counts = {"models in channels-last": 0, "conv weights converted": 0}
    if not convs or not inputs:
        return PassResult(graph, table, counts)
    sparse = [n.target for n in convs if _sparse_inside(table.get(f"{n.target}.weight"))]
    if sparse:  # the pattern-specialized conv kernels read NCHW: a conv still sparse inside wants them
        return PassResult(graph, table, counts, (f"kept NCHW: {len(sparse)} convs stay sparse inside their kept rows "
                                                 f"and columns ({sparse[0]}, ...), for the NCHW sparse kernels",))
    for node in convs:
        set_module(gm, node.target, _channels_last_conv(gm.get_submodule(node.target)))
    for i, node in enumerate(n for n in gm.graph.nodes if n.op == "get_attr"):
        value = _attr(gm, node.target)  # 4-D constants (bias maps): an NCHW one added to NHWC outputs is 20x slower
        if isinstance(value, torch.Tensor) and value.dim() == 4 and value.is_floating_point():
            name = f"_nhwc_{i}"
            gm.register_buffer(name, value.contiguous(memory_format=CL))
            node.target = name
    for node in inputs:
        with gm.graph.inserting_after(node):
            nhwc = gm.graph.call_method("contiguous", (node,), {"memory_format": CL})
        node.replace_all_uses_with(nhwc, delete_user_cb=lambda user, nhwc=nhwc: user is not nhwc)
    new = finished(graph, gm)
    nchw_ms, nhwc_ms = alternating_ms(graph, [graph.module, new.module], options.runs)
    said = (f"NCHW {nchw_ms:.3f} ms, NHWC {nhwc_ms:.3f} ms",)
    if not nhwc_ms < nchw_ms:
        return PassResult(graph, table, counts, said)
    counts.update({"models in channels-last": 1, "conv weights converted": len(convs)})
    return PassResult(new, carried(table, new), counts, said)
