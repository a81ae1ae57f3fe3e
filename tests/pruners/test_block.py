"""Block-magnitude pruner: whole blocks pruned, lowest magnitude first, ragged edges handled."""

import pytest
import torch
from torch import nn

from sparta_explore import TeSA
from sparta_explore.errors import ConfigError
from sparta_explore.pruners import BlockPruneConfig, block_magnitude_masks, prune
from sparta_explore.pruners.block import _keep_lowest_dropped, block_scores


def _sorted_drop(scores, n_prune):
    """What the pruner computed before it selected: a stable sort's first `n_prune` positions dropped."""
    keep = torch.ones(scores.numel(), dtype=torch.bool)
    keep[torch.sort(scores.flatten(), stable=True).indices[:max(n_prune, 0)]] = False
    return keep.reshape(scores.shape)


@pytest.mark.parametrize("values", ["distinct", "ties", "all equal", "nan", "zeros"])
@pytest.mark.parametrize("n_prune", [0, 1, 17, 250, 399, 400])
def test_selected_drops_are_the_stable_sorts(values, n_prune):
    g = torch.Generator().manual_seed(n_prune)
    scores = {"distinct": torch.rand(20, 20, generator=g),
              "ties": torch.randint(0, 5, (20, 20), generator=g).float(),  # thresholds inside runs of equal scores
              "all equal": torch.full((20, 20), 0.5),
              "nan": torch.where(torch.rand(20, 20, generator=g) < 0.1, float("nan"), torch.rand(20, 20, generator=g)),
              "zeros": torch.zeros(20, 20)}[values]
    got = _keep_lowest_dropped(scores, n_prune)
    assert torch.equal(got, _sorted_drop(scores, n_prune))
    assert int((~got).sum()) == min(n_prune, scores.numel())


def _linear(out_f, in_f, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(in_f, out_f))


@pytest.mark.parametrize("block", [(32, 32), (1, 32), (16, 16), (8, 4)])
@pytest.mark.parametrize("shape", [(96, 64), (100, 70)])  # the second has ragged edges
def test_pruned_set_is_a_union_of_whole_blocks(block, shape):
    model = _linear(*shape)
    table = prune(model, BlockPruneConfig(0.75, block), pruner="block")
    tesa = table["0.weight"]
    grid = tesa.block_mask(block)
    n_blocks = grid.numel()
    assert int((~grid).sum()) == round(0.75 * n_blocks)
    # every block is all-kept or all-pruned
    kept_counts = TeSA.from_mask(tesa.kept).block_mask(block)
    pruned_any = TeSA.from_mask(tesa.pruned).block_mask(block)
    assert not torch.any(kept_counts & pruned_any)


def test_lowest_magnitude_blocks_are_pruned():
    model = _linear(4, 4)
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[1., 1., 9., 9.], [1., 1., 9., 9.],
                                            [5., 5., 0.1, 0.1], [5., 5., 0.1, 0.1]]))
    masks = block_magnitude_masks(model, BlockPruneConfig(0.5, (2, 2)))
    assert masks["0"]["weight"].tolist() == [[0, 0, 1, 1], [0, 0, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0]]


def test_ragged_edge_block_scored_on_real_elements():
    w = torch.ones(3, 3)
    scores = block_scores(w, (2, 2))
    assert torch.allclose(scores, torch.ones(2, 2))  # a 1x1 corner block is not diluted by padding


def test_conv_weights_use_the_gemm_view():
    conv = nn.Sequential(nn.Conv2d(4, 64, 3))
    table = prune(conv, BlockPruneConfig(0.5, (16, 12)), pruner="block")
    view = TeSA.from_mask(table["0.weight"].kept.reshape(64, 36))
    assert view.block_density((16, 12)) == 0.5


def test_global_scope_prunes_the_weaker_layer_more():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
    with torch.no_grad():
        model[1].weight.mul_(10)
    table = prune(model, BlockPruneConfig(0.5, (8, 8), scope="global"), pruner="block")
    assert table["0.weight"].sparsity > 0.9 and table["1.weight"].sparsity < 0.1
    assert table.total_sparsity() > 0.4


def test_zero_sparsity_prunes_nothing():
    table = prune(_linear(33, 17), BlockPruneConfig(0.0, (32, 32)), pruner="block")
    assert table["0.weight"].sparsity == 0.0


@pytest.mark.parametrize("bad", [{"sparsity": 1.0}, {"sparsity": 0.5, "block": (0, 4)},
                                 {"sparsity": 0.5, "scope": "model"}])
def test_bad_configs(bad):
    with pytest.raises(ConfigError):
        BlockPruneConfig(**bad)


def test_config_round_trips_through_json_dict():
    table = prune(_linear(64, 64), {"sparsity": 0.5, "block": [1, 32], "op_names": ["0"]}, pruner="block")
    assert table["0.weight"].block_density((1, 32)) == 0.5
