/*
 * model_quant.c: the weight encodings a model file may use and their expansion to fp32.
 *
 * Weights stay in their file encoding (memory-mapped) and are expanded row by row where they are
 * used: a GEMV dots each encoded row with the activation directly, and a prefill GEMM expands a
 * whole matrix into a scratch buffer and hands it to sgemm. That keeps resident memory at the
 * file size (a 4-bit 8B model stays ~5 GB instead of 32 GB in fp32), and the expansion cost is
 * amortized over all the rows of a prefill chunk.
 *
 * Block layouts (32 elements each, little endian):
 *   Q8_0: f16 d, int8 q[32]            x = d * q
 *   Q4_0: f16 d, u8 q[16]              x[j] = d ((q[j] & 15) - 8), x[j+16] = d ((q[j] >> 4) - 8)
 *   Q4_1: f16 d, f16 m, u8 q[16]       x[j] = d * (q[j] & 15) + m,   x[j+16] = d * (q[j] >> 4) + m
 *   Q5_0 / Q5_1: as Q4_0 / Q4_1 with a fifth bit per element from a u32 qh (bit j for element j),
 *         centred at 16 (Q5_0) or offset by m (Q5_1)
 * and the 256-element "K" super-blocks, where 6-bit sub-block scales multiply an f16 scale:
 *   Q4_K: f16 d, f16 dmin, u8 scales[12] (8 x (6-bit scale, 6-bit min)), u8 q[128]
 *         each 32-element sub-block s: x = d * sc[s] * q - dmin * mn[s]
 *   Q5_K: as Q4_K plus u8 qh[32], one high bit per element
 *   Q6_K: u8 ql[128], u8 qh[64], int8 scales[16], f16 d; x = d * scales[s16] * (q6 - 32)
 */
#include "model_internal.h"

#include <math.h>
#include <pthread.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define MIM_AVX2 1
#endif

#define MIM_QK_K 256 /* elements per K-quant super-block */

static float f16_table[65536];
static pthread_once_t f16_once = PTHREAD_ONCE_INIT;

static float f16_convert(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F;
    uint32_t man = h & 0x3FF;
    float v;
    if (exp == 0)
        v = ldexpf((float)man, -24); /* subnormal */
    else if (exp == 31)
        v = man ? NAN : INFINITY;
    else
        v = ldexpf((float)(man | 0x400), (int)exp - 25);
    uint32_t bits;
    memcpy(&bits, &v, 4);
    bits |= sign;
    memcpy(&v, &bits, 4);
    return v;
}

static void f16_init(void) {
    for (uint32_t i = 0; i < 65536; i++) f16_table[i] = f16_convert((uint16_t)i);
}

static inline float fp16(const unsigned char *p) {
    return f16_table[(uint16_t)(p[0] | (p[1] << 8))];
}

static inline float bf16(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float v;
    memcpy(&v, &bits, 4);
    return v;
}

const char *mim_type_name(uint32_t type) {
    static const char *names[] = {
        "F32",   "F16",        "Q4_0",       "Q4_1",       "Q4_2",     "Q4_3",     "Q5_0",
        "Q5_1",  "Q8_0",       "Q8_1",       "Q2_K",       "Q3_K",     "Q4_K",     "Q5_K",
        "Q6_K",  "Q8_K",       "IQ2_XXS",    "IQ2_XS",     "IQ3_XXS",  "IQ1_S",    "IQ4_NL",
        "IQ3_S", "IQ2_S",      "IQ4_XS",     "I8",         "I16",      "I32",      "I64",
        "F64",   "IQ1_M",      "BF16",       "Q4_0_4_4",   "Q4_0_4_8", "Q4_0_8_8", "TQ1_0",
        "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4",
    };
    if (type < sizeof(names) / sizeof(names[0])) return names[type];
    return "unknown";
}

/* Elements per block and bytes per block of each readable type (0: not readable). */
static void block_shape(uint32_t type, uint64_t *elems, uint64_t *bytes) {
    *elems = 0;
    *bytes = 0;
    switch (type) {
    case MIM_TYPE_F32: *elems = 1, *bytes = 4; break;
    case MIM_TYPE_F16:
    case MIM_TYPE_BF16: *elems = 1, *bytes = 2; break;
    case MIM_TYPE_Q8_0: *elems = MIM_QK, *bytes = 34; break;
    case MIM_TYPE_Q4_0: *elems = MIM_QK, *bytes = 18; break;
    case MIM_TYPE_Q4_1: *elems = MIM_QK, *bytes = 20; break;
    case MIM_TYPE_Q5_0: *elems = MIM_QK, *bytes = 22; break;
    case MIM_TYPE_Q5_1: *elems = MIM_QK, *bytes = 24; break;
    case MIM_TYPE_Q4_K: *elems = MIM_QK_K, *bytes = 144; break;
    case MIM_TYPE_Q5_K: *elems = MIM_QK_K, *bytes = 176; break;
    case MIM_TYPE_Q6_K: *elems = MIM_QK_K, *bytes = 210; break;
    default: break;
    }
}

bool mim_type_supported(uint32_t type) {
    uint64_t e, b;
    block_shape(type, &e, &b);
    return e != 0;
}

uint64_t mim_type_block(uint32_t type) {
    uint64_t e, b;
    block_shape(type, &e, &b);
    return e;
}

bool mim_type_row_bytes(uint32_t type, uint64_t n, uint64_t *bytes) {
    uint64_t e, b;
    block_shape(type, &e, &b);
    if (e == 0 || n % e != 0 || n / e > UINT64_MAX / b) return false;
    *bytes = n / e * b;
    return true;
}

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K super-block. */
static inline void k_scale_min(int j, const unsigned char *q, int *sc, int *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

static void dequant_q5(const unsigned char *p, float *dst, int64_t n, bool with_min) {
    const int64_t bs = with_min ? 24 : 22;
    for (int64_t b = 0; b < n / MIM_QK; b++, p += bs) {
        const float d = fp16(p), m = with_min ? fp16(p + 2) : 0.0f;
        const unsigned char *hq = p + (with_min ? 4 : 2);
        const uint32_t qh = (uint32_t)hq[0] | ((uint32_t)hq[1] << 8) | ((uint32_t)hq[2] << 16) |
                            ((uint32_t)hq[3] << 24);
        const unsigned char *q = hq + 4;
        const int centre = with_min ? 0 : 16;
        for (int j = 0; j < 16; j++) {
            int lo = (q[j] & 15) | (int)(((qh >> j) & 1) << 4);
            int hi = (q[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            dst[b * MIM_QK + j] = d * (float)(lo - centre) + m;
            dst[b * MIM_QK + j + 16] = d * (float)(hi - centre) + m;
        }
    }
}

static void dequant_q45k(const unsigned char *p, float *dst, int64_t n, bool five) {
    const int64_t bs = five ? 176 : 144;
    for (int64_t b = 0; b < n / MIM_QK_K; b++, p += bs) {
        const float d = fp16(p), dmin = fp16(p + 2);
        const unsigned char *scales = p + 4;
        const unsigned char *qh = five ? p + 16 : NULL;
        const unsigned char *q = p + (five ? 48 : 16);
        float *y = dst + b * MIM_QK_K;
        for (int j = 0, is = 0; j < MIM_QK_K; j += 64, is += 2, q += 32) {
            int sc, mn;
            k_scale_min(is, scales, &sc, &mn);
            const float d1 = d * (float)sc, m1 = dmin * (float)mn;
            k_scale_min(is + 1, scales, &sc, &mn);
            const float d2 = d * (float)sc, m2 = dmin * (float)mn;
            const int u1 = 1 << is, u2 = 2 << is; /* high bits of this 64-element pair */
            for (int l = 0; l < 32; l++) {
                int lo = q[l] & 15, hi = q[l] >> 4;
                if (five) {
                    lo += (qh[l] & u1) ? 16 : 0;
                    hi += (qh[l] & u2) ? 16 : 0;
                }
                y[j + l] = d1 * (float)lo - m1;
                y[j + 32 + l] = d2 * (float)hi - m2;
            }
        }
    }
}

static void dequant_q6k(const unsigned char *p, float *dst, int64_t n) {
    for (int64_t b = 0; b < n / MIM_QK_K; b++, p += 210) {
        const unsigned char *ql = p, *qh = p + 128;
        const int8_t *sc = (const int8_t *)(p + 192);
        const float d = fp16(p + 208);
        float *y = dst + b * MIM_QK_K;
        for (int half = 0; half < 2; half++, y += 128, ql += 64, qh += 32, sc += 8) {
            /* two runs of 16 with a fixed scale index each, so the loop vectorises */
            for (int is = 0; is < 2; is++) {
                for (int l = 16 * is; l < 16 * is + 16; l++) {
                    const int q1 = ((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4)) - 32;
                    const int q2 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
                    const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                    const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                    y[l] = d * (float)sc[is] * (float)q1;
                    y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                    y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                    y[l + 96] = d * (float)sc[is + 6] * (float)q4;
                }
            }
        }
    }
}

void mim_dequant_row(uint32_t type, const void *src, float *dst, int64_t n) {
    pthread_once(&f16_once, f16_init);
    const unsigned char *p = src;
    switch (type) {
    case MIM_TYPE_F32: memcpy(dst, src, (size_t)n * 4); break;
    case MIM_TYPE_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = fp16(p + 2 * i);
        break;
    case MIM_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = bf16((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
        break;
    case MIM_TYPE_Q8_0:
        for (int64_t b = 0; b < n / MIM_QK; b++, p += 34) {
            const float d = fp16(p);
            const int8_t *q = (const int8_t *)(p + 2);
            for (int j = 0; j < MIM_QK; j++) dst[b * MIM_QK + j] = d * (float)q[j];
        }
        break;
    case MIM_TYPE_Q4_0:
        for (int64_t b = 0; b < n / MIM_QK; b++, p += 18) {
            const float d = fp16(p);
            const unsigned char *q = p + 2;
            for (int j = 0; j < MIM_QK / 2; j++) {
                dst[b * MIM_QK + j] = d * (float)((q[j] & 15) - 8);
                dst[b * MIM_QK + j + 16] = d * (float)((q[j] >> 4) - 8);
            }
        }
        break;
    case MIM_TYPE_Q4_1:
        for (int64_t b = 0; b < n / MIM_QK; b++, p += 20) {
            const float d = fp16(p), m = fp16(p + 2);
            const unsigned char *q = p + 4;
            for (int j = 0; j < MIM_QK / 2; j++) {
                dst[b * MIM_QK + j] = d * (float)(q[j] & 15) + m;
                dst[b * MIM_QK + j + 16] = d * (float)(q[j] >> 4) + m;
            }
        }
        break;
    case MIM_TYPE_Q5_0:
    case MIM_TYPE_Q5_1: dequant_q5(p, dst, n, type == MIM_TYPE_Q5_1); break;
    case MIM_TYPE_Q4_K:
    case MIM_TYPE_Q5_K: dequant_q45k(p, dst, n, type == MIM_TYPE_Q5_K); break;
    case MIM_TYPE_Q6_K: dequant_q6k(p, dst, n); break;
    default: memset(dst, 0, (size_t)n * 4); break;
    }
}

#ifdef MIM_AVX2
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 unsigned bytes to 8 floats */
static inline __m256 u8x8_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }

static inline __m256 i8x8_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

/* Vector versions of the dots below; same block algebra, 8 lanes at a time. Decode streams every
 * weight once per token and is bound by memory, so the quantized loops prefetch 1 KB ahead
 * (rows are contiguous, so this runs into the next rows): 15-20% faster decode measured. A
 * prefetch never faults, so reaching past the tensor is harmless. */
static bool dot_avx2(uint32_t type, const unsigned char *p, const float *x, int64_t n, float *r) {
    __m256 acc = _mm256_setzero_ps();
    const int64_t nb = n / MIM_QK;
    switch (type) {
    case MIM_TYPE_F32: {
        const float *w = (const float *)p;
        __m256 a2 = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) {
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), acc);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a2);
        }
        float t = hsum8(_mm256_add_ps(acc, a2));
        for (; i < n; i++) {
            float wi; /* safetensors data need not be 4-byte aligned */
            memcpy(&wi, w + i, 4);
            t += wi * x[i];
        }
        *r = t;
        return true;
    }
    case MIM_TYPE_F16: {
        if (n % 8) return false;
        for (int64_t i = 0; i < n; i += 8) {
            __m256 w = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 2 * i)));
            acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + i), acc);
        }
        *r = hsum8(acc);
        return true;
    }
    case MIM_TYPE_BF16: {
        if (n % 8) return false;
        for (int64_t i = 0; i < n; i += 8) {
            __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 2 * i)));
            __m256 w = _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
            acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + i), acc);
        }
        *r = hsum8(acc);
        return true;
    }
    case MIM_TYPE_Q8_0:
        for (int64_t b = 0; b < nb; b++, p += 34) {
            const float *xb = x + b * MIM_QK;
            _mm_prefetch((const char *)p + 1024, _MM_HINT_T0);
            __m128i q0 = _mm_loadu_si128((const __m128i *)(p + 2));
            __m128i q1 = _mm_loadu_si128((const __m128i *)(p + 18));
            __m256 s = _mm256_mul_ps(i8x8_ps(q0), _mm256_loadu_ps(xb));
            s = _mm256_fmadd_ps(i8x8_ps(_mm_srli_si128(q0, 8)), _mm256_loadu_ps(xb + 8), s);
            s = _mm256_fmadd_ps(i8x8_ps(q1), _mm256_loadu_ps(xb + 16), s);
            s = _mm256_fmadd_ps(i8x8_ps(_mm_srli_si128(q1, 8)), _mm256_loadu_ps(xb + 24), s);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(p)), s, acc);
        }
        *r = hsum8(acc);
        return true;
    case MIM_TYPE_Q4_0:
    case MIM_TYPE_Q4_1: {
        const bool q41 = type == MIM_TYPE_Q4_1;
        const int64_t bs = q41 ? 20 : 18;
        const __m128i mask = _mm_set1_epi8(15);
        const __m256 eight = _mm256_set1_ps(8.0f);
        __m256 accm = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++, p += bs) {
            const float *xb = x + b * MIM_QK;
            _mm_prefetch((const char *)p + 1024, _MM_HINT_T0);
            __m128i q = _mm_loadu_si128((const __m128i *)(p + (q41 ? 4 : 2)));
            __m128i lo = _mm_and_si128(q, mask), hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
            __m256 w0 = u8x8_ps(lo), w1 = u8x8_ps(_mm_srli_si128(lo, 8));
            __m256 w2 = u8x8_ps(hi), w3 = u8x8_ps(_mm_srli_si128(hi, 8));
            if (!q41) {
                w0 = _mm256_sub_ps(w0, eight);
                w1 = _mm256_sub_ps(w1, eight);
                w2 = _mm256_sub_ps(w2, eight);
                w3 = _mm256_sub_ps(w3, eight);
            }
            __m256 x0 = _mm256_loadu_ps(xb), x1 = _mm256_loadu_ps(xb + 8);
            __m256 x2 = _mm256_loadu_ps(xb + 16), x3 = _mm256_loadu_ps(xb + 24);
            __m256 s = _mm256_mul_ps(w0, x0);
            s = _mm256_fmadd_ps(w1, x1, s);
            s = _mm256_fmadd_ps(w2, x2, s);
            s = _mm256_fmadd_ps(w3, x3, s);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(p)), s, acc);
            if (q41) {
                __m256 sx = _mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3));
                accm = _mm256_fmadd_ps(_mm256_set1_ps(fp16(p + 2)), sx, accm);
            }
        }
        *r = hsum8(_mm256_add_ps(acc, accm));
        return true;
    }
    default: return false;
    }
}
#endif

/* The quantized dots factor the scale out of each block: sum(d q x) = d sum(q x), and Q4_1's
 * offset adds m * sum(x). The inner loops are fixed-length so the compiler vectorizes them. */
float mim_dot_row(uint32_t type, const void *row, const float *x, int64_t n) {
    pthread_once(&f16_once, f16_init);
    const unsigned char *p = row;
    float acc = 0.0f;
#ifdef MIM_AVX2
    if (dot_avx2(type, p, x, n, &acc)) return acc;
#endif
    switch (type) {
    case MIM_TYPE_F32: {
        const unsigned char *w = row; /* possibly unaligned (safetensors): memcpy loads */
        float s[8] = {0};
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
            float wv[8];
            memcpy(wv, w + 4 * i, sizeof(wv));
            for (int j = 0; j < 8; j++) s[j] += wv[j] * x[i + j];
        }
        for (; i < n; i++) {
            float wi;
            memcpy(&wi, w + 4 * i, 4);
            acc += wi * x[i];
        }
        for (int j = 0; j < 8; j++) acc += s[j];
        return acc;
    }
    case MIM_TYPE_F16:
    case MIM_TYPE_BF16: {
        float buf[256];
        for (int64_t i = 0; i < n; i += 256) {
            int64_t m = n - i < 256 ? n - i : 256;
            mim_dequant_row(type, p + 2 * i, buf, m);
            acc += mim_dot_row(MIM_TYPE_F32, buf, x + i, m);
        }
        return acc;
    }
    case MIM_TYPE_Q8_0:
        for (int64_t b = 0; b < n / MIM_QK; b++, p += 34) {
            const int8_t *q = (const int8_t *)(p + 2);
            const float *xb = x + b * MIM_QK;
            float s = 0.0f;
            for (int j = 0; j < MIM_QK; j++) s += (float)q[j] * xb[j];
            acc += fp16(p) * s;
        }
        return acc;
    case MIM_TYPE_Q4_0:
        for (int64_t b = 0; b < n / MIM_QK; b++, p += 18) {
            const unsigned char *q = p + 2;
            const float *xb = x + b * MIM_QK;
            float s = 0.0f;
            for (int j = 0; j < 16; j++)
                s += (float)((q[j] & 15) - 8) * xb[j] + (float)((q[j] >> 4) - 8) * xb[j + 16];
            acc += fp16(p) * s;
        }
        return acc;
    case MIM_TYPE_Q4_1:
        for (int64_t b = 0; b < n / MIM_QK; b++, p += 20) {
            const unsigned char *q = p + 4;
            const float *xb = x + b * MIM_QK;
            float s = 0.0f, sx = 0.0f;
            for (int j = 0; j < 16; j++) {
                s += (float)(q[j] & 15) * xb[j] + (float)(q[j] >> 4) * xb[j + 16];
                sx += xb[j] + xb[j + 16];
            }
            acc += fp16(p) * s + fp16(p + 2) * sx;
        }
        return acc;
    default: {
        /* The other encodings: expand one block at a time and dot it. */
        uint64_t be = 0, bb = 0;
        block_shape(type, &be, &bb);
        if (be == 0) return 0.0f;
        float buf[MIM_QK_K];
        for (int64_t i = 0; i < n; i += (int64_t)be) {
            mim_dequant_row(type, p + (uint64_t)i / be * bb, buf, (int64_t)be);
            acc += mim_dot_row(MIM_TYPE_F32, buf, x + i, (int64_t)be);
        }
        return acc;
    }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* One row against several x rows (a batch of decode rows)                                     */

#ifdef MIM_AVX2
/* G x rows (a constant once inlined, so the accumulators stay in registers): each block is
 * unpacked once for all of them, and each row's accumulation is dot_avx2's, op for op, so
 * out[r] equals mim_dot_row(row, x + r * ldx) bit for bit. */
static inline __attribute__((always_inline)) void dots_q4(const unsigned char *p, const float *x,
                                                          int64_t ldx, int64_t nb, bool q41, int G,
                                                          float *out) {
    const int64_t bs = q41 ? 20 : 18;
    const __m128i mask = _mm_set1_epi8(15);
    const __m256 eight = _mm256_set1_ps(8.0f);
    __m256 acc[4], accm[4];
    for (int r = 0; r < G; r++) acc[r] = accm[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, p += bs) {
        _mm_prefetch((const char *)p + 1024, _MM_HINT_T0);
        __m128i q = _mm_loadu_si128((const __m128i *)(p + (q41 ? 4 : 2)));
        __m128i lo = _mm_and_si128(q, mask), hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
        __m256 w0 = u8x8_ps(lo), w1 = u8x8_ps(_mm_srli_si128(lo, 8));
        __m256 w2 = u8x8_ps(hi), w3 = u8x8_ps(_mm_srli_si128(hi, 8));
        if (!q41) {
            w0 = _mm256_sub_ps(w0, eight);
            w1 = _mm256_sub_ps(w1, eight);
            w2 = _mm256_sub_ps(w2, eight);
            w3 = _mm256_sub_ps(w3, eight);
        }
        const __m256 d = _mm256_set1_ps(fp16(p));
        const __m256 mn = _mm256_set1_ps(q41 ? fp16(p + 2) : 0.0f);
        for (int r = 0; r < G; r++) {
            const float *xb = x + r * ldx + b * MIM_QK;
            __m256 x0 = _mm256_loadu_ps(xb), x1 = _mm256_loadu_ps(xb + 8);
            __m256 x2 = _mm256_loadu_ps(xb + 16), x3 = _mm256_loadu_ps(xb + 24);
            __m256 s = _mm256_mul_ps(w0, x0);
            s = _mm256_fmadd_ps(w1, x1, s);
            s = _mm256_fmadd_ps(w2, x2, s);
            s = _mm256_fmadd_ps(w3, x3, s);
            acc[r] = _mm256_fmadd_ps(d, s, acc[r]);
            if (q41) {
                __m256 sx = _mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3));
                accm[r] = _mm256_fmadd_ps(mn, sx, accm[r]);
            }
        }
    }
    for (int r = 0; r < G; r++) out[r] = hsum8(_mm256_add_ps(acc[r], accm[r]));
}

static inline __attribute__((always_inline)) void
dots_q8(const unsigned char *p, const float *x, int64_t ldx, int64_t nb, int G, float *out) {
    __m256 acc[4];
    for (int r = 0; r < G; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, p += 34) {
        _mm_prefetch((const char *)p + 1024, _MM_HINT_T0);
        __m128i q0 = _mm_loadu_si128((const __m128i *)(p + 2));
        __m128i q1 = _mm_loadu_si128((const __m128i *)(p + 18));
        const __m256 w0 = i8x8_ps(q0), w1 = i8x8_ps(_mm_srli_si128(q0, 8));
        const __m256 w2 = i8x8_ps(q1), w3 = i8x8_ps(_mm_srli_si128(q1, 8));
        const __m256 d = _mm256_set1_ps(fp16(p));
        for (int r = 0; r < G; r++) {
            const float *xb = x + r * ldx + b * MIM_QK;
            __m256 s = _mm256_mul_ps(w0, _mm256_loadu_ps(xb));
            s = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xb + 8), s);
            s = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xb + 16), s);
            s = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xb + 24), s);
            acc[r] = _mm256_fmadd_ps(d, s, acc[r]);
        }
    }
    for (int r = 0; r < G; r++) out[r] = hsum8(acc[r]);
}

static void dots_group(uint32_t type, const unsigned char *p, const float *x, int64_t ldx,
                       int64_t n, int g, float *out) {
    const int64_t nb = n / MIM_QK;
    const bool q41 = type == MIM_TYPE_Q4_1;
    if (type == MIM_TYPE_Q8_0) {
        switch (g) {
        case 4: dots_q8(p, x, ldx, nb, 4, out); break;
        case 3: dots_q8(p, x, ldx, nb, 3, out); break;
        case 2: dots_q8(p, x, ldx, nb, 2, out); break;
        default: dots_q8(p, x, ldx, nb, 1, out); break;
        }
        return;
    }
    switch (g) {
    case 4: dots_q4(p, x, ldx, nb, q41, 4, out); break;
    case 3: dots_q4(p, x, ldx, nb, q41, 3, out); break;
    case 2: dots_q4(p, x, ldx, nb, q41, 2, out); break;
    default: dots_q4(p, x, ldx, nb, q41, 1, out); break;
    }
}
#endif

void mim_dot_rows(uint32_t type, const void *row, const float *x, int64_t ldx, int64_t n_x,
                  int64_t n, float *out) {
#ifdef MIM_AVX2
    if ((type == MIM_TYPE_Q4_0 || type == MIM_TYPE_Q4_1 || type == MIM_TYPE_Q8_0) &&
        n % MIM_QK == 0) {
        pthread_once(&f16_once, f16_init);
        for (int64_t i = 0; i < n_x; i += 4) {
            const int g = n_x - i < 4 ? (int)(n_x - i) : 4;
            dots_group(type, row, x + i * ldx, ldx, n, g, out + i);
        }
        return;
    }
#endif
    for (int64_t i = 0; i < n_x; i++) out[i] = mim_dot_row(type, row, x + i * ldx, n);
}
