/* Matmul and dequantization of integer weights stored in bit planes, for CPUs (quantlab.quant.kernel_bitplane).

   Layout: each row of K codes (K a multiple of 32) is K/32 blocks of 4*bits bytes. A block holds its 32 codes
   as bits/2 two-bit planes of 8 bytes (plane p: bits 2p and 2p+1 of code 8i+t sit at bits 2i, 2i+1 of byte t),
   then, for an odd bit width, a one-bit plane of 4 bytes (the top bit of code 8i+t is bit t of byte i). So a
   3-bit row takes exactly 3 bits per code, and 32 codes come out of a block with a few shifts and masks.

   Weights dequantize as (code - zero) * scale, with one scale and zero per row and group of `group` columns (the
   last group may be shorter). Scales are float32, float16 or bfloat16 (scale_kind 0, 1, 2); zeros are `bits`-bit
   codes packed as a little-endian bit stream, zero_row_bytes per row (quantlab's packed layout), float zero points
   in code units stored like the scales (zero_row_bytes -1: HQQ's form), or absent (NULL: every zero is sym_zero).
   With AVX-512 a block's 32 codes become floats 16 to a register. Compiled at first use with the machine's C compiler. */
#include <omp.h>
#include <stdlib.h>

#include "common.h"


static inline int group_end(int g, int group, int K) { return (g + 1) * group < K ? (g + 1) * group : K; }

/* Zero point of row n, group g: code g of the row's packed bit stream, or (zero_row_bytes < 0) a float zero point
   in code units stored like the scales (HQQ's and quanto's form), entry gi = n * n_groups + g. */
static inline float load_zero(const uint8_t* zeros, int zero_row_bytes, int sym_zero, int n, int g, int bits,
                              int scale_kind, size_t gi) {
    if (!zeros) return (float)sym_zero;
    if (zero_row_bytes < 0) return load_scale(zeros, scale_kind, gi);
    const uint8_t* row = zeros + (size_t)n * zero_row_bytes;
    int bit = g * bits, byte = bit >> 3, shift = bit & 7;
    unsigned v = row[byte];
    if (shift + bits > 8) v |= (unsigned)row[byte + 1] << 8;
    return (float)((v >> shift) & ((1u << bits) - 1));
}

/* The 32 codes of a block, code j in codes[j]. */
static inline void decode_block(const uint8_t* blk, int bits, uint8_t* codes) {
    uint64_t out[4] = {0, 0, 0, 0};
    int n2 = bits >> 1;
    for (int p = 0; p < n2; p++) {
        uint64_t w; memcpy(&w, blk + 8 * p, 8);
        for (int i = 0; i < 4; i++) out[i] |= ((w >> (2 * i)) & 0x0303030303030303ULL) << (2 * p);
    }
    if (bits & 1) {
        for (int i = 0; i < 4; i++) {  /* bit t of byte i -> byte t of word i */
            uint64_t x = ((uint64_t)blk[8 * n2 + i] * 0x0101010101010101ULL) & 0x8040201008040201ULL;
            out[i] |= (((x + 0x7F7F7F7F7F7F7F7FULL) >> 7) & 0x0101010101010101ULL) << (2 * n2);
        }
    }
    memcpy(codes, out, 32);  /* little-endian: byte t of word i is code 8i+t */
}

#ifdef __AVX2__
static inline __m256i decode_block_avx2(const uint8_t* blk, int bits) {
    const __m256i shifts = _mm256_setr_epi64x(0, 2, 4, 6), three = _mm256_set1_epi8(3);
    __m256i codes = _mm256_setzero_si256();
    int n2 = bits >> 1;
    for (int p = 0; p < n2; p++) {
        int64_t w; memcpy(&w, blk + 8 * p, 8);
        __m256i v = _mm256_and_si256(_mm256_srlv_epi64(_mm256_set1_epi64x(w), shifts), three);
        codes = _mm256_or_si256(codes, _mm256_slli_epi16(v, 2 * p));  /* codes < 2^6 before the shift: no carry */
    }
    if (bits & 1) {
        int32_t h; memcpy(&h, blk + 8 * n2, 4);
        const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                              2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
        const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
        __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(h), pick);  /* byte i in all of word i */
        v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
        codes = _mm256_or_si256(codes, _mm256_and_si256(v, _mm256_set1_epi8((char)(1 << (2 * n2)))));
    }
    return codes;
}

/* Eight scales from entry i as floats (kind F32, F16, BF16). */
static inline __m256 load8_scales(const void* scales, int kind, size_t i) {
    if (kind == F32) return _mm256_loadu_ps((const float*)scales + i);
    __m128i h = _mm_loadu_si128((const __m128i*)((const uint16_t*)scales + i));
#ifdef __F16C__
    if (kind == F16) return _mm256_cvtph_ps(h);
#else
    if (kind == F16) {
        float f[8];
        for (int j = 0; j < 8; j++) f[j] = load_scale(scales, kind, i + j);
        return _mm256_loadu_ps(f);
    }
#endif
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Row n's group scales as floats into sc[g], and into offset[r] its offset term sum over g of scale * zero *
   (x row r's sum over group g), computed eight groups at a time before the row's blocks: per group beside them,
   this scalar work cost as much as 15-17% of a 4096 x 4096 product in groups of 32 or 64 (one thread). */
static inline __attribute__((always_inline)) void row_groups_avx2(
        const void* scales, int scale_kind, const uint8_t* zeros, int zero_row_bytes, int sym_zero, const float* xsum,
        int n, int n_groups, int R, int bits, float* sc, float* offset) {
    size_t g0 = (size_t)n * n_groups;
    __m256 off[4];
    float tail[4] = {0, 0, 0, 0};
    for (int r = 0; r < R; r++) off[r] = _mm256_setzero_ps();
    int g = 0;
    for (; g + 8 <= n_groups; g += 8) {
        __m256 s = load8_scales(scales, scale_kind, g0 + g), z;
        if (!zeros) z = _mm256_set1_ps((float)sym_zero);
        else if (zero_row_bytes < 0) z = load8_scales(zeros, scale_kind, g0 + g);
        else {
            float zf[8];
            for (int j = 0; j < 8; j++) zf[j] = load_zero(zeros, zero_row_bytes, sym_zero, n, g + j, bits, scale_kind, g0 + g + j);
            z = _mm256_loadu_ps(zf);
        }
        _mm256_storeu_ps(sc + g, s);
        __m256 sz = _mm256_mul_ps(s, z);
        for (int r = 0; r < R; r++) off[r] = _mm256_fmadd_ps(sz, _mm256_loadu_ps(xsum + (size_t)r * n_groups + g), off[r]);
    }
    for (; g < n_groups; g++) {
        float s = load_scale(scales, scale_kind, g0 + g), z = load_zero(zeros, zero_row_bytes, sym_zero, n, g, bits, scale_kind, g0 + g);
        sc[g] = s;
        for (int r = 0; r < R; r++) tail[r] += s * z * xsum[(size_t)r * n_groups + g];
    }
    for (int r = 0; r < R; r++) offset[r] = hsum(off[r]) + tail[r];
}

/* Output row n for R rows of x; R and bits are compile-time constants at every call (the dispatch in rows_avx2 is
   inside the parallel loop: GCC outlines an OpenMP loop body before inlining, so constants passed to a function
   holding the loop would reach it as variables, and its row loops would not unroll). hoisted (a constant too): the
   row's group work done first (row_groups_avx2, into sc: room for n_groups scales), else each group's beside its
   blocks. */
static inline __attribute__((always_inline)) void row_avx2(
        const uint8_t* w, const void* scales, int scale_kind, const uint8_t* zeros, int zero_row_bytes, int sym_zero,
        const float* x, const float* xsum, float* y, int n, int R, int N, int K, int bits, int group, float* sc,
        int hoisted) {
    int n_groups = (K + group - 1) / group, block_bytes = 4 * bits;
    {
        const uint8_t* row = w + (size_t)n * (K / 32) * block_bytes;
        __m256 total[4];
        float offset[4] = {0, 0, 0, 0};
        if (hoisted)
            row_groups_avx2(scales, scale_kind, zeros, zero_row_bytes, sym_zero, xsum, n, n_groups, R, bits, sc, offset);
        for (int r = 0; r < R; r++) total[r] = _mm256_setzero_ps();
        for (int g = 0; g < n_groups; g++) {
            __m256 acc[4][2];
            for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
#ifdef __AVX512F__
            __m512 wide[4][2];
            for (int r = 0; r < R; r++) wide[r][0] = wide[r][1] = _mm512_setzero_ps();
            for (int b = g * group / 32, b1 = group_end(g, group, K) / 32; b < b1; b++) {  /* 16 codes to a register */
                __m256i codes = decode_block_avx2(row + (size_t)b * block_bytes, bits);
                __m512 c0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(codes)));
                __m512 c1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(codes, 1)));
                for (int r = 0; r < R; r++) {
                    const float* xb = x + (size_t)r * K + b * 32;
                    wide[r][0] = _mm512_fmadd_ps(c0, _mm512_loadu_ps(xb), wide[r][0]);
                    wide[r][1] = _mm512_fmadd_ps(c1, _mm512_loadu_ps(xb + 16), wide[r][1]);
                }
            }
            for (int r = 0; r < R; r++) {
                __m512 t = _mm512_add_ps(wide[r][0], wide[r][1]);
                acc[r][0] = _mm512_castps512_ps256(t);
                acc[r][1] = _mm512_extractf32x8_ps(t, 1);
            }
#else
            for (int b = g * group / 32, b1 = group_end(g, group, K) / 32; b < b1; b++) {
                __m256i codes = decode_block_avx2(row + (size_t)b * block_bytes, bits);
                __m128i lo = _mm256_castsi256_si128(codes), hi = _mm256_extracti128_si256(codes, 1);
                __m256 c0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
                __m256 c1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
                __m256 c2 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
                __m256 c3 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
                for (int r = 0; r < R; r++) {
                    const float* xb = x + (size_t)r * K + b * 32;
                    acc[r][0] = _mm256_fmadd_ps(c0, _mm256_loadu_ps(xb), acc[r][0]);
                    acc[r][1] = _mm256_fmadd_ps(c1, _mm256_loadu_ps(xb + 8), acc[r][1]);
                    acc[r][0] = _mm256_fmadd_ps(c2, _mm256_loadu_ps(xb + 16), acc[r][0]);
                    acc[r][1] = _mm256_fmadd_ps(c3, _mm256_loadu_ps(xb + 24), acc[r][1]);
                }
            }
#endif
            float s;
            if (hoisted) s = sc[g];
            else {
                size_t gi = (size_t)n * n_groups + g;
                s = load_scale(scales, scale_kind, gi);
                float z = load_zero(zeros, zero_row_bytes, sym_zero, n, g, bits, scale_kind, gi);
                for (int r = 0; r < R; r++) offset[r] += s * z * xsum[(size_t)r * n_groups + g];
            }
            __m256 vs = _mm256_set1_ps(s);
            for (int r = 0; r < R; r++) total[r] = _mm256_fmadd_ps(vs, _mm256_add_ps(acc[r][0], acc[r][1]), total[r]);
        }
        for (int r = 0; r < R; r++) y[(size_t)r * N + n] = hsum(total[r]) - offset[r];
    }
}

static void rows_avx2(const uint8_t* w, const void* scales, int scale_kind, const uint8_t* zeros, int zero_row_bytes,
                      int sym_zero, const float* x, const float* xsum, float* y, int R, int N, int K, int bits, int group) {
    int n_groups = (K + group - 1) / group;
    /* groups of 128 or more (their work hidden behind four blocks), or fewer than 8 a row: each beside its blocks */
    int hoist = n_groups >= 8 && group <= 64;
    #pragma omp parallel
    {
        float sc[n_groups];  /* a row's scales, one buffer a thread (K / 32 floats at most) */
        #pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
#define CALL(RR, B) (hoist ? row_avx2(w, scales, scale_kind, zeros, zero_row_bytes, sym_zero, x, xsum, y, n, RR, N, K, B, group, sc, 1) \
                         : row_avx2(w, scales, scale_kind, zeros, zero_row_bytes, sym_zero, x, xsum, y, n, RR, N, K, B, group, sc, 0))
#define ROWS(RR) do { switch (bits) { case 1: CALL(RR, 1); break; case 2: CALL(RR, 2); break; case 3: CALL(RR, 3); break; \
            case 4: CALL(RR, 4); break; case 5: CALL(RR, 5); break; case 6: CALL(RR, 6); break; \
            case 7: CALL(RR, 7); break; default: CALL(RR, 8); } } while (0)
            WITH_CONSTANT_ROWS(R, ROWS);
#undef ROWS
#undef CALL
        }
    }
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VBMI__) && defined(__AVX512BF16__)
#define BITPLANE_BF16 1
/* The multishift control that puts the bits of codes first .. first + 31 from two-bit plane p at bits
   at, at + 1 of 32 16-bit lanes: lane j's low byte takes the plane word's bits from 8t + 2i (code 8i + t),
   less at, wrapping (the bits below land at the byte's bottom and are masked off). */
static inline __m512i plane_ctrl16(int at) {
    uint8_t c[64];
    for (int j = 0; j < 32; j++) {
        c[2 * j] = (uint8_t)((8 * (j & 7) + 2 * (j >> 3) - at) & 63);
        c[2 * j + 1] = 0;
    }
    return _mm512_loadu_si512(c);
}

/* The 32 codes of a block (bits < 8) as bfloat16 values 1 + code / 2^bits, one per 16-bit lane in order: the
   code at mantissa bits 7 - bits .. 6 of 0x3F80 (1.0), exactly. Each two-bit plane's word is broadcast and its
   bits put in place for every lane by one multishift (ctrl[p]: plane_ctrl16(7 - bits + 2p)); the one-bit plane's
   32 bits are a mask register. */
static inline __attribute__((always_inline)) __m512i block_bf16(const uint8_t* blk, int bits, const __m512i* ctrl) {
    const int low = 7 - bits;  /* where the code's bit 0 goes */
    __m512i v = _mm512_set1_epi16(0x3F80);
    int n2 = bits >> 1;
    for (int p = 0; p < n2; p++) {
        int64_t word; memcpy(&word, blk + 8 * p, 8);
        __m512i m = _mm512_multishift_epi64_epi8(ctrl[p], _mm512_set1_epi64(word));
        v = _mm512_ternarylogic_epi32(v, m, _mm512_set1_epi16((short)(3 << (low + 2 * p))), 0xF8);  /* v | (m & keep) */
    }
    if (bits & 1) {
        uint32_t top; memcpy(&top, blk + 8 * n2, 4);
        v = _mm512_mask_add_epi16(v, (__mmask32)top, v, _mm512_set1_epi16((short)(1 << (low + 2 * n2))));  /* that bit is 0: add is or */
    }
    return v;
}

/* Sixteen lanes of n (<= 16) 16-bit values at p as float32: float16 (F16) or bfloat16 (BF16); the rest 0. */
static inline __m512 load16_half(const void* p, int kind, int n) {
    __m256i h = _mm256_maskz_loadu_epi16((__mmask16)((1u << n) - 1), p);
    if (kind == F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Sixteen lanes of n (<= 16) scales (or float zero points) stored like the scales, from entry i on, as float32. */
static inline __m512 load16_scales(const void* scales, int kind, size_t i, int n) {
    if (kind == F32) return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), (const float*)scales + i);
    return load16_half((const uint16_t*)scales + i, kind, n);
}

/* The vpermb and vpmultishiftqb controls that take codes c .. c + 15 (c a multiple of 16) of a little-endian
   `bits`-bit stream, from the 2 bits bytes at the stream's byte c bits / 8, to the low bits of 16 32-bit lanes:
   lane j's qword holds the bytes from the one where code 2 (j / 2)'s bits start, and each of the lane's bytes takes
   8 bits from code j's first bit on (the bits above the code are masked off after). */
static inline void stream16_ctrl(int bits, __m512i* perm, __m512i* shift) {
    uint8_t pm[64], sh[64];
    for (int q = 0; q < 8; q++) {
        int first = 2 * q * bits, b0 = first / 8;
        for (int k = 0; k < 8; k++) {
            pm[8 * q + k] = (uint8_t)(b0 + k < 16 ? b0 + k : 15);
            int at = first - 8 * b0 + (k / 4) * bits + 8 * (k % 4);  /* byte k % 4 of lane 2q + k / 4 */
            sh[8 * q + k] = (uint8_t)(at & 63);
        }
    }
    *perm = _mm512_loadu_si512(pm);
    *shift = _mm512_loadu_si512(sh);
}

/* Codes c .. c + n - 1 (c a multiple of 16, n <= 16) of a row's `bits`-bit stream as float32 lanes (the rest 0). */
static inline __m512 load16_codes(const uint8_t* row, int c, int n, int bits, __m512i perm, __m512i shift) {
    int bytes = (n * bits + 7) / 8;
    __m128i raw = _mm_maskz_loadu_epi8((__mmask16)((1u << bytes) - 1), row + c * bits / 8);
    __m512i v = _mm512_multishift_epi64_epi8(shift, _mm512_permutexvar_epi8(perm, _mm512_castsi128_si512(raw)));
    v = _mm512_maskz_and_epi32((__mmask16)((1u << n) - 1), v, _mm512_set1_epi32((1 << bits) - 1));
    return _mm512_cvtepi32_ps(v);
}

/* Row n's per-group factors: into unit_scale[g] each group's scale times 2^bits, and into offset[r] the offset
   term sum over groups of scale (2^bits + zero) sum(x), for R rows of x; sixteen groups a pass. */
static inline __attribute__((always_inline)) void row_groups_bf16(
        const void* scales, int scale_kind, const uint8_t* zeros, int zero_row_bytes, int sym_zero, const float* xsum,
        int n, int n_groups, int R, int bits, __m512i perm, __m512i shift, float* unit_scale, float* offset) {
    const __m512 unit = _mm512_set1_ps((float)(1 << bits));
    __m512 off[4];
    for (int r = 0; r < R; r++) off[r] = _mm512_setzero_ps();
    const uint8_t* zrow = zeros && zero_row_bytes > 0 ? zeros + (size_t)n * zero_row_bytes : NULL;
    for (int g = 0; g < n_groups; g += 16) {
        int m = n_groups - g < 16 ? n_groups - g : 16;
        size_t gi = (size_t)n * n_groups + g;
        __m512 s = load16_scales(scales, scale_kind, gi, m);
        __m512 z = !zeros ? _mm512_set1_ps((float)sym_zero)
                 : zrow ? load16_codes(zrow, g, m, bits, perm, shift) : load16_scales(zeros, scale_kind, gi, m);
        _mm512_mask_storeu_ps(unit_scale + g, (__mmask16)((1u << m) - 1), _mm512_mul_ps(s, unit));
        __m512 so = _mm512_mul_ps(s, _mm512_add_ps(unit, z));
        for (int r = 0; r < R; r++)
            off[r] = _mm512_fmadd_ps(so, _mm512_maskz_loadu_ps((__mmask16)((1u << m) - 1), xsum + r * n_groups + g), off[r]);
    }
    for (int r = 0; r < R; r++) offset[r] = _mm512_reduce_add_ps(off[r]);
}

/* Output rows n .. n + NR - 1 for R rows of x (bfloat16 [R, K]) through bfloat16 dot products: per block, the
   codes as 1 + code / 2^bits (exact) times the activations in pairs (vdpbf16ps: exact products, float32 sums), two
   blocks' chains in flight and the NR weight rows sharing each activation load; per group, sum(code x) =
   2^bits (that sum - sum(x)), so the group adds scale 2^bits (its sum), and the offset (row_groups_bf16) takes
   scale (2^bits + zero) sum(x). GB, the blocks in a full group, is a constant where it is 1, 2 or 4 (0: group / 32). */
static inline __attribute__((always_inline)) void row_bf16(
        const uint8_t* w, const void* scales, int scale_kind, const uint8_t* zeros, int zero_row_bytes, int sym_zero,
        const uint16_t* xb16, const float* xsum, float* y, int n, int NR, int R, int N, int K, int bits, int group,
        int GB, const __m512i* ctrl, __m512i perm, __m512i shift, float* scratch) {
    int n_groups = (K + group - 1) / group, block_bytes = 4 * bits;
    const int gb = GB ? GB : group / 32;
    const uint8_t* row[2];
    float* unit_scale[2] = {scratch, scratch + n_groups};
    float offset[2][4];
    __m512 total[2][4];
    for (int i = 0; i < NR; i++) {
        row[i] = w + (size_t)(n + i) * (K / 32) * block_bytes;
        row_groups_bf16(scales, scale_kind, zeros, zero_row_bytes, sym_zero, xsum, n + i, n_groups, R, bits, perm,
                        shift, unit_scale[i], offset[i]);
        for (int r = 0; r < R; r++) total[i][r] = _mm512_setzero_ps();
    }
    for (int g = 0; g < n_groups; g++) {
        __m512 acc[2][4][2];
        for (int i = 0; i < NR; i++)
            for (int r = 0; r < R; r++) acc[i][r][0] = acc[i][r][1] = _mm512_setzero_ps();
        int b = g * gb, b1 = g + 1 < n_groups ? b + gb : K / 32;
        for (; b + 2 <= b1; b += 2) {
            __m512i x0[4], x1[4];
            for (int r = 0; r < R; r++) {
                x0[r] = _mm512_loadu_si512(xb16 + (size_t)r * K + b * 32);
                x1[r] = _mm512_loadu_si512(xb16 + (size_t)r * K + b * 32 + 32);
            }
            for (int i = 0; i < NR; i++) {
                __m512i c0 = block_bf16(row[i] + (size_t)b * block_bytes, bits, ctrl);
                __m512i c1 = block_bf16(row[i] + (size_t)(b + 1) * block_bytes, bits, ctrl);
                for (int r = 0; r < R; r++) {
                    acc[i][r][0] = _mm512_dpbf16_ps(acc[i][r][0], (__m512bh)c0, (__m512bh)x0[r]);
                    acc[i][r][1] = _mm512_dpbf16_ps(acc[i][r][1], (__m512bh)c1, (__m512bh)x1[r]);
                }
            }
        }
        if (b < b1) {
            for (int i = 0; i < NR; i++) {
                __m512i c0 = block_bf16(row[i] + (size_t)b * block_bytes, bits, ctrl);
                for (int r = 0; r < R; r++)
                    acc[i][r][0] = _mm512_dpbf16_ps(acc[i][r][0], (__m512bh)c0,
                                                    (__m512bh)_mm512_loadu_si512(xb16 + (size_t)r * K + b * 32));
            }
        }
        for (int i = 0; i < NR; i++) {
            __m512 vs = _mm512_set1_ps(unit_scale[i][g]);
            for (int r = 0; r < R; r++)
                total[i][r] = _mm512_fmadd_ps(vs, _mm512_add_ps(acc[i][r][0], acc[i][r][1]), total[i][r]);
        }
    }
    for (int i = 0; i < NR; i++)
        for (int r = 0; r < R; r++) y[(size_t)r * N + n + i] = _mm512_reduce_add_ps(total[i][r]) - offset[i][r];
}

/* One product's operands, as rows_bf16 hands them to each thread's range of output rows. */
typedef struct {
    const uint8_t* w; const void* scales; const uint8_t* zeros; const uint16_t* xb16; const float* xsum; float* y;
    int scale_kind, zero_row_bytes, sym_zero, N, K, group;
    __m512i ctrl[3], perm, shift;
} bf16_job;

/* Output rows [n0, n1), two weight rows at a time where R (rows of x) is 1 or 2; R, BITS and GB are compile-time
   constants at each call. */
static inline __attribute__((always_inline)) void range_bf16(bf16_job job, int n0, int n1, float* scratch, int R,
                                                             int BITS, int GB) {
    int n = n0;
    if (R <= 2)
        for (; n + 2 <= n1; n += 2)
            row_bf16(job.w, job.scales, job.scale_kind, job.zeros, job.zero_row_bytes, job.sym_zero, job.xb16, job.xsum,
                     job.y, n, 2, R, job.N, job.K, BITS, job.group, GB, job.ctrl, job.perm, job.shift, scratch);
    for (; n < n1; n++)
        row_bf16(job.w, job.scales, job.scale_kind, job.zeros, job.zero_row_bytes, job.sym_zero, job.xb16, job.xsum,
                 job.y, n, 1, R, job.N, job.K, BITS, job.group, GB, job.ctrl, job.perm, job.shift, scratch);
}

/* One function per (rows of x, bits, blocks per group): each compiled on its own with its constants, so its loops
   unroll and its registers are allocated for it alone. Blocks per group are a constant (1, 2, 4: groups of 32, 64,
   128) for a single row of x at 2-4 bits, a decode step's common case; 0 (group / 32 at run time) otherwise. */
typedef void (*range_fn)(bf16_job, int, int, float*);
#define RANGE(RR, B, G) static __attribute__((noinline)) void range_##RR##_##B##_##G(bf16_job j, int n0, int n1, float* s) \
    { range_bf16(j, n0, n1, s, RR, B, G); }
#define RANGES(RR) RANGE(RR, 1, 0) RANGE(RR, 2, 0) RANGE(RR, 3, 0) RANGE(RR, 4, 0) RANGE(RR, 5, 0) RANGE(RR, 6, 0) RANGE(RR, 7, 0)
RANGES(1) RANGES(2) RANGES(3) RANGES(4)
RANGE(1, 2, 1) RANGE(1, 2, 2) RANGE(1, 2, 4) RANGE(1, 3, 1) RANGE(1, 3, 2) RANGE(1, 3, 4) RANGE(1, 4, 1) RANGE(1, 4, 2) RANGE(1, 4, 4)
#define ROW_OF(RR) {range_##RR##_1_0, range_##RR##_2_0, range_##RR##_3_0, range_##RR##_4_0, range_##RR##_5_0, \
                    range_##RR##_6_0, range_##RR##_7_0}
static const range_fn ANY_GROUP[4][7] = {ROW_OF(1), ROW_OF(2), ROW_OF(3), ROW_OF(4)};
static const range_fn ONE_ROW[3][3] = {{range_1_2_1, range_1_2_2, range_1_2_4}, {range_1_3_1, range_1_3_2, range_1_3_4},
                                       {range_1_4_1, range_1_4_2, range_1_4_4}};
#undef ROW_OF
#undef RANGES
#undef RANGE

static range_fn pick_range(int R, int bits, int gb) {
    if (R == 1 && bits >= 2 && bits <= 4 && (gb == 1 || gb == 2 || gb == 4)) return ONE_ROW[bits - 2][gb == 4 ? 2 : gb - 1];
    return ANY_GROUP[R - 1][bits - 1];
}

static void rows_bf16(const uint8_t* w, const void* scales, int scale_kind, const uint8_t* zeros, int zero_row_bytes,
                      int sym_zero, const uint16_t* xb16, const float* xsum, float* y, int R, int N, int K, int bits, int group) {
    bf16_job job = {w, scales, zeros, xb16, xsum, y, scale_kind, zero_row_bytes, sym_zero, N, K, group};
    for (int p = 0; p < bits / 2; p++) job.ctrl[p] = plane_ctrl16(7 - bits + 2 * p);
    stream16_ctrl(bits, &job.perm, &job.shift);
    const int n_groups = (K + group - 1) / group;
    const range_fn range = pick_range(R, bits, group % 32 ? 0 : group / 32);
    /* each thread a range of whole pairs of rows */
    #pragma omp parallel
    {
        const int nt = omp_get_num_threads(), t = omp_get_thread_num(), pairs = (N + 1) / 2;
        const int n0 = 2 * (pairs * t / nt), n1 = t + 1 == nt ? N : 2 * (pairs * (t + 1) / nt);
        float scratch[2 * n_groups];  /* two rows' scales x 2^bits, once per thread */
        if (n1 > n0) range(job, n0, n1, scratch);
    }
}
#endif

/* Portable form of the same product, for CPUs without AVX2. */
static void rows_scalar(const uint8_t* w, const void* scales, int scale_kind, const uint8_t* zeros, int zero_row_bytes, int sym_zero,
                        const float* x, const float* xsum, float* y, int R, int N, int K, int bits, int group) {
    int n_groups = (K + group - 1) / group, block_bytes = 4 * bits;
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const uint8_t* row = w + (size_t)n * (K / 32) * block_bytes;
        for (int r = 0; r < R; r++) {
            float total = 0;
            for (int g = 0; g < n_groups; g++) {
                float acc = 0;
                for (int b = g * group / 32, b1 = group_end(g, group, K) / 32; b < b1; b++) {
                    uint8_t codes[32];
                    decode_block(row + (size_t)b * block_bytes, bits, codes);
                    const float* xb = x + (size_t)r * K + b * 32;
                    for (int j = 0; j < 32; j++) acc += (float)codes[j] * xb[j];
                }
                size_t gi = (size_t)n * n_groups + g;
                float s = load_scale(scales, scale_kind, gi), z = load_zero(zeros, zero_row_bytes, sym_zero, n, g, bits, scale_kind, gi);
                total += s * (acc - z * xsum[r * n_groups + g]);
            }
            y[(size_t)r * N + n] = total;
        }
    }
}

/* Each group's sum of x for R rows of x [R, K], float32 (x_bf16 0) or bfloat16 (1), in column order. */
static void group_sums(const void* x, int x_bf16, int R, int K, int group, float* xsum) {
    int n_groups = (K + group - 1) / group;
    for (int r = 0; r < R; r++)
        for (int g = 0; g < n_groups; g++) {
            float s = 0;
            for (int k = g * group, e = group_end(g, group, K); k < e; k++) {
                size_t i = (size_t)r * K + k;
                s += x_bf16 ? bf16_to_float(((const uint16_t*)x)[i]) : ((const float*)x)[i];
            }
            xsum[r * n_groups + g] = s;
        }
}

int bitplane_matmul_bf16(const uint8_t* w, const void* scales, int scale_kind, const uint8_t* zeros, int zero_row_bytes,
                         int sym_zero, const uint16_t* x, float* y, int M, int N, int K, int bits, int group);

/* y [M, N] = x [M, K] @ W^T, float32, for a few rows of x (decode steps); W's codes are read once per 4 rows. */
void bitplane_matmul(const uint8_t* w, const void* scales, int scale_kind, const uint8_t* zeros, int zero_row_bytes, int sym_zero,
                     const float* x, float* y, int M, int N, int K, int bits, int group) {
#ifdef BITPLANE_BF16
    /* codes below 8 bits and activations that are all bfloat16 (a bf16 model's): the bfloat16 entry's dot products */
    if (bits < 8 && all_bf16(x, (size_t)M * K)) {
        uint16_t* xb16 = malloc((size_t)M * K * sizeof(uint16_t));
        if (xb16) {
            for (size_t i = 0; i < (size_t)M * K; i++) xb16[i] = float_to_bf16(x[i]);  /* exact: they are bfloat16 */
            bitplane_matmul_bf16(w, scales, scale_kind, zeros, zero_row_bytes, sym_zero, xb16, y, M, N, K, bits, group);
            free(xb16);
            return;
        }
    }
#endif
    int n_groups = (K + group - 1) / group;
    float xsum[4 * n_groups];
    for (int m0 = 0; m0 < M; m0 += 4) {
        int R = M - m0 < 4 ? M - m0 : 4;
        const float* xr = x + (size_t)m0 * K;
        group_sums(xr, 0, R, K, group, xsum);
        float* yr = y + (size_t)m0 * N;
#ifdef __AVX2__
        rows_avx2(w, scales, scale_kind, zeros, zero_row_bytes, sym_zero, xr, xsum, yr, R, N, K, bits, group);
#else
        rows_scalar(w, scales, scale_kind, zeros, zero_row_bytes, sym_zero, xr, xsum, yr, R, N, K, bits, group);
#endif
    }
}

/* The same product with x [M, K] given as bfloat16 (a bf16 model's activations as they are, so a compiled graph
   rounds them to bfloat16 before the call, as the eager model does): bfloat16 dot products where the CPU has them
   (and the codes are below 8 bits), else x widened to float32 for the product above. Returns 0, or -1 when memory
   for the widened copy cannot be had. */
int bitplane_matmul_bf16(const uint8_t* w, const void* scales, int scale_kind, const uint8_t* zeros, int zero_row_bytes,
                         int sym_zero, const uint16_t* x, float* y, int M, int N, int K, int bits, int group) {
#ifdef BITPLANE_BF16
    if (bits < 8) {
        float xsum[4 * ((K + group - 1) / group)];
        for (int m0 = 0; m0 < M; m0 += 4) {
            int R = M - m0 < 4 ? M - m0 : 4;
            group_sums(x + (size_t)m0 * K, 1, R, K, group, xsum);
            rows_bf16(w, scales, scale_kind, zeros, zero_row_bytes, sym_zero, x + (size_t)m0 * K, xsum, y + (size_t)m0 * N,
                      R, N, K, bits, group);
        }
        return 0;
    }
#endif
    float* xf = widen_bf16(x, (size_t)M * K);
    if (!xf) return -1;
    bitplane_matmul(w, scales, scale_kind, zeros, zero_row_bytes, sym_zero, xf, y, M, N, K, bits, group);
    free(xf);
    return 0;
}

/* Rows [row0, row1) of W as float32 (out_kind 0) or bfloat16 (out_kind 2), [row1 - row0, K] row-major. */
void bitplane_dequantize(const uint8_t* w, const void* scales, int scale_kind, const uint8_t* zeros, int zero_row_bytes, int sym_zero,
                         void* out, int out_kind, int row0, int row1, int K, int bits, int group) {
    int n_groups = (K + group - 1) / group, block_bytes = 4 * bits;
    #pragma omp parallel for schedule(static)
    for (int n = row0; n < row1; n++) {
        const uint8_t* row = w + (size_t)n * (K / 32) * block_bytes;
        size_t o = (size_t)(n - row0) * K;
        for (int g = 0; g < n_groups; g++) {
            size_t gi = (size_t)n * n_groups + g;
            float s = load_scale(scales, scale_kind, gi), z = load_zero(zeros, zero_row_bytes, sym_zero, n, g, bits, scale_kind, gi);
            for (int b = g * group / 32, b1 = group_end(g, group, K) / 32; b < b1; b++) {
#ifdef __AVX2__
                __m256i codes = decode_block_avx2(row + (size_t)b * block_bytes, bits);
                __m128i half[2] = {_mm256_castsi256_si128(codes), _mm256_extracti128_si256(codes, 1)};
                __m256 vs = _mm256_set1_ps(s), vzs = _mm256_set1_ps(z * s);
                for (int q = 0; q < 4; q++) {
                    __m128i c8 = q & 1 ? _mm_srli_si128(half[q >> 1], 8) : half[q >> 1];
                    __m256 v = _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(c8)), vs, vzs);
                    size_t at = o + b * 32 + q * 8;
                    if (out_kind == BF16) _mm_storeu_si128((__m128i*)((uint16_t*)out + at), bf16_round8(v));
                    else _mm256_storeu_ps((float*)out + at, v);
                }
#else
                uint8_t codes[32];
                decode_block(row + (size_t)b * block_bytes, bits, codes);
                for (int j = 0; j < 32; j++) {
                    float v = (float)codes[j] * s - z * s;
                    if (out_kind == BF16) ((uint16_t*)out)[o + b * 32 + j] = float_to_bf16(v);
                    else ((float*)out)[o + b * 32 + j] = v;
                }
#endif
            }
        }
    }
}
