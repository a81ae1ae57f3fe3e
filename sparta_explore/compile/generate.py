"""Greedy decoding of a Llama without Hugging Face's per-token machinery: `generate(model, input_ids, n)`.

The prompt runs through the model's own modules (`LlamaStep`: large products, a preallocated
KV cache); each new token runs the compiled decode step (`CompiledDecoder`: one C call for
every layer, weights read in their packed layouts). The decoder is built on the first call
and kept for the model until one of its tensors changes (each tensor's version counter).

The tokens are the model's greedy tokens (`model.generate(..., do_sample=False)`; tests hold
both paths to that). A sequence that emits the end-of-sequence token is padded after it, as
Hugging Face does. A model compiled in place decodes through the step too, from its kernels'
weights (`as_linear`). Where the step cannot run (kernels that round their inputs per row,
more than `MAX_BATCH` sequences, no C compiler, another activation) the model's own modules
decode, with a warning naming why; `compiled=False` asks for that path. A model that
is not a Llama-pattern causal LM, a padded batch or sampling runs `model.generate`, with a
warning.

Example:
    >>> out = generate(llama, prompt_ids, max_new_tokens=32)                # doctest: +SKIP
    >>> torch.equal(out, llama.generate(prompt_ids, max_new_tokens=32, do_sample=False))  # doctest: +SKIP
    True
"""

from __future__ import annotations

import itertools
import warnings
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from sparta_explore.compile.decoder import CompiledDecoder, rounded_inputs, why_not_compiled
from sparta_explore.compile.llama_step import LlamaStep, why_not_llama
from sparta_explore.errors import ConfigError
from sparta_explore.kernels.decode_step import MAX_BATCH
from sparta_explore.kernels.packed_weights import PackedWeight

_decoders: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {act_bits: (versions, decoder)}
DECODE_ATTRIBUTE = "sparta_decode"  # a model loaded from a decoder package: its `DecodeSettings`


def _versions(model: nn.Module) -> tuple:
    # buffers too: kernels compiled in place hold their weights as buffers
    return tuple((t.data_ptr(), t._version) for t in itertools.chain(model.parameters(), model.buffers()))


@dataclass(frozen=True)
class DecodeSettings:
    """How a model loaded from a decoder package decodes: the activation width it was measured with and its
    weights' packed layouts, which the step reads while the model's tensors are the loaded ones (`versions`);
    `loaded`: how the load went and the package's manifest (an exported trial's figures in its metadata).

    Example:
        >>> getattr(se.load("pick.sparta"), DECODE_ATTRIBUTE).act_bits   # doctest: +SKIP
        8
    """

    act_bits: int
    packed: Mapping[str, PackedWeight]
    versions: tuple
    loaded: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def attach(cls, model: nn.Module, act_bits: int, packed: Mapping[str, PackedWeight],
               loaded: Mapping[str, Any] | None = None) -> DecodeSettings:
        """Record the settings on `model` (its tensors as they are now) and return them.

        Example:
            >>> DecodeSettings.attach(llama, 8, packed).act_bits   # doctest: +SKIP
            8
        """
        settings = cls(int(act_bits), dict(packed), _versions(model), dict(loaded or {}))
        object.__setattr__(model, DECODE_ATTRIBUTE, settings)
        return settings


def default_act_bits(model: nn.Module) -> int:
    """The activation width `generate` uses when none is given: the loaded package's, else 32 (float).

    Example:
        >>> default_act_bits(nn.Linear(2, 2))
        32
    """
    settings = getattr(model, DECODE_ATTRIBUTE, None)
    return settings.act_bits if isinstance(settings, DecodeSettings) else 32


def compiled_decoder(model: nn.Module, max_len: int, act_bits: int = 32) -> CompiledDecoder:
    """The model's `CompiledDecoder` for at least `max_len` positions: kept from an earlier call while the
    model's tensors are unchanged (packing its weights is the slow part), else built.

    Example:
        >>> compiled_decoder(llama, 160) is compiled_decoder(llama, 96)   # doctest: +SKIP
        True
    """
    versions = _versions(model)
    kept = _decoders.setdefault(model, {})
    held = kept.get(act_bits)
    if held is not None and held[0] == versions and held[1].max_len >= max_len:
        return held[1]
    same = [d.packed for v, d in kept.values() if v == versions]  # any decoder of these tensors: its packed weights
    settings = getattr(model, DECODE_ATTRIBUTE, None)
    if isinstance(settings, DecodeSettings) and settings.versions == versions:  # as loaded: the package's layouts
        same.append(dict(settings.packed))
    decoder = CompiledDecoder(model, max_len, packed=same[0] if same else None, act_bits=act_bits)
    kept[act_bits] = (versions, decoder)
    return decoder


def _fallback_reason(model: nn.Module, attention_mask: torch.Tensor | None, kwargs: dict[str, Any]) -> str | None:
    why = why_not_llama(model)
    if why is not None:
        return why
    if attention_mask is not None and not bool(attention_mask.all()):
        return "the attention mask pads some sequences"
    if kwargs.get("do_sample"):
        return "sampling is not implemented in the step (greedy only)"
    extra = sorted(k for k in kwargs if k not in ("do_sample", "pad_token_id", "eos_token_id"))
    return f"generation options {extra} are Hugging Face's" if extra else None


class _TorchDecode:
    """The decode path through the model's own modules (what runs where the compiled step cannot); `act_bits=8`
    rounds their inputs as the compiled step does."""

    def __init__(self, model: nn.Module, batch: int, max_len: int, act_bits: int) -> None:
        self.model, self.act_bits = model, act_bits
        self.torch_step = LlamaStep(model, max_len)
        self.torch_step.reset(batch)

    def _forward(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        if self.act_bits == 8:
            with rounded_inputs(self.model):
                return self.torch_step.forward(ids, start)
        return self.torch_step.forward(ids, start)

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        return self._forward(ids, 0)

    def step(self, tokens: torch.Tensor, position: int) -> torch.Tensor:
        return self._forward(tokens[:, None], position)


def _decode_path(model: nn.Module, batch: int, max_len: int, compiled: bool, act_bits: int
                 ) -> CompiledDecoder | _TorchDecode:
    if compiled:
        why = why_not_compiled(model)
        if why is None and batch > MAX_BATCH:
            why = f"{batch} sequences; the compiled step decodes up to {MAX_BATCH} at once"
        if why is None:
            decoder = compiled_decoder(model, max_len, act_bits)
            decoder.reset(batch)
            return decoder
        warnings.warn(f"generate: the compiled decode step cannot run ({why}): the model's own modules decode",
                      stacklevel=3)
    return _TorchDecode(model, batch, max_len, act_bits)


@torch.inference_mode()
def generate(model: nn.Module, input_ids: torch.Tensor, max_new_tokens: int, *,
             attention_mask: torch.Tensor | None = None, compiled: bool = True, act_bits: int | None = None,
             **kwargs: Any) -> torch.Tensor:
    """Greedy tokens of `model` after `input_ids` (batch, t): the prompt and up to `max_new_tokens` new tokens.

    `act_bits=8` rounds every projection's input per 32 columns to int8 (faster integer kernels;
    the tokens are those of the model under `rounded_inputs`); None: the width a loaded package
    was measured with (`DecodeSettings`), else 32.

    `pad_token_id` / `eos_token_id` default to the model's generation config; a sequence that
    emits the end token is padded after it, and decoding stops once every sequence has. Other
    cases run `model.generate` (see the module docstring).

    Example:
        >>> generate(llama, torch.tensor([[1, 2, 3]]), 4).shape   # doctest: +SKIP
        torch.Size([1, 7])
    """
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    act_bits = default_act_bits(model) if act_bits is None else act_bits
    if act_bits not in (8, 32):
        raise ConfigError(f"act_bits must be 32 (float inputs) or 8 (int8 runs of 32 columns), got {act_bits!r}")
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise ConfigError(f"input_ids must be (batch, tokens) with at least one token, got {tuple(input_ids.shape)}")
    why = _fallback_reason(model, attention_mask, kwargs)
    if why is not None:
        warnings.warn(f"generate: {why}: the model's own generate runs", stacklevel=2)
        return model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens, **kwargs)
    config = getattr(model, "generation_config", None)
    eos = kwargs.get("eos_token_id", getattr(config, "eos_token_id", None))
    eos = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
    pad = kwargs.get("pad_token_id", getattr(config, "pad_token_id", None))
    pad = pad if pad is not None else (min(eos) if eos else 0)
    batch, t = input_ids.shape
    path = _decode_path(model, batch, t + max_new_tokens, compiled, act_bits)
    done = torch.zeros(batch, dtype=torch.bool)
    ends = torch.tensor(sorted(eos), dtype=input_ids.dtype)
    tokens = [input_ids]
    logits = path.prefill(input_ids)
    for position in range(t, t + max_new_tokens):
        token = torch.where(done, torch.full_like(done, pad, dtype=input_ids.dtype), logits.argmax(-1))
        tokens.append(token[:, None])
        done |= torch.isin(token, ends)
        if bool(done.all()) or position + 1 == t + max_new_tokens:
            break
        logits = path.step(token, position)
    return torch.cat(tokens, dim=1)
