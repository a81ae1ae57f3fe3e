
static void pack_tile(const float *X, ${elem} *xq, float *sx, long m0, long mt, const float *xs) {
    /* stride-1 conv as shifted windows (see pack_tile_window.c), quantized on each image's grid: xs[img]
       is max|x| / QMAX over the whole image, q = round-half-even(x / scale), stored as q + ${offset}. The
       kernel's k order is (i, j, c): per window position, ${word} consecutive channels form one packed
       32-bit word, and column word (c / ${word}, i, j) reads its channel group's window at its own offset
       (P_XOFF). 8 positions at a time: ${word} channel rows quantized in vectors, merged into 8 words by
       shifts, one store */
    const long img = m0 / CONV_MI, q0 = m0 % CONV_MI;
    const float scale = xs[img];
    const int32_t zero_word = ${zero_word};
    (void)mt;
    for (long t = 0; t < TILE; ++t) sx[t] = scale;
    for (long cg = 0; cg < CONV_CPAD / ${word}; ++cg) {
        int32_t *dst = (int32_t *)(xq + cg * CONV_CW * ${word});
        const float *planes[${word}];
        for (long g = 0; g < ${word}; ++g) {
            const long c = cg * ${word} + g;
            planes[g] = c < CONV_C ? X + (img * CONV_C + c) * (CONV_H * CONV_W) : NULL;
        }
        for (long f = q0, end = q0 + CONV_CW; f < end;) {
            long ih, lo, hi;
            const long len = window_span(f, end, &ih, &lo, &hi);
            int32_t *d = dst + (f - q0);
            for (long u = 0; u < lo; ++u) d[u] = zero_word;
            for (long u = hi; u < len; ++u) d[u] = zero_word;
            const long off = ih * CONV_W + f % CONV_WP - CONV_PW;
            long u = lo;
            for (; u + 8 <= hi; u += 8) {
                vi w = {0};
                for (int g = 0; g < ${word}; ++g) {
                    const vi q = planes[g] ? vquantize(LD(planes[g] + off + u) / scale) : w - w;
                    w |= ((q + ${offset}) & ${mask}) << (g * ${bits});
                }
                memcpy(d + u, &w, sizeof w);
            }
            for (; u < hi; ++u) {
                int32_t w = 0;
                for (int g = 0; g < ${word}; ++g) {
                    float q = planes[g] ? nearbyintf(planes[g][off + u] / scale) : 0.0f;
                    q = q > QMAX ? QMAX : (q < -QMAX ? -QMAX : q);
                    w |= (((int32_t)q + ${offset}) & ${mask}) << (g * ${bits});
                }
                d[u] = w;
            }
            f += len;
        }
    }
}
