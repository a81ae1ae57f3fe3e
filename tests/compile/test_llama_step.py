"""`generate`: a Llama's greedy tokens without Hugging Face's per-token machinery, equal to its own (`LlamaStep`)."""

import warnings

import pytest
import torch

from sparta_explore.compile.generate import generate
from sparta_explore.compile.llama_step import LlamaStep, why_not_llama
from sparta_explore.errors import ConfigError

pytest.importorskip("transformers")


def _prompts(batch, length, seed):
    return torch.randint(3, 256, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_each_steps_logits_are_the_full_forwards(tiny_llama):
    model = tiny_llama()
    ids = _prompts(2, 9, 0)
    step = LlamaStep(model, 16)
    step.reset(2)
    with torch.no_grad():
        got = [step.forward(ids[:, :6], 0)] + [step.forward(ids[:, p:p + 1], p) for p in range(6, 9)]
        want = [model(ids[:, :p + 1]).logits[:, -1] for p in range(5, 9)]
    for g, w in zip(got, want):
        assert torch.allclose(g, w, atol=1e-5)


@pytest.mark.parametrize("batch, length, seed", [(1, 12, 1), (1, 5, 2), (3, 20, 3)])
def test_greedy_tokens_equal_hugging_faces(tiny_llama, batch, length, seed):
    model = tiny_llama()
    model.generation_config.eos_token_id = None  # a random model may end early; that case has its own test
    ids = _prompts(batch, length, seed)
    want = model.generate(ids, max_new_tokens=24, do_sample=False, pad_token_id=0)
    assert torch.equal(generate(model, ids, 24), want)


def test_a_sequence_that_ends_is_padded_and_decoding_stops_when_all_have(tiny_llama):
    model = tiny_llama()
    ids = _prompts(2, 8, 4)
    free = generate(model, ids, 6, eos_token_id=None)
    end = int(free[0, 9])  # make the first sequence's second new token its end token
    got = generate(model, ids, 6, eos_token_id=end, pad_token_id=0)
    want = model.generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=end, pad_token_id=0)
    assert torch.equal(got, want)
    assert got[0, 9] == end and bool((got[0, 10:] == 0).all())


def test_a_model_compiled_in_place_decodes_through_the_step_from_its_kernels_weights(tiny_llama, device):
    import sparta_explore as se
    from sparta_explore.compile.config import CompileConfig
    from sparta_explore.compile.generate import compiled_decoder

    model = tiny_llama()
    model.generation_config.eos_token_id = None
    ids = _prompts(1, 16, 5)
    names = [n for n, p in model.named_parameters() if n.startswith("model.layers") and p.dim() == 2]
    table = se.TeSATable({n: se.TeSA.from_mask(torch.rand(model.get_parameter(n).shape,
                                                          generator=torch.Generator().manual_seed(6)) > 0.5)
                          for n in names})
    masked = se.masked_copy(model, table)  # what the user gave: the model masked with the table
    sparse = ";".join(f"{n.removesuffix('.weight').replace('.', '_')}:sparse" for n in names)  # kernels, not torch
    se.compile(model, table, (ids,), config=CompileConfig(inplace=True, device=device, guard=False, choices=sparse))
    assert model.sparta_compiled.swapped
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback: the step reads the kernels' weights
        got = generate(model, ids, 16)
    assert torch.equal(got, masked.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=0))
    decoder = compiled_decoder(model, 32)
    packed = decoder.packed["model.layers.0.self_attn.q_proj"].dequantize()
    assert torch.equal(packed, masked.model.layers[0].self_attn.q_proj.weight)  # the masked weight, zeros and all


def test_int8_kernels_compiled_in_place_decode_through_their_own_modules(tiny_llama, device):
    import sparta_explore as se
    from sparta_explore.compile.config import CompileConfig
    from sparta_explore.kernels.build import cpu_flags
    from sparta_explore.quantizers import bits_to_table
    from sparta_explore.tesa import NumberFormat

    if "avx2" not in cpu_flags():
        pytest.skip("the int8 kernels need AVX2")
    model = tiny_llama()
    model.generation_config.eos_token_id = None
    ids = _prompts(1, 12, 8)
    graph = se.capture(model, (ids,))
    table = bits_to_table(graph, {f"model.layers.{i}.{name}": {"weight": (8, NumberFormat.INT),
                                                               "_input_0": (8, NumberFormat.INT)}
                                  for i in range(2) for name in ("self_attn.q_proj", "mlp.down_proj")})
    se.compile(model, table, (ids,), config=CompileConfig(inplace=True, device=device, guard=False))
    with pytest.warns(UserWarning, match="rounds its inputs to 8 bits per row"):  # its own modules run its kernels
        got = generate(model, ids, 8)
    assert torch.equal(got, model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0))


def test_other_cases_run_the_models_own_generate_and_say_why(tiny_llama):
    model = tiny_llama()
    ids = _prompts(2, 6, 7)
    mask = torch.ones_like(ids)
    mask[0, 0] = 0
    with pytest.warns(UserWarning, match="pads some sequences"):
        out = generate(model, ids, 3, attention_mask=mask, pad_token_id=0)
    assert out.shape == (2, 9)
    with pytest.warns(UserWarning, match="sampling"):
        generate(model, ids, 2, do_sample=True, pad_token_id=0)
    assert why_not_llama(torch.nn.Linear(2, 2)) is not None
    with pytest.raises(ConfigError, match="max_new_tokens"):
        generate(model, ids, 0)
    with pytest.raises(ConfigError, match="LlamaStep runs Llama-pattern"):
        LlamaStep(torch.nn.Linear(2, 2), 8)
    step = LlamaStep(model, 8)
    step.reset(2)
    with pytest.raises(ConfigError, match="do not fit its cache of 8"):
        step.forward(_prompts(2, 9, 8), 0)
