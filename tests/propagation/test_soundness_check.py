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


class _BakedBatch(nn.Module):
    """Reshapes with the example's batch size written in: it cannot run one item."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)).reshape(4, 8))


def _spy(monkeypatch):
    from sparta_explore.propagation import verify

    seen, change = [], verify._change

    def spied(*args, first_item, **kwargs):
        seen.append(first_item)
        return change(*args, first_item=first_item, **kwargs)

    monkeypatch.setattr(verify, "_change", spied)
    return seen


def test_one_item_checks_what_the_whole_example_does(monkeypatch):
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).eval()
    graph = capture(model, torch.randn(4, 6))
    before = TeSATable(shapes=graph.shapes())
    wrong = run_propagation(graph, before, rules={nn.ReLU: wrong_relu}, check=False)
    seen = _spy(monkeypatch)
    assert max_output_change(graph, before, wrong.table, one_item=True) > 0.1
    kept = torch.ones(3, 8, dtype=torch.bool)
    kept[:, 5] = False
    pruned = TeSATable({"2.weight": TeSA.from_mask(kept)}, shapes=graph.shapes())
    sound = run_propagation(graph, pruned, check=False)
    assert max_output_change(graph, pruned, sound.table, one_item=True) < 1e-4
    assert seen == [True, True]


def test_items_pruned_differently_or_sizes_baked_in_check_the_whole_example(monkeypatch):
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).eval()
    graph = capture(model, torch.randn(4, 6))
    kept = torch.ones(4, 6, dtype=torch.bool)
    kept[2, 1] = False  # one element of the third item's input: items are not pruned alike
    before = TeSATable({graph.inputs[0]: TeSA.from_mask(kept)}, shapes=graph.shapes())
    seen = _spy(monkeypatch)
    after = run_propagation(graph, before, check=False).table
    assert max_output_change(graph, before, after, one_item=True) < 1e-4
    baked = capture(_BakedBatch().eval(), torch.randn(4, 6))
    table = TeSATable(shapes=baked.shapes())
    assert max_output_change(baked, table, run_propagation(baked, table, check=False).table, one_item=True) < 1e-4
    assert seen == [False, True, False]  # baked sizes: one item fails, the whole example runs


def test_the_self_check_runs_one_item_and_confirms_a_change_on_the_whole_example(monkeypatch):
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).eval()
    graph = capture(model, torch.randn(4, 6))
    kept = torch.ones(3, 8, dtype=torch.bool)
    kept[:, 5] = False
    before = TeSATable({"2.weight": TeSA.from_mask(kept)}, shapes=graph.shapes())
    seen = _spy(monkeypatch)
    assert run_propagation(graph, before).check.passed
    assert seen == [True]
    seen.clear()
    with pytest.warns(PropagationWarning):
        run_propagation(graph, before, rules={nn.ReLU: wrong_relu})
    assert seen[:2] == [True, False] and not any(seen[2:])  # found on one item, confirmed and bisected on all


def test_masks_alike_are_those_pruning_in_later_items_only_what_the_first_prunes():
    from sparta_explore.propagation.verify import _alike

    assert _alike(torch.tensor([True, False, False, False]), 4)  # BERT's arange(batch): its zero in item 0
    assert not _alike(torch.tensor([False, True, False, False]), 4)  # item 1 prunes what item 0 keeps
    assert _alike(torch.tensor([[True, False]]).expand(4, 2), 4)  # broadcast along the batch
    assert _alike(torch.tensor([True, False, True]), 4)  # not along the batch: kept whole
