/* quantlab's entry points into ggml's block code (third_party/ggml/ggml_quants.c, included whole below, one
 * translation unit so its static functions are in reach): one quantizer and one dequantizer by ggml type number,
 * the float product over dequantized rows, and the product of ggml's 8-bit activation blocks through ggml's own
 * integer dot products where the CPU has them. Built as quantlab's other kernels are. */
#include "ggml_quants.c"
#include "common.h"

/* ---- quantlab's entry points: one quantizer and one dequantizer by ggml type number ---- */

typedef size_t (*quantize_fn)(const float *, void *, int64_t, int64_t, const float *);
typedef void (*dequantize_fn)(const void *, float *, int64_t);

/* ggml's type numbers (enum ggml_type) */
enum { T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8, T_Q2_K = 10, T_Q3_K = 11, T_Q4_K = 12,
       T_Q5_K = 13, T_Q6_K = 14, T_IQ4_NL = 20, T_IQ4_XS = 23 };

static quantize_fn quantizer(int type) {
    switch (type) {
        case T_Q4_0: return quantize_q4_0;
        case T_Q4_1: return quantize_q4_1;
        case T_Q5_0: return quantize_q5_0;
        case T_Q5_1: return quantize_q5_1;
        case T_Q8_0: return quantize_q8_0;
        case T_Q2_K: return quantize_q2_K;
        case T_Q3_K: return quantize_q3_K;
        case T_Q4_K: return quantize_q4_K;
        case T_Q5_K: return quantize_q5_K;
        case T_Q6_K: return quantize_q6_K;
        case T_IQ4_NL: return quantize_iq4_nl;
        case T_IQ4_XS: return quantize_iq4_xs;
        default: return NULL;
    }
}

static dequantize_fn dequantizer(int type) {
    switch (type) {
        case T_Q4_0: return (dequantize_fn)dequantize_row_q4_0;
        case T_Q4_1: return (dequantize_fn)dequantize_row_q4_1;
        case T_Q5_0: return (dequantize_fn)dequantize_row_q5_0;
        case T_Q5_1: return (dequantize_fn)dequantize_row_q5_1;
        case T_Q8_0: return (dequantize_fn)dequantize_row_q8_0;
        case T_Q2_K: return (dequantize_fn)dequantize_row_q2_K;
        case T_Q3_K: return (dequantize_fn)dequantize_row_q3_K;
        case T_Q4_K: return (dequantize_fn)dequantize_row_q4_K;
        case T_Q5_K: return (dequantize_fn)dequantize_row_q5_K;
        case T_Q6_K: return (dequantize_fn)dequantize_row_q6_K;
        case T_IQ4_NL: return (dequantize_fn)dequantize_row_iq4_nl;
        case T_IQ4_XS: return (dequantize_fn)dequantize_row_iq4_xs;
        default: return NULL;
    }
}

/* Rows [0, nrow) of src (float32 [nrow, n_per_row]) as ggml blocks into dst (row_bytes each), rows split over
 * OpenMP threads; imatrix: n_per_row column weights or NULL. Returns 0, or -1 for a type it does not know. */
int ggml_quantize_rows(int type, const float * src, uint8_t * dst, int64_t nrow, int64_t n_per_row,
                       int64_t row_bytes, const float * imatrix) {
    quantize_fn f = quantizer(type);
    if (!f) return -1;
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < nrow; ++r) {
        f(src + r * n_per_row, dst + r * row_bytes, 1, n_per_row, imatrix);
    }
    return 0;
}

/* Rows [row0, row1) of the blocks (row_bytes each) as float32 into dst [row1 - row0, n_per_row]. */
int ggml_dequantize_rows(int type, const uint8_t * src, float * dst, int64_t row0, int64_t row1,
                         int64_t n_per_row, int64_t row_bytes) {
    dequantize_fn f = dequantizer(type);
    if (!f) return -1;
    #pragma omp parallel for schedule(static)
    for (int64_t r = row0; r < row1; ++r) {
        f(src + r * row_bytes, dst + (r - row0) * n_per_row, n_per_row);
    }
    return 0;
}

/* y [m, out] = x [m, in] times the weight's rows, transposed (float32; m small: a decode step's rows). Each output
 * row's blocks are decoded a chunk at a time (up to 1,024 weights) into scratch with ggml's own dequantizer, then
 * multiplied by every row of x: the stored bytes are read once, in a fixed order whatever the thread count. */
int ggml_matmul(int type, const uint8_t * w, const float * x, float * y, int64_t m, int64_t out, int64_t n_in,
                int64_t row_bytes, int64_t block, int64_t block_bytes) {
    dequantize_fn f = dequantizer(type);
    if (!f || m > 64) return -1;
    int64_t per = 1024 / block > 0 ? 1024 / block : 1;
    while (per > 1 && (n_in / block) % per) per--;
    const int64_t chunk = per * block;
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < out; ++r) {
        float buf[1024] __attribute__((aligned(64)));
        float acc[64];
        for (int64_t i = 0; i < m; ++i) acc[i] = 0.0f;
        const uint8_t * row = w + r * row_bytes;
        for (int64_t c = 0; c < n_in; c += chunk) {
            f(row + (c / block) * block_bytes, buf, chunk);
            for (int64_t i = 0; i < m; ++i) {
                const float * xi = x + i * n_in + c;
                float s = 0.0f;
                #pragma omp simd reduction(+:s)
                for (int64_t j = 0; j < chunk; ++j) s += buf[j] * xi[j];
                acc[i] += s;
            }
        }
        for (int64_t i = 0; i < m; ++i) y[i * out + r] = acc[i];
    }
    return 0;
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
typedef void (*vec_dot_fn)(int, float *, size_t, const void *, size_t, const void *, size_t, int);
typedef void (*from_float_fn)(const float *, void *, int64_t);

/* The dot product of a type's row with the activations, the activations' block type (its from_float), and the
 * bytes of one activation block of 32 or 256 (as llama.cpp's CPU type traits pair them). */
static int dot_traits(int type, vec_dot_fn * dot, from_float_fn * from, int64_t * q_block, int64_t * q_bytes) {
    switch (type) {
        case T_Q4_0: *dot = ggml_vec_dot_q4_0_q8_0; break;
        case T_Q5_0: *dot = ggml_vec_dot_q5_0_q8_0; break;
        case T_Q8_0: *dot = ggml_vec_dot_q8_0_q8_0; break;
        case T_IQ4_NL: *dot = ggml_vec_dot_iq4_nl_q8_0; break;
        case T_Q4_1: *dot = ggml_vec_dot_q4_1_q8_1; break;
        case T_Q5_1: *dot = ggml_vec_dot_q5_1_q8_1; break;
        case T_Q2_K: *dot = ggml_vec_dot_q2_K_q8_K; break;
        case T_Q3_K: *dot = ggml_vec_dot_q3_K_q8_K; break;
        case T_Q4_K: *dot = ggml_vec_dot_q4_K_q8_K; break;
        case T_Q5_K: *dot = ggml_vec_dot_q5_K_q8_K; break;
        case T_Q6_K: *dot = ggml_vec_dot_q6_K_q8_K; break;
        case T_IQ4_XS: *dot = ggml_vec_dot_iq4_xs_q8_K; break;
        default: return -1;
    }
    if (type == T_Q4_1 || type == T_Q5_1) {
        *from = quantize_row_q8_1; *q_block = QK8_1; *q_bytes = sizeof(block_q8_1);
    } else if (type == T_Q4_0 || type == T_Q5_0 || type == T_Q8_0 || type == T_IQ4_NL) {
        *from = quantize_row_q8_0; *q_block = QK8_0; *q_bytes = sizeof(block_q8_0);
    } else {
        *from = quantize_row_q8_K; *q_block = QK_K; *q_bytes = sizeof(block_q8_K);
    }
    return 0;
}

int ggml_dot_available(void) { return 1; }

/* Bytes of scratch ggml_matmul_q8 needs for m rows of n_in activations (their 8-bit blocks). */
int64_t ggml_q8_scratch_bytes(int type, int64_t m, int64_t n_in) {
    vec_dot_fn dot; from_float_fn from; int64_t qb, qbytes;
    if (dot_traits(type, &dot, &from, &qb, &qbytes)) return -1;
    return m * (n_in / qb) * qbytes;
}

/* y [m, out] = x [m, in] times the weight's rows, transposed, as llama.cpp's CPU backend computes it: each row of
 * x quantized once to the type's 8-bit activation blocks (into scratch), then each output row one ggml dot
 * product of its blocks with them (integer products in SIMD, float scales), rows split over OpenMP threads. */
int ggml_matmul_q8(int type, const uint8_t * w, const float * x, float * y, int64_t m, int64_t out, int64_t n_in,
                   int64_t row_bytes, uint8_t * scratch) {
    vec_dot_fn dot; from_float_fn from; int64_t qb, qbytes;
    if (dot_traits(type, &dot, &from, &qb, &qbytes)) return -1;
    const int64_t x_row_bytes = (n_in / qb) * qbytes;
    for (int64_t i = 0; i < m; ++i) from(x + i * n_in, scratch + i * x_row_bytes, n_in);
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < out; ++r) {
        for (int64_t i = 0; i < m; ++i) {
            dot((int)n_in, y + i * out + r, 0, w + r * row_bytes, 0, scratch + i * x_row_bytes, 0, 1);
        }
    }
    return 0;
}

/* ---- ggml's repacked layouts (third_party/ggml_repack): eight rows interleaved, as llama.cpp repacks Q4_0, IQ4_NL
 * and Q4_K at load where the CPU has AVX2, and their eight-rows-at-once products ---- */
#include <omp.h>
#include "ggml_repack.c"

/* Whether ``type`` has a repacked layout here (its rows must come in eights). */
int ggml_repack_available(int type) { return type == T_Q4_0 || type == T_IQ4_NL || type == T_Q4_K; }

/* The blocks of rows [0, nrow) (nrow a multiple of 8; row_bytes each) interleaved eight rows at a time into dst (as
 * many bytes): llama.cpp's repack_q4_0_to_q4_0_8_bl / repack_iq4_nl_to_iq4_nl_8_bl / repack_q4_K_to_q4_K_8_bl. */
int ggml_repack_rows(int type, const uint8_t * src, uint8_t * dst, int64_t nrow, int64_t n_in) {
    if (!ggml_repack_available(type) || nrow % 8) return -1;
    #pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < nrow / 8; ++g) {
        if (type == T_Q4_K) {
            const int64_t nb = n_in / QK_K;
            const block_q4_K * in = (const block_q4_K *)src + g * 8 * nb;
            block_q4_Kx8 * out = (block_q4_Kx8 *)dst + g * nb;
            block_q4_K tmp[8];
            for (int64_t b = 0; b < nb; ++b) {
                for (int i = 0; i < 8; ++i) tmp[i] = in[b + i * nb];
                out[b] = make_block_q4_Kx8(tmp, 8);
            }
        } else {
            const int64_t nb = n_in / QK4_0;
            const block_q4_0 * in = (const block_q4_0 *)src + g * 8 * nb;  /* block_iq4_nl: the same bytes */
            block_q4_0x8 * out = (block_q4_0x8 *)dst + g * nb;
            block_q4_0 tmp[8];
            for (int64_t b = 0; b < nb; ++b) {
                for (int i = 0; i < 8; ++i) tmp[i] = in[b + i * nb];
                out[b] = type == T_Q4_0 ? make_block_q4_0x8(tmp, 8) : make_block_iq4_nlx8((block_iq4_nl *)tmp, 8);
            }
        }
    }
    return 0;
}

/* Row j of an interleaved Q4_K block back as its own block: the quants' 8-byte pieces, and the 6-bit scales and
 * mins of its 8 sub-blocks packed again as quantize_row_q4_K packs them (12 bytes). */
static void unpack_q4_Kx8(const block_q4_Kx8 * in, int j, block_q4_K * out) {
    out->d = in->d[j];
    out->dmin = in->dmin[j];
    for (int k = 0; k < QK_K / 16; ++k) memcpy(out->qs + k * 8, in->qs + (k * 8 + j) * 8, 8);
    uint8_t sc[8], mn[8];
    for (int c = 0; c < 8; ++c) {  /* sub-block c's scales and mins of the 8 rows: 12 bytes */
        const uint8_t * b = in->scales + c * 12;
        const int h = j & 3;
        if (j < 4) {
            sc[c] = b[h] & 63;
            mn[c] = b[4 + h] & 63;
        } else {
            sc[c] = (b[8 + h] & 15) | ((b[h] >> 6) << 4);
            mn[c] = (b[8 + h] >> 4) | ((b[4 + h] >> 6) << 4);
        }
    }
    for (int k = 0; k < 4; ++k) {
        out->scales[k] = sc[k] | ((sc[k + 4] >> 4) << 6);
        out->scales[k + 4] = mn[k] | ((mn[k + 4] >> 4) << 6);
        out->scales[k + 8] = (sc[k + 4] & 15) | ((mn[k + 4] & 15) << 4);
    }
}

/* Row r of an interleaved tensor back as its original blocks, into out (one row's bytes). */
static void unpack_row(int type, const uint8_t * src, int64_t r, int64_t n_in, uint8_t * out) {
    const int64_t g = r / 8;
    const int j = (int)(r % 8);
    if (type == T_Q4_K) {
        const int64_t nb = n_in / QK_K;
        const block_q4_Kx8 * in = (const block_q4_Kx8 *)src + g * nb;
        for (int64_t b = 0; b < nb; ++b) unpack_q4_Kx8(in + b, j, (block_q4_K *)out + b);
    } else {
        const int64_t nb = n_in / QK4_0;
        const block_q4_0x8 * in = (const block_q4_0x8 *)src + g * nb;
        block_q4_0 * o = (block_q4_0 *)out;
        const uint64_t flip = type == T_Q4_0 ? 0x8888888888888888ULL : 0;
        for (int64_t b = 0; b < nb; ++b) {
            o[b].d = in[b].d[j];
            for (int k = 0; k < QK4_0 / 16; ++k) {
                uint64_t e;
                memcpy(&e, in[b].qs + (k * 8 + j) * 8, 8);
                e ^= flip;
                memcpy(o[b].qs + k * 8, &e, 8);
            }
        }
    }
}

static int64_t unpacked_row_bytes(int type, int64_t n_in) {
    return type == T_Q4_K ? n_in / QK_K * (int64_t)sizeof(block_q4_K) : n_in / QK4_0 * (int64_t)sizeof(block_q4_0);
}

/* Rows [row0, row1) of an interleaved tensor back as the original blocks (row_bytes each) into dst: the inverse of
 * ggml_repack_rows, byte for byte. */
int ggml_unpack_rows(int type, const uint8_t * src, uint8_t * dst, int64_t row0, int64_t row1, int64_t n_in) {
    if (!ggml_repack_available(type)) return -1;
    const int64_t row_bytes = unpacked_row_bytes(type, n_in);
    #pragma omp parallel for schedule(static)
    for (int64_t r = row0; r < row1; ++r) unpack_row(type, src, r, n_in, dst + (r - row0) * row_bytes);
    return 0;
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define REPACKED_ROW_AVX512 1
/* Row r of an interleaved Q4_0 or IQ4_NL tensor dequantized straight from the interleaved bytes into f32 (or, where
 * bf16 is given, rounded to nearest even into bf16): per block, its 16 bytes gathered (Q4_0's flipped back), each
 * nibble's value looked up (Q4_0: nibble - 8; IQ4_NL: kvalues_iq4nl) and multiplied by the block's scale as float32,
 * sixteen lanes at a time: the products ggml's dequantizers compute, one rounding each. */
static void dequantize_x8_row(int type, const uint8_t * src, int64_t r, int64_t n_in, float * f32, uint16_t * bf16) {
    const int64_t nb = n_in / QK4_0;
    const int j = (int)(r % 8);
    const block_q4_0x8 * in = (const block_q4_0x8 *)src + (r / 8) * nb;
    const __m128i flip = _mm_set1_epi8(type == T_Q4_0 ? (char)0x88 : 0), low = _mm_set1_epi8(0x0F);
    const __m128i values = type == T_Q4_0 ? _mm_setr_epi8(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7)
                                          : _mm_loadu_si128((const __m128i *)kvalues_iq4nl);
    for (int64_t b = 0; b < nb; ++b) {
        const __m512 d = _mm512_set1_ps(GGML_FP16_TO_FP32(in[b].d[j]));
        int64_t first, second;
        memcpy(&first, in[b].qs + j * 8, 8);
        memcpy(&second, in[b].qs + (8 + j) * 8, 8);
        const __m128i q = _mm_xor_si128(_mm_set_epi64x(second, first), flip);  /* the block's own 16 bytes */
        const __m128i lo = _mm_shuffle_epi8(values, _mm_and_si128(q, low));
        const __m128i hi = _mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(q, 4), low));
        const __m512 v[2] = {_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)), d),
                             _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)), d)};
        for (int h = 0; h < 2; ++h) {
            const int64_t at = b * QK4_0 + 16 * h;
            if (!bf16) {
                _mm512_storeu_ps(f32 + at, v[h]);
                continue;
            }
            _mm256_storeu_si256((__m256i *)(bf16 + at), bf16_round16(v[h]));
        }
    }
}
#endif

/* Rows [row0, row1) of an interleaved tensor as float32 (bf16 0) or bfloat16 (bf16 1, rounded to nearest even as
 * torch rounds) into dst [row1 - row0, n_in]: each row unpacked and dequantized by ggml's dequantizer in one pass
 * (prefill's row blocks), the same values as ggml_unpack_rows, then ggml_dequantize_rows, then the rounding.
 * Returns 0, -1 for a type without the layout, -2 when scratch memory cannot be had. */
int ggml_dequantize_repacked_rows(int type, const uint8_t * src, void * dst, int bf16, int64_t row0, int64_t row1,
                                  int64_t n_in) {
    if (!ggml_repack_available(type)) return -1;
    const dequantize_fn f = dequantizer(type);
    const int64_t row_bytes = unpacked_row_bytes(type, n_in);
    int failed = 0;
    #pragma omp parallel
    {
        uint8_t * blocks = malloc(row_bytes);
        float * values = bf16 ? malloc(n_in * sizeof(float)) : NULL;
        if (!blocks || (bf16 && !values)) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp barrier
        if (!failed) {
            #pragma omp for schedule(static)
            for (int64_t r = row0; r < row1; ++r) {
#ifdef REPACKED_ROW_AVX512
                if (type != T_Q4_K) {
                    dequantize_x8_row(type, src, r, n_in, bf16 ? NULL : (float *)dst + (r - row0) * n_in,
                                      bf16 ? (uint16_t *)dst + (r - row0) * n_in : NULL);
                    continue;
                }
#endif
                unpack_row(type, src, r, n_in, blocks);
                float * v = bf16 ? values : (float *)dst + (r - row0) * n_in;
                f(blocks, v, n_in);
                if (bf16) {
                    uint16_t * o = (uint16_t *)dst + (r - row0) * n_in;
                    for (int64_t k = 0; k < n_in; ++k) o[k] = float_to_bf16(v[k]);
                }
            }
        }
        free(blocks);
        free(values);
    }
    return failed ? -2 : 0;
}

/* y [m, out] = x [m, in] times the interleaved weight's rows, transposed, as llama.cpp's repacked CPU path computes
 * a decode step: each row of x rounded once to 8-bit blocks (Q8_0, or Q8_K for Q4_K) into scratch, then ggml's GEMV
 * over eight output rows at a time, the groups of eight split over OpenMP threads. */
int ggml_matmul_repacked(int type, const uint8_t * w, const float * x, float * y, int64_t m, int64_t out,
                         int64_t n_in, int64_t row_bytes, uint8_t * scratch) {
    if (!ggml_repack_available(type) || out % 8) return -1;
    vec_dot_fn dot; from_float_fn from; int64_t qb, qbytes;
    if (dot_traits(type, &dot, &from, &qb, &qbytes)) return -1;
    const int64_t x_row_bytes = (n_in / qb) * qbytes;
    const int64_t group_bytes = 8 * row_bytes;  /* eight rows interleaved: as many bytes as the eight rows */
    for (int64_t i = 0; i < m; ++i) from(x + i * n_in, scratch + i * x_row_bytes, n_in);
    const int64_t groups = out / 8;
    #pragma omp parallel
    {
        const int nt = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t g0 = groups * t / nt, g1 = groups * (t + 1) / nt;
        if (g1 > g0) {
            for (int64_t i = 0; i < m; ++i) {
                float * yi = y + i * out + g0 * 8;
                const void * wi = w + g0 * group_bytes;
                const void * xi = scratch + i * x_row_bytes;
                const int nc = (int)((g1 - g0) * 8);
                if (type == T_Q4_0) ggml_gemv_q4_0_8x8_q8_0((int)n_in, yi, 0, wi, xi, 1, nc);
                else if (type == T_IQ4_NL) ggml_gemv_iq4_nl_8x8_q8_0((int)n_in, yi, 0, wi, xi, 1, nc);
                else ggml_gemv_q4_K_8x8_q8_K((int)n_in, yi, 0, wi, xi, 1, nc);
            }
        }
    }
    return 0;
}
#else
int ggml_repack_available(int type) { (void)type; return 0; }
int ggml_repack_rows(int type, const uint8_t * src, uint8_t * dst, int64_t nrow, int64_t n_in) {
    (void)type; (void)src; (void)dst; (void)nrow; (void)n_in; return -1;
}
int ggml_unpack_rows(int type, const uint8_t * src, uint8_t * dst, int64_t row0, int64_t row1, int64_t n_in) {
    (void)type; (void)src; (void)dst; (void)row0; (void)row1; (void)n_in; return -1;
}
int ggml_dequantize_repacked_rows(int type, const uint8_t * src, void * dst, int bf16, int64_t row0, int64_t row1,
                                  int64_t n_in) {
    (void)type; (void)src; (void)dst; (void)bf16; (void)row0; (void)row1; (void)n_in; return -1;
}
int ggml_matmul_repacked(int type, const uint8_t * w, const float * x, float * y, int64_t m, int64_t out,
                         int64_t n_in, int64_t row_bytes, uint8_t * scratch) {
    (void)type; (void)w; (void)x; (void)y; (void)m; (void)out; (void)n_in; (void)row_bytes; (void)scratch; return -1;
}
int ggml_dot_available(void) { return 0; }
int64_t ggml_q8_scratch_bytes(int type, int64_t m, int64_t n_in) { (void)type; (void)m; (void)n_in; return -1; }
int ggml_matmul_q8(int type, const uint8_t * w, const float * x, float * y, int64_t m, int64_t out, int64_t n_in,
                   int64_t row_bytes, uint8_t * scratch) {
    (void)type; (void)w; (void)x; (void)y; (void)m; (void)out; (void)n_in; (void)row_bytes; (void)scratch;
    return -1;
}
#endif
