"""C source generation for pattern-specialized sparse fp32 linear kernels.

The kernel computes Y^T = W X^T with activations K-major (X^T is K x M) so that the
vector dimension is M: every kept weight w[n, k] is one broadcast-FMA of a row of X^T.
Outputs are processed in *row groups* (up to R rows that share a k pattern: the rows of
one block row), and each group's kept k indices are merged into contiguous segments.
The group and segment tables are baked into the source as constant arrays (the paper's
*dismantle*: empty blocks do not exist in the code, there is no per-element test), and
the kept weights are packed group by group, R values per k, in the order the kernel reads.

The source uses GCC vector extensions, so the same text compiles to AVX2 (8 lanes) or
AVX-512 (16 lanes) with -march=native; register tile: R rows x V vectors of M.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from sparta_explore.kernels.panels import cut_panels, panel_rows

R_MAX = 4  # output rows per register tile (default)
V = 3  # vectors of M per register tile (default)
LAYOUTS = ("rows", "segments")


@dataclass(frozen=True)
class TileConfig:
    """Register tiling of the generated kernel, chosen by `tuning.search` or left at the default.

    `rows`: output rows per group (register tile height); `vectors`: vectors of M per tile
    for multi-row groups; `single_vectors`: for one-row groups, which are load-bound and
    want more. The M tile is their least common multiple, in vectors. `panel` processes K in
    L1-sized panels (see panels.py). `layout` is the loop order: "rows" groups consecutive
    rows that share a pattern (block rows); "segments" regroups, per K panel, any rows whose
    kept k's in that panel are identical (see segment_codegen.py: 1xK blocks become blocks).
    """

    rows: int = R_MAX
    vectors: int = V
    single_vectors: int = 2 * V
    panel: bool = False  # cut K into L1-sized panels (helps one-row groups, costs spills for blocks)
    layout: str = "rows"

    def __post_init__(self) -> None:
        if not (1 <= self.rows <= 8 and 1 <= self.vectors <= 8 and 1 <= self.single_vectors <= 12):
            raise ValueError(f"unsupported tile config {self}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"tile layout must be one of {LAYOUTS}, got {self.layout!r}")

    @property
    def tile_vectors(self) -> int:
        return math.lcm(self.vectors, self.single_vectors)

    def vectors_for(self, r: int) -> int:
        return self.single_vectors if r == 1 else self.vectors


@dataclass(frozen=True)
class Groups:
    """Row groups and k segments of one sparsity pattern, plus the packed-weight offsets."""

    row0: np.ndarray      # first output row of each group
    rows: np.ndarray      # rows in each group (1..R_MAX)
    seg_ptr: np.ndarray   # group g's segments are seg_ptr[g]:seg_ptr[g+1]
    seg_k0: np.ndarray    # first k of each segment
    seg_len: np.ndarray   # k count of each segment
    w_off: np.ndarray     # offset of group g's packed weights

    @property
    def kept_k(self) -> int:
        return int(self.seg_len.sum())


def _segments(kept_cols: np.ndarray) -> list[tuple[int, int]]:
    """Contiguous runs of True in a 1-D bool array, as (start, length)."""
    if not kept_cols.any():
        return []
    padded = np.concatenate([[False], kept_cols, [False]])
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    return [(int(a), int(b - a)) for a, b in zip(edges[0::2], edges[1::2])]


def plan_groups(kept: np.ndarray, block_rows: int, max_rows: int = R_MAX) -> Groups:
    """Split the outputs into row groups of at most `max_rows` rows inside each block row.

    `kept` is the (N, K) bool mask of kept weights; rows of a group share the union of
    their kept columns (exact for block patterns, where rows of a block row agree).

    Example:
        >>> g = plan_groups(np.eye(4, dtype=bool), 1)
        >>> g.rows.tolist(), g.seg_k0.tolist()
        ([1, 1, 1, 1], [0, 1, 2, 3])
    """
    n = kept.shape[0]
    row0, rows, seg_ptr, seg_k0, seg_len, w_off = [], [], [0], [], [], []
    offset = 0
    for b0 in range(0, n, block_rows):
        b1 = min(b0 + block_rows, n)
        for g0 in range(b0, b1, max_rows):
            g1 = min(g0 + max_rows, b1)
            cols = kept[g0:g1].any(axis=0)
            segs = _segments(cols)
            if not segs:
                continue  # an all-pruned group is never computed; its outputs are bias (or 0)
            row0.append(g0)
            rows.append(g1 - g0)
            w_off.append(offset)
            for k0, length in segs:
                seg_k0.append(k0)
                seg_len.append(length)
                offset += length * (g1 - g0)
            seg_ptr.append(len(seg_k0))
    as_i = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
    return Groups(as_i(row0), as_i(rows), as_i(seg_ptr), as_i(seg_k0), as_i(seg_len), as_i(w_off))


def segment_blocks(weights: np.ndarray, groups: Groups) -> Iterator[np.ndarray]:
    """The (rows, k) block of `weights` under each group's segment, in the order kernels read them."""
    for g in range(len(groups.row0)):
        r0, r = int(groups.row0[g]), int(groups.rows[g])
        for s in range(int(groups.seg_ptr[g]), int(groups.seg_ptr[g + 1])):
            k0, length = int(groups.seg_k0[s]), int(groups.seg_len[s])
            yield weights[r0:r0 + r, k0:k0 + length]


def pack_weights(weight: np.ndarray, kept: np.ndarray, groups: Groups) -> np.ndarray:
    """Kept weights in kernel order: per group, per segment, per k, the group's rows (pruned -> 0)."""
    w = np.where(kept, weight, 0.0).astype(np.float32)
    parts = [block.T.reshape(-1) for block in segment_blocks(w, groups)]
    return np.concatenate(parts) if parts else np.zeros(1, dtype=np.float32)


def _array(name: str, values: np.ndarray) -> str:
    body = ",".join(str(int(v)) for v in values) or "0"
    return f"static const long {name}[] = {{{body}}};\n"


_ACTIVATIONS = {
    "none": "",
    "relu": "v = vsel(v > zero, v, zero);",
    # exact-erf GELU, 0.5 v (1 + erf(v / sqrt 2)), erf by Abramowitz-Stegun 7.1.26 (|err| < 1.5e-7)
    "gelu": "v = 0.5f * v * (one + verf(v * 0.70710678118654752f));",
}

_PRELUDE = r"""
#include <stdint.h>
#include <string.h>
typedef float vf __attribute__((vector_size(VEC * 4), aligned(4)));
typedef int32_t vi __attribute__((vector_size(VEC * 4), aligned(4)));
#define LD(p) (*(const vf *)(p))
#define ST(p, v) (*(vf *)(p) = (v))

static inline vf vsel(vi mask, vf a, vf b) { return (vf)(((vi)a & mask) | ((vi)b & ~mask)); }

static inline vf vexp(vf x) {
    /* exp(x) = 2^n * exp(r), |r| <= ln2/2, degree-6 polynomial; the clamp keeps 2^n finite */
    const vf zero = x - x, hi = zero + 88.0f, lo = zero - 88.0f;
    x = vsel(x > hi, hi, x);
    x = vsel(x < lo, lo, x);
    vf fn = x * 1.44269504088896341f;
    fn = fn + vsel(fn < zero, zero - 0.5f, zero + 0.5f);
    vi n = __builtin_convertvector(fn, vi);
    vf nf = __builtin_convertvector(n, vf);
    vf r = x - nf * 0.693359375f + nf * 2.12194440e-4f;
    vf p = 1.9875691500e-4f * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f; p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f; p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    vi bits = (n + 127) << 23;
    return p * (vf)bits;
}

static inline vf verf(vf x) {
    const vf zero = x - x, one = zero + 1.0f;
    vf sign = vsel(x < zero, -one, one);
    vf a = x * sign;
    vf t = one / (one + 0.3275911f * a);
    vf y = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t;
    return sign * (one - y * vexp(-a * a));
}
"""


def _vectors(r: int) -> int:
    # one-row groups are load-bound (one broadcast per V loads), so they get more vectors
    return TileConfig().vectors_for(r)


def _tile_function(r: int, act: str, v: int) -> str:
    """One register tile (r rows x v vectors) over one panel entry: start, accumulate, spill or finish."""
    acc_decl = " ".join(f"vf a{i}{j} = first ? zero : LD(yb + (n0 + {i}) * TILE + t + {j} * VEC);"
                        for i in range(r) for j in range(v))
    loads = " ".join(f"const vf x{j} = LD(x + {j} * VEC);" for j in range(v))
    fmas = " ".join(f"a{i}{j} += w[{i}] * x{j};" for i in range(r) for j in range(v))
    finish, spill = [], []
    for i in range(r):
        for j in range(v):
            finish.append(f"{{ vf v = a{i}{j} + bias_of(bias, n0 + {i}); {_ACTIVATIONS[act]} "
                          f"ST(yb + (n0 + {i}) * TILE + t + {j} * VEC, v); }}")
            spill.append(f"ST(yb + (n0 + {i}) * TILE + t + {j} * VEC, a{i}{j});")
    return f"""
static inline void tile{r}(const float *xb, float *yb, long t, long e, const float *W, const float *bias) {{
    const vf zero = {{0}}; const vf one = zero + 1.0f; (void)one;
    const long n0 = G_ROW0[E_G[e]];
    const int first = (E_FLAGS[e] & 1) != 0, last = (E_FLAGS[e] & 2) != 0;
    {acc_decl}
    const float *w = W + E_WOFF[e];
    for (long p = E_P0[e]; p < E_P1[e]; ++p) {{
        const float *x = xb + P_K0[p] * TILE + t;
        for (long k = P_LEN[p]; k > 0; --k, x += TILE, w += {r}) {{
            {loads}
            {fmas}
        }}
    }}
    if (last) {{ {" ".join(finish)} }} else {{ {" ".join(spill)} }}
}}
"""


CHUNKS = 8  # row chunks baked into every kernel; small M splits work over them


def _chunks(groups: Groups, n_out: int, empty: np.ndarray) -> tuple[list[int], ...]:
    """Split groups into up to CHUNKS contiguous runs of similar kept work; each owns a row range."""
    per_group = np.zeros(len(groups.row0))
    if len(groups.row0):
        owner = np.repeat(np.arange(len(groups.row0)), np.diff(groups.seg_ptr))
        np.add.at(per_group, owner, groups.seg_len * groups.rows[owner])
    total = per_group.sum()
    cuts = [0]
    acc = 0.0
    for g, wk in enumerate(per_group):
        acc += wk
        if len(cuts) < CHUNKS and acc >= total * len(cuts) / CHUNKS and g + 1 < len(per_group):
            cuts.append(g + 1)
    cuts.append(len(per_group))
    g0, g1, n0, n1 = [], [], [], []
    for i in range(len(cuts) - 1):
        a, b = cuts[i], cuts[i + 1]
        g0.append(a)
        g1.append(b)
        n0.append(0 if i == 0 else int(groups.row0[a]))
        n1.append(n_out if i == len(cuts) - 2 else int(groups.row0[b]))
    ep = np.searchsorted(empty, n0 + [n_out]).tolist() if len(empty) else [0] * (len(n0) + 1)
    return g0, g1, n0, n1, ep


UNPACK_TILE = """
#if VEC == 8
static inline void transpose8(const float *src, long src_stride, float *dst, long dst_stride) {
    /* dst[j * dst_stride + i] = src[i * src_stride + j] for an 8 x 8 block, in registers */
    const vi lo = {0, 8, 1, 9, 4, 12, 5, 13}, hi = {2, 10, 3, 11, 6, 14, 7, 15};
    const vi lo2 = {0, 1, 8, 9, 4, 5, 12, 13}, hi2 = {2, 3, 10, 11, 6, 7, 14, 15};
    const vi lo4 = {0, 1, 2, 3, 8, 9, 10, 11}, hi4 = {4, 5, 6, 7, 12, 13, 14, 15};
    vf r[8];
    for (int i = 0; i < 8; ++i) r[i] = LD(src + i * src_stride);
    vf a0 = __builtin_shuffle(r[0], r[1], lo), a1 = __builtin_shuffle(r[0], r[1], hi);
    vf a2 = __builtin_shuffle(r[2], r[3], lo), a3 = __builtin_shuffle(r[2], r[3], hi);
    vf a4 = __builtin_shuffle(r[4], r[5], lo), a5 = __builtin_shuffle(r[4], r[5], hi);
    vf a6 = __builtin_shuffle(r[6], r[7], lo), a7 = __builtin_shuffle(r[6], r[7], hi);
    vf b0 = __builtin_shuffle(a0, a2, lo2), b1 = __builtin_shuffle(a0, a2, hi2);
    vf b2 = __builtin_shuffle(a1, a3, lo2), b3 = __builtin_shuffle(a1, a3, hi2);
    vf b4 = __builtin_shuffle(a4, a6, lo2), b5 = __builtin_shuffle(a4, a6, hi2);
    vf b6 = __builtin_shuffle(a5, a7, lo2), b7 = __builtin_shuffle(a5, a7, hi2);
    ST(dst + 0 * dst_stride, __builtin_shuffle(b0, b4, lo4)); ST(dst + 4 * dst_stride, __builtin_shuffle(b0, b4, hi4));
    ST(dst + 1 * dst_stride, __builtin_shuffle(b1, b5, lo4)); ST(dst + 5 * dst_stride, __builtin_shuffle(b1, b5, hi4));
    ST(dst + 2 * dst_stride, __builtin_shuffle(b2, b6, lo4)); ST(dst + 6 * dst_stride, __builtin_shuffle(b2, b6, hi4));
    ST(dst + 3 * dst_stride, __builtin_shuffle(b3, b7, lo4)); ST(dst + 7 * dst_stride, __builtin_shuffle(b3, b7, hi4));
}
#endif

static void unpack_tile(const float *yb, float *Y, long m0, long mt, long r0, long r1) {
    /* Y[m0 + t][n] = yb[n][t] for rows r0..r1 */
    long n_vec = r0;
#if VEC == 8
    /* 8 x 8 blocks transposed in registers: each Y row gets one 32-byte store per block.
       Blocks of 8 t outer, rows inner: the 8 rows of Y are written left to right, whole
       cache lines in order (rows outer left half-lines behind: 2 ms of 5 at 4096 x 3072) */
    const long t_full = mt - mt % 8, n_full = r0 + (r1 - r0) / 8 * 8;
    for (long t = 0; t < t_full; t += 8)
        for (n_vec = r0; n_vec < n_full; n_vec += 8)
            transpose8(yb + n_vec * TILE + t, TILE, Y + (m0 + t) * N_OUT + n_vec, N_OUT);
    for (long t = t_full; t < mt; ++t)
        for (long n = r0; n < n_full; ++n) Y[(m0 + t) * N_OUT + n] = yb[n * TILE + t];
    n_vec = n_full;
#endif
    /* the remaining rows (fewer than 8, or every row when VEC != 8) */
    for (long t = 0; t < mt; ++t) {
        float *dst = Y + (m0 + t) * N_OUT;
        for (long n = n_vec; n < r1; ++n) dst[n] = yb[n * TILE + t];
    }
}
"""


def finish_tile(act: str) -> str:
    """C that ends a work item: rows no kept weight reaches get act(bias), then the tile goes to Y."""
    return f"""            for (long e = C_EPTR[c0]; e < C_EPTR[c1]; ++e) {{  /* rows no kept weight reaches */
                const long n = EMPTY_ROWS[e];
                for (long t = 0; t < TILE; t += VEC) {{ vf v = zero + bias_of(bias, n); {_ACTIVATIONS[act]}
                    ST(yb + n * TILE + t, v); }}
            }}
            unpack_tile(yb, Y, m0, mt, C_N0[c0], C_N1[c1 - 1]);"""



PACK_TILE = """
static void pack_tile(const float *X, float *xb, long m0, long mt) {
    /* xb[k][t] = X[m0 + t][k]; blocked over k so the written rows of xb stay in L1 */
    for (long k0 = 0; k0 < K_IN; k0 += 64) {
        const long k1 = k0 + 64 < K_IN ? k0 + 64 : K_IN;
        long t = 0;
#if VEC == 8
        /* whole 8 x 8 blocks through registers (a scalar copy took 3 of 16 ms at 4096 x 3072 -> 768) */
        const long k8 = k0 + (k1 - k0) / 8 * 8;
        for (; t + 8 <= mt; t += 8) {
            const float *src = X + (m0 + t) * K_IN;
            for (long k = k0; k < k8; k += 8) transpose8(src + k, K_IN, xb + k * TILE + t, TILE);
            for (long k = k8; k < k1; ++k)
                for (long i = 0; i < 8; ++i) xb[k * TILE + t + i] = src[i * K_IN + k];
        }
#endif
        for (; t < mt; ++t) {
            const float *src = X + (m0 + t) * K_IN;
            for (long k = k0; k < k1; ++k) xb[k * TILE + t] = src[k];
        }
        for (t = mt; t < TILE; ++t)
            for (long k = k0; k < k1; ++k) xb[k * TILE + t] = 0.0f;
    }
}
"""


def fp32_driver(name: str, body: str) -> str:
    """C of `void {name}(X, Y, M, W, bias)`: work items of (tile of M) x (run of row chunks c0..c1).

    Each item packs its tile of X K-major (`xt`) and runs `body`, which fills the private
    N x TILE buffer `yb` for chunks c0..c1 and writes those rows of Y. Large M takes all
    chunks per item (one pack per tile); small M packs every tile once into a shared buffer
    and splits the chunks over threads.
    """
    return f"""void {name}(const float *X, float *Y, long M, const float *W, const float *bias) {{
    const long tiles = (M + TILE - 1) / TILE;
    const long split = tiles >= 4 * omp_get_max_threads() ? 1 : N_CHUNKS;  /* chunk runs per tile */
    /* small M: every tile is packed once into a shared buffer, then chunks split over threads */
    float *shared = split == 1 ? NULL : aligned_alloc(64, sizeof(float) * K_IN * TILE * tiles);
    #pragma omp parallel
    {{
        float *xb = split == 1 ? aligned_alloc(64, sizeof(float) * K_IN * TILE) : NULL;
        float *yb = aligned_alloc(64, sizeof(float) * N_OUT * TILE);
        const vf zero = {{0}}; const vf one = zero + 1.0f; (void)one;
        if (split != 1) {{
            #pragma omp for schedule(static)
            for (long i = 0; i < tiles; ++i) {{
                const long m0 = i * TILE;
                pack_tile(X, shared + i * K_IN * TILE, m0, M - m0 < TILE ? M - m0 : TILE);
            }}
        }}
        #pragma omp for schedule(static)
        for (long item = 0; item < tiles * split; ++item) {{
            const long tile = item / split, m0 = tile * TILE;
            const long c0 = split == 1 ? 0 : item % split, c1 = split == 1 ? N_CHUNKS : c0 + 1;
            const long mt = M - m0 < TILE ? M - m0 : TILE;
            if (split == 1) pack_tile(X, xb, m0, mt);
            const float *xt = split == 1 ? xb : shared + tile * K_IN * TILE;
{body}        }}
        free(xb);
        free(yb);
    }}
    free(shared);
}}
"""


def fp32_source(vec: int, cfg: TileConfig, n_in: int, n_out: int, n_chunks: int, specialized: str, driver: str,
                defines: str = "") -> str:
    """A whole fp32 kernel source: shape macros, prelude, the pattern's tables and tiles, pack/unpack, driver."""
    return f"""#define VEC {vec}
#define TILE ({cfg.tile_vectors} * VEC)
#define K_IN {n_in}L
#define N_OUT {n_out}L
#define N_CHUNKS {n_chunks}L
{defines}#include <stdlib.h>
#include <omp.h>
{_PRELUDE}
static inline float bias_of(const float *bias, long n) {{ return bias ? bias[n] : 0.0f; }}
{specialized}
{UNPACK_TILE}
{PACK_TILE}
{driver}"""


def pattern_tables(groups: Groups, n_out: int, act: str) -> tuple[str, list[int]]:
    """The constant tables every kernel of a pattern bakes in (groups, segments, empty rows, chunks)."""
    if act not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {act!r}")
    empty_rows = np.ones(n_out, dtype=bool)
    for r0, r in zip(groups.row0, groups.rows):
        empty_rows[r0:r0 + r] = False
    empty = np.flatnonzero(empty_rows)
    g0, g1, n0, n1, ep = _chunks(groups, n_out, empty)
    tables = (_array("G_ROW0", groups.row0) + _array("G_ROWS", groups.rows) + _array("G_SEGPTR", groups.seg_ptr)
              + _array("G_SEGK0", groups.seg_k0) + _array("G_SEGLEN", groups.seg_len)
              + _array("G_WOFF", groups.w_off) + _array("EMPTY_ROWS", empty) + _array("C_G0", g0)
              + _array("C_G1", g1) + _array("C_N0", n0) + _array("C_N1", n1) + _array("C_EPTR", ep))
    return tables, g0


def generate_source(groups: Groups, n_out: int, n_in: int, vec: int, act: str, name: str,
                    cfg: TileConfig = TileConfig()) -> str:
    """C source of `void {name}(X, Y, M, W, bias)`: X is M x K row-major, Y is M x N row-major.

    Work items are (tile of TILE rows of X) x (run of row chunks): each packs its tile of X
    K-major into a private buffer, runs its groups into a private N x TILE buffer, fills the
    rows no weight reaches, and writes its rows of that tile of Y. Large M takes all chunks
    per item (one pack per tile); small M splits chunks over threads.
    """
    tables, chunk_g0 = pattern_tables(groups, n_out, act)
    n_chunks = len(chunk_g0)
    panels = cut_panels(groups, n_in, panel_rows(cfg.tile_vectors * vec) if cfg.panel else max(1, n_in), chunk_g0)
    tables += (_array("E_G", panels.e_group) + _array("E_P0", panels.e_piece0) + _array("E_P1", panels.e_piece1)
               + _array("E_WOFF", panels.e_woff) + _array("E_FLAGS", panels.e_flags) + _array("P_K0", panels.p_k0)
               + _array("P_LEN", panels.p_len) + _array("E_PTR", panels.e_ptr))
    n_panels = len(panels.e_ptr) // (n_chunks + 1)
    dispatch = "\n".join(
        f"                    case {r}: " + " ".join(f"tile{r}(xt, yb, {j} * {cfg.vectors_for(r)} * VEC, e, W, bias);"
                                          for j in range(cfg.tile_vectors // cfg.vectors_for(r))) + " break;"
        for r in range(1, cfg.rows + 1))
    tiles = "".join(_tile_function(r, act, cfg.vectors_for(r)) for r in range(1, cfg.rows + 1))
    body = f"""            for (long p = 0; p < {n_panels}; ++p) {{  /* panel by panel: the panel of xt stays in L1 */
                for (long e = E_PTR[p * (N_CHUNKS + 1) + c0]; e < E_PTR[p * (N_CHUNKS + 1) + c1]; ++e) {{
                    switch (G_ROWS[E_G[e]]) {{
{dispatch}
                    }}
                }}
            }}
{finish_tile(act)}
"""
    return fp32_source(vec, cfg, n_in, n_out, n_chunks, tables + tiles, fp32_driver(name, body))
