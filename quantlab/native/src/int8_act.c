/* Integer products of integer weights and int8 activations, for CPUs (W8A8 and W4A8:
   quantlab.quant.forms.affine.int8_act).

   The activations: each row of x (a token) rounded to int8 with its own scale, the row's largest |x| over 127
   (vLLM's dynamic per-token int8; 127.5 is compressed-tensors'), or with one static scale for the tensor, rounding to nearest even and
   saturating to [-128, 127]. The weights: affine codes with a scale and zero point per row and group of `group`
   columns (a multiple of 32), 8-bit as signed bytes (code - 128), 4-bit as ggml's Q4_0 packing (a block of 32
   codes in 16 bytes, code j in the low nibble of byte j and code j + 16 in its high nibble). Scales are float32,
   float16 or bfloat16; zero points are codes packed as quantlab packs them (a little-endian bit stream per row),
   or absent (symmetric).

   y[m, n] = sx[m] * sum over groups g of s[n, g] * (sum_k xq[m, k] * (c[n, k] - z[n, g])), the inner sums in
   int32 (exact): on AVX2 32 products at a time with maddubs (unsigned by signed bytes into int16 pairs) and
   madd, as ggml's q8_0 and q4_0 dot products do; with AVX-VNNI or AVX512-VNNI, dpbusd. Symmetric 8-bit weights
   take ggml's sign trick (|x| times w carrying x's sign); asymmetric ones (a code of -128 after the shift)
   widen to int16. Compiled at first use with the machine's C compiler. */
#include <math.h>
#include "common.h"

/* Row r of x as int8 codes and its scale; the sums of each block of 32 codes (for the zero points). */
static void quantize_row(const float* x, int K, float static_scale, float divisor, int8_t* q, float* scale,
                         int32_t* block_sums) {
    float s = static_scale;
    if (!(s > 0)) {
        float amax = 0;
        for (int k = 0; k < K; k++) amax = fabsf(x[k]) > amax ? fabsf(x[k]) : amax;
        s = amax > 0 ? amax / divisor : 1.0f;
    }
    for (int k = 0; k < K; k++) {
        float v = nearbyintf(x[k] / s);
        q[k] = (int8_t)(v > 127.0f ? 127.0f : v < -128.0f ? -128.0f : v);
    }
    for (int b = 0; b < K / 32; b++) {
        int32_t t = 0;
        for (int j = 0; j < 32; j++) t += q[b * 32 + j];
        block_sums[b] = t;
    }
    *scale = s;
}

static inline int zero_at(const uint8_t* zeros, int zero_row_bytes, int n, int g, int bits) {
    const uint8_t* row = zeros + (size_t)n * zero_row_bytes;
    return bits == 8 ? row[g] : (row[g >> 1] >> ((g & 1) * 4)) & 15;
}

#ifdef __AVX2__
#if defined(__AVXVNNI__)
#define DOT_U8S8(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define DOT_U8S8(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#else
#define DOT_U8S8(acc, u, s) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)))
#endif

/* sum of 32 products of signed bytes w (any value) and x. */
static inline __m256i dot_i8_wide(__m256i acc, __m256i w, __m256i x) {
    __m256i wl = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w)), wh = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(w, 1));
    __m256i xl = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(x)), xh = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(x, 1));
    return _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(wl, xl), _mm256_madd_epi16(wh, xh)));
}

/* Output n for R rows of x; bits, R and whether the weights have zero points are compile-time constants at every
   call (the dispatch below is inside the parallel loop, so the outlined loop body keeps them constant). */
static inline __attribute__((always_inline)) void row_avx2(
        const uint8_t* w, const void* scales, int scale_kind, const uint8_t* zeros, int zero_row_bytes,
        const int8_t* xq, const float* xs, const int32_t* bsum, float* y, int n, int R, int N, int K, int bits,
        int group, int has_zeros) {
    int n_groups = K / group, blocks = group / 32, row_bytes = bits == 8 ? K : K / 2, mid = 1 << (bits - 1);
    const __m128i low = _mm_set1_epi8(0x0F);
    const uint8_t* row = w + (size_t)n * row_bytes;
    __m256 acc[4];
    float correction[4] = {0, 0, 0, 0};
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int g = 0; g < n_groups; g++) {
        __m256i dot[4];
        int32_t xsum[4] = {0, 0, 0, 0};
        for (int r = 0; r < R; r++) dot[r] = _mm256_setzero_si256();
        for (int b = g * blocks; b < (g + 1) * blocks; b++) {
            if (bits == 4) {
                __m128i raw = _mm_loadu_si128((const __m128i*)(row + (size_t)b * 16));
                __m256i c = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low), _mm_and_si128(raw, low));
                for (int r = 0; r < R; r++)
                    dot[r] = DOT_U8S8(dot[r], c, _mm256_loadu_si256((const __m256i*)(xq + (size_t)r * K + b * 32)));
            } else {
                __m256i c = _mm256_loadu_si256((const __m256i*)(row + (size_t)b * 32));
                for (int r = 0; r < R; r++) {
                    __m256i x = _mm256_loadu_si256((const __m256i*)(xq + (size_t)r * K + b * 32));
                    dot[r] = has_zeros ? dot_i8_wide(dot[r], c, x)
                                       : DOT_U8S8(dot[r], _mm256_sign_epi8(x, x), _mm256_sign_epi8(c, x));
                }
            }
            if (has_zeros || bits == 4)
                for (int r = 0; r < R; r++) xsum[r] += bsum[(size_t)r * (K / 32) + b];
        }
        float s = load_scale(scales, scale_kind, (size_t)n * n_groups + g);
        /* 4-bit codes are unsigned (subtract z); 8-bit ones are stored minus 128 (subtract z - 128) */
        int z = has_zeros ? zero_at(zeros, zero_row_bytes, n, g, bits) : mid;
        int offset = bits == 8 ? z - 128 : z;
        __m256 vs = _mm256_set1_ps(s);
        for (int r = 0; r < R; r++) {
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r]), vs, acc[r]);
            correction[r] += s * (float)(offset * xsum[r]);
        }
    }
    for (int r = 0; r < R; r++) y[(size_t)r * N + n] = (hsum(acc[r]) - correction[r]) * xs[r];
}

static void rows_avx2(const uint8_t* w, const void* scales, int scale_kind, const uint8_t* zeros, int zero_row_bytes,
                      const int8_t* xq, const float* xs, const int32_t* bsum, float* y, int R, int N, int K,
                      int bits, int group) {
    int kind = (bits == 4) * 2 + (zeros != NULL);
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
#define CALL(RR, BITS, Z) row_avx2(w, scales, scale_kind, zeros, zero_row_bytes, xq, xs, bsum, y, n, RR, N, K, BITS, group, Z)
#define ROWS(RR) do { switch (kind) { case 0: CALL(RR, 8, 0); break; case 1: CALL(RR, 8, 1); break; \
                                      case 2: CALL(RR, 4, 0); break; default: CALL(RR, 4, 1); } } while (0)
        WITH_CONSTANT_ROWS(R, ROWS);
#undef ROWS
#undef CALL
    }
}
#endif

static void rows_scalar(const uint8_t* w, const void* scales, int scale_kind, const uint8_t* zeros, int zero_row_bytes,
                        const int8_t* xq, const float* xs, float* y, int R, int N, int K, int bits, int group) {
    int n_groups = K / group, row_bytes = bits == 8 ? K : K / 2, mid = 1 << (bits - 1);
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const uint8_t* row = w + (size_t)n * row_bytes;
        for (int r = 0; r < R; r++) {
            float acc = 0;
            for (int g = 0; g < n_groups; g++) {
                int z = zeros ? zero_at(zeros, zero_row_bytes, n, g, bits) : mid;
                int32_t dot = 0;
                for (int k = g * group; k < (g + 1) * group; k++) {
                    int c = bits == 8 ? (int8_t)row[k] + 128
                                      : (row[(k / 32) * 16 + (k % 32) % 16] >> ((k % 32) >= 16 ? 4 : 0)) & 15;
                    dot += xq[(size_t)r * K + k] * (c - z);
                }
                acc += load_scale(scales, scale_kind, (size_t)n * n_groups + g) * (float)dot;
            }
            y[(size_t)r * N + n] = acc * xs[r];
        }
    }
}

/* y [M, N] float32 = round_int8(x [M, K]) @ W^T: static_scale > 0 the tensor's activation scale, else each row's
   max |x| / divisor (127: vLLM's; 127.5: compressed-tensors'). */
void int8_act_matmul(const uint8_t* w, const void* scales, int scale_kind, const uint8_t* zeros, int zero_row_bytes,
                     const float* x, float static_scale, float divisor, float* y, int M, int N, int K, int bits,
                     int group) {
    int8_t xq[4 * (size_t)K] __attribute__((aligned(32)));
    int32_t bsum[4 * (K / 32)];
    float xs[4];
    for (int m0 = 0; m0 < M; m0 += 4) {
        int R = M - m0 < 4 ? M - m0 : 4;
        for (int r = 0; r < R; r++)
            quantize_row(x + (size_t)(m0 + r) * K, K, static_scale, divisor, xq + (size_t)r * K, xs + r, bsum + (size_t)r * (K / 32));
        float* yr = y + (size_t)m0 * N;
#ifdef __AVX2__
        rows_avx2(w, scales, scale_kind, zeros, zero_row_bytes, xq, xs, bsum, yr, R, N, K, bits, group);
#else
        rows_scalar(w, scales, scale_kind, zeros, zero_row_bytes, xq, xs, yr, R, N, K, bits, group);
#endif
    }
}

/* Rows [row0, row1) of W as float32, [row1 - row0, K] row-major. */
void int8_act_dequantize(const uint8_t* w, const void* scales, int scale_kind, const uint8_t* zeros, int zero_row_bytes,
                         float* out, int row0, int row1, int K, int bits, int group) {
    int n_groups = K / group, row_bytes = bits == 8 ? K : K / 2, mid = 1 << (bits - 1);
    #pragma omp parallel for schedule(static)
    for (int n = row0; n < row1; n++) {
        const uint8_t* row = w + (size_t)n * row_bytes;
        float* o = out + (size_t)(n - row0) * K;
        for (int g = 0; g < n_groups; g++) {
            float s = load_scale(scales, scale_kind, (size_t)n * n_groups + g);
            int z = zeros ? zero_at(zeros, zero_row_bytes, n, g, bits) : mid;
            for (int k = g * group; k < (g + 1) * group; k++) {
                int c = bits == 8 ? (int8_t)row[k] + 128 : (row[(k / 32) * 16 + (k % 32) % 16] >> ((k % 32) >= 16 ? 4 : 0)) & 15;
                o[k] = (float)(c - z) * s;
            }
        }
    }
}
