/* Scattered int8 linear with the weights in registers and the activations permuted (kernels/permute_int8.py).
   Rows n in blocks of 16 (one int32 lane each), k in windows of 64 (one vector of u8 x for one row of M).
   A block's steps each hold a weight vector (lane i: 4 of row i's kept weights in one window) and a byte
   permutation (lane i: their 4 k inside the window): per row m of a tile of 16, vperm gathers those x and
   vdot adds the 4 products into lane i. Y is written row-major, dequantized, as the accumulators finish.
   A cell's (block, window) steps run up to ${chunk} at a time with their vectors held in registers, so each row's
   64 bytes of x are loaded once per chunk, not once per step. Cells run in runs of equal step counts, each a
   loop with a body unrolled for its count (kernels/permute_int8.py, plan_steps). */
#define VEC 16
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
${prelude}
${dot}
#define MT 16  /* rows of M per tile: one accumulator each */
#define HAS_ACT ${has_act}
typedef uint8_t vu8 __attribute__((vector_size(16)));

/* The vector parts of a row's quantization: the largest |x| over whole vectors, and q over whole vectors (from
   k = 0 each; both return where they stopped, the scalar tails in quantize_tile finish the row). On AVX-512 in
   intrinsics: max and min for the clamps and the maximum, the CPU's round-to-nearest-even conversion and one
   narrowing store (generic vector selects are three instructions each: the FFN pair 12.3 -> 10.0 ms). */
#if defined(__AVX512F__)
#include <immintrin.h>
static long row_max(const float *src, long K, float *amax) {
    __m512 m = _mm512_setzero_ps();
    long k = 0;
    for (; k + 16 <= K; k += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(src + k)));
    *amax = _mm512_reduce_max_ps(m);
    return k;
}

static long row_quantize(const float *src, uint8_t *dst, float s, long K) {
    const __m512 top = _mm512_set1_ps(QMAX), bottom = _mm512_set1_ps(-QMAX), sv = _mm512_set1_ps(s);
    const __m512i offset = _mm512_set1_epi32(128);
    long k = 0;
    for (; k + 16 <= K; k += 16) {
        __m512 v = _mm512_div_ps(_mm512_loadu_ps(src + k), sv);  /* a division, as the reference's x / s */
        v = _mm512_min_ps(_mm512_max_ps(v, bottom), top);  /* clamped to integers, then rounded: the same q */
        const __m512i q = _mm512_add_epi32(_mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT |
                                                                      _MM_FROUND_NO_EXC), offset);
        _mm_storeu_si128((__m128i *)(dst + k), _mm512_cvtepi32_epi8(q));
    }
    return k;
}
#else
static long row_max(const float *src, long K, float *amax) {
    const vf zero = {0};
    vf m = zero;
    long k = 0;
    for (; k + VEC <= K; k += VEC) {  /* |x| by the sign bit, max in vectors (a scalar loop does not vectorize) */
        vf v; memcpy(&v, src + k, sizeof v);
        v = (vf)((vi)v & 0x7fffffff);
        m = vsel(v > m, v, m);
    }
    *amax = 0.0f;
    for (long i = 0; i < VEC; ++i) *amax = m[i] > *amax ? m[i] : *amax;
    return k;
}

static long row_quantize(const float *src, uint8_t *dst, float s, long K) {
    const vf zero = {0}, magic = zero + 12582912.0f, top = zero + QMAX;
    long k = 0;
    for (; k + VEC <= K; k += VEC) {
        vf v; memcpy(&v, src + k, sizeof v);
        v = (v / s + magic) - magic;
        v = vsel(v > top, top, v);
        v = vsel(v < -top, -top, v);
        const vu8 q = __builtin_convertvector(__builtin_convertvector(v, vi) + 128, vu8);
        memcpy(dst + k, &q, sizeof q);
    }
    return k;
}
#endif

static void quantize_tile(const float *X, uint8_t *xq, float *sx, long m0, long mt, long K, long K_PAD) {
    /* row t: scale max|x| / QMAX (1 for a zero row), q = round-half-even(x / scale) + 128; padding k and rows: 128 */
    for (long t = 0; t < MT; ++t) {
        uint8_t *dst = xq + t * K_PAD;
        if (t >= mt) { memset(dst, 128, K_PAD); sx[t] = 1.0f; continue; }
        const float *src = X + (m0 + t) * K;
        float amax;
        long k = row_max(src, K, &amax);
        for (; k < K; ++k) { const float a = src[k] < 0 ? -src[k] : src[k]; amax = a > amax ? a : amax; }
        const float s = amax > 0.0f ? amax / QMAX : 1.0f;
        sx[t] = s;
        for (k = row_quantize(src, dst, s, K); k < K; ++k) {
            float q = ((src[k] / s) + 12582912.0f) - 12582912.0f;
            q = q > QMAX ? QMAX : (q < -QMAX ? -QMAX : q);
            dst[k] = (uint8_t)((int)q + 128);
        }
        memset(dst + K, 128, K_PAD - K);
    }
}

static void act_rows(float *Y, long m0, long mt, long N, long n0, long n1) {
    /* the activation over rows m0.. (columns n0..n1) of Y as they leave the tile, a pass of its own: inlined
       into each of the 16 accumulators' stores, GELU's constants left the registers (3.1 of 8 ms at 768->3072) */
    const vf zero = {0}; const vf one = zero + 1.0f; (void)one;
    for (long t = 0; t < mt; ++t) {
        float *row = Y + (m0 + t) * N;
        long n = n0;
        for (; n + VEC <= n1; n += VEC) { vf v; memcpy(&v, row + n, sizeof v); ${act} memcpy(row + n, &v, sizeof v); }
        if (n < n1) {
            vf v = zero;
            memcpy(&v, row + n, sizeof(float) * (n1 - n));
            ${act}
            memcpy(row + n, &v, sizeof(float) * (n1 - n));
        }
    }
}

/* One layer's tables (kernels/permute_int8.py, Steps): steps (k bytes, weight bytes), each cell's window, the
   runs (steps per cell, cells, first step, first cell), each block's first run, the offset correction, weight
   scales and bias. */
struct permute_layer {
    const VD *idx, *w;
    const int32_t *windows;
    const int64_t *runs, *block_runs;
    const int32_t *corr;
    const float *ws, *bias;
};

void permute_int8_quantize(const float *X, uint8_t *xq, float *sx, long m0, long mt, long K) {
    quantize_tile(X, xq, sx, m0, mt, K, (K + 63) / 64 * 64);
}

void permute_int8_tile(const uint8_t *xq, const float *sx, float *Y, long m0, long mt, long K, long N,
                       const struct permute_layer *L, long b0, long b1) {
    /* blocks b0..b1 of one quantized tile of M (MT rows of K_PAD bytes) into rows m0.. of Y (N wide) */
    const long K_PAD = (K + 63) / 64 * 64;
    const VD *idx = L->idx, *w = L->w;
    const int32_t *corr = L->corr;
    const float *ws = L->ws, *bias = L->bias;
    for (long b = b0; b < b1; ++b) {
${acc}
        for (long r = L->block_runs[b]; r < L->block_runs[b + 1]; ++r) {
            const int64_t *run = L->runs + 4 * r;
            const long count = run[0], cells = run[1];
            long s = run[2];
            const int32_t *cw = L->windows + run[3];
            switch (count) {
${cases}
            default:  /* denser cells: chunks in a loop */
                for (long j = 0; j < cells; ++j) {
                    const uint8_t *xw = xq + (long)cw[j] * 64;
                    const long end = s + count;
                    for (; s + ${chunk} <= end; s += ${chunk}) ${steps_chunk}
                    for (; s < end; ++s) ${steps_one}
                }
            }
        }
        const long n0 = b * 16, nn = N - n0 < 16 ? N - n0 : 16;
        VD cv = {0};
        vf wsv = {0}, bv = {0};
        if (nn == 16) {  /* every block but a ragged last one: three vector loads, not 48 guarded scalars */
            memcpy(&cv, corr + n0, sizeof cv);
            memcpy(&wsv, ws + n0, sizeof wsv);
            if (bias) memcpy(&bv, bias + n0, sizeof bv);
        } else {
            for (long i = 0; i < nn; ++i) {  /* rows past N: their sums are 0 and never stored */
                cv[i] = corr[n0 + i];
                wsv[i] = ws[n0 + i];
                bv[i] = bias ? bias[n0 + i] : 0.0f;
            }
        }
${stores}
    }
    if (HAS_ACT) act_rows(Y, m0, mt, N, b0 * 16, b1 * 16 < N ? b1 * 16 : N);
}

long permute_int8_tile_rows(void) { return MT; }

void permute_int8(const float *X, float *Y, long M, long K, long N, const struct permute_layer *L) {
    const long K_PAD = (K + 63) / 64 * 64, blocks = (N + 15) / 16, tiles = (M + MT - 1) / MT;
    /* few tiles of M: each tile's blocks are split over threads too (the tile is quantized per item) */
    const long want = 4L * omp_get_max_threads();
    const long split = tiles >= want ? 1 : (want + tiles - 1) / tiles < blocks ? (want + tiles - 1) / tiles : blocks;
    #pragma omp parallel
    {
        uint8_t *xq = aligned_alloc(64, MT * K_PAD);
        float sx[MT];
        long quantized = -1;
        if (split == 1) {
            /* whole tiles handed out one at a time: a slower core (a busy neighbour) takes fewer */
            #pragma omp for schedule(dynamic, 1)
            for (long tile = 0; tile < tiles; ++tile) {
                const long m0 = tile * MT, mt = M - m0 < MT ? M - m0 : MT;
                quantize_tile(X, xq, sx, m0, mt, K, K_PAD);
                permute_int8_tile(xq, sx, Y, m0, mt, K, N, L, 0, blocks);
            }
        } else {
            /* in order, so that a thread's items of one tile follow each other and it quantizes the tile once */
            #pragma omp for schedule(static)
            for (long item = 0; item < tiles * split; ++item) {
                const long tile = item / split, part = item % split, m0 = tile * MT;
                const long mt = M - m0 < MT ? M - m0 : MT;
                if (quantized != tile) { quantize_tile(X, xq, sx, m0, mt, K, K_PAD); quantized = tile; }
                permute_int8_tile(xq, sx, Y, m0, mt, K, N, L, blocks * part / split, blocks * (part + 1) / split);
            }
        }
        free(xq);
    }
}
