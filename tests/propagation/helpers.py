"""Shared helpers for propagation tests."""

from __future__ import annotations

import torch

from sparta_explore import TeSA, TeSATable, capture
from sparta_explore.propagation import run_propagation
from sparta_explore.propagation.verify import max_output_change


def prune_rows(shape, rows, dim=0) -> TeSA:
    keep = torch.ones(shape, dtype=torch.bool)
    index = [slice(None)] * len(shape)
    index[dim] = list(rows)
    keep[tuple(index)] = False
    return TeSA.from_mask(keep)


def propagate_checked(model, inputs, entries: dict, leaf_modules=(), **kwargs):
    """Capture, propagate `entries`, assert soundness; returns (graph, result)."""
    graph = capture(model.eval(), inputs, leaf_modules=leaf_modules)
    before = TeSATable(entries, shapes=graph.shapes())
    result = run_propagation(graph, before, **kwargs)
    assert max_output_change(graph, before, result.table) < 1e-4
    return graph, result


def newly_pruned(result, name) -> torch.Tensor:
    return result.table[name].pruned & ~result.before[name].pruned
