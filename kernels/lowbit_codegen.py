"""The u8 x s8 int8 kernel variant for narrow weight grids: twice the multiplies per instruction.

Without VNNI, AVX2's integer multiply port does one `vpmaddwd` (16 int16 products) or one
`vpmaddubsw` (32 u8 x s8 products, adjacent pairs summed to int16, saturating) per cycle
on this Zen 3. The int16 kernels use `vpmaddwd` and match fp32 FMA throughput. When the
weights sit on a narrow grid (|w| <= 2^(bits-1) - 1), the pair sums are small enough to add
several `vpmaddubsw` results in int16 without any chance of saturation, and to widen them
to int32 (`vpmaddwd` by ones) once per `steps`: 32 products per multiply instead of 16.

Activations are quantized exactly as in the int16 kernels (per row, symmetric), then stored
offset by 128 as u8; the offset's contribution, 128 * sum_k w[n, k], is subtracted per output
row before dequantizing, so the int32 result is the same exact sum. k quads are interleaved:
one 32-bit word holds x[t, 4q .. 4q + 3], so one `vpmaddubsw` + `vpmaddwd` gives 4-term sums.
"""

from __future__ import annotations

import numpy as np

from sparta_explore.fake_quant import qmax
from sparta_explore.kernels.bsr_codegen import _ACTIVATIONS
from sparta_explore.kernels.c_templates import c_text
from sparta_explore.kernels.groups import Groups, word_index
from sparta_explore.kernels.qtile import int32_slot, qtile

ROWS = 3  # register tile: 3 rows x 2 vectors x (int16 partial + int32 sum) + 2 x + 1 weight = 15 ymm
VECTORS = 2
MAX_STEPS = 16


def accumulate_steps(weight_bits: int, act_bits: int) -> int:
    """How many `vpmaddubsw` results can be added in int16 with no possible overflow (>= 2 to pay).

    Example:
        >>> accumulate_steps(4, 8), accumulate_steps(8, 8)
        (9, 0)
    """
    pair_max = 2 * (128 + qmax(act_bits)) * qmax(weight_bits)
    return min(MAX_STEPS, 32767 // pair_max)


def pack_quads(wq: np.ndarray, groups: Groups) -> np.ndarray:
    """int8 weights in kernel order: per group, per k quad, per row, (w[4q] .. w[4q + 3]) as one int32."""
    n, k = wq.shape
    wpad = np.zeros((n, k + 3), dtype=np.int8)
    wpad[:, :k] = wq
    rows, ks = word_index(groups, 4)  # segments are whole quads (align_segments)
    if not rows.size:
        return np.zeros(1, dtype=np.int32)
    quads = np.stack([wpad[rows, ks + i] for i in range(4)], axis=1)  # little endian: k % 4 == 0 in the low byte
    return np.ascontiguousarray(quads).view(np.int32).reshape(-1)


def offset_correction(wq: np.ndarray) -> np.ndarray:
    """128 * sum_k w[n, k] per output row: what the +128 activation offset adds to every sum."""
    return (128 * wq.sum(axis=1, dtype=np.int64)).astype(np.int32)  # summed in int64 without an int64 copy of wq


def u8_tile(r: int, act: str, steps: int) -> str:
    """One register tile (r rows x VECTORS vectors of 8 outputs) of one row group."""
    pairs = [(i, j) for i in range(r) for j in range(VECTORS)]
    acc = " ".join(f"__m256i a{i}{j} = first ? _mm256_setzero_si256() : _mm256_loadu_si256((const __m256i *)"
                   f"({int32_slot(i, f'{j} * 8')})), h{i}{j} = _mm256_setzero_si256();" for i, j in pairs)
    spill = " ".join(f"_mm256_storeu_si256((__m256i *)({int32_slot(i, f'{j} * 8')}), a{i}{j});" for i, j in pairs)
    loads = " ".join(f"const __m256i x{j} = _mm256_loadu_si256((const __m256i *)(x + {j} * 32));"
                     for j in range(VECTORS))
    madds = " ".join(f"{{ const __m256i b = _mm256_set1_epi32(w[{i}]); "
                     + " ".join(f"h{i}{j} = _mm256_add_epi16(h{i}{j}, _mm256_maddubs_epi16(x{j}, b));"
                                for j in range(VECTORS)) + " }"
                     for i in range(r))
    widen = " ".join(f"a{i}{j} = _mm256_add_epi32(a{i}{j}, _mm256_madd_epi16(h{i}{j}, ones)); "
                     f"h{i}{j} = _mm256_setzero_si256();" for i, j in pairs)
    stores = " ".join(
        f"{{ vf v = (vf)_mm256_cvtepi32_ps(_mm256_sub_epi32(a{i}{j}, _mm256_set1_epi32(corr[n0 + {i}])))"
        f" * LD(sx + t + {j} * 8) * ws[n0 + {i}] + bias_of(bias, n0 + {i}); {_ACTIVATIONS[act]} "
        f"ST(yb + (n0 + {i}) * TILE + t + {j} * 8, v); }}" for i, j in pairs)
    body = f"{loads}\n            {madds}\n            if (++steps == {steps}) {{ {widen} steps = 0; }}"
    return qtile(r, "uint8_t", 4, acc=acc, body=body, stores=stores, spill=spill,
                 consts="    const __m256i ones = _mm256_set1_epi16(1);\n", counters="    int steps = 0;\n",
                 after=f"    {widen}\n")


U8_PACK = c_text("pack_tile_u8.c")
