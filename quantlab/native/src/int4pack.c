/* Rows of a weight held in torch's CPU int4 packing (torch._convert_weight_to_int4pack_for_cpu, the layout
 * torch._weight_int4pack_mm_for_cpu reads), dequantized for a dense matmul: a prompt's or a perplexity window's
 * rows, where torch's fused kernel decodes every weight again for each 4 rows of the input.
 *
 * torch packs the [N, K] codes in blocks of BLOCK_N output rows, a block's bytes at block * K * BLOCK_N / 2, and
 * within a block input column k's codes in BLOCK_N / 2 bytes (aten/src/ATen/native/cpu/int4mm_kernel.cpp,
 * weight_to_int4pack_kernel); how a block's rows share those bytes follows the CPU capability torch dispatched to:
 *   layout 64 (AVX-512, BLOCK_N 64): byte k*32 + d holds rows d (low nibble) and d+32 (high), byte k*32 + 16 + d
 *                                    rows 16+d and 48+d (d < 16);
 *   layout 32 (AVX2, BLOCK_N 32):    byte k*16 + d holds rows d and d+16;
 *   layout 0 (no vectors, BLOCK_N 32), and a last block narrower than BLOCK_N in every layout: byte k*nb/2 + r/2
 *                                    holds rows r (even, low nibble) and r+1 (nb the block's rows).
 * A weight value is (code - 8) * scale + zero, scale and zero from scales_and_zeros [K / group, N, 2] (float32
 * or bfloat16), in float32 as torch's kernel for the layout computes it (AVX2's as code * scale + (zero - 8 scale)),
 * rounded once to the output dtype: a bfloat16 weight is the kernel's own value rounded. */
#include <math.h>

#include "common.h"

/* Where row n's codes are: the byte of column 0, the bytes from one column to the next, the nibble's shift. */
static void row_place(int64_t n, int64_t N, int64_t K, int layout, int64_t* base, int64_t* stride, int* shift) {
    int64_t block_n = layout == 64 ? 64 : 32, nb = n / block_n, r = n % block_n;
    int64_t rows = N - nb * block_n < block_n ? N - nb * block_n : block_n;
    *base = nb * K * (block_n / 2);
    if (rows == block_n && layout == 64) {
        *base += (r & 15) + ((r >> 4) & 1) * 16;
        *stride = 32;
        *shift = r >= 32 ? 4 : 0;
    } else if (rows == block_n && layout == 32) {
        *base += r & 15;
        *stride = 16;
        *shift = r >= 16 ? 4 : 0;
    } else {
        *base += r / 2;
        *stride = rows / 2;
        *shift = (int)(r & 1) * 4;
    }
}

#ifdef __AVX2__  /* the vector paths' (AVX-512 builds have AVX2) */
/* A group's scales and zeros of rows [n0, n0 + count) (count <= 64) as float32. */
static void group_params(const void* sz, int sz_kind, int64_t N, int64_t kg, int64_t n0, int count, float* scale,
                         float* zero) {
    for (int d = 0; d < count; d++) {
        size_t g = ((size_t)kg * (size_t)N + (size_t)(n0 + d)) * 2;
        scale[d] = load_scale(sz, sz_kind, g);
        zero[d] = load_scale(sz, sz_kind, g + 1);
    }
}
#endif

#ifdef __AVX512F__
/* A whole block of layout 64: each column's 32 bytes are its 64 rows' codes (low nibbles rows 0-15 and 16-31, high
   nibbles rows 32-47 and 48-63), written at out + k * width. */
static void block64(const uint8_t* b, const void* sz, int sz_kind, uint16_t* out16, float* out32, int64_t width,
                    int64_t N, int64_t K, int64_t group, int64_t n0) {
    const __m256i low4 = _mm256_set1_epi8(15);
    const __m512i eight = _mm512_set1_epi32(8);
    for (int64_t k0 = 0; k0 < K; k0 += group) {
        float s[64], z[64];
        group_params(sz, sz_kind, N, k0 / group, n0, 64, s, z);
        for (int64_t k = k0; k < k0 + group; k++) {
            __m256i bytes = _mm256_loadu_si256((const __m256i*)(b + k * 32));
            __m256i lo = _mm256_and_si256(bytes, low4), hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4);
            __m128i part[4] = {_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1),
                               _mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1)};
            for (int q = 0; q < 4; q++) {  /* (code - 8) * scale + zero in float32, as torch's kernel computes it */
                __m512 c = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(part[q]), eight));
                __m512 v = _mm512_fmadd_ps(c, _mm512_loadu_ps(s + 16 * q), _mm512_loadu_ps(z + 16 * q));
                if (out16) _mm256_storeu_si256((__m256i*)(out16 + k * width + 16 * q), bf16_round16(v));
                else _mm512_storeu_ps(out32 + k * width + 16 * q, v);
            }
        }
    }
}
#endif

#ifdef __AVX2__
/* A whole block of layout 32: each column's 16 bytes are its 32 rows' codes (low nibbles rows 0-15, high 16-31). */
static void block32(const uint8_t* b, const void* sz, int sz_kind, uint16_t* out16, float* out32, int64_t width,
                    int64_t N, int64_t K, int64_t group, int64_t n0) {
    const __m128i low4 = _mm_set1_epi8(15);
    for (int64_t k0 = 0; k0 < K; k0 += group) {
        float s[32], z[32];
        group_params(sz, sz_kind, N, k0 / group, n0, 32, s, z);
        for (int d = 0; d < 32; d++) z[d] = fmaf(s[d], -8.0f, z[d]);  /* code * scale + (zero - 8 scale), as torch's AVX2 kernel */
        for (int64_t k = k0; k < k0 + group; k++) {
            __m128i bytes = _mm_loadu_si128((const __m128i*)(b + k * 16));
            __m128i lo = _mm_and_si128(bytes, low4), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low4);
            __m128i part[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
            for (int q = 0; q < 4; q++) {
                __m256 c = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(part[q]));
                __m256 v = _mm256_fmadd_ps(c, _mm256_loadu_ps(s + 8 * q), _mm256_loadu_ps(z + 8 * q));
                if (out16) _mm_storeu_si128((__m128i*)(out16 + k * width + 8 * q), bf16_round8(v));
                else _mm256_storeu_ps(out32 + k * width + 8 * q, v);
            }
        }
    }
}
#endif

/* Output rows [row0, row1) transposed into out [K, row1 - row0] (k-major, as torch's blocks hold them; a dense
   matmul takes either orientation): 0, or 1 for a layout or shape it does not know. */
int int4pack_dequantize_t(const uint8_t* packed, const void* sz, int sz_kind, void* out, int out_kind, int64_t row0,
                          int64_t row1, int64_t N, int64_t K, int64_t group, int layout) {
    if ((layout != 0 && layout != 32 && layout != 64) || group <= 0 || K % group || N % 16) return 1;
    int64_t block_n = layout == 64 ? 64 : 32, width = row1 - row0;
    int64_t nb0 = row0 / block_n, nb1 = (row1 + block_n - 1) / block_n;
    uint16_t* out16 = out_kind == BF16 ? (uint16_t*)out : NULL;
    float* out32 = out_kind == BF16 ? NULL : (float*)out;
    #pragma omp parallel for schedule(static)
    for (int64_t nb = nb0; nb < nb1; nb++) {
        int64_t n0 = nb * block_n > row0 ? nb * block_n : row0;
        int64_t n1 = (nb + 1) * block_n < row1 ? (nb + 1) * block_n : row1;
        int whole = n0 == nb * block_n && n1 == n0 + block_n && N - n0 >= block_n;
        const uint8_t* b = packed + nb * K * (block_n / 2);
        uint16_t* o16 = out16 ? out16 + (n0 - row0) : NULL;
        float* o32 = out32 ? out32 + (n0 - row0) : NULL;
        void (*block)(const uint8_t*, const void*, int, uint16_t*, float*, int64_t, int64_t, int64_t, int64_t,
                      int64_t) = NULL;  /* the vector path for a whole block of this layout, where built */
#ifdef __AVX512F__
        if (layout == 64) block = block64;
#endif
#ifdef __AVX2__
        if (layout == 32) block = block32;
#endif
        if (whole && block) {
            block(b, sz, sz_kind, o16, o32, width, N, K, group, n0);
            continue;
        }
        for (int64_t n = n0; n < n1; n++) {  /* a last, narrower block; layout 0 */
            int64_t base, stride;
            int shift;
            row_place(n, N, K, layout, &base, &stride, &shift);
            for (int64_t k = 0; k < K; k++) {
                size_t g = ((size_t)(k / group) * (size_t)N + (size_t)n) * 2, o = (size_t)k * (size_t)width + (size_t)(n - row0);
                int code = (packed[base + k * stride] >> shift) & 15;
                float scale = load_scale(sz, sz_kind, g), zero = load_scale(sz, sz_kind, g + 1);
                float v = layout == 32 ? fmaf((float)code, scale, fmaf(scale, -8.0f, zero))
                                       : fmaf((float)(code - 8), scale, zero);
                if (out16) out16[o] = float_to_bf16(v);
                else out32[o] = v;
            }
        }
    }
    return 0;
}
