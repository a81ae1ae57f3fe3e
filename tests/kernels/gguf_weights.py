"""Weights as a GGUF's quantized blocks de-quantize, for the packed-layout tests."""

import torch


def gguf_like(n: int, k: int, group: int, symmetric: bool, seed: int = 0) -> torch.Tensor:
    """A weight as a GGUF's blocks de-quantize: float16 scales, codes 0..15 plus a float16 minimum (Q4_1), or
    -127..127 times the scale (Q8_0)."""
    gen = torch.Generator().manual_seed(seed)
    groups = -(-k // group)  # the last may be shorter

    def per_column(v: torch.Tensor) -> torch.Tensor:
        return v.half().float().repeat_interleave(group, 1)[:, :k]

    d = per_column(torch.rand(n, groups, generator=gen) * 0.02 + 1e-3)
    if symmetric:
        return d * torch.randint(-127, 128, (n, k), generator=gen).float()
    q = torch.randint(0, 16, (n, k), generator=gen).float()
    q[:, ::group] = 0  # Q4_1's minimum is a value of its block
    m = per_column(-torch.rand(n, groups, generator=gen) * 0.1)
    return d * q + m
