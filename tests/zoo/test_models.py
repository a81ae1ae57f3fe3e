"""Embedded models: shapes, BERT sizes, trained digits accuracy, weight cache."""

import pytest
import torch
from torch import nn

from sparta_explore.errors import ConfigError
from sparta_explore.zoo import (
    BertConfig,
    BertEncoder,
    TrainConfig,
    build_model,
    evaluate,
    example_inputs,
    get_spec,
    model_names,
    pretrained,
)


def test_bert_base_sizes():
    cfg = BertConfig.base()
    assert (cfg.hidden, cfg.heads, cfg.ffn, cfg.batch, cfg.seq) == (768, 12, 3072, 32, 128)
    model = build_model("bert-base")
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert len(linears) == 6
    assert tuple(linears["layers.0.ffn.fc1"].weight.shape) == (3072, 768)
    assert not any(isinstance(m, nn.TransformerEncoderLayer) for m in model.modules())


def test_bert_attention_is_permutation_equivariant():
    model = BertEncoder(BertConfig.tiny())
    (x,) = model.example_inputs()
    perm = torch.randperm(x.shape[1])
    assert torch.allclose(model(x)[:, perm], model(x[:, perm]), atol=1e-5)


def test_bert_config_checks():
    with pytest.raises(ValueError, match="divisible"):
        BertConfig(hidden=100, heads=12)
    with pytest.raises(ValueError, match="layers"):
        BertConfig(layers=0)


@pytest.mark.parametrize("name", [n for n in model_names() if n != "bert-base"])  # base: see above
def test_every_model_builds_deterministically(name):
    a, b = build_model(name, seed=3), build_model(name, seed=3)
    for (na, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(pa, pb), na
    (x,) = example_inputs(name, batch=2)
    assert x.shape == (2, *get_spec(name).input_shape)
    assert torch.isfinite(a(x)).all()


def test_unknown_model_lists_choices():
    with pytest.raises(ConfigError, match="digits-cnn"):
        get_spec("alexnet")


@pytest.mark.parametrize("name", ["digits-cnn", "digits-mlp"])
def test_digits_models_reach_95_percent(trained, digits, name):
    assert evaluate(trained(name), digits.test_x, digits.test_y) >= 0.95


def test_cache_hit_loads_identical_weights(cache_dir, digits):
    a, acc_a = pretrained("digits-mlp", cache_dir=cache_dir, data=digits)
    (entry,) = (cache_dir / "zoo").glob("digits-mlp-*.pt")
    stamp = entry.stat().st_mtime_ns
    b, acc_b = pretrained("digits-mlp", cache_dir=cache_dir, data=digits)
    assert entry.stat().st_mtime_ns == stamp  # loaded, not retrained and rewritten
    assert acc_a == acc_b
    for (n, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(pa, pb), n


def test_changed_recipe_retrains_into_a_new_entry(tmp_path, digits):
    pretrained("digits-mlp", cache_dir=tmp_path, data=digits, config=TrainConfig(epochs=1))
    pretrained("digits-mlp", cache_dir=tmp_path, data=digits, config=TrainConfig(epochs=2))
    assert len(list((tmp_path / "zoo").glob("digits-mlp-*.pt"))) == 2


def test_latency_models_have_no_training_task():
    with pytest.raises(ConfigError, match="latency model"):
        pretrained("bert-tiny")
