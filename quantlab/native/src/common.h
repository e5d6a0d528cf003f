/* Helpers every quantlab C kernel shares (included by the kernels in this folder; its text is part of each build's cache key). */
#ifndef QUANTLAB_COMMON_H
#define QUANTLAB_COMMON_H
#include <stdint.h>
#include <stdlib.h>
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
/* Eight finite floats to bfloat16, rounded to nearest even as float_to_bf16 rounds them (dequantized weights: no
   NaN), packed into 128 bits. */
static inline __m128i bf16_round8(__m256 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    u = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
    return _mm_packus_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
}
#endif

#ifdef __AVX512F__
/* Sixteen finite floats to bfloat16 the same way, packed into 256 bits. */
static inline __m256i bf16_round16(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    u = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
    return _mm512_cvtepi32_epi16(u);
}
#endif

/* A float16 or bfloat16 value as float32 (scales and caches stored in 16 bits). */
static inline float half_to_float(uint16_t h) {
#ifdef __F16C__
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, u;
    if (exp == 0x1F) u = sign | 0x7F800000 | (man << 13);
    else if (exp) u = sign | ((exp + 112) << 23) | (man << 13);
    else if (man) {  /* subnormal: normalize */
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3FF) << 13);
    } else u = sign;
    float f; memcpy(&f, &u, 4); return f;
#endif
}

static inline float bf16_to_float(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }

/* Entry i of a scale array stored as float32, float16 or bfloat16 (kind F32, F16, BF16). */
static inline float load_scale(const void* scales, int kind, size_t i) {
    if (kind == F32) return ((const float*)scales)[i];
    uint16_t h = ((const uint16_t*)scales)[i];
    return kind == F16 ? half_to_float(h) : bf16_to_float(h);
}

/* An e8m0 scale byte (OCP MX): the power of two 2^(e - 127); 0 is 2^-127, a subnormal. */
static inline float e8m0_to_float(uint8_t e) {
    uint32_t u = e ? (uint32_t)e << 23 : 1u << 22;
    float f; memcpy(&f, &u, 4);
    return f;
}

/* Whether every value is a bfloat16 (its low 16 bits zero): a bf16 model's activations, which the kernels' bfloat16
   dot products (AVX512-BF16) then multiply exactly. */
static inline int all_bf16(const float* v, size_t n) {
    uint32_t low = 0, u;
    for (size_t i = 0; i < n; i++) { memcpy(&u, v + i, 4); low |= u; }
    return (low & 0xFFFF) == 0;
}

/* n bfloat16 values widened to float32 in a new buffer (free it), for a kernel's float32 path given bf16 rows;
   NULL when the memory cannot be had. */
static inline float* widen_bf16(const uint16_t* x, size_t n) {
    float* out = (float*)malloc(n * sizeof(float));
    if (out)
        for (size_t i = 0; i < n; i++) out[i] = bf16_to_float(x[i]);
    return out;
}

/* CALL(R) with R a compile-time constant 1-4 (the rows of x in one group), so a kernel's row loops unroll. */
#define WITH_CONSTANT_ROWS(R, CALL) do { switch (R) { \
    case 1: CALL(1); break; case 2: CALL(2); break; case 3: CALL(3); break; default: CALL(4); } } while (0)

/* A float8 code's value (finite codes), e4m3 or e5m2. */
static inline float fp8_decode(uint8_t b, int e5m2) {
    float v;
    if (e5m2) {
        int e = (b >> 2) & 31, m = b & 3;
        v = e ? (1.0f + m / 4.0f) * (float)(1u << e) / 32768.0f : m / 4.0f / 16384.0f;
    } else {
        int e = (b >> 3) & 15, m = b & 7;
        v = e ? (1.0f + m / 8.0f) * (float)(1u << e) / 128.0f : m / 8.0f / 64.0f;
    }
    return b & 0x80 ? -v : v;
}

#if defined(__AVX2__) && defined(__F16C__)
/* Eight float8 codes as floats: e5m2 exactly (the top byte of a float16), e4m3 times 2^-8 (its exponent and
   mantissa shifted into a float16's fields: the biases differ by 8). */
static inline __m256 fp8_widen8_bytes(__m128i bytes, int e5m2) {  /* the codes in bytes' low 8 bytes */
    __m128i b = _mm_cvtepu8_epi16(bytes);
    __m128i h = e5m2 ? _mm_slli_epi16(b, 8)
        : _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7F)), 7),
                       _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8));
    return _mm256_cvtph_ps(h);
}

/* fp8_widen8_bytes of the eight codes at p. */
static inline __m256 fp8_widen8(const uint8_t* p, int e5m2) {
    return fp8_widen8_bytes(_mm_loadl_epi64((const __m128i*)p), e5m2);
}
#endif

#if defined(__AVX512BW__) && defined(__F16C__)
/* 32 float8 codes as floats, as fp8_widen8 reads them (e4m3 times 2^-8), 16 to a register: e4m3's sign shifted to
   the top and its exponent and mantissa one place below (an arithmetic shift copies the sign into bit 14, which
   the mask clears). */
static inline void fp8_widen32(const uint8_t* p, int e5m2, __m512* lo, __m512* hi) {
    __m512i b = _mm512_slli_epi16(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)p)), 8);
    __m512i h = e5m2 ? b : _mm512_and_si512(_mm512_srai_epi16(b, 1), _mm512_set1_epi16((short)0xBFFF));
    *lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    *hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
}
#endif

#ifdef __AVX2__
static inline float hsum(__m256 v) {
    float t[8]; _mm256_storeu_ps(t, v);
    return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}
#endif
#endif
