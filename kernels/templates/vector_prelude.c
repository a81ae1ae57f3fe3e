
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
/* Phi(-a) for a in [0, 5.5) as 16 pieces of degree 6 in a - 0.34375 i, fitted at Chebyshev nodes to
   0.5 erfc(a / sqrt 2) (|err| < 4e-8 in float32); the piece's coefficients by vpermps from one vector
   each. Phi(-5.5) < 2e-8: past it, 0. Half the instructions of the exp-and-reciprocal form below. */
static const float GELU_C0[16] __attribute__((aligned(64))) = {5.000000000e-01f, 3.655171394e-01f, 2.458838522e-01f, 1.512117982e-01f, 8.456572145e-02f, 4.282995313e-02f, 1.958007924e-02f, 8.058615960e-03f, 2.979763318e-03f, 9.882197483e-04f, 2.935553493e-04f, 7.802143227e-05f, 1.853673712e-05f, 3.933900643e-06f, 7.452691762e-07f, 1.259721927e-07f};
static const float GELU_C1[16] __attribute__((aligned(64))) = {-3.989422917e-01f, -3.760547340e-01f, -3.149735332e-01f, -2.344115674e-01f, -1.550122499e-01f, -9.108252823e-02f, -4.755389690e-02f, -2.206069231e-02f, -9.093564935e-03f, -3.330666106e-03f, -1.083951443e-03f, -3.134514554e-04f, -8.054013597e-05f, -1.838805474e-05f, -3.730271601e-06f, -6.723975616e-07f};
static const float GELU_C2[16] __attribute__((aligned(64))) = {9.954046618e-07f, 6.463471800e-02f, 1.082716659e-01f, 1.208677068e-01f, 1.065704599e-01f, 7.827402651e-02f, 4.904017970e-02f, 2.654199302e-02f, 1.250375900e-02f, 5.152137484e-03f, 1.863018028e-03f, 5.925950827e-04f, 1.660998823e-04f, 4.107965287e-05f, 8.973821423e-06f, 1.732906867e-06f};
static const float GELU_C3[16] __attribute__((aligned(64))) = {6.647289544e-02f, 5.526414886e-02f, 2.769156173e-02f, -2.466576174e-03f, -2.300122380e-02f, -2.966359258e-02f, -2.579330467e-02f, -1.761590689e-02f, -9.948048741e-03f, -4.758281633e-03f, -1.953655388e-03f, -6.942655309e-04f, -2.147228806e-04f, -5.802168744e-05f, -1.373711348e-05f, -2.855794946e-06f};
static const float GELU_C4[16] __attribute__((aligned(64))) = {1.466000977e-04f, -1.547212061e-02f, -2.287025005e-02f, -1.961650141e-02f, -9.923866019e-03f, -3.050374216e-04f, 5.156931002e-03f, 6.204448640e-03f, 4.770800937e-03f, 2.823821967e-03f, 1.365335425e-03f, 5.542510771e-04f, 1.918033522e-04f, 5.712245911e-05f, 1.473419252e-05f, 3.306587814e-06f};
static const float GELU_C5[16] __attribute__((aligned(64))) = {-1.060726959e-02f, -7.460477762e-03f, -7.500451757e-04f, 4.868684802e-03f, 6.478284951e-03f, 4.588002339e-03f, 1.619187067e-03f, -4.726340121e-04f, -1.197903999e-03f, -1.044620993e-03f, -6.337473751e-04f, -3.017837007e-04f, -1.180798645e-04f, -3.884771286e-05f, -1.089297348e-05f, -2.626218702e-06f};
static const float GELU_C6[16] __attribute__((aligned(64))) = {1.369872480e-03f, 3.084053053e-03f, 2.672565635e-03f, 8.490514592e-04f, -8.189357468e-04f, -1.388654811e-03f, -1.017902163e-03f, -3.773568897e-04f, 5.416775457e-05f, 1.916703477e-04f, 1.611656626e-04f, 9.134284483e-05f, 4.015475861e-05f, 1.440838332e-05f, 4.327835995e-06f, 1.104311764e-06f};
static inline vf vgelu(vf x) {
    /* in intrinsics: compares into mask registers, min for the clamps; generic vector selects cost three
       instructions each (compare, mask to vector, blend), a third of the function */
    const __m512 X = (__m512)x, one = _mm512_set1_ps(1.0f), edge = _mm512_set1_ps(5.5f);
    const __m512 a = _mm512_abs_ps(X);
    /* a clamped just below the edge: the piece index stays <= 15 without a clamp of its own */
    const __m512i i = _mm512_cvttps_epi32(_mm512_mul_ps(_mm512_min_ps(a, _mm512_set1_ps(5.4999995f)),
                                                         _mm512_set1_ps(16.0f / 5.5f)));
    const __m512 t = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(i), _mm512_set1_ps(5.5f / 16.0f), a);
#define GELU_PIECE(k) _mm512_permutexvar_ps(i, _mm512_load_ps(GELU_C##k))
    __m512 q = GELU_PIECE(6);
    q = _mm512_fmadd_ps(q, t, GELU_PIECE(5)); q = _mm512_fmadd_ps(q, t, GELU_PIECE(4));
    q = _mm512_fmadd_ps(q, t, GELU_PIECE(3)); q = _mm512_fmadd_ps(q, t, GELU_PIECE(2));
    q = _mm512_fmadd_ps(q, t, GELU_PIECE(1)); q = _mm512_fmadd_ps(q, t, GELU_PIECE(0));
#undef GELU_PIECE
    q = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, edge, _CMP_LT_OQ), q);  /* Phi(-a) past the edge: 0 */
    const __mmask16 negative = _mm512_cmp_ps_mask(X, _mm512_setzero_ps(), _CMP_LT_OQ);
    return (vf)_mm512_mul_ps(X, _mm512_mask_blend_ps(negative, _mm512_sub_ps(one, q), q));
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
