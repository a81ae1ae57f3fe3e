"""Sparse convolution as implicit GEMM over the pattern-specialized sparse linear kernels.

A Conv2d with groups 1 is a linear over im2col rows: each output position's receptive
field (C_in x kh x kw values, in the order of the weight's own flattening) times the weight
viewed as (C_out, C_in * kh * kw). So every sparsity pattern a linear kernel runs (blocks,
1xK, unstructured) runs on convolutions too, dead blocks never emitted. A 1x1 conv with
stride 1 and no padding needs no im2col: its rows are the input's pixels, channels last. A
kxk conv unfolds its input (`F.unfold`, kh x kw times the input's memory), which is why the
compiler keeps this candidate only where it measures faster than dense and shrink. Non-zero
padding modes pad first. The output is channels-last memory in NCHW shape (a permuted
view), as PyTorch's own channels-last convolutions return.

Example:
    >>> conv = nn.Conv2d(8, 16, 3, padding=1)
    >>> kept = torch.rand(16, 8 * 9) < 0.2
    >>> op = SparseConv2d(conv, SparseLinear(conv.weight.reshape(16, -1) * kept, conv.bias, kept))  # doctest: +SKIP
    >>> op(torch.randn(2, 8, 5, 5)).shape                                                          # doctest: +SKIP
    torch.Size([2, 16, 5, 5])
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from sparta_explore.kernels.compiled_op import CompiledOp


class SparseConv2d(CompiledOp):
    """`conv`'s geometry around `linear`, a compiled linear over im2col rows (C_out x C_in*kh*kw).

    The linear holds the (masked, possibly fake-quantized) weight and the bias; `reference`
    runs the linear's reference on the same rows, so both paths compute the same function.
    """

    def __init__(self, conv: nn.Conv2d, linear: nn.Module) -> None:
        super().__init__()
        if conv.groups != 1:
            raise ValueError(f"SparseConv2d needs groups=1 (implicit GEMM), got groups={conv.groups}")
        if isinstance(conv.padding, str):
            raise ValueError(f"SparseConv2d needs numeric padding, got {conv.padding!r}")
        k = conv.in_channels * conv.kernel_size[0] * conv.kernel_size[1]
        if (linear.out_features, linear.in_features) != (conv.out_channels, k):
            raise ValueError(f"linear {linear.in_features}->{linear.out_features} does not match conv im2col "
                             f"{k}->{conv.out_channels}")
        self.feature_dim, self.input_ndim = 1, (4,)
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.out_features = conv.out_channels
        self.kernel_size, self.stride, self.dilation = conv.kernel_size, conv.stride, conv.dilation
        self.padding, self.padding_mode = tuple(conv.padding), conv.padding_mode
        self.linear = linear
        self.exact_grad = getattr(linear, "exact_grad", True)
        self.pointwise = (self.kernel_size == (1, 1) and self.stride == (1, 1) and self.padding == (0, 0))

    @property
    def in_features(self) -> int:
        return self.in_channels

    @property
    def density(self) -> float:
        """Nonzero fraction of the weight (the inner linear's)."""
        return float(getattr(self.linear, "density", 1.0))

    def extra_repr(self) -> str:
        return (f"{self.in_channels}->{self.out_channels}, kernel={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, {'pointwise' if self.pointwise else 'im2col'}")

    def _implicit_gemm(self, x: torch.Tensor, run: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        n = x.shape[0]
        padding = self.padding
        if self.padding_mode != "zeros" and any(padding):
            ph, pw = padding
            x = F.pad(x, (pw, pw, ph, ph), mode=self.padding_mode)
            padding = (0, 0)
        if self.pointwise:
            h, w = x.shape[2], x.shape[3]
            rows = x.permute(0, 2, 3, 1).reshape(-1, self.in_channels)
        else:
            h, w = (tuple((x.shape[2 + i] + 2 * padding[i] - self.dilation[i] * (self.kernel_size[i] - 1) - 1)
                          // self.stride[i] + 1 for i in range(2)))
            cols = F.unfold(x, self.kernel_size, self.dilation, padding, self.stride)  # (N, C*kh*kw, L)
            rows = cols.transpose(1, 2).reshape(n * h * w, -1)
        return run(rows).reshape(n, h, w, self.out_channels).permute(0, 3, 1, 2)

    def _fast(self, x: torch.Tensor) -> torch.Tensor:
        return self._implicit_gemm(x, self.linear)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The same convolution through the inner linear's PyTorch reference, in `x`'s dtype."""
        return self._implicit_gemm(x, self.linear.reference)
