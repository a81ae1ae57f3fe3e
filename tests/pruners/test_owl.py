"""OWL: per-block sparsities average the target, stay within +- lambda, and fall as a block's outliers rise."""

import pytest
import torch

from sparta_explore.errors import ConfigError
from sparta_explore.oneshot import calibration_samples, find_blocks, select_linears
from sparta_explore.pruners import SparseGPTConfig, WandaConfig, owl_sparsities, prune
from sparta_explore.pruners.owl import block_sparsities, outlier_ratio, owl_outlier_ratios


@pytest.mark.parametrize("ratios", [[0.01, 0.05, 0.02, 0.03], [0.01, 0.01, 0.01, 0.2], [0.3, 0.0]])
@pytest.mark.parametrize("target, lam", [(0.5, 0.08), (0.7, 0.2), (0.05, 0.08)])
def test_sparsities_average_the_target_within_lambda_and_fall_with_outliers(ratios, target, lam):
    out = owl_sparsities(ratios, target, lam)
    assert sum(out) / len(out) == pytest.approx(target, abs=1e-12)
    assert all(abs(s - target) <= lam + 1e-12 and 0.0 <= s < 1.0 for s in out)
    for i in range(len(ratios)):
        for j in range(len(ratios)):
            if ratios[i] > ratios[j]:
                assert out[i] < out[j]


def test_the_outlier_ratio_counts_scores_above_m_times_the_mean():
    scores = [torch.ones(2, 8), torch.tensor([[30.0, 1.0]])]  # mean 48/18: only 30 lies above 5x it
    assert outlier_ratio(scores, 5.0) == pytest.approx(1 / 18)


def test_llama_blocks_get_owl_sparsities_and_wanda_prunes_to_them(tiny_llama, calib_ids):
    model = tiny_llama()
    samples = calibration_samples(calib_ids, 16)
    layers = select_linears(model, [b for b, _ in find_blocks(model)])
    ratios = owl_outlier_ratios(model, samples, layers, 5.0)
    assert ratios[0] != ratios[1]
    config = WandaConfig(0.5, samples=16, layer_sparsity="owl", owl_lambda=0.1)
    sparsities = block_sparsities(config, model, samples, layers)
    assert sum(sparsities) / 2 == pytest.approx(0.5, abs=1e-12)
    assert all(abs(s - 0.5) <= 0.1 + 1e-12 for s in sparsities)
    fewer, more = sorted((0, 1), key=lambda b: ratios[b])
    assert sparsities[fewer] > sparsities[more]

    table = prune(model, config, pruner="wanda", evaluator=calib_ids)
    for block in (0, 1):
        for layer, width in (("self_attn.q_proj", 64), ("mlp.down_proj", 128)):
            kept = table[f"model.layers.{block}.{layer}.weight"].kept
            assert bool((kept.sum(1) == width - round(width * sparsities[block])).all())


def test_sparsegpt_takes_owl_sparsities_too(tiny_llama, calib_ids):
    model = tiny_llama()
    config = SparseGPTConfig(0.5, samples=8, layer_sparsity="owl")
    samples = calibration_samples(calib_ids, 8)
    sparsities = block_sparsities(config, model, samples, select_linears(model, ["model.layers.0", "model.layers.1"]))
    prune(model, config, pruner="sparsegpt", evaluator=calib_ids)
    for block in (0, 1):
        weight = model.get_submodule(f"model.layers.{block}.mlp.up_proj").weight
        assert int((weight == 0).sum()) == round(weight.numel() * sparsities[block])


def test_owl_with_nm_is_refused():
    with pytest.raises(ConfigError, match="nm fixes it"):
        WandaConfig(nm=(2, 4), layer_sparsity="owl")
