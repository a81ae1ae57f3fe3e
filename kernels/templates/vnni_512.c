
typedef __m512i VI;
#define VZERO() _mm512_setzero_si512()
#define VLOAD(p) _mm512_loadu_si512((const void *)(p))
#define VSTORE(p, v) _mm512_storeu_si512((void *)(p), v)
#define VBCAST(w) _mm512_set1_epi32(w)
static inline VI vdot(VI a, VI x, VI w) { return ${intrinsic}; }
static inline vi vhalf(VI a, int h) { return (vi)(h ? _mm512_extracti64x4_epi64(a, 1) : _mm512_castsi512_si256(a)); }
