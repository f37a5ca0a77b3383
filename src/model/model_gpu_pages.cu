/*
 * model_gpu_pages.cu: session pages decoded on the device (see model_gpu_pages.h).
 *
 * One CTA per (page, KV head, K or V) reads the head's rows as 16-byte vectors straight from
 * pinned host memory and writes bf16 rows into the cache. The values equal the host reader's
 * (kv_rows_decode, then the f32 -> bf16 rounding of mi_kv_seq_read): model_gpu_pages.cuh
 * decodes to f32 exactly, bf16 rows are copied and the others rounded to nearest even once.
 */
#include "model_gpu_pages.h"

#include "model_gpu_pages.cuh"

#include <stdlib.h>

typedef __nv_bfloat16 bf16;

namespace {

const int PAGE_MAX_HD = 256;
const int PAGE_THREADS = 128;

template <int KIND>
__global__ void __launch_bounds__(PAGE_THREADS)
    pages_to_rows_kernel(const mim_page_job *jobs, page_geom g, bf16 *k, bf16 *v, int64_t kvd) {
    typedef page_vec<KIND> V;
    __shared__ float centre[PAGE_MAX_HD];
    const mim_page_job j = jobs[blockIdx.x];
    const int h = blockIdx.y, kv = blockIdx.z;
    float s;
    const unsigned char *src = page_head_rows<KIND>(j.page, g, h, kv, centre, &s);
    __syncthreads();
    bf16 *dst = (kv ? v : k) + j.row0 * kvd + (int64_t)h * g.hd;
    const int per_row = g.hd / V::ELEMS, total = j.rows * per_row;
    for (int i = threadIdx.x; i < total; i += blockDim.x) {
        const int r = i / per_row, c0 = (i - r * per_row) * V::ELEMS;
        const uint4 w = *(const uint4 *)(src + r * g.row_stride + (int64_t)c0 * 16 / V::ELEMS);
        V::to_bf16(w, centre + c0, s, dst + r * kvd + c0);
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
    const page_geom g = page_geom_of(lay);
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
