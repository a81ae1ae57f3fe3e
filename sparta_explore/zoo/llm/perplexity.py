"""Perplexity of a causal language model on fixed token windows: the LLM workloads' metric (lower is better).

Each window is scored on its own: the model reads the whole window, and token t+1 is
predicted from the logits at position t, so a window of L tokens predicts L - 1 of them (its
first is never predicted). Perplexity is exp of the mean negative log-likelihood over every
predicted token of every window; per-token losses are summed in float64.

Example:
    >>> model = nn.Sequential(nn.Embedding(8, 8), nn.Linear(8, 8))
    >>> ppl = perplexity(model, torch.randint(0, 8, (3, 16)))
    >>> ppl > 1.0
    True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sparta_explore.errors import ConfigError


def logits_of(out: Any) -> torch.Tensor:
    """The logits in what a causal LM's forward returned: a `CausalLMOutput`, a dict, a tuple or a tensor.

    Example:
        >>> logits_of({"logits": torch.zeros(1, 2, 3)}).shape
        torch.Size([1, 2, 3])
    """
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if logits is None and isinstance(out, Mapping):
        logits = out.get("logits")
    if logits is None and isinstance(out, (tuple, list)) and out:
        logits = out[0]
    if not isinstance(logits, torch.Tensor):
        raise ConfigError(f"a causal LM's forward returned {type(out).__name__}, with no logits tensor in it")
    return logits


def window_nll(model: nn.Module, windows: torch.Tensor, *, batch_size: int = 4) -> tuple[float, int]:
    """(sum of the token negative log-likelihoods, number of predicted tokens) of `model` on `windows`.

    Example:
        >>> total, n = window_nll(nn.Sequential(nn.Embedding(4, 4)), torch.zeros(2, 5, dtype=torch.long))
        >>> n
        8
    """
    if not isinstance(windows, torch.Tensor) or windows.dim() != 2 or windows.dtype != torch.long:
        raise ConfigError(f"windows must be a (count, seq_len) LongTensor, got "
                          f"{getattr(windows, 'dtype', type(windows).__name__)} of shape "
                          f"{tuple(getattr(windows, 'shape', ()))}")
    if windows.shape[1] < 2 or len(windows) == 0:
        raise ConfigError(f"windows of shape {tuple(windows.shape)} predict no token (need >= 1 window of >= 2)")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
    total = torch.zeros((), dtype=torch.float64)
    with torch.no_grad():
        for i in range(0, len(windows), batch_size):
            ids = windows[i:i + batch_size]
            logits = logits_of(model(ids))
            if logits.shape[:2] != ids.shape:
                raise ConfigError(f"the model's logits have shape {tuple(logits.shape)}; expected "
                                  f"{tuple(ids.shape)} + (vocab,) for input ids of shape {tuple(ids.shape)}")
            nll = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten(), reduction="none")
            total += nll.double().sum()
    return float(total), windows.shape[0] * (windows.shape[1] - 1)


def perplexity(model: nn.Module, windows: torch.Tensor, *, batch_size: int = 4) -> float:
    """exp(mean token negative log-likelihood) of `model` on `windows`, a (count, seq_len) LongTensor of ids.

    `model(ids)` is called on `batch_size` windows at a time, without gradients; it may return a
    `CausalLMOutput` (Hugging Face), a dict or tuple holding the logits, or the logits tensor.

    Example:
        >>> perplexity(model, text_windows(tokenizer, "evaluation", count=16))  # doctest: +SKIP
        14.80...
    """
    total, count = window_nll(model, windows, batch_size=batch_size)
    return math.exp(total / count)
