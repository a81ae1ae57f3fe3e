"""Check propagation's invariant on real values: pruned elements never change the output.

The masked model (the starting table's pruning applied) is the reference. In the checked
run, every weight or input element that propagation newly pruned gets a random value,
and every pruned activation element is forced to zero (what a kernel that skips it
computes). The outputs must agree.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch import fx

from sparta_explore.graph import Graph
from sparta_explore.tesa import TeSA


class _Zeroing(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule, pruned: Mapping[str, torch.Tensor]) -> None:
        super().__init__(gm)
        self.pruned = pruned

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        if n.op != "placeholder" and isinstance(out, torch.Tensor) and n.name in self.pruned:
            out = out.masked_fill(self.pruned[n.name].expand(out.shape), 0)
        return out


def _random_inputs(graph: Graph, g: torch.Generator) -> list[torch.Tensor]:
    out = []
    for x in graph.example_inputs:
        out.append(torch.randn(x.shape, generator=g).to(x.dtype) if x.is_floating_point() else x.clone())
    return out


def max_output_change(graph: Graph, before: Mapping[str, TeSA], after: Mapping[str, TeSA], *,
                      trials: int = 3, seed: int = 0) -> float:
    """Largest |output difference| relative to the output's scale over `trials` random runs.

    A sound propagation gives ~1e-6 (float rounding). Run on a graph captured with the
    model in eval mode.

    Example:
        >>> max_output_change(graph, pruned, propagate(graph, pruned)) < 1e-4  # doctest: +SKIP
        True
    """
    g = torch.Generator().manual_seed(seed)
    gm = graph.module
    params = dict(gm.named_parameters(remove_duplicate=False)) | dict(gm.named_buffers(remove_duplicate=False))
    activations = {n: t.pruned for n, t in after.items() if n not in params and graph.tensors[n].kind == "activation"}
    start_activations = {n: t.pruned for n, t in before.items() if n in activations}
    worst = 0.0
    for _ in range(trials):
        reference = copy.deepcopy(gm).eval()
        checked = copy.deepcopy(gm).eval()
        ref_params = dict(reference.named_parameters(remove_duplicate=False))
        ref_params |= dict(reference.named_buffers(remove_duplicate=False))
        chk_params = dict(checked.named_parameters(remove_duplicate=False))
        chk_params |= dict(checked.named_buffers(remove_duplicate=False))
        with torch.no_grad():
            for name in params:
                was = before[name].pruned if name in before else torch.zeros(params[name].shape, dtype=torch.bool)
                now = after[name].pruned if name in after else was
                for p in (ref_params[name], chk_params[name]):
                    p.masked_fill_(was.expand(p.shape), 0)
                new = (now & ~was).expand(params[name].shape)
                if new.any() and chk_params[name].is_floating_point():
                    noise = torch.randn(params[name].shape, generator=g).to(params[name].dtype) * 3
                    chk_params[name].copy_(torch.where(new, noise, chk_params[name]))
            inputs = _random_inputs(graph, g)
            ref_inputs, chk_inputs = [], []
            for name, x in zip(graph.inputs, inputs):
                was = before[name].pruned if name in before else torch.zeros(x.shape, dtype=torch.bool)
                now = after[name].pruned if name in after else was
                x = x.masked_fill(was.expand(x.shape), 0)
                ref_inputs.append(x)
                noise = torch.randn(x.shape, generator=g).to(x.dtype) * 3 if x.is_floating_point() else x
                chk_inputs.append(torch.where((now & ~was).expand(x.shape), noise, x))
            expected = _Zeroing(reference, start_activations).run(*ref_inputs)
            got = _Zeroing(checked, activations).run(*chk_inputs)
        exp_t = expected if isinstance(expected, torch.Tensor) else torch.cat([e.flatten() for e in expected])
        got_t = got if isinstance(got, torch.Tensor) else torch.cat([e.flatten() for e in got])
        scale = float(exp_t.abs().max()) + 1e-6
        worst = max(worst, float((got_t - exp_t).abs().max()) / scale)
    return worst
