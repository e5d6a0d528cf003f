/* Matmul and dequantization of float8 weights (e4m3fn, e5m2) for CPUs (quantlab.quant.kernels.fp8_cpu).

   Layout: the stored form as it is, one byte per weight, row-major [N, K], with a float32 scale per output row
   (or one for the whole tensor). A byte becomes a float without a table: e5m2 is the top byte of a float16;
   e4m3's exponent and mantissa shifted into a float16's fields give the value times 2^-8 for normal and
   subnormal codes alike (the biases differ by 8), so the factor 256 goes into the row's scale. Eight codes at a
   time are widened this way and converted with F16C in registers. Compiled at first use with the machine's C
   compiler. */
#include "common.h"

#if defined(__AVX2__) && defined(__F16C__)
#define FP8_SIMD 1
#endif
#if defined(__AVX512BW__) && defined(__F16C__)
#define FP8_AVX512 1  /* 32 codes a step, widened 16 to a register (fp8_widen32) */
#endif

enum { E4M3 = 0, E5M2 = 1 };


static inline float decode(uint8_t b, int kind) { return fp8_decode(b, kind == E5M2); }

/* Scale of row n (e4m3's codes in registers read 2^-8 of their value: the factor goes here). */
static inline float row_scale(const float* scales, int per_tensor, int n) { return scales[per_tensor ? 0 : n]; }

#ifdef FP8_SIMD
static inline __m256 widen8(const uint8_t* p, int kind) { return fp8_widen8(p, kind == E5M2); }

static inline __attribute__((always_inline)) void rows_simd_row(int n, const uint8_t* w, const float* scales, int per_tensor, int kind,
                                                            const float* x, float* y, int R, int N, int K) {
    float unit = kind == E4M3 ? 256.0f : 1.0f;
    int k16 = K & ~15;
    {
        const uint8_t* row = w + (size_t)n * K;
        __m256 acc[4][2];
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        int k0 = 0;
#ifdef FP8_AVX512
        __m512 wide[4][2];
        for (int r = 0; r < R; r++) wide[r][0] = wide[r][1] = _mm512_setzero_ps();
        for (; k0 + 32 <= k16; k0 += 32) {
            __m512 v0, v1;
            fp8_widen32(row + k0, kind == E5M2, &v0, &v1);
            for (int r = 0; r < R; r++) {
                const float* xb = x + (size_t)r * K + k0;
                wide[r][0] = _mm512_fmadd_ps(v0, _mm512_loadu_ps(xb), wide[r][0]);
                wide[r][1] = _mm512_fmadd_ps(v1, _mm512_loadu_ps(xb + 16), wide[r][1]);
            }
        }
        for (int r = 0; r < R; r++) {  /* folded into the 8-wide sums the 16-code tail adds to */
            __m512 t = _mm512_add_ps(wide[r][0], wide[r][1]);
            acc[r][0] = _mm256_add_ps(_mm512_castps512_ps256(t), _mm512_extractf32x8_ps(t, 1));
        }
#endif
        for (int k = k0; k < k16; k += 16) {
            __m256 v0 = widen8(row + k, kind), v1 = widen8(row + k + 8, kind);
            for (int r = 0; r < R; r++) {
                const float* xb = x + (size_t)r * K + k;
                acc[r][0] = _mm256_fmadd_ps(v0, _mm256_loadu_ps(xb), acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(v1, _mm256_loadu_ps(xb + 8), acc[r][1]);
            }
        }
        float s = row_scale(scales, per_tensor, n);
        for (int r = 0; r < R; r++) {
            float tail = 0;
            for (int k = k16; k < K; k++) tail += decode(row[k], kind) * x[(size_t)r * K + k];
            y[(size_t)r * N + n] = s * (unit * hsum(_mm256_add_ps(acc[r][0], acc[r][1])) + tail);
        }
    }
}
#endif

static void rows_scalar(const uint8_t* w, const float* scales, int per_tensor, int kind, const float* x, float* y,
                        int R, int N, int K) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const uint8_t* row = w + (size_t)n * K;
        for (int r = 0; r < R; r++) {
            float acc = 0;
            for (int k = 0; k < K; k++) acc += decode(row[k], kind) * x[(size_t)r * K + k];
            y[(size_t)r * N + n] = row_scale(scales, per_tensor, n) * acc;
        }
    }
}

/* y [M, N] = x [M, K] @ W^T, float32, for a few rows of x (decode steps); W is read once per 4 rows. */
void fp8_matmul(const uint8_t* w, const float* scales, int per_tensor, int kind, const float* x, float* y,
                int M, int N, int K) {
    for (int m0 = 0; m0 < M; m0 += 4) {
        int R = M - m0 < 4 ? M - m0 : 4;
        const float* xr = x + (size_t)m0 * K;
        float* yr = y + (size_t)m0 * N;
#ifdef FP8_SIMD
        #pragma omp parallel for schedule(static)  /* outside the inlined row: R stays a constant in it */
        for (int n = 0; n < N; n++) {
#define ROWS(C) rows_simd_row(n, w, scales, per_tensor, kind, xr, yr, C, N, K)
            WITH_CONSTANT_ROWS(R, ROWS);
#undef ROWS
        }
#else
        rows_scalar(w, scales, per_tensor, kind, xr, yr, R, N, K);
#endif
    }
}

/* Rows [row0, row1) of W as float32 (out_kind 0) or bfloat16 (out_kind 2): the code's value times its scale. */
void fp8_dequantize(const uint8_t* w, const float* scales, int per_tensor, int kind, void* out, int out_kind,
                    int row0, int row1, int K) {
    #pragma omp parallel for schedule(static)
    for (int n = row0; n < row1; n++) {
        const uint8_t* row = w + (size_t)n * K;
        size_t o = (size_t)(n - row0) * K;
        float s = row_scale(scales, per_tensor, n);
        for (int k = 0; k < K; k++) {
            float v = decode(row[k], kind) * s;
            if (out_kind == BF16) ((uint16_t*)out)[o + k] = float_to_bf16(v);
            else ((float*)out)[o + k] = v;
        }
    }
}

/* Blocked e4m3 weights: one scale per `b` codes of a row, shared by `rows_per_scale` rows, [ceil(N / rows_per_scale),
   ceil(K / b)] row-major (the last block of a row or column may be partial; K a multiple of 16). MXFP8
   (quantlab.quant.forms.microscaling): b = 32, one row, e8m0 scale bytes (scale_kind SCALE_E8M0); block FP8
   (quantlab.quant.tensors.float8): b x b tiles, float32 scales (SCALE_F32). */
enum { SCALE_F32 = 0, SCALE_E8M0 = 1 };

static inline float blocks_scale(const void* scales, int scale_kind, size_t i) {
    return scale_kind == SCALE_E8M0 ? e8m0_to_float(((const uint8_t*)scales)[i]) : ((const float*)scales)[i];
}

#ifdef FP8_SIMD
static inline __attribute__((always_inline)) void blocks_rows_simd_row(int n, const uint8_t* w, const void* scales, int scale_kind, int b,
                                                       int rows_per_scale, const float* x, float* y, int R, int N,
                                                       int K) {
    int per_row = (K + b - 1) / b;
    {
        const uint8_t* row = w + (size_t)n * K;
        size_t s0 = (size_t)(n / rows_per_scale) * per_row;
        __m256 total[4];
        for (int r = 0; r < R; r++) total[r] = _mm256_setzero_ps();
#ifdef FP8_AVX512
        if (b == 32 && K % 32 == 0) {  /* MXFP8: each block's codes scaled in registers, once for all rows */
            __m512 t[4][2];
            for (int r = 0; r < R; r++) t[r][0] = t[r][1] = _mm512_setzero_ps();
            for (int g = 0; g < per_row; g++) {
                __m512 v0, v1, s = _mm512_set1_ps(256.0f * blocks_scale(scales, scale_kind, s0 + g));
                fp8_widen32(row + g * 32, 0, &v0, &v1);
                v0 = _mm512_mul_ps(v0, s);
                v1 = _mm512_mul_ps(v1, s);
                for (int r = 0; r < R; r++) {
                    const float* xb = x + (size_t)r * K + g * 32;
                    t[r][0] = _mm512_fmadd_ps(v0, _mm512_loadu_ps(xb), t[r][0]);
                    t[r][1] = _mm512_fmadd_ps(v1, _mm512_loadu_ps(xb + 16), t[r][1]);
                }
            }
            for (int r = 0; r < R; r++) y[(size_t)r * N + n] = _mm512_reduce_add_ps(_mm512_add_ps(t[r][0], t[r][1]));
            return;
        }
#endif
        for (int g = 0; g < per_row; g++) {
            int end = (g + 1) * b < K ? (g + 1) * b : K, k = g * b;
            __m256 s = _mm256_set1_ps(256.0f * blocks_scale(scales, scale_kind, s0 + g));
#ifdef FP8_AVX512
            if (k + 32 <= end) {  /* the block's products summed 16 wide, then scaled once */
                __m512 a[4][2];
                for (int r = 0; r < R; r++) a[r][0] = a[r][1] = _mm512_setzero_ps();
                for (; k + 32 <= end; k += 32) {
                    __m512 v0, v1;
                    fp8_widen32(row + k, 0, &v0, &v1);
                    for (int r = 0; r < R; r++) {
                        const float* xb = x + (size_t)r * K + k;
                        a[r][0] = _mm512_fmadd_ps(v0, _mm512_loadu_ps(xb), a[r][0]);
                        a[r][1] = _mm512_fmadd_ps(v1, _mm512_loadu_ps(xb + 16), a[r][1]);
                    }
                }
                for (int r = 0; r < R; r++) {
                    __m512 t = _mm512_add_ps(a[r][0], a[r][1]);
                    total[r] = _mm256_fmadd_ps(s, _mm256_add_ps(_mm512_castps512_ps256(t), _mm512_extractf32x8_ps(t, 1)),
                                               total[r]);
                }
            }
#endif
            for (; k + 32 <= end; k += 32) {  /* 32 codes' products summed, then scaled once */
                __m256 v0 = widen8(row + k, E4M3), v1 = widen8(row + k + 8, E4M3);
                __m256 v2 = widen8(row + k + 16, E4M3), v3 = widen8(row + k + 24, E4M3);
                for (int r = 0; r < R; r++) {
                    const float* xb = x + (size_t)r * K + k;
                    __m256 a = _mm256_fmadd_ps(v1, _mm256_loadu_ps(xb + 8), _mm256_mul_ps(v0, _mm256_loadu_ps(xb)));
                    a = _mm256_fmadd_ps(v3, _mm256_loadu_ps(xb + 24), _mm256_fmadd_ps(v2, _mm256_loadu_ps(xb + 16), a));
                    total[r] = _mm256_fmadd_ps(s, a, total[r]);
                }
            }
            if (k < end) {  /* a block of 16 left at the end of a row */
                __m256 v0 = widen8(row + k, E4M3), v1 = widen8(row + k + 8, E4M3);
                for (int r = 0; r < R; r++) {
                    const float* xb = x + (size_t)r * K + k;
                    __m256 a = _mm256_fmadd_ps(v1, _mm256_loadu_ps(xb + 8), _mm256_mul_ps(v0, _mm256_loadu_ps(xb)));
                    total[r] = _mm256_fmadd_ps(s, a, total[r]);
                }
            }
        }
        for (int r = 0; r < R; r++) y[(size_t)r * N + n] = hsum(total[r]);
    }
}
#endif

static void blocks_rows_scalar(const uint8_t* w, const void* scales, int scale_kind, int b, int rows_per_scale,
                               const float* x, float* y, int R, int N, int K) {
    int per_row = (K + b - 1) / b;
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const uint8_t* row = w + (size_t)n * K;
        size_t s0 = (size_t)(n / rows_per_scale) * per_row;
        for (int r = 0; r < R; r++) {
            float total = 0;
            for (int g = 0; g < per_row; g++) {
                int end = (g + 1) * b < K ? (g + 1) * b : K;
                float acc = 0;
                for (int k = g * b; k < end; k++) acc += decode(row[k], E4M3) * x[(size_t)r * K + k];
                total += blocks_scale(scales, scale_kind, s0 + g) * acc;
            }
            y[(size_t)r * N + n] = total;
        }
    }
}

/* y [M, N] = x [M, K] @ W^T for a blocked e4m3 weight, a few rows of x at a time. */
void fp8_blocks_matmul(const uint8_t* w, const void* scales, int scale_kind, int b, int rows_per_scale, const float* x,
                       float* y, int M, int N, int K) {
    for (int m0 = 0; m0 < M; m0 += 4) {
        int R = M - m0 < 4 ? M - m0 : 4;
        const float* xr = x + (size_t)m0 * K;
        float* yr = y + (size_t)m0 * N;
#ifdef FP8_SIMD
        #pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
#define ROWS(C) blocks_rows_simd_row(n, w, scales, scale_kind, b, rows_per_scale, xr, yr, C, N, K)
            WITH_CONSTANT_ROWS(R, ROWS);
#undef ROWS
        }
#else
        blocks_rows_scalar(w, scales, scale_kind, b, rows_per_scale, xr, yr, R, N, K);
#endif
    }
}

/* Rows [row0, row1) of a blocked e4m3 weight as float32 (out_kind 0) or bfloat16 (out_kind 2). */
void fp8_blocks_dequantize(const uint8_t* w, const void* scales, int scale_kind, int b, int rows_per_scale, void* out,
                           int out_kind, int row0, int row1, int K) {
    int per_row = (K + b - 1) / b;
    #pragma omp parallel for schedule(static)
    for (int n = row0; n < row1; n++) {
        const uint8_t* row = w + (size_t)n * K;
        size_t s0 = (size_t)(n / rows_per_scale) * per_row, o = (size_t)(n - row0) * K;
        for (int k = 0; k < K; k++) {
            float v = decode(row[k], E4M3) * blocks_scale(scales, scale_kind, s0 + k / b);
            if (out_kind == BF16) ((uint16_t*)out)[o + k] = float_to_bf16(v);
            else ((float*)out)[o + k] = v;
        }
    }
}
