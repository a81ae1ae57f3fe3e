
static void pack_tile(const float *X, float *xb, long m0, long mt, const struct pattern *P) {
    (void)P;  /* K_IN may be its field (a kernel shared by every shape: bsr_codegen) */
    /* xb[k][t] = X[m0 + t][k]; blocked over k so the written rows of xb stay in L1 */
    for (long k0 = 0; k0 < K_IN; k0 += 64) {
        const long k1 = k0 + 64 < K_IN ? k0 + 64 : K_IN;
        long t = 0;
        /* whole 8 x 8 blocks through registers (a scalar copy took 3 of 16 ms at 4096 x 3072 -> 768) */
        const long k8 = k0 + (k1 - k0) / 8 * 8;
        for (; t + 8 <= mt; t += 8) {
            const float *src = X + (m0 + t) * K_IN;
            for (long k = k0; k < k8; k += 8) transpose8(src + k, K_IN, xb + k * TILE + t, TILE);
            for (long k = k8; k < k1; ++k)
                for (long i = 0; i < 8; ++i) xb[k * TILE + t + i] = src[i * K_IN + k];
        }
        for (; t < mt; ++t) {
            const float *src = X + (m0 + t) * K_IN;
            for (long k = k0; k < k1; ++k) xb[k * TILE + t] = src[k];
        }
        for (t = mt; t < TILE; ++t)
            for (long k = k0; k < k1; ++k) xb[k * TILE + t] = 0.0f;
    }
}
