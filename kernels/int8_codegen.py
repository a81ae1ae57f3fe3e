"""C source generation for pattern-specialized int8 sparse (and dense) linear kernels.

Same plan as the fp32 kernels (row groups, k segments baked as constant arrays, each
thread packs a tile of X), with integer arithmetic:

* activations are quantized per row (per token) while packing: scale = max|x| / 127,
  q = round-half-even(x / scale) in [-127, 127], stored as int16 with k pairs interleaved;
* weights are int8 per output row (scale = max|w| / 127), packed as (w[2p], w[2p+1]) int16
  pairs so one `vpmaddwd` multiplies 8 rows of X by a broadcast weight pair: 16 exact
  multiply-adds into int32 (no saturation, unlike u8 x s8 `vpmaddubsw`);
* the epilogue dequantizes (acc * x_scale[m] * w_scale[n]), adds the bias and applies the
  activation in fp32. AVX2 intrinsics: runs on every x86-64 machine of this project.

Narrow weight grids (a calibrated 4-bit weight) take the u8 x s8 variant instead
(lowbit_codegen.py): same result, twice the products per multiply instruction. CPUs with
VNNI take the `vpdpbusd` variant (vnni_codegen.py) for any 8-bit grid: same layout as u8,
products summed straight into int32, up to 64 per instruction.
"""

from __future__ import annotations

import math

import numpy as np

from sparta_explore.fake_quant import qmax
from sparta_explore.kernels.act_rows import act_rows_wide
from sparta_explore.kernels.bsr_codegen import (
    _ACTIVATIONS,
    _PRELUDE,
    ROWS_IO,
    UNPACK_TILE,
    KernelIO,
    V,
    _vectors,
    entry_loop,
    entry_tables,
    finish_tile,
    pattern_tables,
)
from sparta_explore.kernels.c_templates import c_fill, c_text
from sparta_explore.kernels.groups import (
    R_MAX,
    SHORT_SEGMENTS,
    Groups,
    align_segments,
    plan_groups,
    unit_segments,
    word_index,
)
from sparta_explore.kernels.lowbit_codegen import ROWS, U8_PACK, VECTORS, accumulate_steps, u8_tile
from sparta_explore.kernels.panels import cut_panels, l1_budget, panel_rows
from sparta_explore.kernels.pattern_data import KernelSource
from sparta_explore.kernels.qtile import int32_slot, qtile
from sparta_explore.kernels.vnni_codegen import DotMode, vnni_prelude, vnni_tile


def even_segments(groups: Groups) -> Groups:
    """Segments widened to start and end on even k (the extra k carries a zero weight)."""
    return align_segments(groups, 2)


def quantize_rows(weight: np.ndarray, kept: np.ndarray, bits: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per output row over the kept weights at `bits` <= 8: (int8 levels, float32 scales).

    Example:
        >>> q, s = quantize_rows(np.array([[2.0, -1.0, 9.0]]), np.array([[True, True, False]]))
        >>> q.tolist(), s.tolist()
        ([[127, -64, 0]], [0.015748031437397003])
    """
    level = np.float32(qmax(bits))
    n, k = weight.shape
    q = np.empty((n, k), dtype=np.int8)
    scale = np.empty(n, dtype=np.float32)
    # by blocks of rows, through one small buffer: whole-matrix temporaries were fresh pages (a BERT 3072 x 768
    # weight with fresh memory: 10 -> 4.4 ms); pruned weights are zeroed as bits (an AND with 0 or all ones: exact
    # for any value; `compact.zero_where_`'s AND, here on this loop's own buffers: calling it per block made its
    # operand anew each time, 6-8 ms)
    step = max(1, QUANT_BLOCK // max(k, 1))
    w = np.empty((min(step, n), k), dtype=np.float32)
    keep = np.empty((min(step, n), k), dtype=np.int32)
    for r0 in range(0, n, step):
        rows = slice(r0, min(r0 + step, n))
        wb, kb = w[: rows.stop - r0], keep[: rows.stop - r0]
        np.copyto(wb, weight[rows], casting="unsafe")
        np.negative(np.asarray(kept[rows], dtype=bool).view(np.uint8), out=kb, dtype=np.int32)
        np.bitwise_and(wb.view(np.int32), kb, out=wb.view(np.int32))
        amax = np.abs(wb).max(axis=1) if k else np.zeros(len(wb), dtype=np.float32)
        sb = np.where(amax > 0, amax / level, np.float32(1.0)).astype(np.float32)
        scale[rows] = sb
        np.divide(wb, sb[:, None], out=wb)
        np.clip(np.rint(wb, out=wb), -level, level, out=wb)
        q[rows] = wb
    return q, scale


QUANT_BLOCK = 1 << 16  # weights per block of rows: 256 KB of float32 and of int32, in L2


def pack_pairs(wq: np.ndarray, groups: Groups) -> np.ndarray:
    """int8 weights in kernel order: per group, per k pair, per row, (w[2p], w[2p+1]) as one int32."""
    n, k = wq.shape
    wpad = np.zeros((n, k + 1), dtype=np.int32)
    wpad[:, :k] = wq
    rows, ks = word_index(groups, 2)  # segments are whole pairs (align_segments)
    if not rows.size:
        return np.zeros(1, dtype=np.int32)
    return ((wpad[rows, ks] & 0xFFFF) | (wpad[rows, ks + 1] << 16)).astype(np.int32)  # little endian: k even low


def _load_i32(i: int, j: int) -> str:
    return f"_mm256_loadu_si256((const __m256i *)({int32_slot(i, f'{j} * 8')}))"


def _store_i32(i: int, j: int, value: str) -> str:
    return f"_mm256_storeu_si256((__m256i *)({int32_slot(i, f'{j} * 8')}), {value});"


def _tile(r: int, act: str) -> str:
    v = _vectors(r)  # int8 kernels use the default tiling
    acc = " ".join(f"__m256i a{i}{j} = first ? _mm256_setzero_si256() : {_load_i32(i, j)};"
                   for i in range(r) for j in range(v))
    spill = " ".join(_store_i32(i, j, f"a{i}{j}") for i in range(r) for j in range(v))
    loads = " ".join(f"const __m256i x{j} = _mm256_loadu_si256((const __m256i *)(x + {j} * 16));" for j in range(v))
    bcast = " ".join(f"const __m256i w{i} = _mm256_set1_epi32(w[{i}]);" for i in range(r))
    madds = " ".join(f"a{i}{j} = _mm256_add_epi32(a{i}{j}, _mm256_madd_epi16(x{j}, w{i}));"
                     for i in range(r) for j in range(v))
    stores = []
    for i in range(r):
        for j in range(v):
            stores.append(f"{{ vf v = (vf)_mm256_cvtepi32_ps(a{i}{j}) * LD(sx + t + {j} * 8) * ws[n0 + {i}]"
                          f" + bias_of(bias, n0 + {i}); {_ACTIVATIONS[act]} "
                          f"ST(yb + (n0 + {i}) * TILE + t + {j} * 8, v); }}")
    return qtile(r, "int16_t", 2, acc=acc, body=f"{loads}\n            {bcast}\n            {madds}",
                 stores=" ".join(stores), spill=spill, head="    (void)corr;\n")


ROW_SCALE = c_text("row_scale.c")

I16_PACK = c_text("pack_tile_int16.c")


U8_COST = 0.75  # time per padded product of the u8 variant over the int16 one (BERT FFN shapes, Zen 3)


def _work(groups: Groups) -> int:
    owner = np.repeat(np.arange(len(groups.row0)), np.diff(groups.seg_ptr))
    return int((groups.seg_len * groups.rows[owner]).sum()) if len(owner) else 0


# Cost of one packed word's loop step (address, weight broadcast, loads), in padded products of
# one row: on scattered patterns the kernels are bound by steps, not products (Zen 5, 3072 x 768,
# M = 4096, 90% unstructured: 65 quads per row ran in 18.0 ms, 73 pairs in 20.1 ms although the
# quads hold 1.8x the padded products).
STEP_COST = 4.0
# int8 groups whose segments mostly share one length keep their inner loop even when short (1x8 blocks at 90%:
# runs of 2 quads, 90% of them; one-word loops there cost 5-10%, without split sums to win it back like fp32's)
UNIFORM_RUNS = 0.8
# Activations the 16-lane VNNI kernels apply in a separate pass of 16-float vectors instead of in
# each 8-float store: exact GELU in the stores cost 8.2 ms at 768->3072, M = 4096 (the fp32
# kernel's 16-float GELU: 2.5-3.5 ms); ReLU is one compare either way.
WIDE_ACTIVATIONS = frozenset({"gelu", "silu"})  # exp-heavy: worth a 16-float pass


def tile_rows_for(variant: str, dot: DotMode | None) -> int:
    """Rows of M per work item: 48, or what one VNNI tile covers when that is more (a multiple of 48).

    Example:
        >>> tile_rows_for("int16", None)
        48
    """
    base = 2 * V * 8
    if variant != "vnni" or dot is None:
        return base
    widest = max(dot.vectors_for(1), dot.vectors) * dot.lanes
    return -(-widest // base) * base


def panel_k_for(variant: str, dot: DotMode | None, groups: Groups, n_in: int) -> int:
    """k per K panel (0: none): scattered patterns keep their panel of packed X in L1.

    A scattered row loads one x vector per quad it touches and reuses it for one product
    only, so where X's tile outgrows L1 every load comes from L2. Block patterns reuse each
    load across their rows and lose more to the spills between panels.

    Example:
        >>> g = unit_segments(align_segments(plan_groups(np.eye(8, 4096, dtype=bool), 1), 4), 4)
        >>> panel_k_for("vnni", None, g, 4096) == panel_rows(48, 4)  # 48 bytes of packed X per k
        True
    """
    word = 2 if variant == "int16" else 4
    x_bytes = tile_rows_for(variant, dot) * (2 if variant == "int16" else 1)  # packed X per k
    if not scattered(groups, word) or n_in * x_bytes <= l1_budget():
        return 0
    return panel_rows(x_bytes, word)


def _score(groups: Groups, unit: int, cost: float) -> float:
    """Predicted time: padded products x the variant's cost, plus loop steps (words per group)."""
    return _work(groups) * cost + STEP_COST * int(groups.seg_len.sum()) / unit


def prepare_groups(kept: np.ndarray, block_rows: int, weight_bits: int, act_bits: int,
                   dot: DotMode | None = None, one_word: bool = False) -> tuple[Groups, str]:
    """Row groups aligned to the packed words of the fastest variant, and its name.

    "int16" (k pairs, `vpmaddwd`) always works; "vnni" (k quads, `vpdpbusd`) when a dot mode
    is given; "u8" (k quads, `vpmaddubsw`) for narrow weight grids without VNNI. The quad
    variants pad segments to k quads; on scattered patterns that padding costs more than
    their faster multiplies gain, so the padded work times each variant's cost decides.
    `one_word` gives every group one piece per word (for kernel I/O whose words are not
    evenly spaced in k, e.g. a convolution's shifted windows).

    Example:
        >>> prepare_groups(np.ones((8, 64), dtype=bool), 8, weight_bits=4, act_bits=8)[1]
        'u8'
    """
    short = math.inf if one_word else SHORT_SEGMENTS
    uniform = None if one_word else UNIFORM_RUNS
    pairs = unit_segments(align_segments(plan_groups(kept, block_rows, R_MAX), 2), 2, short, uniform)
    if dot is not None:
        rows, cost, variant = dot.rows, dot.cost, "vnni"
    elif accumulate_steps(weight_bits, act_bits) >= 2:
        rows, cost, variant = ROWS, U8_COST, "u8"
    else:
        return pairs, "int16"
    quads = unit_segments(align_segments(plan_groups(kept, block_rows, rows), 4), 4, short, uniform)
    if _score(quads, 4, cost) < _score(pairs, 2, 1.0):
        return quads, variant
    return pairs, "int16"


def scattered(groups: Groups, unit: int) -> bool:
    """True when most loop steps are single words (unstructured-like): wide one-row tiles pay there.

    Example:
        >>> scattered(unit_segments(align_segments(plan_groups(np.eye(8, dtype=bool), 1), 4), 4), 4)
        True
    """
    return len(groups.seg_len) > 0 and float((groups.seg_len == unit).mean()) > 0.8


def generate_int8_source(groups: Groups, n_out: int, n_in: int, act: str, name: str, act_bits: int = 8,
                         weight_bits: int = 8, variant: str = "int16", dot: DotMode | None = None,
                         emulate: bool = False, panel_k: int = 0, io: KernelIO | None = None,
                         as_data: bool = False) -> KernelSource:
    """C source of `void {name}(X, Y, M, W, corr, w_scale, bias, xs, P)`: fp32 in and out, int8 inside.

    Activations are quantized on the symmetric `act_bits` grid (see sparta_explore.fake_quant).
    `variant` is what `prepare_groups` chose for these groups: "int16", "u8" (only for grids
    with `accumulate_steps` >= 2) or "vnni" (with `dot`, portable C when `emulate`); the
    quad variants need `corr` (lowbit_codegen.offset_correction). `panel_k` > 0 cuts K into
    panels of that many k (a multiple of the packed word; see `panel_k_for`). `io` replaces the
    row-major packing (quantized per row) and writing: e.g. a convolution's (`conv_geometry.py`).
    `as_data`: the pattern's tables come at run time through `P` (kernels/pattern_data.py), so the
    source holds no pattern (one build per shape class).
    """
    level = f"{qmax(act_bits)}.0f"
    tables, chunk_g0 = pattern_tables(groups, n_out, act)
    steps = accumulate_steps(weight_bits, act_bits)
    extra, finish = "", finish_tile(act)
    if variant == "u8":
        if steps < 2:
            raise ValueError(f"{weight_bits}-bit weights x {act_bits}-bit activations can overflow int16: "
                             "no u8 variant")
        elem, k_group, pack = "uint8_t", 4, U8_PACK
        tiles = "".join(u8_tile(r, act, steps) for r in range(1, ROWS + 1))
        rows_per_call = {r: VECTORS * 8 for r in range(1, ROWS + 1)}
    elif variant == "vnni":
        if dot is None:
            raise ValueError("the vnni variant needs a dot mode")
        elem, k_group, pack = "uint8_t", 4, U8_PACK
        extra = vnni_prelude(dot, emulate)
        if dot.lanes == 16 and act in WIDE_ACTIVATIONS:  # the activation as a 16-float pass over the rows
            extra += act_rows_wide(act)
            finish = finish_tile("none", before_unpack="            act_rows(yb, C_N0[c0], C_N1[c1 - 1]);\n")
            act = "none"
        tiles = "".join(vnni_tile(r, act, dot) for r in range(1, dot.rows + 1))
        rows_per_call = {r: dot.vectors_for(r) * dot.lanes for r in range(1, dot.rows + 1)}
    elif variant == "int16":
        elem, k_group, pack = "int16_t", 2, I16_PACK
        tiles = "".join(_tile(r, act) for r in range(1, R_MAX + 1))
        rows_per_call = {r: _vectors(r) * 8 for r in range(1, R_MAX + 1)}
    else:
        raise ValueError(f"unknown int8 kernel variant {variant!r}")
    tile_rows = tile_rows_for(variant, dot)
    dispatch = "\n".join(
        f"                        case {r}: " + " ".join(f"qtile{r}(xq, sx, yb, {j * m}, e, W, corr, ws, bias, P);"
                                          for j in range(tile_rows // m)) + " break;"
        for r, m in rows_per_call.items())
    k_pad = -(-n_in // k_group) * k_group
    panels = cut_panels(groups, n_in, panel_k or k_pad, chunk_g0, k_group)
    if io is not None and io.one_word and int(panels.p_len.max(initial=k_group)) > k_group:
        raise ValueError("this kernel I/O reads one word per piece: prepare the groups with one_word=True")
    x_off = (io or ROWS_IO).offsets(panels.p_k0, tile_rows, k_group)
    tables += entry_tables(panels).array("P_XOFF", x_off, "int32_t").array("P_WORDS", panels.p_len // k_group,
                                                                          "int32_t")
    bits = 32 // k_group
    text = c_fill("int8_kernel.c", level=level, tile_rows=tile_rows, n_in=n_in, k_pad=k_pad, n_out=n_out,
                  defines=io.defines if io else "", prelude=_PRELUDE, extra=extra,
                  tables=tables.c(as_data), tiles=tiles, unpack=io.unpack if io else UNPACK_TILE,
                  row_scale=ROW_SCALE, pack=io.pack if io else pack, name=name, elem=elem,
                  loop=entry_loop(panels.count, dispatch, finish), word=k_group, bits=bits,
                  mask=hex((1 << bits) - 1), offset=0 if elem == "int16_t" else 128)
    return KernelSource(text, tables, as_data)
