"""Dense and channel-shrunk ops on PyTorch's own kernels, and the sum of several sub-operators.

These are the candidates a plan always has (so it is never slower than dense) and the
glue that runs a decomposed op: `SummedParts` adds the outputs of sub-operators that each
cover part of the weight, then applies the bias and the activation once.

Example:
    >>> op = DenseLinear(torch.randn(8, 4), torch.zeros(8), activation="relu")
    >>> bool((op(torch.randn(3, 4)) >= 0).all())
    True
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sparta_explore.kernels.compiled_op import (
    CompiledOp,
    check_act_bits,
    float_inputs_only,
    quantized_images,
    quantized_input,
)
from sparta_explore.kernels.sparse_linear import _ACT, check_linear_args


class DenseLinear(CompiledOp):
    """act(x W^T + b) with F.linear (MKL); W already masked / fake-quantized by the caller.

    With `act_bits` <= 8 the input's rows are put on their symmetric grid first, as the
    int8 kernel does (what a TeSA asking for 8-bit inputs means).

    Example:
        >>> DenseLinear(torch.eye(2), None)(torch.ones(1, 2)).tolist()
        [[1.0, 1.0]]
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, activation: str = "none", *,
                 act_bits: int = 32) -> None:
        super().__init__()
        check_linear_args(weight, torch.ones_like(weight, dtype=torch.bool), activation)
        self.out_features, self.in_features = weight.shape
        self.activation = activation
        self.act_bits = check_act_bits(act_bits)
        self.register_buffer("weight", weight.detach().float().contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())

    @property
    def density(self) -> float:
        """Fraction of the weight that is nonzero (what effective FLOPs count)."""
        return int(torch.count_nonzero(self.weight)) / max(1, self.weight.numel())

    def _fast(self, x: torch.Tensor) -> torch.Tensor:
        return self.reference(x)

    def as_linear(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(weight, bias) of the dense linear this op computes before its activation
        (a ValueError for an op that rounds its inputs)."""
        float_inputs_only(self)
        return self.weight, self.bias

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """PyTorch's dense op, in `x`'s dtype (input rows on their grid if `act_bits` <= 8): its own reference."""
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return _ACT[self.activation](F.linear(quantized_input(x, self.act_bits), self.weight.to(x.dtype), bias))


class ShrunkConv2d(CompiledOp):
    """A Conv2d over the kept output channels (and, for groups=1, kept input channels) only.

    Pruned output channels hold the bias (or 0), broadcast without compute. Inputs are
    batched (N, C, H, W). With `act_bits` <= 8 each input image is put on its symmetric grid
    first (all its channels, before any is dropped), as the int8 conv kernel does.

    Example:
        >>> conv = nn.Conv2d(4, 6, 3, padding=1); kept = torch.ones(6, 4, 3, 3, dtype=torch.bool); kept[2] = False
        >>> ShrunkConv2d(conv, conv.weight * kept, kept).weight_small.shape
        torch.Size([5, 4, 3, 3])
    """

    def __init__(self, conv: nn.Conv2d, weight: torch.Tensor, kept: torch.Tensor, *, act_bits: int = 32) -> None:
        super().__init__()
        self.feature_dim, self.input_ndim = 1, (4,)
        self.act_bits = check_act_bits(act_bits)
        if kept.shape != conv.weight.shape:
            raise ValueError(f"kept mask {tuple(kept.shape)} does not match conv weight {tuple(conv.weight.shape)}")
        if conv.padding_mode != "zeros":
            raise ValueError(f"ShrunkConv2d supports zero padding only, got {conv.padding_mode!r}")
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.kernel_size, self.stride, self.padding = conv.kernel_size, conv.stride, conv.padding
        self.dilation, self.groups = conv.dilation, conv.groups
        if conv.groups != 1 and not bool(kept.all()):
            raise ValueError(f"a grouped conv (groups={conv.groups}) cannot drop channels without regrouping")
        rows = kept.reshape(kept.shape[0], -1).any(dim=1).nonzero().flatten()
        cols = kept.any(dim=(0, 2, 3)).nonzero().flatten() if conv.groups == 1 else torch.arange(kept.shape[1])
        self.register_buffer("rows", rows)
        self.register_buffer("cols", cols)
        w = weight.detach().float()
        # a conv stored channels-last (the memory_format pass) keeps its weights so: oneDNN then never reorders
        nhwc = conv.weight.is_contiguous(memory_format=torch.channels_last) and not conv.weight.is_contiguous()
        fmt = torch.channels_last if nhwc else torch.contiguous_format
        self.register_buffer("weight_small", w[rows][:, cols].contiguous(memory_format=fmt))
        bias = None if conv.bias is None else conv.bias.detach().float()
        self.register_buffer("bias_small", None if bias is None else bias[rows].contiguous())
        self.register_buffer("filler", torch.zeros(self.out_channels) if bias is None else bias.clone())
        self.all_rows = len(rows) == self.out_channels
        self.all_cols = conv.groups != 1 or len(cols) == conv.in_channels
        self.empty = len(rows) == 0 or len(cols) == 0  # every output is its bias: no compute at all

    @property
    def density(self) -> float:
        """Fraction of the full weight that is nonzero (what effective FLOPs count)."""
        return int(torch.count_nonzero(self.weight_small)) / (self.out_channels * self.in_channels // self.groups
                                                              * self.kernel_size[0] * self.kernel_size[1])

    def _out_size(self, x: torch.Tensor) -> tuple[int, int]:
        return tuple((x.shape[2 + i] + 2 * self.padding[i] - self.dilation[i] * (self.kernel_size[i] - 1) - 1)
                     // self.stride[i] + 1 for i in range(2))

    @property
    def in_features(self) -> int:
        return self.in_channels

    def extra_repr(self) -> str:
        return f"in={self.in_channels}->{len(self.cols)}, out={self.out_channels}->{len(self.rows)}"

    def _fast(self, x: torch.Tensor) -> torch.Tensor:
        if self.empty:
            return self.filler.reshape(1, -1, 1, 1).expand(x.shape[0], -1, *self._out_size(x)).clone()
        x = quantized_images(x, self.act_bits)
        xs = x if self.all_cols else x.index_select(1, self.cols)
        ys = F.conv2d(xs, self.weight_small, self.bias_small, self.stride, self.padding, self.dilation, self.groups)
        if self.all_rows:
            return ys
        # the output keeps the conv's memory format (channels-last stays channels-last for the next op)
        nhwc = ys.is_contiguous(memory_format=torch.channels_last) and not ys.is_contiguous()
        y = torch.empty((ys.shape[0], self.out_channels, ys.shape[2], ys.shape[3]), dtype=ys.dtype,
                        memory_format=torch.channels_last if nhwc else torch.contiguous_format)
        y.copy_(self.filler.reshape(1, -1, 1, 1).expand_as(y))
        return y.index_copy_(1, self.rows, ys)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The full masked convolution (input images on their grid if `act_bits` <= 8), in `x`'s dtype."""
        x = quantized_images(x, self.act_bits)
        w = torch.zeros(self.out_channels, self.in_channels // self.groups, *self.kernel_size, dtype=x.dtype)
        w[self.rows.reshape(-1, 1), self.cols.reshape(1, -1)] = self.weight_small.to(x.dtype)
        bias = self.filler.to(x.dtype) if self.bias_small is not None else None
        return F.conv2d(x, w, bias, self.stride, self.padding, self.dilation, self.groups)


class DenseConv2d(ShrunkConv2d):
    """The masked (fake-quantized) convolution with nothing cut: the dense candidate for convs.

    Example:
        >>> conv = nn.Conv2d(2, 3, 1); op = DenseConv2d(conv, conv.weight, torch.ones(3, 2, 1, 1, dtype=torch.bool))
        >>> op.all_rows and op.all_cols
        True
    """

    def __init__(self, conv: nn.Conv2d, weight: torch.Tensor, kept: torch.Tensor, *, act_bits: int = 32) -> None:
        super().__init__(conv, weight, torch.ones_like(kept, dtype=torch.bool), act_bits=act_bits)


class SummedParts(CompiledOp):
    """act(sum of sub-operator outputs + b): one op decomposed into parts over disjoint weight elements.

    Each part is built without bias and activation; adding in place keeps one output buffer.

    Example:
        >>> a, b = DenseLinear(torch.eye(2), None), DenseLinear(torch.eye(2), None)
        >>> SummedParts([a, b], torch.ones(2))(torch.ones(1, 2)).tolist()
        [[3.0, 3.0]]
    """

    def __init__(self, parts: list[nn.Module], bias: torch.Tensor | None, activation: str = "none") -> None:
        super().__init__()
        if not parts:
            raise ValueError("SummedParts needs at least one part")
        self.parts = nn.ModuleList(parts)
        self.exact_grad = all(getattr(p, "exact_grad", True) for p in parts)
        self.activation = activation
        self.out_features, self.in_features = parts[0].out_features, parts[0].in_features
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())

    @property
    def density(self) -> float:
        """Nonzero fraction of the whole weight: the parts hold disjoint elements, so densities add up."""
        return sum(float(p.density) for p in self.parts)

    def _combine(self, outputs) -> torch.Tensor:
        y = next(outputs)
        for more in outputs:
            y += more
        if self.bias is not None:
            y += self.bias.to(y.dtype)
        return _ACT[self.activation](y)

    def _fast(self, x: torch.Tensor) -> torch.Tensor:
        return self._combine(p(x) for p in self.parts)

    def as_linear(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(weight, bias): the parts' weights summed (they cover disjoint elements) and this op's bias."""
        return sum(p.as_linear()[0] for p in self.parts), self.bias

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The parts' references summed, then bias and activation."""
        return self._combine(p.reference(x) for p in self.parts)
