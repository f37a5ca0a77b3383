/* tensor.c: tensor descriptors, dtype helpers and half-precision conversions. */
#include "internal.h"

#include <string.h>

size_t mi_dtype_size(mi_dtype dtype) {
    switch (dtype) {
    case MI_DTYPE_F32: return 4;
    case MI_DTYPE_F16: return 2;
    case MI_DTYPE_BF16: return 2;
    }
    return 0;
}

const char *mi_dtype_name(mi_dtype dtype) {
    switch (dtype) {
    case MI_DTYPE_F32: return "f32";
    case MI_DTYPE_F16: return "f16";
    case MI_DTYPE_BF16: return "bf16";
    }
    return "unknown";
}

mi_tensor mi_tensor_bhld(void *data, mi_dtype dtype, mi_device_type device, int64_t B, int64_t H,
                         int64_t L, int64_t D) {
    mi_tensor t;
    t.data = data;
    t.dtype = dtype;
    t.device = device;
    t.shape[0] = B, t.shape[1] = H, t.shape[2] = L, t.shape[3] = D;
    t.stride[0] = H * L * D, t.stride[1] = L * D, t.stride[2] = D, t.stride[3] = 1;
    return t;
}

mi_tensor mi_tensor_blhd(void *data, mi_dtype dtype, mi_device_type device, int64_t B, int64_t H,
                         int64_t L, int64_t D) {
    mi_tensor t = mi_tensor_bhld(data, dtype, device, B, H, L, D);
    t.stride[0] = L * H * D, t.stride[1] = D, t.stride[2] = H * D, t.stride[3] = 1;
    return t;
}

static uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

uint16_t mi_f32_to_bf16(float x) {
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

float mi_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t mi_f32_to_f16(float x) {
    uint32_t u = f32_bits(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
    if (absu >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: Inf */
    if (absu < 0x38800000u) {
        /* Subnormal half (or zero): scale into the integer range and round to nearest even. */
        if (absu < 0x33000000u) return (uint16_t)sign; /* below half the smallest subnormal */
        uint32_t mant = (absu & 0x7fffffu) | 0x800000u;
        /* value / 2^-24 = mant * 2^(exp - 126): shift right by 126 - exp (14..24). */
        int shift = 126 - (int)(absu >> 23);
        uint32_t q = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = absu + 0xfffu + ((absu >> 13) & 1u); /* round mantissa to 10 bits */
    r -= 0x38000000u;                                 /* rebias exponent 127 -> 15 */
    return (uint16_t)(sign | (r >> 13));
}

float mi_f16_to_f32(uint16_t h) {
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t exp = ((uint32_t)h >> 10) & 0x1fu;
    uint32_t mant = (uint32_t)h & 0x3ffu;
    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24 */
        float f = (float)mant * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}
