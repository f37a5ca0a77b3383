/*
 * model_gpu_pages.h: the device reads a session's host pages itself (model_gpu_pages.cu).
 *
 * A session pool of a CUDA model takes its slabs from pinned, mapped host memory (unless the
 * model was loaded with kv_pinned), so a kernel can read any page over the bus: an upload is
 * one launch per layer over a list of pages, the rows decoded on the device (bf16 copied, f16
 * and fp8 converted) into the bf16 cache. The bus carries the pages as stored: an fp8 page is
 * half the bytes of its bf16 rows, and no host core converts anything.
 */
#ifndef MI_MODEL_GPU_PAGES_H
#define MI_MODEL_GPU_PAGES_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>

extern "C" {
#include "minference_kv.h"
}

/* One page of one layer to upload: its base, the cache row of its row 0, its rows. */
struct mim_page_job {
    const unsigned char *page;
    int64_t row0;
    int32_t rows, pad;
};

/* Whether the device can decode pages of this layout (bf16, f16, fp8 e4m3; head_dim at most
 * 256, rows a whole number of 16-byte vectors). */
bool mim_pages_decodable(const mi_kv_page_layout *lay);

/* Whether `p` lies in pinned host memory that the device can address. */
bool mim_host_is_pinned(const void *p);

/* Decodes the jobs' rows (jobs in device memory) into k and v, [row][kvd] bf16 with the rows
 * of KV head h at column h * head_dim, on `stream`. */
cudaError_t mim_pages_to_rows(const mim_page_job *jobs, int n_jobs, const mi_kv_page_layout *lay,
                              __nv_bfloat16 *k, __nv_bfloat16 *v, int64_t kvd, cudaStream_t stream);

/* The pool allocator: pinned, mapped memory, or where that fails pageable memory, counted in
 * *(int *)user (may be NULL). */
void *mim_pinned_alloc(void *user, size_t bytes);
void mim_pinned_free(void *user, void *ptr, size_t bytes);

#endif /* MI_MODEL_GPU_PAGES_H */
