/* The decode step's one-row products (decode_step.c follows this file in one library).
 *
 * One decode step of a Llama-pattern model for a few sequences (batch B <= 8) in one call.
 *
 * Every weight is read once per step: rows are split over the threads, and each row is
 * multiplied with all B activation rows while it sits in registers / L1.
 *
 * Weight formats (Mat.fmt): F32 rows as they are; U8 and U4 integer codes with a (scale, offset)
 * pair per `group` columns (a multiple of 32) of a row, w = scale * code + offset:
 *   U8: one signed byte a column, code - 128 (the offset absorbs the 128), rows of k % 32 == 0;
 *   U4: 32 bytes a run of 64 columns, byte j holding column j (low nibble) and j + 32 (high);
 *   U8H, U4H: the same codes, their grids in float16 (F16C widens a row's grids as it starts);
 *   X8, X4 (and X8H, X4H): the same codes in tiles of 8 rows for int8 activations (see tile_int8);
 *   S32: a pruned float32 weight's kept values, row after row, with one mask bit a column (w: the values,
 *        codes: n x k / 8 mask bytes, grid: n + 1 int32 row starts; kernels/bitmask_rows.py).
 *
 * Activations (Model.act_q; gemv's run): float32: quantized weights are widened in registers,
 * and the step computes the model's weights times its activations up to summation order. Int8:
 * every projection's input is rounded per 32 columns to a symmetric 8-bit grid (scale = max |x| /
 * 127, as `fake_quantize_rows` of each 32-column block; gemv also rounds per row, at any bits),
 * and integer codes meet integer activations in `vpdpbusd` (VNNI) or `vpmaddubsw` (32 products
 * an instruction), eight weight rows at once: what the model with those inputs rounded computes.
 *
 * One OpenMP parallel region runs the whole step; the stages are work-shared loops whose
 * implicit barriers order them, so threads start once per token, not once per matrix.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#define F32 0
#define U8 1
#define U4 2
#define U4H 3
#define U8H 4
#define X8 5 /* tiles from here on */
#define X4 6
#define X8H 7
#define X4H 8
#define S32 9
#define IS_TILE(fmt) ((fmt) >= X8 && (fmt) <= X4H)
#define TILE 8 /* weight rows a tile interleaves */
#define MAX_BATCH 8
#define CHUNK 4 /* activation rows per pass over a weight row (the row stays in L1 between passes) */
#define QBLOCK 32 /* activation columns per int8 grid */
#define INLINE static inline __attribute__((always_inline))

typedef struct {
    int32_t fmt, n, k, group;
    const float *w;
    const uint8_t *codes;
    const void *grid; /* per row (tiles: per tile, see tile_int8) its groups' scales, then offsets; H: float16 */
    const float *bias;
} Mat;

typedef struct {
    Mat q, k, v, o, gate, up, down;
    const float *ln1, *ln2;
    float *kcache, *vcache; /* (batch, kv_heads, max_len, head_dim) */
} Layer;

typedef struct {
    int32_t layers, hidden, heads, kv_heads, head_dim, inter, vocab, max_len, batch, threads, act_q;
    float eps, attn_scale;
    const float *embed; /* (vocab, hidden), or NULL: rows come from the (tied) head */
    const float *norm;
    Mat head;
    const float *cos, *sin; /* (max_len, head_dim) */
    const Layer *layer;
    float *scratch;
} Model;

/* A projection's input: float rows x (the rounded values when q is set), and with int8 activations
   their codes q (B, k), and per 32 columns the scale d and the sum of the rounded values xs (B, k / 32). */
typedef struct {
    const float *x;
    int ldx;
    const int8_t *q;
    const float *d, *xs;
} Act;

/* float16 grid values widened: F16C where the build has it, else bit by bit (the Python side keeps float32
   grids on CPUs without F16C, so that path is for completeness) */
#ifdef __F16C__
INLINE float half_at(const uint16_t *h, long i) { return _cvtsh_ss(h[i]); }
INLINE __m256 half_8(const uint16_t *h, long i) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))); }
#else
INLINE float half_at(const uint16_t *h, long i) {
    const uint32_t x = h[i], e = (x >> 10) & 31, f = x & 1023;
    const float v = e == 0 ? ldexpf((float)f, -24) : e == 31 ? (f ? NAN : INFINITY) : ldexpf((float)(f | 1024), (int)e - 25);
    return x & 0x8000u ? -v : v;
}
INLINE __m256 half_8(const uint16_t *h, long i) {
    float v[8];
    for (int t = 0; t < 8; ++t) v[t] = half_at(h, i + t);
    return _mm256_loadu_ps(v);
}
#endif

/* Row n's grids (its groups' scales, then offsets) as float32: the stream itself, or for the H formats its
   float16 values widened into `tmp` (2 x groups floats) once, before the row's products read them. */
INLINE const float *row_grids(const Mat *m, int n, int groups, float *tmp) {
    if (m->fmt != U8H && m->fmt != U4H) return (const float *)m->grid + (long)n * groups * 2;
    const uint16_t *h = (const uint16_t *)m->grid + (long)n * groups * 2;
    int i = 0;
    for (; i + 8 <= 2 * groups; i += 8) _mm256_storeu_ps(tmp + i, half_8(h, i));
    for (; i < 2 * groups; ++i) tmp[i] = half_at(h, i);
    return tmp;
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* One weight row's dot products with `nb` (<= CHUNK) activation rows. An FMA waits several cycles
   for its accumulator, so one row of x gets 8 independent chains: CHAINS(nb) per row of x. */
#define CHAINS(nb) ((nb) == 1 ? 8 : (nb) == 2 ? 4 : 2)

INLINE void reduce(__m256 acc[CHUNK][8], int nb, float *out) {
    for (int b = 0; b < nb; ++b) {
        __m256 s = acc[b][0];
        for (int a = 1; a < CHAINS(nb); ++a) s = _mm256_add_ps(s, acc[b][a]);
        out[b] = hsum(s);
    }
}

#define ZERO_ACC(acc)                                                                                        \
    for (int b_ = 0; b_ < CHUNK; ++b_)                                                                       \
        for (int a_ = 0; a_ < 8; ++a_) acc[b_][a_] = _mm256_setzero_ps();

INLINE void row_f32(const float *w, int k, const float *x, int ldx, int nb, float *out) {
    __m256 acc[CHUNK][8];
    ZERO_ACC(acc)
    int j = 0;
    for (; j + 64 <= k; j += 64) {
#pragma GCC unroll 8
        for (int f = 0; f < 8; ++f) {
            const __m256 wv = _mm256_loadu_ps(w + j + 8 * f);
            for (int b = 0; b < nb; ++b)
                acc[b][f % CHAINS(nb)] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + b * ldx + j + 8 * f),
                                                         acc[b][f % CHAINS(nb)]);
        }
    }
    for (; j + 8 <= k; j += 8) {
        const __m256 wv = _mm256_loadu_ps(w + j);
        for (int b = 0; b < nb; ++b) acc[b][0] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + b * ldx + j), acc[b][0]);
    }
    reduce(acc, nb, out);
    for (int b = 0; b < nb; ++b)
        for (int t = j; t < k; ++t) out[b] += w[t] * x[b * ldx + t];
}

/* Float activations, quantized weights: each 8 codes widened to scale * code + offset in registers. */
INLINE void row_u8_f32(const Mat *m, int n, const float *x, int ldx, int nb, float *out) {
    const int8_t *c = (const int8_t *)m->codes + (long)n * m->k;
    const int groups = (m->k + m->group - 1) / m->group;
    float tmp[2 * groups];
    const float *scales = row_grids(m, n, groups, tmp), *offs = scales + groups;
    __m256 acc[CHUNK][8];
    ZERO_ACC(acc)
    for (int j0 = 0, left = 0, g = -1; j0 < m->k; j0 += 32) {
        if (left == 0) { left = m->group / 32; ++g; }
        --left;
        const __m256 s = _mm256_set1_ps(scales[g]), o = _mm256_set1_ps(offs[g]);
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) {
            const __m128i bytes = _mm_loadl_epi64((const __m128i *)(c + j0 + 8 * t));
            const __m256 w = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), s, o);
            const int a = t % CHAINS(nb);
            for (int b = 0; b < nb; ++b)
                acc[b][a] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + b * ldx + j0 + 8 * t), acc[b][a]);
        }
    }
    reduce(acc, nb, out);
}

INLINE void row_u4_f32(const Mat *m, int n, const float *x, int ldx, int nb, float *out, const int PER) {
    const uint8_t *c = m->codes + (long)n * (m->k / 2);
    const int groups = (m->k + m->group - 1) / m->group;
    float tmp[2 * groups];
    const float *scales = row_grids(m, n, groups, tmp), *offs = scales + groups;
    const int per = PER ? PER : m->group / 32; /* 32-column runs a group spans */
#if defined(__AVX512F__)
    /* 16 columns a step: each run's 16 possible weights s c + o in one register, and a code picks its weight
       with one vpermps (no int -> float conversion and scaling per weight) */
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i nibble = _mm512_set1_epi32(15);
    __m512 wide[CHUNK][2];
    for (int b = 0; b < CHUNK; ++b) wide[b][0] = wide[b][1] = _mm512_setzero_ps();
    for (int j0 = 0; j0 < m->k; j0 += 64) {
        const int run = j0 / 32, lo = run / per, hi = (run + 1) / per;
        const __m512 w_lo = _mm512_fmadd_ps(iota, _mm512_set1_ps(scales[lo]), _mm512_set1_ps(offs[lo]));
        const __m512 w_hi = _mm512_fmadd_ps(iota, _mm512_set1_ps(scales[hi]), _mm512_set1_ps(offs[hi]));
#pragma GCC unroll 2
        for (int t = 0; t < 2; ++t) {
            const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(c + j0 / 2 + 16 * t)));
            const __m512 w0 = _mm512_permutexvar_ps(_mm512_and_si512(bytes, nibble), w_lo);
            const __m512 w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), w_hi);
            for (int b = 0; b < nb; ++b) {
                wide[b][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + b * ldx + j0 + 16 * t), wide[b][0]);
                wide[b][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + b * ldx + j0 + 32 + 16 * t), wide[b][1]);
            }
        }
    }
    for (int b = 0; b < nb; ++b) out[b] = _mm512_reduce_add_ps(_mm512_add_ps(wide[b][0], wide[b][1]));
#else
    const __m256i low = _mm256_set1_epi32(15);
    __m256 acc[CHUNK][8];
    ZERO_ACC(acc)
    for (int j0 = 0; j0 < m->k; j0 += 64) {
        const int run = j0 / 32; /* runs j0 / 32 (low nibbles) and + 1 (high) */
        const int lo = run / per, hi = (run + 1) / per;
        const __m256 s0 = _mm256_set1_ps(scales[lo]), o0 = _mm256_set1_ps(offs[lo]);
        const __m256 s1 = _mm256_set1_ps(scales[hi]), o1 = _mm256_set1_ps(offs[hi]);
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) {
            const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(c + j0 / 2 + 8 * t)));
            const __m256 w0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(bytes, low)), s0, o0);
            const __m256 w1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(bytes, 4)), s1, o1);
            for (int b = 0; b < nb; ++b) {
                acc[b][(2 * t) % CHAINS(nb)] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + b * ldx + j0 + 8 * t),
                                                               acc[b][(2 * t) % CHAINS(nb)]);
                acc[b][(2 * t + 1) % CHAINS(nb)] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + b * ldx + j0 + 32 + 8 * t),
                                                                   acc[b][(2 * t + 1) % CHAINS(nb)]);
            }
        }
    }
    reduce(acc, nb, out);
#endif
}

/* The 8 weights of a mask byte in their columns: the next popcount(bits) kept values moved to the set lanes,
   zeros elsewhere. AVX-512 expands in one instruction; AVX2 permutes by a table of each byte's lane sources
   (lane i takes value rank(i), the set bits below i) and clears the unset lanes. */
#if defined(__AVX512F__) && defined(__AVX512VL__)
INLINE __m256 expand8(const float *v, unsigned bits) { return _mm256_maskz_expand_ps((__mmask8)bits, _mm256_loadu_ps(v)); }
#else
static uint64_t EXPAND_FROM[256]; /* 8 source lanes a byte, one per byte of the word */
__attribute__((constructor)) static void fill_expand_from(void) {
    for (int bits = 0; bits < 256; ++bits) {
        uint64_t word = 0;
        for (int i = 0, rank = 0; i < 8; ++i)
            if (bits >> i & 1) word |= (uint64_t)rank++ << (8 * i);
        EXPAND_FROM[bits] = word;
    }
}
INLINE __m256 expand8(const float *v, unsigned bits) {
    const __m256i from = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)EXPAND_FROM[bits]));
    const __m256i lane = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)bits), lane), lane);
    return _mm256_and_ps(_mm256_permutevar8x32_ps(_mm256_loadu_ps(v), from), _mm256_castsi256_ps(set));
}
#endif

/* A bitmask row (S32): 8 columns a mask byte, its kept values expanded into place; an all-pruned byte reads
   nothing. The values end with PAD zeros (bitmask_rows.py), so the 8-float load at the last value stays inside. */
INLINE void row_s32(const Mat *m, int n, const float *x, int ldx, int nb, float *out) {
    const uint8_t *mask = m->codes + (long)n * (m->k / 8);
    const float *v = m->w + ((const int32_t *)m->grid)[n];
    __m256 acc[CHUNK][8];
    ZERO_ACC(acc)
    int j = 0;
#if defined(__AVX512F__)
    /* 16 columns (two mask bytes) an expansion: half the instructions of two 8-wide ones */
    __m512 wide[CHUNK][4];
    for (int b = 0; b < CHUNK; ++b)
        for (int a = 0; a < 4; ++a) wide[b][a] = _mm512_setzero_ps();
    for (; j + 64 <= m->k; j += 64) {
#pragma GCC unroll 4
        for (int f = 0; f < 4; ++f) {
            const unsigned bits = mask[j / 8 + 2 * f] | (unsigned)mask[j / 8 + 2 * f + 1] << 8;
            const __m512 w = _mm512_maskz_expand_ps((__mmask16)bits, _mm512_loadu_ps(v));
            v += __builtin_popcount(bits);
            for (int b = 0; b < nb; ++b)
                wide[b][f % 4] = _mm512_fmadd_ps(w, _mm512_loadu_ps(x + b * ldx + j + 16 * f), wide[b][f % 4]);
        }
    }
    for (int b = 0; b < nb; ++b)
        for (int a = 0; a < 4; ++a)
            acc[b][0] = _mm256_add_ps(acc[b][0], _mm256_add_ps(_mm512_castps512_ps256(wide[b][a]), _mm256_castpd_ps(
                _mm512_extractf64x4_pd(_mm512_castps_pd(wide[b][a]), 1))));
#endif
    for (; j + 64 <= m->k; j += 64) {
#pragma GCC unroll 8
        for (int f = 0; f < 8; ++f) {
            const unsigned bits = mask[j / 8 + f];
            if (!bits) continue;
            const __m256 w = expand8(v, bits);
            v += __builtin_popcount(bits);
            for (int b = 0; b < nb; ++b)
                acc[b][f % CHAINS(nb)] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + b * ldx + j + 8 * f), acc[b][f % CHAINS(nb)]);
        }
    }
    for (; j < m->k; j += 8) {
        const unsigned bits = mask[j / 8];
        const __m256 w = expand8(v, bits);
        v += __builtin_popcount(bits);
        for (int b = 0; b < nb; ++b) acc[b][0] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + b * ldx + j), acc[b][0]);
    }
    reduce(acc, nb, out);
}

/* Unsigned bytes u times signed bytes s, each four neighbours summed into int32 and added to acc: one
   `vpdpbusd` where the CPU has VNNI (the build's -march=native says), else `vpmaddubsw` + `vpmaddwd` + add.
   Our operands never reach vpmaddubsw's int16 saturation (codes <= 15, or |code| <= 128 against |q| <= 127),
   so both agree exactly. */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define VNNI 1
INLINE __m256i dot4_add(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
#elif defined(__AVXVNNI__)
#define VNNI 1
INLINE __m256i dot4_add(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_avx_epi32(acc, u, s); }
#else
#define VNNI 0
INLINE __m256i dot4_add(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
#endif

/* Tile layouts (X formats): rows in tiles of 8 (n padded with zero rows); a tile holds its runs of 32 columns
   one after another. In a run, column chunk c (columns 4c .. 4c + 3) is one 32-byte vector: bytes 4i .. 4i + 3
   are row i's codes of the chunk, so `vpmaddubsw` against the chunk's four activations (one int32 broadcast)
   leaves row i's partial sum in lane i: no horizontal sums, eight outputs in one register.
     X8: 8 vectors a run (256 bytes), signed codes (code - 128);
     X4: 4 vectors a run (128 bytes), vector j holding chunk j in its low nibbles and chunk j + 4 in its high.
   Grids: per tile its groups' 8 scales (one per row), then its groups' 8 offsets; float16 for the H variants. */

INLINE __m256 tile_grid(const void *grid, int half, long at) {
    return half ? half_8((const uint16_t *)grid, at) : _mm256_loadu_ps((const float *)grid + at);
}

/* One run's 8 row sums (int32, lane i = row i) against the run's activation codes q (32 bytes). */
INLINE __m256i tile_run_x4(const uint8_t *w, const int8_t *q, __m256i low) {
    const int32_t *qd = (const int32_t *)q;
#if VNNI
    __m256i s = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(w + 32 * j));
        s = dot4_add(s, _mm256_and_si256(raw, low), _mm256_set1_epi32(qd[j]));
        s = dot4_add(s, _mm256_and_si256(_mm256_srli_epi16(raw, 4), low), _mm256_set1_epi32(qd[j + 4]));
    }
    return s;
#else
    /* codes <= 15 and |q| <= 127: a pair's sum is at most 3810, eight chunks' 30480, inside int16 */
    __m256i s = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(w + 32 * j));
        s = _mm256_add_epi16(s, _mm256_maddubs_epi16(_mm256_and_si256(raw, low), _mm256_set1_epi32(qd[j])));
        s = _mm256_add_epi16(s, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(raw, 4), low),
                                                     _mm256_set1_epi32(qd[j + 4])));
    }
    return _mm256_madd_epi16(s, _mm256_set1_epi16(1));
#endif
}

INLINE __m256i tile_run_x8(const int8_t *w, const int8_t *q) {
    const int32_t *qd = (const int32_t *)q;
    __m256i s = _mm256_setzero_si256();
    for (int c = 0; c < 8; ++c) {
        const __m256i code = _mm256_loadu_si256((const __m256i *)(w + 32 * c));
        /* signed codes: the sign moves onto the activation (|c| * sign(q, c)) */
        s = dot4_add(s, _mm256_abs_epi8(code), _mm256_sign_epi8(_mm256_set1_epi32(qd[c]), code));
    }
    return s;
}

/* Tile t's 8 outputs for nb (<= CHUNK) activation rows: out[b * 8 + i]. Per run, the 8 integer sums times the
   rows' scales times the run's activation scale d; per group, the rows' offsets times the sum of its runs' rounded
   inputs (xs). A row past n is zero codes and zero grids: its lane computes 0. */
INLINE void tile_int8(const Mat *m, int t, const Act *a, int nb, float *out, const int fmt, const int PER) {
    const int runs = m->k / 32, per = PER ? PER : m->group / 32, groups = (m->k + m->group - 1) / m->group;
    const int ld = a->ldx / QBLOCK, half = fmt == X4H || fmt == X8H, four = fmt == X4 || fmt == X4H;
    const long run_bytes = four ? 128 : 256;
    const uint8_t *w = m->codes + (long)t * runs * run_bytes;
    const long g0 = (long)t * groups * 2 * TILE; /* this tile's grids: scales, then offsets */
    const __m256i low = _mm256_set1_epi8(15);
    __m256 acc[CHUNK], off[CHUNK];
    for (int b = 0; b < CHUNK; ++b) { acc[b] = _mm256_setzero_ps(); off[b] = _mm256_setzero_ps(); }
    for (int g = 0, r = 0; g < groups; ++g) {
        const __m256 s = tile_grid(m->grid, half, g0 + g * TILE), o = tile_grid(m->grid, half, g0 + (groups + g) * TILE);
        const int end = r + per < runs ? r + per : runs;
        __m256 xsum[CHUNK];
        for (int b = 0; b < nb; ++b) xsum[b] = _mm256_setzero_ps();
        for (; r < end; ++r, w += run_bytes)
            for (int b = 0; b < nb; ++b) {
                const int8_t *q = a->q + (long)b * a->ldx + r * 32;
                const __m256i p = four ? tile_run_x4(w, q, low) : tile_run_x8((const int8_t *)w, q);
                acc[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(s, _mm256_broadcast_ss(a->d + (long)b * ld + r)), acc[b]);
                xsum[b] = _mm256_add_ps(xsum[b], _mm256_broadcast_ss(a->xs + (long)b * ld + r));
            }
        for (int b = 0; b < nb; ++b) off[b] = _mm256_fmadd_ps(o, xsum[b], off[b]);
    }
    for (int b = 0; b < nb; ++b) _mm256_storeu_ps(out + b * TILE, _mm256_add_ps(acc[b], off[b]));
}

/* nb as a constant in each call, so the always-inlined row code keeps its accumulators in registers. */
#define BY_ROWS(CALL) switch (nb) { case 1: CALL(1); break; case 2: CALL(2); break; case 3: CALL(3); break; default: CALL(4); }
#define F32_ROW(NB) row_f32(m->w + (long)n * m->k, m->k, x, ldx, NB, out)
#define S32_ROW(NB) row_s32(m, n, x, ldx, NB, out)
#define U8_ROW(NB) row_u8_f32(m, n, x, ldx, NB, out)
#define U4_ROW(NB) if (m->group == 32) row_u4_f32(m, n, x, ldx, NB, out, 1); else row_u4_f32(m, n, x, ldx, NB, out, 0)

/* A row-layout weight meets float rows: the input itself, or with int8 activations its rounded values (the
   same products as the integer ones, up to summation order; integer inputs take the tiles). */
static void mat_row(const Mat *m, int n, const Act *a, int b0, int nb, float *out) {
    const float *x = a->x + (long)b0 * a->ldx;
    const int ldx = a->ldx;
    if (m->fmt == F32) BY_ROWS(F32_ROW) else if (m->fmt == S32) BY_ROWS(S32_ROW)
    else if (m->fmt == U8 || m->fmt == U8H) BY_ROWS(U8_ROW) else BY_ROWS(U4_ROW)
}

/* runs a group spans as a constant where common (1: groups of 32; 4: of 128), so no division a run */
#define TILE_ROWS(NB)                                                                                          \
    if (per == 1) tile_int8(m, t, &sub, NB, out, FMT, 1);                                                     \
    else if (per == 4) tile_int8(m, t, &sub, NB, out, FMT, 4);                                                \
    else tile_int8(m, t, &sub, NB, out, FMT, 0)

static void tile_rows(const Mat *m, int t, const Act *a, int b0, int nb, float *out) {
    const int runs = a->ldx / QBLOCK, per = m->group / 32;
    const Act sub = {a->x + (long)b0 * a->ldx, a->ldx, a->q + (long)b0 * a->ldx, a->d + (long)b0 * runs,
                     a->xs + (long)b0 * runs};
#define FMT X4H
    if (m->fmt == X4H) { BY_ROWS(TILE_ROWS) return; }
#undef FMT
#define FMT X4
    if (m->fmt == X4) { BY_ROWS(TILE_ROWS) return; }
#undef FMT
#define FMT X8H
    if (m->fmt == X8H) { BY_ROWS(TILE_ROWS) return; }
#undef FMT
#define FMT X8
    BY_ROWS(TILE_ROWS)
#undef FMT
}

INLINE void put(const Mat *m, int n, float v, float *dst, int add) {
    v += m->bias ? m->bias[n] : 0.0f;
    *dst = add ? *dst + v : v;
}

/* y (B, ldy) = x W^T + bias, or y += that when `add`; call inside a parallel region. Tiled weights (int8
   activations only) split their tiles over the threads, row-layout ones their rows. */
static void gemv_shared(const Mat *m, const Act *a, int B, float *y, int ldy, int add) {
    if (IS_TILE(m->fmt)) {
#pragma omp for schedule(static) nowait
        for (int t = 0; t < (m->n + TILE - 1) / TILE; ++t) {
            float out[CHUNK * TILE];
            const int rows = m->n - t * TILE < TILE ? m->n - t * TILE : TILE;
            for (int b0 = 0; b0 < B; b0 += CHUNK) {
                const int nb = B - b0 < CHUNK ? B - b0 : CHUNK;
                tile_rows(m, t, a, b0, nb, out);
                for (int b = 0; b < nb; ++b)
                    for (int i = 0; i < rows; ++i)
                        put(m, t * TILE + i, out[b * TILE + i], y + (long)(b0 + b) * ldy + t * TILE + i, add);
            }
        }
        return;
    }
#pragma omp for schedule(static) nowait
    for (int n = 0; n < m->n; ++n) {
        float out[CHUNK];
        for (int b0 = 0; b0 < B; b0 += CHUNK) {
            const int nb = B - b0 < CHUNK ? B - b0 : CHUNK;
            mat_row(m, n, a, b0, nb, out);
            for (int b = 0; b < nb; ++b) put(m, n, out[b], y + (long)(b0 + b) * ldy + n, add);
        }
    }
}

/* Floats an int8 input of (B, k) needs in scratch: codes, the rounded values, scales and run sums. */
long act_floats(int batch, int k) { return (long)batch * (k / 4 + k + 2 * (k / QBLOCK)) + 8; }

/* max |x| over the 32 values of v */
static inline float abs_max(const __m256 v[4]) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int t = 0; t < 4; ++t) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[t]));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    return _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
}

/* max |x| over n values, n a multiple of 32 */
static float abs_max_of(const float *x, int n) {
    float m = 0.0f;
    for (int j = 0; j < n; j += 32) {
        __m256 v[4];
        for (int t = 0; t < 4; ++t) v[t] = _mm256_loadu_ps(x + j + 8 * t);
        const float here = abs_max(v);
        m = here > m ? here : m;
    }
    return m;
}

/* The int8 view of B rows of k columns laid out in `scratch` (act_floats(B, k)): the rounded values, the
   per-32-column scales and run sums, then the codes. */
static Act act_layout(int B, int k, float *scratch) {
    const int blocks = k / QBLOCK;
    float *d = scratch + (long)B * k, *xs = d + (long)B * blocks;
    return (Act){scratch, k, (const int8_t *)(xs + (long)B * blocks), d, xs};
}

/* Rows r0 .. r1 - 1 of x (B, k) rounded into the layout of `act_layout(B, k, scratch)`: one symmetric grid of
   +-levels (127 for int8) per `run` columns (QBLOCK, or k: one grid a row, as the int8 sparse kernels round).
   `values`: also the rounded values as floats (the row layouts read them; tiles read only codes and sums). */
static void round_rows(const float *x, int B, int k, int run, float levels, float *scratch, int r0, int r1,
                       int values) {
    const int blocks = k / QBLOCK, per = run / QBLOCK;
    float *xhat = scratch, *d = xhat + (long)B * k, *xs = d + (long)B * blocks;
    int8_t *q = (int8_t *)(xs + (long)B * blocks);
    const __m256 top = _mm256_set1_ps(levels), bottom = _mm256_set1_ps(-levels);
    float scale = 1.0f;
    for (long i = (long)r0 * blocks; i < (long)r1 * blocks; ++i) {
        const float *src = x + (i / blocks) * k + (i % blocks) * QBLOCK;
        __m256 v[4];
        for (int t = 0; t < 4; ++t) v[t] = _mm256_loadu_ps(src + 8 * t);
        if (i % per == 0) {
            const float amax = per == 1 ? abs_max(v) : abs_max_of(src, run);
            scale = amax > 0.0f ? amax / levels : 1.0f;
        }
        const __m256 sv = _mm256_set1_ps(scale);
        __m256 sum = _mm256_setzero_ps();
        __m256i c[4];
        for (int t = 0; t < 4; ++t) { /* x / scale (a true division, as torch's), rounded half to even */
            const __m256 r = _mm256_min_ps(top, _mm256_max_ps(bottom, _mm256_round_ps(
                _mm256_div_ps(v[t], sv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
            if (values) _mm256_storeu_ps(xhat + i * QBLOCK + 8 * t, _mm256_mul_ps(r, sv));
            sum = _mm256_add_ps(sum, r);
            c[t] = _mm256_cvtps_epi32(r);
        }
        /* int32 -> int8 in column order: the packs interleave 128-bit lanes, the permute undoes it */
        const __m256i words = _mm256_packs_epi32(c[0], c[1]), words2 = _mm256_packs_epi32(c[2], c[3]);
        const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(words, words2),
                                                          _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(q + i * QBLOCK), bytes);
        d[i] = scale;
        xs[i] = scale * hsum(sum); /* the codes' sum is an exact integer in float */
    }
}

/* x (B, k) rounded into `a`, laid out in `scratch` (act_floats(B, k)). Each thread of the step rounds the
   whole input into its own scratch: B k values, cheaper than the barrier a shared copy needs. */
static void round_input(const float *x, int B, int k, int run, float levels, float *scratch, Act *a) {
    round_rows(x, B, k, run, levels, scratch, 0, B, 1);
    *a = act_layout(B, k, scratch);
}

/* The same product on its own (one-row kernels for any caller: tests, small-M linears). run > 0 rounds
   the input first, one grid of +-levels per `run` columns (a multiple of 32 dividing k), in `scratch`
   (act_floats(B, k)); run = 0 keeps it float. */
void gemv(const Mat *m, const float *x, int B, float *y, int threads, int run, float levels, float *scratch) {
    Act a = {x, m->k, NULL, NULL, NULL};
    if (run > 0) round_input(x, B, m->k, run, levels, scratch, &a);
#pragma omp parallel num_threads(threads)
    gemv_shared(m, &a, B, y, m->n, 0);
}

