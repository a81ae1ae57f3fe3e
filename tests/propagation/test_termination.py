"""The worklist ends: visits stay within a small multiple of the op count on a deep model."""

import torch
from torch import nn

from sparta_explore import TeSA, TeSATable, capture
from sparta_explore.propagation import run_propagation
from sparta_explore.propagation.verify import max_output_change


def deep_mlp(depth: int) -> nn.Module:
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(16, 16), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(16, 2)).eval()


def test_visits_grow_linearly_with_depth():
    visits = {}
    for depth in (10, 40):
        model = deep_mlp(depth)
        graph = capture(model, torch.randn(2, 16))
        # prune a column at the bottom and a row at the top: facts must cross the whole depth both ways
        keep_first = torch.ones(16, 16, dtype=torch.bool)
        keep_first[:, 3] = False
        keep_last = torch.ones(2, 16, dtype=torch.bool)
        keep_last[:, 7] = False
        table = TeSATable({"0.weight": TeSA.from_mask(keep_first), f"{2 * depth}.weight": TeSA.from_mask(keep_last)},
                          shapes=graph.shapes())
        result = run_propagation(graph, table)
        ops = result.report.nodes
        visits[depth] = result.report.visits
        assert ops == 2 * depth + 1
        assert result.report.visits <= 4 * ops, result.report.visits
        assert not result.report.stopped_early
        assert result.table["input_1"].pruned[:, 3].all()  # the bottom column's input went irrelevant
        assert max_output_change(graph, table, result.table, trials=1) < 1e-4
    assert visits[40] / visits[10] < 4 * 1.5  # linear in depth, not quadratic


def test_fixpoint_is_stable():
    model = deep_mlp(5)
    graph = capture(model, torch.randn(2, 16))
    table = TeSATable({"2.weight": TeSA.from_mask(torch.rand(16, 16) > 0.5)}, shapes=graph.shapes())
    once = run_propagation(graph, table).table
    twice = run_propagation(graph, once)
    assert twice.table.equals(once)
    assert not any(e["newly_pruned"] for e in twice.report.events)


def test_max_visits_stops_early_and_says_so():
    model = deep_mlp(10)
    graph = capture(model, torch.randn(2, 16))
    result = run_propagation(graph, {}, max_visits=3)
    assert result.report.stopped_early and result.report.visits == 3
