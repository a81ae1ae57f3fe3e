#define VEC 8
#define QMAX ${level}
#define TILE ${tile_rows}
#define K_IN ${n_in}L
#define K_PAD ${k_pad}L
#define N_OUT ${n_out}L
${defines}#ifndef XB_ELEMS
#define XB_ELEMS (K_PAD * TILE)  /* elements of one packed X tile: K rows of TILE */
#endif
#include <stdlib.h>
#include <stdint.h>
#include <math.h>
#include <omp.h>
#include <immintrin.h>
${prelude}${extra}
static inline float bias_of(const float *bias, long n) { return bias ? bias[n] : 0.0f; }
static inline vi vquantize(vf v) {
    /* v = x / scale onto the grid: round half to even by adding 1.5 * 2^23 (|v| <= QMAX by the choice of
       scale, far inside its exact range), clamp (ties at the edge), convert */
    const vf zero = {0}, magic = zero + 12582912.0f, top = zero + QMAX;
    v = (v + magic) - magic;
    v = vsel(v > top, top, v);
    v = vsel(v < -top, -top, v);
    return __builtin_convertvector(v, vi);
}
${tables}${tiles}
${unpack}
${row_scale}
${pack}
/* Chunks c0..c1 of a packed tile (xq, its row scales sx) into yb (N_OUT x TILE), then those rows of yb to
   rows m0.. of Y (none when Y is NULL: a fused pair reads yb). */
static void run_item(const ${elem} *xq, const float *sx, float *yb, float *Y, long m0, long mt, long c0, long c1,
                     const int32_t *W, const int32_t *corr, const float *ws, const float *bias,
                     const struct pattern *P) {
    const vf zero = {0}; const vf one = zero + 1.0f; (void)one; (void)zero;
${loop}}

void ${name}(const float *X, float *Y, long M, const int32_t *W, const int32_t *corr, const float *ws,
            const float *bias, const float *xs, const struct pattern *P) {
    const long tiles = (M + TILE - 1) / TILE;
    const long split = tiles >= 4 * omp_get_max_threads() ? 1 : N_CHUNKS;
    ${elem} *sq = split == 1 ? NULL : aligned_alloc(64, sizeof(${elem}) * XB_ELEMS * tiles);
    float *ss = split == 1 ? NULL : aligned_alloc(64, sizeof(float) * TILE * tiles);
    #pragma omp parallel
    {
        ${elem} *xb = split == 1 ? aligned_alloc(64, sizeof(${elem}) * XB_ELEMS) : NULL;
        float *sb = split == 1 ? aligned_alloc(64, sizeof(float) * TILE) : NULL;
        float *yb = aligned_alloc(64, sizeof(float) * N_OUT * TILE);
        if (split == 1) {
            /* whole tiles handed out one at a time: a slower core (a busy neighbour) takes fewer */
            #pragma omp for schedule(dynamic, 1)
            for (long tile = 0; tile < tiles; ++tile) {
                const long m0 = tile * TILE, mt = M - m0 < TILE ? M - m0 : TILE;
                pack_tile(X, xb, sb, m0, mt, xs);
                run_item(xb, sb, yb, Y, m0, mt, 0, N_CHUNKS, W, corr, ws, bias, P);
            }
        } else {
            /* few tiles: each packed once, its chunks split over threads, in order: a thread runs the tiles
               it packed (handed out one at a time, items read the other core's packed tiles: M = 128 0.30 ->
               0.38 ms at 768 -> 3072) */
            #pragma omp for schedule(static)
            for (long i = 0; i < tiles; ++i)
                pack_tile(X, sq + i * XB_ELEMS, ss + i * TILE, i * TILE, M - i * TILE < TILE ? M - i * TILE : TILE, xs);
            #pragma omp for schedule(static)
            for (long item = 0; item < tiles * split; ++item) {
                const long tile = item / split, m0 = tile * TILE, c = item % split;
                run_item(sq + tile * XB_ELEMS, ss + tile * TILE, yb, Y, m0, M - m0 < TILE ? M - m0 : TILE, c, c + 1,
                         W, corr, ws, bias, P);
            }
        }
        free(xb);
        free(sb);
        free(yb);
    }
    free(sq);
    free(ss);
}

/* Entry points for a fused driver that chains kernels tile by tile (kernels/fused_ffn.py): the
   previous kernel's output tile (N x TILE floats, K-major for this one) is packed without ever
   reaching memory as an M x N matrix. */
long ${name}_tile_rows(void) { return TILE; }

long ${name}_packed_bytes(void) { return (long)sizeof(${elem}) * XB_ELEMS; }

void ${name}_pack_rows(const float *X, ${elem} *xq, float *sx, long m0, long mt) {
    pack_tile(X, xq, sx, m0, mt, NULL);
}

void ${name}_run_tile(const ${elem} *xq, const float *sx, float *yb, const int32_t *W, const int32_t *corr,
                      const float *ws, const float *bias, const struct pattern *P) {
    /* every chunk of one tile into yb (N_OUT x TILE): sums, empty rows, activation; nothing to Y */
    run_item(xq, sx, yb, NULL, 0, TILE, 0, N_CHUNKS, W, corr, ws, bias, P);
}

void ${name}_pack_kmajor(const float *src, ${elem} *xq, float *sx) {
    /* src is K_IN x TILE floats (a tile of the previous layer's output, K-major). Each row t gets its
       own grid, as pack_tile gives rows of X: scale = max_k |src[k][t]| / QMAX, q = round-half-even;
       ${word} k per packed 32-bit word (stored + ${offset}), 8 rows of M at a time in vectors */
    const vf zero = {0};
    vf m[TILE / 8];  /* k outer: one sweep over src (t outer swept it TILE / 8 times, 3 of 23 ms in a BERT FFN) */
    for (long i = 0; i < TILE / 8; ++i) m[i] = zero;
    for (long k = 0; k < K_IN; ++k)
        for (long i = 0; i < TILE / 8; ++i) {
            const vf v = LD(src + k * TILE + 8 * i);
            m[i] = vsel(v > m[i], v, m[i]);
            m[i] = vsel(-v > m[i], -v, m[i]);
        }
    for (long i = 0; i < TILE / 8; ++i) ST(sx + 8 * i, vsel(m[i] > zero, m[i] / QMAX, zero + 1.0f));
    int32_t *out = (int32_t *)xq;
    for (long kw = 0; kw < K_PAD / ${word}; ++kw)
        for (long t = 0; t < TILE; t += 8) {
            const vf s = LD(sx + t);
            vi w = {0};
            for (int g = 0; g < ${word}; ++g) {
                const long k = kw * ${word} + g;
                const vi q = k < K_IN ? vquantize(LD(src + k * TILE + t) / s) : w - w;
                w |= ((q + ${offset}) & ${mask}) << (g * ${bits});
            }
            memcpy(out + kw * TILE + t, &w, sizeof w);
        }
}

void ${name}_unpack(const float *yb, float *Y, long m0, long mt) { unpack_tile(yb, Y, m0, mt, 0, N_OUT, NULL); }
