/* Helpers every quantlab C kernel shares (included by the kernels in this folder; its text is part of each build's cache key). */
#ifndef QUANTLAB_COMMON_H
#define QUANTLAB_COMMON_H
#include <stdint.h>
#include <string.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

enum { F32 = 0, F16 = 1, BF16 = 2 };  /* dtype codes: scales read, outputs written (kernels.base.OUT_KINDS) */

static inline uint16_t float_to_bf16(float f) {  /* round to nearest even, as torch does */
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFF) > 0x7F800000) return (uint16_t)((u >> 16) | 0x40);  /* NaN stays NaN */
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

#ifdef __AVX2__
static inline float hsum(__m256 v) {
    float t[8]; _mm256_storeu_ps(t, v);
    return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}
#endif
#endif
