typedef int32_t VD __attribute__((vector_size(64), aligned(4)));  /* one step: 64 bytes of weights or k */
static inline VD vload64(const uint8_t *p) { VD v; memcpy(&v, p, sizeof v); return v; }
/* noinline: the kernel unrolls hundreds of calls (permute_int8._run_cases); inlined, gcc took 9 s a build */
static __attribute__((noinline)) VD vperm(VD i, VD x) {  /* exact vpermb in portable C: byte j <- x's byte (i's byte j) mod 64 */
    uint8_t ib[64], xb[64], out[64];
    memcpy(ib, &i, 64); memcpy(xb, &x, 64);
    for (int j = 0; j < 64; ++j) out[j] = xb[ib[j] & 63];
    VD r; memcpy(&r, out, 64); return r;
}
static __attribute__((noinline)) VD vdot(VD a, VD x, VD w) {  /* exact vpdpbusd: per int32 lane, 4 u8 x s8 products */
    uint8_t xb[64]; int8_t wb[64];
    memcpy(xb, &x, 64); memcpy(wb, &w, 64);
    for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 4; ++j) a[i] += (int32_t)xb[4 * i + j] * (int32_t)wb[4 * i + j];
    return a;
}
#define KEEP(x) ((void)0)
