"""A Llama's decode step as one C call per token: `CompiledDecoder(model, max_len)`.

Each projection's weight is packed in the narrowest layout its values fit
(`kernels/packed_weights.py`: a GPTQ 4-bit weight as 4-bit codes with its group scales and
offsets, an 8-bit one as bytes, anything else float32); the output head too, and a tied
embedding reads its rows from the head's codes. `kernels/templates/decode_*.c` then run
every layer of one token (norms, projections, rotary embedding from the model's own
`rotary_emb` tables, its scaling included, attention over the KV cache, SiLU MLP, residuals,
the head) inside one OpenMP region. With `act_bits=8` and every weight on codes the prompt runs the
same way, all its positions in one C call (`templates/decode_prompt.c`: many rows per tile pass, VNNI
integer products where the CPU has them, causal attention over the cache it fills). Otherwise it runs
through `LlamaStep` into the same KV cache: its projections through the model's own modules (float
activations: large float32 matrix products), or with `act_bits=8` through the step's packed weights
(`prefill_products`), a float32 weight's group through its modules on inputs rounded in torch.

With `act_bits=32` activations stay float32 and weights are widened in registers, so the
logits are the compressed model's (its weights as they are) up to summation order. With
`act_bits=8` every projection's input (the head's too) is rounded per 32 columns to a symmetric
int8 grid, as llama.cpp rounds its activations, and integer codes meet integer activations:
the logits are those of the model under `rounded_inputs(model)`.

Example:
    >>> decoder = CompiledDecoder(llama, max_len=160)                     # doctest: +SKIP
    >>> decoder.reset(1); logits = decoder.prefill(prompt_ids)            # doctest: +SKIP
    >>> logits = decoder.step(logits.argmax(-1), position=prompt_ids.shape[1])  # doctest: +SKIP
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager

import pandas as pd
import torch
from torch import nn

from sparta_explore.compile.llama_step import HEAD, LlamaStep, why_not_llama
from sparta_explore.compile.quantized_copy import RoundInput
from sparta_explore.errors import ConfigError
from sparta_explore.fake_quant import fake_quantize_runs
from sparta_explore.kernels.build import compiler_available
from sparta_explore.kernels.decode_step import (
    MAX_BATCH,
    RUN,
    Layer,
    Mat,
    Model,
    library,
    mat_of,
    prefill_products,
    why_no_kernels,
)
from sparta_explore.kernels.packed_weights import PackedWeight, pack_weight

PROJECTIONS = (("q", "self_attn.q_proj"), ("k", "self_attn.k_proj"), ("v", "self_attn.v_proj"),
               ("o", "self_attn.o_proj"), ("gate", "mlp.gate_proj"), ("up", "mlp.up_proj"), ("down", "mlp.down_proj"))
FIELDS = {path: field for field, path in PROJECTIONS}


def _module(layer: nn.Module, path: str) -> nn.Module | None:
    module = layer
    for part in path.split("."):
        module = getattr(module, part, None)
    return module


def why_not_linear(module: nn.Module | None, name: str) -> str | None:
    """Why the step cannot read the projection `module` (an `nn.Linear`, or a kernel compiled in place that
    has `as_linear` and float inputs), or None. Reads no weights.

    Example:
        >>> why_not_linear(nn.Linear(2, 3), "fc") is None
        True
        >>> why_not_linear(nn.Conv1d(2, 3, 1), "fc")
        'fc is a Conv1d, not a linear the step can read'
    """
    if isinstance(module, nn.Linear):
        return None
    if not hasattr(module, "as_linear"):
        return f"{name} is a {type(module).__name__}, not a linear the step can read"
    if getattr(module, "activation", "none") != "none":
        return f"{name} applies {module.activation} itself"
    for part in module.modules():  # an op that rounds its inputs per row: the step rounds per 32 columns or not at all
        bits = getattr(part, "act_bits", 32)
        if bits != 32:
            label = part.op_name() if hasattr(part, "op_name") else type(part).__name__
            return f"{name}: {label} rounds its inputs to {bits} bits per row"
    return None


def linear_of(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, bias) of a projection `why_not_linear` accepts: an `nn.Linear`'s own, or a kernel's `as_linear()`
    (masked, on its grids).

    Example:
        >>> linear_of(nn.Linear(2, 3))[0].shape
        torch.Size([3, 2])
    """
    return (module.weight, module.bias) if isinstance(module, nn.Linear) else module.as_linear()


def why_not_compiled(model: nn.Module) -> str | None:
    """Why `model`'s decode cannot run as the compiled step, or None.

    Example:
        >>> why_not_compiled(nn.Linear(2, 2)).startswith("Linear has no")
        True
    """
    why = why_not_llama(model)
    if why is not None:
        return why
    if not compiler_available():
        return "no C compiler to build the decode step"
    if (why := why_no_kernels()) is not None:
        return why
    return why_not_step_shaped(model)


def why_not_step_shaped(model: nn.Module) -> str | None:
    """Why the Llama-pattern `model`'s layers are not what the decode step computes (SiLU MLPs, RMSNorms, float32
    linears without biases it cannot read), or None; the machine is not asked (no compiler needed).

    Example:
        >>> from sparta_explore.zoo.llm.workloads import tiny_llama
        >>> why_not_step_shaped(tiny_llama(layers=1)) is None
        True
    """
    config = model.config
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"the MLP's activation is {config.hidden_act!r}, the step computes SiLU"
    if model.model.embed_tokens.weight.dtype != torch.float32:
        return f"the model's weights are {model.model.embed_tokens.weight.dtype}, the step runs float32 models"
    for i, layer in enumerate(model.model.layers):
        for _, path in PROJECTIONS:
            if (why := why_not_linear(_module(layer, path), f"decoder layer {i}'s {path}")) is not None:
                return why
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            if not hasattr(norm, "weight") or getattr(norm, "bias", None) is not None:
                return f"decoder layer {i}'s norms are not RMSNorm"
    return why_not_linear(model.lm_head, "lm_head")


@contextmanager
def rounded_inputs(model: nn.Module) -> Iterator[nn.Module]:
    """`model` computing what `CompiledDecoder(model, ..., act_bits=8)` computes while the block runs: each
    decoder projection's and the head's input rounded per 32 columns (hooks removed after).

    Example:
        >>> with rounded_inputs(llama):                                  # doctest: +SKIP
        ...     ppl = perplexity(llama, windows)
    """
    modules = [_module(layer, path) for layer in model.model.layers for _, path in PROJECTIONS] + [model.lm_head]
    hook = RoundInput(8, per_image=False, run=RUN)
    handles = [m.register_forward_pre_hook(hook) for m in modules if m is not None]
    try:
        yield model
    finally:
        for handle in handles:
            handle.remove()


def _eps(norm: nn.Module) -> float:
    return float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))


class CompiledDecoder:
    """`model`'s decode step compiled for up to `MAX_BATCH` sequences of `max_len` positions (module docstring).

    `formats()` lists each weight's layout and bytes; `bytes_per_token` is what a step reads.
    `packed` reuses an earlier decoder's packed weights (same model, unchanged tensors); `pack=False`
    keeps every weight float32 (the same arithmetic, more bytes).

    Example:
        >>> CompiledDecoder(llama, 160).formats().fmt.value_counts()    # doctest: +SKIP
    """

    def __init__(self, model: nn.Module, max_len: int, threads: int | None = None,
                 packed: dict[str, PackedWeight] | None = None, act_bits: int = 32, pack: bool = True) -> None:
        why = why_not_compiled(model)
        if why is not None:
            raise ConfigError(f"CompiledDecoder: {why}")
        if act_bits not in (8, 32):
            raise ConfigError(f"CompiledDecoder: act_bits must be 32 (float inputs) or 8 (int8 runs of {RUN}), "
                              f"got {act_bits!r}")
        self.act_bits, self.pack = act_bits, pack
        self.model, self.max_len = model, int(max_len)
        self.threads = threads
        self.torch_step = LlamaStep(model, self.max_len)
        config = model.config
        self.packed: dict[str, PackedWeight] = dict(packed or {})  # given: an earlier decoder's, for a longer cache
        self._keep: list[torch.Tensor] = [self.torch_step.cos.float().contiguous(),
                                          self.torch_step.sin.float().contiguous()]
        self._layers = (Layer * len(model.model.layers))()
        for i, layer in enumerate(model.model.layers):
            for field, path in PROJECTIONS:
                name = f"model.layers.{i}.{path}"
                setattr(self._layers[i], field, self._mat(name, *linear_of(_module(layer, path))))
            self._layers[i].ln1 = self._pointer(layer.input_layernorm.weight)
            self._layers[i].ln2 = self._pointer(layer.post_attention_layernorm.weight)
        head = self._mat("lm_head", *linear_of(model.lm_head))
        ragged = [name for name, p in self.packed.items() if p.k % RUN]
        if act_bits == 8 and ragged:
            raise ConfigError(f"CompiledDecoder: act_bits=8 rounds inputs per {RUN} columns; {ragged[0]} has "
                              f"{self.packed[ragged[0]].k}")
        head_weight = getattr(model.lm_head, "weight", None)
        tied = head_weight is not None and head_weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        self.model_struct = Model(
            layers=len(model.model.layers), hidden=config.hidden_size, heads=self.torch_step.heads,
            kv_heads=self.torch_step.kv_heads, head_dim=self.torch_step.head_dim,
            inter=model.model.layers[0].mlp.gate_proj.out_features, vocab=model.lm_head.out_features,
            max_len=self.max_len, batch=0, threads=0, act_q=int(act_bits == 8),
            eps=_eps(model.model.layers[0].input_layernorm), attn_scale=self.torch_step.scale,
            embed=None if tied else self._pointer(model.model.embed_tokens.weight),
            norm=self._pointer(model.model.norm.weight), head=head, cos=self._keep[0].data_ptr(),
            sin=self._keep[1].data_ptr(), layer=ctypes.cast(self._layers, ctypes.POINTER(Layer)), scratch=None)
        eps = {_eps(n) for layer in model.model.layers for n in (layer.input_layernorm, layer.post_attention_layernorm)}
        if len(eps | {_eps(model.model.norm)}) != 1:
            raise ConfigError(f"CompiledDecoder: the RMSNorms use different epsilons {sorted(eps)}")
        self.lib = library().lib
        self.batch = 0

    def _pointer(self, t: torch.Tensor) -> int:
        t = t.detach().float().contiguous()
        self._keep.append(t)
        return t.data_ptr()

    def _mat(self, name: str, weight: torch.Tensor, bias: torch.Tensor | None) -> Mat:
        packed = self.packed.get(name) or pack_weight(weight.detach(), bits=None if self.pack else 32)
        # held in the one layout its kernels read (int8 inputs: tiles of rows), not in both
        packed = packed.to_tiles() if self.act_bits == 8 else packed.to_rows()
        self.packed[name] = packed
        mat, keep = mat_of(packed, bias, tiles=self.act_bits == 8)
        self._keep.extend(keep)
        return mat

    @property
    def bytes_per_token(self) -> int:
        """Weight bytes one decode step reads (every packed weight once; the embedding row aside)."""
        return sum(p.nbytes for p in self.packed.values())

    def formats(self) -> pd.DataFrame:
        """One row per weight: layout, bits, group, MB.

        Example:
            >>> decoder.formats().columns.tolist()     # doctest: +SKIP
            ['weight', 'fmt', 'bits', 'group', 'MB']
        """
        return pd.DataFrame([{"weight": k, "fmt": p.fmt, "bits": p.bits, "group": p.group, "MB": p.nbytes / 1e6}
                             for k, p in self.packed.items()])

    def reset(self, batch: int) -> None:
        """Fresh caches for `batch` (1 .. MAX_BATCH) sequences."""
        if not 1 <= batch <= MAX_BATCH:
            raise ConfigError(f"CompiledDecoder runs 1 .. {MAX_BATCH} sequences at once, got {batch}")
        self.torch_step.reset(batch)
        for i, (k, v) in enumerate(zip(self.torch_step.keys, self.torch_step.values)):
            self._layers[i].kcache, self._layers[i].vcache = k.data_ptr(), v.data_ptr()
        self.batch = batch
        self._scratch_threads = 0  # sized on the next step, for its thread count

    def _scratch_for(self, threads: int) -> None:
        s = self.model_struct
        self._scratch = torch.empty(self.lib.scratch_floats(self.batch, s.hidden, s.heads, s.kv_heads, s.head_dim,
                                                            s.inter, s.max_len, threads), dtype=torch.float32)
        s.scratch, s.batch, s.threads = self._scratch.data_ptr(), self.batch, threads
        self._scratch_threads = threads

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """The last prompt position's logits (batch, vocab); the prompt's keys and values fill the cache
        (through the model's own modules, its inputs rounded as the step rounds them)."""
        if ids.shape[0] != self.batch:
            raise ConfigError(f"CompiledDecoder.prefill: {ids.shape[0]} sequences, reset for {self.batch}")
        if self.act_bits == 8 and all(p.has_codes for p in self.packed.values()):
            return self._prompt_step(ids)
        if self.act_bits == 8:
            return self.torch_step.forward(ids, 0, project=self._prefill_project)
        return self.torch_step.forward(ids, 0)

    def _prompt_step(self, ids: torch.Tensor) -> torch.Tensor:
        # every layer of the prompt in one C call (templates/decode_prompt.c): each weight has codes
        batch, t = ids.shape
        if not 1 <= t <= self.max_len:
            raise ConfigError(f"CompiledDecoder.prefill: {t} positions do not fit its cache of {self.max_len}"
                              if t else "CompiledDecoder.prefill: an empty prompt (no position to predict from)")
        vocab = self.model_struct.vocab
        if bool(((ids < 0) | (ids >= vocab)).any()):
            raise ConfigError(f"CompiledDecoder.prefill: token ids must lie in 0 .. {vocab - 1}")
        s, threads = self.model_struct, self.threads or torch.get_num_threads()
        work = torch.empty(self.lib.prompt_floats(batch * t, s.hidden, s.heads, s.kv_heads, s.head_dim, s.inter,
                                                  s.max_len, threads), dtype=torch.float32)
        tokens = ids.to(torch.int64).contiguous()
        logits = torch.empty(batch, vocab, dtype=torch.float32)
        self.lib.prompt_step(ctypes.byref(s), tokens.data_ptr(), batch, t, logits.data_ptr(), threads, work.data_ptr())
        return logits

    def _prefill_project(self, layer: int, paths: tuple[str, ...], x: torch.Tensor) -> list[torch.Tensor]:
        # a LlamaStep projector: the prompt's rows times the step's own packed weights (one rounding a group)
        names = ["lm_head"] if layer == HEAD else [f"model.layers.{layer}.{path}" for path in paths]
        if not all(self.packed[name].has_codes for name in names):  # float values: the modules' own products
            return self.torch_step.by_modules(layer, paths, fake_quantize_runs(x, RUN, 8))
        mats = [self.model_struct.head] if layer == HEAD else [getattr(self._layers[layer], FIELDS[p]) for p in paths]
        outs = prefill_products(mats, x.reshape(-1, x.shape[-1]), self.threads)
        return [out.view(*x.shape[:-1], out.shape[1]) for out in outs]

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor, position: int) -> torch.Tensor:
        """Logits (batch, vocab) after `tokens` (batch,) at `position`; the cache holds 0 .. position - 1."""
        if tokens.shape != (self.batch,):
            raise ConfigError(f"CompiledDecoder.step: expected {self.batch} tokens, got shape {tuple(tokens.shape)}")
        if not 0 <= position < self.max_len:
            raise ConfigError(f"CompiledDecoder.step: position {position} does not fit its cache of {self.max_len}")
        vocab = self.model_struct.vocab
        if bool(((tokens < 0) | (tokens >= vocab)).any()):
            raise ConfigError(f"CompiledDecoder.step: token ids must lie in 0 .. {vocab - 1}, got {tokens.tolist()}")
        threads = self.threads or torch.get_num_threads()
        if threads != self._scratch_threads:
            self._scratch_for(threads)
        ids = tokens.to(torch.int64).contiguous()
        logits = torch.empty(self.batch, vocab, dtype=torch.float32)
        self.lib.decode_step(ctypes.byref(self.model_struct), ids.data_ptr(), self.batch, position,
                             logits.data_ptr())
        return logits
