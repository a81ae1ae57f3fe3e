"""A Llama's forward over new tokens through its own modules, with a preallocated KV cache: `LlamaStep`.

Hugging Face's `generate` spends most of a small model's token on Python: cache objects,
masks, logits processors, one module call at a time through several wrappers. `LlamaStep`
runs the same arithmetic directly: the model's own modules (so kernels an in-place compile
put there run), one preallocated KV cache per layer, the rotary table computed once by the
model's own `rotary_emb`, and `scaled_dot_product_attention` (grouped-query heads included).
It is the prompt's path of `generate` (`compile/generate.py`), and its decode path where
the compiled step (`compile/decoder.py`) cannot run. A `Projector` passed to `forward` computes
the linear projections instead of the modules, a group sharing one input at a time (q/k/v,
gate/up): the compiled step's prompt runs its own packed weights so.

Example:
    >>> step = LlamaStep(llama, max_len=160); step.reset(1)        # doctest: +SKIP
    >>> logits = step.forward(prompt_ids, start=0)                 # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from sparta_explore.errors import ConfigError

_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj", "act_fn")
_LAYER = ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")
# the projections a forward asks for together (one input each): a projector may fuse them
QKV = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
GATE_UP = ("mlp.gate_proj", "mlp.up_proj")
HEAD = -1  # the layer index a projector is asked for the output head with

# (layer index or HEAD, module paths in that layer (the model for HEAD), their one input) -> their outputs
Projector = Callable[[int, tuple[str, ...], torch.Tensor], Sequence[torch.Tensor]]


def why_not_llama(model: nn.Module) -> str | None:
    """Why `model` is not a Llama-pattern causal LM this step can run, or None.

    Example:
        >>> why_not_llama(nn.Linear(2, 2))
        'Linear has no model.layers / model.embed_tokens / model.norm / model.rotary_emb / lm_head'
    """
    inner = getattr(model, "model", None)
    parts = ("layers", "embed_tokens", "norm", "rotary_emb")
    if inner is None or any(not hasattr(inner, p) for p in parts) or not hasattr(model, "lm_head"):
        return (f"{type(model).__name__} has no model.layers / model.embed_tokens / model.norm / model.rotary_emb / "
                "lm_head")
    for i, layer in enumerate(inner.layers):
        missing = [p for p in _LAYER if not hasattr(layer, p)]
        missing += [f"self_attn.{p}" for p in _ATTENTION if not hasattr(getattr(layer, "self_attn", None), p)]
        missing += [f"mlp.{p}" for p in _MLP if not hasattr(getattr(layer, "mlp", None), p)]
        if missing:
            return f"decoder layer {i} ({type(layer).__name__}) has no {', '.join(missing)}"
        if getattr(getattr(layer, "self_attn", None), "sliding_window", None):
            return f"decoder layer {i} attends over a sliding window"
    return None


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaStep:
    """A Llama's forward over new tokens with a preallocated KV cache of `max_len` positions (see the module docstring).

    Example:
        >>> step = LlamaStep(llama, max_len=160)          # doctest: +SKIP
        >>> logits = step.forward(prompt_ids, start=0)    # doctest: +SKIP
    """

    def __init__(self, model: nn.Module, max_len: int) -> None:
        why = why_not_llama(model)
        if why is not None:
            raise ConfigError(f"LlamaStep runs Llama-pattern causal LMs: {why}")
        config = model.config
        self.model, self.max_len = model, int(max_len)
        self.layers = list(model.model.layers)
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.scale = float(getattr(self.layers[0].self_attn, "scaling", self.head_dim ** -0.5))
        weight = model.model.embed_tokens.weight
        with torch.no_grad():  # the model's own rotary embedding (its scaling type included), for every position once
            cos, sin = model.model.rotary_emb(torch.zeros(1, self.max_len, self.head_dim, dtype=weight.dtype),
                                              torch.arange(self.max_len)[None])
        self.cos, self.sin = cos[0], sin[0]
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def reset(self, batch: int) -> None:
        """Fresh, zeroed caches for `batch` sequences."""
        dtype = self.model.model.embed_tokens.weight.dtype
        shape = (batch, self.kv_heads, self.max_len, self.head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype) for _ in self.layers]
        self.values = [torch.zeros(shape, dtype=dtype) for _ in self.layers]

    def by_modules(self, layer: int, paths: tuple[str, ...], x: torch.Tensor) -> list[torch.Tensor]:
        """The default `Projector`: each module at `paths` of decoder layer `layer` (of the model for `HEAD`)
        applied to `x`."""
        owner = self.model if layer == HEAD else self.layers[layer]
        return [owner.get_submodule(path)(x) for path in paths]

    def forward(self, ids: torch.Tensor, start: int, project: Projector | None = None) -> torch.Tensor:
        """The last position's logits after the tokens `ids` (batch, t) at positions start .. start + t - 1;
        `project` computes the linear projections (default `by_modules`: the model's own modules)."""
        project = project or self.by_modules
        batch, t = ids.shape
        if start + t > self.max_len:
            raise ConfigError(f"LlamaStep: positions up to {start + t} do not fit its cache of {self.max_len}")
        if t > 1 and start > 0:
            raise ConfigError("LlamaStep: several new tokens after a prefix need a causal mask with an offset")
        x = self.model.model.embed_tokens(ids)
        cos, sin = self.cos[start:start + t][None, None], self.sin[start:start + t][None, None]
        for i, layer in enumerate(self.layers):
            mlp = layer.mlp
            q, k, v = project(i, QKV, layer.input_layernorm(x))
            q = q.view(batch, t, self.heads, self.head_dim).transpose(1, 2)
            k = k.view(batch, t, self.kv_heads, self.head_dim).transpose(1, 2)
            v = v.view(batch, t, self.kv_heads, self.head_dim).transpose(1, 2)
            self.keys[i][:, :, start:start + t] = k * cos + _rotate_half(k) * sin
            self.values[i][:, :, start:start + t] = v
            o = F.scaled_dot_product_attention(q * cos + _rotate_half(q) * sin, self.keys[i][:, :, :start + t],
                                               self.values[i][:, :, :start + t], is_causal=t > 1 and start == 0,
                                               scale=self.scale, enable_gqa=self.heads != self.kv_heads)
            x = x + project(i, ("self_attn.o_proj",), o.transpose(1, 2).reshape(batch, t, -1))[0]
            gate, up = project(i, GATE_UP, layer.post_attention_layernorm(x))
            x = x + project(i, ("mlp.down_proj",), mlp.act_fn(gate) * up)[0]
        return project(HEAD, ("lm_head",), self.model.model.norm(x[:, -1:]))[0][:, -1]
