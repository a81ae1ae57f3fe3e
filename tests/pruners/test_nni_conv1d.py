"""NNI's pruners on Hugging Face's Conv1D (GPT-2): registered with NNI, blocks laid out on the (in, out) weight."""

import pytest
import torch
from torch import nn

from sparta_explore.pruners import get_pruner
from sparta_explore.pruners.registry import PruneRequest

pytest.importorskip("transformers")
from transformers.pytorch_utils import Conv1D  # noqa: E402


class TwoConv1D(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = Conv1D(32, 16), Conv1D(8, 32)  # 16 -> 32 -> 8, weights (16, 32) and (32, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _masks(pruner: str, **request):
    model = TwoConv1D()
    entry = get_pruner(pruner)
    (config,) = entry.configs_for(PruneRequest(layers=("a", "b"), **request), model)
    return entry.fn(model, entry.prepare(config, None), None)


def test_level_pruner_prunes_conv1d_elements():
    masks = _masks("level", sparsity=0.5)
    weight = masks["a"]["weight"]
    assert weight.shape == (16, 32) and abs(float((weight == 0).float().mean()) - 0.5) < 0.02


def test_an_out_by_in_block_becomes_an_in_by_out_block_of_a_conv1d_weight():
    # block (1, 4): one output x 4 inputs; Conv1D stores (in, out), so 4 rows x 1 column of its weight
    weight = _masks("level", sparsity=0.5, block=(1, 4))["a"]["weight"]
    blocks = weight.reshape(4, 4, 32)
    assert bool((blocks == blocks[:, :1]).all())  # constant down each 4-row group
    assert not bool((weight.reshape(16, 8, 4) == weight.reshape(16, 8, 4)[..., :1]).all())  # not along columns
