#include <stdint.h>
#include <stdlib.h>
#include <omp.h>

/* Two int8 kernels chained tile by tile: per tile of M rows, the first kernel packs its rows of X
   and runs the whole tile into a private buffer (its activation included), the second packs that
   buffer (K-major already) on its own grids, runs, and writes its rows of Y. The M x N intermediate
   never goes to memory. The kernels are other libraries: their entry points come as pointers. */
typedef void (*pack_rows_fn)(const float *X, void *xq, float *sx, long m0, long mt);
typedef void (*run_tile_fn)(const void *xq, const float *sx, float *yb, const int32_t *W, const int32_t *corr,
                            const float *ws, const float *bias, const void *pattern);
typedef void (*pack_kmajor_fn)(const float *src, void *xq, float *sx);
typedef void (*unpack_fn)(const float *yb, float *Y, long m0, long mt);

struct layer {
    run_tile_fn run_tile;
    const int32_t *W, *corr;
    const float *ws, *bias;
    long n_out, packed_bytes;
    const void *pattern;  /* the kernel's pattern tables (kernels/pattern_data.py), NULL when baked */
};

void fused_pair(const float *X, float *Y, long M, long T, pack_rows_fn pack_rows, const struct layer *a,
                pack_kmajor_fn pack_kmajor, const struct layer *b, unpack_fn unpack) {
    const long tiles = (M + T - 1) / T;
    #pragma omp parallel
    {
        void *xa = aligned_alloc(64, (a->packed_bytes + 63) / 64 * 64);
        void *xb = aligned_alloc(64, (b->packed_bytes + 63) / 64 * 64);
        float *sa = aligned_alloc(64, sizeof(float) * ((T + 15) / 16 * 16));
        float *sb = aligned_alloc(64, sizeof(float) * ((T + 15) / 16 * 16));
        float *ya = aligned_alloc(64, sizeof(float) * a->n_out * T);
        float *yb = aligned_alloc(64, sizeof(float) * b->n_out * T);
        #pragma omp for schedule(dynamic, 1)  /* a slower core takes fewer tiles */
        for (long i = 0; i < tiles; ++i) {
            const long m0 = i * T, mt = M - m0 < T ? M - m0 : T;
            pack_rows(X, xa, sa, m0, mt);
            a->run_tile(xa, sa, ya, a->W, a->corr, a->ws, a->bias, a->pattern);
            pack_kmajor(ya, xb, sb);
            b->run_tile(xb, sb, yb, b->W, b->corr, b->ws, b->bias, b->pattern);
            unpack(yb, Y, m0, mt);
        }
        free(xa); free(xb); free(sa); free(sb); free(ya); free(yb);
    }
}

/* The fp32 pair: a tile's output of the first kernel (N x TILE floats, K-major) is the second's packed
   input as it is, so nothing is packed between them. */
typedef void (*pack_rows32_fn)(const float *X, float *xb, long m0, long mt, const void *pattern);
typedef void (*run_tile32_fn)(const float *xt, float *yb, const float *W, const float *bias, const void *pattern);
typedef void (*unpack32_fn)(const float *yb, float *Y, long m0, long mt, const void *pattern);

struct layer32 {
    run_tile32_fn run_tile;
    const float *W, *bias;
    long n_out, xb_floats;
    const void *pattern;
};

void fused_pair_fp32(const float *X, float *Y, long M, long T, pack_rows32_fn pack_rows, const struct layer32 *a,
                     const struct layer32 *b, unpack32_fn unpack) {
    const long tiles = (M + T - 1) / T;
    const long mid = a->n_out * T > b->xb_floats ? a->n_out * T : b->xb_floats;
    #pragma omp parallel
    {
        float *xa = aligned_alloc(64, sizeof(float) * ((a->xb_floats + 15) / 16 * 16));
        float *ya = aligned_alloc(64, sizeof(float) * ((mid + 15) / 16 * 16));
        float *yb = aligned_alloc(64, sizeof(float) * b->n_out * T);
        #pragma omp for schedule(dynamic, 1)  /* a slower core takes fewer tiles */
        for (long i = 0; i < tiles; ++i) {
            const long m0 = i * T, mt = M - m0 < T ? M - m0 : T;
            pack_rows(X, xa, m0, mt, a->pattern);
            a->run_tile(xa, ya, a->W, a->bias, a->pattern);
            b->run_tile(ya, yb, b->W, b->bias, b->pattern);
            unpack(yb, Y, m0, mt, b->pattern);
        }
        free(xa); free(ya); free(yb);
    }
}

/* The fp32 pair at few tiles of M (fewer than a few whole tiles per thread), as each kernel's own driver runs
   them: every tile packed once into a shared buffer, the first kernel's chunks split over threads into a shared
   intermediate tile (K-major: the second kernel's packed input as it is), then the second's chunks, each writing
   its rows of Y. The intermediate (M = 128, N = 3072: 1.5 MB) is never unpacked to rows nor packed again. */
typedef void (*run_chunks32_fn)(const float *xt, float *yb, float *Y, long m0, long mt, long c0, long c1,
                                const float *W, const float *bias, const void *pattern);

void fused_pair_fp32_split(const float *X, float *Y, long M, long T, pack_rows32_fn pack_rows,
                           const struct layer32 *a, run_chunks32_fn run_a, long chunks_a,
                           const struct layer32 *b, run_chunks32_fn run_b, long chunks_b) {
    const long tiles = (M + T - 1) / T;
    const long mid = a->n_out * T > b->xb_floats ? a->n_out * T : b->xb_floats;
    const long xa_stride = (a->xb_floats + 15) / 16 * 16, mid_stride = (mid + 15) / 16 * 16;  /* 64-byte rows */
    float *xa = aligned_alloc(64, sizeof(float) * xa_stride * tiles);
    float *ya = aligned_alloc(64, sizeof(float) * mid_stride * tiles);
    #pragma omp parallel
    {
        float *yb = aligned_alloc(64, sizeof(float) * b->n_out * T);
        #pragma omp for schedule(static)
        for (long i = 0; i < tiles; ++i)
            pack_rows(X, xa + i * xa_stride, i * T, M - i * T < T ? M - i * T : T, a->pattern);
        /* in order, as the kernels' own drivers: a thread's chunks of one tile follow each other */
        #pragma omp for schedule(static)
        for (long item = 0; item < tiles * chunks_a; ++item) {
            const long tile = item / chunks_a, c = item % chunks_a;
            run_a(xa + tile * xa_stride, ya + tile * mid_stride, NULL, 0, T, c, c + 1, a->W, a->bias, a->pattern);
        }
        #pragma omp for schedule(static)
        for (long item = 0; item < tiles * chunks_b; ++item) {
            const long tile = item / chunks_b, c = item % chunks_b, m0 = tile * T;
            run_b(ya + tile * mid_stride, yb, Y, m0, M - m0 < T ? M - m0 : T, c, c + 1, b->W, b->bias, b->pattern);
        }
        free(yb);
    }
    free(xa);
    free(ya);
}

/* The permute int8 pair (kernels/permute_int8.py): per tile of 16 rows of M, the first kernel's rows
   (activation included) go to a private N1-wide buffer, which the second kernel's own quantize (its
   activation bits) turns into its input, and the second writes its rows of Y. */
typedef void (*permute_quantize_fn)(const float *X, uint8_t *xq, float *sx, long m0, long mt, long K);
typedef void (*permute_tile_fn)(const uint8_t *xq, const float *sx, float *Y, long m0, long mt, long K, long N,
                                const void *layer, long b0, long b1);

void fused_pair_permute(const float *X, float *Y, long M, long K1, long N1, long N2, long T,
                        permute_quantize_fn quantize_a, permute_tile_fn run_a, const void *la,
                        permute_quantize_fn quantize_b, permute_tile_fn run_b, const void *lb) {
    const long tiles = (M + T - 1) / T, pad1 = (K1 + 63) / 64 * 64, pad2 = (N1 + 63) / 64 * 64;
    #pragma omp parallel
    {
        uint8_t *xa = aligned_alloc(64, T * pad1), *xb = aligned_alloc(64, T * pad2);
        float *ya = aligned_alloc(64, sizeof(float) * ((T * N1 + 15) / 16 * 16));
        float *sa = aligned_alloc(64, sizeof(float) * 64), *sb = aligned_alloc(64, sizeof(float) * 64);
        #pragma omp for schedule(dynamic, 1)  /* a slower core takes fewer tiles */
        for (long i = 0; i < tiles; ++i) {
            const long m0 = i * T, mt = M - m0 < T ? M - m0 : T;
            quantize_a(X, xa, sa, m0, mt, K1);
            run_a(xa, sa, ya, 0, mt, K1, N1, la, 0, (N1 + 15) / 16);
            quantize_b(ya, xb, sb, 0, mt, N1);
            run_b(xb, sb, Y, m0, mt, N1, N2, lb, 0, (N2 + 15) / 16);
        }
        free(xa); free(xb); free(ya); free(sa); free(sb);
    }
}
