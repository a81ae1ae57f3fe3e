"""Sparse convolution as implicit GEMM over the pattern-specialized sparse linear kernels.

A Conv2d with groups 1 is a linear over im2col rows: each output position's receptive
field (C_in x kh x kw values, in the order of the weight's own flattening) times the weight
viewed as (C_out, C_in * kh * kw). So every sparsity pattern a linear kernel runs (blocks,
1xK, unstructured) runs on convolutions too, dead blocks never emitted.

Two ways to feed the kernel:

* `ImplicitConvLinear` (fp32): the kernel gathers its K-major tiles straight from the
  N x C x H x W input and writes the N x C_out x OH x OW output (`conv_geometry.py`); no
  im2col matrix exists. Its sizes are baked in: `SparseConv2d` builds one per input size
  it meets (the pattern's build is cached on disk, so a size costs one compile, once).
* any other linear (`Int8SparseLinear`, a row-major `SparseLinear`): rows from `F.unfold`
  (kh x kw times the input's memory, then a transpose), or the pixels themselves for 1x1
  convs; its output is channels-last memory in NCHW shape (a permuted view).

Non-zero padding modes pad first, for both.

Example:
    >>> conv = nn.Conv2d(8, 16, 3, padding=1)
    >>> kept = torch.rand(16, 8 * 9) < 0.2
    >>> w2d = conv.weight.detach().reshape(16, -1) * kept
    >>> op = SparseConv2d(conv, ImplicitConvLinear(w2d, conv.bias, kept, ConvGeometry.of(conv, (5, 5))))
    >>> op(torch.randn(2, 8, 5, 5)).shape
    torch.Size([2, 16, 5, 5])
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from sparta_explore.activations import ACTIVATIONS
from sparta_explore.fake_quant import quantized_conv2d, row_scales
from sparta_explore.kernels import output_pool
from sparta_explore.kernels.compiled_op import CompiledOp, KernelInputError, describe
from sparta_explore.kernels.conv_geometry import ConvGeometry
from sparta_explore.kernels.int8_linear import Int8SparseLinear
from sparta_explore.kernels.kernel_io import KernelIO
from sparta_explore.kernels.sparse_linear import KernelLinear, SparseLinear


class ImplicitConvLinear(SparseLinear):
    """A `SparseLinear` whose kernel is the convolution `geometry` (NCHW in, NCHW out): implicit GEMM.

    `weight`, `kept` are the conv's weight and mask viewed as (C_out, C_in * kh * kw); the
    other arguments are `SparseLinear`'s (`tile="auto"` times row-major builds of the
    pattern and keeps the winner). Called through `SparseConv2d`, which checks its input.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kept: torch.Tensor, geometry: ConvGeometry,
                 **kwargs) -> None:
        _check_conv_matrix(weight, geometry)
        self.geometry = geometry
        super().__init__(weight, bias, kept, **kwargs)

    def _build(self, kept: np.ndarray, block_rows: int, cache_dir) -> None:
        if self.geometry.windowed and self.tile.layout != "rows":  # windows are read one k at a time
            self.tile = dataclasses.replace(self.tile, layout="rows")
        super()._build(kept, block_rows, cache_dir)

    def _kernel_io(self) -> KernelIO:
        return self.geometry.kernel_io(self._tile)

    @property
    def in_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of the inputs the kernel was built for."""
        return (self.geometry.channels, *self.geometry.in_hw)

    def _arguments(self, cache_dir: str | os.PathLike | None) -> tuple[tuple, dict]:
        args, kwargs = super()._arguments(cache_dir)
        return (*args, self.geometry), kwargs

    def for_input(self, in_hw: tuple[int, int]) -> ImplicitConvLinear:
        """The same pattern, tiling and fusion built for inputs of `in_hw` pixels."""
        return _for_input(self, in_hw)

    def _check_input(self, g: torch.Generator) -> torch.Tensor:
        """Random images covering at least two tiles and a ragged one."""
        images = max(1, math.ceil((2 * self._tile + 3) / math.prod(self.geometry.out_hw)))
        return torch.randn(images, *self.in_shape, generator=g)

    def _fast(self, x: torch.Tensor) -> torch.Tensor:
        _check_conv_input(self, x)
        if self._fn is None:
            return self.reference(x)
        x = x.contiguous()
        oh, ow = self.geometry.out_hw
        y = output_pool.take((x.shape[0], self.out_features, oh, ow))
        self._run(x, y, x.shape[0] * self.geometry.rows_per_image(self._tile))
        return y

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """`F.conv2d` with the masked weight (zero padding as built), then the activation, in `x`'s dtype."""
        g = self.geometry
        w = self.weight.reshape(self.out_features, g.channels, *g.kernel).to(x.dtype)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return ACTIVATIONS[self.activation].torch_fn(F.conv2d(x, w, bias, g.stride, g.padding, g.dilation))


class Int8ConvLinear(Int8SparseLinear):
    """An `Int8SparseLinear` run as the stride-1 convolution `geometry` (NCHW in, NCHW out): int8 implicit GEMM.

    Each image is quantized on one symmetric `act_bits` grid (max|x| over the image), each
    filter on its own `weight_bits` grid (`fake_quant.quantized_conv2d` is the reference).
    The kernel's k order is (i, j, c) with channels padded to whole words, so a packed word
    holds neighbouring channels of one input position and every (i, j) tap reads the same
    quantized window at its own shift. `weight`, `kept` are (C_out, C_in * kh * kw) in the
    weight's own order; the other arguments are `Int8SparseLinear`'s.
    """

    one_word_io = True

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kept: torch.Tensor, geometry: ConvGeometry,
                 **kwargs) -> None:
        _check_conv_matrix(weight, geometry)
        if geometry.stride != (1, 1):
            raise ValueError(f"int8 conv kernels run stride-1 convolutions, got stride {geometry.stride}")
        self.geometry = geometry
        super().__init__(weight, bias, kept, **kwargs)

    def _kernel_matrix(self, weight: np.ndarray, kept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.geometry.channels_inner(weight), self.geometry.channels_inner(kept)

    def _kernel_io(self, tile_rows: int, variant: str) -> KernelIO:
        elem, word, offset = ("int16_t", 2, 0) if variant == "int16" else ("uint8_t", 4, 128)
        return self.geometry.quantized_io(tile_rows, elem, word, offset)

    in_shape = ImplicitConvLinear.in_shape
    _check_input = ImplicitConvLinear._check_input

    def _arguments(self, cache_dir: str | os.PathLike | None) -> tuple[tuple, dict]:
        args, kwargs = super()._arguments(cache_dir)
        return (*args, self.geometry), kwargs

    def for_input(self, in_hw: tuple[int, int]) -> Int8ConvLinear:
        """The same pattern, grids and fusion built for inputs of `in_hw` pixels."""
        return _for_input(self, in_hw)

    def _fast(self, x: torch.Tensor) -> torch.Tensor:
        _check_conv_input(self, x)
        if self._fn is None:
            return self.reference(x)
        x = x.contiguous()
        n = x.shape[0]
        oh, ow = self.geometry.out_hw
        y = output_pool.take((n, self.out_features, oh, ow))
        scales = row_scales(x.reshape(n, -1), self.act_bits).reshape(n).contiguous()
        self._run(x, y, n * self.geometry.rows_per_image(self._tile, windows=True), scales)
        return y

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """`fake_quant.quantized_conv2d` with the masked weight, then the activation; in `x`'s dtype."""
        g = self.geometry
        w = self.weight.reshape(self.out_features, g.channels, *g.kernel)
        y = quantized_conv2d(x.float(), w, self.bias, g.stride, g.padding, g.dilation, weight_bits=self.weight_bits,
                             act_bits=self.act_bits)
        return ACTIVATIONS[self.activation].torch_fn(y).to(x.dtype)


def _check_conv_matrix(weight: torch.Tensor, geometry: ConvGeometry) -> None:
    if weight.dim() != 2 or weight.shape[1] != geometry.k:
        raise ValueError(f"conv weight viewed as {tuple(weight.shape)} does not match im2col columns "
                         f"{geometry.k} (C_in x kh x kw)")


def _check_conv_input(op: KernelLinear, x: torch.Tensor) -> None:
    if tuple(x.shape[1:]) != op.in_shape:
        raise KernelInputError(f"{op.op_name()}: built for inputs (N, {', '.join(map(str, op.in_shape))}), "
                               f"got {describe(x)}")


def _resized(g: ConvGeometry, in_hw: tuple[int, int]) -> ConvGeometry:
    return ConvGeometry(g.channels, (int(in_hw[0]), int(in_hw[1])), g.kernel, g.stride, g.padding, g.dilation)


def _for_input(op: ImplicitConvLinear | Int8ConvLinear, in_hw: tuple[int, int]) -> KernelLinear:
    (*args, geometry), kwargs = op._arguments(op.cache_dir)
    return type(op)(*args, _resized(geometry, in_hw), **kwargs)


CONV_KERNELS = (ImplicitConvLinear, Int8ConvLinear)  # linears that run the convolution themselves


class SparseConv2d(CompiledOp):
    """`conv`'s geometry around `linear`, a compiled linear over im2col rows (C_out x C_in*kh*kw).

    The linear holds the (masked, possibly fake-quantized) weight and the bias; `reference`
    runs the linear's reference on the same input, so both paths compute the same function.
    An `ImplicitConvLinear` runs the convolution itself (other input sizes get their own
    build, kept in `sizes`); any other linear runs on `F.unfold` rows.
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
        self.implicit = isinstance(linear, CONV_KERNELS)
        if self.implicit:
            h, w = linear.geometry.in_hw
            if self.padding_mode != "zeros":
                h, w = h - 2 * self.padding[0], w - 2 * self.padding[1]
            want = ConvGeometry.of(conv, (h, w))
            if linear.geometry != want:
                raise ValueError(f"implicit conv kernel geometry {linear.geometry} does not match the conv ({want})")
        self.sizes = nn.ModuleDict()  # implicit kernels for input sizes other than the linear's, by "HxW"

    @property
    def in_features(self) -> int:
        return self.in_channels

    @property
    def density(self) -> float:
        """Nonzero fraction of the weight (the inner linear's)."""
        return float(getattr(self.linear, "density", 1.0))

    def extra_repr(self) -> str:
        path = "implicit gemm" if self.implicit else ("pointwise" if self.pointwise else "im2col")
        return (f"{self.in_channels}->{self.out_channels}, kernel={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, {path}")

    def _padded(self, x: torch.Tensor) -> torch.Tensor:
        if self.padding_mode != "zeros" and any(self.padding):
            ph, pw = self.padding
            return F.pad(x, (pw, pw, ph, ph), mode=self.padding_mode)
        return x

    def _unfolded(self, x: torch.Tensor, run: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        n = x.shape[0]
        padding = self.padding if self.padding_mode == "zeros" else (0, 0)
        if self.pointwise:
            h, w = x.shape[2], x.shape[3]
            rows = x.permute(0, 2, 3, 1).reshape(-1, self.in_channels)
        else:
            h, w = (tuple((x.shape[2 + i] + 2 * padding[i] - self.dilation[i] * (self.kernel_size[i] - 1) - 1)
                          // self.stride[i] + 1 for i in range(2)))
            cols = F.unfold(x, self.kernel_size, self.dilation, padding, self.stride)  # (N, C*kh*kw, L)
            rows = cols.transpose(1, 2).reshape(n * h * w, -1)
        return run(rows).reshape(n, h, w, self.out_channels).permute(0, 3, 1, 2)

    def _kernel_for(self, x: torch.Tensor) -> ImplicitConvLinear | Int8ConvLinear:
        hw = (x.shape[2], x.shape[3])
        if hw == self.linear.geometry.in_hw:
            return self.linear
        key = f"{hw[0]}x{hw[1]}"
        if key not in self.sizes:
            with torch.inference_mode(False):  # normal tensors: the kernel may later run its reference under grad
                self.sizes[key] = self.linear.for_input(hw)
        return self.sizes[key]

    def _fast(self, x: torch.Tensor) -> torch.Tensor:
        x = self._padded(x)
        if self.implicit:
            return self._kernel_for(x)._fast(x)
        return self._unfolded(x, self.linear)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The same convolution through the inner linear's PyTorch reference, in `x`'s dtype."""
        x = self._padded(x)
        if self.implicit:
            return self.linear.reference(x)
        return self._unfolded(x, self.linear.reference)
