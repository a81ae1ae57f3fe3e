"""The compiled decode step's library: C structs for packed weights and a Llama's layers, and the one-row GEMV.

`templates/decode_rows.c` (the products) and `templates/decode_step.c` (the layer) run one
token of a Llama-pattern model for up to `MAX_BATCH` sequences in one call (`decode_step`); the
weight-times-rows product is exposed on its own too (`gemv`): the kernel for small row counts,
M = 1 .. 8, in every layout of `packed_weights.py`. The structs here point into tensors the
caller keeps alive (`Mat` holds raw pointers); `mat_of` builds one from a `PackedWeight` and
returns what must be kept.

Example:
    >>> w = pack_weight(torch.randn(64, 96))                            # doctest: +SKIP
    >>> torch.allclose(gemv(w, torch.ones(1, 96)), torch.ones(1, 96) @ w.dequantize().T, atol=1e-4)  # doctest: +SKIP
    True
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence

import torch

from sparta_explore.kernels.build import BuiltLibrary, build, cpu_flags, target_isa
from sparta_explore.kernels.c_templates import c_text
from sparta_explore.kernels.packed_weights import TILE, PackedWeight, converts_halves

MAX_BATCH = 8  # sequences (rows) one call decodes; the C file's MAX_BATCH
RUN = 32  # columns per int8 activation grid; the C file's QBLOCK
FMT_CODES = {"f32": 0, "u8": 1, "u4": 2, "s32": 9}  # decode_rows.c's F32, U8, U4, S32
TILE_CODES = {"u8": 5, "u4": 6}  # X8, X4: the codes in tiles of TILE rows
HALF_CODES = {1: 4, 2: 3, 5: 7, 6: 8}  # a layout's code -> the same with float16 grids (U8H, U4H, X8H, X4H)
NEEDS = ("avx2", "fma")
_ptr = ctypes.c_void_p


class Mat(ctypes.Structure):
    _fields_ = [("fmt", ctypes.c_int32), ("n", ctypes.c_int32), ("k", ctypes.c_int32), ("group", ctypes.c_int32),
                ("w", _ptr), ("codes", _ptr), ("grid", _ptr), ("bias", _ptr)]


class Layer(ctypes.Structure):
    _fields_ = [(name, Mat) for name in ("q", "k", "v", "o", "gate", "up", "down")] + [
        ("ln1", _ptr), ("ln2", _ptr), ("kcache", _ptr), ("vcache", _ptr)]


class Model(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int32) for name in ("layers", "hidden", "heads", "kv_heads", "head_dim", "inter",
                                                     "vocab", "max_len", "batch", "threads", "act_q")] + [
        ("eps", ctypes.c_float), ("attn_scale", ctypes.c_float), ("embed", _ptr), ("norm", _ptr), ("head", Mat),
        ("cos", _ptr), ("sin", _ptr), ("layer", ctypes.POINTER(Layer)), ("scratch", _ptr)]


def why_no_kernels() -> str | None:
    """Why this CPU cannot run the decode kernels (they need AVX2 and FMA), or None.

    Example:
        >>> why_no_kernels() is None or "AVX2" in why_no_kernels()
        True
    """
    missing = [f for f in NEEDS if f not in cpu_flags()]
    return f"the decode kernels need AVX2 and FMA; this CPU lacks {', '.join(missing)}" if missing else None


def library() -> BuiltLibrary:
    """The decode step's library for the target instruction set (`set_target_isa`), built once per process and
    ceiling (cached on disk by content hash)."""
    return _library(target_isa())


@functools.cache
def _library(isa: str) -> BuiltLibrary:  # `isa` keys the process cache; `build` reads the ceiling's flags itself
    built = build(c_text("decode_rows.c") + c_text("decode_prefill.c") + c_text("decode_step.c")
                  + c_text("decode_prompt.c"), "decode_step")
    lib = built.lib
    lib.decode_step.argtypes = [ctypes.POINTER(Model), _ptr, ctypes.c_int, ctypes.c_int, _ptr]
    lib.decode_step.restype = None
    lib.gemv.argtypes = [ctypes.POINTER(Mat), _ptr, ctypes.c_int, _ptr, ctypes.c_int, ctypes.c_int, ctypes.c_float,
                         _ptr]
    lib.gemv.restype = None
    lib.act_floats.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.act_floats.restype = ctypes.c_long
    lib.prefill.argtypes = [ctypes.POINTER(ctypes.POINTER(Mat)), ctypes.c_int, _ptr, ctypes.c_int,
                            ctypes.POINTER(_ptr), ctypes.c_int, _ptr]
    lib.prefill.restype = None
    lib.prefill_floats.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.prefill_floats.restype = ctypes.c_long
    lib.scratch_floats.argtypes = [ctypes.c_int] * 8
    lib.scratch_floats.restype = ctypes.c_long
    lib.prompt_step.argtypes = [ctypes.POINTER(Model), _ptr, ctypes.c_int, ctypes.c_int, _ptr, ctypes.c_int, _ptr]
    lib.prompt_step.restype = None
    lib.prompt_floats.argtypes = [ctypes.c_int] * 8
    lib.prompt_floats.restype = ctypes.c_long
    return built


def _address(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _tile_grids(scale: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    # per tile: its groups' TILE scales, then its groups' TILE offsets (zero for padded rows)
    n, groups = scale.shape
    both = torch.zeros(-(-n // TILE) * TILE, 2, groups, dtype=scale.dtype)
    both[:n, 0], both[:n, 1] = scale, offset
    return both.reshape(-1, TILE, 2, groups).permute(0, 2, 3, 1).contiguous()


def mat_of(packed: PackedWeight, bias: torch.Tensor | None = None, tiles: bool = False
           ) -> tuple[Mat, tuple[torch.Tensor, ...]]:
    """The C view of `packed` (with `bias`), and the tensors it points into (keep them alive with it). `tiles`:
    codes in tiles of `TILE` rows (`PackedWeight.to_tiles`), the layout int8 activations run fastest on (and only
    they: the float kernels read rows); a weight without codes or whole 32-column runs keeps its rows. `packed`
    in the other layout is converted (pass it in the layout asked for to convert nothing).

    Example:
        >>> mat, keep = mat_of(pack_weight(torch.ones(2, 8)))    # doctest: +SKIP
    """
    bias = None if bias is None else bias.detach().float().contiguous()
    f32 = not packed.has_codes
    grid, code, data = None, FMT_CODES[packed.fmt], packed.data
    if packed.fmt == "s32":  # kept values, mask bytes and row starts (decode_rows.c's S32)
        keep = tuple(t for t in (data, packed.mask, packed.starts, bias) if t is not None)
        return Mat(code, packed.n, packed.k, packed.k, _address(data), _address(packed.mask), _address(packed.starts),
                   _address(bias)), keep
    if not f32:
        scale, offset = packed.scale.float(), packed.offset.float()
        if packed.fmt == "u8":  # u8 codes are stored as code - 128: the offset takes the 128 back
            offset = offset + 128 * scale
        tiles = tiles and packed.can_tile
        packed = packed.to_tiles() if tiles else packed.to_rows()
        data, code = packed.data, (TILE_CODES if tiles else FMT_CODES)[packed.fmt]
        grid = _tile_grids(scale, offset) if tiles else torch.cat([scale, offset], dim=1).contiguous()
        half = grid.half()
        # float16 where the grids are (and the 128 moved into the offset kept them so) and the CPU converts
        if packed.half_grids and converts_halves() and torch.equal(half.float(), grid):
            grid, code = half, HALF_CODES[code]
    keep = tuple(t for t in (data, grid, bias) if t is not None)
    mat = Mat(code, packed.n, packed.k, packed.group, _address(data) if f32 else None,
              None if f32 else _address(data), _address(grid), _address(bias))
    return mat, keep


def gemv(packed: PackedWeight, x: torch.Tensor, bias: torch.Tensor | None = None, threads: int | None = None,
         act_bits: int = 32, run: int = RUN) -> torch.Tensor:
    """`x @ W^T + bias` for the rows of `x` (M, k), M <= MAX_BATCH per call (more rows run in chunks).

    `act_bits` 2..8 rounds `x` first to a symmetric grid per `run` columns (`fake_quantize_runs`; `run=k`:
    per row, `fake_quantize_rows`) and runs the int8 kernels; `run` is a multiple of 32 dividing k.

    Example:
        >>> gemv(pack_weight(torch.eye(8)), torch.arange(8.0)[None]).tolist()   # doctest: +SKIP
        [[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]]
    """
    if x.dim() != 2 or x.shape[1] != packed.k:
        raise ValueError(f"gemv: expected an (M, {packed.k}) input, got {tuple(x.shape)}")
    rounds = act_bits != 32
    if rounds and (act_bits not in range(2, 9) or run <= 0 or run % RUN or packed.k % run):
        raise ValueError(f"gemv: act_bits is 32, or 2..8 with a run of a multiple of {RUN} columns dividing the "
                         f"row; got {act_bits} bits in runs of {run} for {packed.k} columns")
    x = x.detach().float().contiguous()
    out = torch.empty(x.shape[0], packed.n, dtype=torch.float32)
    mat, _keep = mat_of(packed, bias, tiles=rounds)
    lib = library().lib
    threads = threads or torch.get_num_threads()
    scratch = torch.empty(lib.act_floats(MAX_BATCH, packed.k), dtype=torch.float32)
    for start in range(0, x.shape[0], MAX_BATCH):
        rows = min(MAX_BATCH, x.shape[0] - start)
        lib.gemv(ctypes.byref(mat), x[start].data_ptr(), rows, out[start].data_ptr(), threads, run if rounds else 0,
                 float(2 ** (act_bits - 1) - 1), scratch.data_ptr())
    return out


def prefill_products(mats: Sequence[Mat], x: torch.Tensor, threads: int | None = None) -> list[torch.Tensor]:
    """`x` (M, k) rounded per `RUN` columns to int8, as the decode step rounds a projection's input, times each
    weight of `mats` (all k columns wide): one (M, n) product each, any M (`templates/decode_prefill.c`: the
    prompt's matrix products; the mats must outlive the call, as `mat_of`'s kept tensors must).

    Example:
        >>> mat, keep = mat_of(pack_weight(w_on_8bit_grid), tiles=True)     # doctest: +SKIP
        >>> y, = prefill_products([mat], torch.randn(128, w_on_8bit_grid.shape[1]))   # doctest: +SKIP
    """
    if not mats:
        raise ValueError("prefill_products: no weights given")
    widths = {m.k for m in mats}
    if x.dim() != 2 or widths != {x.shape[1]} or x.shape[1] % RUN:
        raise ValueError(f"prefill_products: expected an (M, k) input with k a multiple of {RUN} and the weights' "
                         f"width {sorted(widths)}, got {tuple(x.shape)}")
    lib = library().lib
    x = x.detach().float().contiguous()
    rows, k = x.shape
    outs = [torch.empty(rows, m.n, dtype=torch.float32) for m in mats]
    if rows == 0:
        return outs
    scratch = torch.empty(lib.prefill_floats(rows, k), dtype=torch.float32)
    pointers = (ctypes.POINTER(Mat) * len(mats))(*(ctypes.pointer(m) for m in mats))
    ys = (_ptr * len(mats))(*(o.data_ptr() for o in outs))
    lib.prefill(pointers, len(mats), x.data_ptr(), rows, ys, threads or torch.get_num_threads(), scratch.data_ptr())
    return outs
