void ${name}(const float *X, float *Y, long M, const float *W, const float *bias, const struct pattern *P) {
    const long tiles = (M + TILE - 1) / TILE;
    const long split = tiles >= 4 * omp_get_max_threads() ? 1 : N_CHUNKS;  /* chunk runs per tile */
    /* small M: every tile is packed once into a shared buffer, then chunks split over threads */
    float *shared = split == 1 ? NULL : aligned_alloc(64, sizeof(float) * XB_FLOATS * tiles);
    #pragma omp parallel
    {
        float *xb = split == 1 ? aligned_alloc(64, sizeof(float) * XB_FLOATS) : NULL;
        float *yb = aligned_alloc(64, sizeof(float) * N_OUT * TILE);
        const vf zero = {0}; const vf one = zero + 1.0f; (void)one;
        if (split != 1) {
            #pragma omp for schedule(static)
            for (long i = 0; i < tiles; ++i) {
                const long m0 = i * TILE;
                pack_tile(X, shared + i * XB_FLOATS, m0, M - m0 < TILE ? M - m0 : TILE, P);
            }
        }
        #pragma omp for schedule(static)
        for (long item = 0; item < tiles * split; ++item) {
            const long tile = item / split, m0 = tile * TILE;
            const long c0 = split == 1 ? 0 : item % split, c1 = split == 1 ? N_CHUNKS : c0 + 1;
            const long mt = M - m0 < TILE ? M - m0 : TILE;
            if (split == 1) pack_tile(X, xb, m0, mt, P);
            const float *xt = split == 1 ? xb : shared + tile * XB_FLOATS;
${body}        }
        free(xb);
        free(yb);
    }
    free(shared);
}
