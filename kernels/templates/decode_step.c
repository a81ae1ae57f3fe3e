/* The decode step itself: a Llama token for B <= 8 sequences in one OpenMP region (after decode_rows.c). */

/* Row `n` of the weight, de-quantized: the embedding of a token when the head is tied. */
static void weight_row(const Mat *m, int n, float *out) {
    if (m->fmt == F32) { memcpy(out, m->w + (long)n * m->k, sizeof(float) * m->k); return; }
    if (m->fmt == S32) { /* the row's kept values into their masked columns */
        const float *v = m->w + ((const int32_t *)m->grid)[n];
        const uint8_t *mask = m->codes + (long)n * (m->k / 8);
        for (int j = 0; j < m->k; ++j) out[j] = mask[j / 8] >> (j % 8) & 1 ? *v++ : 0.0f;
        return;
    }
    const int groups = (m->k + m->group - 1) / m->group;
    if (IS_TILE(m->fmt)) { /* row i of tile t (layout: tile_int8) */
        const int t = n / TILE, i = n % TILE, four = m->fmt == X4 || m->fmt == X4H;
        const int half = m->fmt == X4H || m->fmt == X8H;
        const uint8_t *w = m->codes + (long)t * (m->k / 32) * (four ? 128 : 256);
        const long g0 = (long)t * groups * 2 * TILE + i;
        for (int j = 0; j < m->k; ++j) {
            const int r = j / 32, c = j % 32 / 4, at = 4 * i + j % 4, g = j / m->group;
            const int code = four ? (c < 4 ? w[r * 128 + c * 32 + at] & 15 : w[r * 128 + (c - 4) * 32 + at] >> 4)
                                  : ((const int8_t *)w)[r * 256 + c * 32 + at];
            const long s = g0 + (long)g * TILE, o = g0 + (long)(groups + g) * TILE;
            out[j] = half ? half_at(m->grid, s) * code + half_at(m->grid, o)
                          : ((const float *)m->grid)[s] * code + ((const float *)m->grid)[o];
        }
        return;
    }
    float tmp[2 * groups];
    const float *scales = row_grids(m, n, groups, tmp), *offs = scales + groups;
    for (int j = 0; j < m->k; ++j) {
        int code;
        if (m->fmt == U8 || m->fmt == U8H) code = ((const int8_t *)m->codes)[(long)n * m->k + j];
        else {
            const uint8_t byte = m->codes[(long)n * (m->k / 2) + (j / 64) * 32 + j % 32];
            code = j % 64 < 32 ? byte & 15 : byte >> 4;
        }
        out[j] = scales[j / m->group] * code + offs[j / m->group];
    }
}

static void rms_norm(const float *x, const float *weight, int d, float eps, float *out) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= d; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(x + i), acc);
    float ss = hsum(acc);
    for (; i < d; ++i) ss += x[i] * x[i];
    const float r = 1.0f / sqrtf(ss / d + eps);
    const __m256 rv = _mm256_set1_ps(r);
    for (i = 0; i + 8 <= d; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(weight + i), _mm256_mul_ps(_mm256_loadu_ps(x + i), rv)));
    for (; i < d; ++i) out[i] = weight[i] * (x[i] * r);
}

/* e^x for 8 floats: x = n ln 2 + r, a degree-7 polynomial in r (Cephes' expf coefficients), 2^n put in the
   exponent bits; within 1 ulp of the correctly rounded e^x over [-87, 88] (checked on ~10^7 points), where
   2^n stays a normal float: x is clamped there. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x); /* ln 2 in two parts: r exact enough */
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(two_n));
}

/* out = silu(g) * u = g / (1 + e^-g) * u over n values: each thread's own gated input (every thread needs it all) */
static void silu_times(const float *g, const float *u, long n, float *out) {
    long i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 gv = _mm256_loadu_ps(g + i);
        const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e)),
                                                _mm256_loadu_ps(u + i)));
    }
    for (; i < n; ++i) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
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

/* The sums of eight vectors' lanes, side by side: lane i holds the sum of a[i]. */
static inline __m256 sums8(const __m256 a[8]) {
    const __m256 s0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 s1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(s0, s1, 0x20), _mm256_permute2f128_ps(s0, s1, 0x31));
}

/* One head's attention over positions 0 .. T - 1: o = softmax(scale q K^T) V, scores in s (T floats).
   With hd a multiple of 8: eight positions' dot products at once (q read once for eight keys, one
   horizontal sum for eight), e^x eight at a time, and o's columns held in registers while every
   value row is added in. Otherwise one position at a time. */
static void attend(const float *q, const float *K, const float *V, int T, int hd, float scale, float *s,
                   float *o) {
    int t = 0;
    if (hd % 8 == 0)
        for (; t + 8 <= T; t += 8) {
            __m256 acc[8];
            for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
            for (int j = 0; j < hd; j += 8) {
                const __m256 qv = _mm256_loadu_ps(q + j);
                for (int i = 0; i < 8; ++i)
                    acc[i] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(K + (long)(t + i) * hd + j), acc[i]);
            }
            _mm256_storeu_ps(s + t, _mm256_mul_ps(sums8(acc), _mm256_set1_ps(scale)));
        }
    for (; t < T; ++t) s[t] = dot(q, K + (long)t * hd, hd) * scale;
    float best = -INFINITY, total = 0.0f;
    for (t = 0; t < T; ++t) best = s[t] > best ? s[t] : best;
    t = 0;
    __m256 sum = _mm256_setzero_ps();
    for (; t + 8 <= T; t += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), _mm256_set1_ps(best)));
        _mm256_storeu_ps(s + t, e);
        sum = _mm256_add_ps(sum, e);
    }
    total = hsum(sum);
    for (; t < T; ++t) { s[t] = expf(s[t] - best); total += s[t]; }
    const float inv = 1.0f / total;
    if (hd % 8 == 0) {
        for (int j0 = 0; j0 < hd; j0 += 64) {
            const int w = (hd - j0 < 64 ? hd - j0 : 64) / 8;
            __m256 acc[8];
            for (int f = 0; f < 8; ++f) acc[f] = _mm256_setzero_ps();
            for (t = 0; t < T; ++t) {
                const __m256 p = _mm256_set1_ps(s[t] * inv);
                const float *row = V + (long)t * hd + j0;
                for (int f = 0; f < w; ++f) acc[f] = _mm256_fmadd_ps(p, _mm256_loadu_ps(row + 8 * f), acc[f]);
            }
            for (int f = 0; f < w; ++f) _mm256_storeu_ps(o + j0 + 8 * f, acc[f]);
        }
        return;
    }
    memset(o, 0, sizeof(float) * hd);
    for (t = 0; t < T; ++t) {
        const float p = s[t] * inv;
        for (int j = 0; j < hd; ++j) o[j] += p * V[(long)t * hd + j];
    }
}

/* Scratch, in floats: x (B x hidden); q, att (B x heads*hd); k, v (B x kv*hd); g, u (B x inter);
   scores (B*heads x max_len); then per thread a normalized or gated input (B x the widest) and its
   rounding (act_floats of the widest). Python allocates scratch_floats(...) of them. */
static int widest(int hidden, int heads, int head_dim, int inter) {
    const int w = hidden > inter ? hidden : inter;
    return w > heads * head_dim ? w : heads * head_dim;
}

static long private_floats(int batch, int width) { return (long)batch * width + act_floats(batch, width); }

long scratch_floats(int batch, int hidden, int heads, int kv_heads, int head_dim, int inter, int max_len,
                    int threads) {
    return (long)batch * (hidden + 2L * heads * head_dim + 2L * kv_heads * head_dim + 2L * inter
                          + (long)heads * max_len)
           + threads * private_floats(batch, widest(hidden, heads, head_dim, inter));
}

/* Logits (B, vocab) after tokens[b] at position `pos` of each sequence; the KV caches hold 0 .. pos - 1. */
void decode_step(const Model *m, const int64_t *tokens, int B, int pos, float *logits) {
    const int H = m->hidden, hd = m->head_dim, QD = m->heads * hd, KD = m->kv_heads * hd, I = m->inter;
    const int per_kv = m->heads / m->kv_heads, T = pos + 1;
    float *x = m->scratch, *q = x + B * H, *att = q + B * QD, *k = att + B * QD;
    float *v = k + B * KD, *g = v + B * KD, *u = g + B * I, *scores = u + B * I;
    float *threads_own = scores + (long)B * m->heads * m->max_len;
    const int wide = widest(H, m->heads, hd, I);
    const float *cs = m->cos + (long)pos * hd, *sn = m->sin + (long)pos * hd;
/* A projection's input: rounded to int8 runs in the thread's own scratch when act_q, else as it is. */
#define INPUT(src, width)                                                                                        \
    if (m->act_q) round_input(src, B, width, QBLOCK, 127.0f, mine + (long)B * wide, &a);                                        \
    else a = (Act){src, width, NULL, NULL, NULL};
#pragma omp parallel num_threads(m->threads)
    {
        /* each thread normalizes (and gates) the whole input itself: B x width values, no barrier */
        float *mine = threads_own + omp_get_thread_num() * private_floats(B, wide);
        Act a;
#pragma omp for schedule(static)
        for (int b = 0; b < B; ++b) {
            if (m->embed) memcpy(x + b * H, m->embed + tokens[b] * H, sizeof(float) * H);
            else weight_row(&m->head, (int)tokens[b], x + b * H);
        }
        for (int l = 0; l < m->layers; ++l) {
            const Layer *L = m->layer + l;
            for (int b = 0; b < B; ++b) rms_norm(x + b * H, L->ln1, H, m->eps, mine + b * H);
            INPUT(mine, H)
            gemv_shared(&L->q, &a, B, q, QD, 0);
            gemv_shared(&L->k, &a, B, k, KD, 0);
            gemv_shared(&L->v, &a, B, v, KD, 0);
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
                attend(qi, K, V, T, hd, m->attn_scale, scores + (long)i * m->max_len, att + b * QD + head * hd);
            }
            INPUT(att, QD)
            gemv_shared(&L->o, &a, B, x, H, 1);
#pragma omp barrier
            for (int b = 0; b < B; ++b) rms_norm(x + b * H, L->ln2, H, m->eps, mine + b * H);
            INPUT(mine, H)
            gemv_shared(&L->gate, &a, B, g, I, 0);
            gemv_shared(&L->up, &a, B, u, I, 0);
#pragma omp barrier
            silu_times(g, u, (long)B * I, mine);
            INPUT(mine, I)
            gemv_shared(&L->down, &a, B, x, H, 1);
#pragma omp barrier
        }
        for (int b = 0; b < B; ++b) rms_norm(x + b * H, m->norm, H, m->eps, mine + b * H);
        INPUT(mine, H)
        gemv_shared(&m->head, &a, B, logits, m->vocab, 0);
    }
#undef INPUT
}
