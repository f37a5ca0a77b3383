/*
 * model_gpu_pages.cu: session pages decoded on the device (see model_gpu_pages.h).
 *
 * One CTA per (page, KV head, K or V) reads the head's rows as 16-byte vectors straight from
 * pinned host memory and writes bf16 rows into the cache. The values equal the host reader's
 * (kv_rows_decode, then the f32 -> bf16 rounding of mi_kv_seq_read): bf16 is copied; f16 is
 * widened exactly and rounded to nearest even; an fp8 code is widened exactly, times the page's
 * scale (a power of two, so the product is exact), plus the channel's centre, rounded once.
 */
#include "model_gpu_pages.h"

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdlib.h>

typedef __nv_bfloat16 bf16;

namespace {

const int PAGE_MAX_HD = 256;
const int PAGE_THREADS = 128;

/* 16 bytes of a row in, their elements out as bf16: 8 (bf16, f16) or 16 (fp8) of them. */
template <int KIND> struct row_vec;

template <> struct row_vec<MI_KV_BF16> {
    static constexpr int ELEMS = 8;
    __device__ static void decode(uint4 w, const float *, float, bf16 *dst) { *(uint4 *)dst = w; }
};

template <> struct row_vec<MI_KV_F16> {
    static constexpr int ELEMS = 8;
    __device__ static void decode(uint4 w, const float *, float, bf16 *dst) {
        const __half *h = (const __half *)&w;
        __align__(16) bf16 o[8];
#pragma unroll
        for (int i = 0; i < 8; i++) o[i] = __float2bfloat16_rn(__half2float(h[i]));
        *(uint4 *)dst = *(const uint4 *)o;
    }
};

template <> struct row_vec<MI_KV_FP8_E4M3> {
    static constexpr int ELEMS = 16;
    __device__ static void decode(uint4 w, const float *c, float s, bf16 *dst) {
        const unsigned char *b = (const unsigned char *)&w;
        __align__(16) bf16 o[16];
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const __half_raw r = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b[i], __NV_E4M3);
            const float x = __half2float(__half(r));
            o[i] = __float2bfloat16_rn(__fadd_rn(c[i], __fmul_rn(x, s)));
        }
        *(uint4 *)dst = *(const uint4 *)o;
        *(uint4 *)(dst + 8) = *(const uint4 *)(o + 8);
    }
};

struct page_geom {
    int32_t n_kv, hd;
    int64_t row_stride, head_stride, k_offset, v_offset, scale_offset, center_offset;
};

template <int KIND>
__global__ void __launch_bounds__(PAGE_THREADS)
    pages_to_rows_kernel(const mim_page_job *jobs, page_geom g, bf16 *k, bf16 *v, int64_t kvd) {
    typedef row_vec<KIND> V;
    __shared__ float centre[PAGE_MAX_HD];
    const mim_page_job j = jobs[blockIdx.x];
    const int h = blockIdx.y, kv = blockIdx.z;
    const unsigned char *src = j.page + (kv ? g.v_offset : g.k_offset) + h * g.head_stride;
    bf16 *dst = (kv ? v : k) + j.row0 * kvd + (int64_t)h * g.hd;
    float s = 1.0f;
    if (KIND == MI_KV_FP8_E4M3) {
        s = ((const float *)(j.page + g.scale_offset))[kv * g.n_kv + h];
        const uint16_t *c =
            (const uint16_t *)(j.page + g.center_offset) + ((int64_t)kv * g.n_kv + h) * g.hd;
        for (int d = threadIdx.x; d < g.hd; d += blockDim.x)
            centre[d] = __uint_as_float((uint32_t)c[d] << 16);
        __syncthreads();
    }
    const int per_row = g.hd / V::ELEMS, total = j.rows * per_row;
    for (int i = threadIdx.x; i < total; i += blockDim.x) {
        const int r = i / per_row, c0 = (i - r * per_row) * V::ELEMS;
        const uint4 w = *(const uint4 *)(src + r * g.row_stride + (int64_t)c0 * 16 / V::ELEMS);
        V::decode(w, centre + c0, s, dst + r * kvd + c0);
    }
}

} // namespace

bool mim_pages_decodable(const mi_kv_page_layout *lay) {
    const int elems = lay->dtype == MI_KV_FP8_E4M3 ? 16 : 8;
    return (lay->dtype == MI_KV_BF16 || lay->dtype == MI_KV_F16 || lay->dtype == MI_KV_FP8_E4M3) &&
           lay->head_dim > 0 && lay->head_dim <= PAGE_MAX_HD && lay->head_dim % elems == 0 &&
           lay->row_stride % 16 == 0 && lay->head_stride % 16 == 0 && lay->v_offset % 16 == 0 &&
           lay->k_offset % 16 == 0;
}

bool mim_host_is_pinned(const void *p) {
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeHost && a.devicePointer == p;
}

cudaError_t mim_pages_to_rows(const mim_page_job *jobs, int n_jobs, const mi_kv_page_layout *lay,
                              bf16 *k, bf16 *v, int64_t kvd, cudaStream_t stream) {
    if (n_jobs <= 0) return cudaSuccess;
    page_geom g;
    g.n_kv = lay->n_kv_heads, g.hd = lay->head_dim;
    g.row_stride = (int64_t)lay->row_stride, g.head_stride = (int64_t)lay->head_stride;
    g.k_offset = (int64_t)lay->k_offset, g.v_offset = (int64_t)lay->v_offset;
    g.scale_offset = (int64_t)lay->scale_offset, g.center_offset = (int64_t)lay->center_offset;
    const dim3 grid((unsigned)n_jobs, (unsigned)lay->n_kv_heads, 2);
    switch (lay->dtype) {
    case MI_KV_BF16:
        pages_to_rows_kernel<MI_KV_BF16><<<grid, PAGE_THREADS, 0, stream>>>(jobs, g, k, v, kvd);
        break;
    case MI_KV_F16:
        pages_to_rows_kernel<MI_KV_F16><<<grid, PAGE_THREADS, 0, stream>>>(jobs, g, k, v, kvd);
        break;
    case MI_KV_FP8_E4M3:
        pages_to_rows_kernel<MI_KV_FP8_E4M3><<<grid, PAGE_THREADS, 0, stream>>>(jobs, g, k, v, kvd);
        break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

void *mim_pinned_alloc(void *user, size_t bytes) {
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable | cudaHostAllocMapped) == cudaSuccess)
        return p;
    (void)cudaGetLastError(); /* out of pinned memory is not sticky */
    /* pageable memory still holds the pages; uploads then go through the host */
    p = aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (p && user) __atomic_add_fetch((int *)user, 1, __ATOMIC_RELAXED);
    return p;
}

void mim_pinned_free(void *user, void *ptr, size_t bytes) {
    (void)user, (void)bytes;
    if (!ptr) return;
    if (mim_host_is_pinned(ptr))
        cudaFreeHost(ptr);
    else
        free(ptr);
}
