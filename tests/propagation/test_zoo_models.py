"""Every op of every embedded model has a rule (no scrambling), and propagation is sound on each."""

import pytest
from torch import nn

from sparta_explore import capture
from sparta_explore.propagation import run_propagation
from sparta_explore.propagation.verify import max_output_change
from sparta_explore.pruners import NNIPruneConfig, prune, prune_dependent_norms
from sparta_explore.zoo import build_model, example_inputs, model_names


@pytest.mark.parametrize("name", model_names())
def test_zoo_model_has_rules_for_every_op_and_is_sound(name):
    model = build_model(name)
    graph = capture(model, example_inputs(name, batch=1))
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    table = prune(model, NNIPruneConfig(0.5, exclude_op_names=(linears[-1],)), pruner="l1norm", graph=graph)
    table = prune_dependent_norms(graph, table)
    result = run_propagation(graph, table)
    assert not result.report.scrambled and not result.report.unsupported
    weights = [n for n, i in graph.tensors.items() if i.kind == "param"]
    assert sum(int(result.table[n].pruned.sum()) for n in weights) >= sum(int(table[n].pruned.sum()) for n in weights)
    assert max_output_change(graph, table, result.table, trials=1) < 1e-4
