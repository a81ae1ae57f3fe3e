"""Two int8 sparse linears chained tile by tile: a BERT FFN (fc1 + GELU, then fc2) without its intermediate.

Unfused, fc1 writes its M x 3072 output (48 MiB at M = 4096) and fc2 reads it back, packing
it row by row. Fused, a small driver (`templates/fused_driver.c`) runs, per tile of M rows:
fc1's pack and whole tile (activation included) into a private buffer, fc2's packing of
that buffer (already K-major for fc2: `..._pack_kmajor`, each row of M on its own grid as
fc2's own packing would give it), fc2's tile, and fc2's write to Y. Both kernels stay what
they are (their own libraries, their own baked tables); the driver gets their entry points
as pointers. The same computation as the two ops one after the other (`reference` runs them
so), with one caveat: fc1's fp32 outputs can differ from the unfused build's in the last bit
(the compiler contracts multiply-adds per inlining context), so a value exactly halfway
between two of fc2's grid levels can round the other way (about 1 row in 1000 in tests).

Example:
    >>> ffn = FusedInt8Pair(fc1, fc2)  # doctest: +SKIP
    >>> torch.allclose(ffn(x), fc2(fc1(x)), atol=1e-4)  # doctest: +SKIP
    True
"""

from __future__ import annotations

import ctypes
import os

import torch

from sparta_explore.kernels import output_pool
from sparta_explore.kernels.build import BuiltLibrary, KernelBuildError, build, load_library
from sparta_explore.kernels.c_templates import c_text
from sparta_explore.kernels.compiled_op import CompiledOp
from sparta_explore.kernels.sparse_linear import Int8SparseLinear

SYMBOL = "sparse_linear_int8"  # Int8SparseLinear's kernel name: its fused entry points are SYMBOL_*
DRIVER_NAME = "fused_pair"  # the driver library (plain C: no vector code, so it builds for any x86-64 CPU)


class _Layer(ctypes.Structure):
    _fields_ = [("run_tile", ctypes.c_void_p), ("W", ctypes.c_void_p), ("corr", ctypes.c_void_p),
                ("ws", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("n_out", ctypes.c_long),
                ("packed_bytes", ctypes.c_long), ("pattern", ctypes.c_void_p)]


def why_not_fusable(first: torch.nn.Module, second: torch.nn.Module) -> str | None:
    """Why `first` then `second` cannot run as one `FusedInt8Pair`, or None when they can.

    Example:
        >>> why_not_fusable(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
        'Linear is not a row-major Int8SparseLinear'
    """
    for op in (first, second):
        if type(op) is not Int8SparseLinear:
            return f"{type(op).__name__} is not a row-major Int8SparseLinear"
        if op._fn is None or op.built is None:
            return f"{op.op_name()} runs its reference ({op.fallback_reason})"
    if first.out_features != second.in_features:
        return f"{first.out_features} outputs feed {second.in_features} inputs"
    if first._tile != second._tile:
        return f"tiles of {first._tile} and {second._tile} rows"
    return None


class FusedInt8Pair(CompiledOp):
    """y = second(first(x)) for two `Int8SparseLinear` kernels, tile by tile (see the module docstring).

    `first` keeps its fused activation; `second` quantizes first's output rows exactly as it
    would quantize its own input. Built once (the driver is pattern-independent and cached).
    """

    exact_grad = False  # int8 kernels: rounding has no useful gradient
    fallback_reason: str | None = None  # set when a copy could not bind the pair: the two ops then run in turn

    def __init__(self, first: Int8SparseLinear, second: Int8SparseLinear,
                 cache_dir: str | os.PathLike | None = None) -> None:
        super().__init__()
        why = why_not_fusable(first, second)
        if why is not None:
            raise ValueError(f"cannot fuse: {why}")
        self.first, self.second = first, second
        self.in_features, self.out_features = first.in_features, second.out_features
        self.built: BuiltLibrary = build(c_text("fused_driver.c"), DRIVER_NAME, cache_dir=cache_dir)
        self._bind(self.built.lib)

    @property
    def density(self) -> float:
        """Nonzero share of both weights together."""
        sizes = [op.in_features * op.out_features for op in (self.first, self.second)]
        return sum(op.density * s for op, s in zip((self.first, self.second), sizes)) / sum(sizes)

    def _bind(self, lib: ctypes.CDLL) -> None:
        fn = lib.fused_pair
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p,
                       ctypes.POINTER(_Layer), ctypes.c_void_p, ctypes.POINTER(_Layer), ctypes.c_void_p]
        self._fn = fn
        # by path: after a copy or unpickling the ops' build records hold no library handle
        a, b = load_library(self.first.built.path), load_library(self.second.built.path)
        entry = lambda lib, what: ctypes.cast(lib[f"{SYMBOL}_{what}"], ctypes.c_void_p).value  # noqa: E731
        self._entries = (entry(a, "pack_rows"), entry(b, "pack_kmajor"), entry(b, "unpack"), entry(a, "run_tile"),
                         entry(b, "run_tile"), a[f"{SYMBOL}_packed_bytes"](), b[f"{SYMBOL}_packed_bytes"]())

    @staticmethod
    def _layer(op: Int8SparseLinear, run_tile: int, packed_bytes: int) -> _Layer:
        ptr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
        return _Layer(run_tile, ptr(op._packed), ptr(op._corr), ptr(op.weight_scale), ptr(op.bias),
                      op.out_features, packed_bytes, op.pattern_address)

    def _fast(self, x: torch.Tensor) -> torch.Tensor:
        if self._fn is None:  # unbound (loaded without a compiler, or its ops rebuilt apart): one after the other
            return self.second(self.first(x))
        pack_rows, pack_kmajor, unpack, run_a, run_b, bytes_a, bytes_b = self._entries
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).contiguous()
        y = output_pool.take((x2.shape[0], self.out_features))
        a, b = self._layer(self.first, run_a, bytes_a), self._layer(self.second, run_b, bytes_b)
        self._fn(x2.data_ptr(), y.data_ptr(), x2.shape[0], self.first._tile, pack_rows, ctypes.byref(a), pack_kmajor,
                 ctypes.byref(b), unpack)
        return y.reshape(*lead, self.out_features)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The two ops' references one after the other."""
        return self.second.reference(self.first.reference(x))

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        for key in ("_fn", "_entries"):
            state.pop(key, None)
        state["built"] = None if self.built is None else self.built.detached()
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._fn, self.fallback_reason = None, None
        why = "no driver library" if self.built is None else why_not_fusable(self.first, self.second)
        if why is None:
            try:
                self._bind(load_library(self.built.path))
                return
            except (OSError, KernelBuildError) as e:
                why = str(e)
        self.fallback_reason = f"pair not bound ({why}): its two ops run one after the other"

    def extra_repr(self) -> str:
        return f"{self.in_features}->{self.first.out_features}->{self.out_features}, tile={self.first._tile}"
