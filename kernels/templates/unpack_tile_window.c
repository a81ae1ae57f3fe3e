
static void unpack_tile(const float *yb, float *Y, long m0, long mt, long r0, long r1, const struct pattern *P) {
    (void)P;  /* N_OUT may be its field */
    /* Y is the conv output, N x N_OUT x OH x OW; tile row t is grid point q0 + t of its image's WP-wide
       output grid: grid columns from OW on, and grid rows from OH on (tile padding), are dropped */
    const long img = m0 / CONV_MI, q0 = m0 % CONV_MI;
    for (long t = 0; t < mt;) {
        const long q = q0 + t, oh = q / CONV_WP, ow = q % CONV_WP;
        const long len = CONV_WP - ow < mt - t ? CONV_WP - ow : mt - t;
        if (oh < CONV_OH && ow < CONV_OW) {
            const long kept = CONV_OW - ow < len ? CONV_OW - ow : len;
            for (long n = r0; n < r1; ++n) {
                float *dst = Y + ((img * N_OUT + n) * CONV_OH + oh) * CONV_OW + ow;
                const float *src = yb + n * TILE + t;
                for (long u = 0; u < kept; ++u) dst[u] = src[u];
            }
        }
        t += len;
    }
}
