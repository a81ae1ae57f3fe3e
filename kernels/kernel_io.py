"""How a generated kernel reads its input tile and writes its output: the C around the pattern's loops.

Every fp32 and int8 kernel packs a tile of its input into a private buffer (`pack_tile`),
runs the pattern's register tiles over it, and writes the tile's outputs (`unpack_tile`).
A linear reads and writes row-major matrices (`bsr_codegen.ROWS_IO`); a convolution packs
its im2col rows from NCHW instead (`conv_geometry.ConvGeometry.kernel_io`). Where the
packed words of k sit in the buffer is what the register tiles' offset tables hold.

Example:
    >>> KernelIO("pack", "unpack", x_offsets=(0, 7, 3), one_word=True).offsets(np.array([1, 2]), tile=48).tolist()
    [7, 3]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class KernelIO:
    """How a kernel (fp32 or int8) reads and writes: C of `pack_tile` (input tile -> packed buffer), of
    `unpack_tile` (N x TILE `yb` -> output), the macros they need, and where each packed word of k
    sits in the buffer (`x_offsets`; None: word after word, TILE rows apart, as `bsr_codegen.ROWS_IO`).
    """

    pack: str
    unpack: str
    defines: str = ""
    x_offsets: tuple[int, ...] | None = None  # offset in xb of each packed word (of k); None: word * TILE
    one_word: bool = False  # offsets are not evenly spaced in k: every piece must be one k

    def offsets(self, k: np.ndarray, tile: int, word: int = 1) -> np.ndarray:
        """Where (in packed elements) the kernel reads the packed word holding column k, per entry of `k`.

        Example:
            >>> KernelIO("pack", "unpack").offsets(np.array([0, 4, 8]), tile=48, word=4).tolist()
            [0, 192, 384]
        """
        if self.x_offsets is None:
            return k // word * tile * word
        return np.asarray(self.x_offsets, dtype=np.int64)[k // word]
