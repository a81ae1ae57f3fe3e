"""fold_batchnorm: an eval BatchNorm after a conv / linear becomes its weights and bias; pruned stays pruned."""

import pytest
import torch
from torch import nn

from sparta_explore.compile.passes.base import PassOptions
from sparta_explore.compile.passes.fold_batchnorm import fold_batchnorm

from .cases import assert_same_outputs, masked_graph, randomize_norms, rows_pruned


def _norms(graph) -> int:
    return sum(1 for n in graph.module.graph.nodes if n.op == "call_module"
               and isinstance(graph.module.get_submodule(n.target), nn.modules.batchnorm._BatchNorm))


@pytest.mark.parametrize("groups", [1, 6])  # plain and depthwise
def test_conv_bn_relu_folds_and_keeps_the_output(groups):
    model = randomize_norms(nn.Sequential(nn.Conv2d(6, 6, 3, padding=1, groups=groups, bias=groups == 1),
                                          nn.BatchNorm2d(6), nn.ReLU6()))
    x = (torch.randn(2, 6, 9, 7),)  # ragged spatial size
    graph, table = masked_graph(model, rows_pruned(model, {"0": [1, 4]}), x)
    result = fold_batchnorm(graph, table, PassOptions())
    assert result.changes["batchnorms folded"] == 1 and _norms(result.graph) == 0
    assert_same_outputs(graph, result.graph, x)
    w = result.graph.module.get_submodule("0").weight
    assert float(w[[1, 4]].abs().sum()) == 0.0  # pruned filters stay zero (0 * scale)
    assert bool(result.table["0.weight"].pruned[[1, 4]].all())
    assert result.table["0.bias"].kept_bits() == [32]  # the folded bias carries BN's shift: kept


def test_linear_bn1d_folds_on_two_dim_outputs_only():
    model = randomize_norms(nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.Linear(4, 3)))
    x = (torch.randn(6, 5),)
    graph, table = masked_graph(model, {}, x, propagate=False)
    result = fold_batchnorm(graph, table, PassOptions())
    assert result.changes["batchnorms folded"] == 1
    assert_same_outputs(graph, result.graph, x)


def test_what_is_not_a_per_channel_affine_map_stays():
    class Shared(nn.Module):  # the conv's output has a second reader: folding would change it
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.conv(x)
            return self.bn(y) + y

    x = (torch.randn(2, 3, 4, 4),)
    for model in (randomize_norms(Shared()),
                  nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4, track_running_stats=False)).eval()):
        graph, table = masked_graph(model, {}, x, propagate=False)
        result = fold_batchnorm(graph, table, PassOptions())
        assert result.changes["batchnorms folded"] == 0 and _norms(result.graph) == 1
        assert_same_outputs(graph, result.graph, x)


def test_the_captured_model_is_never_touched():
    model = randomize_norms(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = (torch.randn(1, 3, 5, 5),)
    graph, table = masked_graph(model, {}, x, propagate=False)
    kept = graph.module.get_submodule("0").weight.clone()
    fold_batchnorm(graph, table, PassOptions())
    assert torch.equal(graph.module.get_submodule("0").weight, kept)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
