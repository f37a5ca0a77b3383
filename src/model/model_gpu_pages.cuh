/*
 * model_gpu_pages.cuh: decoding 16 bytes of a session page row on the device, shared by the
 * upload of pages (model_gpu_pages.cu) and Quest's reads (model_gpu_quest.cu).
 *
 * The values equal the host reader's (kv_rows_decode): bf16 and f16 widen exactly; an fp8 code
 * widens exactly, times the page's scale (a power of two, so the product is exact), plus the
 * channel's centre, one rounding in f32.
 */
#ifndef MI_MODEL_GPU_PAGES_CUH
#define MI_MODEL_GPU_PAGES_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

extern "C" {
#include "minference_kv.h"
}

/* N decoded values rounded once to bf16 (nearest even), stored as N / 8 16-byte vectors. */
template <int N> __device__ inline void store_bf16(const float *f, __nv_bfloat16 *dst) {
    __align__(16) __nv_bfloat16 o[N];
#pragma unroll
    for (int i = 0; i < N; i++) o[i] = __float2bfloat16_rn(f[i]);
#pragma unroll
    for (int i = 0; i < N / 8; i++) *(uint4 *)(dst + 8 * i) = *(const uint4 *)(o + 8 * i);
}

/* 16 bytes of a row in: ELEMS elements (4 for f32, 8 for bf16 and f16, 16 for fp8). c: the elements'
 * centres, s: the page's scale (fp8 only). */
template <int KIND> struct page_vec;

template <> struct page_vec<MI_KV_F32> {
    static constexpr int ELEMS = 4;
    __device__ static void to_f32(uint4 w, const float *, float, float *out) {
        const float *f = (const float *)&w;
#pragma unroll
        for (int i = 0; i < 4; i++) out[i] = f[i];
    }
};

template <> struct page_vec<MI_KV_BF16> {
    static constexpr int ELEMS = 8;
    __device__ static void to_f32(uint4 w, const float *, float, float *out) {
        const uint16_t *b = (const uint16_t *)&w;
#pragma unroll
        for (int i = 0; i < 8; i++) out[i] = __uint_as_float((uint32_t)b[i] << 16);
    }
    __device__ static void to_bf16(uint4 w, const float *, float, __nv_bfloat16 *dst) {
        *(uint4 *)dst = w;
    }
};

template <> struct page_vec<MI_KV_F16> {
    static constexpr int ELEMS = 8;
    __device__ static void to_f32(uint4 w, const float *, float, float *out) {
        const __half *h = (const __half *)&w;
#pragma unroll
        for (int i = 0; i < 8; i++) out[i] = __half2float(h[i]);
    }
    __device__ static void to_bf16(uint4 w, const float *c, float s, __nv_bfloat16 *dst) {
        float f[8];
        to_f32(w, c, s, f);
        store_bf16<8>(f, dst);
    }
};

template <> struct page_vec<MI_KV_FP8_E4M3> {
    static constexpr int ELEMS = 16;
    __device__ static void to_f32(uint4 w, const float *c, float s, float *out) {
        const unsigned char *b = (const unsigned char *)&w;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const __half_raw r = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b[i], __NV_E4M3);
            out[i] = __fadd_rn(c[i], __fmul_rn(__half2float(__half(r)), s));
        }
    }
    __device__ static void to_bf16(uint4 w, const float *c, float s, __nv_bfloat16 *dst) {
        float f[16];
        to_f32(w, c, s, f);
        store_bf16<16>(f, dst);
    }
};

/* Where a page keeps one head's rows, scales and centres (mi_kv_page_layout, as kernel
 * arguments). */
struct page_geom {
    int32_t n_kv, hd;
    int64_t row_stride, head_stride, k_offset, v_offset, scale_offset, center_offset;
};

static inline page_geom page_geom_of(const mi_kv_page_layout *lay) {
    page_geom g;
    g.n_kv = lay->n_kv_heads, g.hd = lay->head_dim;
    g.row_stride = (int64_t)lay->row_stride, g.head_stride = (int64_t)lay->head_stride;
    g.k_offset = (int64_t)lay->k_offset, g.v_offset = (int64_t)lay->v_offset;
    g.scale_offset = (int64_t)lay->scale_offset, g.center_offset = (int64_t)lay->center_offset;
    return g;
}

/* Head h's K (kv 0) or V (kv 1) rows of a page: the first row's bytes; for fp8 the scale and
 * the centres (hd floats) into centre, which the CTA shares (call from every thread, then
 * __syncthreads before reading centre). */
template <int KIND>
__device__ inline const unsigned char *page_head_rows(const unsigned char *page, const page_geom &g,
                                                      int h, int kv, float *centre, float *scale) {
    *scale = 1.0f;
    if (KIND == MI_KV_FP8_E4M3) {
        *scale = ((const float *)(page + g.scale_offset))[kv * g.n_kv + h];
        const uint16_t *c =
            (const uint16_t *)(page + g.center_offset) + ((int64_t)kv * g.n_kv + h) * g.hd;
        for (int d = threadIdx.x; d < g.hd; d += blockDim.x)
            centre[d] = __uint_as_float((uint32_t)c[d] << 16);
    }
    return page + (kv ? g.v_offset : g.k_offset) + h * g.head_stride;
}

#endif /* MI_MODEL_GPU_PAGES_CUH */
