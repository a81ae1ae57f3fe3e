"""Generative models capture with their KV cache off, and get their config back as it was, whatever happens."""

from types import SimpleNamespace

import pytest

from sparta_explore.tracing.kv_cache import NOTE, kv_cache_off


def test_the_cache_is_off_inside_and_back_on_after_even_on_error():
    model = SimpleNamespace(config=SimpleNamespace(use_cache=True))
    with kv_cache_off(model) as note:
        assert note == NOTE and model.config.use_cache is False
    assert model.config.use_cache is True
    with pytest.raises(RuntimeError), kv_cache_off(model):
        raise RuntimeError("capture failed")
    assert model.config.use_cache is True


@pytest.mark.parametrize("use_cache", [False, None])
def test_models_without_a_cache_are_left_alone(use_cache):
    model = SimpleNamespace(config=SimpleNamespace(use_cache=use_cache))
    with kv_cache_off(model) as note:
        assert note is None and model.config.use_cache is use_cache


def test_a_default_llama_captures_and_its_graph_says_why_the_cache_is_off():
    transformers = pytest.importorskip("transformers")
    import torch

    import sparta_explore as se

    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        vocab_size=64)).eval()
    graph = se.capture(model, {"input_ids": torch.randint(0, 64, (2, 8))})
    assert graph.notes == (NOTE,) and model.config.use_cache is True
    assert list(graph.run().keys()) == ["logits"]
