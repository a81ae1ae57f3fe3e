"""The soundness check detects an unsound rule, and propagation's self-check never lets one through."""

import pytest
import torch
from torch import nn

from sparta_explore import TeSA, TeSATable, capture
from sparta_explore.propagation import OpUpdate, run_propagation
from sparta_explore.propagation.self_check import PropagationWarning
from sparta_explore.propagation.verify import max_output_change


def wrong_relu(op):  # claims relu's input never matters: false
    return OpUpdate(args={0: torch.zeros(op.args[0].shape, dtype=torch.bool)})


def test_an_unsound_rule_is_caught_by_the_checker():
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).eval()
    graph = capture(model, torch.randn(4, 6))
    before = TeSATable(shapes=graph.shapes())
    result = run_propagation(graph, before, rules={nn.ReLU: wrong_relu}, check=False)
    assert result.table["0.weight"].sparsity == 1.0
    assert max_output_change(graph, before, result.table) > 0.1


def test_the_self_check_reverts_what_an_unsound_rule_pruned_and_names_it():
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).eval()
    graph = capture(model, torch.randn(4, 6))
    kept = torch.ones(3, 8, dtype=torch.bool)
    kept[:, 5] = False  # a sound fact as well: column 5 of the last layer is pruned by the user
    before = TeSATable({"2.weight": TeSA.from_mask(kept)}, shapes=graph.shapes())
    with pytest.warns(PropagationWarning, match="wrong_relu"):
        result = run_propagation(graph, before, rules={nn.ReLU: wrong_relu})
    check = result.check
    assert not check.passed and check.error > 0.1 and check.final_error < 1e-4
    assert "0.weight" in check.reverted and "wrong_relu" in check.reverted["_0"]  # the root of the chain
    assert result.table["0.weight"].sparsity < 1.0
    assert max_output_change(graph, before, result.table) < 1e-4  # what leaves propagation is sound
    assert result.table["2.weight"].equals(before["2.weight"])


def test_a_wrong_forward_claim_is_caught():
    model = nn.Sequential(nn.Linear(6, 8), nn.Sigmoid(), nn.Linear(8, 3)).eval()
    graph = capture(model, torch.randn(4, 6))
    before = TeSATable({"0.weight": TeSA.from_mask(torch.zeros(8, 6)), "0.bias": TeSA.from_mask(torch.zeros(8))},
                       shapes=graph.shapes())

    def zero_preserving_sigmoid(op):  # sigmoid(0) = 0.5, not 0
        return OpUpdate(output=op.args[0].kept)

    unchecked = run_propagation(graph, before, rules={nn.Sigmoid: zero_preserving_sigmoid}, check=False)
    assert max_output_change(graph, before, unchecked.table) > 0.1
    with pytest.warns(PropagationWarning, match="zero_preserving_sigmoid"):
        checked = run_propagation(graph, before, rules={nn.Sigmoid: zero_preserving_sigmoid})
    assert max_output_change(graph, before, checked.table) < 1e-4
    honest = run_propagation(graph, before)
    assert honest.table["_1"].sparsity == 0.0 and honest.check.passed and not honest.check.reverted
    assert max_output_change(graph, before, honest.table) < 1e-6
