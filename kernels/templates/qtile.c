
static inline void qtile${r}(const ${elem} *xq, const float *sx, float *yb, long t, long g, const int32_t *W,
                           const int32_t *corr, const float *ws, const float *bias) {
${head}    const vf zero = {0}; const vf one = zero + 1.0f; (void)one;
${consts}    ${acc}
${counters}    const long n0 = G_ROW0[g];
    const int32_t *w = W + G_WOFF[g];
    for (long s = G_SEGPTR[g]; s < G_SEGPTR[g + 1]; ++s) {
        const ${elem} *x = xq + (G_SEGK0[s] / ${word}) * TILE * ${word} + t * ${word};
        for (long q = G_SEGLEN[s] / ${word}; q > 0; --q, x += ${word} * TILE, w += ${r}) {
            ${body}
        }
    }
${after}    ${stores}
}
