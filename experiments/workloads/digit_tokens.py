"""The bundled digits as token sequences, for the transformer example workloads (no downloads).

Each 8x8 image becomes 9 tokens: [CLS] and its 8 rows, each row's pixels thresholded at
half intensity and read as an 8-bit pattern (256 row tokens). A sequence classifier
predicts the digit from them. Honest about what this
is: a real, offline, minutes-to-train classification task for a transformer on 2 cores,
not a language task; its accuracy moves with pruning and quantization the way a real
task's does, which is what exploration needs.

Latency is measured on other shapes than training: `padded(batch, seq_len)` pads the
sequences to `seq_len` (e.g. 128, BERT's usual) with an attention mask.

Example:
    >>> data = load_token_digits()
    >>> data.train_ids.shape, data.vocab_size
    (torch.Size([1347, 9]), 258)
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from fit import fit_cached
from torch import nn

from sparta_explore.cache import atomic_write, content_key, resolve_cache_dir
from sparta_explore.zoo import load_digits_split

PAD, CLS, OFFSET = 0, 1, 2  # ids 2..257 are the 256 row patterns
VOCAB = OFFSET + 256


@dataclass(frozen=True)
class TokenDigits:
    """Token ids, attention masks and labels of the digits' train and test splits."""

    train_ids: torch.Tensor
    train_y: torch.Tensor
    test_ids: torch.Tensor
    test_y: torch.Tensor
    vocab_size: int = VOCAB

    def mask(self, ids: torch.Tensor) -> torch.Tensor:
        return (ids != PAD).long()

    def padded(self, batch: int, seq_len: int) -> dict[str, torch.Tensor]:
        """`batch` test sequences padded (or cut) to `seq_len` tokens, with their attention mask."""
        reps = -(-batch // len(self.test_ids))
        ids = self.test_ids.repeat(reps, 1)[:batch]
        out = torch.full((batch, seq_len), PAD, dtype=torch.long)
        n = min(seq_len, ids.shape[1])
        out[:, :n] = ids[:, :n]
        return {"input_ids": out, "attention_mask": self.mask(out)}


def _tokens(images: torch.Tensor) -> torch.Tensor:
    bits = (images.reshape(len(images), 8, 8) >= 0.5).long()
    rows = (bits * (2 ** torch.arange(8))).sum(dim=-1) + OFFSET
    return torch.cat([torch.full((len(images), 1), CLS, dtype=torch.long), rows], dim=1)


def load_token_digits() -> TokenDigits:
    """The digits split (scikit-learn's bundled 1797 images) as token sequences."""
    data = load_digits_split()
    return TokenDigits(_tokens(data.train_x), data.train_y, _tokens(data.test_x), data.test_y)


def logits_of(output: object) -> torch.Tensor:
    """Logits of a Hugging Face output (or a plain tensor)."""
    return output if isinstance(output, torch.Tensor) else output.logits


def accuracy(model: nn.Module, ids: torch.Tensor, y: torch.Tensor, batch: int = 256) -> float:
    """Top-1 accuracy of a sequence classifier on (ids, y)."""
    correct = 0
    with torch.no_grad():
        for i in range(0, len(ids), batch):
            x = ids[i:i + batch]
            pred = logits_of(model(input_ids=x, attention_mask=(x != PAD).long())).argmax(-1)
            correct += int((pred == y[i:i + batch]).sum())
    return correct / max(1, len(ids))


def batches(ids: torch.Tensor, y: torch.Tensor, size: int = 32, seed: int = 0
            ) -> Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]]:
    """One epoch of shuffled (ids, labels) batches per call (the same order each epoch)."""
    def epoch() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = torch.randperm(len(ids), generator=torch.Generator().manual_seed(seed))
        for i in range(0, len(order), size):
            idx = order[i:i + size]
            yield ids[idx], y[idx]
    return epoch


def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy of a sequence classifier on one batch."""
    ids, y = batch
    return F.cross_entropy(logits_of(model(input_ids=ids, attention_mask=(ids != PAD).long())), y)


def trained(name: str, build: Callable[[], nn.Module], data: TokenDigits, *, epochs: int, lr: float,
            cache_dir: str | os.PathLike | None = None, seed: int = 0) -> nn.Module:
    """`build()` trained on the token digits (AdamW, linear warm-up and decay), cached by architecture and recipe."""
    torch.manual_seed(seed)
    model = build()
    key = content_key({"name": name, "arch": repr(model), "epochs": epochs, "lr": lr, "seed": seed,
                       "torch": torch.__version__})
    path = resolve_cache_dir(cache_dir, "workloads") / f"{name}-{key}.pt"
    fresh = not path.exists()
    model = fit_cached(model, path, batches(data.train_ids, data.train_y, seed=seed), loss, epochs=epochs, lr=lr,
                       weight_decay=0.01, pct_start=0.1)
    if not fresh:
        return model
    record = {"name": name, "test_accuracy": accuracy(model, data.test_ids, data.test_y)}
    atomic_write(path.with_suffix(".json"), lambda f: f.write(json.dumps(record).encode()))
    return model
