/* A prompt's products (after decode_rows.c): many input rows against the step's packed weights.
 *
 * The prefill of a 128-token prompt multiplies 128 rows by every projection: a matrix product, where
 * the decode kernels (a weight row against at most 4 input rows, activation signs applied per product)
 * leave most of the integer units idle. `prefill` rounds the rows once per 32 columns, as the step rounds
 * them (shared by the threads), and runs one or several weights over them in one parallel region.
 *
 * Tiled weights meet PR input rows at a time in `tile_many`: a run's weight vectors are loaded once and
 * made unsigned (X4: the nibbles; X8: code - 128 + 128, the 128 moved into the offset: w = s c + (o - 128 s)),
 * so each 32-byte vector of 8 rows x 4 columns meets a broadcast of a row's 4 signed activation codes in one
 * `vpdpbusd`, PR independent accumulator chains. Without VNNI the 4-bit tiles run the same way with
 * `vpmaddubsw` into int16 sums; 8-bit codes would overflow those, so X8 without VNNI, and the row layouts,
 * run the decode kernels (`gemv_shared`) over the same rounded rows: the same products, as the step does.
 * So do inputs of at most CHUNK rows (a short prompt, the head's last position), where those win.
 */

#if VNNI && defined(__AVX512VL__)
#define PR 8 /* input rows a pass over a tile's run meets: 8 codes + 8 int32 + 8 float accumulators in 32 ymm */
#else
#define PR 4
#endif
#define PREFILL_CHUNK 64 /* input rows of one work item (a tile against them): tiles x chunks spread the threads */
#define REC_BYTES (PR * 32 + 2 * PR * 4) /* a block's run: PR x 32 codes, PR scales, PR run sums */

/* Floats `prefill` needs in scratch for M rows of k columns: the rounded rows (padded to PR with zeros), then
   the same rows interleaved by blocks of PR for tile_many. */
long prefill_floats(int M, int k) {
    const long padded = (M + PR - 1) / PR * PR;
    return act_floats(padded, k) + padded / PR * (k / QBLOCK) * REC_BYTES / 4;
}

/* Tile t's 8 outputs for the PR input rows of one block (`blk`: its runs' records, one after another):
   out[b * TILE + i]. Per run, the integer sums times the rows' scales times the run's activation scale, plus
   the group's offsets times the run's rounded sums (xs). One pointer walks the records, so every broadcast is
   a constant displacement: no per-row address registers, all accumulators stay in registers. */
INLINE void tile_many(const Mat *m, int t, const uint8_t *blk, float *out, const int FOUR, const int HALF,
                      const int PER) {
    const int runs = m->k / 32, per = PER ? PER : m->group / 32, groups = (m->k + m->group - 1) / m->group;
    const long run_bytes = FOUR ? 128 : 256;
    const uint8_t *w = m->codes + (long)t * runs * run_bytes;
    const long g0 = (long)t * groups * 2 * TILE;
    const __m256i low = _mm256_set1_epi8(15), flip = _mm256_set1_epi8((char)0x80);
    __m256 acc[PR];
    for (int b = 0; b < PR; ++b) acc[b] = _mm256_setzero_ps();
    for (int g = 0, r = 0; g < groups; ++g) {
        const __m256 s = tile_grid(m->grid, HALF, g0 + g * TILE);
        __m256 o = tile_grid(m->grid, HALF, g0 + (groups + g) * TILE);
        if (!FOUR) o = _mm256_fnmadd_ps(_mm256_set1_ps(128.0f), s, o);
        const int end = r + per < runs ? r + per : runs;
        for (; r < end; ++r, w += run_bytes) {
            const uint8_t *rec = blk + (long)r * REC_BYTES;
            const float *d = (const float *)(rec + PR * 32), *xs = d + PR;
            __m256i u[8];
            if (FOUR) {
                for (int j = 0; j < 4; ++j) {
                    const __m256i raw = _mm256_loadu_si256((const __m256i *)(w + 32 * j));
                    u[j] = _mm256_and_si256(raw, low);
                    u[j + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
                }
            } else {
                for (int c = 0; c < 8; ++c) u[c] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + 32 * c)), flip);
            }
            __m256i p[PR];
            for (int b = 0; b < PR; ++b) p[b] = _mm256_setzero_si256();
            /* chunk-major: PR independent chains between two products of one chain */
#if VNNI
            for (int c = 0; c < 8; ++c)
                for (int b = 0; b < PR; ++b)
                    p[b] = dot4_add(p[b], u[c], _mm256_set1_epi32(*(const int32_t *)(rec + b * 32 + 4 * c)));
#else
            /* X4 only: nibbles <= 15 against |q| <= 127 sum to at most 8 x 3810 = 30480 per int16 lane pair */
            for (int c = 0; c < 8; ++c)
                for (int b = 0; b < PR; ++b)
                    p[b] = _mm256_add_epi16(p[b], _mm256_maddubs_epi16(u[c], _mm256_set1_epi32(*(const int32_t *)(rec + b * 32 + 4 * c))));
            for (int b = 0; b < PR; ++b) p[b] = _mm256_madd_epi16(p[b], _mm256_set1_epi16(1));
#endif
            for (int b = 0; b < PR; ++b) {
                acc[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p[b]), _mm256_mul_ps(s, _mm256_set1_ps(d[b])), acc[b]);
                acc[b] = _mm256_fmadd_ps(o, _mm256_set1_ps(xs[b]), acc[b]);
            }
        }
    }
    for (int b = 0; b < PR; ++b) _mm256_storeu_ps(out + b * TILE, acc[b]);
}

/* the layout and the runs a group spans as constants (1: groups of 32; 4: of 128), so each variant inlines */
#define MANY(FOUR, HALF)                                                                                       \
    if (per == 1) tile_many(m, t, blk, out, FOUR, HALF, 1);                                                   \
    else if (per == 4) tile_many(m, t, blk, out, FOUR, HALF, 4);                                              \
    else tile_many(m, t, blk, out, FOUR, HALF, 0)

/* y (M, ldy) = x W^T + bias (or += that, `add`) for a tiled W over the interleaved blocks `blocks`; work items are
   (tile, PREFILL_CHUNK rows); call inside a parallel region. */
static void prefill_tiles(const Mat *m, const uint8_t *blocks, int M, float *y, int ldy, int add) {
    const int tiles = (m->n + TILE - 1) / TILE, chunks = (M + PREFILL_CHUNK - 1) / PREFILL_CHUNK, per = m->group / 32;
    const long block_bytes = (long)(m->k / QBLOCK) * REC_BYTES;
#pragma omp for schedule(static) nowait
    for (int item = 0; item < tiles * chunks; ++item) {
        const int t = item / chunks, first = item % chunks * PREFILL_CHUNK;
        const int last = first + PREFILL_CHUNK < M ? first + PREFILL_CHUNK : M;
        const int rows = m->n - t * TILE < TILE ? m->n - t * TILE : TILE;
        float out[PR * TILE];
        for (int b0 = first; b0 < last; b0 += PR) {
            const uint8_t *blk = blocks + b0 / PR * block_bytes;
            if (m->fmt == X4) { MANY(1, 0); }
            else if (m->fmt == X4H) { MANY(1, 1); }
#if VNNI
            else if (m->fmt == X8) { MANY(0, 0); }
            else { MANY(0, 1); }
#endif
            const int nb = last - b0 < PR ? last - b0 : PR;
            for (int b = 0; b < nb; ++b)
                for (int i = 0; i < rows; ++i) put(m, t * TILE + i, out[b * TILE + i], y + (long)(b0 + b) * ldy + t * TILE + i, add);
        }
    }
}
#undef MANY

/* Whether `tile_many` runs this layout at M rows: more rows than the decode kernels' CHUNK (at up to CHUNK they
   read the weight once and win: the head's one row at 0.7 against 1.3 ms), and every tile layout with VNNI;
   without, the 4-bit ones (their int16 sums cannot overflow; 8-bit codes would: they keep the sign trick). */
static int many_rows(const Mat *m, int M) {
    return M > CHUNK && (VNNI ? IS_TILE(m->fmt) : m->fmt == X4 || m->fmt == X4H);
}

/* Block `blk`'s rows of the rounded input `a` copied into its records (tile_many's layout). */
static void interleave_block(const Act *a, int k, int blk, uint8_t *blocks) {
    const int runs = k / QBLOCK;
    for (int r = 0; r < runs; ++r) {
        uint8_t *rec = blocks + ((long)blk * runs + r) * REC_BYTES;
        float *d = (float *)(rec + PR * 32), *xs = d + PR;
        for (int b = 0; b < PR; ++b) {
            const long row = (long)blk * PR + b;
            memcpy(rec + b * 32, a->q + row * k + r * 32, 32);
            d[b] = a->d[row * runs + r];
            xs[b] = a->xs[row * runs + r];
        }
    }
}

/* ys[c] (M, mats[c]->n) = x W_c^T + bias_c (or += that, `add`) for `count` weights of one input width k: x (M, k)
   rounded once per 32 columns to int8 (as the step rounds it) in `scratch` (prefill_floats(M, k)), then each
   product. Call inside a parallel region; the products end without a barrier (the caller's before reading ys). */
static void products_shared(const Mat *const *mats, int count, const float *x, int M, float *const *ys,
                            float *scratch, int add) {
    const int k = mats[0]->k, padded = (M + PR - 1) / PR * PR;
    const Act a = act_layout(padded, k, scratch);
    uint8_t *blocks = (uint8_t *)(scratch + act_floats(padded, k));
    int tiled = 0, rows = 0; /* some weight reads the interleaved codes; some the rounded values */
    for (int c = 0; c < count; ++c) {
        tiled |= many_rows(mats[c], M);
        rows |= !many_rows(mats[c], M);
    }
#pragma omp for schedule(static)
    for (int b = 0; b < padded; ++b) {
        if (b < M) { round_rows(x, padded, k, QBLOCK, 127.0f, scratch, b, b + 1, rows); continue; }
        /* padding: zero codes, scales and sums, so its outputs are zero and never stored */
        memset((int8_t *)a.q + (long)b * k, 0, k);
        memset((float *)a.d + (long)b * (k / QBLOCK), 0, sizeof(float) * (k / QBLOCK));
        memset((float *)a.xs + (long)b * (k / QBLOCK), 0, sizeof(float) * (k / QBLOCK));
    }
    if (tiled) {
#pragma omp for schedule(static)
        for (int blk = 0; blk < padded / PR; ++blk) interleave_block(&a, k, blk, blocks);
    }
    for (int c = 0; c < count; ++c) {
        if (many_rows(mats[c], M)) { prefill_tiles(mats[c], blocks, M, ys[c], mats[c]->n, add); continue; }
        gemv_shared(mats[c], &a, M, ys[c], mats[c]->n, add);
    }
}

/* ys[c] (M, mats[c]->n) = x W_c^T + bias_c, one parallel region (products_shared). */
void prefill(const Mat *const *mats, int count, const float *x, int M, float *const *ys, int threads, float *scratch) {
#pragma omp parallel num_threads(threads)
    products_shared(mats, count, x, M, ys, scratch, 0);
}
