
/* 8 x 8 float blocks in 32-byte vectors whatever VEC is: 16-float kernels (AVX-512) copy their tiles through them
   too (copied element by element, fp32 768 -> 3072 at M = 4096 took 7.9 instead of 6.2 ms at 32x32 and 15.0
   instead of 13.4 ms unstructured) */
typedef float v8f __attribute__((vector_size(32), aligned(4)));
typedef int32_t v8i __attribute__((vector_size(32)));
#define LD8(p) (*(const v8f *)(p))
#define ST8(p, v) (*(v8f *)(p) = (v))
static inline void transpose8(const float *src, long src_stride, float *dst, long dst_stride) {
    /* dst[j * dst_stride + i] = src[i * src_stride + j] for an 8 x 8 block, in registers */
    const v8i lo = {0, 8, 1, 9, 4, 12, 5, 13}, hi = {2, 10, 3, 11, 6, 14, 7, 15};
    const v8i lo2 = {0, 1, 8, 9, 4, 5, 12, 13}, hi2 = {2, 3, 10, 11, 6, 7, 14, 15};
    const v8i lo4 = {0, 1, 2, 3, 8, 9, 10, 11}, hi4 = {4, 5, 6, 7, 12, 13, 14, 15};
    v8f r[8];
    for (int i = 0; i < 8; ++i) r[i] = LD8(src + i * src_stride);
    v8f a0 = __builtin_shuffle(r[0], r[1], lo), a1 = __builtin_shuffle(r[0], r[1], hi);
    v8f a2 = __builtin_shuffle(r[2], r[3], lo), a3 = __builtin_shuffle(r[2], r[3], hi);
    v8f a4 = __builtin_shuffle(r[4], r[5], lo), a5 = __builtin_shuffle(r[4], r[5], hi);
    v8f a6 = __builtin_shuffle(r[6], r[7], lo), a7 = __builtin_shuffle(r[6], r[7], hi);
    v8f b0 = __builtin_shuffle(a0, a2, lo2), b1 = __builtin_shuffle(a0, a2, hi2);
    v8f b2 = __builtin_shuffle(a1, a3, lo2), b3 = __builtin_shuffle(a1, a3, hi2);
    v8f b4 = __builtin_shuffle(a4, a6, lo2), b5 = __builtin_shuffle(a4, a6, hi2);
    v8f b6 = __builtin_shuffle(a5, a7, lo2), b7 = __builtin_shuffle(a5, a7, hi2);
    ST8(dst + 0 * dst_stride, __builtin_shuffle(b0, b4, lo4)); ST8(dst + 4 * dst_stride, __builtin_shuffle(b0, b4, hi4));
    ST8(dst + 1 * dst_stride, __builtin_shuffle(b1, b5, lo4)); ST8(dst + 5 * dst_stride, __builtin_shuffle(b1, b5, hi4));
    ST8(dst + 2 * dst_stride, __builtin_shuffle(b2, b6, lo4)); ST8(dst + 6 * dst_stride, __builtin_shuffle(b2, b6, hi4));
    ST8(dst + 3 * dst_stride, __builtin_shuffle(b3, b7, lo4)); ST8(dst + 7 * dst_stride, __builtin_shuffle(b3, b7, hi4));
}

static void unpack_tile(const float *yb, float *Y, long m0, long mt, long r0, long r1, const struct pattern *P) {
    (void)P;  /* N_OUT may be its field */
    /* Y[m0 + t][n] = yb[n][t] for rows r0..r1 */
    /* 8 x 8 blocks transposed in registers: each Y row gets one 32-byte store per block.
       Blocks of 8 t outer, rows inner: the 8 rows of Y are written left to right, whole
       cache lines in order (rows outer left half-lines behind: 2 ms of 5 at 4096 x 3072) */
    const long t_full = mt - mt % 8, n_full = r0 + (r1 - r0) / 8 * 8;
    for (long t = 0; t < t_full; t += 8)
        for (long n_vec = r0; n_vec < n_full; n_vec += 8)
            transpose8(yb + n_vec * TILE + t, TILE, Y + (m0 + t) * N_OUT + n_vec, N_OUT);
    for (long t = t_full; t < mt; ++t)
        for (long n = r0; n < n_full; ++n) Y[(m0 + t) * N_OUT + n] = yb[n * TILE + t];
    /* the remaining rows (fewer than 8) */
    for (long t = 0; t < mt; ++t) {
        float *dst = Y + (m0 + t) * N_OUT;
        for (long n = n_full; n < r1; ++n) dst[n] = yb[n * TILE + t];
    }
}
