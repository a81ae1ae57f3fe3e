"""Check propagation's invariant on real values: pruned elements never change the output.

The masked model (the starting table's pruning applied) is the reference. In the checked
run, every weight or input element that propagation newly pruned gets a random value,
and every pruned activation element is forced to zero (what a kernel that skips it
computes). The outputs must agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import fx
from torch.nn.utils import stateless
from torch.utils import _pytree as pytree

from sparta_explore.compact import any_true, both, core, negate, zero_where_
from sparta_explore.graph import Graph
from sparta_explore.tesa import TeSA


class _Zeroing(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule, pruned: Mapping[str, torch.Tensor]) -> None:
        super().__init__(gm)
        self.pruned = pruned
        self.held = {t.untyped_storage().data_ptr() for t in (*gm.parameters(), *gm.buffers())}

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        if n.op != "placeholder" and isinstance(out, torch.Tensor) and n.name in self.pruned:
            mask = self.pruned[n.name].expand(out.shape)
            # in place only on a fresh result: a view or an operand returned as is shares memory
            # with values other nodes read (no new 12 MB buffer per masked BERT activation)
            if n.op == "call_module" or out._base is not None or _shares_memory(out, n, self.env, self.held):
                return zero_where_(out.clone(), mask)
            return zero_where_(out, mask)
        return out


def _shares_memory(out: torch.Tensor, node: fx.Node, env: Mapping[fx.Node, Any], held: set[int]) -> bool:
    ptr = out.untyped_storage().data_ptr()
    if ptr in held:
        return True
    operands = [env[a] for a in node.all_input_nodes if a in env]
    return any(isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() == ptr
               for t in pytree.tree_leaves(operands))


def _random_inputs(graph: Graph, g: torch.Generator) -> list[Any]:
    out = []
    for x in graph.example_inputs:
        if isinstance(x, torch.Tensor):
            out.append(torch.randn(x.shape, generator=g).to(x.dtype) if x.is_floating_point() else x.clone())
        else:
            out.append(x)  # None, ints, flags: passed as they were
    return out


def _flat_output(out: Any) -> torch.Tensor:
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return torch.cat([t.flatten() for t in leaves]) if leaves else torch.zeros(0)


def max_output_change(graph: Graph, before: Mapping[str, TeSA], after: Mapping[str, TeSA], *,
                      trials: int = 3, seed: int = 0, one_item: bool = False) -> float:
    """Largest |output difference| relative to the output's scale over `trials` random runs.

    A sound propagation gives ~1e-6 (float rounding). Parameters are substituted for the
    run (`stateless` reparametrization), so the model is neither copied nor modified, and
    the graph runs in eval mode. `one_item`: on the first item of the inputs only where every
    item prunes what the first does (`_one_item`; a fraction of a run), else on the whole example.

    Example:
        >>> max_output_change(graph, pruned, propagate(graph, pruned)) < 1e-4  # doctest: +SKIP
        True
    """
    g = torch.Generator().manual_seed(seed)
    gm = graph.module
    params = dict(gm.named_parameters(remove_duplicate=False)) | dict(gm.named_buffers(remove_duplicate=False))
    # only activations with something pruned: masking the rest would cost a full pass over each for nothing
    activations = _pruned_activations(graph, after, params)
    start_activations = {n: m for n, m in _pruned_activations(graph, before, params).items() if n in graph.tensors}
    batch = _one_item(graph, before, after, activations, start_activations) if one_item else None
    if batch is not None:
        firsts = [{n: m[:1] if m.dim() and m.shape[0] == batch else m for n, m in masks.items()}
                  for masks in (activations, start_activations)]
        try:
            return _change(graph, before, after, params, *firsts, g, trials, first_item=True)
        except Exception:  # noqa: BLE001  (a forward that fails on one item, e.g. sizes baked in: the whole example)
            g = torch.Generator().manual_seed(seed)
    return _change(graph, before, after, params, activations, start_activations, g, trials, first_item=False)


def _change(graph: Graph, before: Mapping[str, TeSA], after: Mapping[str, TeSA], params: Mapping[str, Any],
            activations: Mapping[str, torch.Tensor], start_activations: Mapping[str, torch.Tensor],
            g: torch.Generator, trials: int, first_item: bool) -> float:
    from sparta_explore.tracing.inputs import set_mode

    gm = graph.module
    worst = 0.0
    was_training = set_mode(gm, False)
    try:
        for _ in range(trials):
            noise = _Noise(g)
            ref_params, chk_params = {}, {}
            with torch.no_grad():
                for name, p in params.items():
                    was = before[name].pruned if name in before else None
                    now = after[name].pruned if name in after else was
                    # byte views: torch 2.13's bool any / & / ~ are 30x slower (BERT-base: 0.15 s of the check)
                    ref = p if was is None or not bool(any_true(core(was))) else p.masked_fill(was.expand(p.shape), 0)
                    ref_params[name], chk_params[name] = ref, ref
                    new = now if was is None else both(now, negate(was))
                    if new is not None and p.is_floating_point() and bool(any_true(core(new))):
                        chk_params[name] = torch.where(new.expand(p.shape), noise(p), ref)
                ref_inputs, chk_inputs = _inputs(graph, before, after, g)
                if first_item:
                    ref_inputs, chk_inputs = ([x[:1] if isinstance(x, torch.Tensor) else x for x in xs]
                                              for xs in (ref_inputs, chk_inputs))
                with stateless._reparametrize_module(gm, ref_params):
                    expected = _flat_output(_Zeroing(gm, start_activations).run(*ref_inputs))
                with stateless._reparametrize_module(gm, chk_params):
                    got = _flat_output(_Zeroing(gm, activations).run(*chk_inputs))
            scale = float(expected.abs().max()) + 1e-6 if expected.numel() else 1.0
            worst = max(worst, float((got - expected).abs().max()) / scale if expected.numel() else 0.0)
    finally:
        set_mode(gm, was_training)
    return worst


class _Noise:
    """Random values (scale 3) per shape and dtype, drawn once per trial and shared by same-shaped tensors.

    Sharing keeps detection (a pruned element that matters moves the output whatever
    random value it holds) while the 72 weights of a 12-layer BERT need 3 draws, not 72.
    """

    def __init__(self, g: torch.Generator) -> None:
        self.g, self.drawn = g, {}

    def __call__(self, like: torch.Tensor) -> torch.Tensor:
        key = (tuple(like.shape), like.dtype)
        if key not in self.drawn:
            self.drawn[key] = torch.randn(like.shape, generator=self.g).to(like.dtype) * 3
        return self.drawn[key]


def _alike(mask: torch.Tensor, batch: int) -> bool:
    """Whether `mask`, where its dim 0 is `batch` items, prunes in every item only what it prunes in the first
    (BERT's `arange(batch)` holds its only zero, pruned, in the first item)."""
    if mask.dim() == 0 or mask.shape[0] != batch or mask.stride(0) == 0:
        return True  # not along the batch (kept whole: a mask of a tensor one item shrinks fails, and all runs)
    return not bool((mask[1:] & ~mask[:1]).any())


def _one_item(graph: Graph, before: Mapping[str, TeSA], after: Mapping[str, TeSA], *masks: Mapping) -> int | None:
    """The example's batch size where a run on its first item checks what a run on all would: every tensor input
    shares a batch size over 1, and no input or activation mask prunes in a later item what it keeps in the first
    (every pruning then meets random values in the first item too: BERT-base at 8 x 128, 0.55 instead of 2.1 s
    a check). None: run the whole example."""
    first = graph.first_item()
    if first is None:
        return None
    batch = first[0]
    inputs = [t.pruned for name in graph.inputs for t in (before.get(name), after.get(name)) if t is not None]
    every = [*inputs, *(m for group in masks for m in group.values())]
    return batch if all(_alike(m, batch) for m in every) else None


def _pruned_activations(graph: Graph, table: Mapping[str, TeSA], params: Mapping[str, Any]) -> dict:
    out = {}
    for n, t in table.items():
        if n in params or n not in graph.tensors or graph.tensors[n].kind != "activation":
            continue
        if t.numel and int(core(t._key).min()) == 0:  # a reduction, no full-size bool tensor for the dense ones
            out[n] = t.pruned
    return out


def _inputs(graph: Graph, before: Mapping[str, TeSA], after: Mapping[str, TeSA],
            g: torch.Generator) -> tuple[list, list]:
    ref_inputs, chk_inputs = [], []
    for name, x in zip(graph.inputs, _random_inputs(graph, g)):
        if not isinstance(x, torch.Tensor):
            ref_inputs.append(x)
            chk_inputs.append(x)
            continue
        was = before[name].pruned if name in before else torch.zeros(x.shape, dtype=torch.bool)
        now = after[name].pruned if name in after else was
        x = x.masked_fill(was.expand(x.shape), 0)
        ref_inputs.append(x)
        noise = torch.randn(x.shape, generator=g).to(x.dtype) * 3 if x.is_floating_point() else x
        chk_inputs.append(torch.where((now & ~was).expand(x.shape), noise, x))
    return ref_inputs, chk_inputs
