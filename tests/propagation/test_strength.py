"""Propagation exposes more sparsity than the pruner set, through channels, FFNs and heads."""

import torch
from torch import nn

from sparta_explore import TeSA, capture
from sparta_explore.propagation import run_propagation
from sparta_explore.propagation.verify import max_output_change
from sparta_explore.pruners import NNIPruneConfig, prune, prune_dependent_norms

from .helpers import newly_pruned, propagate_checked, prune_rows


class ConvBNConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, x):
        return self.conv2(torch.relu(self.bn(self.conv1(x))))


def test_conv_output_channels_prune_bn_and_next_conv_inputs():
    model = ConvBNConv().eval()
    x = torch.randn(1, 3, 6, 6)
    graph = capture(model, x)
    table = prune(model, NNIPruneConfig(0.5, op_names=("conv1",)), pruner="l1norm", graph=graph)
    dead = table["conv1.weight"].pruned.reshape(8, -1).all(dim=1)
    assert dead.sum() == 4
    # soundly, BN turns a zero channel into a constant: nothing reaches conv2 ...
    plain = run_propagation(graph, table)
    assert not plain.table["conv2.weight"].pruned.any()
    # ... until the pruner also prunes the BN channel (dropping that constant), as NNI's speedup does
    closed = prune_dependent_norms(graph, table)
    assert closed["bn.weight"].pruned.equal(dead) and closed["bn.bias"].pruned.equal(dead)
    result = run_propagation(graph, closed)
    assert result.table["conv2.weight"].pruned[:, dead].all()
    assert not result.table["conv2.weight"].pruned[:, ~dead].any()
    assert max_output_change(graph, closed, result.table) < 1e-4


def test_next_conv_input_channels_prune_bn_and_previous_filters_backward():
    model = ConvBNConv()
    keep = torch.ones(4, 8, 3, 3, dtype=torch.bool)
    keep[:, [2, 6]] = False
    _, result = propagate_checked(model, torch.randn(1, 3, 6, 6), {"conv2.weight": TeSA.from_mask(keep)})
    for name in ("conv1.weight", "conv1.bias", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"):
        pruned = newly_pruned(result, name)
        assert pruned[[2, 6]].all() and not pruned[[0, 1, 3, 4, 5, 7]].any(), name


def test_ffn_rows_prune_second_linear_columns():
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))
    rows = [1, 2, 30]
    _, result = propagate_checked(model, torch.randn(2, 5, 8), {"0.weight": prune_rows((32, 8), rows),
                                                                 "0.bias": prune_rows((32,), rows)})
    assert newly_pruned(result, "2.weight")[:, rows].all()
    assert newly_pruned(result, "2.weight").sum() == 8 * len(rows)
