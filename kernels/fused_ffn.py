"""Two sparse linears chained tile by tile: a BERT FFN (fc1 + GELU, then fc2) without its intermediate.

Unfused, fc1 writes its M x 3072 output (48 MiB at M = 4096) and fc2 reads it back, packing
it row by row. Fused, a small driver (`templates/fused_driver.c`) runs, per tile of M rows:
fc1's pack and whole tile (activation included) into a private buffer, fc2's whole tile on
that buffer, and fc2's write to Y. Both kernels stay what they are (their own libraries, their
own tables); the driver gets their entry points as pointers.

* fp32 (`FusedFp32Pair`, two `SparseLinear`): fc1's output tile (N x TILE, K-major) is fc2's
  packed input tile as it is: nothing is packed between them.
* permute int8 (`FusedPermutePair`, two `PermutedInt8Linear`, kernels/permute_int8.py): per tile of 16
  rows of M, fc1's rows go to a 16 x N1 float buffer (in L2), quantized per row by fc2's own library
  (fc2's activation bits), then fc2 writes its rows of Y: the same arithmetic as the two ops.
* int8 (`FusedInt8Pair`, two `Int8SparseLinear`): fc2 packs fc1's tile on its own grids
  (`..._pack_kmajor`, each row of M on its own grid as fc2's own packing would give it). fc1's
  fp32 outputs can differ from the unfused build's in the last bit (the compiler contracts
  multiply-adds per inlining context), so a value exactly halfway between two of fc2's grid
  levels can round the other way (about 1 row in 1000 in tests).

`reference` runs the two ops' references one after the other. Below `WHOLE_TILES` tiles of M
per thread each op's own driver splits a tile's row chunks over threads, while the pair drivers'
only parallelism is over tiles of M (slower at M = 128): an int8 pair runs its two ops apart
there, an fp32 pair its split driver (`fused_pair_fp32_split`: the two ops' chunk items in one
parallel region, the intermediate tile shared between threads instead of unpacked and packed
again; BERT FFN 90% at M = 1-384: 1.07-1.11x the two ops in turn).

Example:
    >>> ffn = fused_pair(fc1, fc2)  # doctest: +SKIP
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
from sparta_explore.kernels.int8_linear import Int8SparseLinear
from sparta_explore.kernels.permute_int8 import PermutedInt8Linear
from sparta_explore.kernels.sparse_linear import KernelLinear, SparseLinear

DRIVER_NAME = "fused_pair"  # the driver library (plain C: no vector code, so it builds for any x86-64 CPU)
WHOLE_TILES = 4  # tiles of M per thread from which a kernel's driver runs whole tiles (templates/fp32_driver.c)


class _Layer(ctypes.Structure):  # `struct layer` of fused_driver.c
    _fields_ = [("run_tile", ctypes.c_void_p), ("W", ctypes.c_void_p), ("corr", ctypes.c_void_p),
                ("ws", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("n_out", ctypes.c_long),
                ("packed_bytes", ctypes.c_long), ("pattern", ctypes.c_void_p)]


class _Layer32(ctypes.Structure):  # `struct layer32` of fused_driver.c
    _fields_ = [("run_tile", ctypes.c_void_p), ("W", ctypes.c_void_p), ("bias", ctypes.c_void_p),
                ("n_out", ctypes.c_long), ("xb_floats", ctypes.c_long), ("pattern", ctypes.c_void_p)]


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _entry(lib: ctypes.CDLL, symbol: str) -> int:
    return ctypes.cast(lib[symbol], ctypes.c_void_p).value


class FusedPair(CompiledOp):
    """y = second(first(x)) for two kernels of one precision, tile by tile (see the module docstring).

    `first` keeps its fused activation. Built once (the driver is pattern-independent and
    cached). Subclasses name the kernel type they chain (`op_type`, whose library exports
    `<symbol>_*` entry points) and how the driver is bound and called.
    """

    op_type: type[KernelLinear]
    symbol: str  # the kernel's function name in its library: its fused entry points are symbol_*
    # True: at `runs_fused` M the pair is the two ops' own work minus the intermediate's trip, so it is never
    # slower and compile fuses it without timing; False: it packs differently, and compile times it
    less_work: bool = False
    whole_tiles: int = WHOLE_TILES  # per thread, from which it runs fused; each pair keeps (and saves) its own
    fallback_reason: str | None = None  # set when a copy could not bind the pair: the two ops then run in turn

    def __init__(self, first: KernelLinear, second: KernelLinear, cache_dir: str | os.PathLike | None = None) -> None:
        super().__init__()
        why = why_not_fusable(first, second)
        if why is None and type(first) is not self.op_type:
            why = f"{type(self).__name__} chains {self.op_type.__name__}s, not {type(first).__name__}s"
        if why is not None:
            raise ValueError(f"cannot fuse: {why}")
        self.first, self.second = first, second
        self.in_features, self.out_features = first.in_features, second.out_features
        self.whole_tiles = type(self).whole_tiles
        self.built: BuiltLibrary = build(c_text("fused_driver.c"), DRIVER_NAME, cache_dir=cache_dir)
        self._bind(self.built.lib)

    @property
    def density(self) -> float:
        """Nonzero share of both weights together."""
        sizes = [op.in_features * op.out_features for op in (self.first, self.second)]
        return sum(op.density * s for op, s in zip((self.first, self.second), sizes)) / sum(sizes)

    def _bind(self, lib: ctypes.CDLL) -> None:
        # by path: after a copy or unpickling the ops' build records hold no library handle
        a, b = load_library(self.first.built.path), load_library(self.second.built.path)
        self._fn, self._entries = self._bind_driver(lib, a, b)

    def _bind_driver(self, lib: ctypes.CDLL, a: ctypes.CDLL, b: ctypes.CDLL) -> tuple[ctypes._CFuncPtr, tuple]:
        raise NotImplementedError(f"{type(self).__name__} names no driver")

    def _call(self, x2: torch.Tensor, y: torch.Tensor) -> None:
        raise NotImplementedError(f"{type(self).__name__} names no driver call")

    def whole_tiles_at(self, rows: int) -> bool:
        """Whether `rows` rows of M give every thread `whole_tiles` tiles: the point from which the pair's whole-tile
        driver runs (each op's own driver runs whole tiles from there too).

        Example:
            >>> pair.whole_tiles_at(4096), pair.whole_tiles_at(128)  # doctest: +SKIP
            (True, False)
        """
        return -(-rows // self.first._tile) >= self.whole_tiles * torch.get_num_threads()

    def runs_fused(self, rows: int) -> bool:
        """Whether `rows` rows of M run through a fused driver (else the two ops run apart, see the module): from
        `whole_tiles_at` (an fp32 pair at any M).

        Example:
            >>> pair.runs_fused(4096), pair.runs_fused(128)  # doctest: +SKIP
            (True, False)
        """
        return self.whole_tiles_at(rows)

    def _fast(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if self._fn is None or not self.runs_fused(x2.shape[0]):  # unbound, or few tiles: one after the other
            return self.second(self.first(x))
        x2 = x2.contiguous()
        y = output_pool.take((x2.shape[0], self.out_features))
        self._call(x2, y)
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
            except (OSError, AttributeError, KernelBuildError) as e:  # AttributeError: a library without entries
                why = str(e)
        self.fallback_reason = f"pair not bound ({why}): its two ops run one after the other"

    def extra_repr(self) -> str:
        return f"{self.in_features}->{self.first.out_features}->{self.out_features}, tile={self.first._tile}"


class FusedInt8Pair(FusedPair):
    """Two `Int8SparseLinear` tile by tile; `second` quantizes first's output rows as it would its own input."""

    op_type = Int8SparseLinear
    symbol = "sparse_linear_int8"
    exact_grad = False  # int8 kernels: rounding has no useful gradient

    def _bind_driver(self, lib: ctypes.CDLL, a: ctypes.CDLL, b: ctypes.CDLL) -> tuple[ctypes._CFuncPtr, tuple]:
        fn = lib.fused_pair
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p,
                       ctypes.POINTER(_Layer), ctypes.c_void_p, ctypes.POINTER(_Layer), ctypes.c_void_p]
        s = self.symbol
        entries = (_entry(a, f"{s}_pack_rows"), _entry(b, f"{s}_pack_kmajor"), _entry(b, f"{s}_unpack"),
                   _entry(a, f"{s}_run_tile"), _entry(b, f"{s}_run_tile"), a[f"{s}_packed_bytes"](),
                   b[f"{s}_packed_bytes"]())
        return fn, entries

    def _call(self, x2: torch.Tensor, y: torch.Tensor) -> None:
        pack_rows, pack_kmajor, unpack, run_a, run_b, bytes_a, bytes_b = self._entries
        a, b = self.first, self.second
        la = _Layer(run_a, _ptr(a._packed), _ptr(a._corr), _ptr(a.weight_scale), _ptr(a.bias), a.out_features,
                    bytes_a, a.pattern_address)
        lb = _Layer(run_b, _ptr(b._packed), _ptr(b._corr), _ptr(b.weight_scale), _ptr(b.bias), b.out_features,
                    bytes_b, b.pattern_address)
        self._fn(x2.data_ptr(), y.data_ptr(), x2.shape[0], a._tile, pack_rows, ctypes.byref(la), pack_kmajor,
                 ctypes.byref(lb), unpack)


class FusedFp32Pair(FusedPair):
    """Two `SparseLinear` tile by tile: first's output tile is second's packed input tile, unchanged."""

    op_type = SparseLinear
    symbol = "sparse_linear"
    less_work = True  # the same run_item calls as the two ops, without fc1's unpack and fc2's pack
    exact_grad = True  # backward runs the two references: exact gradients

    def _bind_driver(self, lib: ctypes.CDLL, a: ctypes.CDLL, b: ctypes.CDLL) -> tuple[ctypes._CFuncPtr, tuple]:
        fn, split = lib.fused_pair_fp32, lib.fused_pair_fp32_split
        fn.restype = split.restype = None
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p,
                       ctypes.POINTER(_Layer32), ctypes.POINTER(_Layer32), ctypes.c_void_p]
        split.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p] + \
            [ctypes.POINTER(_Layer32), ctypes.c_void_p, ctypes.c_long] * 2
        s = self.symbol
        counts = [lib_[f"{s}_{what}"] for lib_ in (a, b) for what in ("xb_floats", "chunks")]
        for f in counts:
            f.restype, f.argtypes = ctypes.c_long, [ctypes.c_void_p]
        patterns = (self.first.pattern_address, self.first.pattern_address, self.second.pattern_address,
                    self.second.pattern_address)
        floats_a, chunks_a, floats_b, chunks_b = (f(p) for f, p in zip(counts, patterns))
        entries = (_entry(a, f"{s}_pack_rows"), _entry(a, f"{s}_run_tile"), _entry(b, f"{s}_run_tile"),
                   _entry(b, f"{s}_unpack"), floats_a, floats_b,
                   split, _entry(a, f"{s}_run_chunks"), chunks_a, _entry(b, f"{s}_run_chunks"), chunks_b)
        return fn, entries

    def runs_fused(self, rows: int) -> bool:
        """Always: below `whole_tiles` tiles of M per thread, each tile's chunks split over threads instead
        (`fused_pair_fp32_split`, as each op's own driver does there, without the intermediate's trip).

        Example:
            >>> pair.runs_fused(128)  # doctest: +SKIP
            True
        """
        return True

    def _call(self, x2: torch.Tensor, y: torch.Tensor) -> None:
        pack_rows, run_a, run_b, unpack, floats_a, floats_b, split, chunks_a, n_a, chunks_b, n_b = self._entries
        a, b = self.first, self.second
        la = _Layer32(run_a, a._packed.data_ptr(), _ptr(a.bias), a.out_features, floats_a, a.pattern_address)
        lb = _Layer32(run_b, b._packed.data_ptr(), _ptr(b.bias), b.out_features, floats_b, b.pattern_address)
        rows = x2.shape[0]
        if self.whole_tiles_at(rows):  # whole tiles, handed to threads one at a time
            self._fn(x2.data_ptr(), y.data_ptr(), rows, a._tile, pack_rows, ctypes.byref(la), ctypes.byref(lb),
                     unpack)
        else:
            split(x2.data_ptr(), y.data_ptr(), rows, a._tile, pack_rows, ctypes.byref(la), chunks_a, n_a,
                  ctypes.byref(lb), chunks_b, n_b)


class FusedPermutePair(FusedPair):
    """Two `PermutedInt8Linear` tile by tile: first's rows of a tile stay in L2, quantized there for second."""

    op_type = PermutedInt8Linear
    symbol = "permute_int8"
    exact_grad = False  # int8 kernels: rounding has no useful gradient
    less_work = True  # the two ops' own code, without the M x N1 float intermediate in memory

    def _bind_driver(self, lib: ctypes.CDLL, a: ctypes.CDLL, b: ctypes.CDLL) -> tuple[ctypes._CFuncPtr, tuple]:
        fn = lib.fused_pair_permute
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_long] * 5 + [ctypes.c_void_p] * 6
        s = self.symbol
        # each op quantizes its own input: the two may keep their activations at different bits
        return fn, tuple(_entry(lib_, f"{s}_{name}") for lib_ in (a, b) for name in ("quantize", "tile"))

    def _call(self, x2: torch.Tensor, y: torch.Tensor) -> None:
        quantize_a, run_a, quantize_b, run_b = self._entries
        a, b = self.first, self.second
        la, lb = a.layer(), b.layer()
        self._fn(x2.data_ptr(), y.data_ptr(), x2.shape[0], a.in_features, a.out_features, b.out_features, a._tile,
                 quantize_a, run_a, ctypes.byref(la), quantize_b, run_b, ctypes.byref(lb))


PAIRS: dict[type, type[FusedPair]] = {Int8SparseLinear: FusedInt8Pair, SparseLinear: FusedFp32Pair,
                                      PermutedInt8Linear: FusedPermutePair}


def why_not_fusable(first: torch.nn.Module, second: torch.nn.Module) -> str | None:
    """Why `first` then `second` cannot run as one fused pair (`PAIRS`), or None when they can.

    Example:
        >>> why_not_fusable(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
        'Linear is not a row-major SparseLinear, Int8SparseLinear or PermutedInt8Linear'
    """
    names = [t.__name__ for t in (SparseLinear, Int8SparseLinear, PermutedInt8Linear)]
    kinds = ", ".join(names[:-1]) + " or " + names[-1]
    for op in (first, second):
        if type(op) not in PAIRS:
            return f"{type(op).__name__} is not a row-major {kinds}"
        if op._fn is None or op.built is None:
            return f"{op.op_name()} runs its reference ({op.fallback_reason})"
    if type(first) is not type(second):
        return f"a {type(first).__name__} feeds a {type(second).__name__}"
    if first.out_features != second.in_features:
        return f"{first.out_features} outputs feed {second.in_features} inputs"
    if first._tile != second._tile:
        return f"tiles of {first._tile} and {second._tile} rows"
    return None


def fused_pair(first: KernelLinear, second: KernelLinear, cache_dir: str | os.PathLike | None = None) -> FusedPair:
    """The fused pair for `first` then `second` (`FusedFp32Pair` or `FusedInt8Pair`); ValueError if none can be.

    Example:
        >>> fused_pair(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
        Traceback (most recent call last):
        ...
        ValueError: cannot fuse: Linear is not a row-major SparseLinear, Int8SparseLinear or PermutedInt8Linear
    """
    why = why_not_fusable(first, second)
    if why is not None:
        raise ValueError(f"cannot fuse: {why}")
    return PAIRS[type(first)](first, second, cache_dir=cache_dir)
