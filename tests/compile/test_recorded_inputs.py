"""Recorded op inputs: one item of the example, repeated, where that is the example's shape; else the whole run."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

import sparta_explore as se
from sparta_explore.compile.recorded_inputs import record_run
from sparta_explore.pruners import prune
from sparta_explore.pruners.block import BlockPruneConfig


class Tokens(nn.Module):
    """(batch, tokens, 16) flattened to rows before its linears, as some models feed them."""

    def __init__(self, fixed_rows: int | None = None) -> None:
        super().__init__()
        self.fixed_rows = fixed_rows
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        rows = x.reshape(self.fixed_rows if self.fixed_rows else -1, 16)  # fixed: the example's size baked in
        return self.fc2(torch.relu(self.fc1(rows)))


def _ops(graph):
    return [SimpleNamespace(op=n.name, site=SimpleNamespace(input_index=0))
            for n in graph.module.graph.nodes if n.op == "call_module"]


@pytest.mark.parametrize("model, x", [
    (nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)), torch.randn(6, 16)),
    (Tokens(), torch.randn(4, 5, 16)),  # rows = batch x tokens: the item's rows repeat per item
])
def test_one_item_inputs_are_the_first_items_repeated_to_the_examples_shape(model, x):
    graph = se.capture(model, (x,))
    ops = _ops(graph)
    whole, one = record_run(graph, ops), record_run(graph, ops, one_item=True)
    assert one.output is None and one.seconds is None and whole.seconds is not None
    assert set(one.inputs) == set(whole.inputs) == {op.op for op in ops}
    for name, full in whole.inputs.items():
        got = one.inputs[name]
        assert got.shape == full.shape
        item = full.shape[0] // x.shape[0]  # rows of the first item
        for i in range(x.shape[0]):
            assert torch.allclose(got[i * item:(i + 1) * item], full[:item], atol=1e-6)


@pytest.mark.parametrize("model, x", [
    (Tokens(fixed_rows=20), torch.randn(4, 5, 16)),  # fails on one item
    (nn.Sequential(nn.Linear(16, 8)), torch.randn(1, 16)),  # one item is the example
])
def test_the_whole_example_runs_where_one_item_cannot_stand_for_it(model, x):
    graph = se.capture(model, (x,))
    ops = _ops(graph)
    got = record_run(graph, ops, one_item=True)
    assert got.seconds is not None and got.output is not None
    for name, full in record_run(graph, ops).inputs.items():
        assert torch.equal(got.inputs[name], full)


def test_a_compiled_fp32_model_is_checked_against_the_users_model_without_the_ops_run(device, cache_dir):
    model, x = Tokens(), torch.randn(4, 5, 16)
    graph = se.capture(model, (x,))
    table = prune(model, BlockPruneConfig(sparsity=0.8, block=(1, 1)), pruner="block", graph=graph)
    cm = se.compile(model, se.propagate(graph, table), (x,), device=device, cache_dir=cache_dir, tune=False)
    checks = cm.checks.set_index("check")
    assert checks.loc["table", "passed"] and checks.loc["table", "error"] <= 1e-4
    assert torch.allclose(cm(x), se.masked_copy(model, table)(x), atol=1e-4)


def test_inputs_from_one_item_are_made_when_asked_for_and_say_their_shape_without_making_one():
    from sparta_explore.compile.recorded_inputs import OpInputs

    item = {"a": torch.randn(1, 5, 3), "b": torch.randn(2, 7)}
    inputs = OpInputs(item, batch=4)
    assert sorted(inputs) == ["a", "b"] and len(inputs) == 2
    for name, x in item.items():
        assert inputs.shape(name) == tuple(inputs[name].shape) == (4 * x.shape[0], *x.shape[1:])
        assert torch.equal(inputs[name], x.repeat(4, *([1] * (x.dim() - 1))))
    assert inputs["b"] is inputs["b"]  # the last one asked for is kept
    whole = OpInputs(item)
    assert whole["a"] is item["a"] and whole.shape("b") == (2, 7)
