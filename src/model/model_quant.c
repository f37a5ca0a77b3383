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
 *   Q4_0: f16 d, u8 q[16]              x[j] = d * ((q[j] & 15) - 8), x[j+16] = d * ((q[j] >> 4) - 8)
 *   Q4_1: f16 d, f16 m, u8 q[16]       x[j] = d * (q[j] & 15) + m,   x[j+16] = d * (q[j] >> 4) + m
 */
#include "model_internal.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

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

/* The quantized dots factor the scale out of each block: sum(d q x) = d sum(q x), and Q4_1's
 * offset adds m * sum(x). The inner loops are fixed-length so the compiler vectorizes them. */
float mim_dot_row(uint32_t type, const void *row, const float *x, int64_t n)
{
    pthread_once(&f16_once, f16_init);
    const unsigned char *p = row;
    float acc = 0.0f;
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
