"""Fusion pass of `compile`: a chain of two sparse kernels becomes one tile-by-tile pair where that is faster.

After every op has its kernel, a linear compiled to a row-major `SparseLinear`,
`PermutedInt8Linear` or `Int8SparseLinear` whose only reader is another of the same kind and
tile (a BERT FFN: fc1 with its GELU fused, then fc2) can run as one fused pair
(`kernels/fused_ffn.py`). fp32 and permute-int8 pairs do the two ops' own work without the
intermediate's trip through memory (`FusedPair.less_work`) and are fused without timing; two
fp32 ops whose tile searches chose different tilings get the second built again with the
first's (`KernelLinear.rebuilt(tile=...)`), and that pair is timed. A quad int8 pair packs differently
and is timed too (against the two ops on the op's recorded input, interleaved, fastest kept,
as candidates are). A timed verdict holds for every later pair of its class (`_pair_class`: the
kernels, tilings and pattern classes, as tile searches share theirs): BERT-base at 90% 32x32 has
12 retiled pairs, each 25% faster fused, and the pass took 0.6-0.7 s of every compile timing
them all, 0.3-0.4 s timing one. An int8 pair
is left apart where the op's M is too few tiles to run fused (`runs_fused`: it would only add
a call); an fp32 pair runs fused at any M (its split driver at few tiles). Where fused, the
second op's module becomes the pair, its node reads the first op's input, and the first op's
node goes; both ops say so in their notes, and so do pairs left apart (with both times).

Example:
    >>> fuse_pairs(gm, planned, compiled, op_inputs, runs=5, cache_dir=None)  # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

import torch
import torch.fx as fx
from torch import nn

from sparta_explore.cache import content_key
from sparta_explore.compile.pair_tiles import recall, remember, retile_key
from sparta_explore.compile.recorded_inputs import OpInputs
from sparta_explore.device import fastest_ms
from sparta_explore.kernels.build import KernelBuildError
from sparta_explore.kernels.fused_ffn import PAIRS, fused_pair, why_not_fusable
from sparta_explore.kernels.sparse_linear import SparseLinear
from sparta_explore.kernels.tuning import m_bucket, shape_and_pattern
from sparta_explore.module_tree import set_module
from sparta_explore.plan import OpPlan
from sparta_explore.plan.sites import OUT_IN


def _chained(calls: Mapping[str, fx.Node], first: OpPlan, by_node: Mapping[str, OpPlan], through: str | None = None
             ) -> tuple[fx.Node, OpPlan] | None:
    """(first's node, the op reading it) when first's output goes to exactly that one compiled module op (`through`:
    or by way of that node alone, the activation first will fuse)."""
    if first.site.module_target is None or first.site.layout != OUT_IN:
        return None
    node = calls.get(first.site.module_target)
    if node is None or len(node.users) != 1:
        return None
    user = next(iter(node.users))
    if through is not None and user.name == through and len(user.users) == 1:
        node, user = user, next(iter(user.users))
    second = by_node.get(user.name)
    if second is None or user.op != "call_module" or second.site.layout != OUT_IN or user.args[:1] != (node,):
        return None
    return node, second


def chains(gm: fx.GraphModule, planned: list[OpPlan]) -> dict[str, str]:
    """Before the activations are fused: each planned op reading, alone, the output of another planned op (or of
    the activation that op fuses): op -> that first op (the pairs `fuse_pairs` will meet).

    Example:
        >>> chains(gm, list(plan.ops.values()))  # doctest: +SKIP
        {'fc2': 'fc1'}
    """
    by_node = {op.op: op for op in planned}
    calls = {n.target: n for n in gm.graph.nodes if n.op == "call_module"}
    found = ((first, _chained(calls, first, by_node, first.activation_node)) for first in planned)
    return {chain[1].op: first.op for first, chain in found if chain is not None}


def _timed_kind(a: nn.Module, retile: str | None) -> bool:
    """Whether a pair led by `a` is timed: one retiled, or of a kind that packs differently (not `less_work`)."""
    return retile is not None or not PAIRS[type(a)].less_work


def _retile(a: nn.Module, b: nn.Module) -> str | None:
    """A note when two fp32 kernels could fuse but for their tiles (each op's tile search chose its own): the
    second is then built with the first's tiling, and the pair is timed against the two as they are."""
    if type(a) is not SparseLinear or type(b) is not SparseLinear or a.tile == b.tile or a._fn is None or b._fn is None:
        return None
    if a.out_features != b.in_features:
        return None
    return f"; the second retiled to the first's {a._tile}-row tile (was {b._tile})"


def _pair_class(a: nn.Module, b: nn.Module, rows: int) -> str:
    """What decides whether a timed pair runs faster fused: both kernels, their tilings, their patterns' classes
    (`tuning.shape_and_pattern`) and the rows. The layers of a model pruned alike share one timing."""
    parts = [(type(m).__name__, getattr(m, "tile", None), getattr(m, "activation", None),
              shape_and_pattern(m.kept.numpy(), m.block_rows)) for m in (a, b)]
    return content_key({"pair": [repr(p) for p in parts], "m": m_bucket(rows)})


def fuse_pairs(gm: fx.GraphModule, planned: list[OpPlan], compiled: dict[str, nn.Module],
               op_inputs: OpInputs, runs: int, cache_dir: str | os.PathLike | None) -> None:
    """Fuse, in `gm` and `compiled`, every chained kernel pair that runs faster fused (see the module docstring)."""
    by_node = {op.op: op for op in planned if op.op in compiled}
    calls = {n.target: n for n in gm.graph.nodes if n.op == "call_module"}
    timed: dict[str, tuple[bool, str]] = {}  # pair class -> (fused faster, what its timing said)
    for first in planned:
        if first.op not in compiled:
            continue
        chain = _chained(calls, first, by_node)
        if chain is None:
            continue
        node, second = chain
        a, b = compiled[first.op], compiled.get(second.op)
        if b is None:
            continue
        retile = _retile(a, b)
        if why_not_fusable(a, b) is not None and retile is None:
            continue
        rows = math.prod(op_inputs.shape(first.op)) // max(1, a.in_features)
        verdict, key = None, None
        if _timed_kind(a, retile):
            pair_class = _pair_class(a, b, rows)
            verdict = timed.get(pair_class)
            if retile is not None:  # a retiled pair's verdict outlives the compile (`pair_tiles.py`)
                key = retile_key(a, b.kept.numpy(), b.block_rows, b.activation, rows)
                remembered = recall(cache_dir, key) if verdict is None else None
                if remembered is not None:
                    verdict = timed[pair_class] = (remembered[0], f"as timed by an earlier compile ({remembered[1]})")
            if verdict is not None and not verdict[0]:
                first.notes.append(f"fusion with {second.op!r} kept apart: {verdict[1]}")
                continue
        try:
            second_op = b if retile is None else b.rebuilt(cache_dir, tile=a.tile, tile_searched=True)
            fused = fused_pair(a, second_op, cache_dir=cache_dir)
        except (KernelBuildError, OSError, ValueError) as e:
            first.fell_back(f"fusion with {second.op!r} failed to build ({e})")
            continue
        fused.label = f"{first.op}+{second.op}"
        if not fused.runs_fused(rows):  # the pair would run its two ops apart: only a call more
            first.notes.append(f"fusion with {second.op!r} not tried: {rows} rows are too few tiles to fuse")
            continue
        if not _timed_kind(a, retile):
            said = "not timed: the two ops' own work, the intermediate never in memory"
        elif verdict is not None:
            said = verdict[1]
        else:
            with torch.inference_mode():
                times = fastest_ms({"apart": nn.Sequential(a, b), "fused": fused}, op_inputs[first.op], runs,
                                   settle=True)
            said = f"apart {times['apart']:.3f} ms, fused {times['fused']:.3f} ms" + (retile or "")
            faster = times["fused"] < times["apart"]
            timed[pair_class] = (faster, f"as timed for {first.op!r}'s pair of the same class ({said})")
            if key is not None:
                remember(cache_dir, key, faster, said)
            if not faster:
                first.notes.append(f"fusion with {second.op!r} measured slower ({said}): kept apart")
                continue
        user = next(iter(node.users))  # the second op's node stays (it names the pair's output), reading the input
        set_module(gm, user.target, fused)
        user.args = node.args
        gm.graph.erase_node(node)
        compiled[first.op] = fused
        del compiled[second.op]
        first.notes.append(f"fused with {second.op!r}, tile by tile ({said})")
        second.notes.append(f"runs inside {first.op!r}'s fused pair")
