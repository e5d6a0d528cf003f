/* Decode attention over a quantized KV cache's stored codes (quantlab.kv.code_attention).

   A static cache layer stores each position's keys and values per head as one row of codes: packed integers
   with float16 scales and packed zero points per group of channels (kind INT: value = (code - zero) * scale,
   codes little-endian at bit i * bits of the row), a float cast (kinds F32, F16, BF16, E4M3 with a
   float16 scale per row), or a block form of its own (quantlab.kv.packed.ELEMENTS): NVFP4 (e2m1 codes, an e4m3
   scale byte per 16), MXFP4 (e2m1, an e8m0 byte per 32), MXFP8 (e4m3, e8m0 per 32), each e2m1 byte holding
   element 2k in its low nibble, and llama.cpp's q8_0 (int8 codes, a float16 scale per 32) and q4_0 (per 32 a
   float16 scale and 16 bytes, element j in the low nibble and j + 16 in the high one, value (code - 8) x
   scale); their scales are [BH, S, D / block] (float16 for the ggml kinds). A rotated store is read as stored:
   the caller rotates the query and the weighted sum. The stores are [BH, S, ·] (BH = batch x key/value heads,
   S = slots). Keys may also be stored per channel (kind INT_CHANNEL, KIVI): [S / block, BH x D, ·], each row
   one channel's codes over a block of positions with one scale and zero point; its scores are the query scaled
   per channel times the codes, minus the zero points' share, vectorized over the block's positions. For one
   query row per head of a group, these compute

     kv_scores:  out[bh, g, s]  = q[bh, g, :] . key[bh, s, :]                (s < n_valid, else 0)
     kv_values:  out[bh, g, :]  = sum over s < n_valid of p[bh, g, s] * value[bh, s, :]

   A layer's ring of recent positions (R rows per head in a float cast, [BH, R, D]) may come in the same call:
   the scores are then rows of S + R, the ring's after the stored slots (every ring row scored; the caller masks
   them), and the weights rows of S + R likewise, the ring's weighted rows added after the stored ones. One call
   and one softmax row per layer, as for a cache held whole.

   decoding each row once and never writing a dequantized history. With AVX-512 the common layouts (integers of
   8, 4 and 2 bits, the float casts, e4m3) are decoded 16 channels to a register and used there: the scores four
   rows at a time, the weighted values with a chunk of channels' accumulators held in registers over all the rows;
   the block forms go through a scratch row; without AVX-512, 8 channels at a time with AVX2. Integer rows with one
   scale and zero point for the whole row (a group as wide as the head) skip the per-chunk affine: the scores take
   the codes as they are and apply s (q . c) - z s sum(q) to each row's sum, and the values weight the codes by
   p s and add sum(p z s) to every channel once. Work is split
   into chunks of CHUNK slots per head; kv_values reduces the chunks' partial sums in a fixed order, so its
   result does not depend on the thread count. Compiled at first use with the machine's C compiler. */
#include "common.h"
#include <stdlib.h>

enum { INT = 0, CAST_F32 = 1, CAST_F16 = 2, CAST_BF16 = 3, CAST_E4M3 = 4, INT_CHANNEL = 5,
       NVFP4 = 6, MXFP4 = 7, MXFP8 = 8, Q8_0 = 9, Q4_0 = 10 };
static const float E2M1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

static inline int is_block_kind(int kind) { return kind >= NVFP4; }

/* The scale of block j of a block-kind row whose scale bytes start at sc. */
static inline float block_scale(int kind, const uint8_t* sc, int j) {
    if (kind == NVFP4) return fp8_decode(sc[j], 0);
    if (kind == MXFP4 || kind == MXFP8) return e8m0_to_float(sc[j]);
    uint16_t h; memcpy(&h, sc + 2 * j, 2);
    return half_to_float(h);
}

/* Element i of a block-kind row, unscaled. */
static inline float block_code(int kind, const uint8_t* row, int i) {
    switch (kind) {
        case NVFP4: case MXFP4: {
            int c = (row[i >> 1] >> ((i & 1) * 4)) & 15;
            return c & 8 ? -E2M1[c & 7] : E2M1[c & 7];
        }
        case MXFP8: return fp8_decode(row[i], 0);
        case Q8_0: return (float)(int8_t)row[i];
        default: {  /* Q4_0 */
            int k = i & 31;
            uint8_t b = row[(i >> 5) * 16 + (k & 15)];
            return (float)((k < 16 ? b & 15 : b >> 4) - 8);
        }
    }
}
#define CHUNK 256
#define MAX_D 512


static inline int code_at(const uint8_t* row, int i, int bits) {
    if (bits == 8) return row[i];
    if (bits == 4) return (row[i >> 1] >> ((i & 1) * 4)) & 15;
    if (bits == 2) return (row[i >> 2] >> ((i & 3) * 2)) & 3;
    int bit = i * bits, byte = bit >> 3;
    int word = row[byte] | (((bit & 7) + bits > 8) ? row[byte + 1] << 8 : 0);
    return (word >> (bit & 7)) & ((1 << bits) - 1);
}

typedef struct {
    int kind, bits, D, group, row_bytes, groups, zero_bytes;
    const uint8_t* data;    /* [BH, S, row_bytes] (row_bytes: the stored row's, pack's padding included) */
    const uint16_t* scales; /* INT: [BH, S, groups] float16; E4M3: [BH, S, 1] float16 or NULL (codes alone, a
                               static per-head scale applied by the caller); block kinds: their scale
                               bytes, [BH, S, groups x scale_bytes]; others: NULL */
    const uint8_t* zeros;   /* INT: [BH, S, zero_bytes], zero points packed with bits */
    int S;
    int scale_bytes;        /* block kinds: bytes of one block's scale (2 for the ggml kinds, else 1) */
} Store;

#if defined(__AVX2__) && defined(__F16C__)
#define KV_SIMD 1
static const int32_t NIBBLE_SHIFTS[8] = {0, 4, 0, 4, 0, 4, 0, 4}, CRUMB_SHIFTS[8] = {0, 2, 4, 6, 0, 2, 4, 6};

/* Codes i .. i + 7 of a row (i a multiple of 8) as floats. */
static inline __m256 codes8(const uint8_t* row, int i, int bits) {
    if (bits == 8) return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(row + i))));
    if (bits == 4) {
        uint32_t w; memcpy(&w, row + i / 2, 4);
        __m128i b = _mm_cvtsi32_si128((int)w);
        __m256i v = _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(b, b));
        v = _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_loadu_si256((const __m256i*)NIBBLE_SHIFTS)), _mm256_set1_epi32(15));
        return _mm256_cvtepi32_ps(v);
    }
    if (bits == 2) {
        uint16_t w; memcpy(&w, row + i / 4, 2);
        __m128i b = _mm_shuffle_epi8(_mm_cvtsi32_si128(w), _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0));
        __m256i v = _mm256_cvtepu8_epi32(b);
        v = _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_loadu_si256((const __m256i*)CRUMB_SHIFTS)), _mm256_set1_epi32(3));
        return _mm256_cvtepi32_ps(v);
    }
    int32_t c[8];
    for (int k = 0; k < 8; k++) c[k] = code_at(row, i + k, bits);
    return _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i*)c));
}

/* e2m1 elements i .. i + 7 (i a multiple of 8) as floats: the magnitude from an 8-entry table in a register,
   the code's top bit as the sign. */
static inline __m256 e2m1_8(const uint8_t* row, int i) {
    uint32_t w; memcpy(&w, row + i / 2, 4);
    __m128i b = _mm_cvtsi32_si128((int)w);
    __m256i v = _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(b, b));
    v = _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_loadu_si256((const __m256i*)NIBBLE_SHIFTS)), _mm256_set1_epi32(15));
    __m256 magnitude = _mm256_permutevar8x32_ps(_mm256_loadu_ps(E2M1), v);  /* the index's low 3 bits */
    __m256i sign = _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(8)), 28);
    return _mm256_xor_ps(magnitude, _mm256_castsi256_ps(sign));
}

/* A block-kind row decoded into out[D] (D a multiple of the block, blocks multiples of 8). */
static inline void decode_block_row(const Store* st, const uint8_t* row, const uint8_t* sc, float* out) {
    int block = st->group;
    for (int j = 0; j < st->groups; j++) {
        __m256 vs = _mm256_set1_ps(block_scale(st->kind, sc, j));
        int i0 = j * block;
        switch (st->kind) {
            case NVFP4: case MXFP4:
                for (int i = i0; i < i0 + block; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(e2m1_8(row, i), vs));
                break;
            case MXFP8:
                vs = _mm256_mul_ps(vs, _mm256_set1_ps(256.0f));  /* fp8_widen8 gives e4m3 x 2^-8 */
                for (int i = i0; i < i0 + block; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(fp8_widen8(row + i, 0), vs));
                break;
            case Q8_0:
                for (int i = i0; i < i0 + block; i += 8) {
                    __m256i c = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(row + i)));
                    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtepi32_ps(c), vs));
                }
                break;
            default: {  /* Q4_0: 16 bytes per 32, low nibbles first */
                __m128i bytes = _mm_loadu_si128((const __m128i*)(row + j * 16)), m = _mm_set1_epi8(15);
                __m128i half[2] = {_mm_and_si128(bytes, m), _mm_and_si128(_mm_srli_epi16(bytes, 4), m)};
                __m256 eight = _mm256_set1_ps(8.0f);
                for (int k = 0; k < 4; k++) {
                    __m128i part = k & 1 ? _mm_srli_si128(half[k >> 1], 8) : half[k >> 1];
                    __m256 c = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(part)), eight);
                    _mm256_storeu_ps(out + i0 + 8 * k, _mm256_mul_ps(c, vs));
                }
            }
        }
    }
}

#endif

/* Row s of head bh, dequantized into out[D]. */
static inline void decode_row(const Store* st, int bh, int s, float* out) {
    size_t r = (size_t)bh * st->S + s;
    const uint8_t* row = st->data + r * st->row_bytes;
    int D = st->D;
    if (is_block_kind(st->kind)) {
        const uint8_t* sc = (const uint8_t*)st->scales + r * st->groups * st->scale_bytes;
#ifdef KV_SIMD
        if (st->group % 8 == 0) { decode_block_row(st, row, sc, out); return; }
#endif
        for (int i = 0; i < D; i++) out[i] = block_code(st->kind, row, i) * block_scale(st->kind, sc, i / st->group);
        return;
    }
#ifdef KV_SIMD
    if (D % 8 == 0 && (st->kind != INT || st->group % 8 == 0)) {
        switch (st->kind) {
            case INT: {
                const uint16_t* sc = st->scales + r * st->groups;
                const uint8_t* zr = st->zeros + r * st->zero_bytes;
                for (int j = 0; j < st->groups; j++) {
                    float scale = half_to_float(sc[j]);
                    __m256 vs = _mm256_set1_ps(scale), vb = _mm256_set1_ps(-(float)code_at(zr, j, st->bits) * scale);
                    int i1 = (j + 1) * st->group < D ? (j + 1) * st->group : D;
                    for (int i = j * st->group; i < i1; i += 8) _mm256_storeu_ps(out + i, _mm256_fmadd_ps(codes8(row, i, st->bits), vs, vb));
                }
                return;
            }
            case CAST_F32: memcpy(out, row, (size_t)D * 4); return;
            case CAST_F16:
                for (int i = 0; i < D; i += 8) _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(row + 2 * i))));
                return;
            case CAST_BF16:
                for (int i = 0; i < D; i += 8) {
                    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(row + 2 * i)));
                    _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
                }
                return;
            default: {
                __m256 vs = _mm256_set1_ps((st->scales ? half_to_float(st->scales[r]) : 1.0f) * 256.0f);
                for (int i = 0; i < D; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(fp8_widen8(row + i, 0), vs));
                return;
            }
        }
    }
#endif
    switch (st->kind) {
        case INT: {
            const uint16_t* sc = st->scales + r * st->groups;
            const uint8_t* zr = st->zeros + r * st->zero_bytes;
            for (int j = 0; j < st->groups; j++) {
                float scale = half_to_float(sc[j]), bias = -(float)code_at(zr, j, st->bits) * scale;
                int i1 = (j + 1) * st->group < D ? (j + 1) * st->group : D;
                for (int i = j * st->group; i < i1; i++) out[i] = (float)code_at(row, i, st->bits) * scale + bias;
            }
            break;
        }
        case CAST_F32: memcpy(out, row, (size_t)D * 4); break;
        case CAST_F16: for (int i = 0; i < D; i++) out[i] = half_to_float(((const uint16_t*)row)[i]); break;
        case CAST_BF16: for (int i = 0; i < D; i++) out[i] = bf16_to_float(((const uint16_t*)row)[i]); break;
        default: {  /* no scales: a static per-head scale the caller applies */
            float scale = st->scales ? half_to_float(st->scales[r]) : 1.0f;
            for (int i = 0; i < D; i++) out[i] = fp8_decode(row[i], 0) * scale;
        }
    }
}

/* q . row over D values. */
static inline float dot(const float* q, const float* row, int D) {
#ifdef KV_SIMD
    if (D % 8 == 0) {
        __m256 acc = _mm256_setzero_ps();
        for (int i = 0; i < D; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(row + i), acc);
        return hsum(acc);
    }
#endif
    float acc = 0;
    for (int i = 0; i < D; i++) acc += q[i] * row[i];
    return acc;
}

static Store make_store(int kind, int bits, int D, int group, int row_bytes, int zero_bytes, const void* data,
                        const void* scales, const void* zeros, int S) {
    Store st = {kind, bits, D, group, row_bytes, kind == INT || is_block_kind(kind) ? (D + group - 1) / group : 1,
                zero_bytes, (const uint8_t*)data, (const uint16_t*)scales, (const uint8_t*)zeros, S,
                kind == Q8_0 || kind == Q4_0 ? 2 : 1};
    return st;
}

static inline int valid_slots(const int64_t* n_valid, int S) {
    int64_t n = *n_valid;
    return n < 0 ? 0 : n > S ? S : (int)n;
}

#ifdef KV_SIMD
static inline float hsum_fast(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_shuffle_ps(x, x, 1)));
}

/* Scores of rows [s0, s1) for G query rows (a constant where inlined: the accumulators stay in registers); two
   rows at a time, so 2 x G independent chains of multiply-adds are in flight. */
static inline __attribute__((always_inline)) void scores_simd(const Store* st, int bh, int s0, int s1, const float* q,
                                                              const int G, float* out, int S) {
    float rows[2][MAX_D];
    int D = st->D;
    for (int s = s0; s < s1; s += 2) {
        int pair = s + 1 < s1;
        decode_row(st, bh, s, rows[0]);
        if (pair) decode_row(st, bh, s + 1, rows[1]);
        __m256 acc[2][8];
        for (int g = 0; g < G; g++) acc[0][g] = acc[1][g] = _mm256_setzero_ps();
        for (int i = 0; i < D; i += 8) {
            __m256 r0 = _mm256_loadu_ps(rows[0] + i), r1 = _mm256_loadu_ps(rows[1] + i);
            for (int g = 0; g < G; g++) {
                __m256 qg = _mm256_loadu_ps(q + (size_t)g * D + i);
                acc[0][g] = _mm256_fmadd_ps(qg, r0, acc[0][g]);
                acc[1][g] = _mm256_fmadd_ps(qg, r1, acc[1][g]);
            }
        }
        for (int g = 0; g < G; g++) {
            out[(size_t)g * S + s] = hsum_fast(acc[0][g]);
            if (pair) out[(size_t)g * S + s + 1] = hsum_fast(acc[1][g]);
        }
    }
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__F16C__)
/* With AVX-512 each stored row's chunk of 16 channels is decoded (codes to floats, then one multiply-add with its
   group's scale and offset) and used at once: scores four rows at a time (4 x G accumulators, reduced to four
   sums together), values with G x 4 (G > 4: G x 2) accumulator registers kept over all of a chunk's rows. */
#define KV_AVX512 1
static const int32_t CRUMB16[16] = {0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6};
static const float E2M1_SIGNED[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* Whether the AVX-512 path reads this store: whole chunks of 16 in every scale group, integers of 8, 4 or 2 bits. */
static inline int reads512(const Store* st) {
    if (st->D % 16 || st->kind == INT_CHANNEL) return 0;
    if (st->kind == INT) return st->group % 16 == 0 && (st->bits == 8 || st->bits == 4 || st->bits == 2);
    return !is_block_kind(st->kind) || st->group % 16 == 0;
}

/* The 16 bytes of 16 packed nibbles (element 2k in byte k's low nibble) at p, one per byte in order. */
static inline __m128i nibbles16(const uint8_t* p) {
    __m128i b = _mm_loadl_epi64((const __m128i*)p), m = _mm_set1_epi8(15);
    return _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
}

/* 16 float8 e4m3 codes as floats times 2^-8 (as fp8_widen32 reads them). */
static inline __m512 e4m3_16(const uint8_t* p) {
    __m256i b = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)p)), 8);
    return _mm512_cvtph_ps(_mm256_and_si256(_mm256_srai_epi16(b, 1), _mm256_set1_epi16((short)0xBFFF)));
}

/* Codes i .. i + 15 of an integer row of 8, 4 or 2 bits (i a multiple of 16) as floats. */
static inline __m512 int_codes16(const uint8_t* row, int i, int bits) {
    if (bits == 8) return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(row + i))));
    if (bits == 4) return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(nibbles16(row + i / 2)));
    uint32_t w; memcpy(&w, row + i / 4, 4);
    __m512i v = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(_mm_cvtsi32_si128((int)w),
                                                      _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)));
    return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(v, _mm512_loadu_si512(CRUMB16)), _mm512_set1_epi32(3)));
}

/* Stored row rr decoded into out[D]: per scale group, the codes as floats times the scale plus the offset. The
   kind is switched on once per row; each case is a loop of 16-wide steps. */
static inline void decode512(const Store* st, size_t rr, float* out) {
    const uint8_t* row = st->data + rr * st->row_bytes;
    const int D = st->D;
    switch (st->kind) {
        case INT: {
            const uint16_t* scales = st->scales + rr * st->groups;
            const uint8_t* zeros = st->zeros + rr * st->zero_bytes;
            for (int j = 0, i0 = 0; i0 < D; j++, i0 += st->group) {
                float scale = half_to_float(scales[j]);
                __m512 sc = _mm512_set1_ps(scale), off = _mm512_set1_ps(-(float)code_at(zeros, j, st->bits) * scale);
                if (st->bits == 8) {
                    for (int i = i0; i < i0 + st->group; i += 16)
                        _mm512_storeu_ps(out + i, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                            _mm_loadu_si128((const __m128i*)(row + i)))), sc, off));
                } else if (st->bits == 4) {
                    for (int i = i0; i < i0 + st->group; i += 16)
                        _mm512_storeu_ps(out + i, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                            nibbles16(row + i / 2))), sc, off));
                } else {
                    const __m128i spread = _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
                    const __m512i shifts = _mm512_loadu_si512(CRUMB16), three = _mm512_set1_epi32(3);
                    for (int i = i0; i < i0 + st->group; i += 16) {
                        uint32_t w; memcpy(&w, row + i / 4, 4);
                        __m512i v = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(_mm_cvtsi32_si128((int)w), spread));
                        v = _mm512_and_si512(_mm512_srlv_epi32(v, shifts), three);
                        _mm512_storeu_ps(out + i, _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), sc, off));
                    }
                }
            }
            return;
        }
        case CAST_F32: memcpy(out, row, (size_t)D * 4); return;
        case CAST_F16:
            for (int i = 0; i < D; i += 16) _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(row + 2 * i))));
            return;
        case CAST_BF16:
            for (int i = 0; i < D; i += 16)
                _mm512_storeu_ps(out + i, _mm512_castsi512_ps(_mm512_slli_epi32(
                    _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(row + 2 * i))), 16)));
            return;
        case CAST_E4M3: {
            __m512 sc = _mm512_set1_ps((st->scales ? half_to_float(st->scales[rr]) : 1.0f) * 256.0f);
            for (int i = 0; i < D; i += 16) _mm512_storeu_ps(out + i, _mm512_mul_ps(e4m3_16(row + i), sc));
            return;
        }
        default: {  /* the block kinds */
            const uint8_t* bs = (const uint8_t*)st->scales + rr * st->groups * st->scale_bytes;
            const __m512 table = _mm512_loadu_ps(E2M1_SIGNED);
            for (int j = 0, i0 = 0; i0 < D; j++, i0 += st->group) {
                float scale = block_scale(st->kind, bs, j);
                __m512 sc = _mm512_set1_ps(st->kind == MXFP8 ? scale * 256.0f : scale);
                for (int i = i0; i < i0 + st->group; i += 16) {
                    __m512 x;
                    switch (st->kind) {
                        case NVFP4: case MXFP4:
                            x = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(nibbles16(row + i / 2)), table); break;
                        case MXFP8: x = e4m3_16(row + i); break;
                        case Q8_0: x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(row + i)))); break;
                        default: {  /* Q4_0: a block's low nibbles are its first 16 elements, the high ones the rest */
                            __m128i b = _mm_loadu_si128((const __m128i*)(row + (i >> 5) * 16));
                            if (i & 16) b = _mm_srli_epi16(b, 4);
                            x = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b, _mm_set1_epi8(15)))),
                                              _mm512_set1_ps(8.0f));
                        }
                    }
                    _mm512_storeu_ps(out + i, _mm512_mul_ps(x, sc));
                }
            }
        }
    }
}

/* The four sums of four registers, in order. */
static inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
#define HALVES(x) _mm256_add_ps(_mm512_castps512_ps256(x), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)))
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(HALVES(a), HALVES(b)), _mm256_hadd_ps(HALVES(c), HALVES(d)));
#undef HALVES
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* The stored rows of s .. s + 3 (a missing one repeats the last present, so every read stays in the store). */
static inline void four_rows(const Store* st, int bh, int s, int m, size_t* rr) {
    for (int r = 0; r < 4; r++) rr[r] = (size_t)bh * st->S + s + (r < m ? r : m - 1);
}

/* The layouts decoded in registers (LAYOUT: kind x 16 + bits), each a constant in its own copy of the loops. */
#define L_INT8 (INT * 16 + 8)
#define L_INT4 (INT * 16 + 4)
#define L_INT2 (INT * 16 + 2)
#define L_BF16 (CAST_BF16 * 16)
#define L_F16 (CAST_F16 * 16)
#define L_F32 (CAST_F32 * 16)
#define L_E4M3 (CAST_E4M3 * 16)

/* Integer row rr's scale and offset (-zero x scale) of group j (bits: the layout's). */
static inline void int_affine(const Store* st, int bits, size_t rr, int j, float* scale, float* offset) {
    *scale = half_to_float(st->scales[rr * st->groups + j]);
    *offset = -(float)code_at(st->zeros + rr * st->zero_bytes, j, bits) * *scale;
}

/* Whether an integer layout has one scale and zero point for the whole row (a group as wide as the head): then
   the codes go to the products as they are and each row's affine is applied once (scores512, values512). */
static inline int whole_row_affine(const Store* st, const int layout) {
    return layout >= 0 && layout / 16 == INT && st->group >= st->D;
}

/* A row's scale and offset for the 16 channels from i (LAYOUT constant: the casts have none, E4M3 a scale). */
typedef struct { __m512 scale, offset; } Affine;
static inline __attribute__((always_inline)) Affine affine16(const Store* st, const int layout, size_t rr, int i) {
    Affine a = {_mm512_set1_ps(1.0f), _mm512_setzero_ps()};
    if (layout / 16 == INT) {
        float scale, offset;
        int_affine(st, layout % 16, rr, i / st->group, &scale, &offset);
        a.scale = _mm512_set1_ps(scale);
        a.offset = _mm512_set1_ps(offset);
    } else if (layout == L_E4M3) {
        a.scale = _mm512_set1_ps((st->scales ? half_to_float(st->scales[rr]) : 1.0f) * 256.0f);
    }
    return a;
}

/* Channels i .. i + 15 of stored row rr as floats, decoded in registers (as decode512 writes them). */
static inline __attribute__((always_inline)) __m512 chunk16(const Store* st, const int layout, size_t rr, int i,
                                                            Affine a) {
    const uint8_t* row = st->data + rr * st->row_bytes;
    switch (layout) {
        case L_INT8: case L_INT4: case L_INT2:
            return _mm512_fmadd_ps(int_codes16(row, i, layout % 16), a.scale, a.offset);
        case L_BF16:
            return _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(row + 2 * i))), 16));
        case L_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(row + 2 * i)));
        case L_F32: return _mm512_loadu_ps((const float*)row + i);
        default: return _mm512_mul_ps(e4m3_16(row + i), a.scale);  /* L_E4M3 */
    }
}

/* Scores of rows [s0, s1) for G query rows, four rows at a time: each row's 16-channel chunks decoded in
   registers (the block kinds through decode512's scratch rows). */
static inline __attribute__((always_inline)) void scores512(const Store* st, const int layout, int bh, int s0, int s1,
                                                            const float* q, const int G, float* out, int S) {
    const int D = st->D, scaled = layout / 16 == INT;
    /* one scale and zero point a row: q . (c s - z s) = s (q . c) - z s sum(q) */
    const int whole = whole_row_affine(st, layout);
    float qsum[8];
    if (whole)
        for (int g = 0; g < G; g++) {
            __m512 t = _mm512_setzero_ps();
            for (int i = 0; i < D; i += 16) t = _mm512_add_ps(t, _mm512_loadu_ps(q + (size_t)g * D + i));
            qsum[g] = _mm512_reduce_add_ps(t);
        }
    float rows[4][MAX_D] __attribute__((aligned(64)));
    for (int s = s0; s < s1; s += 4) {
        const int m = s1 - s < 4 ? s1 - s : 4;
        size_t rr[4];
        four_rows(st, bh, s, m, rr);
        if (layout < 0)
            for (int r = 0; r < 4; r++) decode512(st, rr[r], rows[r]);
        __m512 acc[4][8];
        Affine a[4];
        for (int r = 0; r < 4; r++)
            for (int g = 0; g < G; g++) acc[r][g] = _mm512_setzero_ps();
        for (int i = 0; i < D; i += 16) {
            __m512 x[4];
            for (int r = 0; r < 4; r++) {
                if (layout < 0) { x[r] = _mm512_load_ps(rows[r] + i); continue; }
                if (whole) { x[r] = int_codes16(st->data + rr[r] * st->row_bytes, i, layout % 16); continue; }
                if (i == 0 || (scaled && i % st->group == 0))
                    a[r] = affine16(st, layout, rr[r], i);
                x[r] = chunk16(st, layout, rr[r], i, a[r]);
            }
            for (int g = 0; g < G; g++) {
                __m512 qg = _mm512_loadu_ps(q + (size_t)g * D + i);
                for (int r = 0; r < 4; r++) acc[r][g] = _mm512_fmadd_ps(qg, x[r], acc[r][g]);
            }
        }
        float sc[4], off[4];
        if (whole)
            for (int r = 0; r < 4; r++) int_affine(st, layout % 16, rr[r], 0, &sc[r], &off[r]);
        for (int g = 0; g < G; g++) {
            float t[4];
            _mm_storeu_ps(t, reduce4(acc[0][g], acc[1][g], acc[2][g], acc[3][g]));
            for (int r = 0; r < m; r++) out[(size_t)g * S + s + r] = whole ? sc[r] * t[r] + off[r] * qsum[g] : t[r];
        }
    }
}

/* acc[g, :] += sum over s0 <= s < s1 of p[g, s] x row s (p: this head's [G, S] weights). The layouts decoded in
   registers take the channels NC chunks of 16 at a time, each chunk's G x NC accumulators in registers over all
   the rows (the rows' order, and so the sums, as the block kinds' four-row loop keeps them). */
static inline __attribute__((always_inline)) void values512(const Store* st, const int layout, int bh, int s0, int s1,
                                                            const float* p, const int G, float* acc, int S) {
    const int D = st->D;
    if (layout >= 0) {
        const int NC = G <= 4 ? 4 : 2;  /* G x NC <= 16 accumulators */
        const int scaled = layout / 16 == INT;
        /* one scale and zero point a row: p (c s - z s) = (p s) c - p z s, so the codes are weighted by p s and
           sum(p z s) is added to every channel once */
        const int whole = whole_row_affine(st, layout);
        float bias[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int c0 = 0; c0 < D; c0 += 16 * NC) {
            const int nc = (D - c0) / 16 < NC ? (D - c0) / 16 : NC;
            __m512 a[8][4];
            for (int g = 0; g < G; g++)
                for (int c = 0; c < nc; c++) a[g][c] = _mm512_loadu_ps(acc + (size_t)g * D + c0 + 16 * c);
            for (int s = s0; s < s1; s++) {
                const size_t rr = (size_t)bh * st->S + s;
                __m512 w[8];
                float sc = 1.0f, off = 0.0f;
                if (whole) int_affine(st, layout % 16, rr, 0, &sc, &off);
                for (int g = 0; g < G; g++) {
                    float pg = p[(size_t)g * S + s];
                    w[g] = _mm512_set1_ps(pg * sc);
                    if (whole && c0 == 0) bias[g] += pg * off;
                }
                Affine af;
                if (!whole) af = affine16(st, layout, rr, c0);
                for (int c = 0; c < nc; c++) {
                    const int i = c0 + 16 * c;
                    __m512 x;
                    if (whole) x = int_codes16(st->data + rr * st->row_bytes, i, layout % 16);
                    else {
                        if (scaled && c && i % st->group == 0) af = affine16(st, layout, rr, i);
                        x = chunk16(st, layout, rr, i, af);
                    }
                    for (int g = 0; g < G; g++) a[g][c] = _mm512_fmadd_ps(x, w[g], a[g][c]);
                }
            }
            for (int g = 0; g < G; g++)
                for (int c = 0; c < nc; c++) _mm512_storeu_ps(acc + (size_t)g * D + c0 + 16 * c, a[g][c]);
        }
        if (whole)
            for (int g = 0; g < G; g++) {
                __m512 b = _mm512_set1_ps(bias[g]);
                for (int i = 0; i < D; i += 16)
                    _mm512_storeu_ps(acc + (size_t)g * D + i, _mm512_add_ps(_mm512_loadu_ps(acc + (size_t)g * D + i), b));
            }
        return;
    }
    float rows[4][MAX_D] __attribute__((aligned(64)));
    for (int s = s0; s < s1; s += 4) {
        const int m = s1 - s < 4 ? s1 - s : 4;
        size_t rr[4];
        four_rows(st, bh, s, m, rr);
        for (int r = 0; r < 4; r++) decode512(st, rr[r], rows[r]);
        __m512 w[8][4];
        for (int g = 0; g < G; g++)
            for (int r = 0; r < 4; r++) w[g][r] = _mm512_set1_ps(r < m ? p[(size_t)g * S + s + r] : 0.0f);
        for (int i = 0; i < D; i += 16) {
            __m512 x0 = _mm512_load_ps(rows[0] + i), x1 = _mm512_load_ps(rows[1] + i);
            __m512 x2 = _mm512_load_ps(rows[2] + i), x3 = _mm512_load_ps(rows[3] + i);
            for (int g = 0; g < G; g++) {
                float* a = acc + (size_t)g * D + i;
                __m512 v = _mm512_fmadd_ps(x0, w[g][0], _mm512_loadu_ps(a));
                v = _mm512_fmadd_ps(x1, w[g][1], v);
                v = _mm512_fmadd_ps(x2, w[g][2], v);
                _mm512_storeu_ps(a, _mm512_fmadd_ps(x3, w[g][3], v));
            }
        }
    }
}

/* CALL(layout) with the store's layout a constant (-1: the block kinds, through scratch rows); nested with
   WITH_CONSTANT_G through a const local, which the inlined loops fold as they fold the literal. */
#define WITH_LAYOUT(st, CALL) do { switch ((st)->kind == INT ? INT * 16 + (st)->bits : (st)->kind * 16) { \
    case L_INT8: CALL(L_INT8); break; case L_INT4: CALL(L_INT4); break; case L_INT2: CALL(L_INT2); break; \
    case L_BF16: CALL(L_BF16); break; case L_F16: CALL(L_F16); break; case L_F32: CALL(L_F32); break; \
    case L_E4M3: CALL(L_E4M3); break; default: CALL(-1); } } while (0)

#define WITH_CONSTANT_G(G, CALL) do { switch (G) { \
    case 1: CALL(1); break; case 2: CALL(2); break; case 3: CALL(3); break; case 4: CALL(4); break; \
    case 5: CALL(5); break; case 6: CALL(6); break; case 7: CALL(7); break; default: CALL(8); } } while (0)
#endif

static void scores_rows(const Store* st, int bh, int s0, int s1, const float* q, int G, float* out, int S) {
#ifdef KV_AVX512
    if (G <= 8 && reads512(st)) {
#define SCORES_G(K) scores512(st, layout_, bh, s0, s1, q, K, out, S)
#define SCORES(L) do { const int layout_ = (L); WITH_CONSTANT_G(G, SCORES_G); } while (0)
        WITH_LAYOUT(st, SCORES);
#undef SCORES
#undef SCORES_G
        return;
    }
#endif
#ifdef KV_SIMD
    if (st->D % 8 == 0 && G <= 8) {
        switch (G) {
            case 1: scores_simd(st, bh, s0, s1, q, 1, out, S); return;
            case 2: scores_simd(st, bh, s0, s1, q, 2, out, S); return;
            case 3: scores_simd(st, bh, s0, s1, q, 3, out, S); return;
            case 4: scores_simd(st, bh, s0, s1, q, 4, out, S); return;
            default: scores_simd(st, bh, s0, s1, q, G, out, S); return;
        }
    }
#endif
    float row[MAX_D];
    for (int s = s0; s < s1; s++) {
        decode_row(st, bh, s, row);
        for (int g = 0; g < G; g++) out[(size_t)g * S + s] = dot(q + (size_t)g * st->D, row, st->D);
    }
}

/* Scores over per-channel key blocks: for block k of head bh, score[t] = sum_i q_i s_ki (code_kit - z_ki). */
#ifdef KV_AVX512
/* One per-channel key block's scores (block = 16 x NC positions) with the G x NC accumulators in registers: each
   channel's codes decoded once, then one multiply-add per query row and chunk. */
static inline __attribute__((always_inline)) void channel_block512(int bits, int D, int BH, int bh, int k, int row_bytes,
                                                                   int zero_bytes, const uint8_t* data,
                                                                   const uint16_t* scales, const uint8_t* zeros,
                                                                   const float* q, const int G, const int NC,
                                                                   float* out, int S) {
    __m512 acc[8][4];
    float offset[8] = {0};
    for (int g = 0; g < G; g++)
        for (int c = 0; c < NC; c++) acc[g][c] = _mm512_setzero_ps();
    for (int i = 0; i < D; i++) {
        size_t r = ((size_t)k * BH + bh) * D + i;
        const uint8_t* row = data + r * row_bytes;
        float scale = half_to_float(scales[r]);
        int zero = code_at(zeros + r * zero_bytes, 0, bits);
        __m512 x[4];
        for (int c = 0; c < NC; c++) x[c] = int_codes16(row, 16 * c, bits);
        for (int g = 0; g < G; g++) {
            float wq = q[((size_t)bh * G + g) * D + i] * scale;
            offset[g] += wq * zero;
            __m512 vw = _mm512_set1_ps(wq);
            for (int c = 0; c < NC; c++) acc[g][c] = _mm512_fmadd_ps(x[c], vw, acc[g][c]);
        }
    }
    for (int g = 0; g < G; g++) {
        float* o = out + ((size_t)bh * G + g) * S + (size_t)k * 16 * NC;
        for (int c = 0; c < NC; c++) _mm512_storeu_ps(o + 16 * c, _mm512_sub_ps(acc[g][c], _mm512_set1_ps(offset[g])));
    }
}
#endif

static void channel_scores(int bits, int D, int block, int row_bytes, int zero_bytes, const uint8_t* data,
                           const uint16_t* scales, const uint8_t* zeros, int BH, int S, int n, const float* q, int G,
                           float* out) {
    int blocks = n / block;  /* the stored length is whole blocks */
    #pragma omp parallel for schedule(static)
    for (int w = 0; w < BH * blocks; w++) {
        int bh = w / blocks, k = w % blocks;
#ifdef KV_AVX512
        if (G <= 8 && block % 16 == 0 && block <= 64 && (bits == 8 || bits == 4 || bits == 2)) {
#define BLOCK(K, NC) channel_block512(bits, D, BH, bh, k, row_bytes, zero_bytes, data, scales, zeros, q, K, NC, out, S)
#define BLOCKS(K) do { switch (block) { case 16: BLOCK(K, 1); break; case 32: BLOCK(K, 2); break; \
                                      case 48: BLOCK(K, 3); break; default: BLOCK(K, 4); } } while (0)
            WITH_CONSTANT_G(G, BLOCKS);
#undef BLOCKS
#undef BLOCK
            continue;
        }
#endif
        float acc[G][block], offset[G];  /* a few KB on the stack */
        memset(acc, 0, sizeof(acc));
        memset(offset, 0, sizeof(offset));
        for (int i = 0; i < D; i++) {
            size_t r = ((size_t)k * BH + bh) * D + i;
            const uint8_t* row = data + r * row_bytes;
            float scale = half_to_float(scales[r]);
            int zero = code_at(zeros + r * zero_bytes, 0, bits);
            for (int g = 0; g < G; g++) {
                float wq = q[((size_t)bh * G + g) * D + i] * scale;
                offset[g] += wq * zero;
                float* a = acc[g];
#ifdef KV_SIMD
                if (block % 8 == 0) {
                    __m256 vw = _mm256_set1_ps(wq);
                    for (int t = 0; t < block; t += 8)
                        _mm256_storeu_ps(a + t, _mm256_fmadd_ps(codes8(row, t, bits), vw, _mm256_loadu_ps(a + t)));
                    continue;
                }
#endif
                for (int t = 0; t < block; t++) a[t] += wq * code_at(row, t, bits);
            }
        }
        for (int g = 0; g < G; g++)
            for (int t = 0; t < block; t++) out[((size_t)bh * G + g) * S + (size_t)k * block + t] = acc[g][t] - offset[g];
    }
}

/* The bytes of one element of a float cast kind (a ring's). */
static inline int cast_bytes(int kind) { return kind == CAST_F32 ? 4 : 2; }

/* Item w of a call's parallel loop: below BH x chunks a chunk of CHUNK stored rows of one head, above it one head's
   whole ring. Sets the head and its rows [s0, s1); returns the store they are read from. */
static inline const Store* work_item(const Store* st, const Store* rs, int BH, int chunks, int n, int w, int* bh,
                                     int* s0, int* s1) {
    if (w >= BH * chunks) {
        *bh = w - BH * chunks, *s0 = 0, *s1 = rs->S;
        return rs;
    }
    *bh = w / chunks, *s0 = (w % chunks) * CHUNK, *s1 = *s0 + CHUNK < n ? *s0 + CHUNK : n;
    return st;
}

void kv_scores(int kind, int bits, int D, int group, int row_bytes, int zero_bytes, const void* data,
               const void* scales, const void* zeros, int BH, int S, const int64_t* n_valid,
               const float* q, int G, int ring_kind, const void* ring, int R, float* out) {
    int n = valid_slots(n_valid, S), chunks = (n + CHUNK - 1) / CHUNK, T = S + R;
    memset(out, 0, sizeof(float) * (size_t)BH * G * T);
    Store st = make_store(kind, bits, D, group, row_bytes, zero_bytes, data, scales, zeros, S);
    Store rs = make_store(ring_kind, 0, D, D, D * cast_bytes(ring_kind), 0, ring, NULL, NULL, R);
    if (kind == INT_CHANNEL) {  /* group: the block of positions; the loop below then takes the rings alone */
        channel_scores(bits, D, group, row_bytes, zero_bytes, data, scales, zeros, BH, T, n, q, G, out);
        chunks = 0;
    }
    /* the stored rows in chunks, then (R > 0) each head's ring rows, in one parallel loop */
    #pragma omp parallel for schedule(static)
    for (int w = 0; w < BH * chunks + (R ? BH : 0); w++) {
        int bh, s0, s1;
        const Store* from = work_item(&st, &rs, BH, chunks, n, w, &bh, &s0, &s1);
        scores_rows(from, bh, s0, s1, q + (size_t)bh * G * D, G, out + (size_t)bh * G * T + (from == &rs ? S : 0), T);
    }
}

/* acc[g, :] += sum over s0 <= s < s1 of p[g, s] x row s of head bh (p: the head's weights, rows of stride T). */
static void values_rows(const Store* st, int bh, int s0, int s1, const float* p, int G, float* acc, int T) {
#ifdef KV_AVX512
    if (G <= 8 && reads512(st)) {
#define VALUES_G(K) values512(st, layout_, bh, s0, s1, p, K, acc, T)
#define VALUES(L) do { const int layout_ = (L); WITH_CONSTANT_G(G, VALUES_G); } while (0)
        WITH_LAYOUT(st, VALUES);
#undef VALUES
#undef VALUES_G
        return;
    }
#endif
    const int D = st->D;
    float rows[4][MAX_D];
    for (int s = s0; s < s1; s += 4) {  /* four rows per pass over the accumulators */
        int m = s1 - s < 4 ? s1 - s : 4;
        for (int k = 0; k < m; k++) decode_row(st, bh, s + k, rows[k]);
        for (int k = m; k < 4; k++) memset(rows[k], 0, sizeof(float) * D);
        for (int g = 0; g < G; g++) {
            const float* pg = p + (size_t)g * T + s;
            float w0 = pg[0], w1 = m > 1 ? pg[1] : 0, w2 = m > 2 ? pg[2] : 0, w3 = m > 3 ? pg[3] : 0;
            float* a = acc + (size_t)g * D;
            for (int i = 0; i < D; i++) a[i] += w0 * rows[0][i] + w1 * rows[1][i] + w2 * rows[2][i] + w3 * rows[3][i];
        }
    }
}

void kv_values(int kind, int bits, int D, int group, int row_bytes, int zero_bytes, const void* data,
               const void* scales, const void* zeros, int BH, int S, const int64_t* n_valid,
               const float* p, int G, int ring_kind, const void* ring, int R, float* out) {
    Store st = make_store(kind, bits, D, group, row_bytes, zero_bytes, data, scales, zeros, S);
    Store rs = make_store(ring_kind, 0, D, D, D * cast_bytes(ring_kind), 0, ring, NULL, NULL, R);
    int n = valid_slots(n_valid, S), chunks = (n + CHUNK - 1) / CHUNK, T = S + R, items = BH * chunks + (R ? BH : 0);
    size_t part = (size_t)G * D;
    /* each chunk's partial sums, then each head's ring's */
    float* partial = calloc((size_t)(items ? items : 1) * part, sizeof(float));
    #pragma omp parallel for schedule(static)
    for (int w = 0; w < items; w++) {
        int bh, s0, s1;
        const Store* from = work_item(&st, &rs, BH, chunks, n, w, &bh, &s0, &s1);
        values_rows(from, bh, s0, s1, p + (size_t)bh * G * T + (from == &rs ? S : 0), G, partial + (size_t)w * part, T);
    }
    for (int bh = 0; bh < BH; bh++) {  /* the chunks in order, then the ring: fixed whatever the threads */
        float* o = out + (size_t)bh * part;
        memset(o, 0, sizeof(float) * part);
        for (int c = 0; c < chunks + (R ? 1 : 0); c++) {  /* c == chunks: the head's ring */
            const float* a = partial + (size_t)(c < chunks ? bh * chunks + c : BH * chunks + bh) * part;
            for (size_t k = 0; k < part; k++) o[k] += a[k];
        }
    }
    free(partial);
}
