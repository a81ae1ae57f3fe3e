"""NNI quantizer adapters: TeSA bits equal NNI's quant_bits, on weights and activations."""

import copy

import pytest
import torch
from nni.compression.quantization import QATQuantizer

from sparta_explore import NumberFormat, capture
from sparta_explore.errors import ConfigError
from sparta_explore.pruners import prune
from sparta_explore.pruners.nni_evaluator import quiet_nni, workload_evaluator
from sparta_explore.quantizers import NNIQuantConfig, bits_to_table, get_quantizer, parse_quant_dtype, quantize

MODELS = ["digits-mlp", "digits-cnn"]


@pytest.mark.parametrize("model_name", MODELS)
def test_qat_bits_equal_nni_calibration_config(trained, digits, digits_task, model_name):
    model = trained(model_name)
    config = NNIQuantConfig(weight_bits=4, activation_bits=8, training_steps=4)
    reference = copy.deepcopy(model)
    with quiet_nni():
        q = QATQuantizer(reference, config.to_config_list(), workload_evaluator(reference, digits_task(model_name)))
        _, calib = q.compress(max_steps=4, max_epochs=None)
        q.unwrap_model()
    graph = capture(model, digits.test_x[:2])
    table = quantize(model, config, "qat", evaluator=digits_task(model_name), graph=graph)
    checked = 0
    for module, targets in calib.items():
        node = graph.module_nodes(module)[0]
        for target, info in targets.items():
            name = f"{module}.{target}" if target == "weight" else graph.tensor_name(node.args[0])
            bits, fmt = parse_quant_dtype(info["quant_dtype"])
            assert table[name].kept_bits() == [info["quant_bits"]] == [bits], name
            assert table[name].formats() == {fmt}, name
            checked += 1
    assert checked >= 2 * len(calib)


@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize("name", ["qat", "ptq", "lsq", "dorefa", "bnn"])
def test_every_quantizer_table_equals_its_reported_bits(trained, digits, digits_task, model_name, name):
    model = trained(model_name)
    graph = capture(model, digits.test_x[:2])
    config = NNIQuantConfig(training_steps=4)
    bits = get_quantizer(name).fn(model, config, digits_task(model_name))
    assert bits
    table = bits_to_table(graph, bits)
    for module, targets in bits.items():
        for target, (nbits, fmt) in targets.items():
            if target == "weight":
                assert table[f"{module}.weight"].kept_bits() == [nbits]
                assert table[f"{module}.weight"].formats() == {fmt}
    expected = 1 if name == "bnn" else 8
    assert {b for t in bits.values() for b, _ in t.values()} == {expected}
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert model(digits.test_x[:4]).shape == (4, 10)
    assert not any(m.training for m in model.modules()), "the quantizer left the model in training mode"


def test_mixed_precision_config_list(trained, digits, digits_task):
    model = trained("digits-mlp")
    config_list = [{"op_names": ["layers.0"], "target_names": ["weight"], "quant_dtype": "int4",
                    "quant_scheme": "symmetric"},
                   {"op_names": ["layers.1", "head"], "target_names": ["weight", "_input_"], "quant_dtype": "int8",
                    "quant_scheme": "symmetric",
                    "target_settings": {"_input_": {"quant_dtype": "uint8", "quant_scheme": "affine"}}}]
    table = quantize(model, config_list, "qat", evaluator=digits_task("digits-mlp"), example_inputs=digits.test_x[:2])
    assert table["layers.0.weight"].kept_bits() == [4]
    assert table["layers.1.weight"].kept_bits() == [8]
    assert table["relu"].formats() == {NumberFormat.UINT} and table["relu"].shape == (1, 256)
    assert table["layers.0.bias"].kept_bits() == [32]


def test_merge_with_pruning_keeps_pruned_elements_pruned(trained, digits_task):
    model = trained("digits-mlp")
    pruned = prune(model, {"sparsity": 0.6}, pruner="level")
    bits = quantize(model, {"targets": ["weight"], "training_steps": 2}, "qat", evaluator=digits_task("digits-mlp"))
    merged = pruned.merge(bits)
    w = merged["layers.0.weight"]
    assert torch.equal(w.pruned, pruned["layers.0.weight"].pruned)
    assert w.bit_histogram() == {0: int(w.pruned.sum()), 8: int(w.kept.sum())}


def test_activation_targets_need_the_graph(trained, digits_task):
    with pytest.raises(ConfigError, match="graph= or example_inputs="):
        quantize(trained("digits-mlp"), NNIQuantConfig(training_steps=1), "qat", evaluator=digits_task("digits-mlp"))


def test_quantizers_need_an_evaluator(trained):
    with pytest.raises(ConfigError, match="evaluator"):
        quantize(trained("digits-mlp"), NNIQuantConfig(), "lsq")


@pytest.mark.parametrize("bad", [{"weight_bits": 0}, {"weight_dtype": "float"}, {"targets": ["kernel"]}])
def test_bad_quant_configs(bad):
    with pytest.raises(ConfigError):
        NNIQuantConfig(**bad)


@pytest.mark.parametrize("text,expected", [("int8", (8, NumberFormat.INT)), ("uint4", (4, NumberFormat.UINT)),
                                           (None, (8, NumberFormat.INT)), ("int2", (2, NumberFormat.INT))])
def test_parse_quant_dtype(text, expected):
    assert parse_quant_dtype(text) == expected


@pytest.mark.parametrize("bad", ["float16", "int", "int64", "uint0"])
def test_parse_quant_dtype_rejects(bad):
    with pytest.raises(ConfigError, match=bad):
        parse_quant_dtype(bad)


@pytest.mark.parametrize("name", ["lsq", "qat"])
def test_root_level_parameter_regression(trained, digits_task, name):
    # NNI 3.0 crashes naming a root-level parameter (digits-transformer's `position`) when it
    # adds quantizer parameters to the optimizer; our evaluator keeps such parameters apart.
    model = trained("digits-transformer")
    table = quantize(model, NNIQuantConfig(targets=("weight",), training_steps=2), name,
                     evaluator=digits_task("digits-transformer"))
    assert table["encoder.layers.0.attn.query.weight"].kept_bits() == [8]
    assert table["position"].kept_bits() == [32]
