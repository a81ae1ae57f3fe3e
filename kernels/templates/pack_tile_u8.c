
static void quantize_row(const float *src, uint8_t *xq, float *sx, long t, long k_from) {
    /* row t from k_from on, scalar; sx[t] already holds the row's scale; padding k hold q = 0 */
    const float scale = sx[t];
    for (long k = k_from; k < K_IN; ++k) {
        float q = nearbyintf(src[k] / scale);
        q = q > QMAX ? QMAX : (q < -QMAX ? -QMAX : q);
        xq[((k / 4) * TILE + t) * 4 + (k & 3)] = (uint8_t)((int)q + 128);
    }
    for (long k = K_IN > k_from ? K_IN : k_from; k < K_PAD; ++k) xq[((k / 4) * TILE + t) * 4 + (k & 3)] = 128;
}

static void pack_tile(const float *X, uint8_t *xq, float *sx, long m0, long mt, const float *xs) {
    (void)xs;  /* per-row scales: computed here */
    /* q as in the int16 kernels, stored as q + 128; 8 rows x 32 k at a time in vectors:
       round, clamp, narrow to bytes, order the k quads, transpose 8 x 8 quads into place */
    int32_t *xq32 = (int32_t *)xq;
    const long k32 = K_IN - K_IN % 32;
    const __m256 hi = _mm256_set1_ps(QMAX), lo = _mm256_set1_ps(-QMAX);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7), offset = _mm256_set1_epi16(128);
    long t = 0;
    for (; t + 8 <= mt; t += 8) {
        const float *src = X + (m0 + t) * K_IN;
        __m256 s[8];
        for (int i = 0; i < 8; ++i) { sx[t + i] = row_scale(src + i * K_IN); s[i] = _mm256_set1_ps(sx[t + i]); }
        for (long k = 0; k < k32; k += 32) {
            int32_t quads[8][8] __attribute__((aligned(32)));
            for (int i = 0; i < 8; ++i) {
                __m256i q[4];
                for (int j = 0; j < 4; ++j) {
                    __m256 v = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(src + i * K_IN + k + 8 * j), s[i]), EVEN);
                    q[j] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, lo), hi));
                }
                const __m256i p01 = _mm256_add_epi16(_mm256_packs_epi32(q[0], q[1]), offset);
                const __m256i p23 = _mm256_add_epi16(_mm256_packs_epi32(q[2], q[3]), offset);
                const __m256i bytes = _mm256_packus_epi16(p01, p23);
                _mm256_store_si256((__m256i *)quads[i], _mm256_permutevar8x32_epi32(bytes, order));
            }
            transpose8((const float *)quads, 8, (float *)(xq32 + (k / 4) * TILE + t), TILE);
        }
        for (int i = 0; i < 8; ++i) quantize_row(src + i * K_IN, xq, sx, t + i, k32);
    }
    for (; t < TILE; ++t) {
        if (t >= mt) {
            sx[t] = 0.0f;
            for (long k = 0; k < K_PAD; ++k) xq[((k / 4) * TILE + t) * 4 + (k & 3)] = 128;
            continue;
        }
        const float *src = X + (m0 + t) * K_IN;
        sx[t] = row_scale(src);
        quantize_row(src, xq, sx, t, 0);
    }
}
