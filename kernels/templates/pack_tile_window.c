
static void pack_tile(const float *X, float *xb, long m0, long mt, const struct pattern *P) {
    (void)P;  /* K_IN may be its field (a kernel shared by every shape: bsr_codegen) */
    /* stride-1 conv as shifted windows. Each image owns CONV_MI rows: its output on a grid as wide as
       the padded input (CONV_WP; the last WP - OW columns of a grid row are computed and dropped), padded
       to whole tiles. im2col value (q, c, i, j) is the padded plane c at flat index q + i * DH * WP + j * DW,
       so xb holds, per channel, one window of the padded plane from the tile's first q (CONV_CW floats)
       and column k reads it at its own offset (P_X): the plane is copied once, not kh x kw times */
    const long img = m0 / CONV_MI, q0 = m0 % CONV_MI;
    (void)mt;
    for (long c = 0; c < CONV_C; ++c) {
        const float *plane = X + (img * CONV_C + c) * (CONV_H * CONV_W);
        float *dst = xb + c * CONV_CW;
        for (long f = q0, end = q0 + CONV_CW; f < end;) {
            long ih, lo, hi;
            const long len = window_span(f, end, &ih, &lo, &hi);
            float *d = dst + (f - q0);
            if (lo < hi) {
                const float *row = plane + ih * CONV_W + f % CONV_WP - CONV_PW;
                for (long u = lo; u < hi; ++u) d[u] = row[u];
            }
            for (long u = 0; u < lo; ++u) d[u] = 0.0f;
            for (long u = hi; u < len; ++u) d[u] = 0.0f;
            f += len;
        }
    }
}
