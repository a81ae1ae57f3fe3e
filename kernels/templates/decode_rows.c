/* The decode step's one-row products (decode_step.c follows this file in one library).
 *
 * One decode step of a Llama-pattern model for a few sequences (batch B <= 8) in one call.
 *
 * Every weight is read once per step: rows are split over the threads, and each row is
 * multiplied with all B activation rows while it sits in registers / L1.
 *
 * Weight formats (Mat.fmt): F32 rows as they are; U8 and U4 integer codes with a (scale, offset)
 * pair per `group` columns (a multiple of 32) of a row, w = scale * code + offset:
 *   U8: one signed byte a column, code - 128 (the offset absorbs the 128), rows of k % 32 == 0;
 *   U4: 32 bytes a run of 64 columns, byte j holding column j (low nibble) and j + 32 (high);
 *   U8H, U4H: the same codes, their grids in float16 (F16C widens a row's grids as it starts).
 *
 * Activations (Model.act_q; gemv's run): float32: quantized weights are widened in registers,
 * and the step computes the model's weights times its activations up to summation order. Int8:
 * every projection's input is rounded per 32 columns to a symmetric 8-bit grid (scale = max |x| /
 * 127, as `fake_quantize_rows` of each 32-column block; gemv also rounds per row, at any bits),
 * and integer codes meet integer activations in `vpdpbusd` (VNNI) or `vpmaddubsw` (32 products
 * an instruction): what the model with those inputs rounded computes.
 *
 * One OpenMP parallel region runs the whole step; the stages are work-shared loops whose
 * implicit barriers order them, so threads start once per token, not once per matrix.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#define F32 0
#define U8 1
#define U4 2
#define U4H 3
#define U8H 4
#define MAX_BATCH 8
#define CHUNK 4 /* activation rows per pass over a weight row (the row stays in L1 between passes) */
#define QBLOCK 32 /* activation columns per int8 grid */
#define INLINE static inline __attribute__((always_inline))

typedef struct {
    int32_t fmt, n, k, group;
    const float *w;
    const uint8_t *codes;
    const void *grid; /* U8 / U4: per row its groups' scales, then their offsets (one stream); H: float16 */
    const float *bias;
} Mat;

typedef struct {
    Mat q, k, v, o, gate, up, down;
    const float *ln1, *ln2;
    float *kcache, *vcache; /* (batch, kv_heads, max_len, head_dim) */
} Layer;

typedef struct {
    int32_t layers, hidden, heads, kv_heads, head_dim, inter, vocab, max_len, batch, threads, act_q;
    float eps, attn_scale;
    const float *embed; /* (vocab, hidden), or NULL: rows come from the (tied) head */
    const float *norm;
    Mat head;
    const float *cos, *sin; /* (max_len, head_dim) */
    const Layer *layer;
    float *scratch;
} Model;

/* A projection's input: float rows x (the rounded values when q is set), and with int8 activations
   their codes q (B, k), and per 32 columns the scale d and the sum of the rounded values xs (B, k / 32). */
typedef struct {
    const float *x;
    int ldx;
    const int8_t *q;
    const float *d, *xs;
} Act;

/* float16 grid values widened: F16C where the build has it, else bit by bit (the Python side keeps float32
   grids on CPUs without F16C, so that path is for completeness) */
#ifdef __F16C__
INLINE float half_at(const uint16_t *h, long i) { return _cvtsh_ss(h[i]); }
INLINE __m256 half_8(const uint16_t *h, long i) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))); }
#else
INLINE float half_at(const uint16_t *h, long i) {
    const uint32_t x = h[i], e = (x >> 10) & 31, f = x & 1023;
    const float v = e == 0 ? ldexpf((float)f, -24) : e == 31 ? (f ? NAN : INFINITY) : ldexpf((float)(f | 1024), (int)e - 25);
    return x & 0x8000u ? -v : v;
}
INLINE __m256 half_8(const uint16_t *h, long i) {
    float v[8];
    for (int t = 0; t < 8; ++t) v[t] = half_at(h, i + t);
    return _mm256_loadu_ps(v);
}
#endif

/* Row n's grids (its groups' scales, then offsets) as float32: the stream itself, or for the H formats its
   float16 values widened into `tmp` (2 x groups floats) once, before the row's products read them. */
INLINE const float *row_grids(const Mat *m, int n, int groups, float *tmp) {
    if (m->fmt != U8H && m->fmt != U4H) return (const float *)m->grid + (long)n * groups * 2;
    const uint16_t *h = (const uint16_t *)m->grid + (long)n * groups * 2;
    int i = 0;
    for (; i + 8 <= 2 * groups; i += 8) _mm256_storeu_ps(tmp + i, half_8(h, i));
    for (; i < 2 * groups; ++i) tmp[i] = half_at(h, i);
    return tmp;
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* One weight row's dot products with `nb` (<= CHUNK) activation rows. An FMA waits several cycles
   for its accumulator, so one row of x gets 8 independent chains: CHAINS(nb) per row of x. */
#define CHAINS(nb) ((nb) == 1 ? 8 : (nb) == 2 ? 4 : 2)

INLINE void reduce(__m256 acc[CHUNK][8], int nb, float *out) {
    for (int b = 0; b < nb; ++b) {
        __m256 s = acc[b][0];
        for (int a = 1; a < CHAINS(nb); ++a) s = _mm256_add_ps(s, acc[b][a]);
        out[b] = hsum(s);
    }
}

#define ZERO_ACC(acc)                                                                                        \
    for (int b_ = 0; b_ < CHUNK; ++b_)                                                                       \
        for (int a_ = 0; a_ < 8; ++a_) acc[b_][a_] = _mm256_setzero_ps();

INLINE void row_f32(const float *w, int k, const float *x, int ldx, int nb, float *out) {
    __m256 acc[CHUNK][8];
    ZERO_ACC(acc)
    int j = 0;
    for (; j + 64 <= k; j += 64) {
#pragma GCC unroll 8
        for (int f = 0; f < 8; ++f) {
            const __m256 wv = _mm256_loadu_ps(w + j + 8 * f);
            for (int b = 0; b < nb; ++b)
                acc[b][f % CHAINS(nb)] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + b * ldx + j + 8 * f),
                                                         acc[b][f % CHAINS(nb)]);
        }
    }
    for (; j + 8 <= k; j += 8) {
        const __m256 wv = _mm256_loadu_ps(w + j);
        for (int b = 0; b < nb; ++b) acc[b][0] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + b * ldx + j), acc[b][0]);
    }
    reduce(acc, nb, out);
    for (int b = 0; b < nb; ++b)
        for (int t = j; t < k; ++t) out[b] += w[t] * x[b * ldx + t];
}

/* Float activations, quantized weights: each 8 codes widened to scale * code + offset in registers. */
INLINE void row_u8_f32(const Mat *m, int n, const float *x, int ldx, int nb, float *out) {
    const int8_t *c = (const int8_t *)m->codes + (long)n * m->k;
    const int groups = (m->k + m->group - 1) / m->group;
    float tmp[2 * groups];
    const float *scales = row_grids(m, n, groups, tmp), *offs = scales + groups;
    __m256 acc[CHUNK][8];
    ZERO_ACC(acc)
    for (int j0 = 0, left = 0, g = -1; j0 < m->k; j0 += 32) {
        if (left == 0) { left = m->group / 32; ++g; }
        --left;
        const __m256 s = _mm256_set1_ps(scales[g]), o = _mm256_set1_ps(offs[g]);
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) {
            const __m128i bytes = _mm_loadl_epi64((const __m128i *)(c + j0 + 8 * t));
            const __m256 w = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), s, o);
            const int a = t % CHAINS(nb);
            for (int b = 0; b < nb; ++b)
                acc[b][a] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + b * ldx + j0 + 8 * t), acc[b][a]);
        }
    }
    reduce(acc, nb, out);
}

INLINE void row_u4_f32(const Mat *m, int n, const float *x, int ldx, int nb, float *out, const int PER) {
    const uint8_t *c = m->codes + (long)n * (m->k / 2);
    const int groups = (m->k + m->group - 1) / m->group;
    float tmp[2 * groups];
    const float *scales = row_grids(m, n, groups, tmp), *offs = scales + groups;
    const int per = PER ? PER : m->group / 32; /* 32-column runs a group spans */
    const __m256i low = _mm256_set1_epi32(15);
    __m256 acc[CHUNK][8];
    ZERO_ACC(acc)
    for (int j0 = 0; j0 < m->k; j0 += 64) {
        const int run = j0 / 32; /* runs j0 / 32 (low nibbles) and + 1 (high) */
        const int lo = run / per, hi = (run + 1) / per;
        const __m256 s0 = _mm256_set1_ps(scales[lo]), o0 = _mm256_set1_ps(offs[lo]);
        const __m256 s1 = _mm256_set1_ps(scales[hi]), o1 = _mm256_set1_ps(offs[hi]);
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) {
            const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(c + j0 / 2 + 8 * t)));
            const __m256 w0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(bytes, low)), s0, o0);
            const __m256 w1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(bytes, 4)), s1, o1);
            for (int b = 0; b < nb; ++b) {
                acc[b][(2 * t) % CHAINS(nb)] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + b * ldx + j0 + 8 * t),
                                                               acc[b][(2 * t) % CHAINS(nb)]);
                acc[b][(2 * t + 1) % CHAINS(nb)] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + b * ldx + j0 + 32 + 8 * t),
                                                                   acc[b][(2 * t + 1) % CHAINS(nb)]);
            }
        }
    }
    reduce(acc, nb, out);
}

/* Unsigned bytes u times signed bytes s, each four neighbours summed into int32: one `vpdpbusd` where the
   CPU has VNNI (the build's -march=native says), else `vpmaddubsw` + `vpmaddwd`. Our operands never reach
   vpmaddubsw's int16 saturation (codes <= 15, or |code| <= 128 against |q| <= 127), so both agree exactly. */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define VNNI 1
INLINE __m256i quad_sums(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }
#elif defined(__AVXVNNI__)
#define VNNI 1
INLINE __m256i quad_sums(__m256i u, __m256i s) { return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s); }
#else
#define VNNI 0
INLINE __m256i quad_sums(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
#endif

/* A run's 32 products, 8 partial sums as floats. U4 codes are 0..15, unsigned as they are; U8 codes are
   signed (code - 128), so the sign moves onto the activation (|c| * sign(q, c)). */
INLINE __m256i run_sums(__m256i codes, __m256i q, const int is_signed) {
    return is_signed ? quad_sums(_mm256_abs_epi8(codes), _mm256_sign_epi8(q, codes)) : quad_sums(codes, q);
}

INLINE __m256 run_dot(__m256i codes, __m256i q, const int is_signed) {
    return _mm256_cvtepi32_ps(run_sums(codes, q, is_signed));
}

/* The locals every int8 row product starts from (a macro: the same code as written out, constants kept):
   the row's runs of 32 columns, runs a weight group spans (`per`, a constant where the caller names it), runs
   per row of activations (`ld`), its grids (scales, then offsets) and codes. */
#define ROW_Q_LOCALS                                                                                           \
    const int runs = m->k / 32, per = PER ? PER : m->group / 32, groups = (m->k + m->group - 1) / m->group;  \
    const int ld = a->ldx / QBLOCK;                                                                            \
    float tmp[2 * groups];                                                                                     \
    const float *scales = row_grids(m, n, groups, tmp), *offs = scales + groups;                               \
    const uint8_t *c = m->codes + (long)n * (bits == 4 ? m->k / 2 : m->k);                                      \
    const __m256i low = _mm256_set1_epi8(15);

INLINE void row_q_int8_runs(const Mat *m, int n, const Act *a, int nb, float *out, const int bits, const int PER) {
    ROW_Q_LOCALS
    /* Before the row's runs: each run's weight scale times its activation scale (sd), and the offsets'
       part, offset * sum of the run's rounded inputs, summed for the whole row (off). */
    float sd[CHUNK * runs], off[CHUNK];
    for (int b = 0; b < nb; ++b) {
        const float *d = a->d + (long)b * ld, *xs = a->xs + (long)b * ld;
        float *row_sd = sd + b * runs;
        if (per == 1) {
            __m256 o = _mm256_setzero_ps();
            int r = 0;
            for (; r + 8 <= runs; r += 8) {
                _mm256_storeu_ps(row_sd + r, _mm256_mul_ps(_mm256_loadu_ps(scales + r), _mm256_loadu_ps(d + r)));
                o = _mm256_fmadd_ps(_mm256_loadu_ps(offs + r), _mm256_loadu_ps(xs + r), o);
            }
            off[b] = hsum(o);
            for (; r < runs; ++r) { row_sd[r] = scales[r] * d[r]; off[b] += offs[r] * xs[r]; }
        } else {
            off[b] = 0.0f;
            for (int r = 0; r < runs; ++r) { row_sd[r] = scales[r / per] * d[r]; off[b] += offs[r / per] * xs[r]; }
        }
    }
    __m256 acc[CHUNK][8];
    ZERO_ACC(acc)
    int r = 0;
    __m256i raw = _mm256_setzero_si256();
#define RUN(T)                                                                                                   \
    {                                                                                                            \
        const int run = r + (T);                                                                                 \
        if (bits == 8 || run % 2 == 0) raw = _mm256_loadu_si256((const __m256i *)(c + (bits == 4 ? run / 2 : run) * 32)); \
        const __m256i codes = bits == 8 ? raw : run % 2 == 0 ? _mm256_and_si256(raw, low)                        \
                                                             : _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);  \
        for (int b = 0; b < nb; ++b) {                                                                           \
            const __m256i q = _mm256_loadu_si256((const __m256i *)(a->q + (long)b * a->ldx + run * 32));         \
            acc[b][(T) % 4] = _mm256_fmadd_ps(run_dot(codes, q, bits == 8), _mm256_broadcast_ss(sd + b * runs + run), \
                                              acc[b][(T) % 4]);                                                  \
        }                                                                                                        \
    }
    for (; r + 4 <= runs; r += 4) { RUN(0) RUN(1) RUN(2) RUN(3) }
    for (; r < runs; ++r) RUN(0)
#undef RUN
    for (int b = 0; b < nb; ++b) /* four chains: rows are short (18 runs in 576 columns), the sum is per row */
        out[b] = hsum(_mm256_add_ps(_mm256_add_ps(acc[b][0], acc[b][1]), _mm256_add_ps(acc[b][2], acc[b][3])))
                 + off[b];
}

/* Int8 activations, four runs summed side by side into one vector [r0 r1 r2 r3 | r0 r1 r2 r3] (each half
   holds one 16-column half of each run): one int -> float conversion and one FMA with the runs' scale * d
   then serve four runs, and the grids are read as vectors, with no per-row prologue. */
INLINE __m256i four_runs(const __m256i codes[4], const int8_t *q, const int is_signed) {
    __m256i p[4];
    if (is_signed || VNNI) {
        for (int t = 0; t < 4; ++t)
            p[t] = run_sums(codes[t], _mm256_loadu_si256((const __m256i *)(q + 32 * t)), is_signed);
        return _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    }
    /* 4-bit codes without VNNI: 8 products of at most 15 * 127 stay within int16, so two int16 levels
       precede the one widening */
    for (int t = 0; t < 4; ++t) p[t] = _mm256_maddubs_epi16(codes[t], _mm256_loadu_si256((const __m256i *)(q + 32 * t)));
    return _mm256_madd_epi16(_mm256_hadd_epi16(_mm256_hadd_epi16(p[0], p[1]), _mm256_hadd_epi16(p[2], p[3])),
                             _mm256_set1_epi16(1));
}

/* A group-level value (scale or offset) for runs r..r+3 (r a multiple of 4), `per` runs a group. */
INLINE __m128 per_run4(const float *v, int r, const int per) {
    if (per == 1) return _mm_loadu_ps(v + r);
    if (per == 2) {
        const __m128 t = _mm_castpd_ps(_mm_load_sd((const double *)(v + r / 2)));
        return _mm_unpacklo_ps(t, t);
    }
    if (per % 4 == 0) return _mm_set1_ps(v[r / per]);
    return _mm_setr_ps(v[r / per], v[(r + 1) / per], v[(r + 2) / per], v[(r + 3) / per]);
}

INLINE __m256i u4_codes(const uint8_t *c, int run, __m256i low) {
    const __m256i raw = _mm256_loadu_si256((const __m256i *)(c + run / 2 * 32));
    return run % 2 == 0 ? _mm256_and_si256(raw, low) : _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
}

INLINE void row_q_int8_quads(const Mat *m, int n, const Act *a, int nb, float *out, const int bits, const int PER) {
    ROW_Q_LOCALS
    __m256 acc[CHUNK];
    __m128 off[CHUNK]; /* offset * the run's sum of rounded inputs */
    for (int b = 0; b < CHUNK; ++b) { acc[b] = _mm256_setzero_ps(); off[b] = _mm_setzero_ps(); }
    int r = 0;
    for (; r + 4 <= runs; r += 4) {
        __m256i codes[4];
        for (int t = 0; t < 4; ++t)
            codes[t] = bits == 4 ? u4_codes(c, r + t, low) : _mm256_loadu_si256((const __m256i *)(c + (r + t) * 32));
        const __m128 s4 = per_run4(scales, r, per), o4 = per_run4(offs, r, per);
        const __m256 s8 = _mm256_set_m128(s4, s4);
        for (int b = 0; b < nb; ++b) {
            const __m256i v = four_runs(codes, a->q + (long)b * a->ldx + r * 32, bits == 8);
            const __m256 sd = _mm256_mul_ps(s8, _mm256_broadcast_ps((const __m128 *)(a->d + (long)b * ld + r)));
            acc[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), sd, acc[b]);
            off[b] = _mm_fmadd_ps(o4, _mm_loadu_ps(a->xs + (long)b * ld + r), off[b]);
        }
    }
    float tail[CHUNK] = {0.0f};
    for (; r < runs; ++r) { /* the last runs % 4 runs, one at a time */
        const __m256i codes = bits == 4 ? u4_codes(c, r, low) : _mm256_loadu_si256((const __m256i *)(c + r * 32));
        for (int b = 0; b < nb; ++b) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(a->q + (long)b * a->ldx + r * 32));
            const float d = a->d[(long)b * ld + r];
            acc[b] = _mm256_fmadd_ps(run_dot(codes, q, bits == 8), _mm256_set1_ps(scales[r / per] * d), acc[b]);
            tail[b] += offs[r / per] * a->xs[(long)b * ld + r];
        }
    }
    for (int b = 0; b < nb; ++b)
        out[b] = hsum(_mm256_add_ps(acc[b], _mm256_zextps128_ps256(off[b]))) + tail[b];
}

/* nb as a constant in each call, so the always-inlined row code keeps its accumulators in registers. */
#define BY_ROWS(CALL) switch (nb) { case 1: CALL(1); break; case 2: CALL(2); break; case 3: CALL(3); break; default: CALL(4); }
#define F32_ROW(NB) row_f32(m->w + (long)n * m->k, m->k, x, ldx, NB, out)
#define U8_ROW(NB) row_u8_f32(m, n, x, ldx, NB, out)
#define U4_ROW(NB) if (m->group == 32) row_u4_f32(m, n, x, ldx, NB, out, 1); else row_u4_f32(m, n, x, ldx, NB, out, 0)
/* runs a group spans as a constant where common (1: groups of 32; 4: of 128), so no division a run */
#define U8_I8_ROW(NB) if (per == 1) row_q_int8_quads(m, n, &sub, NB, out, 8, 1); else if (per == 4) row_q_int8_quads(m, n, &sub, NB, out, 8, 4); else row_q_int8_quads(m, n, &sub, NB, out, 8, 0)
#define U4_I8_ROW(NB) if (per == 1) row_q_int8_runs(m, n, &sub, NB, out, 4, 1); else if (per == 4) row_q_int8_quads(m, n, &sub, NB, out, 4, 4); else row_q_int8_quads(m, n, &sub, NB, out, 4, 0)

static void mat_row(const Mat *m, int n, const Act *a, int b0, int nb, float *out) {
    const float *x = a->x + (long)b0 * a->ldx;
    const int ldx = a->ldx;
    if (m->fmt == F32) { BY_ROWS(F32_ROW) return; }
    const int bytes = m->fmt == U8 || m->fmt == U8H; /* else U4 or U4H */
    if (a->q == NULL) {
        if (bytes) { BY_ROWS(U8_ROW) } else { BY_ROWS(U4_ROW) }
        return;
    }
    const int runs = ldx / QBLOCK, per = m->group / 32;
    const Act sub = {x, ldx, a->q + (long)b0 * ldx, a->d + (long)b0 * runs, a->xs + (long)b0 * runs};
    if (bytes) { BY_ROWS(U8_I8_ROW) } else { BY_ROWS(U4_I8_ROW) }
}

/* y (B, ldy) = x W^T + bias, or y += that when `add`; call inside a parallel region. */
static void gemv_shared(const Mat *m, const Act *a, int B, float *y, int ldy, int add) {
#pragma omp for schedule(static) nowait
    for (int n = 0; n < m->n; ++n) {
        float out[CHUNK];
        for (int b0 = 0; b0 < B; b0 += CHUNK) {
            const int nb = B - b0 < CHUNK ? B - b0 : CHUNK;
            mat_row(m, n, a, b0, nb, out);
            for (int b = 0; b < nb; ++b) {
                const float v = out[b] + (m->bias ? m->bias[n] : 0.0f);
                float *dst = y + (long)(b0 + b) * ldy + n;
                *dst = add ? *dst + v : v;
            }
        }
    }
}

/* Floats an int8 input of (B, k) needs in scratch: codes, the rounded values, scales and run sums. */
long act_floats(int batch, int k) { return (long)batch * (k / 4 + k + 2 * (k / QBLOCK)) + 8; }

/* max |x| over the 32 values of v */
static inline float abs_max(const __m256 v[4]) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int t = 0; t < 4; ++t) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[t]));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    return _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
}

/* max |x| over n values, n a multiple of 32 */
static float abs_max_of(const float *x, int n) {
    float m = 0.0f;
    for (int j = 0; j < n; j += 32) {
        __m256 v[4];
        for (int t = 0; t < 4; ++t) v[t] = _mm256_loadu_ps(x + j + 8 * t);
        const float here = abs_max(v);
        m = here > m ? here : m;
    }
    return m;
}

/* x (B, k) rounded into `a`, laid out in `scratch` (act_floats(B, k)): one symmetric grid of +-levels
   (127 for int8) per `run` columns (QBLOCK, or k: one grid a row, as the int8 sparse kernels round).
   Each thread of the step rounds the whole input into its own scratch: B k values, cheaper than the
   barrier a shared copy needs. */
static void round_input(const float *x, int B, int k, int run, float levels, float *scratch, Act *a) {
    const int blocks = k / QBLOCK, per = run / QBLOCK;
    float *xhat = scratch, *d = xhat + (long)B * k, *xs = d + (long)B * blocks;
    int8_t *q = (int8_t *)(xs + (long)B * blocks);
    *a = (Act){xhat, k, q, d, xs};
    const __m256 top = _mm256_set1_ps(levels), bottom = _mm256_set1_ps(-levels);
    float scale = 1.0f;
    for (int i = 0; i < B * blocks; ++i) {
        const float *src = x + (long)(i / blocks) * k + (i % blocks) * QBLOCK;
        __m256 v[4];
        for (int t = 0; t < 4; ++t) v[t] = _mm256_loadu_ps(src + 8 * t);
        if (i % per == 0) {
            const float amax = per == 1 ? abs_max(v) : abs_max_of(src, run);
            scale = amax > 0.0f ? amax / levels : 1.0f;
        }
        const __m256 sv = _mm256_set1_ps(scale);
        __m256 sum = _mm256_setzero_ps();
        __m256i c[4];
        for (int t = 0; t < 4; ++t) { /* x / scale (a true division, as torch's), rounded half to even */
            const __m256 r = _mm256_min_ps(top, _mm256_max_ps(bottom, _mm256_round_ps(
                _mm256_div_ps(v[t], sv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
            _mm256_storeu_ps(xhat + (long)i * QBLOCK + 8 * t, _mm256_mul_ps(r, sv));
            sum = _mm256_add_ps(sum, r);
            c[t] = _mm256_cvtps_epi32(r);
        }
        /* int32 -> int8 in column order: the packs interleave 128-bit lanes, the permute undoes it */
        const __m256i words = _mm256_packs_epi32(c[0], c[1]), words2 = _mm256_packs_epi32(c[2], c[3]);
        const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(words, words2),
                                                          _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(q + (long)i * QBLOCK), bytes);
        d[i] = scale;
        xs[i] = scale * hsum(sum); /* the codes' sum is an exact integer in float */
    }
}

/* The same product on its own (one-row kernels for any caller: tests, small-M linears). run > 0 rounds
   the input first, one grid of +-levels per `run` columns (a multiple of 32 dividing k), in `scratch`
   (act_floats(B, k)); run = 0 keeps it float. */
void gemv(const Mat *m, const float *x, int B, float *y, int threads, int run, float levels, float *scratch) {
    Act a = {x, m->k, NULL, NULL, NULL};
    if (run > 0) round_input(x, B, m->k, run, levels, scratch, &a);
#pragma omp parallel num_threads(threads)
    gemv_shared(m, &a, B, y, m->n, 0);
}

