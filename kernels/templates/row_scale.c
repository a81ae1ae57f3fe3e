
static float row_scale(const float *src) {
    __m256 m = _mm256_setzero_ps();
    const __m256 sign = _mm256_set1_ps(-0.0f);
    long k = 0;
    for (; k + 8 <= K_IN; k += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(src + k)));
    float lanes[8], amax = 0.0f;
    _mm256_storeu_ps(lanes, m);
    for (int i = 0; i < 8; ++i) amax = lanes[i] > amax ? lanes[i] : amax;
    for (; k < K_IN; ++k) { const float a = fabsf(src[k]); amax = a > amax ? a : amax; }
    return amax > 0.0f ? amax / QMAX : 1.0f;
}

#define EVEN (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)  /* round half to even, as nearbyintf */
