
typedef int32_t VI __attribute__((vector_size(${bytes})));
typedef uint8_t VU8 __attribute__((vector_size(${bytes})));
typedef int8_t VS8 __attribute__((vector_size(${bytes})));
#define VZERO() ((VI){0})
static inline VI vload_(const void *p) { VI v; memcpy(&v, p, sizeof v); return v; }
#define VLOAD(p) vload_(p)
#define VSTORE(p, v) do { const VI v_ = (v); memcpy((p), &v_, sizeof v_); } while (0)
#define VBCAST(w) (((VI){0}) + (int32_t)(w))
static inline VI vdot(VI a, VI x, VI w) {
    const VU8 xb = (VU8)x;
    const VS8 wb = (VS8)w;
    for (int i = 0; i < ${lanes}; ++i)
        for (int j = 0; j < 4; ++j) a[i] += (int32_t)xb[4 * i + j] * (int32_t)wb[4 * i + j];
    return a;
}
static inline vi vhalf(VI a, int h) { vi r; memcpy(&r, (const int32_t *)&a + 8 * h, sizeof r); return r; }
