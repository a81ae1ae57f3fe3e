
static inline void qtile${r}(const ${elem} *xq, const float *sx, float *yb, long t, long e, const int32_t *W,
                           const int32_t *corr, const float *ws, const float *bias, const struct pattern *restrict P) {
    (void)P;
${head}    const vf zero = {0}; const vf one = zero + 1.0f; (void)one;
    const long n0 = G_ROW0[E_G[e]];
    const int first = (E_FLAGS[e] & 1) != 0, last = (E_FLAGS[e] & 2) != 0;
    int32_t *yi = (int32_t *)yb;  /* int32 sums wait in the tile's output buffer between panels */
    (void)yi;
${consts}    ${acc}
${counters}    const int32_t *w = W + E_WOFF[e];
    const ${elem} *xt = xq + t * ${word};
    if (E_FLAGS[e] & ${one_word}) {  /* scattered: every piece is one word, so one flat loop over the pieces */
        for (long p = E_P0[e]; p < E_P1[e]; ++p, w += ${r}) {
            const ${elem} *x = xt + P_XOFF[p];
            ${body}
        }
    } else {
        for (long p = E_P0[e]; p < E_P1[e]; ++p) {
            const ${elem} *x = xt + P_XOFF[p];
            for (long q = P_WORDS[p]; q > 0; --q, x += ${word} * TILE, w += ${r}) {
                ${body}
            }
        }
    }
${after}    if (last) { ${stores} } else { ${spill} }
}
