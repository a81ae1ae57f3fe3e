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
packing, no transposing back. A (block, window) cell's steps share one x per row of M, so up to
CHUNK of them run with their vectors in registers and x loaded once; cells run in runs of equal
step counts, a loop with a body unrolled per count (`plan_steps`, `Steps`).

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
from typing import NamedTuple

import numpy as np
import torch

from sparta_explore.fake_quant import qmax
from sparta_explore.kernels.bsr_codegen import _ACTIVATIONS, _PRELUDE
from sparta_explore.kernels.build import build, cpu_flags
from sparta_explore.kernels.c_templates import c_fill, c_text
from sparta_explore.kernels.int8_codegen import quantize_rows
from sparta_explore.kernels.int8_linear import Int8SparseLinear
from sparta_explore.kernels.lowbit_codegen import offset_correction

NEEDS = frozenset({"avx512vbmi", "avx512_vnni"})  # /proc/cpuinfo flags of vpermb and vpdpbusd on 512 bits
ROWS, WINDOW, QUAD = 16, 64, 4  # rows per block (int32 lanes), k per window (bytes of one vector), k per lane
PERMUTE_EDGE = 2.8  # measured: where the permute and quad kernels cross on BERT shapes (Zen 5; see prefers_permute)


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


class Steps(NamedTuple):
    """A pattern's steps (`plan_steps`) and the runs the kernel walks them by."""

    k_bytes: np.ndarray  # (steps, 64) uint8: lane i's 4 k inside its cell's window
    w_bytes: np.ndarray  # (steps, 64) int8: lane i's 4 weights (0 where padding)
    windows: np.ndarray  # (cells,) int32: each non-empty (block, window) cell's window, in step order
    runs: np.ndarray  # (runs, 4) int64: steps per cell, cells, first step, first cell (in `windows`)
    block_runs: np.ndarray  # (blocks + 1,) int64: each block's first run


def plan_steps(wq: np.ndarray, kept: np.ndarray) -> Steps:
    """The steps of a pattern, lane i of a step holding row 16 b + i's kept weights r = 4 s .. 4 s + 3 of one
    window (k order), padding weight 0 at k 0. A (block, window) cell needs as many steps as its fullest row
    needs quads. Within a block, cells run by step count, most first (then by window; empty cells not at all):
    a run of cells with equal counts is one loop with a fixed body, so the loop exits are the only branches
    the CPU cannot predict (one per run, not one per cell).

    Example:
        >>> st = plan_steps(np.ones((2, 70), np.int8), np.ones((2, 70), bool))
        >>> st.windows.tolist(), st.runs.tolist(), st.block_runs.tolist()
        ([0, 1], [[16, 1, 0, 0], [2, 1, 16, 1]], [0, 2])
        >>> st.k_bytes[0, :8].tolist(), st.w_bytes[0, :8].tolist()
        ([0, 1, 2, 3, 0, 1, 2, 3], [1, 1, 1, 1, 1, 1, 1, 1])
    """
    n, k = kept.shape
    blocks, windows = -(-n // ROWS), max(1, -(-k // WINDOW))
    flat = np.flatnonzero(kept)  # row-major: by row, then k (one index array: 2-d nonzero is 3x slower)
    rows = flat // k
    cols = flat - rows * k
    window = cols // WINDOW
    cell = rows * windows + window  # (row, window), nondecreasing
    # kept per (row, window): each kept k's place among its row's in the window, and `block_steps` without a pass
    # over the mask (with the flat scatters below: 11-14 -> 7-9 ms a BERT-base FFN weight)
    per_cell = np.bincount(cell, minlength=n * windows)
    rank = np.arange(cell.size) - (np.cumsum(per_cell) - per_cell)[cell]
    fullest = np.zeros((blocks * ROWS, windows), dtype=np.int64)
    fullest[:n] = per_cell.reshape(n, windows)
    steps = -(-fullest.reshape(blocks, ROWS, windows).max(axis=1) // QUAD)
    cell_b, cell_w = np.nonzero(steps)
    count = steps[cell_b, cell_w]
    order = np.lexsort((cell_w, -count, cell_b))  # by block, then most steps first, then window
    cell_b, cell_w, count = cell_b[order], cell_w[order], count[order]
    first = np.concatenate([[0], np.cumsum(count)])  # each cell's first step, in run order
    first_of = np.zeros(blocks * windows, dtype=np.int64)
    first_of[cell_b * windows + cell_w] = first[:-1]
    total = int(first[-1])
    k_bytes = np.zeros((total, ROWS * QUAD), dtype=np.uint8)
    w_bytes = np.zeros((total, ROWS * QUAD), dtype=np.int8)
    step = first_of[(rows // ROWS) * windows + window] + rank // QUAD
    at = step * (ROWS * QUAD) + (rows % ROWS) * QUAD + rank % QUAD  # (step, lane) as one flat index
    k_bytes.reshape(-1)[at] = cols - window * WINDOW
    w_bytes.reshape(-1)[at] = np.take(wq.reshape(-1), flat)
    new_run = np.ones(count.size, dtype=bool)
    new_run[1:] = (cell_b[1:] != cell_b[:-1]) | (count[1:] != count[:-1])
    starts = np.flatnonzero(new_run)
    runs = np.stack([count[starts], np.diff(np.append(starts, count.size)), first[starts], starts], axis=1)
    block_runs = np.searchsorted(cell_b[starts], np.arange(blocks + 1))
    return Steps(k_bytes, w_bytes, cell_w.astype(np.int32), runs.astype(np.int64).reshape(-1, 4),
                 block_runs.astype(np.int64))


def prefers_permute(kept: np.ndarray) -> bool:
    """Whether the permute kernel beats the quad kernels on this pattern: its ops per 16 rows of M (a vpermb and
    a vpdpbusd per step and row of M) against the quad kernels' dots (one per non-empty quad), weighted by
    `PERMUTE_EDGE`. Measured on 90% unstructured BERT FFN shapes at M = 4096 (Zen 5, 2 threads): 768->3072
    4.8 vs 9.7 ms, 3072->768 6.0 vs 10.0 ms; 1x32 blocks fill their quads, and the quad kernels stay (768->3072
    1x32: quads 4.7 ms, permute 12.9 ms). The edge, since the permute kernel runs cells of steps (3072x768,
    M = 4096, 90% kept as blocks, permute against quads): 1x2 blocks 4.3 vs 9.1 ms (the pattern's ratio says
    permute from an edge of 2.28), 2x2 4.0 vs 8.2 (2.06), 1x2 at 70% 8.3 vs 11.5 (1.82), 32x32 and 16x16 2.5 vs
    3.2-3.3 (2.00; 768x3072 3.0 vs 3.2-3.6); 1x4 4.9 vs 4.8 (quads below 4.97), 1x4 at 70% 8.5 vs 8.0 (3.39),
    4x4 3.8 vs 3.7 (3.61), 1x8 5.8 vs 4.4 (6.32): 2.8 lies between (1.6 before, which kept 1x2, 2x2 and square
    blocks on the quad kernels).

    Example:
        >>> prefers_permute(np.random.default_rng(0).random((64, 256)) < 0.1)
        True
        >>> prefers_permute(np.repeat(np.random.default_rng(0).random((64, 8)) < 0.1, 32, axis=1))  # 1x32 blocks
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
    _fields_ = [(name, ctypes.c_void_p) for name in ("idx", "w", "windows", "runs", "block_runs", "corr", "ws",
                                                     "bias")]


def int8_kernel_for(kept: np.ndarray) -> type[Int8SparseLinear]:
    """The int8 linear kernel for this pattern here: the permute kernel where the CPU has it and
    `prefers_permute`, else the quad kernels (both compute `Int8SparseLinear.reference`).

    Example:
        >>> int8_kernel_for(np.repeat(np.eye(16, 2, dtype=bool), 32, axis=1)).__name__  # 1x32 blocks: quads
        'Int8SparseLinear'
    """
    return PermutedInt8Linear if has_permute() and prefers_permute(kept) else Int8SparseLinear


def _steps(n: int, at: int) -> str:
    """C of `n` consecutive steps (from s + `at`) of one cell: their vectors loaded once, then per row of M one
    load of x and `n` permute-and-dot pairs into that row's accumulator."""
    # xr: xw made opaque per chunk, or gcc hoists all 16 rows of x out of a run's loop and spills accumulators;
    # KEEP(x): x in a register, or gcc folds its load into each vpermb and loads it n times
    load = (" ".join(f"const VD I{j} = idx[s + {at + j}], V{j} = w[s + {at + j}];" for j in range(n))
            + ' const uint8_t *xr = xw; __asm__("" : "+r"(xr));')
    rows = [f"{{ VD x = vload64(xr + {t} * K_PAD); KEEP(x); "
            + " ".join(f"a{t} = vdot(a{t}, vperm(I{j}, x), V{j});" for j in range(n)) + " }" for t in range(ROWS)]
    return "{ " + "\n".join([load, *rows]) + " }"


CHUNK = 3  # steps whose vectors one chunk holds in registers
FIXED = 8  # cells of up to this many steps run a body unrolled for their count; more: chunks in a loop


def _chunks(count: int) -> list[int]:
    """`count` steps as chunks of at most CHUNK, as even as they come.

    Example:
        >>> _chunks(5), _chunks(8)
        ([3, 2], [3, 3, 2])
    """
    parts = -(-count // CHUNK)
    return [count // parts + (i < count % parts) for i in range(parts)]


def _run_cases() -> str:
    """C of the switch over a run's steps per cell: a loop over its cells with a body for that count."""
    cases = []
    for count in range(1, FIXED + 1):
        sizes = _chunks(count)
        body = "\n".join(_steps(size, sum(sizes[:i])) for i, size in enumerate(sizes))
        cases.append(f"""            case {count}:
                for (long j = 0; j < cells; ++j, s += {count}) {{
                    const uint8_t *xw = xq + (long)cw[j] * 64;
{body}
                }}
                break;""")
    return "\n".join(cases)


def _source(activation: str, act_bits: int, emulate: bool) -> str:
    acc = "        VD " + ", ".join(f"a{t} = {{0}}" for t in range(ROWS)) + ";"
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
    return c_fill("permute_int8.c", prelude=prelude, dot=dot, acc=acc, stores="\n".join(store), act=act,
                  has_act=int(bool(act)), cases=_run_cases(), chunk=CHUNK, steps_chunk=_steps(CHUNK, 0),
                  steps_one=_steps(1, 0))


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
        steps = plan_steps(wq, kept)
        # torch's allocator aligns to 64 bytes: one step is one aligned vector
        self._steps_k = torch.from_numpy(steps.k_bytes).clone()
        self._packed = torch.from_numpy(steps.w_bytes).clone()
        self._windows = torch.from_numpy(steps.windows).clone()
        self._runs = torch.from_numpy(steps.runs).clone()
        self._block_runs = torch.from_numpy(steps.block_runs).clone()
        self._corr = torch.from_numpy(offset_correction(wq))
        name = "permute_int8"
        self.built = build(_source(self.activation, self.act_bits, self.emulate_dot), name, cache_dir=cache_dir,
                           emulated=self.emulate_dot)
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
        return PermuteLayer(self._steps_k.data_ptr(), self._packed.data_ptr(), self._windows.data_ptr(),
                            self._runs.data_ptr(), self._block_runs.data_ptr(), self._corr.data_ptr(),
                            self.weight_scale.data_ptr(), bias)

    def _run(self, x2: torch.Tensor, y: torch.Tensor, rows: int | None = None,
             x_scales: torch.Tensor | None = None) -> None:
        self._fn(x2.data_ptr(), y.data_ptr(), x2.shape[0] if rows is None else rows, self.in_features,
                 self.out_features, ctypes.byref(self.layer()))
