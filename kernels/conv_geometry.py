"""The geometry of one Conv2d on one input size, and the C that packs its im2col rows inside a kernel.

A convolution with groups 1 is a linear over im2col rows: row m is an output pixel
(image, oh, ow), column k = (c * kh + i) * kw + j follows the weight's own flattening. The
fp32 sparse kernels pack K-major tiles of their input anyway (`pack_tile`): given this
geometry, `pack_tile` gathers those tiles straight from the N x C x H x W input (implicit
GEMM: no M x K matrix is ever written, where `F.unfold` writes kh x kw copies of the input
and a transpose), and `unpack_tile` writes the N x C_out x OH x OW output directly: a
tile's rows inside one image are consecutive pixels, one contiguous copy per channel.
The sizes are baked into the C, so a kernel serves one input size (a conv's usual case;
`SparseConv2d` builds another on demand for a new size).

Example:
    >>> g = ConvGeometry.of(nn.Conv2d(8, 16, 3, stride=2, padding=1), (15, 15))
    >>> g.out_hw, g.k
    ((8, 8), 72)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from torch import nn

from sparta_explore.kernels.c_templates import c_fill, c_text
from sparta_explore.kernels.kernel_io import KernelIO


@dataclass(frozen=True)
class ConvGeometry:
    """Input channels and size, kernel, stride, zero padding and dilation of one 2-D convolution."""

    channels: int
    in_hw: tuple[int, int]
    kernel: tuple[int, int]
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)

    def __post_init__(self) -> None:
        if self.channels < 1 or min(self.in_hw) < 1 or min(self.kernel) < 1 or min(self.stride) < 1:
            raise ValueError(f"invalid conv geometry {self}")
        if min(self.padding) < 0 or min(self.dilation) < 1 or min(self.out_hw) < 1:
            raise ValueError(f"conv geometry {self} has no output pixel")

    @classmethod
    def of(cls, conv: nn.Conv2d, in_hw: tuple[int, int]) -> ConvGeometry:
        """What a kernel computing `conv` on inputs of `in_hw` pixels sees.

        Zero padding is the kernel's own; other padding modes (reflect, replicate, circular)
        are applied to the input before the kernel, which then sees a larger input, unpadded.

        Example:
            >>> ConvGeometry.of(nn.Conv2d(3, 4, 1), (5, 7)).flat
            True
            >>> ConvGeometry.of(nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"), (5, 7)).in_hw
            (7, 9)
        """
        if isinstance(conv.padding, str):
            raise ValueError(f"conv geometry needs numeric padding, got {conv.padding!r}")
        h, w = int(in_hw[0]), int(in_hw[1])
        padding = tuple(conv.padding)
        if conv.padding_mode != "zeros":
            h, w, padding = h + 2 * padding[0], w + 2 * padding[1], (0, 0)
        return cls(conv.in_channels, (h, w), tuple(conv.kernel_size), tuple(conv.stride), padding,
                   tuple(conv.dilation))

    @property
    def out_hw(self) -> tuple[int, int]:
        """Output height and width (PyTorch's formula)."""
        return tuple((self.in_hw[d] + 2 * self.padding[d] - self.dilation[d] * (self.kernel[d] - 1) - 1)
                     // self.stride[d] + 1 for d in range(2))

    @property
    def k(self) -> int:
        """Columns of the im2col matrix: C x kh x kw."""
        return self.channels * self.kernel[0] * self.kernel[1]

    @property
    def flat(self) -> bool:
        """1x1, stride 1, no padding: im2col rows are the input pixels themselves."""
        return self.kernel == (1, 1) and self.stride == (1, 1) and self.padding == (0, 0)

    @property
    def windowed(self) -> bool:
        """Stride 1 and not flat: kernels read shifted windows of the padded input (`pack_tile_window.c`)."""
        return self.stride == (1, 1) and not self.flat

    @property
    def grid_width(self) -> int:
        """Width of the padded input, the row length of a windowed kernel's output grid."""
        return self.in_hw[1] + 2 * self.padding[1]

    def rows_per_image(self, tile: int, windows: bool | None = None) -> int:
        """Kernel rows (M) per image: its output pixels, or for windowed kernels its grid padded to whole tiles.

        `windows` defaults to `windowed` (fp32 kernels); int8 kernels run every stride-1 conv in windows.
        """
        oh, ow = self.out_hw
        windows = self.windowed if windows is None else windows
        return math.ceil(oh * self.grid_width / tile) * tile if windows else oh * ow

    def window(self, tile: int) -> int:
        """Floats per channel in a windowed kernel's packed tile: the tile's grid points and the kernel's reach."""
        halo = (self.kernel[0] - 1) * self.dilation[0] * self.grid_width + (self.kernel[1] - 1) * self.dilation[1]
        return math.ceil((tile + halo) / 16) * 16

    def defines(self, tile: int, windows: bool | None = None) -> str:
        """The C macros the packing and unpacking templates read (`tile`: rows per kernel tile)."""
        windows = self.windowed if windows is None else windows
        (oh, ow), (h, w), wp, window = self.out_hw, self.in_hw, self.grid_width, self.window(tile)
        values = {"C": self.channels, "H": h, "W": w, "KH": self.kernel[0], "KW": self.kernel[1],
                  "SH": self.stride[0], "SW": self.stride[1], "PH": self.padding[0], "PW": self.padding[1],
                  "DH": self.dilation[0], "DW": self.dilation[1], "OH": oh, "OW": ow, "OHW": oh * ow,
                  "FLAT": int(self.flat), "WP": wp, "MI": self.rows_per_image(tile, windows), "CW": window,
                  "CPAD": self.channels_padded}
        text = "".join(f"#define CONV_{name} {value}L\n" for name, value in values.items())
        return text + (f"#define XB_FLOATS ({self.channels * window}L)\n" if windows else "")

    def window_offsets(self, tile: int) -> tuple[int, ...]:
        """Per im2col column k = (c, i, j): where a windowed kernel's packed tile holds it."""
        wp, (kh, kw), (dh, dw), window = self.grid_width, self.kernel, self.dilation, self.window(tile)
        return tuple(c * window + i * dh * wp + j * dw for c in range(self.channels) for i in range(kh)
                     for j in range(kw))

    @property
    def channels_padded(self) -> int:
        """Channels rounded up to whole int8 words (4), the inner k axis of int8 conv kernels."""
        return -(-self.channels // 4) * 4

    def channels_inner(self, matrix: np.ndarray) -> np.ndarray:
        """(C_out, C x kh x kw) in the weight's own k order -> (C_out, kh x kw x padded C): the int8 k order.

        Example:
            >>> ConvGeometry(2, (4, 4), (1, 2)).channels_inner(np.arange(4).reshape(1, 4)).tolist()
            [[0, 2, 0, 0, 1, 3, 0, 0]]
        """
        n = matrix.shape[0]
        kh, kw = self.kernel
        cube = matrix.reshape(n, self.channels, kh, kw).transpose(0, 2, 3, 1)
        out = np.zeros((n, kh, kw, self.channels_padded), dtype=matrix.dtype)
        out[..., :self.channels] = cube
        return out.reshape(n, -1)

    def quantized_io(self, tile: int, elem: str, word: int, offset: int) -> KernelIO:
        """Packing (quantized windows of `word` channels, stored + `offset`) and writing of an int8 conv kernel.

        Stride 1 only (every shifted window is a plain copy); k in `channels_inner` order.
        """
        if self.stride != (1, 1):
            raise ValueError(f"int8 conv kernels run stride-1 convolutions (shifted windows), got stride {self.stride}")
        wp, (kh, kw), (dh, dw), window = self.grid_width, self.kernel, self.dilation, self.window(tile)
        cpad = self.channels_padded
        offsets = tuple(c // word * window * word + (i * dh * wp + j * dw) * word
                        for i in range(kh) for j in range(kw) for c in range(0, cpad, word))
        bits = 32 // word
        mask = (1 << bits) - 1
        zero_word = sum((offset & mask) << (g * bits) for g in range(word))
        pack = c_text("window_span.c") + c_fill("pack_tile_window_q.c", elem=elem, word=word, offset=offset,
                                                bits=bits, mask=hex(mask), zero_word=f"(int32_t){hex(zero_word)}u")
        return KernelIO(pack, c_text("unpack_tile_window.c"),
                        self.defines(tile, windows=True) + f"#define XB_ELEMS ({cpad * window}L)\n", offsets,
                        one_word=True)

    def kernel_io(self, tile: int) -> KernelIO:
        """Input packing and output writing of an fp32 kernel with `tile` rows per tile run as this convolution."""
        if self.windowed:
            pack = c_text("window_span.c") + c_text("pack_tile_window.c")
            return KernelIO(pack, c_text("unpack_tile_window.c"), self.defines(tile), self.window_offsets(tile),
                            one_word=True)
        return KernelIO(c_text("pack_tile_nchw.c"), c_text("unpack_tile_nchw.c"), self.defines(tile))
