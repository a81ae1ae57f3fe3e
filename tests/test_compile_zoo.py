"""compile() on every embedded model, with NNI-pruned and block-pruned TeSAs: outputs equal the masked model."""

import warnings

import pytest
import torch

import sparta_explore as se
from sparta_explore.compile import compile
from sparta_explore.pruners import prune, prune_dependent_norms
from sparta_explore.pruners.block import BlockPruneConfig
from sparta_explore.pruners.nni_pruners import NNIPruneConfig
from sparta_explore.zoo import build_model, example_inputs, model_names

FAST = {"digits-cnn", "digits-mlp", "digits-resnet", "digits-mobilenet", "bert-tiny"}


def table_for(model, graph, how):
    if how == "block":
        return se.propagate(graph, prune(model, BlockPruneConfig(sparsity=0.7, block=(16, 16)), pruner="block",
                                         graph=graph))
    nni = prune(model, NNIPruneConfig(sparsity=0.5), pruner="l1norm", graph=graph)
    return se.propagate(graph, prune_dependent_norms(graph, nni))


@pytest.mark.parametrize("how", ["l1norm", "block"])
@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in FAST else pytest.mark.slow) for n in model_names()])
def test_every_model_compiles_and_matches(device, cache_dir, name, how):
    model, x = build_model(name).eval(), example_inputs(name, batch=2)
    g = se.capture(model, x)
    table = table_for(model, g, how)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback here would be a bug: every model must compile cleanly
        cm = compile(model, table, x, device=device, cache_dir=cache_dir, tune=False, runs=1)
    assert cm.plan.ops, "pruning at these levels leaves something for the planner"
    want = se.masked_copy(model, table).eval()(*x)
    with torch.inference_mode():
        assert torch.allclose(cm(*x), want, atol=1e-4, rtol=1e-4)
    assert all(op.chosen for op in cm.plan.ops.values())
