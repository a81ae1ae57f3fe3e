"""SparseGPT: pruned weights exactly 0 in the model, the table says which, and it beats Wanda and magnitude."""

import pytest
import torch

import sparta_explore as se
from sparta_explore.errors import ConfigError
from sparta_explore.pruners import PruneRequest, SparseGPTConfig, WandaConfig, get_pruner, prune, sparsegpt_prune

LINEARS = [f"model.layers.{b}.{m}" for b in (0, 1) for m in (
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]


def test_the_model_is_pruned_in_place_and_the_table_matches_it(tiny_llama, calib_ids):
    model = tiny_llama()
    table = prune(model, SparseGPTConfig(0.5, samples=16), pruner="sparsegpt", evaluator=calib_ids)
    fresh = tiny_llama()
    for name in LINEARS:
        weight, kept = model.get_submodule(name).weight, table[f"{name}.weight"].kept
        assert bool((weight[~kept] == 0).all()) and float(kept.float().mean()) == 0.5, name
        assert not torch.equal(weight[kept], fresh.get_submodule(name).weight[kept]), name  # kept ones updated
    masked = se.masked_copy(model, table)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), masked.parameters()))
    assert torch.equal(model.lm_head.weight, fresh.lm_head.weight)


def test_nm_groups_hold_exactly_n_nonzeros(tiny_llama, calib_ids):
    model = tiny_llama()
    table = prune(model, SparseGPTConfig(nm=(2, 4), samples=8), pruner="sparsegpt", evaluator=calib_ids)
    for name in LINEARS:
        kept = table[f"{name}.weight"].kept
        assert bool((kept.reshape(kept.shape[0], -1, 4).sum(-1) == 2).all()), name
        assert bool((model.get_submodule(name).weight[~kept] == 0).all())


def _magnitude(model, n_of_m=None, sparsity=0.5):
    for name in LINEARS:
        w = model.get_submodule(name).weight.data
        if n_of_m is None:
            w.scatter_(1, w.abs().topk(round(w.shape[1] * sparsity), dim=1, largest=False).indices, 0.0)
        else:
            n, m = n_of_m
            groups = w.view(w.shape[0], -1, m)
            groups.scatter_(-1, groups.abs().topk(m - n, dim=-1, largest=False).indices, 0.0)
    return model


@pytest.mark.parametrize("pattern", [{"sparsity": 0.5}, {"nm": (2, 4)}], ids=["unstructured", "2:4"])
def test_sparsegpt_beats_wanda_beats_magnitude(tiny_llama, calib_ids, held_out_ids, logits_error, pattern):
    dense = tiny_llama()
    sparsegpt = tiny_llama()
    prune(sparsegpt, SparseGPTConfig(**pattern, samples=32), pruner="sparsegpt", evaluator=calib_ids)
    model = tiny_llama()
    wanda = se.masked_copy(model, prune(model, WandaConfig(**pattern, samples=32), pruner="wanda",
                                        evaluator=calib_ids))
    magnitude = _magnitude(tiny_llama(), pattern.get("nm"))
    errors = [logits_error(m, dense, held_out_ids) for m in (sparsegpt, wanda, magnitude)]
    assert errors[0] < 0.8 * errors[1] and errors[1] < 0.8 * errors[2], errors


def test_joint_quantization_keeps_the_mask_and_puts_kept_weights_on_grids(tiny_llama, calib_ids):
    model = tiny_llama()
    results = sparsegpt_prune(model, SparseGPTConfig(0.5, bits=4, group_size=32, samples=8), calib_ids)
    for name in LINEARS:
        r, weight = results[name], model.get_submodule(name).weight
        assert torch.equal(weight, r.weight) and bool((weight[~r.keep] == 0).all())
        assert float(r.keep.float().mean()) == 0.5
        assert torch.equal(r.grid.dequantize(r.grid.codes(weight)), weight)
        assert all(len(group.unique()) <= 16 for row in weight for group in row.split(32))


def test_a_bad_config_fails_before_any_weight_changes(tiny_llama, calib_ids):
    model = tiny_llama()
    with pytest.raises(ConfigError, match="m=6 to divide the input width 64"):
        prune(model, SparseGPTConfig(nm=(3, 6), samples=4), pruner="sparsegpt", evaluator=calib_ids)
    with pytest.raises(ConfigError, match="has 32 samples; the config asks for 33"):
        prune(model, SparseGPTConfig(0.5, samples=33), pruner="sparsegpt", evaluator=calib_ids)
    with pytest.raises(ConfigError, match="'lm_head' lies outside the model's repeated blocks"):
        prune(model, SparseGPTConfig(0.5, samples=4, op_names=("lm_head",)), pruner="sparsegpt", evaluator=calib_ids)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), tiny_llama().parameters()))


def test_config_values_are_checked_where_they_are_made():
    for kwargs in ({"bits": 1}, {"bits": 9}, {"group_size": 32}, {"damp": -1.0}, {"blocksize": 0},
                   {"hessian_dtype": "float16"}, {"bits": 4, "group_size": 0}):
        with pytest.raises(ConfigError):
            SparseGPTConfig(0.5, **kwargs)


def test_a_trial_request_maps_to_configs_and_blocks_are_refused(tiny_llama):
    model = tiny_llama()
    entry = get_pruner("sparsegpt")
    assert [c.nm for c in entry.configs_for(PruneRequest(0.75, tuple(LINEARS), block=(1, 4)), model)] == [(1, 4)]
    with pytest.raises(ConfigError, match="not \\(4, 4\\) blocks"):
        entry.configs_for(PruneRequest(0.5, tuple(LINEARS), block=(4, 4)), model)
