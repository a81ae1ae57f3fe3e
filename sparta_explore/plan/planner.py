"""plan(): from a graph and its TeSAs to an ExecutionPlan (predicted; compile measures and chooses).

For every weight site (`plan.sites`) whose weight TeSA prunes something or asks for fewer than 32 bits,
the planner reads the kept mask and bits (as an out x in matrix), the rows the op sees per
call, the bits of its input activation, and whether an elementwise activation right after
it can be fused; then the op kind's registered generator lists the candidates.

Example:
    >>> p = plan(capture(model, (x,)), table, DeviceProfile.load_or_measure())  # doctest: +SKIP
    >>> print(p)                                                               # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch.fx as fx
from torch import nn

from sparta_explore.activations import ACTIVATIONS
from sparta_explore.compact import count_true
from sparta_explore.device import DeviceProfile
from sparta_explore.graph import Graph
from sparta_explore.plan.bit_rounding import MIN_GRID_BITS, floor_bits
from sparta_explore.plan.candidates import CANDIDATES, OpInfo
from sparta_explore.plan.execution_plan import FP32, ExecutionPlan, OpPlan
from sparta_explore.plan.sites import input_bits, weight_sites
from sparta_explore.tesa import TeSA

# Elementwise ops a kernel can fuse after a linear: fx target -> kernel activation name.
FUSABLE: dict[object, str] = {t: act.name for act in ACTIVATIONS.values() for t in act.fx_targets}


def _fusable(graph: Graph, node: fx.Node) -> tuple[str, str | None]:
    """("relu" | "gelu", the activation node) when `node`'s only reader is such an op, else ("none", None)."""
    users = list(node.users)
    if len(users) != 1:
        return "none", None
    user = users[0]
    if user.op == "call_module":
        mod = graph.module.get_submodule(user.target)
        key: object = type(mod)
        if isinstance(mod, nn.GELU) and mod.approximate != "none":
            return "none", None
    elif user.op in ("call_function", "call_method"):
        key = user.target
        if user.kwargs.get("approximate", "none") != "none" or len(user.args) != 1:
            return "none", None
    else:
        return "none", None
    act = FUSABLE.get(key)
    return (act, user.name) if act else ("none", None)


def _rows(graph: Graph, node: fx.Node, out_features: int) -> int:
    out = graph.tensors.get(node.name)
    if out is None:
        return 1
    return max(1, math.prod(out.shape) // out_features)


def plan(graph: Graph, table: Mapping[str, TeSA], device: DeviceProfile | None = None) -> ExecutionPlan:
    """Candidates (with predicted times) for every pruned or quantized weight site of `graph`.

    Sites are what `plan.sites` finds: Linear / Conv2d modules, Hugging Face Conv1D and
    functional linears on parameters. Table names may be any alias of a tied weight.

    Example:
        >>> p = plan(g, table, device)   # doctest: +SKIP
        >>> p.ops["fc1"].candidates[0].name  # doctest: +SKIP
        'dense'
    """
    device = device or DeviceProfile.load_or_measure()
    by_canonical = {graph.canonical(name): tesa for name, tesa in table.items()}
    ops: dict[str, OpPlan] = {}
    nodes = {n.name: n for n in graph.nodes()}
    for site in weight_sites(graph):
        node = nodes[site.node]
        tesa = by_canonical.get(site.weight)
        if tesa is None:
            continue
        act_bits = input_bits(graph, table, site)
        notes = []
        if tesa.group:  # no kernel reads per-group grids: the weight's values (on them already) run in fp32
            notes.append(f"{max(tesa.kept_bits(), default=0)}-bit weights on grids of {tesa.group} run as their "
                         "fp32 values (no per-group integer kernel)")
            tesa = tesa.with_bits(FP32, "float")
        if tesa.sparsity == 0 and all(b >= FP32 for b in tesa.kept_bits()) and act_bits == FP32:
            continue  # nothing to exploit: the op stays as it is
        tesa.check_fits(graph.tensors[site.weight].shape, site.weight)
        kept = site.weight_2d(tesa.kept)
        out_features = kept.shape[0]
        widths = tesa.kept_bits()  # from the TeSA's kept histogram: no pass over the bits where nothing is raised
        bits, raised = floor_bits(site.weight_2d(tesa.bits)) if widths and widths[0] < MIN_GRID_BITS else \
            (site.weight_2d(tesa.bits), False)
        span = (max(widths[0], MIN_GRID_BITS), max(widths[-1], MIN_GRID_BITS)) if widths else None
        module = graph.module.get_submodule(site.module_target) if site.module_target else None
        groups = getattr(module, "groups", 1)
        int8_kernels = not isinstance(module, nn.Conv2d) or module.stride == (1, 1)  # int8 convs: shifted windows
        info = OpInfo(node.name, site.kind, kept, bits, _rows(graph, node, out_features), act_bits, groups,
                      int8_kernels, span)
        activation, act_node = _fusable(graph, node) if site.kind == "linear" else ("none", None)
        candidates = CANDIDATES.get(site.kind)(info, device)
        ops[node.name] = OpPlan(
            op=node.name, target=site.module_target or "", kind=site.kind, weight=site.weight,
            shape=tuple(graph.tensors[site.weight].shape), m=info.m, density=count_true(kept) / max(1, kept.numel()),
            weight_bits=max(tesa.kept_bits(), default=0), act_bits=act_bits, activation=activation,
            activation_node=act_node, candidates=candidates, dense_predicted_ms=candidates[0].predicted_ms,
            notes=notes + [f"weights below {MIN_GRID_BITS} bits run on the {MIN_GRID_BITS}-bit grid"] * raised,
            site=site)
    return ExecutionPlan(ops, device.key)
