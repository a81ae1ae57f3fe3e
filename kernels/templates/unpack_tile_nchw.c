
static void unpack_tile(const float *yb, float *Y, long m0, long mt, long r0, long r1, const struct pattern *P) {
    (void)P;  /* N_OUT may be its field */
    /* Y is the conv output, N x N_OUT x OH x OW: a tile's rows inside one image are consecutive pixels,
       so each output channel's share of the tile is one contiguous copy (no transpose) */
    for (long t0 = 0; t0 < mt;) {
        const long m = m0 + t0, img = m / CONV_OHW, pix = m % CONV_OHW;
        const long len = CONV_OHW - pix < mt - t0 ? CONV_OHW - pix : mt - t0;
        for (long n = r0; n < r1; ++n) {
            float *dst = Y + (img * N_OUT + n) * CONV_OHW + pix;
            const float *src = yb + n * TILE + t0;
            for (long u = 0; u < len; ++u) dst[u] = src[u];
        }
        t0 += len;
    }
}
