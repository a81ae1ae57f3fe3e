#define VEC 8
#define QMAX ${level}
#define TILE ${tile_rows}
#define K_IN ${n_in}L
#define K_PAD ${k_pad}L
#define N_OUT ${n_out}L
#define N_CHUNKS ${n_chunks}L
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
${tables}${tiles}
${unpack}
${row_scale}
${pack}
void ${name}(const float *X, float *Y, long M, const int32_t *W, const int32_t *corr, const float *ws,
            const float *bias, const float *xs) {
    const long tiles = (M + TILE - 1) / TILE;
    const long split = tiles >= 4 * omp_get_max_threads() ? 1 : N_CHUNKS;
    ${elem} *sq = split == 1 ? NULL : aligned_alloc(64, sizeof(${elem}) * XB_ELEMS * tiles);
    float *ss = split == 1 ? NULL : aligned_alloc(64, sizeof(float) * TILE * tiles);
    #pragma omp parallel
    {
        ${elem} *xb = split == 1 ? aligned_alloc(64, sizeof(${elem}) * XB_ELEMS) : NULL;
        float *sb = split == 1 ? aligned_alloc(64, sizeof(float) * TILE) : NULL;
        float *yb = aligned_alloc(64, sizeof(float) * N_OUT * TILE);
        const vf zero = {0}; const vf one = zero + 1.0f; (void)one;
        if (split != 1) {
            #pragma omp for schedule(static)
            for (long i = 0; i < tiles; ++i)
                pack_tile(X, sq + i * XB_ELEMS, ss + i * TILE, i * TILE, M - i * TILE < TILE ? M - i * TILE : TILE, xs);
        }
        #pragma omp for schedule(static)
        for (long item = 0; item < tiles * split; ++item) {
            const long tile = item / split, m0 = tile * TILE;
            const long c0 = split == 1 ? 0 : item % split, c1 = split == 1 ? N_CHUNKS : c0 + 1;
            const long mt = M - m0 < TILE ? M - m0 : TILE;
            if (split == 1) pack_tile(X, xb, sb, m0, mt, xs);
            const ${elem} *xq = split == 1 ? xb : sq + tile * XB_ELEMS;
            const float *sx = split == 1 ? sb : ss + tile * TILE;
${loop}        }
        free(xb);
        free(sb);
        free(yb);
    }
    free(sq);
    free(ss);
}
