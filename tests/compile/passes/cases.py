"""Small models and tables for the graph-pass tests, and the check every pass must pass.

`masked_graph` prepares what `compile` hands the passes (a masked copy of the captured
graph and the table keyed to it); `assert_same_outputs` runs the graph before and after a
pass on fresh random inputs of the example's shape (several draws), so a rewrite is
checked beyond the one input it was built from.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

import sparta_explore as se
from sparta_explore.compile.table_reference import split_unread
from sparta_explore.graph import Graph, _describe, rewritten


def masked_graph(model: nn.Module, table, x: tuple, *, propagate: bool = True, **capture) -> tuple[Graph, dict]:
    """(the masked copy of `model`'s graph, the table keyed to it), propagated like compile's input."""
    graph = se.capture(model, x, **capture)
    if propagate:
        table = se.run_propagation(graph, table).table
    work = copy.deepcopy(graph.module)
    usable, _ = split_unread(graph, work, table)
    se.apply_table(work, usable)
    return rewritten(graph, work), usable


def random_like(x: tuple, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(t.shape, generator=g) if t.is_floating_point() else t for t in x)


def assert_same_outputs(before: Graph, after: Graph, x: tuple, *, rtol: float = 1e-5, draws: int = 3) -> None:
    """`after` computes what `before` does on `draws` random inputs shaped like `x` (relative to the output's scale)."""
    with torch.no_grad():
        for seed in range(draws):
            inputs = random_like(x, seed)
            want, got = before.module(*inputs), after.module(*inputs)
            err = float((got - want).abs().max() / (1 + want.abs().max()))
            assert err <= rtol, f"pass changed the output by {err:.2e} (draw {seed})"
    assert_described_anew(after)


def assert_described_anew(after: Graph) -> None:
    """`after`'s shapes (nodes a pass left alone stood in for themselves) are what a whole fake run records."""
    whole = _describe(after.module, after.module, source=after.module, flat=after.example_inputs,
                      call_args=after.call_args, call_kwargs=after.call_kwargs, method=after.method, fake=True)
    assert after.tensors == whole.tensors and after.constants == whole.constants
    assert after.tuple_shapes == whole.tuple_shapes


def randomize_norms(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give every BatchNorm trained-looking statistics and affine terms (defaults would make shifts zero)."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.normal_(0, 0.5, generator=g)
            m.running_var.uniform_(0.5, 2.0, generator=g)
            if m.affine:
                m.weight.data.uniform_(0.5, 1.5, generator=g)
                m.bias.data.normal_(0, 0.5, generator=g)
    return model.eval()


def rows_pruned(model: nn.Module, rows: dict[str, list[int]]) -> se.TeSATable:
    """A table pruning whole output rows (filters) of the named convs / linears, bias included, as NNI's L1Norm does."""
    table = {}
    modules = dict(model.named_modules())
    for name, dead in rows.items():
        w = modules[name].weight
        mask = torch.ones(w.shape, dtype=torch.bool)
        mask[dead] = False
        table[f"{name}.weight"] = se.TeSA.from_mask(mask)
        if modules[name].bias is not None:
            bmask = torch.ones(w.shape[0], dtype=torch.bool)
            bmask[dead] = False
            table[f"{name}.bias"] = se.TeSA.from_mask(bmask)
    return se.TeSATable(table)


def every_other(n: int, start: int = 0) -> list[int]:
    return list(range(start, n, 2))
