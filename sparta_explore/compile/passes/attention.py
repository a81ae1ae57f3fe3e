"""The `attention` pass: matmul -> scale -> (+ mask) -> softmax -> matmul becomes one SDPA call where that is faster.

Hand-written attention (q @ k^T, divided or multiplied by a constant, an optional additive
mask, softmax over the last dim, @ v) computes exactly `F.scaled_dot_product_attention(q,
k, v, attn_mask=mask, scale=s)`. Each match is timed both ways on its example inputs
(interleaved, fastest kept) and checked to agree (1e-5 relative); the faster one stays and
the report counts both. The intermediate scores and probabilities must have no other reader.

Example:
    >>> attention(graph, table, PassOptions()).summary()   # doctest: +SKIP
    'attentions fused 12'
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from sparta_explore.compile.passes.base import PassOptions, PassResult, Table, register_pass
from sparta_explore.compile.passes.graph_edit import carried, editable, example_values, finished
from sparta_explore.device import fastest_ms
from sparta_explore.graph import Graph

_MATMULS = (torch.matmul, operator.matmul, "matmul")
_SOFTMAX = (F.softmax, torch.softmax, "softmax")
_SCALES = {operator.truediv: True, torch.div: True, "div": True, operator.mul: False, torch.mul: False, "mul": False}
_ADDS = (operator.add, torch.add, "add")
AGREE = 1e-5


@dataclass(frozen=True)
class Match:
    """One hand-written attention: its q, k, v, additive mask (or None), scale, and the node giving its output."""

    q: fx.Node
    k: fx.Node
    v: fx.Node
    mask: fx.Node | None
    scale: float
    out: fx.Node


def _is(node: object, targets: tuple) -> bool:
    try:
        return isinstance(node, fx.Node) and node.op in ("call_function", "call_method") and node.target in targets
    except TypeError:
        return False


def _only_reader(node: fx.Node) -> fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _key_of(transposed: object, rank: int) -> fx.Node | None:
    """k when `transposed` is k with its last two dims swapped (transpose or permute), else None."""
    if not isinstance(transposed, fx.Node) or len(transposed.users) != 1:
        return None
    args = transposed.args
    if transposed.target in ("transpose", torch.transpose) and len(args) == 3 \
            and {args[1] % rank, args[2] % rank} == {rank - 2, rank - 1}:
        return args[0]
    if transposed.target in ("permute", torch.permute):
        dims = args[1] if len(args) == 2 and isinstance(args[1], (tuple, list)) else args[1:]
        want = list(range(rank - 2)) + [rank - 1, rank - 2]
        if [d % rank for d in dims] == want:
            return args[0]
    return None


def _match(graph: Graph, scores: fx.Node) -> Match | None:
    rank = len(graph.tensors[scores.name].shape) if scores.name in graph.tensors else 0
    if rank < 3 or len(scores.args) != 2:
        return None
    k = _key_of(scores.args[1], rank)
    node, scale, mask = _only_reader(scores), 1.0, None
    if k is None or node is None:
        return None
    prev = scores
    if _is(node, tuple(_SCALES)) and len(node.args) == 2 and node.args[0] is scores \
            and isinstance(node.args[1], (int, float)):
        scale = 1.0 / node.args[1] if _SCALES[node.target] else float(node.args[1])
        prev, node = node, _only_reader(node)
    if _is(node, _ADDS) and len(node.args) == 2 and not node.kwargs and prev in node.args:
        mask = node.args[1] if node.args[0] is prev else node.args[0]
        if not isinstance(mask, fx.Node):
            return None
        node = _only_reader(node)
    if not _is(node, _SOFTMAX):
        return None
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    extra = {k: v for k, v in node.kwargs.items() if k != "dim" and not (k == "_stacklevel" or v is None)}
    if dim is None or dim % rank != rank - 1 or len(node.args) > 2 or extra:
        return None
    out = _only_reader(node)
    if _eval_dropout(graph, out):  # what simplify drops anyway, when it has not run
        node, out = out, _only_reader(out)
    if not _is(out, _MATMULS) or out.args[0] is not node:
        return None
    return Match(scores.args[0], k, out.args[1], mask, scale, out)


def _eval_dropout(graph: Graph, node: fx.Node | None) -> bool:
    if node is None:
        return False
    if node.op == "call_module":
        module = graph.module.get_submodule(node.target)
        return isinstance(module, nn.Dropout) and (not module.training or module.p == 0)
    return node.op == "call_function" and node.target is F.dropout and (
        node.kwargs.get("training", node.args[2] if len(node.args) > 2 else True) is False)


def _agree_and_time(values: dict, m: Match, runs: int) -> dict[str, float] | None:
    q, k, v = values[m.q.name], values[m.k.name], values[m.v.name]
    mask = values[m.mask.name] if m.mask is not None else None
    if not all(isinstance(t, torch.Tensor) and t.dtype == torch.float32 for t in (q, k, v)):
        return None
    if mask is not None and (not isinstance(mask, torch.Tensor) or not mask.is_floating_point()):
        return None

    def eager(_: object) -> torch.Tensor:
        s = torch.matmul(q, k.transpose(-1, -2)) * m.scale
        return torch.matmul(F.softmax(s if mask is None else s + mask, dim=-1), v)

    def fused(_: object) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=m.scale)

    with torch.inference_mode():
        want, got = eager(None), fused(None)
        if not bool(((got - want).abs().max() <= AGREE * (1 + want.abs().max())).item()):
            return None
        return fastest_ms({"eager": eager, "fused": fused}, None, runs)


@register_pass("attention")
def attention(graph: Graph, table: Table, options: PassOptions) -> PassResult:
    """Rewrite hand-written attention as one SDPA call where that measures faster (see the module docstring).

    Example:
        >>> fused = attention(graph, table, PassOptions()).graph   # doctest: +SKIP
    """
    gm = editable(graph)
    matches = [m for n in gm.graph.nodes if _is(n, _MATMULS) and (m := _match(graph, n)) is not None]
    counts = {"attentions fused": 0, "kept apart (slower fused)": 0}
    if not matches:
        return PassResult(graph, table, counts)
    values = example_values(graph, [n.name for m in matches for n in (m.q, m.k, m.v, m.mask) if n is not None])
    renames, notes = {}, []
    for m in matches:
        times = _agree_and_time(values, m, options.runs)
        if times is None:
            continue
        said = f"eager {times['eager']:.3f} ms, sdpa {times['fused']:.3f} ms"
        if not times["fused"] < times["eager"]:
            counts["kept apart (slower fused)"] += 1
            notes.append(f"{m.out.name}: {said}: kept as written")
            continue
        with gm.graph.inserting_before(m.out):
            kwargs = {"attn_mask": m.mask, "scale": m.scale} if m.mask is not None else {"scale": m.scale}
            sdpa = gm.graph.call_function(F.scaled_dot_product_attention, (m.q, m.k, m.v), kwargs)
        m.out.replace_all_uses_with(sdpa)
        renames[m.out.name] = sdpa.name
        counts["attentions fused"] += 1
        notes.append(f"{sdpa.name}: {said}")
    if not counts["attentions fused"]:
        return PassResult(graph, table, counts, tuple(notes))
    new = finished(graph, gm)
    return PassResult(new, carried(table, new, renames), counts, tuple(notes))

