
typedef __m256i VI;
#define VZERO() _mm256_setzero_si256()
#define VLOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define VSTORE(p, v) _mm256_storeu_si256((__m256i *)(p), v)
#define VBCAST(w) _mm256_set1_epi32(w)
static inline VI vdot(VI a, VI x, VI w) { return ${intrinsic}; }
static inline vi vhalf(VI a, int h) { (void)h; return (vi)a; }
