"""Wanda: masks by |W| x input-channel norm, per output row (or N:M, or blocks), weights left as they were."""

import pytest
import torch

from sparta_explore.errors import ConfigError
from sparta_explore.pruners import PruneRequest, WandaConfig, get_pruner, prune
from sparta_explore.tesa_table import TeSATable

LINEARS = [f"model.layers.{b}.{m}" for b in (0, 1) for m in (
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]


def _kept(table, name):
    return table[f"{name}.weight"].kept


def test_unstructured_keeps_half_of_every_row_and_changes_no_weight(tiny_llama, calib_ids):
    model = tiny_llama()
    table = prune(model, WandaConfig(0.5, samples=16), pruner="wanda", evaluator=calib_ids)
    assert isinstance(table, TeSATable)
    for name in LINEARS:
        kept = _kept(table, name)
        assert bool((kept.sum(1) == kept.shape[1] // 2).all()), name
    assert bool(table["lm_head.weight"].kept.all()) and bool(table["model.embed_tokens.weight"].kept.all())
    fresh = tiny_llama()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters()))


def test_the_first_blocks_masks_are_the_top_scores_of_the_dense_inputs(tiny_llama, calib_ids):
    model = tiny_llama()
    name = "model.layers.0.mlp.down_proj"
    layer = model.get_submodule(name)
    squares = []
    handle = layer.register_forward_hook(lambda m, a, o: squares.append(a[0].reshape(-1, 128).square().sum(0)))
    with torch.no_grad():
        for i in range(16):
            model(calib_ids[i:i + 1])
    handle.remove()
    scores = layer.weight.abs() * torch.stack(squares).sum(0).sqrt()
    expected = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, scores.topk(32, dim=1).indices, True)
    table = prune(model, WandaConfig(0.75, samples=16), pruner="wanda", evaluator=calib_ids)
    assert torch.equal(_kept(table, name), expected)


def test_nm_keeps_n_of_every_m_inputs(tiny_llama, calib_ids):
    table = prune(tiny_llama(), WandaConfig(nm=(2, 4), samples=8), pruner="wanda", evaluator=calib_ids)
    for name in LINEARS:
        kept = _kept(table, name)
        assert bool((kept.reshape(kept.shape[0], -1, 4).sum(-1) == 2).all()), name


def test_blocks_are_kept_or_pruned_whole(tiny_llama, calib_ids):
    table = prune(tiny_llama(), WandaConfig(0.5, block=(4, 8), samples=8), pruner="wanda", evaluator=calib_ids)
    for name in LINEARS:
        kept = _kept(table, name)
        rows, cols = kept.shape
        blocks = kept.reshape(rows // 4, 4, cols // 8, 8).float().mean(dim=(1, 3))
        assert bool(((blocks == 0) | (blocks == 1)).all()), name
        assert float(blocks.mean()) == 0.5


def _magnitude(model, sparsity):
    for name in LINEARS:
        w = model.get_submodule(name).weight.data
        w.scatter_(1, w.abs().topk(round(w.shape[1] * sparsity), dim=1, largest=False).indices, 0.0)
    return model


def test_wanda_beats_magnitude_on_held_out_logits(tiny_llama, calib_ids, held_out_ids, logits_error):
    import sparta_explore as se

    dense = tiny_llama()
    model = tiny_llama()
    wanda = se.masked_copy(model, prune(model, WandaConfig(0.5, samples=32), pruner="wanda", evaluator=calib_ids))
    magnitude = _magnitude(tiny_llama(), 0.5)
    assert logits_error(wanda, dense, held_out_ids) < 0.7 * logits_error(magnitude, dense, held_out_ids)


@pytest.mark.parametrize("config, message", [
    (WandaConfig(nm=(2, 6), samples=4), "m=6 to divide the input width 64 of 'model.layers.0.self_attn.q_proj'"),
    (WandaConfig(0.5, block=(3, 8), samples=4), r"block \(3, 8\) does not tile the \(64, 64\) weight of"),
    (WandaConfig(0.5, samples=4, op_names=("model.layers.0.mlp.gate",)), r"\['model.layers.0.mlp.gate'\] are not"),
    (WandaConfig(0.5, samples=64), "has 32 samples; the config asks for 64"),
])
def test_bad_configs_are_config_errors_naming_the_culprit(tiny_llama, calib_ids, config, message):
    model = tiny_llama()
    with pytest.raises(ConfigError, match=message):
        prune(model, config, pruner="wanda", evaluator=calib_ids)


def test_config_values_are_checked_where_they_are_made(tiny_llama):
    for kwargs in ({"sparsity": 1.0}, {"sparsity": -0.1}, {}, {"nm": (5, 4)}, {"sparsity": 0.5, "nm": (1, 4)},
                   {"nm": (2, 4), "block": (4, 4)}, {"sparsity": 0.5, "layer_sparsity": "sometimes"},
                   {"sparsity": 0.5, "samples": 0}):
        with pytest.raises(ConfigError):
            WandaConfig(**kwargs)
    with pytest.raises(ConfigError, match="needs an evaluator"):
        prune(tiny_llama(), WandaConfig(0.5), pruner="wanda")


def test_a_trial_request_maps_to_nm_inside_the_blocks(tiny_llama):
    model = tiny_llama()
    request = PruneRequest(0.5, (*LINEARS, "lm_head"), block=(1, 4))
    (config,) = get_pruner("wanda").configs_for(request, model)
    assert config.nm == (2, 4) and config.op_names == tuple(LINEARS) and config.samples is None
    (blocky,) = get_pruner("wanda").configs_for(PruneRequest(0.5, tuple(LINEARS), block=(4, 8)), model)
    assert blocky.block == (4, 8) and blocky.nm is None


def test_a_dict_config_from_trial_parameters_works(tiny_llama, calib_ids):
    table = prune(tiny_llama(), {"sparsity": 0.25, "samples": 4, "op_names": [LINEARS[0]]}, pruner="wanda",
                  evaluator=calib_ids)
    assert float(_kept(table, LINEARS[0]).float().mean()) == 0.75
    assert bool(_kept(table, LINEARS[1]).all())


def test_a_model_without_repeated_blocks_is_pruned_as_one_block():
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    table = prune(net, WandaConfig(0.25, samples=10), pruner="wanda", evaluator=torch.randn(10, 16))
    assert bool((table["0.weight"].kept.sum(1) == 12).all()) and bool((table["2.weight"].kept.sum(1) == 24).all())
