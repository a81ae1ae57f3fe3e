/* One decode step of a Llama-pattern model for a few sequences (batch B <= 8) in one call.
 *
 * Every weight is read once per step: rows are split over the threads, and each row is
 * multiplied with all B activation rows while it sits in registers / L1. Quantized weights
 * are widened in registers (code -> float, then scale * code + offset), so activations stay
 * float32 and the step computes what the fake-quantized model computes, up to summation order.
 *
 * Formats (Mat.fmt): F32 rows as they are; U8 one byte a code; U4 two codes a byte, each run
 * of 32 columns in 16 bytes (low nibbles columns 0..15, high nibbles 16..31). U8 and U4 keep
 * a (scale, offset) pair per `group` columns of a row; the last group of a row may be shorter.
 *
 * One OpenMP parallel region runs the whole step; the stages are work-shared loops whose
 * implicit barriers order them, so threads start once per token, not once per matrix.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define F32 0
#define U8 1
#define U4 2
#define MAX_BATCH 8
#define CHUNK 4 /* activation rows per pass over a weight row (the row stays in L1 between passes) */

typedef struct {
    int32_t fmt, n, k, group;
    const float *w;
    const uint8_t *codes;
    const float *grid; /* U8 / U4: (n, groups, 2): scale, offset of each group, side by side (one stream) */
    const float *bias;
} Mat;

typedef struct {
    Mat q, k, v, o, gate, up, down;
    const float *ln1, *ln2;
    float *kcache, *vcache; /* (batch, kv_heads, max_len, head_dim) */
} Layer;

typedef struct {
    int32_t layers, hidden, heads, kv_heads, head_dim, inter, vocab, max_len, batch, threads;
    float eps, attn_scale;
    const float *embed; /* (vocab, hidden), or NULL: rows come from the (tied) head */
    const float *norm;
    Mat head;
    const float *cos, *sin; /* (max_len, head_dim) */
    const Layer *layer;
    float *scratch;
} Model;

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256 widen8(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)); }

/* One weight row's dot products with `nb` (<= CHUNK) activation rows: two accumulators per row of x
   (even and odd vectors), so the FMA latency is hidden even for one row. */
#define INLINE static inline __attribute__((always_inline))

INLINE void finish(const __m256 *a0, const __m256 *a1, int nb, float *out) {
    for (int b = 0; b < nb; ++b) out[b] = hsum(_mm256_add_ps(a0[b], a1[b]));
}

INLINE void row_f32(const float *w, int k, const float *x, int ldx, int nb, float *out) {
    __m256 a0[CHUNK], a1[CHUNK];
    for (int b = 0; b < CHUNK; ++b) a0[b] = a1[b] = _mm256_setzero_ps();
    int j = 0;
    for (; j + 16 <= k; j += 16) {
        const __m256 w0 = _mm256_loadu_ps(w + j);
        const __m256 w1 = _mm256_loadu_ps(w + j + 8);
        for (int b = 0; b < nb; ++b) {
            a0[b] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + b * ldx + j), a0[b]);
            a1[b] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + b * ldx + j + 8), a1[b]);
        }
    }
    for (; j + 8 <= k; j += 8) {
        const __m256 w0 = _mm256_loadu_ps(w + j);
        for (int b = 0; b < nb; ++b) a0[b] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + b * ldx + j), a0[b]);
    }
    finish(a0, a1, nb, out);
    for (int b = 0; b < nb; ++b)
        for (int t = j; t < k; ++t) out[b] += w[t] * x[b * ldx + t];
}

/* U8 / U4: codes interleaved in 32-bit words. A block of 8 words holds 8 * (32 / bits) columns; field s
   of word i is column 8 s + i, so a shift and a mask give 8 consecutive columns' codes with no shuffle.
   Groups are multiples of 32 columns (a block is 32 or 64): a group is whole runs of four fields.
   Per group: acc = sum code * x, then scale * acc + offset * sum x (xsum: the group sums of x). */
INLINE void row_q(const Mat *m, int n, const float *x, int ldx, int nb, float *out, const float *xsum, int groups,
                  const int bits) {
    const int fields = 32 / bits, block = 8 * fields;
    const uint32_t *c = (const uint32_t *)m->codes + (long)n * (m->k / block) * 8;
    const float *grid = m->grid + (long)n * groups * 2;
    const __m256i mask = _mm256_set1_epi32((1 << bits) - 1);
    __m256 tot[CHUNK];
    float off[CHUNK];
    for (int b = 0; b < CHUNK; ++b) { tot[b] = _mm256_setzero_ps(); off[b] = 0.0f; }
    for (int g = 0; g < groups; ++g) {
        const int end = (g + 1) * m->group < m->k ? (g + 1) * m->group : m->k;
        __m256 acc[CHUNK][4];
        for (int b = 0; b < CHUNK; ++b)
            for (int a = 0; a < 4; ++a) acc[b][a] = _mm256_setzero_ps();
        for (int j = g * m->group; j < end; j += 32) { /* 32 columns: four fields of one word vector */
            __m256i words = _mm256_loadu_si256((const __m256i *)(c + (j / block) * 8));
            if (bits == 4 && (j % 64)) words = _mm256_srli_epi32(words, 16); /* the block's second half */
#pragma GCC unroll 4
            for (int f = 0; f < 4; ++f) {
                const __m256 w = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(words, bits * f), mask));
                for (int b = 0; b < nb; ++b)
                    acc[b][f] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + b * ldx + j + 8 * f), acc[b][f]);
            }
        }
        const __m256 s = _mm256_set1_ps(grid[2 * g]);
        for (int b = 0; b < nb; ++b) {
            const __m256 sum = _mm256_add_ps(_mm256_add_ps(acc[b][0], acc[b][1]), _mm256_add_ps(acc[b][2], acc[b][3]));
            tot[b] = _mm256_fmadd_ps(sum, s, tot[b]);
            off[b] += grid[2 * g + 1] * xsum[b * groups + g];
        }
    }
    for (int b = 0; b < nb; ++b) out[b] = hsum(tot[b]) + off[b];
}

/* Sums of x over each group of columns, for the offsets: (nb, groups). */
static void group_sums(const Mat *m, const float *x, int ldx, int nb, float *xsum, int groups) {
    for (int b = 0; b < nb; ++b)
        for (int g = 0; g < groups; ++g) {
            const int end = (g + 1) * m->group < m->k ? (g + 1) * m->group : m->k;
            float s = 0.0f;
            for (int j = g * m->group; j < end; ++j) s += x[b * ldx + j];
            xsum[b * groups + g] = s;
        }
}

/* nb as a constant in each call, so the always-inlined row code keeps its accumulators in registers. */
#define BY_ROWS(CALL) switch (nb) { case 1: CALL(1); break; case 2: CALL(2); break; case 3: CALL(3); break; default: CALL(4); }
#define F32_ROW(NB) row_f32(m->w + (long)n * m->k, m->k, x, ldx, NB, out)
#define U8_ROW(NB) row_q(m, n, x, ldx, NB, out, xsum, groups, 8)
#define U4_ROW(NB) row_q(m, n, x, ldx, NB, out, xsum, groups, 4)

static void mat_row(const Mat *m, int n, const float *x, int ldx, int nb, float *out, const float *xsum, int groups) {
    if (m->fmt == F32) { BY_ROWS(F32_ROW) }
    else if (m->fmt == U8) { BY_ROWS(U8_ROW) }
    else { BY_ROWS(U4_ROW) }
}

/* y (B, ldy) = x (B, ldx) W^T + bias, or y += that when `add`; call inside a parallel region. */
static void gemv_shared(const Mat *m, const float *x, int ldx, int B, float *y, int ldy, int add) {
    const int groups = (m->k + m->group - 1) / m->group;
    float xsum[MAX_BATCH * (m->fmt == F32 ? 1 : groups)]; /* each thread sums x itself: B k adds, no barrier */
    if (m->fmt != F32) group_sums(m, x, ldx, B, xsum, groups);
#pragma omp for schedule(static) nowait
    for (int n = 0; n < m->n; ++n) {
        float out[CHUNK];
        for (int b0 = 0; b0 < B; b0 += CHUNK) {
            const int nb = B - b0 < CHUNK ? B - b0 : CHUNK;
            mat_row(m, n, x + (long)b0 * ldx, ldx, nb, out, xsum + b0 * groups, groups);
            for (int b = 0; b < nb; ++b) {
                const float v = out[b] + (m->bias ? m->bias[n] : 0.0f);
                float *dst = y + (long)(b0 + b) * ldy + n;
                *dst = add ? *dst + v : v;
            }
        }
    }
}

/* The same product on its own (one-row kernels for any caller: tests, small-M linears). */
void gemv(const Mat *m, const float *x, int B, float *y, int threads) {
#pragma omp parallel num_threads(threads)
    gemv_shared(m, x, m->k, B, y, m->n, 0);
}

/* Row `n` of the weight, de-quantized: the embedding of a token when the head is tied. */
static void weight_row(const Mat *m, int n, float *out) {
    if (m->fmt == F32) { memcpy(out, m->w + (long)n * m->k, sizeof(float) * m->k); return; }
    const int bits = m->fmt == U8 ? 8 : 4, fields = 32 / bits, block = 8 * fields;
    const int groups = (m->k + m->group - 1) / m->group;
    const uint32_t *c = (const uint32_t *)m->codes + (long)n * (m->k / block) * 8;
    const float *grid = m->grid + (long)n * groups * 2;
    for (int j = 0; j < m->k; ++j) {
        const uint32_t word = c[(j / block) * 8 + j % 8];
        const int code = (int)((word >> (bits * ((j % block) / 8))) & ((1u << bits) - 1));
        out[j] = grid[2 * (j / m->group)] * code + grid[2 * (j / m->group) + 1];
    }
}

static void rms_norm(const float *x, const float *weight, int d, float eps, float *out) {
    float ss = 0.0f;
    for (int i = 0; i < d; ++i) ss += x[i] * x[i];
    const float r = 1.0f / sqrtf(ss / d + eps);
    for (int i = 0; i < d; ++i) out[i] = weight[i] * (x[i] * r);
}

static void rope(float *v, const float *cos, const float *sin, int hd) {
    const int half = hd / 2;
    for (int i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cos[i] - b * sin[i];
        v[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

static float dot(const float *a, const float *b, int d) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= d; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = hsum(acc);
    for (; i < d; ++i) s += a[i] * b[i];
    return s;
}

/* Scratch, in floats: x, h (B x hidden); q, att (B x heads*hd); k, v (B x kv*hd); g, u (B x inter);
   scores (B*heads x max_len). Python allocates scratch_floats(...) of them. */
long scratch_floats(int batch, int hidden, int heads, int kv_heads, int head_dim, int inter, int max_len) {
    return (long)batch * (2L * hidden + 2L * heads * head_dim + 2L * kv_heads * head_dim + 2L * inter
                          + (long)heads * max_len);
}

/* Logits (B, vocab) after tokens[b] at position `pos` of each sequence; the KV caches hold 0 .. pos - 1. */
void decode_step(const Model *m, const int64_t *tokens, int B, int pos, float *logits) {
    const int H = m->hidden, hd = m->head_dim, QD = m->heads * hd, KD = m->kv_heads * hd, I = m->inter;
    const int per_kv = m->heads / m->kv_heads, T = pos + 1;
    float *x = m->scratch, *h = x + B * H, *q = h + B * H, *att = q + B * QD, *k = att + B * QD;
    float *v = k + B * KD, *g = v + B * KD, *u = g + B * I, *scores = u + B * I;
    const float *cs = m->cos + (long)pos * hd, *sn = m->sin + (long)pos * hd;
#pragma omp parallel num_threads(m->threads)
    {
#pragma omp for schedule(static)
        for (int b = 0; b < B; ++b) {
            if (m->embed) memcpy(x + b * H, m->embed + tokens[b] * H, sizeof(float) * H);
            else weight_row(&m->head, (int)tokens[b], x + b * H);
        }
        for (int l = 0; l < m->layers; ++l) {
            const Layer *L = m->layer + l;
#pragma omp for schedule(static)
            for (int b = 0; b < B; ++b) rms_norm(x + b * H, L->ln1, H, m->eps, h + b * H);
            gemv_shared(&L->q, h, H, B, q, QD, 0);
            gemv_shared(&L->k, h, H, B, k, KD, 0);
            gemv_shared(&L->v, h, H, B, v, KD, 0);
#pragma omp barrier
#pragma omp for schedule(static)
            for (int i = 0; i < B * (m->heads + m->kv_heads); ++i) {
                const int b = i / (m->heads + m->kv_heads), head = i % (m->heads + m->kv_heads);
                if (head < m->heads) { rope(q + b * QD + head * hd, cs, sn, hd); continue; }
                const int kv = head - m->heads;
                float *kv_at = L->kcache + (((long)b * m->kv_heads + kv) * m->max_len + pos) * hd;
                rope(k + b * KD + kv * hd, cs, sn, hd);
                memcpy(kv_at, k + b * KD + kv * hd, sizeof(float) * hd);
                memcpy(L->vcache + (kv_at - L->kcache), v + b * KD + kv * hd, sizeof(float) * hd);
            }
#pragma omp for schedule(static)
            for (int i = 0; i < B * m->heads; ++i) {
                const int b = i / m->heads, head = i % m->heads, kv = head / per_kv;
                const float *qi = q + b * QD + head * hd;
                const float *K = L->kcache + ((long)b * m->kv_heads + kv) * m->max_len * hd;
                const float *V = L->vcache + ((long)b * m->kv_heads + kv) * m->max_len * hd;
                float *s = scores + (long)i * m->max_len, best = -INFINITY, total = 0.0f;
                for (int t = 0; t < T; ++t) {
                    s[t] = dot(qi, K + (long)t * hd, hd) * m->attn_scale;
                    best = s[t] > best ? s[t] : best;
                }
                for (int t = 0; t < T; ++t) { s[t] = expf(s[t] - best); total += s[t]; }
                float *o = att + b * QD + head * hd;
                memset(o, 0, sizeof(float) * hd);
                for (int t = 0; t < T; ++t) {
                    const float p = s[t] / total;
                    for (int j = 0; j < hd; ++j) o[j] += p * V[(long)t * hd + j];
                }
            }
            gemv_shared(&L->o, att, QD, B, x, H, 1);
#pragma omp barrier
#pragma omp for schedule(static)
            for (int b = 0; b < B; ++b) rms_norm(x + b * H, L->ln2, H, m->eps, h + b * H);
            gemv_shared(&L->gate, h, H, B, g, I, 0);
            gemv_shared(&L->up, h, H, B, u, I, 0);
#pragma omp barrier
#pragma omp for schedule(static)
            for (long i = 0; i < (long)B * I; ++i) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
            gemv_shared(&L->down, g, I, B, x, H, 1);
#pragma omp barrier
        }
#pragma omp for schedule(static)
        for (int b = 0; b < B; ++b) rms_norm(x + b * H, m->norm, H, m->eps, h + b * H);
        gemv_shared(&m->head, h, H, B, logits, m->vocab, 0);
    }
}
