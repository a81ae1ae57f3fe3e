"""Few-row products behind a compiled linear: kernels chosen per row count, M = 1 .. MAX_BATCH.

A linear's kernel is generated and tiled for the row count of the compile example (a 128-token
prefill, a batch of images); one decode token is one row, where that kernel wastes most of its
tile. `RowPath` is the decode step's one-row product (`decode_step.gemv`) over the op's
effective weight packed in the narrowest layout its values fit (`pack_weight`: 4-bit or 8-bit
codes with their grids, else float32, zeros kept as values). Inputs are rounded as the op rounds
them: `act_bits` < 32 puts each row on one symmetric grid, as the int8 sparse kernels do.

`attach(op, weight, bias, act_bits)` builds one for a compiled op, checks it against the op's
reference on 1-3 random rows (a mismatch keeps the op's own kernel, with a warning) and times it
against the op's kernel at 8, then 4, 2, 1 rows: the path serves every row count up to the first
where it measured faster (`up_to`; none when it never won). Ops call it from `_fast`; a copied or
loaded op keeps only that row count and packs its weight again on first use.

Example:
    >>> path = RowPath(torch.randn(64, 96), None)
    >>> x = torch.randn(1, 96)
    >>> torch.allclose(path(x), x @ path.packed.dequantize().T, atol=1e-4)
    True
"""

from __future__ import annotations

import ctypes
import statistics
import time
import warnings
from collections.abc import Callable

import torch

from sparta_explore.fake_quant import fake_quantize_rows
from sparta_explore.kernels.build import compiler_available
from sparta_explore.kernels.decode_step import MAX_BATCH, library, mat_of, why_no_kernels
from sparta_explore.kernels.packed_weights import PackedWeight, pack_weight

FP32_BITS = 32
TIMED_ROWS = (MAX_BATCH, 4, 2, 1)
REPEATS = 5


class RowPathWarning(UserWarning):
    """A few-row path did not match its op's reference: the op keeps its own kernel for every row count."""


class RowPath:
    """`x W^T + bias` for inputs of at most MAX_BATCH rows (module docstring); `up_to` rows it serves.

    Example:
        >>> RowPath(torch.eye(4), torch.ones(4))(torch.ones(1, 4)).tolist()
        [[2.0, 2.0, 2.0, 2.0]]
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, act_bits: int = FP32_BITS,
                 up_to: int = MAX_BATCH) -> None:
        self.packed: PackedWeight = pack_weight(weight.detach().float())
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self.act_bits = int(act_bits)
        # integer codes meet integer inputs where the weight has codes and whole 32-column runs; else the input is
        # rounded in torch and meets the float32 rows
        self.int_inputs = self.act_bits != FP32_BITS and self.packed.can_tile
        if self.int_inputs:  # held in tiles only: the layout the int8 kernels read
            self.packed = self.packed.to_tiles()
        self.up_to = int(up_to)
        self._bound: tuple | None = None

    def _bind(self) -> tuple:
        if self._bound is None:
            lib = library().lib
            mat, keep = mat_of(self.packed, self.bias, tiles=self.int_inputs)
            scratch = torch.empty(lib.act_floats(MAX_BATCH, self.packed.k), dtype=torch.float32)
            self._bound = (lib, mat, keep, scratch)
        return self._bound

    def __call__(self, x2: torch.Tensor) -> torch.Tensor:
        """The product for `x2` (rows <= MAX_BATCH, float32, contiguous)."""
        lib, mat, _keep, scratch = self._bind()
        if self.act_bits != FP32_BITS and not self.int_inputs:
            x2 = fake_quantize_rows(x2, self.act_bits).contiguous()
        out = torch.empty(x2.shape[0], self.packed.n, dtype=torch.float32)
        run = self.packed.k if self.int_inputs else 0
        lib.gemv(ctypes.byref(mat), x2.data_ptr(), x2.shape[0], out.data_ptr(), torch.get_num_threads(), run,
                 float(2 ** (self.act_bits - 1) - 1), scratch.data_ptr())
        return out

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_bound"] = None  # ctypes structs point into this process's memory: bound again on first call
        return state


def why_no_row_path() -> str | None:
    """Why this machine cannot run the few-row kernels, or None.

    Example:
        >>> why_no_row_path() is None or isinstance(why_no_row_path(), str)
        True
    """
    if not compiler_available():
        return "no C compiler"
    return why_no_kernels()


def _median_seconds(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> float:
    fn(x)  # warm: first-touch of outputs, library binding
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def attach(name: str, weight: torch.Tensor, bias: torch.Tensor | None, act_bits: int,
           activation: Callable[[torch.Tensor], torch.Tensor], kernel: Callable[[torch.Tensor], torch.Tensor],
           reference: Callable[[torch.Tensor], torch.Tensor], rows: int | None = None) -> RowPath | None:
    """A `RowPath` for the op `name` if `activation(path(x))` matches the op's `reference`, serving inputs of up to
    `rows` rows, or (None) of as many of 1, 2, 4, 8 rows as it beats the op's `kernel` (both full ops on (M, k)
    float32 rows); else None.

    Example:
        >>> w = torch.randn(32, 64)
        >>> path = attach("fc", w, None, 32, torch.relu, lambda x: torch.relu(x @ w.T), lambda x: torch.relu(x @ w.T))
        >>> path is None or 0 < path.up_to <= 8
        True
    """
    if why_no_row_path() is not None:
        return None
    path = RowPath(weight, bias, act_bits)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in (1, 3):
            x = torch.randn(m, path.packed.k, generator=g)
            got, want = activation(path(x)), reference(x)
            tol = 1e-4 * (1 + float(want.abs().max()))
            err = float((got - want).abs().max())
            if not err <= tol:
                warnings.warn(f"{name}: the few-row path misses the reference by {err:.3g} (tolerance {tol:.3g}); "
                              "the op's own kernel runs every row count", RowPathWarning, stacklevel=2)
                return None
        if rows is not None:
            path.up_to = min(int(rows), MAX_BATCH)
            return path if path.up_to > 0 else None
        path.up_to = 0
        for m in TIMED_ROWS:  # from the most rows down: the one-row kernels' lead only grows with fewer rows
            x = torch.randn(m, path.packed.k, generator=g)
            if _median_seconds(lambda v: activation(path(v)), x) < _median_seconds(kernel, x):
                path.up_to = m
                break
    return path if path.up_to else None
