"""DoReFaQuantizer with a gradient quantizer that survives all-zero gradients.

NNI 3.0's DoReFa gradient hook scales each sample's output gradient by its maximum
|g|, with no epsilon: one sample whose gradient is exactly zero (every unit behind a
dead ReLU, common in trained models) gives 0/0 and turns every weight into NaN at the
next step. This subclass registers the same DoReFa gradient quantization (Zhou et al.
2016, eq. 12) with the maximum clamped away from zero, so a zero gradient stays zero.
"""

from __future__ import annotations

from typing import Any

import torch
from nni.compression.quantization import DoReFaQuantizer
from torch import nn

_TINY = torch.finfo(torch.float32).tiny


def dorefa_quantize_gradient(grad: torch.Tensor, bits: int) -> torch.Tensor:
    """Quantize `grad` to `bits` levels per sample: 2 m (q(g / 2m + 1/2 + noise) - 1/2), m = max|g|.

    Example:
        >>> dorefa_quantize_gradient(torch.zeros(2, 3), 8)
        tensor([[0., 0., 0.],
                [0., 0., 0.]])
    """
    levels = 2 ** bits - 1
    dims = list(range(1, grad.dim()))
    peak = grad.abs().amax(dim=dims, keepdim=True).clamp_min(_TINY) if dims else grad.abs().clamp_min(_TINY)
    noise = (torch.rand_like(peak) - 0.5) / levels
    unit = (grad / (2 * peak) + 0.5 + noise).clamp(0.0, 1.0)
    out = 2 * peak * (torch.round(unit * levels) / levels - 0.5)
    return torch.where(grad.abs().amax(dim=dims, keepdim=True) > 0, out, torch.zeros_like(out)) if dims else out


class SafeDoReFaQuantizer(DoReFaQuantizer):
    """NNI's DoReFaQuantizer whose gradient hook never divides by zero."""

    def _quant_dequant_gradient_hook(self, target_space: Any) -> None:
        bits = int(target_space.quant_bits)

        def hook(module: nn.Module, grad_output: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
            return tuple(dorefa_quantize_gradient(g, bits) if g is not None else g for g in grad_output)

        target_space._wrapper.module.register_full_backward_pre_hook(hook)
