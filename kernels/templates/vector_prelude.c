
#include <stdint.h>
#include <string.h>
typedef float vf __attribute__((vector_size(VEC * 4), aligned(4)));
typedef int32_t vi __attribute__((vector_size(VEC * 4), aligned(4)));
#define LD(p) (*(const vf *)(p))
#define ST(p, v) (*(vf *)(p) = (v))

static inline vf vsel(vi mask, vf a, vf b) { return (vf)(((vi)a & mask) | ((vi)b & ~mask)); }

static inline vf vexp(vf x) {
    /* exp(x) = 2^n * exp(r), |r| <= ln2/2, degree-6 polynomial; the clamp keeps 2^n finite */
    const vf zero = x - x, hi = zero + 88.0f, lo = zero - 88.0f;
    x = vsel(x > hi, hi, x);
    x = vsel(x < lo, lo, x);
    vf fn = x * 1.44269504088896341f;
    fn = fn + vsel(fn < zero, zero - 0.5f, zero + 0.5f);
    vi n = __builtin_convertvector(fn, vi);
    vf nf = __builtin_convertvector(n, vf);
    vf r = x - nf * 0.693359375f + nf * 2.12194440e-4f;
    vf p = 1.9875691500e-4f * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f; p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f; p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    vi bits = (n + 127) << 23;
    return p * (vf)bits;
}

static inline vf verf(vf x) {
    const vf zero = x - x, one = zero + 1.0f;
    vf sign = vsel(x < zero, -one, one);
    vf a = x * sign;
    vf t = one / (one + 0.3275911f * a);
    vf y = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t;
    return sign * (one - y * vexp(-a * a));
}
