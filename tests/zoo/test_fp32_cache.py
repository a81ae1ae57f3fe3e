"""A GGUF model's float32 copy: read once, then loaded from the cache, the same model; a changed file is a new entry."""

import os

import pytest
import torch

from sparta_explore.zoo.llm.fp32_cache import cached_fp32_model, entry_key

pytest.importorskip("transformers")


def _tied_tiny_llama():
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(config).eval()


def test_the_first_load_is_kept_and_later_loads_are_the_same_model(tmp_path):
    source = tmp_path / "model.gguf"
    source.write_bytes(b"stands in for the GGUF file")
    loads = []

    def load():
        loads.append(1)
        return _tied_tiny_llama()

    first = cached_fp32_model(source, load, tmp_path / "cache")
    second = cached_fp32_model(source, load, tmp_path / "cache")
    assert len(loads) == 1 and not second.training
    a, b = first.state_dict(), second.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert second.lm_head.weight.data_ptr() == second.model.embed_tokens.weight.data_ptr()  # still tied
    ids = torch.randint(0, 96, (1, 7))
    with torch.no_grad():
        assert torch.equal(first(ids).logits, second(ids).logits)
    source.write_bytes(b"another file now")  # another size: another entry, read from the file again
    os.utime(source, ns=(1, 1))
    cached_fp32_model(source, load, tmp_path / "cache")
    assert len(loads) == 2 and len(list((tmp_path / "cache" / "zoo" / "gguf-fp32").iterdir())) == 2


def test_a_cache_that_cannot_be_written_costs_only_the_speed(tmp_path):
    source = tmp_path / "model.gguf"
    source.write_bytes(b"x")
    blocked = tmp_path / "blocked"
    (blocked / "zoo").mkdir(parents=True)
    (blocked / "zoo" / "gguf-fp32").write_text("a file where the cache folder should be")
    with pytest.warns(UserWarning, match="no cache folder for model.gguf's float32 copy"):
        assert cached_fp32_model(source, _tied_tiny_llama, blocked).config.num_hidden_layers == 2


def test_a_read_only_cache_warns_and_still_gives_the_model(tmp_path):
    source = tmp_path / "model.gguf"
    source.write_bytes(b"x")
    read_only = tmp_path / "ro"
    (read_only / "zoo" / "gguf-fp32").mkdir(parents=True)
    os.chmod(read_only / "zoo" / "gguf-fp32", 0o500)
    try:
        if os.access(read_only / "zoo" / "gguf-fp32", os.W_OK):
            pytest.skip("running as root: a read-only folder is still writable")
        with pytest.warns(UserWarning, match="could not keep model.gguf's float32 copy"):
            model = cached_fp32_model(source, _tied_tiny_llama, read_only)
        assert model.config.num_hidden_layers == 2
    finally:
        os.chmod(read_only / "zoo" / "gguf-fp32", 0o700)
    assert len(entry_key(source)) == 16 and entry_key(source) == entry_key(source)
