/*
 * cuda_kernels.h: the flat parameter blocks the C++ launchers of src/cuda take. Kept apart from
 * the public API so that one attention kernel serves dense, A-shape, Tri-shape and sparse heads
 * (and a whole layer that mixes them, in one launch).
 */
#ifndef MI_CUDA_KERNELS_H
#define MI_CUDA_KERNELS_H

#include <stdint.h>

#include "../core/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sequence lengths travel by value in the parameter block: no device copy, no allocation. */
#define MI_CUDA_MAX_BATCH 256
/* Per-head modes and budgets travel the same way (kernel parameters hold up to 32 KB). */
#define MI_CUDA_MAX_HEADS 256

enum {
    MI_CUDA_MODE_DENSE = 0,
    MI_CUDA_MODE_A_SHAPE = 1, /* also Tri-shape (n_last > 0) */
    MI_CUDA_MODE_SPARSE = 2,  /* consumes an mi_sparse_index */
    MI_CUDA_MODE_NONE = 3,    /* head skipped by this launch unless dense by dense_below */
};

/* Per-head mode of a mixed launch: {mode, n_init, n_local, n_last}, and the length below which
 * the head runs dense instead (0: never; dense_fallback.h). */
typedef struct mi_cuda_head_mode {
    int32_t mode, n_init, n_local, n_last;
    int32_t dense_below;
} mi_cuda_head_mode;

typedef struct mi_cuda_attn_params {
    const void *q, *k, *v;
    void *o;
    float *lse;                                                 /* [B, H, L] or NULL */
    int64_t q_stride[3], k_stride[3], v_stride[3], o_stride[3]; /* b, h, l in elements */
    int32_t batch, heads, heads_kv, group, len, head_dim;
    /* Queries at an offset: q, o and lse hold the rows from position q_off on (len - q_off of
     * them), keys 0..len-1; row blocks stay aligned to absolute positions. 0 elsewhere. Runs on
     * the portable kernel only (no Tri-shape split). */
    int32_t q_off;
    mi_dtype dtype;
    float scale_log2; /* softmax scale * log2(e) */
    /* Uniform mode (when head_modes is NULL) */
    mi_cuda_head_mode mode;
    int32_t use_head_modes; /* 0: every head runs `mode` */
    /* Sparse index (device), used by MI_CUDA_MODE_SPARSE heads */
    const int32_t *block_count, *block_offset, *column_count, *column_index;
    int32_t row_blocks, max_blocks, max_columns;
    /* NULL, or (the sm_90a ring kernel only) a device flag per (b, h) = b * heads + h: nonzero
     * where the warp-specialised sparse kernel ran the head, which the ring kernel then skips */
    const int32_t *sm90_taken;
    int32_t seq_lens[MI_CUDA_MAX_BATCH];
    mi_cuda_head_mode head_modes[MI_CUDA_MAX_HEADS];
} mi_cuda_attn_params;

/* Points the kernel's sparse-index fields at a (device) index. */
static inline void mi_cuda_attn_use_index(mi_cuda_attn_params *p, const mi_sparse_index *index) {
    p->block_count = index->block_count;
    p->block_offset = index->block_offset;
    p->column_count = index->column_count;
    p->column_index = index->column_index;
    p->row_blocks = index->row_blocks;
    p->max_blocks = index->max_blocks;
    p->max_columns = index->max_columns;
}

/* Runs the attention kernel; block_m 64 (any mode) or 128 (dense only) on the portable path (the
 * sm_90a path always runs 64-row blocks). */
mi_status mi_cuda_attn_run(mi_context *ctx, const mi_cuda_attn_params *p, int block_m);

/* Fills the sequence-length and stride fields shared by every launcher. */
mi_status mi_cuda_fill_attn_params(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                                   const mi_tensor *k, const mi_tensor *v, const mi_tensor *out,
                                   const int32_t *seq_lens, float scale, float *lse,
                                   mi_cuda_attn_params *p);

/* Vertical-slash estimation over the heads whose active[h] != 0 (active may be NULL: all).
 * scratch: mi_cuda_vs_scratch_bytes() bytes of device memory. */
size_t mi_cuda_vs_scratch_bytes(int64_t batch, int64_t heads, int64_t len);
mi_status mi_cuda_vs_estimate_run(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                                  const mi_tensor *k, const int32_t *seq_lens,
                                  const int32_t *vertical_size, const int32_t *slash_size,
                                  const mi_vs_params *params, float scale, const uint8_t *active,
                                  int32_t dense_below, void *scratch, mi_vs_index *index);

/* The estimate's first two passes alone: per active (b, h), the softmax probabilities of the last
 * min(64, len - q_off) queries against every key summed per key (*vert) and per diagonal
 * (*slash, index len - 1 - distance), [B H][len] floats at the start of scratch
 * (mi_cuda_vs_sums_bytes() of it). FlexPrefill's estimate starts from them. */
size_t mi_cuda_vs_sums_bytes(int64_t batch, int64_t heads, int64_t len);
mi_status mi_cuda_vs_sums_run(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                              const mi_tensor *k, const int32_t *seq_lens, float scale,
                              const uint8_t *active, int32_t dense_below, void *scratch,
                              const float **vert, const float **slash);

/* Index conversion; `sorted` = the vs sets are known ascending / descending, unique, in range
 * (as the estimator writes them), which skips the sort. active: host [H] or NULL. Row blocks
 * that end at or before first_row (queries at an offset) are left unwritten. */
mi_status mi_cuda_vs_index_run(mi_context *ctx, int64_t L, int64_t first_row,
                               const int32_t *seq_lens, const mi_vs_index *vs, int sorted,
                               const uint8_t *active, int32_t dense_below, mi_sparse_index *index);

/* Block-sparse estimation; scratch: mi_cuda_bs_scratch_bytes(). */
size_t mi_cuda_bs_scratch_bytes(const mi_context *ctx, int64_t batch, int64_t heads,
                                int64_t heads_kv, int64_t len, int64_t head_dim);
mi_status mi_cuda_bs_estimate_run(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                                  const mi_tensor *k, const int32_t *seq_lens, const int32_t *top_k,
                                  const uint8_t *active, int32_t dense_below, void *scratch,
                                  mi_sparse_index *index);

/* XAttention's estimate (xattn_estimate.cu) over the heads whose active[h] != 0: stride and
 * threshold per head, into an index of R = ceil(len / 64) row blocks of up to R blocks. scratch:
 * at least mi_cuda_xattn_scratch_bytes(1, len) bytes; `pairs` (b, h) pairs go per launch as the
 * scratch allows. */
size_t mi_cuda_xattn_scratch_bytes(int64_t pairs, int64_t len);
mi_status mi_cuda_xattn_estimate_run(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                                     const mi_tensor *k, const int32_t *seq_lens,
                                     const int32_t *stride, const int32_t *threshold, float scale,
                                     const uint8_t *active, int32_t dense_below, void *scratch,
                                     size_t scratch_bytes, mi_sparse_index *index);

/* The dilated and strided heads (rowmask.cu; CPU reference: src/cpu/rowmask.c): every query row
 * of each head whose plan's kernel is MI_PLAN_KERNEL_ROWMASK and that does not run dense at its
 * sequence's length (mi_head_plan_dense_at), its keys by the plan's rule, into out and lse
 * (device [B, H, len - q_off] or NULL); other heads' rows are not touched. heads: host [H];
 * seq_lens: host [B] or NULL. */
struct mi_head_plan;
mi_status mi_cuda_rowmask_run(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                              const mi_tensor *k, const mi_tensor *v, const int32_t *seq_lens,
                              const struct mi_head_plan *heads, float scale, mi_tensor *out,
                              float *lse);

/* FlexPrefill's estimate (flex_estimate.cu; CPU reference: src/cpu/flex_estimate.c) over the
 * heads whose active[h] != 0: gamma and tau per mille per head, into an index of
 * R = ceil(len / 64) row blocks of up to R blocks. scratch: mi_cuda_flex_scratch_bytes(). */
size_t mi_cuda_flex_scratch_bytes(int64_t batch, int64_t heads, int64_t heads_kv, int64_t len,
                                  int64_t head_dim);
mi_status mi_cuda_flex_estimate_run(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                                    const mi_tensor *k, const int32_t *seq_lens,
                                    const int32_t *gamma, const int32_t *tau, float scale,
                                    const uint8_t *active, int32_t dense_below, void *scratch,
                                    size_t scratch_bytes, mi_sparse_index *index);

#ifdef __cplusplus
}
#endif

#endif /* MI_CUDA_KERNELS_H */
