
static inline vi quantize8(const float *p, float scale) {
    /* 8 values on the grid: round half to even by adding 1.5 * 2^23 (|x / scale| <= QMAX by the choice
       of scale, far inside its exact range), clamp (ties at the edge), convert */
    const vf zero = {0}, magic = zero + 12582912.0f, top = zero + QMAX;
    vf v = LD(p) / scale;
    v = (v + magic) - magic;
    v = vsel(v > top, top, v);
    v = vsel(v < -top, -top, v);
    return __builtin_convertvector(v, vi);
}

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
            const long col = f % CONV_WP, ih = f / CONV_WP - CONV_PH;
            const long len = CONV_WP - col < end - f ? CONV_WP - col : end - f;
            int32_t *d = dst + (f - q0);
            long lo = 0, hi = 0;  /* positions lo..hi read input row ih, the rest is zero padding */
            if (ih >= 0 && ih < CONV_H) {
                lo = CONV_PW - col > 0 ? CONV_PW - col : 0;
                hi = CONV_PW + CONV_W - col < len ? CONV_PW + CONV_W - col : len;
                lo = lo < hi ? lo : hi;
            }
            for (long u = 0; u < lo; ++u) d[u] = zero_word;
            for (long u = hi > lo ? hi : lo; u < len; ++u) d[u] = zero_word;
            const long off = ih * CONV_W + (col - CONV_PW);
            long u = lo;
            for (; u + 8 <= hi; u += 8) {
                vi w = {0};
                for (int g = 0; g < ${word}; ++g) {
                    const vi q = planes[g] ? quantize8(planes[g] + off + u, scale) : w - w;
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
