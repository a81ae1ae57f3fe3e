#include <immintrin.h>
typedef int32_t VD __attribute__((vector_size(64), aligned(4)));  /* one step: 64 bytes of weights or k */
static inline VD vload64(const uint8_t *p) { VD v; memcpy(&v, p, sizeof v); return v; }
static inline VD vperm(VD i, VD x) { return (VD)_mm512_permutexvar_epi8((__m512i)i, (__m512i)x); }
static inline VD vdot(VD a, VD x, VD w) { return (VD)_mm512_dpbusd_epi32((__m512i)a, (__m512i)x, (__m512i)w); }
#define KEEP(x) __asm__("" : "+v"(x))  /* x stays in a register: its load is not folded into each use */
