"""Residual add: a zero on one branch is not a zero of the sum; irrelevance reaches both branches."""

import torch
from torch import nn

from .helpers import newly_pruned, propagate_checked, prune_rows


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.fc2 = nn.Linear(8, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.fc1(x))
        return self.head(torch.relu(self.fc2(y) + x))


def test_branch_zero_does_not_prune_the_sum():
    model = Residual()
    _, result = propagate_checked(model, torch.randn(3, 8), {"fc2.weight": prune_rows((8, 8), [1, 2]),
                                                             "fc2.bias": prune_rows((8,), [1, 2])})
    assert result.table["fc2"].pruned[:, [1, 2]].all()
    assert not result.table["add"].pruned.any()  # x still flows through the shortcut


def test_irrelevance_flows_into_both_branches():
    model = Residual()
    _, result = propagate_checked(model, torch.randn(3, 8), {"head.weight": prune_rows((4, 8), [5], dim=1)})
    assert newly_pruned(result, "fc2.weight")[5].all()     # branch row 5 feeds only the dead column
    # the shortcut ignores x[:, 5] too, but fc1 still reads it: irrelevant to one reader is not enough
    assert not result.table["x"].pruned.any()
    assert not result.table["fc1.weight"].pruned.any()    # fc1 still feeds the live columns


def test_resnet_block_model_is_sound():
    from sparta_explore.pruners import NNIPruneConfig, prune
    from sparta_explore.zoo import build_model, example_inputs

    model = build_model("digits-resnet")
    x = example_inputs("digits-resnet", batch=1)
    table = prune(model, NNIPruneConfig(0.5, exclude_op_names=("fc",)), pruner="l1norm")
    propagate_checked(model, x, dict(table))
