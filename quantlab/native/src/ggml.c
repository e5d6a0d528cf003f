/* quantlab's entry points into ggml's block code (third_party/ggml/ggml_quants.c, included whole below, one
 * translation unit so its static functions are in reach): one quantizer and one dequantizer by ggml type number,
 * the float product over dequantized rows, and the product of ggml's 8-bit activation blocks through ggml's own
 * integer dot products where the CPU has them. Built as quantlab's other kernels are. */
#include "ggml_quants.c"

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
#else
int ggml_dot_available(void) { return 0; }
int64_t ggml_q8_scratch_bytes(int type, int64_t m, int64_t n_in) { (void)type; (void)m; (void)n_in; return -1; }
int ggml_matmul_q8(int type, const uint8_t * w, const float * x, float * y, int64_t m, int64_t out, int64_t n_in,
                   int64_t row_bytes, uint8_t * scratch) {
    (void)type; (void)w; (void)x; (void)y; (void)m; (void)out; (void)n_in; (void)row_bytes; (void)scratch;
    return -1;
}
#endif
