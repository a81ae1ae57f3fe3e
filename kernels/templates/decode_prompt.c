/* A prompt through every layer in one OpenMP region (after decode_step.c): the int8 prefill.
 *
 * `prompt_step` runs T tokens of B sequences from position 0, as `decode_step` runs one: RMSNorm, the
 * projections through `products_shared` (each group's input rounded once per 32 columns, many rows per tile
 * pass), rotary embedding per position, keys and values into the cache, causal attention (`attend` of each
 * position over the positions up to it), SiLU MLP, residuals; then the head over each sequence's last row.
 * Stages are work-shared loops with barriers between them; activations live in `work` (prompt_floats).
 */

/* Floats `prompt_step` needs for N = B T rows: x, the normalized or gated input, q, att, k, v, g, u (N rows
   each), per thread a score row (max_len), and the rounding scratch of the widest input. */
long prompt_floats(int rows, int hidden, int heads, int kv_heads, int head_dim, int inter, int max_len, int threads) {
    const int wide = widest(hidden, heads, head_dim, inter);
    return (long)rows * (hidden + wide + 2L * heads * head_dim + 2L * kv_heads * head_dim + 2L * inter)
           + (long)threads * max_len + prefill_floats(rows, wide);
}

/* Logits (B, vocab) at the last of T positions of each sequence after tokens (B, T) from position 0; the KV
   caches hold positions 0 .. T - 1 after it. Int8 activations (the step's act_q rounding), every weight. */
void prompt_step(const Model *m, const int64_t *tokens, int B, int T, float *logits, int threads, float *work) {
    const int H = m->hidden, hd = m->head_dim, QD = m->heads * hd, KD = m->kv_heads * hd, I = m->inter;
    const int N = B * T, per_kv = m->heads / m->kv_heads, wide = widest(H, m->heads, hd, I);
    float *x = work, *h = x + (long)N * H, *q = h + (long)N * wide, *att = q + (long)N * QD;
    float *k = att + (long)N * QD, *v = k + (long)N * KD, *g = v + (long)N * KD, *u = g + (long)N * I;
    float *scores = u + (long)N * I, *rounding = scores + (long)threads * m->max_len;
#pragma omp parallel num_threads(threads)
    {
        float *s = scores + (long)omp_get_thread_num() * m->max_len;
#pragma omp for schedule(static)
        for (int r = 0; r < N; ++r) {
            if (m->embed) memcpy(x + (long)r * H, m->embed + tokens[r] * H, sizeof(float) * H);
            else weight_row(&m->head, (int)tokens[r], x + (long)r * H);
        }
        for (int l = 0; l < m->layers; ++l) {
            const Layer *L = m->layer + l;
#pragma omp for schedule(static)
            for (int r = 0; r < N; ++r) rms_norm(x + (long)r * H, L->ln1, H, m->eps, h + (long)r * H);
            const Mat *qkv[3] = {&L->q, &L->k, &L->v};
            float *const qkv_out[3] = {q, k, v};
            products_shared(qkv, 3, h, N, qkv_out, rounding, 0);
#pragma omp barrier
#pragma omp for schedule(static)
            for (long i = 0; i < (long)N * (m->heads + m->kv_heads); ++i) {
                const int r = (int)(i / (m->heads + m->kv_heads)), head = (int)(i % (m->heads + m->kv_heads));
                const int b = r / T, t = r % T;
                const float *cs = m->cos + (long)t * hd, *sn = m->sin + (long)t * hd;
                if (head < m->heads) { rope(q + (long)r * QD + head * hd, cs, sn, hd); continue; }
                const int kv = head - m->heads;
                float *kv_at = L->kcache + (((long)b * m->kv_heads + kv) * m->max_len + t) * hd;
                rope(k + (long)r * KD + kv * hd, cs, sn, hd);
                memcpy(kv_at, k + (long)r * KD + kv * hd, sizeof(float) * hd);
                memcpy(L->vcache + (kv_at - L->kcache), v + (long)r * KD + kv * hd, sizeof(float) * hd);
            }
            /* position t attends over 0 .. t: the later positions cost more, so the items are spread dynamically */
#pragma omp for schedule(dynamic, 4)
            for (long i = 0; i < (long)N * m->heads; ++i) {
                const int r = (int)(i / m->heads), head = (int)(i % m->heads), b = r / T, t = r % T;
                const long cache = ((long)b * m->kv_heads + head / per_kv) * m->max_len * hd;
                attend(q + (long)r * QD + head * hd, L->kcache + cache, L->vcache + cache, t + 1, hd, m->attn_scale, s,
                       att + (long)r * QD + head * hd);
            }
            const Mat *o[1] = {&L->o};
            float *const o_out[1] = {x};
            products_shared(o, 1, att, N, o_out, rounding, 1);
#pragma omp barrier
#pragma omp for schedule(static)
            for (int r = 0; r < N; ++r) rms_norm(x + (long)r * H, L->ln2, H, m->eps, h + (long)r * H);
            const Mat *gate_up[2] = {&L->gate, &L->up};
            float *const gate_up_out[2] = {g, u};
            products_shared(gate_up, 2, h, N, gate_up_out, rounding, 0);
#pragma omp barrier
#pragma omp for schedule(static)
            for (int r = 0; r < N; ++r) silu_times(g + (long)r * I, u + (long)r * I, I, h + (long)r * I);
            const Mat *down[1] = {&L->down};
            float *const down_out[1] = {x};
            products_shared(down, 1, h, N, down_out, rounding, 1);
#pragma omp barrier
        }
#pragma omp for schedule(static)
        for (int b = 0; b < B; ++b) rms_norm(x + ((long)b * T + T - 1) * H, m->norm, H, m->eps, h + (long)b * H);
        const Mat *head[1] = {&m->head};
        float *const head_out[1] = {logits};
        products_shared(head, 1, h, B, head_out, rounding, 0);
    }
}
