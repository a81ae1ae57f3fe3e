"""GPTQ: weights replaced by values exactly on their groups' grids, pruned zeros kept, and better than rounding."""

import pytest
import torch

from sparta_explore.errors import ConfigError
from sparta_explore.oneshot import QuantSpec, fit_grid, quantize_to_grid
from sparta_explore.pruners import SparseGPTConfig, prune
from sparta_explore.quantizers import GPTQConfig, QuantRequest, get_quantizer, gptq_quantize, quantize
from sparta_explore.tesa import NumberFormat

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

LINEARS = [f"model.layers.{b}.{m}" for b in (0, 1) for m in (
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]


CALIB = torch.randint(0, 256, (32, 32), generator=torch.Generator().manual_seed(1))
HELD_OUT = torch.randint(0, 256, (8, 32), generator=torch.Generator().manual_seed(2))


def _error(model, dense) -> float:
    with torch.no_grad():
        ref = dense(HELD_OUT).logits
        return float((model(HELD_OUT).logits - ref).square().mean() / ref.square().mean())


def _assert_on_grids(weight, grid, bits):
    scale, zero = grid.scale.repeat_interleave(grid.group_size, 1), grid.zero.repeat_interleave(grid.group_size, 1)
    codes = torch.round(weight / scale) + zero
    assert bool(((codes >= 0) & (codes <= 2 ** bits - 1)).all())
    assert torch.equal(scale * (codes - zero), weight)
    assert all(len(group.unique()) <= 2 ** bits for row in weight for group in row.split(grid.group_size))


@pytest.mark.parametrize("sym, fmt", [(False, NumberFormat.UINT), (True, NumberFormat.INT)])
def test_weights_lie_on_their_group_grids_and_the_table_says_the_bits(sym, fmt, tiny_llama):
    model = tiny_llama()
    table = quantize(model, GPTQConfig(bits=4, group_size=32, sym=sym, samples=16), "gptq", evaluator=CALIB)
    for name in LINEARS:
        assert table[f"{name}.weight"].kept_bits() == [4] and table[f"{name}.weight"].formats() == {fmt}
    assert table["lm_head.weight"].kept_bits() == [32]
    results = gptq_quantize(tiny_llama(), GPTQConfig(bits=4, group_size=32, sym=sym, samples=16), CALIB)
    for name in LINEARS:
        weight = model.get_submodule(name).weight
        grid = results[name].grid
        assert grid.scale.shape == (weight.shape[0], weight.shape[1] // 32)
        assert torch.equal(results[name].weight, weight)
        _assert_on_grids(weight, grid, 4)
        if sym:
            assert bool((grid.zero == 8).all())


@pytest.mark.parametrize("group_size", [None, 64])
def test_act_order_keeps_groups_contiguous_in_the_original_column_order(group_size, tiny_llama):
    config = GPTQConfig(bits=3, group_size=group_size, act_order=True, samples=16)
    model = tiny_llama()
    results = gptq_quantize(model, config, CALIB)
    plain = gptq_quantize(tiny_llama(), GPTQConfig(bits=3, group_size=group_size, samples=16), CALIB)
    for name in LINEARS:
        weight = model.get_submodule(name).weight
        assert results[name].grid.group_size == (group_size or weight.shape[1])
        _assert_on_grids(weight, results[name].grid, 3)
    assert any(not torch.equal(results[n].weight, plain[n].weight) for n in LINEARS)


def _round_to_nearest(model, bits, group_size):
    spec = QuantSpec(bits, group_size)
    for name in LINEARS:
        w = model.get_submodule(name).weight.data
        for start in range(0, w.shape[1], group_size):
            group = w[:, start:start + group_size]
            scale, zero = fit_grid(group, spec)
            group.copy_(quantize_to_grid(group, scale[:, None], zero[:, None], spec.maxq))
    return model


def test_gptq_beats_round_to_nearest_on_the_same_grid_and_8_bits_is_nearly_exact(tiny_llama):
    dense = tiny_llama()
    gptq = tiny_llama()
    quantize(gptq, GPTQConfig(bits=4, group_size=32, samples=32), "gptq", evaluator=CALIB)
    rtn = _round_to_nearest(tiny_llama(), 4, 32)
    assert _error(gptq, dense) < 0.7 * _error(rtn, dense)
    eight = tiny_llama()
    quantize(eight, GPTQConfig(bits=8, group_size=32, samples=32), "gptq", evaluator=CALIB)
    assert _error(eight, dense) < 1e-5


def test_quantizing_a_pruned_model_keeps_its_zeros_exactly(tiny_llama):
    model = tiny_llama()
    pruned_table = prune(model, SparseGPTConfig(0.5, samples=16), pruner="sparsegpt", evaluator=CALIB)
    zeros = {name: model.get_submodule(name).weight == 0 for name in LINEARS}
    results = gptq_quantize(model, GPTQConfig(bits=4, group_size=32, samples=16), CALIB)
    for name in LINEARS:
        weight = model.get_submodule(name).weight
        assert bool((weight[zeros[name]] == 0).all()), name  # kept weights may round to 0 too; pruned ones must
        assert torch.equal(results[name].keep, ~zeros[name])
        _assert_on_grids(weight, results[name].grid, 4)
    bits_table = quantize(tiny_llama(), GPTQConfig(bits=4, samples=4, group_size=32), "gptq", evaluator=CALIB)
    merged = pruned_table.merge(bits_table)
    name = f"{LINEARS[0]}.weight"
    assert merged[name].kept_bits() == [4] and float(merged[name].sparsity) == 0.5


@pytest.mark.parametrize("config, message", [
    (GPTQConfig(samples=40, group_size=32), "has 32 samples; the config asks for 40"),
    (GPTQConfig(group_size=32, samples=4, op_names=("model.layers.5.mlp.up_proj",)),
     r"\['model.layers.5.mlp.up_proj'\] are not submodules"),
])
def test_bad_configs_fail_naming_the_culprit_before_any_weight_changes(config, message, tiny_llama):
    model = tiny_llama()
    with pytest.raises(ConfigError, match=message):
        quantize(model, config, "gptq", evaluator=CALIB)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), tiny_llama().parameters()))


def test_config_values_are_checked_where_they_are_made(tiny_llama):
    for kwargs in ({"bits": 1}, {"bits": 9}, {"bits": True}, {"group_size": 0}, {"group_size": -32},
                   {"damp": -0.1}, {"samples": 0}, {"hessian_dtype": "half"}):
        with pytest.raises(ConfigError):
            GPTQConfig(**kwargs)
    with pytest.raises(ConfigError, match="needs an evaluator"):
        quantize(tiny_llama(), GPTQConfig(), "gptq")


def test_a_trial_request_is_weight_only_in_groups_of_128_in_activation_order(tiny_llama):
    entry = get_quantizer("gptq")
    (config,) = entry.configs_for(QuantRequest(4, (*LINEARS, "lm_head"), act_bits=32), tiny_llama())
    assert config.group_size == 128 and config.act_order and config.op_names == tuple(LINEARS) and config.bits == 4
    with pytest.raises(ConfigError, match="weights only"):
        entry.configs_for(QuantRequest(8, tuple(LINEARS)), tiny_llama())
