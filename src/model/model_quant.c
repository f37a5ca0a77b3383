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
 */
#include "model_internal.h"

#include <math.h>
#include <pthread.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define MIM_AVX2 1
#endif

static float f16_table[65536];
static pthread_once_t f16_once = PTHREAD_ONCE_INIT;

static float f16_convert(uint16_t h)
{
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

static void f16_init(void)
{
    for (uint32_t i = 0; i < 65536; i++)
        f16_table[i] = f16_convert((uint16_t)i);
}

static inline float fp16(const unsigned char *p)
{
    return f16_table[(uint16_t)(p[0] | (p[1] << 8))];
}

static inline float bf16(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float v;
    memcpy(&v, &bits, 4);
    return v;
}

const char *mim_type_name(uint32_t type)
{
    static const char *names[] = {
        "F32",     "F16",     "Q4_0",    "Q4_1",   "Q4_2",   "Q4_3",    "Q5_0",    "Q5_1",
        "Q8_0",    "Q8_1",    "Q2_K",    "Q3_K",   "Q4_K",   "Q5_K",    "Q6_K",    "Q8_K",
        "IQ2_XXS", "IQ2_XS",  "IQ3_XXS", "IQ1_S",  "IQ4_NL", "IQ3_S",   "IQ2_S",   "IQ4_XS",
        "I8",      "I16",     "I32",     "I64",    "F64",    "IQ1_M",   "BF16",    "Q4_0_4_4",
        "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0",  "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8",
        "MXFP4",
    };
    if (type < sizeof(names) / sizeof(names[0]))
        return names[type];
    return "unknown";
}

bool mim_type_supported(uint32_t type)
{
    return type == MIM_TYPE_F32 || type == MIM_TYPE_F16 || type == MIM_TYPE_BF16 ||
           type == MIM_TYPE_Q8_0 || type == MIM_TYPE_Q4_0 || type == MIM_TYPE_Q4_1;
}

bool mim_type_row_bytes(uint32_t type, uint64_t n, uint64_t *bytes)
{
    switch (type) {
    case MIM_TYPE_F32:
        *bytes = n * 4;
        return n <= UINT64_MAX / 4;
    case MIM_TYPE_F16:
    case MIM_TYPE_BF16:
        *bytes = n * 2;
        return n <= UINT64_MAX / 2;
    case MIM_TYPE_Q8_0:
        *bytes = n / MIM_QK * 34;
        return n % MIM_QK == 0;
    case MIM_TYPE_Q4_0:
        *bytes = n / MIM_QK * 18;
        return n % MIM_QK == 0;
    case MIM_TYPE_Q4_1:
        *bytes = n / MIM_QK * 20;
        return n % MIM_QK == 0;
    default:
        return false;
    }
}

void mim_dequant_row(uint32_t type, const void *src, float *dst, int64_t n)
{
    pthread_once(&f16_once, f16_init);
    const unsigned char *p = src;
    switch (type) {
    case MIM_TYPE_F32:
        memcpy(dst, src, (size_t)n * 4);
        break;
    case MIM_TYPE_F16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = fp16(p + 2 * i);
        break;
    case MIM_TYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = bf16((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
        break;
    case MIM_TYPE_Q8_0:
        for (int64_t b = 0; b < n / MIM_QK; b++, p += 34) {
            const float d = fp16(p);
            const int8_t *q = (const int8_t *)(p + 2);
            for (int j = 0; j < MIM_QK; j++)
                dst[b * MIM_QK + j] = d * (float)q[j];
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
    default:
        memset(dst, 0, (size_t)n * 4);
        break;
    }
}

#ifdef MIM_AVX2
static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 unsigned bytes to 8 floats */
static inline __m256 u8x8_ps(__m128i v)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
}

static inline __m256 i8x8_ps(__m128i v)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
}

/* Vector versions of the dots below; same block algebra, 8 lanes at a time. */
static bool dot_avx2(uint32_t type, const unsigned char *p, const float *x, int64_t n, float *r)
{
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
        for (; i < n; i++)
            t += w[i] * x[i];
        *r = t;
        return true;
    }
    case MIM_TYPE_F16: {
        if (n % 8)
            return false;
        for (int64_t i = 0; i < n; i += 8) {
            __m256 w = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 2 * i)));
            acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + i), acc);
        }
        *r = hsum8(acc);
        return true;
    }
    case MIM_TYPE_BF16: {
        if (n % 8)
            return false;
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
    default:
        return false;
    }
}
#endif

/* The quantized dots factor the scale out of each block: sum(d q x) = d sum(q x), and Q4_1's
 * offset adds m * sum(x). The inner loops are fixed-length so the compiler vectorizes them. */
float mim_dot_row(uint32_t type, const void *row, const float *x, int64_t n)
{
    pthread_once(&f16_once, f16_init);
    const unsigned char *p = row;
    float acc = 0.0f;
#ifdef MIM_AVX2
    if (dot_avx2(type, p, x, n, &acc))
        return acc;
#endif
    switch (type) {
    case MIM_TYPE_F32: {
        const float *w = row;
        float s[8] = {0};
        int64_t i = 0;
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; j++)
                s[j] += w[i + j] * x[i + j];
        for (; i < n; i++)
            acc += w[i] * x[i];
        for (int j = 0; j < 8; j++)
            acc += s[j];
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
            for (int j = 0; j < MIM_QK; j++)
                s += (float)q[j] * xb[j];
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
    default:
        return 0.0f;
    }
}
