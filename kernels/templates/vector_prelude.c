
#include <stdint.h>
#include <string.h>
typedef float vf __attribute__((vector_size(VEC * 4), aligned(4)));
typedef int32_t vi __attribute__((vector_size(VEC * 4), aligned(4)));
#define LD(p) (*(const vf *)(p))
#define ST(p, v) (*(vf *)(p) = (v))

static inline vf vsel(vi mask, vf a, vf b) { return (vf)(((vi)a & mask) | ((vi)b & ~mask)); }

/* 1 / d for d in [1, 2^20] (GELU's and SiLU's denominators): the CPU's reciprocal estimate (2^-14 or
   2^-12) and one Newton step (2^-23 or better). A vector division cost GELU a third of its cycles. */
#if VEC == 16 && defined(__AVX512F__)
#include <immintrin.h>
static inline vf vrcp(vf d) { const vf r = (vf)_mm512_rcp14_ps((__m512)d); return r * (2.0f - d * r); }
#elif VEC == 8 && defined(__AVX__)
#include <immintrin.h>
static inline vf vrcp(vf d) { const vf r = (vf)_mm256_rcp_ps((__m256)d); return r * (2.0f - d * r); }
#else
static inline vf vrcp(vf d) { return 1.0f / d; }
#endif

static inline vf vexp_neg(vf y) {
    /* exp(y) for y <= 0: 2^n * exp(r), |r| <= ln2/2, degree-6 polynomial; n rounded by adding
       1.5 * 2^23 (its low bits are n). y is clamped at -80: results stay far from denormals,
       whose arithmetic is slow (callers zero what lies below) */
    const vf zero = y - y, magic = zero + 12582912.0f;
    y = vsel(y < zero - 80.0f, zero - 80.0f, y);
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

static inline vf vsilu(vf x) {
    /* x * sigmoid(x) from e = exp(-|x|) <= 1 (never overflows): sigmoid = 1 / (1 + e) for x >= 0,
       e / (1 + e) below; exp(-|x|) < e^-80 reads as e^-80, off by < 1e-34 */
    const vf zero = x - x, one = zero + 1.0f;
    const vf e = vexp_neg((vf)((vi)x | INT32_MIN));  /* -|x|: the sign bit set */
    const vf s = vrcp(one + e);
    return x * vsel(x < zero, e * s, s);
}

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
