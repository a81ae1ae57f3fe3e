"""The `fold_batchnorm` pass: an eval-mode BatchNorm right after a conv or linear becomes that op's weights and bias.

BN(eval) computes y = s_c x + t_c per channel, s = gamma / sqrt(var + eps), t = beta - mean s.
After a conv or linear whose output only the BN reads, W'[c] = s_c W[c] and
b'[c] = s_c b[c] + t_c give the same output with one op less. Pruned weights stay zero
(0 * s = 0), so the weight TeSA holds; a row whose scale is 0 becomes pruned too. The
folded bias gets a TeSA that prunes exactly its zeros (a fact, not a choice). The BN's
output TeSA passes to the folded op's node, which now produces that value.

Per-row weight grids commute with a per-row scale (a symmetric grid scales with its row),
so folding keeps int8 semantics up to a last-bit tie.

Example:
    >>> fold_batchnorm(graph, table, PassOptions()).summary()   # doctest: +SKIP
    'batchnorms folded 17'
"""

from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from sparta_explore.compile.passes.base import PassOptions, PassResult, Table, register_pass
from sparta_explore.compile.passes.graph_edit import carried, clone_module, editable, finished, module_of, set_module
from sparta_explore.graph import Graph
from sparta_explore.tesa import TeSA

_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_PRODUCERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


def _affine_of_module(bn: nn.Module) -> tuple[torch.Tensor, torch.Tensor] | None:
    if bn.training or not bn.track_running_stats or bn.running_mean is None:
        return None  # batch statistics: not a per-channel affine map
    return _affine(bn.running_mean, bn.running_var, bn.weight, bn.bias, bn.eps)


def _affine(mean, var, weight, bias, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    scale = torch.rsqrt(var.detach().double() + eps)
    if weight is not None:
        scale = scale * weight.detach().double()
    shift = -mean.detach().double() * scale
    if bias is not None:
        shift = shift + bias.detach().double()
    return scale, shift


def _attr(gm: fx.GraphModule, value: object) -> torch.Tensor | None:
    if isinstance(value, fx.Node) and value.op == "get_attr":
        out = gm
        for part in value.target.split("."):
            out = getattr(out, part)
        return out
    return None


def _affine_of_function(gm: fx.GraphModule, node: fx.Node) -> tuple[torch.Tensor, torch.Tensor] | None:
    names = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")
    args = dict(zip(names, node.args))
    args.update(node.kwargs)
    if args.get("training", False) is not False:
        return None
    mean, var = _attr(gm, args.get("running_mean")), _attr(gm, args.get("running_var"))
    if mean is None or var is None:
        return None
    weight, bias = args.get("weight"), args.get("bias")
    w = _attr(gm, weight) if weight is not None else None
    b = _attr(gm, bias) if bias is not None else None
    if (weight is not None and w is None) or (bias is not None and b is None):
        return None  # computed affine terms: not a constant map
    return _affine(mean, var, w, b, float(args.get("eps", 1e-5)))


def _norm_affine(gm: fx.GraphModule, node: fx.Node) -> tuple[torch.Tensor, torch.Tensor] | None:
    module = module_of(gm, node)
    if isinstance(module, _NORMS):
        return _affine_of_module(module)
    if node.op == "call_function" and node.target is F.batch_norm:
        return _affine_of_function(gm, node)
    return None


def _folded(op: nn.Module, scale: torch.Tensor, shift: torch.Tensor) -> nn.Module:
    """A copy of `op` (its other parameters shared) with the per-output-channel affine map folded in."""
    out = clone_module(op)
    w = op.weight.detach()
    shape = (-1,) + (1,) * (w.dim() - 1)
    out.weight = nn.Parameter((w.double() * scale.reshape(shape)).to(w.dtype), requires_grad=False)
    bias = op.bias.detach().double() if op.bias is not None else torch.zeros_like(shift)
    out.bias = nn.Parameter((bias * scale + shift).to(w.dtype), requires_grad=False)
    return out


def _producer(gm: fx.GraphModule, graph: Graph, bn: fx.Node) -> fx.Node | None:
    src = bn.args[0] if bn.args else None
    if not isinstance(src, fx.Node) or len(src.users) != 1 or src.name in graph.outputs:
        return None
    module = module_of(gm, src)
    if not isinstance(module, _PRODUCERS) or len(graph.module_nodes(src.target)) != 1:
        return None
    out = graph.tensors.get(src.name)
    if isinstance(module, nn.Linear) and (out is None or len(out.shape) != 2):
        return None  # BatchNorm1d normalizes dim 1: the linear's features only on (N, C) outputs
    return src


def _table_after(table: Table, target: str, op: nn.Module, scale: torch.Tensor) -> dict[str, TeSA]:
    out: dict[str, TeSA] = {}
    weight = table.get(f"{target}.weight")
    if weight is not None:
        dead = (scale == 0).reshape((-1,) + (1,) * (len(weight.shape) - 1)).expand(weight.shape)
        out[f"{target}.weight"] = weight.prune(dead)
    out[f"{target}.bias"] = TeSA.from_mask(op.bias.detach() != 0)
    return out


@register_pass("fold_batchnorm")
def fold_batchnorm(graph: Graph, table: Table, options: PassOptions) -> PassResult:
    """Fold each eval-mode BatchNorm into the conv or linear that feeds it (and only it).

    Example:
        >>> folded = fold_batchnorm(graph, table, PassOptions()).graph   # doctest: +SKIP
    """
    gm = editable(graph)
    entries = dict(table)
    renames: dict[str, str] = {}
    folded = 0
    for bn in list(gm.graph.nodes):
        if bn.op not in ("call_module", "call_function") or bn.name in graph.outputs:
            continue
        affine = _norm_affine(gm, bn)
        src = _producer(gm, graph, bn) if affine is not None else None
        if src is None:
            continue
        op = _folded(gm.get_submodule(src.target), *affine)
        set_module(gm, src.target, op)
        entries.update(_table_after(table, src.target, op, affine[0]))
        bn.replace_all_uses_with(src)
        gm.graph.erase_node(bn)
        renames[bn.name] = src.name
        folded += 1
    if not folded:  # nothing to fold: the same graph (recording shapes anew costs a model run)
        return PassResult(graph, table, {"batchnorms folded": 0})
    new = finished(graph, gm)
    return PassResult(new, carried(entries, new, renames), {"batchnorms folded": folded})
