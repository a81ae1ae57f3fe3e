"""A BERT-style encoder built from nn.Linear with hand-written attention.

Not `nn.TransformerEncoderLayer`: its fused fast path ignores pruning masks. Here every
projection is an `nn.Linear` (q, k, v, out, ffn.fc1, ffn.fc2) and attention is plain
matmul/softmax, so masks, propagation and kernels all see every op.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class BertConfig:
    """Encoder sizes. `BertConfig.base()` is BERT-base; `tiny()` is for tests.

    Example:
        >>> BertConfig.base().ffn
        3072
    """

    hidden: int = 768
    heads: int = 12
    ffn: int = 3072
    layers: int = 1
    batch: int = 32
    seq: int = 128
    dropout: float = 0.0

    def __post_init__(self) -> None:
        for key in ("hidden", "heads", "ffn", "layers", "batch", "seq"):
            if getattr(self, key) < 1:
                raise ValueError(f"BertConfig.{key} must be >= 1, got {getattr(self, key)}")
        if self.hidden % self.heads:
            raise ValueError(f"BertConfig.hidden ({self.hidden}) must be divisible by heads ({self.heads})")

    @classmethod
    def base(cls, layers: int = 1) -> BertConfig:
        """BERT-base: 768 hidden, 12 heads, 3072 FFN; batch 32 x seq 128 for latency."""
        return cls(layers=layers)

    @classmethod
    def tiny(cls, layers: int = 2) -> BertConfig:
        """64 hidden, 4 heads, 256 FFN, batch 2 x seq 16: fast enough for any test."""
        return cls(hidden=64, heads=4, ffn=256, layers=layers, batch=2, seq=16)


class SelfAttention(nn.Module):
    """Multi-head self-attention as explicit q/k/v/out projections and matmuls."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.head_dim = cfg.hidden // cfg.heads
        self.query = nn.Linear(cfg.hidden, cfg.hidden)
        self.key = nn.Linear(cfg.hidden, cfg.hidden)
        self.value = nn.Linear(cfg.hidden, cfg.hidden)
        self.out = nn.Linear(cfg.hidden, cfg.hidden)
        self.dropout = nn.Dropout(cfg.dropout)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        return x.view(b, s, self.heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q = self._split_heads(self.query(x))
        k = self._split_heads(self.key(x))
        v = self._split_heads(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        probs = self.dropout(F.softmax(scores, dim=-1))
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).reshape(b, s, h)
        return self.out(ctx)


class FeedForward(nn.Module):
    """fc1 -> GELU -> fc2."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden, cfg.ffn)
        self.fc2 = nn.Linear(cfg.ffn, cfg.hidden)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.fc2(F.gelu(self.fc1(x))))


class EncoderLayer(nn.Module):
    """Post-norm BERT layer: x + attn(x) -> LayerNorm -> + ffn -> LayerNorm."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.attn = SelfAttention(cfg)
        self.norm1 = nn.LayerNorm(cfg.hidden)
        self.ffn = FeedForward(cfg)
        self.norm2 = nn.LayerNorm(cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.attn(x))
        return self.norm2(x + self.ffn(x))


class BertEncoder(nn.Module):
    """A stack of encoder layers over hidden states (batch, seq, hidden).

    Example:
        >>> cfg = BertConfig.tiny()
        >>> BertEncoder(cfg)(torch.zeros(cfg.batch, cfg.seq, cfg.hidden)).shape
        torch.Size([2, 16, 64])
    """

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.config = cfg
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x

    def example_inputs(self, seed: int = 0) -> tuple[torch.Tensor]:
        """Random hidden states of the configured batch x seq x hidden."""
        g = torch.Generator().manual_seed(seed)
        c = self.config
        return (torch.randn(c.batch, c.seq, c.hidden, generator=g),)


class DigitsTransformer(nn.Module):
    """Digits as a sequence: each of the 8 image rows is a token of 8 pixels.

    Example:
        >>> DigitsTransformer()(torch.zeros(2, 1, 8, 8)).shape
        torch.Size([2, 10])
    """

    def __init__(self, cfg: BertConfig | None = None, num_classes: int = 10, row_pixels: int = 8,
                 rows: int = 8) -> None:
        super().__init__()
        cfg = cfg or BertConfig(hidden=64, heads=4, ffn=128, layers=2, batch=1, seq=rows)
        self.embed = nn.Linear(row_pixels, cfg.hidden)
        self.position = nn.Parameter(torch.zeros(1, rows, cfg.hidden))
        self.encoder = BertEncoder(cfg)
        self.head = nn.Linear(cfg.hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(x.flatten(1, 2)) + self.position
        return self.head(self.encoder(tokens).mean(dim=1))
