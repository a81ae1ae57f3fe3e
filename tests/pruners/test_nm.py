"""N:M pruner: exactly N kept in every group of M along the reduction dim."""

import pytest
import torch
from torch import nn

from sparta_explore.errors import ConfigError
from sparta_explore.pruners import NMPruneConfig, nm_mask, prune


@pytest.mark.parametrize("n,m", [(2, 4), (1, 4), (4, 8), (1, 2)])
def test_every_group_keeps_exactly_n(n, m):
    torch.manual_seed(0)
    w = torch.randn(16, 8 * m)
    mask = nm_mask(w, n, m)
    assert torch.all(mask.reshape(16, 8, m).sum(-1) == n)


def test_keeps_the_largest_magnitudes():
    w = torch.tensor([[0.1, -5.0, 3.0, 0.2, 1.0, 2.0, -3.0, 4.0]])
    assert nm_mask(w, 2, 4).tolist() == [[0, 1, 1, 0, 0, 0, 1, 1]]


def test_ragged_tail_group_keeps_min_n_r():
    w = torch.arange(1.0, 8.0).reshape(1, 7)  # groups of 4: [1,2,3,4], [5,6,7]
    assert nm_mask(w, 2, 4).tolist() == [[0, 0, 1, 1, 0, 1, 1]]
    assert nm_mask(torch.ones(1, 5), 2, 4).sum() == 3  # [4] + ragged [1] keeps its single element


def test_conv_groups_run_along_flattened_inputs():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(4, 8, 2))  # GEMM view 8 x 16
    table = prune(model, NMPruneConfig(2, 4), pruner="nm")
    kept = table["0.weight"].kept.reshape(8, 4, 4)
    assert torch.all(kept.sum(-1) == 2)


def test_selection_and_bias_untouched():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    table = prune(model, {"n": 1, "m": 4, "op_names": ["2"]}, pruner="nm")
    assert table["2.weight"].sparsity == 0.75
    assert table["0.weight"].sparsity == 0.0 and table["2.bias"].sparsity == 0.0


@pytest.mark.parametrize("n,m", [(0, 4), (5, 4), (2.0, 4)])
def test_bad_n_m(n, m):
    with pytest.raises(ConfigError, match="N:M"):
        NMPruneConfig(n, m)


def test_block_config_given_to_nm_is_an_error():
    with pytest.raises(ConfigError, match="unknown config keys"):
        prune(nn.Sequential(nn.Linear(8, 8)), {"sparsity": 0.5}, pruner="nm")
