"""Block-by-block calibration: the right blocks and linears, a faithful replay, compressed outputs fed forward."""

import pytest
import torch
from torch import nn

from sparta_explore.errors import ConfigError
from sparta_explore.oneshot import (
    InputHessian,
    block_output,
    calibrate_sequentially,
    calibration_samples,
    capture_block_inputs,
    find_blocks,
    select_linears,
)

Q1 = "model.layers.1.self_attn.q_proj"


def test_the_decoder_layers_are_the_blocks_and_their_linears_the_default(tiny_llama):
    model = tiny_llama()
    blocks = [name for name, _ in find_blocks(model)]
    assert blocks == ["model.layers.0", "model.layers.1"]
    chosen = select_linears(model, blocks)
    assert len(chosen) == 14 and "lm_head" not in chosen and Q1 in chosen


def test_replaying_the_blocks_on_captured_inputs_gives_the_models_logits(tiny_llama, calib_ids):
    model = tiny_llama()
    samples = calibration_samples(calib_ids, 3)
    blocks = find_blocks(model)
    inputs = capture_block_inputs(model, blocks[0][1], samples)
    assert "position_embeddings" in inputs[0].kwargs
    with torch.no_grad():
        for _, block in blocks:
            inputs = [inp.with_hidden(block_output(block, inp)) for inp in inputs]
        replayed = torch.cat([model.lm_head(model.model.norm(inp.hidden)) for inp in inputs])
        assert torch.allclose(replayed, model(calib_ids[:3]).logits, atol=1e-5)


def _block1_hessian(model, samples, shrink_block0: bool) -> torch.Tensor:
    layers = select_linears(model, [b for b, _ in find_blocks(model)])
    seen = {}

    def compress(index, own, stats):
        if index == 0 and shrink_block0:
            with torch.no_grad():
                for layer in own.values():
                    layer.weight.mul_(0.5)
        if index == 1:
            seen["h"] = stats[Q1].hessian.clone()

    calibrate_sequentially(model, samples, layers, lambda n, m: InputHessian(m.in_features, torch.float64), compress)
    return seen["h"]


def test_block_two_is_calibrated_on_the_compressed_block_ones_outputs(tiny_llama, calib_ids):
    samples = calibration_samples(calib_ids, 8)
    dense = _block1_hessian(tiny_llama(), samples, shrink_block0=False)
    compressed = _block1_hessian(tiny_llama(), samples, shrink_block0=True)

    # the dense run's Hessian is the one hooks on the full model's forward see
    model, direct = tiny_llama(), InputHessian(64, torch.float64)
    handle = model.get_submodule(Q1).register_forward_hook(lambda m, a, o: direct.add(a[0]))
    with torch.no_grad():
        for i in range(8):
            model(calib_ids[i:i + 1])
    handle.remove()
    assert torch.allclose(dense, direct.hessian, rtol=1e-6, atol=1e-9)
    assert not torch.allclose(compressed, dense, rtol=1e-2)


def test_calibration_leaves_mode_and_cache_setting_as_they_were(tiny_llama, calib_ids):
    model = tiny_llama().train()
    model.config.use_cache = True
    layers = select_linears(model, [b for b, _ in find_blocks(model)])
    modes = []
    calibrate_sequentially(model, calibration_samples(calib_ids, 2), layers,
                           lambda n, m: InputHessian(m.in_features), lambda i, own, s: modes.append(model.training))
    assert modes == [False, False] and model.training and model.config.use_cache is True


def test_a_model_without_repeated_blocks_is_one_block():
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    assert [name for name, _ in find_blocks(net)] == [""]
    layers = select_linears(net, [""])
    assert list(layers) == ["0", "2"]
    seen = []
    calibrate_sequentially(net, calibration_samples(torch.randn(5, 8)), layers,
                           lambda n, m: InputHessian(m.in_features), lambda i, own, s: seen.append(s["2"].tokens))
    assert seen == [5]


@pytest.mark.parametrize("kwargs, message", [
    ({"op_names": ["model.layers.0.mlp.nope"]}, r"op_names \['model.layers.0.mlp.nope'\] are not submodules"),
    ({"exclude_op_names": ["gone"]}, r"exclude_op_names \['gone'\] are not submodules"),
    ({"op_names": ["lm_head"]}, "'lm_head' lies outside the model's repeated blocks"),
    ({"op_names": ["model.layers.0.mlp"]}, "'model.layers.0.mlp' is a LlamaMLP"),
])
def test_layer_selection_errors_name_the_layer(tiny_llama, kwargs, message):
    model = tiny_llama()
    with pytest.raises(ConfigError, match=message):
        select_linears(model, [b for b, _ in find_blocks(model)], **kwargs)


def test_a_llama_block_groups_its_linears_by_the_input_they_read(tiny_llama, calib_ids):
    from sparta_explore.oneshot.sequential import input_groups

    model = tiny_llama()
    blocks = find_blocks(model)
    inputs = capture_block_inputs(model, blocks[0][1], calibration_samples(calib_ids, 1))
    own = select_linears(model, ["model.layers.0"])
    with torch.no_grad():
        groups = input_groups(blocks[0][1], inputs[0], own)
    assert [[n.split(".")[-1] for n in g] for g in groups] == [["q_proj", "k_proj", "v_proj"], ["o_proj"],
                                                               ["gate_proj", "up_proj"], ["down_proj"]]


@pytest.mark.parametrize("true_sequential", [False, True])
def test_true_sequential_calibrates_each_group_after_the_groups_before_it(tiny_llama, calib_ids, true_sequential):
    samples = calibration_samples(calib_ids, 4)
    model = tiny_llama()
    layers = select_linears(model, ["model.layers.0"])
    seen: dict[str, torch.Tensor] = {}

    def statistic(name, layer):
        return InputHessian(layer.in_features, torch.float64)

    def halve(index, own, stats):  # a stand-in compressor: every linear it is given shrinks
        for name, layer in own.items():
            seen[name] = stats[name].hessian
            layer.weight.data *= 0.5

    calibrate_sequentially(model, samples, layers, statistic, halve, true_sequential=true_sequential)
    # what each linear reads in a full forward with the groups before it halved (true sequential), or none
    before = {"self_attn.q_proj": (), "self_attn.o_proj": ("q_proj", "k_proj", "v_proj"),
              "mlp.down_proj": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj")}
    for name, halved in before.items():
        fresh = tiny_llama()
        for short in halved if true_sequential else ():
            fresh.get_submodule(next(n for n in layers if n.endswith(short))).weight.data *= 0.5
        linear = fresh.get_submodule(f"model.layers.0.{name}")
        direct = InputHessian(linear.in_features, torch.float64)
        handle = linear.register_forward_hook(lambda m, a, o, d=direct: d.add(a[0]))
        with torch.no_grad():
            for i in range(4):
                fresh(calib_ids[i:i + 1])
        handle.remove()
        assert torch.allclose(seen[f"model.layers.0.{name}"], direct.hessian, rtol=1e-6, atol=1e-9), name
