"""int8 linears on scattered patterns with the weights in registers and the activations permuted.

The quad kernels (`int8_codegen`, `vnni_codegen`) multiply 4 consecutive k of one row per
int32 lane: at 90% unstructured sparsity a row's quad holds 1.2 kept weights on average, so
7 in 10 products are padding. Here (`templates/permute_int8.c`) a lane is one output row and
its 4 bytes are 4 of *that row's* kept k, anywhere in a window of 64: per block of 16 rows and
window, a step is a weight vector and a byte permutation (`vpermb`, AVX-512 VBMI) that gathers
each lane's 4 x values from the window's 64 bytes of one row of M, then `vpdpbusd` adds the 4
products into the lane. A block needs as many steps in a window as its fullest row needs
quads there (about half of the slots hold a kept weight at 90%, against 3 in 10 for quads).
Each row of M (16 per tile) has its own accumulator, so Y comes out row-major: no K-major
packing, no transposing back.

Activations are quantized per row of M and weights per output row exactly as `Int8SparseLinear`
does, so `reference` is its reference. `prefers_permute` says from the pattern alone whether
this kernel beats the quad kernels (it needs AVX-512 VBMI and VNNI; `emulate_dot=True` runs
exact portable C for tests on any CPU).

Example:
    >>> lin = PermutedInt8Linear(weight, bias, kept)  # doctest: +SKIP
    >>> lin.dot_path  # doctest: +SKIP
    'avx512_vbmi permute'
"""

from __future__ import annotations

import ctypes
import os

import numpy as np
import torch

from sparta_explore.fake_quant import qmax
from sparta_explore.kernels.bsr_codegen import _ACTIVATIONS, _PRELUDE
from sparta_explore.kernels.build import build, cpu_flags
from sparta_explore.kernels.c_templates import c_fill, c_text
from sparta_explore.kernels.int8_codegen import quantize_rows
from sparta_explore.kernels.lowbit_codegen import offset_correction
from sparta_explore.kernels.sparse_linear import Int8SparseLinear

NEEDS = frozenset({"avx512vbmi", "avx512_vnni"})  # /proc/cpuinfo flags of vpermb and vpdpbusd on 512 bits
ROWS, WINDOW, QUAD = 16, 64, 4  # rows per block (int32 lanes), k per window (bytes of one vector), k per lane
PERMUTE_EDGE = 1.6  # measured: a permute op costs 1/1.6 of a quad dot on BERT shapes (Zen 5; see prefers_permute)


def has_permute(flags: frozenset[str] | None = None) -> bool:
    """Whether the CPU (under the target ISA ceiling) runs the native permute kernel.

    Example:
        >>> has_permute(frozenset({"avx2"}))
        False
    """
    return (cpu_flags() if flags is None else flags) >= NEEDS


def block_steps(kept: np.ndarray) -> np.ndarray:
    """Steps per (block of 16 rows, window of 64 k): the quads the block's fullest row needs in that window.

    Example:
        >>> block_steps(np.ones((3, 70), bool)).tolist()
        [[16, 2]]
    """
    n, k = kept.shape
    windows = max(1, -(-k // WINDOW))
    pad = np.zeros((-(-n // ROWS) * ROWS, windows * WINDOW), dtype=bool)
    pad[:n, :k] = kept
    return -(-pad.reshape(-1, ROWS, windows, WINDOW).sum(axis=3).max(axis=1) // QUAD)


def plan_steps(wq: np.ndarray, kept: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The steps of a pattern: (k bytes, weight bytes) as (steps, 64) uint8 / int8, each step's window (int32)
    and each block's first step (int64, blocks + 1). Step order: block, window, quad; lane i of a step holds
    row 16 b + i's kept weights r = 4 s .. 4 s + 3 of that window (k order), padding weight 0 at k 0.

    Example:
        >>> k, w, win, ptr = plan_steps(np.ones((2, 3), np.int8), np.ones((2, 3), bool))
        >>> ptr.tolist(), win.tolist(), k[0, :8].tolist(), w[0, :8].tolist()
        ([0, 1], [0], [0, 1, 2, 0, 0, 1, 2, 0], [1, 1, 1, 0, 1, 1, 1, 0])
    """
    n, k = kept.shape
    blocks, windows = -(-n // ROWS), max(1, -(-k // WINDOW))
    flat = np.flatnonzero(kept)  # row-major: by row, then k (one index array: 2-d nonzero is 3x slower)
    rows, cols = flat // k, flat % k
    window = cols // WINDOW
    cell = rows * windows + window  # (row, window), nondecreasing
    index = np.arange(cell.size)
    opens = np.ones(cell.size, dtype=bool)  # where a new (row, window) starts
    opens[1:] = cell[1:] != cell[:-1]
    rank = index - np.maximum.accumulate(np.where(opens, index, 0))  # place among its row's kept k in the window
    steps = block_steps(kept)
    first = np.concatenate([[0], np.cumsum(steps.reshape(-1))])  # first step of each (block, window)
    total = int(first[-1])
    k_bytes = np.zeros((total, ROWS * QUAD), dtype=np.uint8)
    w_bytes = np.zeros((total, ROWS * QUAD), dtype=np.int8)
    step = first[(rows // ROWS) * windows + window] + rank // QUAD
    lane = (rows % ROWS) * QUAD + rank % QUAD
    k_bytes[step, lane] = cols % WINDOW
    w_bytes[step, lane] = wq[rows, cols]
    win = np.repeat(np.tile(np.arange(windows, dtype=np.int32), blocks), steps.reshape(-1))
    return k_bytes, w_bytes, win, first[::windows].astype(np.int64)


def prefers_permute(kept: np.ndarray) -> bool:
    """Whether the permute kernel beats the quad kernels on this pattern: its ops per 16 rows of M (a vpermb and
    a vpdpbusd per step and row of M) against the quad kernels' dots (one per non-empty quad), weighted by
    `PERMUTE_EDGE`. Measured on 90% unstructured BERT FFN shapes at M = 4096 (Zen 5, 2 threads): 768->3072
    4.8 vs 9.7 ms, 3072->768 6.0 vs 10.0 ms; 1x32 and 32x32 blocks fill their quads, and the quad kernels stay
    (768->3072 1x32: quads 4.7 ms, permute 12.9 ms).

    Example:
        >>> prefers_permute(np.random.default_rng(0).random((64, 256)) < 0.1)
        True
        >>> prefers_permute(np.ones((64, 256), bool))
        False
    """
    return 2 * ROWS * int(block_steps(kept).sum()) < PERMUTE_EDGE * live_quads(kept)


def live_quads(kept: np.ndarray) -> int:
    """How many (row, 4 consecutive k) quads hold a kept weight: each quad's 4 bools read as one uint32 (a numpy
    `any` over an axis of 4 took 8 of a BERT FFN op's 9 ms here).

    Example:
        >>> live_quads(np.eye(3, 6, k=2, dtype=bool))  # (0, 2) in quad 0; (1, 3), (2, 4) in quads 0 and 1
        3
    """
    n, k = kept.shape
    pad = np.zeros((n, -(-k // QUAD) * QUAD), dtype=np.uint8)
    pad[:, :k] = kept
    return int(np.count_nonzero(pad.view(np.uint32)))


class PermuteLayer(ctypes.Structure):  # `struct permute_layer` of templates/permute_int8.c
    _fields_ = [(name, ctypes.c_void_p) for name in ("idx", "w", "win", "s_ptr", "corr", "ws", "bias")]


def int8_kernel_for(kept: np.ndarray) -> type[Int8SparseLinear]:
    """The int8 linear kernel for this pattern here: the permute kernel where the CPU has it and
    `prefers_permute`, else the quad kernels (both compute `Int8SparseLinear.reference`).

    Example:
        >>> int8_kernel_for(np.ones((16, 64), bool)).__name__
        'Int8SparseLinear'
    """
    return PermutedInt8Linear if has_permute() and prefers_permute(kept) else Int8SparseLinear


def _source(activation: str, act_bits: int, emulate: bool) -> str:
    acc = "        VD " + ", ".join(f"a{t} = {{0}}" for t in range(ROWS)) + ";"
    dots = "\n".join(f"            a{t} = vdot(a{t}, vperm(I, vload64(xw + {t} * K_PAD)), V);" for t in range(ROWS))
    store = []
    for t in range(ROWS):
        store.append(f"""        if ({t} < mt) {{
            const vf v = __builtin_convertvector(a{t} - cv, vf) * sx[{t}] * wsv + bv;
            float *dst = Y + (m0 + {t}) * N + n0;
            if (nn == 16) memcpy(dst, &v, sizeof v); else for (long i = 0; i < nn; ++i) dst[i] = v[i];
        }}""")
    prelude = "#define QMAX " + f"{qmax(act_bits)}.0f\n" + _PRELUDE
    dot = c_text("permute_dot_emulated.c" if emulate else "permute_dot_native.c")
    act = "" if activation == "none" else _ACTIVATIONS[activation]
    return c_fill("permute_int8.c", prelude=prelude, dot=dot, acc=acc, dots=dots, stores="\n".join(store), act=act,
                  has_act=int(bool(act)))


class PermutedInt8Linear(Int8SparseLinear):
    """`Int8SparseLinear`'s computation by the permute kernel (see the module docstring), for scattered patterns.

    Same arguments and `reference`; `dot` is ignored (the kernel is VBMI + VNNI or, with
    `emulate_dot=True`, their exact portable C). Not a quad kernel: no K-major tile (`_tile` is its
    16 rows of M per tile); two of them chain as `fused_ffn.FusedPermutePair`.

    Example:
        >>> lin = PermutedInt8Linear(torch.randn(32, 64), None, torch.rand(32, 64) < 0.1)  # doctest: +SKIP
        >>> torch.allclose(lin(x), lin.reference(x), atol=1e-4)  # doctest: +SKIP
        True
    """

    @property
    def dot_path(self) -> str:
        if self.fallback_reason is not None:
            return "reference"
        return "avx512_vbmi permute" + (" (emulated)" if self.emulate_dot else "")

    def _build(self, kept: np.ndarray, block_rows: int, cache_dir: str | os.PathLike | None) -> None:
        if not (self.emulate_dot or has_permute()):
            raise ValueError(f"the permute kernel needs {' and '.join(sorted(NEEDS))} (this CPU: "
                             f"{' '.join(sorted(f for f in cpu_flags() if f.startswith('avx512'))) or 'none of them'})")
        weight = self.weight.numpy()
        wq, scale = quantize_rows(weight, kept, self.weight_bits)
        self.register_buffer("weight_q", torch.from_numpy(wq))
        self.register_buffer("weight_scale", torch.from_numpy(scale))
        k_bytes, w_bytes, win, first = plan_steps(wq, kept)
        # torch's allocator aligns to 64 bytes: one step is one aligned vector
        self._steps_k = torch.from_numpy(k_bytes).clone()
        self._packed = torch.from_numpy(w_bytes).clone()
        self._win = torch.from_numpy(win).clone()
        self._first = torch.from_numpy(first).clone()
        self._corr = torch.from_numpy(offset_correction(wq))
        name = "permute_int8"
        self.built = build(_source(self.activation, self.act_bits, self.emulate_dot), name, cache_dir=cache_dir)
        self._tile = ROWS
        self._keep_tables(None)
        self._bind(self.built.lib)
        self.variant = "permute"

    def rebuilt(self, cache_dir: str | os.PathLike | None = None, **changes: object) -> Int8SparseLinear:
        """Built again for this machine: the permute kernel where it runs, else the quad kernel (same result).

        Example:
            >>> type(lin.rebuilt()).__name__  # doctest: +SKIP
            'PermutedInt8Linear'
        """
        if self.emulate_dot or has_permute():
            return super().rebuilt(cache_dir, **changes)
        args, kwargs = self._arguments(cache_dir)
        op = Int8SparseLinear(*args, **{**kwargs, **changes})
        op.label = self.label
        return op

    def _bind(self, lib: ctypes.CDLL) -> None:
        fn = lib.permute_int8
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_long] * 3 + [ctypes.POINTER(PermuteLayer)]
        self._fn = fn

    def layer(self) -> PermuteLayer:
        """The C struct of this op's tables (made per call: the tensors may move between calls, e.g. on a copy).

        Example:
            >>> lin.layer().idx == lin._steps_k.data_ptr()  # doctest: +SKIP
            True
        """
        bias = None if self.bias is None else self.bias.data_ptr()
        return PermuteLayer(self._steps_k.data_ptr(), self._packed.data_ptr(), self._win.data_ptr(),
                            self._first.data_ptr(), self._corr.data_ptr(), self.weight_scale.data_ptr(), bias)

    def _run(self, x2: torch.Tensor, y: torch.Tensor, rows: int | None = None,
             x_scales: torch.Tensor | None = None) -> None:
        self._fn(x2.data_ptr(), y.data_ptr(), x2.shape[0] if rows is None else rows, self.in_features,
                 self.out_features, ctypes.byref(self.layer()))
