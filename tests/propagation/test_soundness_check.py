"""The soundness check itself detects an unsound rule (else every other test proves nothing)."""

import torch
from torch import nn

from sparta_explore import TeSA, TeSATable, capture
from sparta_explore.propagation import OpUpdate, run_propagation
from sparta_explore.propagation.verify import max_output_change


def test_an_unsound_rule_is_caught():
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).eval()
    graph = capture(model, torch.randn(4, 6))
    before = TeSATable(shapes=graph.shapes())

    def wrong_relu(op):  # claims relu's input never matters: false
        return OpUpdate(args={0: torch.zeros(op.args[0].shape, dtype=torch.bool)})

    result = run_propagation(graph, before, rules={nn.ReLU: wrong_relu})
    assert result.table["0.weight"].sparsity == 1.0
    assert max_output_change(graph, before, result.table) > 0.1


def test_a_wrong_forward_claim_is_caught():
    model = nn.Sequential(nn.Linear(6, 8), nn.Sigmoid(), nn.Linear(8, 3)).eval()
    graph = capture(model, torch.randn(4, 6))
    before = TeSATable({"0.weight": TeSA.from_mask(torch.zeros(8, 6)), "0.bias": TeSA.from_mask(torch.zeros(8))},
                       shapes=graph.shapes())

    def zero_preserving_sigmoid(op):  # sigmoid(0) = 0.5, not 0
        return OpUpdate(output=op.args[0].kept)

    result = run_propagation(graph, before, rules={nn.Sigmoid: zero_preserving_sigmoid})
    assert max_output_change(graph, before, result.table) > 0.1
    honest = run_propagation(graph, before)
    assert honest.table["_1"].sparsity == 0.0
    assert max_output_change(graph, before, honest.table) < 1e-6
