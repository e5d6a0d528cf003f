/* Products of a few rows of activations with a dense float16 or bfloat16 weight, for CPUs
   (quantlab.quant.kernels.half_rows): a decode step's unquantized linears (a bf16 model's, the output head
   that quantized models keep in 16 bits).

   y [M, N] = x [M, K] @ W^T, W [N, K] row-major as stored (kind BF16 or F16), x in the weight's dtype, y float32.
   Each weight row is read once per 4 rows of x, straight from memory into registers: the step is bound by the
   weight's bytes. With AVX512-BF16 and a bfloat16 weight, 32 values a turn are multiplied in pairs by vdpbf16ps
   (exact products, float32 sums); otherwise each 16 values are widened to float32 (a shift for bfloat16,
   vcvtph2ps for float16) and multiplied by FMA. Four weight rows are read at once (four independent streams in
   flight; the vdpbf16ps path prefetches each 2 KB ahead); a row's lanes are summed at its end. A block's row
   counts are constants (WITH_CONSTANT_ROWS, the last rows one at a time), so the accumulators stay in registers:
   with a run-time count they were kept in memory and SmolLM2's head read at half the copy bandwidth. Sums are
   float32 in a fixed order: the result does not depend on the thread count. Compiled at first use with the
   machine's C compiler. */
#include <stdlib.h>

#include "common.h"

#define ROW_BLOCK 4  /* weight rows read together */
#ifndef HALF_ROWS_PREFETCH
#define HALF_ROWS_PREFETCH 1024  /* values ahead in a weight row fetched into cache (2 KB) */
#endif

static inline float half_value(uint16_t h, int kind) { return kind == BF16 ? bf16_to_float(h) : half_to_float(h); }

static void rows_scalar(const uint16_t* w, const uint16_t* x, float* y, int kind, int M, int N, int K) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const uint16_t* row = w + (size_t)n * K;
        for (int m = 0; m < M; m++) {
            float acc = 0;
            for (int k = 0; k < K; k++) acc += half_value(row[k], kind) * half_value(x[(size_t)m * K + k], kind);
            y[(size_t)m * N + n] = acc;
        }
    }
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
/* 16 half-precision values at p (the first `count`, the others 0) as float32 lanes. */
static inline __m512 load16(const uint16_t* p, int kind, __mmask16 keep) {
    __m256i h = _mm256_maskz_loadu_epi16(keep, p);
    if (kind == BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* Rows n .. n + nr - 1 of y (nr <= ROW_BLOCK) for R rows of x (float32, [R, K]), by FMA. */
static inline __attribute__((always_inline)) void block_fma(const uint16_t* w, const float* xf, float* y, int kind,
                                                            int n, int nr, int R, int N, int K) {
    __m512 acc[ROW_BLOCK][4];
    for (int i = 0; i < nr; i++)
        for (int r = 0; r < R; r++) acc[i][r] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 16) {
        __mmask16 keep = K - k >= 16 ? 0xFFFF : (__mmask16)((1u << (K - k)) - 1);
        __m512 xv[4];
        for (int r = 0; r < R; r++) xv[r] = _mm512_maskz_loadu_ps(keep, xf + (size_t)r * K + k);
        for (int i = 0; i < nr; i++) {
            __m512 wv = load16(w + (size_t)(n + i) * K + k, kind, keep);
            for (int r = 0; r < R; r++) acc[i][r] = _mm512_fmadd_ps(wv, xv[r], acc[i][r]);
        }
    }
    for (int i = 0; i < nr; i++)
        for (int r = 0; r < R; r++) y[(size_t)r * N + n + i] = _mm512_reduce_add_ps(acc[i][r]);
}

static void rows_fma(const uint16_t* w, const uint16_t* x, float* y, int kind, int M, int N, int K) {
    float* xf = malloc((size_t)M * K * sizeof(float));
    if (!xf) { rows_scalar(w, x, y, kind, M, N, K); return; }
    for (size_t i = 0; i < (size_t)M * K; i++) xf[i] = half_value(x[i], kind);
    for (int m0 = 0; m0 < M; m0 += 4) {
        int R = M - m0 < 4 ? M - m0 : 4;
        #pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n += ROW_BLOCK) {
            int nr = N - n < ROW_BLOCK ? N - n : ROW_BLOCK;
#define ROWS(C) block_fma(w, xf + (size_t)m0 * K, y + (size_t)m0 * N, kind, n, ROW_BLOCK, C, N, K)
#define TAIL(C) for (int t = n; t < N; t++) block_fma(w, xf + (size_t)m0 * K, y + (size_t)m0 * N, kind, t, 1, C, N, K)
            if (nr == ROW_BLOCK) WITH_CONSTANT_ROWS(R, ROWS);
            else WITH_CONSTANT_ROWS(R, TAIL);
#undef TAIL
#undef ROWS
        }
    }
    free(xf);
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512BF16__)
/* Rows n .. n + nr - 1 of y for R rows of x (bfloat16, [R, K]), by vdpbf16ps on 32 values a turn: whole turns
   unmasked, the last (K not a multiple of 32) masked. */
static inline __attribute__((always_inline)) void block_bf16(const uint16_t* w, const uint16_t* x, float* y, int n,
                                                             int nr, int R, int N, int K) {
    __m512 acc[ROW_BLOCK][4];
    const uint16_t* rows[ROW_BLOCK];
    for (int i = 0; i < nr; i++) {
        rows[i] = w + (size_t)(n + i) * K;
        for (int r = 0; r < R; r++) acc[i][r] = _mm512_setzero_ps();
    }
    int k = 0;
    for (; k + 32 <= K; k += 32) {
        __m512i xv[4];
        for (int r = 0; r < R; r++) xv[r] = _mm512_loadu_si512(x + (size_t)r * K + k);
        for (int i = 0; i < nr; i++) {
            _mm_prefetch((const char*)(rows[i] + k + HALF_ROWS_PREFETCH), _MM_HINT_T0);
            __m512i wv = _mm512_loadu_si512(rows[i] + k);
            for (int r = 0; r < R; r++) acc[i][r] = _mm512_dpbf16_ps(acc[i][r], (__m512bh)wv, (__m512bh)xv[r]);
        }
    }
    if (k < K) {
        __mmask32 keep = (__mmask32)((1u << (K - k)) - 1);
        __m512i xv[4];
        for (int r = 0; r < R; r++) xv[r] = _mm512_maskz_loadu_epi16(keep, x + (size_t)r * K + k);
        for (int i = 0; i < nr; i++) {
            __m512i wv = _mm512_maskz_loadu_epi16(keep, rows[i] + k);
            for (int r = 0; r < R; r++) acc[i][r] = _mm512_dpbf16_ps(acc[i][r], (__m512bh)wv, (__m512bh)xv[r]);
        }
    }
    for (int i = 0; i < nr; i++)
        for (int r = 0; r < R; r++) y[(size_t)r * N + n + i] = _mm512_reduce_add_ps(acc[i][r]);
}

static void rows_bf16(const uint16_t* w, const uint16_t* x, float* y, int M, int N, int K) {
    for (int m0 = 0; m0 < M; m0 += 4) {
        int R = M - m0 < 4 ? M - m0 : 4;
        #pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n += ROW_BLOCK) {
            int nr = N - n < ROW_BLOCK ? N - n : ROW_BLOCK;
#define ROWS(C) block_bf16(w, x + (size_t)m0 * K, y + (size_t)m0 * N, n, ROW_BLOCK, C, N, K)
#define TAIL(C) for (int t = n; t < N; t++) block_bf16(w, x + (size_t)m0 * K, y + (size_t)m0 * N, t, 1, C, N, K)
            if (nr == ROW_BLOCK) WITH_CONSTANT_ROWS(R, ROWS);
            else WITH_CONSTANT_ROWS(R, TAIL);
#undef TAIL
#undef ROWS
        }
    }
}
#endif

/* y [M, N] = x [M, K] @ W^T, float32; W and x float16 (kind F16) or bfloat16 (kind BF16). */
void half_rows_matmul(const uint16_t* w, const uint16_t* x, float* y, int kind, int M, int N, int K) {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512BF16__)
    if (kind == BF16) { rows_bf16(w, x, y, M, N, K); return; }
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__)
    rows_fma(w, x, y, kind, M, N, K);
#else
    rows_scalar(w, x, y, kind, M, N, K);
#endif
}

/* The path half_rows_matmul takes for a bfloat16 weight: 2 vdpbf16ps, 1 AVX-512 FMA, 0 scalar (where the
   compiled loop of the caller is faster). */
int half_rows_path(void) {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512BF16__)
    return 2;
#elif defined(__AVX512F__) && defined(__AVX512BW__)
    return 1;
#else
    return 0;
#endif
}
