"""The compiled decode step: every layer of a token in one C call, equal to the model it was built from."""

import contextlib
import warnings

import pytest
import torch

import sparta_explore.compile.decoder as decoder_module
from sparta_explore.compile.decoder import CompiledDecoder, linear_of, rounded_inputs, why_not_compiled, why_not_linear
from sparta_explore.compile.generate import compiled_decoder, generate
from sparta_explore.errors import ConfigError
from sparta_explore.fake_quant import fake_quantize_rows
from sparta_explore.kernels import ShrunkLinear
from sparta_explore.kernels.decode_step import why_no_kernels
from sparta_explore.kernels.dense import DenseLinear, SummedParts
from sparta_explore.oneshot.grid import QuantSpec, round_to_grids

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(why_no_kernels() is not None, reason=str(why_no_kernels()))


def gqa_llama(quantized: bool) -> torch.nn.Module:
    """Grouped-query heads (4 over 2), a tied head; `quantized`: 4-bit grids of 32 in the layers, 8-bit head rows."""
    state = torch.random.get_rng_state()
    torch.manual_seed(7)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                      max_position_embeddings=128, use_cache=False)
    model = transformers.LlamaForCausalLM(config).eval()
    torch.random.set_rng_state(state)
    model.generation_config.eos_token_id = None
    if quantized:
        with torch.no_grad():
            for name, module in model.named_modules():
                if isinstance(module, torch.nn.Linear) and name.startswith("model.layers"):
                    module.weight.copy_(round_to_grids(module.weight, QuantSpec(4, 32)))
            model.lm_head.weight.copy_(fake_quantize_rows(model.lm_head.weight, 8))
    return model


def _prompts(batch, length, seed):
    return torch.randint(3, 256, (batch, length), generator=torch.Generator().manual_seed(seed))


def _models(tiny_llama):
    return {"float, own heads": tiny_llama(), "4-bit, grouped heads": gqa_llama(True)}


@pytest.mark.parametrize("which", ["float, own heads", "4-bit, grouped heads"])
def test_each_steps_logits_are_the_full_forwards(tiny_llama, which):
    model = _models(tiny_llama)[which]
    decoder = CompiledDecoder(model, 24)
    if which.startswith("4-bit"):
        formats = decoder.formats().set_index("weight")
        assert set(formats.fmt) == {"u4", "u8"} and formats.loc["lm_head", "fmt"] == "u8"  # tied: the embedding too
        assert decoder.bytes_per_token < sum(p.numel() for p in model.parameters()) * 4 / 3
    ids = _prompts(3, 12, 0)
    decoder.reset(3)
    with torch.no_grad():
        got = [decoder.prefill(ids[:, :6])] + [decoder.step(ids[:, p], p) for p in range(6, 12)]
        want = [model(ids[:, :p + 1]).logits[:, -1] for p in range(5, 12)]
    for g, w in zip(got, want):
        assert float((g - w).abs().max()) <= 1e-4 * float(w.abs().max())


@pytest.mark.parametrize("head_dim", [12, 80])
def test_attention_over_head_sizes_the_vector_path_does_not_divide(head_dim):
    """12: not a multiple of 8 (positions one at a time); 80: output columns in a 64 and a 16 pass. Positions
    5 .. 20 give every remainder of eight-position score blocks."""
    torch.manual_seed(3)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=2 * head_dim, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                      max_position_embeddings=64, use_cache=False)
    model = transformers.LlamaForCausalLM(config).eval()
    decoder = CompiledDecoder(model, 24, pack=False)
    ids = torch.randint(0, 128, (2, 21), generator=torch.Generator().manual_seed(4))
    decoder.reset(2)
    with torch.no_grad():
        got = [decoder.prefill(ids[:, :5])] + [decoder.step(ids[:, p], p) for p in range(5, 21)]
        want = [model(ids[:, :p + 1]).logits[:, -1] for p in range(4, 21)]
    for g, w in zip(got, want):
        assert float((g - w).abs().max()) <= 1e-4 * float(w.abs().max())


@pytest.mark.parametrize("batch, length, seed", [(1, 10, 1), (3, 7, 2)])
def test_greedy_tokens_equal_hugging_faces(batch, length, seed):
    model = gqa_llama(True)
    ids = _prompts(batch, length, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the compiled step runs: no fallback warning
        got = generate(model, ids, 40)
    assert torch.equal(got, model.generate(ids, max_new_tokens=40, do_sample=False, pad_token_id=0))


def test_the_decoder_is_kept_until_the_model_changes():
    model = gqa_llama(True)
    first = compiled_decoder(model, 40)
    assert compiled_decoder(model, 20) is first
    longer = compiled_decoder(model, 80)
    assert longer is not first and longer.packed["lm_head"] is first.packed["lm_head"]  # packed once
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.mul_(2.0)
    changed = compiled_decoder(model, 40)
    assert changed is not longer
    ids = _prompts(1, 8, 3)
    assert torch.equal(generate(model, ids, 12), model.generate(ids, max_new_tokens=12, do_sample=False,
                                                                pad_token_id=0))


def test_bad_input_is_refused_with_one_clear_error():
    decoder = CompiledDecoder(gqa_llama(False), 16)
    with pytest.raises(ConfigError, match="1 .. 8 sequences"):
        decoder.reset(9)
    decoder.reset(2)
    with pytest.raises(ConfigError, match="expected 2 tokens"):
        decoder.step(torch.tensor([1, 2, 3]), 0)
    with pytest.raises(ConfigError, match="position 16 does not fit its cache of 16"):
        decoder.step(torch.tensor([1, 2]), 16)
    with pytest.raises(ConfigError, match=r"token ids must lie in 0 \.\. 255"):
        decoder.step(torch.tensor([1, 256]), 0)
    with pytest.raises(ConfigError, match="CompiledDecoder: Linear has no"):
        CompiledDecoder(torch.nn.Linear(2, 2), 8)


def test_where_the_step_cannot_run_the_models_modules_decode_and_say_why(tiny_llama, no_compiler):
    model = tiny_llama()
    model.generation_config.eos_token_id = None
    ids = _prompts(9, 5, 4)
    want = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    with pytest.warns(UserWarning, match="no C compiler"):
        assert torch.equal(generate(model, ids, 6), want)


def test_a_batch_larger_than_the_step_and_compiled_false():
    model = gqa_llama(False)
    ids = _prompts(9, 5, 5)
    want = model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0)
    with pytest.warns(UserWarning, match="9 sequences; the compiled step decodes up to 8"):
        assert torch.equal(generate(model, ids, 5), want)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(generate(model, ids, 5, compiled=False), want)


def test_why_not_compiled_names_what_differs():
    model = gqa_llama(False)
    assert why_not_compiled(model) is None
    model.config.hidden_act = "gelu"
    assert "activation is 'gelu'" in why_not_compiled(model)


@pytest.mark.parametrize("which", ["float, own heads", "4-bit, grouped heads"])
def test_int8_activations_compute_the_model_with_rounded_inputs(tiny_llama, which):
    model = _models(tiny_llama)[which]
    decoder = CompiledDecoder(model, 24, act_bits=8)
    ids = _prompts(2, 12, 9)
    decoder.reset(2)
    with torch.no_grad():
        got = [decoder.prefill(ids[:, :6])] + [decoder.step(ids[:, p], p) for p in range(6, 12)]
        with rounded_inputs(model):
            want = [model(ids[:, :p + 1]).logits[:, -1] for p in range(5, 12)]
        exact = model(ids).logits[:, -1]
    for g, w in zip(got, want):
        assert float((g - w).abs().max()) <= 1e-4 * float(w.abs().max())
    assert not torch.allclose(got[-1], exact, atol=1e-4)  # the rounding is there, and the hooks are gone
    if which == "4-bit, grouped heads":  # int8 inputs read tiles: the decoder holds them and not the rows too
        codes = [p for p in decoder.packed.values() if p.fmt != "f32"]
        assert codes and all(p.tiles for p in codes)
        floats = CompiledDecoder(model, 24, packed=decoder.packed)  # float inputs from them: back to rows
        assert not any(p.tiles for p in floats.packed.values())
        floats.reset(2)
        with torch.no_grad():
            assert torch.allclose(floats.prefill(ids[:, :6]), model(ids[:, :6]).logits[:, -1], atol=1e-4)
            assert torch.allclose(floats.step(ids[:, 6], 6), model(ids[:, :7]).logits[:, -1], atol=1e-4)


@pytest.mark.parametrize("head_bits", [8, 4])
def test_int8_activation_tokens_equal_the_rounded_models(head_bits):
    model = gqa_llama(True)
    if head_bits == 4:  # the tied head in 4-bit tiles: embedding rows are read from them too
        with torch.no_grad():
            model.lm_head.weight.copy_(round_to_grids(model.lm_head.weight, QuantSpec(4, 32)))
    ids = _prompts(2, 9, 10)
    got = generate(model, ids, 32, act_bits=8)
    with rounded_inputs(model):
        want = model.generate(ids, max_new_tokens=32, do_sample=False, pad_token_id=0)
    assert torch.equal(got, want)
    assert torch.equal(generate(model, ids, 32, act_bits=8, compiled=False), want)
    with pytest.raises(ConfigError, match="act_bits must be 32"):
        generate(model, ids, 4, act_bits=4)


def test_kernels_compiled_in_place_read_as_the_dense_linears_they_compute():
    g = torch.Generator().manual_seed(3)
    w, bias, x = torch.randn(8, 64, generator=g), torch.randn(8, generator=g), torch.randn(3, 64, generator=g)
    kept = torch.rand(8, 64, generator=g) > 0.5
    kept[2] = False  # a pruned row: its output is the bias
    kept[:, 5] = False  # a pruned column
    shrunk = ShrunkLinear(w, bias, kept)
    parts = SummedParts([DenseLinear(w * kept, None), DenseLinear(w * ~kept, None)], bias)
    for op in (shrunk, parts):
        assert why_not_linear(op, "fc") is None
        assert torch.allclose(torch.nn.functional.linear(x, *linear_of(op)), op(x), atol=1e-5)
    assert why_not_linear(SummedParts([DenseLinear(w, None, act_bits=8)], None), "fc").endswith(
        "rounds its inputs to 8 bits per row")
    assert why_not_linear(DenseLinear(w, None, activation="relu"), "fc") == "fc applies relu itself"


def test_an_int8_prompt_runs_the_packed_weights_and_float_groups_their_modules(monkeypatch):
    model = gqa_llama(True)
    with torch.no_grad():  # layer 1's MLP off any grid: float32 rows, its group through the modules
        for name in ("gate_proj", "up_proj"):
            getattr(model.model.layers[1].mlp, name).weight.normal_(0, 0.05)
    decoder = CompiledDecoder(model, 48, act_bits=8)
    assert decoder.packed["model.layers.1.mlp.gate_proj"].fmt == "f32"
    calls = []
    real = decoder_module.prefill_products
    monkeypatch.setattr(decoder_module, "prefill_products", lambda mats, x, threads: calls.append(len(mats))
                        or real(mats, x, threads))
    ids = _prompts(2, 21, 11)  # 42 rows: ragged against the kernel's row blocks
    decoder.reset(2)
    with torch.no_grad():
        got = decoder.prefill(ids)
        with rounded_inputs(model):
            want = model(ids).logits[:, -1]
        nxt = decoder.step(got.argmax(-1), 21)
        with rounded_inputs(model):
            want_next = model(torch.cat([ids, got.argmax(-1)[:, None]], 1)).logits[:, -1]
    assert float((got - want).abs().max()) <= 1e-4 * float(want.abs().max())
    assert float((nxt - want_next).abs().max()) <= 1e-4 * float(want_next.abs().max())  # the cache it filled
    # per layer q/k/v, o, gate/up (not layer 1's), down; then the head: one call a group
    assert calls == [3, 1, 2, 1, 3, 1, 1, 1]


@pytest.mark.parametrize("act_bits, head", [(32, "dense"), (8, "dense"), (32, "pruned")])
def test_a_pruned_models_weights_are_read_as_bitmask_rows(act_bits, head):
    model = gqa_llama(False)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():  # half of every projection pruned at random (the tied head too, or not)
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and (name.startswith("model.layers") or head == "pruned"):
                module.weight.mul_(torch.rand(module.weight.shape, generator=g) < 0.5)
    decoder = CompiledDecoder(model, 32, act_bits=act_bits)
    formats = decoder.formats().set_index("weight")
    # a pruned tied head: the step reads each token's embedding row from its bitmask rows
    assert set(formats.fmt) - {"f32"} == {"s32"} and formats.loc["lm_head", "fmt"] == {"dense": "f32"}.get(head, "s32")
    assert decoder.bytes_per_token < 0.8 * sum(p.nbytes for p in CompiledDecoder(model, 32, pack=False).packed.values())
    ids = _prompts(2, 9, 12)
    if act_bits == 32:
        assert torch.equal(generate(model, ids, 16), model.generate(ids, max_new_tokens=16, do_sample=False,
                                                                     pad_token_id=0))
    decoder.reset(2)
    with torch.no_grad():
        got = [decoder.prefill(ids[:, :5])] + [decoder.step(ids[:, p], p) for p in range(5, 9)]
        with rounded_inputs(model) if act_bits == 8 else contextlib.nullcontext():
            want = [model(ids[:, :p + 1]).logits[:, -1] for p in range(4, 9)]
    for a, b in zip(got, want):
        assert float((a - b).abs().max()) <= 1e-4 * float(b.abs().max())


def test_an_int8_prompt_of_coded_weights_runs_as_one_call_equal_to_the_layer_by_layer_path():
    model = gqa_llama(True)
    decoder = CompiledDecoder(model, 40, act_bits=8)
    ids = _prompts(3, 13, 14)  # 39 rows: ragged against the row blocks
    decoder.reset(3)
    with torch.no_grad():
        one_call = decoder.prefill(ids)
        caches = [t.clone() for t in decoder.torch_step.keys + decoder.torch_step.values]
        decoder.reset(3)
        by_layer = decoder.torch_step.forward(ids, 0, project=decoder._prefill_project)
    assert float((one_call - by_layer).abs().max()) <= 1e-4 * float(by_layer.abs().max())
    for got, want in zip(caches, decoder.torch_step.keys + decoder.torch_step.values):
        assert float((got - want).abs().max()) <= 1e-4 * float(want.abs().max())
    with pytest.raises(ConfigError, match="41 positions do not fit its cache of 40"):
        decoder.prefill(_prompts(3, 41, 0))
    with pytest.raises(ConfigError, match="an empty prompt"):
        decoder.prefill(_prompts(3, 0, 0))
