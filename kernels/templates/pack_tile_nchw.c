
static void pack_tile(const float *X, float *xb, long m0, long mt, const struct pattern *P) {
    (void)P;  /* K_IN may be its field (a kernel shared by every shape: bsr_codegen) */
    /* implicit im2col: X is the conv input, N x C x H x W. Row m of the im2col matrix is output pixel
       (image, oh, ow), column k = (c * KH + i) * KW + j (the weight's own flattening). xb[k][t] is that
       row's value (0 in the padding). A tile's rows split into runs of consecutive pixels of one output
       row (of one image when the conv is flat: 1x1, stride 1, no padding), so every row of xb is filled
       by a few contiguous (or strided) copies and no M x K matrix is ever written */
    long run_t[TILE + 1], run_img[TILE], run_pix[TILE];
    long runs = 0;
    for (long t = 0; t < mt; ++runs) {
        const long m = m0 + t, img = m / CONV_OHW, pix = m % CONV_OHW;
        long len = CONV_FLAT ? CONV_OHW - pix : CONV_OW - pix % CONV_OW;
        if (len > mt - t) len = mt - t;
        run_t[runs] = t;
        run_img[runs] = img;
        run_pix[runs] = pix;
        t += len;
    }
    run_t[runs] = mt;
    for (long c = 0; c < CONV_C; ++c)
        for (long i = 0; i < CONV_KH; ++i)
            for (long j = 0; j < CONV_KW; ++j) {
                float *dst = xb + ((c * CONV_KH + i) * CONV_KW + j) * TILE;
                for (long r = 0; r < runs; ++r) {
                    const long len = run_t[r + 1] - run_t[r];
                    const float *plane = X + (run_img[r] * CONV_C + c) * (CONV_H * CONV_W);
                    float *d = dst + run_t[r];
                    if (CONV_FLAT) {
                        const float *s = plane + run_pix[r];
                        for (long u = 0; u < len; ++u) d[u] = s[u];
                        continue;
                    }
                    const long ih = run_pix[r] / CONV_OW * CONV_SH - CONV_PH + i * CONV_DH;
                    const long iw0 = run_pix[r] % CONV_OW * CONV_SW - CONV_PW + j * CONV_DW;
                    long lo = 0, hi = 0;  /* d[lo..hi) reads the input, the rest is zero padding */
                    if (ih >= 0 && ih < CONV_H) {
                        lo = iw0 >= 0 ? 0 : (CONV_SW - 1 - iw0) / CONV_SW;
                        hi = iw0 < CONV_W ? (CONV_W - iw0 + CONV_SW - 1) / CONV_SW : 0;
                        hi = hi < len ? hi : len;
                        lo = lo < hi ? lo : hi;
                        const float *row = plane + ih * CONV_W;
                        for (long u = lo; u < hi; ++u) d[u] = row[iw0 + u * CONV_SW];
                    }
                    for (long u = 0; u < lo; ++u) d[u] = 0.0f;
                    for (long u = hi; u < len; ++u) d[u] = 0.0f;
                }
                for (long t = mt; t < TILE; ++t) dst[t] = 0.0f;
            }
}
