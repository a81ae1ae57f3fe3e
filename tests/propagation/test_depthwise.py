"""Depthwise conv: channels are independent, so pruning moves channel by channel."""

import torch
from torch import nn

from .helpers import newly_pruned, propagate_checked, prune_rows


def _model():
    return nn.Sequential(nn.Conv2d(4, 4, 3, padding=1, groups=4), nn.ReLU(), nn.Conv2d(4, 6, 1), nn.Flatten())


def test_pruned_depthwise_filter_prunes_pointwise_input_channel():
    _, result = propagate_checked(_model(), torch.randn(1, 4, 5, 5), {"0.weight": prune_rows((4, 1, 3, 3), [1]),
                                                                       "0.bias": prune_rows((4,), [1])})
    assert newly_pruned(result, "2.weight")[:, 1].all()
    assert not result.table["2.weight"].pruned[:, [0, 2, 3]].any()


def test_unused_pointwise_input_prunes_depthwise_filter_and_input_channel():
    _, result = propagate_checked(_model(), torch.randn(1, 4, 5, 5), {"2.weight": prune_rows((6, 4, 1, 1), [3], dim=1)})
    assert newly_pruned(result, "0.weight")[3].all() and newly_pruned(result, "0.bias")[3]
    assert result.table["input_1"].pruned[:, 3].all() and not result.table["input_1"].pruned[:, :3].any()


def test_mobilenet_model_is_sound():
    from sparta_explore.pruners import NNIPruneConfig, prune
    from sparta_explore.zoo import build_model, example_inputs

    model = build_model("digits-mobilenet")
    table = prune(model, NNIPruneConfig(0.5, exclude_op_names=("fc",)), pruner="l1norm")
    _, result = propagate_checked(model, example_inputs("digits-mobilenet", batch=1), dict(table))
    assert result.table.total_sparsity() > result.before.total_sparsity()
