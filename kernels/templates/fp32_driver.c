/* One work item: chunks c0..c1 of the tile packed in xt (K-major) into yb (N x TILE), then those rows
   of yb to rows m0.. of Y (none when Y is NULL: a fused pair reads yb). */
static void run_item(const float *xt, float *yb, float *Y, long m0, long mt, long c0, long c1, const float *W,
                     const float *bias, const struct pattern *P) {
    const vf zero = {0}; const vf one = zero + 1.0f; (void)one; (void)zero;
${body}}

void ${name}(const float *X, float *Y, long M, const float *W, const float *bias, const struct pattern *P) {
    const long tiles = (M + TILE - 1) / TILE;
    const long split = tiles >= 4 * omp_get_max_threads() ? 1 : N_CHUNKS;  /* chunk runs per tile */
    /* small M: every tile is packed once into a shared buffer, then chunks split over threads */
    float *shared = split == 1 ? NULL : aligned_alloc(64, sizeof(float) * XB_FLOATS * tiles);
    #pragma omp parallel
    {
        float *xb = split == 1 ? aligned_alloc(64, sizeof(float) * XB_FLOATS) : NULL;
        float *yb = aligned_alloc(64, sizeof(float) * N_OUT * TILE);
        if (split == 1) {
            /* whole tiles handed out one at a time, not in two fixed halves: where one core runs slower (a busy
               neighbour on a shared machine), the other takes more tiles instead of waiting for it at the end */
            #pragma omp for schedule(dynamic, 1)
            for (long tile = 0; tile < tiles; ++tile) {
                const long m0 = tile * TILE, mt = M - m0 < TILE ? M - m0 : TILE;
                pack_tile(X, xb, m0, mt, P);
                run_item(xb, yb, Y, m0, mt, 0, N_CHUNKS, W, bias, P);
            }
        } else {
            /* few tiles: each packed once, its chunks split over threads, in order, so that a thread runs the
               tiles it packed */
            #pragma omp for schedule(static)
            for (long i = 0; i < tiles; ++i) {
                const long m0 = i * TILE;
                pack_tile(X, shared + i * XB_FLOATS, m0, M - m0 < TILE ? M - m0 : TILE, P);
            }
            #pragma omp for schedule(static)
            for (long item = 0; item < tiles * split; ++item) {
                const long tile = item / split, m0 = tile * TILE, c = item % split;
                run_item(shared + tile * XB_FLOATS, yb, Y, m0, M - m0 < TILE ? M - m0 : TILE, c, c + 1, W, bias, P);
            }
        }
        free(xb);
        free(yb);
    }
    free(shared);
}

/* Entry points for a fused driver that chains kernels tile by tile (kernels/fused_ffn.py). A tile's
   output yb (N_OUT x TILE) is K-major, the packed X tile of a next kernel with the same TILE as it is:
   the M x N intermediate never reaches memory and is never packed. */
long ${name}_tile_rows(void) { return TILE; }

long ${name}_xb_floats(const struct pattern *P) { (void)P; return XB_FLOATS; }

void ${name}_pack_rows(const float *X, float *xb, long m0, long mt, const struct pattern *P) {
    pack_tile(X, xb, m0, mt, P);
}

void ${name}_run_tile(const float *xt, float *yb, const float *W, const float *bias, const struct pattern *P) {
    run_item(xt, yb, NULL, 0, TILE, 0, N_CHUNKS, W, bias, P);
}

void ${name}_unpack(const float *yb, float *Y, long m0, long mt, const struct pattern *P) {
    unpack_tile(yb, Y, m0, mt, 0, N_OUT, P);
}

/* Chunks c0..c1 of a packed tile, for a fused driver that splits a tile's chunks over threads (few tiles of M):
   rows m0.. of Y get them, or none when Y is NULL (yb is then the next kernel's packed input). */
void ${name}_run_chunks(const float *xt, float *yb, float *Y, long m0, long mt, long c0, long c1, const float *W,
                        const float *bias, const struct pattern *P) {
    run_item(xt, yb, Y, m0, mt, c0, c1, W, bias, P);
}

long ${name}_chunks(const struct pattern *P) { (void)P; return N_CHUNKS; }
