#define VEC ${vec}
#define TILE (${tile_vectors} * VEC)
${shape}${defines}#ifndef XB_FLOATS
#define XB_FLOATS (K_IN * TILE)  /* floats of one packed X tile: K rows of TILE */
#endif
#include <stdlib.h>
#include <omp.h>
${prelude}
static inline float bias_of(const float *bias, long n) { return bias ? bias[n] : 0.0f; }
${specialized}
${unpack}
${pack}
${driver}
