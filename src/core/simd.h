/*
 * simd.h: the vector type of the build's target (8 floats with AVX2, 16 with AVX-512, GCC vector
 * extensions elsewhere) and the few operations the CPU kernels share: broadcast, FMA, select,
 * max, min, 2^x, horizontal sum. Intrinsics where the target has them, because the build's strict
 * C11 mode turns floating-point contraction off. Included by the attention engine (once per
 * instruction set it is compiled for) and by the KV methods' host code.
 */
#ifndef MI_SIMD_H
#define MI_SIMD_H

#include <stdint.h>

#if defined(__AVX__) || defined(__FMA__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__)
#define VL 16
#else
#define VL 8
#endif

typedef float vf __attribute__((vector_size(VL * 4)));
typedef int32_t vi __attribute__((vector_size(VL * 4)));

static inline vf vset1(float x) {
#if VL == 16
    return (vf)_mm512_set1_ps(x);
#elif defined(__AVX__)
    return (vf)_mm256_set1_ps(x);
#else
    vf r;
    for (int i = 0; i < VL; i++) r[i] = x;
    return r;
#endif
}

static inline vf vfma(vf a, vf b, vf c) {
#if VL == 16
    return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
    return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    return a * b + c;
#endif
}

static inline vf vsel(vi mask, vf a, vf b) { return (vf)((mask & (vi)a) | (~mask & (vi)b)); }

static inline vf vmax(vf a, vf b) {
#if VL == 16
    return (vf)_mm512_max_ps((__m512)a, (__m512)b);
#elif defined(__AVX__)
    return (vf)_mm256_max_ps((__m256)a, (__m256)b);
#else
    return vsel(a > b, a, b);
#endif
}

static inline vf vmin(vf a, vf b) {
#if VL == 16
    return (vf)_mm512_min_ps((__m512)a, (__m512)b);
#elif defined(__AVX__)
    return (vf)_mm256_min_ps((__m256)a, (__m256)b);
#else
    return vsel(a < b, a, b);
#endif
}

/* 2^x in fp32: x = n + f with n = round(x), |f| <= 1/2; 2^f by its degree-7 Taylor polynomial
 * (truncation error < 1e-8 relative, below fp32 rounding); 2^n assembled in the exponent bits.
 * x < -126 gives exactly 0 (masked scores are -inf and must contribute nothing); NaN stays NaN. */
static inline vf vexp2(vf x) {
    const vi keep = x >= vset1(-126.0f);
    const vi nan = x != x;
    const vf xc = vmin(vmax(x, vset1(-126.0f)), vset1(127.0f));
    const vi n = __builtin_convertvector(xc + vset1(128.5f), vi) - 128;
    const vf f = xc - __builtin_convertvector(n, vf);
    vf p = vset1(1.525273380405984e-05f);
    p = vfma(p, f, vset1(1.5403530393381606e-04f));
    p = vfma(p, f, vset1(1.3333558146428443e-03f));
    p = vfma(p, f, vset1(9.618129107628477e-03f));
    p = vfma(p, f, vset1(5.550410866482158e-02f));
    p = vfma(p, f, vset1(2.402265069591007e-01f));
    p = vfma(p, f, vset1(6.931471805599453e-01f));
    p = vfma(p, f, vset1(1.0f));
    const vf scale = (vf)((n + 127) << 23);
    const vf r = (vf)((vi)(p * scale) & keep);
    return vsel(nan, x, r);
}

static inline float hsum(vf v) {
    float s = 0.0f;
    for (int i = 0; i < VL; i++) s += v[i];
    return s;
}

#endif /* MI_SIMD_H */
