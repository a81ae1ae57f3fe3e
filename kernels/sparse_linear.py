"""SparseLinear: an nn.Module running a pattern-specialized kernel, checked, with a dense fallback.

Build: the kept-weight pattern becomes generated C (see bsr_codegen), compiled once and
cached; the module then checks its output against the masked dense `F.linear` on a random
input. A build or check failure is a warning and the module runs the dense reference.
"""

from __future__ import annotations

import ctypes
import os
import time
import warnings

import numpy as np
import torch
import torch.nn.functional as F

from sparta_explore.activations import ACTIVATIONS
from sparta_explore.compact import count_true, kept_only
from sparta_explore.kernels import output_pool
from sparta_explore.kernels.bsr_codegen import ROWS_IO, KernelIO, TileConfig
from sparta_explore.kernels.build import BuiltLibrary, KernelBuildError, build, load_library, vector_width
from sparta_explore.kernels.compiled_op import CompiledOp, float_inputs_only
from sparta_explore.kernels.fp32_layouts import FP32_LAYOUTS
from sparta_explore.kernels.pattern_data import KernelSource, pattern_struct
from sparta_explore.kernels.row_path import RowPath, attach, why_no_row_path
from sparta_explore.kernels.tuning import search_tiles

_ACT = {name: act.torch_fn for name, act in ACTIVATIONS.items()}  # the one table: sparta_explore/activations.py


def check_linear_args(weight: torch.Tensor, kept: torch.Tensor, activation: str) -> None:
    """One clear error for a bad activation name or a mask that does not fit the weight."""
    if activation not in _ACT:
        raise ValueError(f"activation must be one of {sorted(_ACT)}, got {activation!r}")
    if kept.shape != weight.shape:
        raise ValueError(f"kept mask {tuple(kept.shape)} does not match weight {tuple(weight.shape)}")


# Kernels read their pattern as data (kernels/pattern_data.py): one library per shape class, tiling and precision,
# shared by every layer and trial of that class, instead of one gcc run per pattern
PATTERN_AS_DATA = True


class KernelFallbackWarning(UserWarning):
    """A kernel failed to build or to match its reference; the dense op runs instead."""


class KernelLinear(CompiledOp):
    """Shared life cycle of kernel-backed linears: build, check against `reference`, or fall back.

    Subclasses implement `_build(kept, block_rows, cache_dir)` (setting `self._fn`),
    `_run(x2, y)` and `reference(x)`. Inputs are checked and dtypes kept as `CompiledOp` says.
    `tile="auto"` searches the tiling (cached per pattern class); `tile_searched=True` says a
    given tile is that search's result (compile passes it; no tune step follows). A kernel
    built with its pattern as data reads it through `pattern_address` (None when baked).
    `zeroed=True`: `weight` is zero wherever `kept` is False already, and is held as it is (no copy).
    """

    kind = "kernel"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kept: torch.Tensor, *, block_rows: int = 1,
                 activation: str = "none", cache_dir: str | os.PathLike | None = None, check: bool = True,
                 tile: TileConfig | str = TileConfig(), expected_m: int = 1024, tile_searched: bool = False,
                 zeroed: bool = False, few_rows: bool | int = False) -> None:
        super().__init__()
        check_linear_args(weight, kept, activation)
        self.out_features, self.in_features = weight.shape
        self.activation = activation
        masked = (weight.detach() if zeroed else kept_only(weight.detach(), kept)).float().contiguous()
        self.register_buffer("weight", masked)
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())
        self.density = count_true(kept) / max(1, kept.numel())  # no float copy of the mask (9 MB a BERT weight)
        kept_np = kept.cpu().numpy().astype(bool)
        # the pattern (one bit per weight, not a buffer: no weight bytes counted) and where kernels are cached:
        # what `rebuilt` needs to generate the op again for another machine
        self.kept_bits = torch.from_numpy(np.packbits(kept_np.reshape(-1)))
        self.block_rows = max(1, int(block_rows))
        self.cache_dir = cache_dir
        self.fallback_reason: str | None = None
        self.built: BuiltLibrary | None = None
        self._fn = None
        self._keep_tables(None)
        start = time.perf_counter()
        searching = tile == "auto"
        # the tiling a (cached) search chose, here or by the caller: a tune step has nothing to add
        self.tile_searched = searching or bool(tile_searched)
        if searching:
            tile = search(weight, bias, kept, block_rows=block_rows, activation=activation, m=expected_m,
                          cache_dir=cache_dir)
        searched = time.perf_counter()
        if not isinstance(tile, TileConfig):
            raise ValueError(f"tile must be a TileConfig or 'auto', got {tile!r}")
        self.tile = tile
        self.expected_m = int(expected_m)
        built = checked = searched
        try:
            self._build(kept_np, self.block_rows, cache_dir)
            built = time.perf_counter()
            if check:
                self._check()
            checked = time.perf_counter()
        except (KernelBuildError, OSError, AssertionError, ValueError) as e:
            self.fallback_reason = str(e)
            self._fn = None
            warnings.warn(f"{type(self).__name__} {self.out_features}x{self.in_features}: kernel unusable ({e}); "
                          "running the reference op", KernelFallbackWarning, stacklevel=2)
        # inputs of up to `few_rows` rows (one decode token) through the one-row kernels (row_path.py)
        self.rows = self._few_row_path(few_rows) if few_rows and self._fn is not None else None
        self.few_rows = 0 if self.rows is None else self.rows.up_to
        rows_done = time.perf_counter()
        gcc = self.built.build_seconds if self.built is not None else 0.0
        # where this op's construction went (compile's breakdown, `CompiledModel.compile_times`)
        self.build_seconds = {"tile search": searched - start if searching else 0.0,
                              "gcc + load": min(gcc, max(0.0, built - searched)),
                              "codegen": max(0.0, built - searched - gcc), "kernel check": max(0.0, checked - built),
                              "few-row path": rows_done - checked}

    def _few_row_path(self, few_rows: bool | int) -> RowPath | None:
        """The op's product as a `row_path.RowPath`, checked against `reference`: for as many rows as it measures
        faster than this kernel (`few_rows=True`), or for `few_rows` rows as given (a rebuilt or loaded op keeps
        its decision). Plain rows only: ops reading their input another way (convolution patches) keep theirs."""
        if type(self)._fast is not KernelLinear._fast:
            return None
        name = self.label or f"{type(self).__name__} {self.out_features}x{self.in_features}"
        return attach(name, self.effective_weight(), self.bias, getattr(self, "act_bits", 32), _ACT[self.activation],
                      self._fast, self.reference, rows=None if few_rows is True else int(few_rows))

    def _rows(self) -> RowPath | None:
        """The few-row path, packed again after a copy or a load (only its row count is kept with the op)."""
        rows = self.__dict__.get("rows")
        if rows is None and self.__dict__.get("few_rows", 0) and why_no_row_path() is None:
            rows = self.rows = RowPath(self.effective_weight(), self.bias, getattr(self, "act_bits", 32),
                                       self.few_rows)
        return rows

    def effective_weight(self) -> torch.Tensor:
        """The float weight `reference` multiplies (masked; on its grid for integer ops)."""
        return self.weight

    def as_linear(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(weight, bias) of the dense linear this op computes before its activation
        (a ValueError for an op that rounds its inputs)."""
        float_inputs_only(self)
        return self.effective_weight(), self.bias

    def _keep_tables(self, source: KernelSource | None) -> None:
        """Hold the pattern tables a kernel built `as_data` reads at run time (None / baked: it reads none)."""
        if source is not None and source.as_data:
            self._tab64, self._tab32, self._layout = source.tables.blobs()
        else:
            self._tab64 = self._tab32 = self._layout = None
        self._point_tables()

    def _point_tables(self) -> None:
        # `struct pattern` holds addresses: made again whenever the tables' tensors may have moved (copy, load);
        # its own address is kept as an int (`ndarray.ctypes` builds an object per access: not per call)
        self._struct = None if self._layout is None else pattern_struct(self._tab64, self._tab32, self._layout)
        self.pattern_address = None if self._struct is None else int(self._struct.ctypes.data)

    @property
    def kept(self) -> torch.Tensor:
        """The bool mask of kept weights the kernel was generated for, (out_features, in_features)."""
        n = self.out_features * self.in_features
        return torch.from_numpy(np.unpackbits(self.kept_bits.numpy(), count=n).astype(bool)).reshape(
            self.out_features, self.in_features)

    def _arguments(self, cache_dir: str | os.PathLike | None) -> tuple[tuple, dict]:
        """The constructor arguments that generate this op again (tile and fusion as chosen, no search)."""
        return (self.weight, self.bias, self.kept), {"block_rows": self.block_rows, "activation": self.activation,
                                                     "cache_dir": cache_dir, "tile": self.tile,
                                                     "expected_m": self.expected_m, "zeroed": True,
                                                     "few_rows": self.__dict__.get("few_rows", 0)}

    def rebuilt(self, cache_dir: str | os.PathLike | None = None, **changes: object) -> KernelLinear:
        """The same op generated and built again for this machine (a saved model loaded where the ISA differs),
        with `changes` to its constructor arguments (another tiling to match a neighbour: compile/kernel_pairs.py).

        Example:
            >>> sl.rebuilt().tile == sl.tile  # doctest: +SKIP
            True
            >>> sl.rebuilt(tile=other.tile, tile_searched=True).tile == other.tile  # doctest: +SKIP
            True
        """
        args, kwargs = self._arguments(cache_dir)
        op = type(self)(*args, **{**kwargs, **changes})
        op.label = self.label
        return op

    def _check_input(self, g: torch.Generator) -> torch.Tensor:
        """A random input covering two whole tiles and a ragged one."""
        return torch.randn(2 * self._tile + 3, self.in_features, generator=g)

    def _check(self) -> None:
        x = self._check_input(torch.Generator().manual_seed(0))
        with torch.no_grad():
            got, want = self._fast(x), self.reference(x)
        tol = 1e-4 * (1 + float(want.abs().max()))
        err = float((got - want).abs().max())
        if not err <= tol:
            raise AssertionError(f"max error {err:.3g} over tolerance {tol:.3g}")

    def __getstate__(self) -> dict:
        # ctypes handles cannot be pickled: keep the library's record and bind it again on load
        state = self.__dict__.copy()
        state.pop("_fn", None)
        state.pop("_struct", None)
        state.pop("pattern_address", None)
        state.pop("_weight_levels", None)  # a cache of the weight grid, made again on first use
        state.pop("rows", None)  # the few-row path: packed again from the weight on first use (`few_rows` stays)
        built = state.get("built")
        state["built"] = None if built is None else built.detached()
        state["_bound"] = self._fn is not None
        return state

    def __setstate__(self, state: dict) -> None:
        bound = state.pop("_bound", False)
        state.pop("_library_path", None)  # written by older versions
        super().__setstate__(state)
        self._fn = None
        for key in ("_tab64", "_tab32", "_layout"):  # written by versions that baked every pattern
            self.__dict__.setdefault(key, None)
        self._point_tables()
        if not bound or self.built is None or self.fallback_reason is not None:
            return
        try:
            self._bind(load_library(self.built.path))
        except (OSError, KernelBuildError) as e:  # copied to a machine without the cached library
            self.fallback_reason = f"kernel library not loadable after unpickling ({e})"
            warnings.warn(f"{type(self).__name__}: {self.fallback_reason}; running the reference op",
                          KernelFallbackWarning, stacklevel=2)

    def _fast(self, x: torch.Tensor) -> torch.Tensor:
        if self._fn is None:
            return self.reference(x)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).contiguous()
        if x2.shape[0] <= self.__dict__.get("few_rows", 0) and (rows := self._rows()) is not None:
            return _ACT[self.activation](rows(x2)).reshape(*lead, self.out_features)
        y = output_pool.take((x2.shape[0], self.out_features))  # no page faults on memory freed by a last call
        self._run(x2, y)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        if self._fn is None:
            state = f"reference fallback ({self.fallback_reason})" if self.fallback_reason else "reference (unbound)"
        else:
            state = f"kernel {self.built.key}" if self.built is not None else "kernel"
        return (f"in={self.in_features}, out={self.out_features}, density={self.density:.3f}, "
                f"act={self.activation}, {state}")


class SparseLinear(KernelLinear):
    """y = act(x W_kept^T + b) in fp32 through a kernel specialized to W's kept pattern.

    `kept` is the bool mask of kept weights (a TeSA's `.kept`); `block_rows` tells how many
    consecutive output rows share a pattern (the block height; 1 for 1xK or unstructured).

    Example:
        >>> lin = torch.nn.Linear(64, 32)
        >>> kept = torch.rand(32, 64) > 0.9
        >>> sl = SparseLinear(lin.weight, lin.bias, kept, block_rows=1)
        >>> torch.allclose(sl(x := torch.randn(5, 64)), F.linear(x, lin.weight * kept, lin.bias), atol=1e-4)
        True
    """

    def _build(self, kept: np.ndarray, block_rows: int, cache_dir) -> None:
        self._vec = vector_width()
        self._tile = self.tile.tile_vectors * self._vec
        name = "sparse_linear"
        source, packed = FP32_LAYOUTS[self.tile.layout](self.weight.numpy(), kept, block_rows, self.tile, self._vec,
                                                        self.activation, name, self._kernel_io(), PATTERN_AS_DATA)
        self.built = build(source.text, name, cache_dir=cache_dir)
        self._packed = torch.from_numpy(packed)
        self._keep_tables(source)
        self._bind(self.built.lib)

    def _kernel_io(self) -> KernelIO:
        """How the kernel reads X and writes Y: row-major here; a convolution gathers im2col rows."""
        return ROWS_IO

    def _bind(self, lib: ctypes.CDLL) -> None:
        fn = lib.sparse_linear
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_void_p]
        self._fn = fn

    def _run(self, x2: torch.Tensor, y: torch.Tensor, rows: int | None = None) -> None:
        self._fn(x2.data_ptr(), y.data_ptr(), x2.shape[0] if rows is None else rows, self._packed.data_ptr(),
                 None if self.bias is None else self.bias.data_ptr(), self.pattern_address)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The masked dense op this kernel must match, in `x`'s dtype."""
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return _ACT[self.activation](F.linear(x, self.weight.to(x.dtype), bias))


def search(weight: torch.Tensor, bias: torch.Tensor | None, kept: torch.Tensor, *, block_rows: int, activation: str,
           m: int, cache_dir: str | os.PathLike | None = None, repeats: int = 5) -> TileConfig:
    """The fastest candidate tiling for this pattern's class at about `m` rows of input (cached per class).

    What `tile="auto"` runs: candidates are `SparseLinear`s built side by side and timed by
    `tuning.search_tiles`; here, beside the layer, so that tuning.py need not import it.

    Example:
        >>> cfg = search(w, b, kept, block_rows=32, activation="none", m=4096)  # doctest: +SKIP
    """
    def make(cfg: TileConfig) -> SparseLinear:
        return SparseLinear(weight, bias, kept, block_rows=block_rows, activation=activation, cache_dir=cache_dir,
                            tile=cfg, check=False)

    return search_tiles(kept, make, block_rows=block_rows, activation=activation, m=m, cache_dir=cache_dir,
                        repeats=repeats)
