/* Matmul and dequantization of 4-bit codebook weights (NF4, FP4, any 16-entry table) for CPUs
   (quantlab.quant.kernels.lut4).

   Layout: the stored form as it is. Each row of K codes is K/2 bytes, code 2i in the low nibble of byte i and
   code 2i+1 in the high one; a code is an index into a 16-entry float table (`lut`). The row-major weight is cut
   into blocks of `block` values (K a multiple of `block`, `block` a multiple of 32, so blocks never straddle
   rows; 16 too), each with one scale: its absolute maximum as float32 (`absmax`, kind 0), or double-quantized
   (kind 1): a uint8 index into a 256-entry map (`dmap`) times a float32 scale per 256 blocks (`scale2`) plus one
   float32 offset; or a microscaling scale (quantlab.quant.forms.microscaling): an e8m0 biased exponent byte (kind
   2, the power of two 2^(e - 127)), or an e4m3 byte decoded through `dmap` and divided by one float32 global
   scale (`scale2[0]`, kind 3; NVFP4). A decode step's few rows of activations are multiplied by the codes directly: 32 codes at a time are
   split out of their nibbles and looked up in the table in registers, never written out. With AVX-512 the whole
   table sits in one register: a 16-byte load widened to 16 lanes gives the low nibbles' codes as they are and the
   high nibbles' after one shift, each looked up with one permute (vpermps reads an index's low 4 bits), against
   the activations split once per call into the even and odd positions of every 32. Where the table's values and the
   activations are all bfloat16 (the microscaling forms' e2m1 codes times a bf16 model's activations) and the CPU
   has AVX512-BF16, microscaling rows take row_bf16 instead: 128 codes a turn looked up as bfloat16 and multiplied in
   pairs by vdpbf16ps, each block's scale applied once to its lanes' sums. Compiled at first use with the
   machine's C compiler. */
#include <stdlib.h>

#include "common.h"

enum { ABSMAX_F32 = 0, ABSMAX_DQ = 1, SCALE_E8M0 = 2, SCALE_E4M3 = 3 };


/* The scale of block b. */
static inline float block_scale(const void* absmax, int kind, const float* scale2, const float* offset,
                                const float* dmap, size_t b) {
    if (kind == ABSMAX_F32) return ((const float*)absmax)[b];
    uint8_t byte = ((const uint8_t*)absmax)[b];
    if (kind == SCALE_E8M0) return e8m0_to_float(byte);
    if (kind == SCALE_E4M3) return dmap[byte] / scale2[0];
    return dmap[byte] * scale2[b >> 8] + offset[0];
}

#ifdef __AVX2__
/* Table lookup of 8 codes (int32 lanes, 0-15) in a 16-entry table held as two 8-float registers. */
static inline __m256 lookup8(__m256i idx, __m256 lo, __m256 hi) {
    __m256 a = _mm256_permutevar8x32_ps(lo, idx), b = _mm256_permutevar8x32_ps(hi, idx);
    return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));  /* bit 3 picks the high half */
}

/* The 32 codes of 16 packed bytes, in order, as four groups of 8 table values. */
static inline void decode32(const uint8_t* p, __m256 lo, __m256 hi, __m256 v[4]) {
    __m128i bytes = _mm_loadu_si128((const __m128i*)p), mask = _mm_set1_epi8(0x0F);
    __m128i low = _mm_and_si128(bytes, mask), high = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
    __m128i c0 = _mm_unpacklo_epi8(low, high), c1 = _mm_unpackhi_epi8(low, high);  /* codes 0-15, 16-31 */
    v[0] = lookup8(_mm256_cvtepu8_epi32(c0), lo, hi);
    v[1] = lookup8(_mm256_cvtepu8_epi32(_mm_srli_si128(c0, 8)), lo, hi);
    v[2] = lookup8(_mm256_cvtepu8_epi32(c1), lo, hi);
    v[3] = lookup8(_mm256_cvtepu8_epi32(_mm_srli_si128(c1, 8)), lo, hi);
}

static inline __attribute__((always_inline)) void row_avx2(int n,
        const uint8_t* w, const void* absmax, int kind, const float* scale2, const float* offset, const float* dmap,
        const float* lut, const float* x, float* y, int R, int N, int K, int block) {
    const __m256 lo = _mm256_loadu_ps(lut), hi = _mm256_loadu_ps(lut + 8);
    int per_row = K / block;
    {
        const uint8_t* row = w + (size_t)n * (K / 2);
        __m256 total[4];
        for (int r = 0; r < R; r++) total[r] = _mm256_setzero_ps();
        if (block == 16 || block == 32) {  /* microscaling: each chunk of 32 codes takes one scale (MX) or two (NVFP4) */
            for (int k = 0; k < K; k += 32) {
                __m256 v[4];
                decode32(row + k / 2, lo, hi, v);
                size_t b = (size_t)n * per_row + k / block;
                __m256 s0 = _mm256_set1_ps(block_scale(absmax, kind, scale2, offset, dmap, b));
                __m256 s1 = block == 16 ? _mm256_set1_ps(block_scale(absmax, kind, scale2, offset, dmap, b + 1)) : s0;
                for (int r = 0; r < R; r++) {
                    const float* xb = x + (size_t)r * K + k;
                    __m256 a0 = _mm256_fmadd_ps(v[1], _mm256_loadu_ps(xb + 8), _mm256_mul_ps(v[0], _mm256_loadu_ps(xb)));
                    __m256 a1 = _mm256_fmadd_ps(v[3], _mm256_loadu_ps(xb + 24), _mm256_mul_ps(v[2], _mm256_loadu_ps(xb + 16)));
                    total[r] = _mm256_fmadd_ps(s1, a1, _mm256_fmadd_ps(s0, a0, total[r]));
                }
            }
            for (int r = 0; r < R; r++) y[(size_t)r * N + n] = hsum(total[r]);
            return;
        }
        for (int g = 0; g < per_row; g++) {
            __m256 acc[4][2];
            for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
            for (int k = g * block; k < (g + 1) * block; k += 32) {
                __m256 v[4];
                decode32(row + k / 2, lo, hi, v);
                for (int r = 0; r < R; r++) {
                    const float* xb = x + (size_t)r * K + k;
                    acc[r][0] = _mm256_fmadd_ps(v[0], _mm256_loadu_ps(xb), acc[r][0]);
                    acc[r][1] = _mm256_fmadd_ps(v[1], _mm256_loadu_ps(xb + 8), acc[r][1]);
                    acc[r][0] = _mm256_fmadd_ps(v[2], _mm256_loadu_ps(xb + 16), acc[r][0]);
                    acc[r][1] = _mm256_fmadd_ps(v[3], _mm256_loadu_ps(xb + 24), acc[r][1]);
                }
            }
            __m256 s = _mm256_set1_ps(block_scale(absmax, kind, scale2, offset, dmap, (size_t)n * per_row + g));
            for (int r = 0; r < R; r++) total[r] = _mm256_fmadd_ps(s, _mm256_add_ps(acc[r][0], acc[r][1]), total[r]);
        }
        for (int r = 0; r < R; r++) y[(size_t)r * N + n] = hsum(total[r]);
    }
}
#endif

#ifdef __AVX512F__
/* x [R, K] with each 32 values reordered as the 16 even positions, then the 16 odd ones (the low and high
   nibbles' codes of 16 bytes). */
static void split_even_odd(const float* x, float* xs, int R, int K) {
    for (size_t i = 0; i < (size_t)R * K; i += 32)
        for (int j = 0; j < 16; j++) { xs[i + j] = x[i + 2 * j]; xs[i + 16 + j] = x[i + 2 * j + 1]; }
}

/* Scales b0 .. b0 + count - 1 into sc, each as block_scale gives it (e4m3 over the global scale: the same
   division, 16 at a time). */
static inline void row_scales(const void* absmax, int kind, const float* scale2, const float* offset,
                              const float* dmap, size_t b0, int count, float* sc) {
    if (kind != SCALE_E4M3) {
        for (int i = 0; i < count; i++) sc[i] = block_scale(absmax, kind, scale2, offset, dmap, b0 + i);
        return;
    }
    const uint8_t* bytes = (const uint8_t*)absmax + b0;
    int i = 0;
#ifdef __F16C__
    const __m256 g = _mm256_set1_ps(scale2[0]), unit = _mm256_set1_ps(256.0f);  /* fp8_widen8 reads 2^-8 of a code */
    for (; i + 8 <= count; i += 8)
        _mm256_storeu_ps(sc + i, _mm256_div_ps(_mm256_mul_ps(fp8_widen8(bytes + i, 0), unit), g));
#endif
    for (; i < count; i++) sc[i] = dmap[bytes[i]] / scale2[0];
}

static inline __attribute__((always_inline)) void row_avx512(int n,
        const uint8_t* w, const void* absmax, int kind, const float* scale2, const float* offset, const float* dmap,
        const float* lut, const float* xs, float* y, int R, int N, int K, int block) {
    const __m512 table = _mm512_loadu_ps(lut);
    const uint8_t* row = w + (size_t)n * (K / 2);
    size_t b0 = (size_t)n * (K / block);
    __m512 total[4][2];
    for (int r = 0; r < R; r++) total[r][0] = total[r][1] = _mm512_setzero_ps();
    if (block == 16 || block == 32) {  /* microscaling: the codes scaled in registers, once for all rows */
        int per_row = K / block;
        float sc[per_row];  /* the row's scales, decoded first (NVFP4's divisions 16 at a time) */
        row_scales(absmax, kind, scale2, offset, dmap, b0, per_row, sc);
        int pair = block == 16;  /* two scales per 32 codes */
        const __m512i halves = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
        for (int k = 0, i = 0; k < K; k += 32, i += 1 + pair) {
            __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(row + k / 2)));
            __m512 s = pair  /* lanes 0-7 hold codes 0-15, the first block's; lanes 8-15 the second's */
                ? _mm512_permutexvar_ps(halves, _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd((const double*)(sc + i)))))
                : _mm512_set1_ps(sc[i]);
            __m512 lo = _mm512_mul_ps(s, _mm512_permutexvar_ps(c, table));
            __m512 hi = _mm512_mul_ps(s, _mm512_permutexvar_ps(_mm512_srli_epi32(c, 4), table));
            for (int r = 0; r < R; r++) {
                const float* xb = xs + (size_t)r * K + k;
                total[r][0] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(xb), total[r][0]);
                total[r][1] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xb + 16), total[r][1]);
            }
        }
    } else {
        for (int g = 0; g < K / block; g++) {
            __m512 acc[4][2];
            for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
            for (int k = g * block; k < (g + 1) * block; k += 32) {
                __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(row + k / 2)));
                __m512 lo = _mm512_permutexvar_ps(c, table), hi = _mm512_permutexvar_ps(_mm512_srli_epi32(c, 4), table);
                for (int r = 0; r < R; r++) {
                    const float* xb = xs + (size_t)r * K + k;
                    acc[r][0] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(xb), acc[r][0]);
                    acc[r][1] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xb + 16), acc[r][1]);
                }
            }
            __m512 s = _mm512_set1_ps(block_scale(absmax, kind, scale2, offset, dmap, b0 + g));
            for (int r = 0; r < R; r++) {
                total[r][0] = _mm512_fmadd_ps(s, acc[r][0], total[r][0]);
                total[r][1] = _mm512_fmadd_ps(s, acc[r][1], total[r][1]);
            }
        }
    }
    for (int r = 0; r < R; r++) y[(size_t)r * N + n] = _mm512_reduce_add_ps(_mm512_add_ps(total[r][0], total[r][1]));
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512BF16__)
#define LUT4_BF16 1
/* x [R, K] as bfloat16 in the order row_bf16 reads it: each 128 values as four runs of 32, x[4w + j] at position
   w of run j (the codes of 64 bytes as four nibble shifts of their 32 words pick them); K up to Kp with zeros. */
static void arrange_bf16(const void* x, int x_bf16, uint16_t* xs, int R, int K, int Kp) {
    for (int r = 0; r < R; r++)
        for (int c = 0; c < Kp; c += 128)
            for (int j = 0; j < 4; j++)
                for (int i = 0; i < 32; i++) {
                    int k = c + 4 * i + j;
                    size_t at = (size_t)r * K + k;
                    xs[(size_t)r * Kp + c + 32 * j + i] =
                        k >= K ? 0 : x_bf16 ? ((const uint16_t*)x)[at] : float_to_bf16(((const float*)x)[at]);
                }
}

/* Output row n for R rows of x, microscaling blocks (16 or 32 codes) with a table of bfloat16 values: 128 codes
   (64 bytes) a turn, looked up as bfloat16 16 bits at a time (vpermw reads an index's low 5 bits, so the table
   is held twice and a nibble's neighbour bit does not matter) and multiplied with the activations in pairs
   (vdpbf16ps: exact products, float32 sums); float32 lane i then holds codes 8i .. 8i + 7, all of one block, and
   takes its block's scale once. */
static inline __attribute__((always_inline)) void row_bf16(int n,
        const uint8_t* w, const void* absmax, int kind, const float* scale2, const float* offset, const float* dmap,
        __m512i table, const uint16_t* xs, float* y, int R, int N, int K, int Kp, int block) {
    const uint8_t* row = w + (size_t)n * (K / 2);
    int per_row = K / block;
    size_t b0 = (size_t)n * per_row;
    const __m512i spread = block == 32 ? _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0)
                                       : _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    const int per_turn = 128 / block;  /* scales a turn: 4 (MX) or 8 (NVFP4) */
    float sc[per_row + 8];  /* other kinds' scales, decoded first; a last short turn's missing blocks read 0 */
    if (kind != SCALE_E8M0 && kind != SCALE_E4M3) {
        for (int i = 0; i < per_row; i++) sc[i] = block_scale(absmax, kind, scale2, offset, dmap, b0 + i);
        for (int i = per_row; i < per_row + 8; i++) sc[i] = 0;
    }
    __m512 total[4];
    for (int r = 0; r < R; r++) total[r] = _mm512_setzero_ps();
    for (int c = 0; c < Kp; c += 128) {
        int whole = c + 128 <= K;
        __m512i raw = whole ? _mm512_loadu_si512(row + c / 2)
                            : _mm512_maskz_loadu_epi8((((__mmask64)1) << ((K - c) / 2)) - 1, row + c / 2);
        __m512i q0 = _mm512_permutexvar_epi16(raw, table);
        __m512i q1 = _mm512_permutexvar_epi16(_mm512_srli_epi16(raw, 4), table);
        __m512i q2 = _mm512_permutexvar_epi16(_mm512_srli_epi16(raw, 8), table);
        __m512i q3 = _mm512_permutexvar_epi16(_mm512_srli_epi16(raw, 12), table);
        /* the turn's scales; past the row's last block the bytes read as 0 (their lanes' sums are 0 too) */
        const uint8_t* sb = (const uint8_t*)absmax + b0 + c / block;
        __mmask16 present = (__mmask16)((1u << (whole ? per_turn : (K - c) / block)) - 1);
        __m256 s8;
        if (kind == SCALE_E4M3) {  /* e4m3 bytes widened (x 2^-8); the global scale is divided out at the end */
            s8 = fp8_widen8_bytes(_mm_maskz_loadu_epi8(present, sb), 0);
        } else if (kind == SCALE_E8M0) {  /* 2^(e - 127): the byte as a float's exponent; 0 is 2^-127, a subnormal */
            __m256i e = _mm256_cvtepu8_epi32(_mm_maskz_loadu_epi8(present, sb));
            __m256i bits = _mm256_slli_epi32(e, 23);
            __m256i zero = _mm256_cmpeq_epi32(e, _mm256_setzero_si256());
            s8 = _mm256_castsi256_ps(_mm256_blendv_epi8(bits, _mm256_set1_epi32(1 << 22), zero));
        } else {
            s8 = _mm256_loadu_ps(sc + c / block);
        }
        __m512 s = _mm512_permutexvar_ps(spread, _mm512_castps256_ps512(s8));
        for (int r = 0; r < R; r++) {
            const uint16_t* xb = xs + (size_t)r * Kp + c;
            __m512 p0 = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)q0, (__m512bh)_mm512_loadu_si512(xb));
            __m512 p1 = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)q2, (__m512bh)_mm512_loadu_si512(xb + 64));
            p0 = _mm512_dpbf16_ps(p0, (__m512bh)q1, (__m512bh)_mm512_loadu_si512(xb + 32));
            p1 = _mm512_dpbf16_ps(p1, (__m512bh)q3, (__m512bh)_mm512_loadu_si512(xb + 96));
            total[r] = _mm512_fmadd_ps(s, _mm512_add_ps(p0, p1), total[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        float v = _mm512_reduce_add_ps(total[r]);
        y[(size_t)r * N + n] = kind == SCALE_E4M3 ? v * 256.0f / scale2[0] : v;
    }
}

/* lut4_matmul through row_bf16 where it applies (microscaling blocks, a table and activations all bfloat16: x
   float32 holding bfloat16 values, or bfloat16 itself, x_bf16 1); returns 0 where it does not, having done nothing. */
static int matmul_bf16(const uint8_t* w, const void* absmax, int kind, const float* scale2, const float* offset,
                       const float* dmap, const float* lut, const void* x, int x_bf16, float* y, int M, int N, int K,
                       int block) {
    if ((block != 16 && block != 32) || !all_bf16(lut, 16) || (!x_bf16 && !all_bf16(x, (size_t)M * K))) return 0;
    int Kp = (K + 127) / 128 * 128;
    uint16_t* xs = malloc((size_t)M * Kp * sizeof(uint16_t));
    if (!xs) return 0;
    arrange_bf16(x, x_bf16, xs, M, K, Kp);
    uint16_t t[32];
    for (int i = 0; i < 32; i++) t[i] = float_to_bf16(lut[i & 15]);
    const __m512i table = _mm512_loadu_si512(t);
    for (int m0 = 0; m0 < M; m0 += 4) {
        int R = M - m0 < 4 ? M - m0 : 4;
        const uint16_t* xr = xs + (size_t)m0 * Kp;
        float* yr = y + (size_t)m0 * N;
        #pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
#define ROWS(C) row_bf16(n, w, absmax, kind, scale2, offset, dmap, table, xr, yr, C, N, K, Kp, block)
            WITH_CONSTANT_ROWS(R, ROWS);
#undef ROWS
        }
    }
    free(xs);
    return 1;
}
#endif

static void rows_scalar(const uint8_t* w, const void* absmax, int kind, const float* scale2, const float* offset,
                        const float* dmap, const float* lut, const float* x, float* y, int R, int N, int K, int block) {
    int per_row = K / block;
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const uint8_t* row = w + (size_t)n * (K / 2);
        for (int r = 0; r < R; r++) {
            float total = 0;
            for (int g = 0; g < per_row; g++) {
                float acc = 0;
                for (int k = g * block; k < (g + 1) * block; k += 2) {
                    uint8_t b = row[k / 2];
                    acc += lut[b & 15] * x[(size_t)r * K + k] + lut[b >> 4] * x[(size_t)r * K + k + 1];
                }
                total += block_scale(absmax, kind, scale2, offset, dmap, (size_t)n * per_row + g) * acc;
            }
            y[(size_t)r * N + n] = total;
        }
    }
}

/* y [M, N] = x [M, K] @ W^T, float32, for a few rows of x (decode steps); W's codes are read once per 4 rows. */
void lut4_matmul(const uint8_t* w, const void* absmax, int kind, const float* scale2, const float* offset,
                 const float* dmap, const float* lut, const float* x, float* y, int M, int N, int K, int block) {
#ifdef LUT4_BF16
    if (matmul_bf16(w, absmax, kind, scale2, offset, dmap, lut, x, 0, y, M, N, K, block)) return;
#endif
#ifdef __AVX512F__
    float* xs = malloc((size_t)M * K * sizeof(float));
    if (xs) {
        split_even_odd(x, xs, M, K);
        for (int m0 = 0; m0 < M; m0 += 4) {
            int R = M - m0 < 4 ? M - m0 : 4;
            const float* xr = xs + (size_t)m0 * K;
            float* yr = y + (size_t)m0 * N;
            #pragma omp parallel for schedule(static)
            for (int n = 0; n < N; n++) {
#define ROWS(C) row_avx512(n, w, absmax, kind, scale2, offset, dmap, lut, xr, yr, C, N, K, block)
                WITH_CONSTANT_ROWS(R, ROWS);
#undef ROWS
            }
        }
        free(xs);
        return;
    }
#endif
    for (int m0 = 0; m0 < M; m0 += 4) {
        int R = M - m0 < 4 ? M - m0 : 4;
        const float* xr = x + (size_t)m0 * K;
        float* yr = y + (size_t)m0 * N;
#ifdef __AVX2__
        #pragma omp parallel for schedule(static)  /* outside the inlined row: R stays a constant in it */
        for (int n = 0; n < N; n++) {
#define ROWS(C) row_avx2(n, w, absmax, kind, scale2, offset, dmap, lut, xr, yr, C, N, K, block)
            WITH_CONSTANT_ROWS(R, ROWS);
#undef ROWS
        }
#else
        rows_scalar(w, absmax, kind, scale2, offset, dmap, lut, xr, yr, R, N, K, block);
#endif
    }
}

/* The same product with x [M, K] given as bfloat16 (a bf16 model's activations as they are, so a compiled graph
   rounds them to bfloat16 before the call, as the eager model does): bfloat16 dot products where they apply, else x
   widened to float32 for the product above. Returns 0, or -1 when memory for the widened copy cannot be had. */
int lut4_matmul_bf16(const uint8_t* w, const void* absmax, int kind, const float* scale2, const float* offset,
                     const float* dmap, const float* lut, const uint16_t* x, float* y, int M, int N, int K, int block) {
#ifdef LUT4_BF16
    if (matmul_bf16(w, absmax, kind, scale2, offset, dmap, lut, x, 1, y, M, N, K, block)) return 0;
#endif
    float* xf = widen_bf16(x, (size_t)M * K);
    if (!xf) return -1;
    lut4_matmul(w, absmax, kind, scale2, offset, dmap, lut, xf, y, M, N, K, block);
    free(xf);
    return 0;
}

/* Rows [row0, row1) of W as float32 (out_kind 0) or bfloat16 (out_kind 2), [row1 - row0, K] row-major. */
void lut4_dequantize(const uint8_t* w, const void* absmax, int kind, const float* scale2, const float* offset,
                     const float* dmap, const float* lut, void* out, int out_kind, int row0, int row1, int K, int block) {
    int per_row = K / block;
    #pragma omp parallel for schedule(static)
    for (int n = row0; n < row1; n++) {
        const uint8_t* row = w + (size_t)n * (K / 2);
        size_t o = (size_t)(n - row0) * K;
        for (int g = 0; g < per_row; g++) {
            float s = block_scale(absmax, kind, scale2, offset, dmap, (size_t)n * per_row + g);
            for (int k = g * block; k < (g + 1) * block; k += 2) {
                uint8_t b = row[k / 2];
                float v0 = lut[b & 15] * s, v1 = lut[b >> 4] * s;
                if (out_kind == BF16) {
                    ((uint16_t*)out)[o + k] = float_to_bf16(v0);
                    ((uint16_t*)out)[o + k + 1] = float_to_bf16(v1);
                } else {
                    ((float*)out)[o + k] = v0;
                    ((float*)out)[o + k + 1] = v1;
                }
            }
        }
    }
}
