
#include <stdint.h>
#include <string.h>
typedef float vf __attribute__((vector_size(VEC * 4), aligned(4)));
typedef int32_t vi __attribute__((vector_size(VEC * 4), aligned(4)));
#define LD(p) (*(const vf *)(p))
#define ST(p, v) (*(vf *)(p) = (v))

static inline vf vsel(vi mask, vf a, vf b) { return (vf)(((vi)a & mask) | ((vi)b & ~mask)); }

/* vrcp: 1 / d for d in [1, 2^20] (GELU's and SiLU's denominators): the CPU's reciprocal estimate (2^-14 or
   2^-12) and one Newton step (2^-23 or better). A vector division cost GELU a third of its cycles.
   vmax(a, b): b where a is below it (a clamp; a NaN a gives b on AVX), one instruction where the CPU has it: a
   generic select is a compare, a mask-to-vector move and a blend on AVX-512 */
#if VEC == 16 && defined(__AVX512F__)
#include <immintrin.h>
static inline vf vrcp(vf d) { const vf r = (vf)_mm512_rcp14_ps((__m512)d); return r * (2.0f - d * r); }
static inline vf vmax(vf a, vf b) { return (vf)_mm512_max_ps((__m512)a, (__m512)b); }
#elif VEC == 8 && defined(__AVX__)
#include <immintrin.h>
static inline vf vrcp(vf d) { const vf r = (vf)_mm256_rcp_ps((__m256)d); return r * (2.0f - d * r); }
static inline vf vmax(vf a, vf b) { return (vf)_mm256_max_ps((__m256)a, (__m256)b); }
#else
static inline vf vrcp(vf d) { return 1.0f / d; }
static inline vf vmax(vf a, vf b) { return vsel(a < b, b, a); }
#endif

static inline vf vexp_neg(vf y) {
    /* exp(y) for y <= 0: 2^n * exp(r), |r| <= ln2/2, degree-6 polynomial; n rounded by adding
       1.5 * 2^23 (its low bits are n). y is clamped at -80: results stay far from denormals,
       whose arithmetic is slow (callers zero what lies below) */
    const vf zero = y - y, magic = zero + 12582912.0f;
    y = vmax(y, zero - 80.0f);
    const vf fn = y * 1.44269504088896341f + magic;
    const vf nf = fn - magic;
    const vi n = (vi)fn - (vi)magic;
    const vf r = y - nf * 0.693359375f + nf * 2.12194440e-4f;
    vf p = 1.9875691500e-4f * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f; p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f; p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    return p * (vf)((n + 127) << 23);
}

#if VEC == 16 && defined(__AVX512F__)
static inline vf vsilu(vf x) {
    /* as below, the final select a mask blend (a generic vector select costs a compare, a mask-to-vector move
       and a blend) */
    const __m512 X = (__m512)x, one = _mm512_set1_ps(1.0f);
    const __m512 e = (__m512)vexp_neg((vf)((vi)x | INT32_MIN));  /* -|x|: the sign bit set */
    const __m512 s = (__m512)vrcp((vf)_mm512_add_ps(one, e));
    const __mmask16 negative = _mm512_cmp_ps_mask(X, _mm512_setzero_ps(), _CMP_LT_OQ);
    return (vf)_mm512_mul_ps(X, _mm512_mask_blend_ps(negative, s, _mm512_mul_ps(e, s)));
}
#else
static inline vf vsilu(vf x) {
    /* x * sigmoid(x) from e = exp(-|x|) <= 1 (never overflows): sigmoid = 1 / (1 + e) for x >= 0,
       e / (1 + e) below; exp(-|x|) < e^-80 reads as e^-80, off by < 1e-34 */
    const vf zero = x - x, one = zero + 1.0f;
    const vf e = vexp_neg((vf)((vi)x | INT32_MIN));  /* -|x|: the sign bit set */
    const vf s = vrcp(one + e);
    return x * vsel(x < zero, e * s, s);
}
#endif

#if VEC == 16 && defined(__AVX512F__)
/* Phi(-a) for a in [0, 5.5) as 32 pieces of degree 3 in a - 0.171875 i, fitted at Chebyshev nodes to
   0.5 erfc(a / sqrt 2) (|err| |a| < 1.6e-7 in float32); each power's 32 coefficients are two vectors, and
   vpermt2ps takes the piece's from both. Phi(-5.5) < 2e-8: past it, 0. 16 pieces of degree 6 (vpermps from
   one vector) took 1.45x the time; 16 of degree 4, 1.1x (Zen 5). */
static const float GELU_C0[32] __attribute__((aligned(64))) = {5.000000000e-01f, 4.317679703e-01f, 3.655172884e-01f, 3.030583262e-01f, 2.458840013e-01f, 1.950669736e-01f, 1.512119174e-01f, 1.144640595e-01f, 8.456577361e-02f, 6.094671413e-02f, 4.282994196e-02f, 2.933718264e-02f, 1.958004013e-02f, 1.272916235e-02f, 8.058574982e-03f, 4.966867156e-03f, 2.979733748e-03f, 1.739633037e-03f, 9.882031009e-04f, 5.461022956e-04f, 2.935476077e-04f, 1.534628536e-04f, 7.801839092e-05f, 3.856675539e-05f, 1.853571302e-05f, 8.660577805e-06f, 3.933603239e-06f, 1.736632953e-06f, 7.451944271e-07f, 3.107763860e-07f, 1.259557934e-07f, 4.960859101e-08f};
static const float GELU_C1[32] __attribute__((aligned(64))) = {-3.989468515e-01f, -3.931076825e-01f, -3.760774732e-01f, -3.493105471e-01f, -3.150025904e-01f, -2.757934928e-01f, -2.344341278e-01f, -1.934746504e-01f, -1.550219655e-01f, -1.205946058e-01f, -9.108096361e-02f, -6.678700447e-02f, -4.754672199e-02f, -3.286344931e-02f, -2.205307968e-02f, -1.436774433e-02f, -9.088054299e-03f, -5.581049714e-03f, -3.327540122e-03f, -1.926162280e-03f, -1.082491246e-03f, -5.906329607e-04f, -3.128761600e-04f, -1.609120663e-04f, -8.034631901e-05f, -3.894972178e-05f, -1.833173883e-05f, -8.376521691e-06f, -3.716074843e-06f, -1.600536962e-06f, -6.692793590e-07f, -2.717124516e-07f};
static const float GELU_C2[32] __attribute__((aligned(64))) = {1.179921237e-04f, 3.419579938e-02f, 6.528615952e-02f, 9.084936976e-02f, 1.091175675e-01f, 1.192865446e-01f, 1.215317175e-01f, 1.168624461e-01f, 1.068621054e-01f, 9.337921441e-02f, 7.823459804e-02f, 6.299418211e-02f, 4.883335903e-02f, 3.649438173e-02f, 2.631957829e-02f, 1.833295636e-02f, 1.234169770e-02f, 8.034189232e-03f, 5.059756804e-03f, 3.083909862e-03f, 1.819688827e-03f, 1.039763796e-03f, 5.754621234e-04f, 3.085545613e-04f, 1.603090059e-04f, 8.071658522e-05f, 3.939187445e-05f, 1.863558646e-05f, 8.547119251e-06f, 3.800838385e-06f, 1.638930598e-06f, 6.853271088e-07f};
static const float GELU_C3[32] __attribute__((aligned(64))) = {6.566577405e-02f, 5.996471643e-02f, 4.937954992e-02f, 3.538186103e-02f, 1.981430501e-02f, 4.555339459e-03f, -8.790319785e-03f, -1.911185496e-02f, -2.588854171e-02f, -2.916177176e-02f, -2.941149473e-02f, -2.738204226e-02f, -2.390387654e-02f, -1.974746585e-02f, -1.552901231e-02f, -1.167082507e-02f, -8.406681940e-03f, -5.816108547e-03f, -3.871040652e-03f, -2.481764182e-03f, -1.534159528e-03f, -9.151984705e-04f, -5.272176350e-04f, -2.934547374e-04f, -1.578982774e-04f, -8.216310380e-05f, -4.136115967e-05f, -2.014921483e-05f, -9.501440218e-06f, -4.337994142e-06f, -1.917994041e-06f, -8.213813771e-07f};
static inline vf vgelu(vf x) {
    /* in intrinsics: compares into mask registers, min for the clamps; generic vector selects cost three
       instructions each (compare, mask to vector, blend), a third of the function */
    const __m512 X = (__m512)x, one = _mm512_set1_ps(1.0f), edge = _mm512_set1_ps(5.5f);
    const __m512 a = _mm512_abs_ps(X);
    /* a clamped just below the edge: the piece index stays <= 31 without a clamp of its own */
    const __m512i i = _mm512_cvttps_epi32(_mm512_mul_ps(_mm512_min_ps(a, _mm512_set1_ps(5.4999995f)),
                                                         _mm512_set1_ps(32.0f / 5.5f)));
    const __m512 t = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(i), _mm512_set1_ps(5.5f / 32.0f), a);
#define GELU_PIECE(k) _mm512_permutex2var_ps(_mm512_load_ps(GELU_C##k), i, _mm512_load_ps(GELU_C##k + 16))
    __m512 q = GELU_PIECE(3);
    q = _mm512_fmadd_ps(q, t, GELU_PIECE(2)); q = _mm512_fmadd_ps(q, t, GELU_PIECE(1));
    q = _mm512_fmadd_ps(q, t, GELU_PIECE(0));
#undef GELU_PIECE
    q = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, edge, _CMP_LT_OQ), q);  /* Phi(-a) past the edge: 0 */
    const __mmask16 negative = _mm512_cmp_ps_mask(X, _mm512_setzero_ps(), _CMP_LT_OQ);
    return (vf)_mm512_mul_ps(X, _mm512_mask_blend_ps(negative, _mm512_sub_ps(one, q), q));
}
#elif VEC == 8 && defined(__AVX2__) && defined(__FMA__)
/* Phi(-a) for a in [0, 5.5) as 8 pieces of degree 6 in a - 0.6875 i, fitted at Chebyshev nodes to
   0.5 erfc(a / sqrt 2) (|err| max(|a|, 1) < 5e-8 in float32); vpermps takes each power's coefficient
   from one vector. 5.0 ns a vector against 9.9 for the erfc formula below (Zen 3), whose reciprocal
   and exp were two thirds of it; degree 5 (|err| |a| < 1.7e-7) saved only 5% more. */
static const float GELU8_C0[8] __attribute__((aligned(32))) = {5.000000000e-01f, 2.458838373e-01f, 8.456572145e-02f, 1.958008111e-02f, 2.979763784e-03f, 2.935550874e-04f, 1.853663889e-05f, 7.452568411e-07f};
static const float GELU8_C1[8] __attribute__((aligned(32))) = {-3.989432752e-01f, -3.149725795e-01f, -1.550119221e-01f, -4.755423218e-02f, -9.093644097e-03f, -1.083914889e-03f, -8.052610792e-05f, -3.728490583e-06f};
static const float GELU8_C2[8] __attribute__((aligned(32))) = {2.357801532e-05f, 1.082504913e-01f, 1.065624431e-01f, 4.904789478e-02f, 1.250563283e-02f, 1.862179604e-03f, 1.657737012e-04f, 8.932088349e-06f};
static const float GELU8_C3[8] __attribute__((aligned(32))) = {6.627835333e-02f, 2.786861546e-02f, -2.293089218e-02f, -2.585842647e-02f, -9.964439087e-03f, -1.946581760e-03f, -2.119194542e-04f, -1.337522917e-05f};
static const float GELU8_C4[8] __attribute__((aligned(32))) = {9.180163615e-04f, -2.354886755e-02f, -1.020838879e-02f, 5.409367383e-03f, 4.836914130e-03f, 1.337938360e-03f, 1.807119261e-04f, 1.328796407e-05f};
static const float GELU8_C5[8] __attribute__((aligned(32))) = {-1.205185521e-02f, 4.737705167e-04f, 7.022522856e-03f, 1.158055733e-03f, -1.324023237e-03f, -5.837472854e-04f, -9.735117055e-05f, -8.160320249e-06f};
static const float GELU8_C6[8] __attribute__((aligned(32))) = {2.414186485e-03f, 1.822806080e-03f, -1.220979495e-03f, -6.931574317e-04f, 1.471083233e-04f, 1.259900891e-04f, 2.519432383e-05f, 2.332835265e-06f};
static inline vf vgelu(vf x) {
    const __m256 X = (__m256)x, one = _mm256_set1_ps(1.0f), edge = _mm256_set1_ps(5.5f);
    const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), X);
    /* a clamped just below the edge: the piece index stays <= 7 (a NaN a reads as the edge) */
    const __m256i i = _mm256_cvttps_epi32(_mm256_mul_ps(_mm256_min_ps(a, _mm256_set1_ps(5.4999995f)),
                                                         _mm256_set1_ps(8.0f / 5.5f)));
    const __m256 t = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(5.5f / 8.0f), a);
#define GELU_PIECE(k) _mm256_permutevar8x32_ps(_mm256_load_ps(GELU8_C##k), i)
    __m256 q = GELU_PIECE(6);
    q = _mm256_fmadd_ps(q, t, GELU_PIECE(5)); q = _mm256_fmadd_ps(q, t, GELU_PIECE(4));
    q = _mm256_fmadd_ps(q, t, GELU_PIECE(3)); q = _mm256_fmadd_ps(q, t, GELU_PIECE(2));
    q = _mm256_fmadd_ps(q, t, GELU_PIECE(1)); q = _mm256_fmadd_ps(q, t, GELU_PIECE(0));
#undef GELU_PIECE
    q = _mm256_and_ps(q, _mm256_cmp_ps(a, edge, _CMP_LT_OQ));  /* Phi(-a) past the edge: 0 */
    /* Phi(x): q where x is negative (blendv reads x's sign bit), 1 - q elsewhere */
    return (vf)_mm256_mul_ps(X, _mm256_blendv_ps(_mm256_sub_ps(one, q), q, X));
}
#else
static inline vf vgelu(vf x) {
    /* exact-erf GELU, x * Phi(x): Phi(-|x|) = 0.5 erfc(|x| / sqrt 2) by Abramowitz-Stegun 7.1.26
       (|err| < 1.5e-7), then Phi(x) = 1 - Phi(-x) for x >= 0; no sign multiplies (1.6x fewer
       cycles than 0.5 x (1 + erf(x / sqrt 2)) with a signed erf) */
    const vf zero = x - x, one = zero + 1.0f;
    const vf a = (vf)((vi)x & 0x7fffffff) * 0.70710678118654752f;
    const vf t = vrcp(one + 0.3275911f * a);
    const vf p = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t;
    const vf y = a * -a;
    const vf q = vsel(y < zero - 80.0f, zero, 0.5f * p * vexp_neg(y));  /* Phi(-|x|) < 1e-35: exactly 0 */
    return x * vsel(x < zero, q, one - q);
}
#endif
