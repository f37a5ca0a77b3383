/*
 * backend.h: the interface every compute backend implements.
 *
 * The public entry points in src/core/api.c validate their arguments, then call the backend of
 * the context's device through these functions. Arguments arriving here are already checked:
 * shapes agree, pointers are non-NULL where required, scale is resolved (> 0), budgets clamped.
 * src/cpu implements mi_cpu_*; src/cuda implements mi_cuda_* (a CPU-only build links
 * src/core/cuda_absent.c instead, which answers MI_STATUS_NOT_BUILT).
 *
 * Both backends must give the same result up to rounding: the CPU backend is the reference the
 * GPU tests compare against.
 */
#ifndef MI_BACKEND_H
#define MI_BACKEND_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MI_BACKEND_DECLARE(prefix)                                                                 \
    mi_status prefix##attention_dense(                                                             \
        mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q, const mi_tensor *k,           \
        const mi_tensor *v, const int32_t *seq_lens, float scale, mi_tensor *out, float *lse);     \
    mi_status prefix##attention_a_shape(                                                           \
        mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q, const mi_tensor *k,           \
        const mi_tensor *v, const int32_t *seq_lens, int32_t n_init, int32_t n_local,              \
        int32_t n_last, float scale, mi_tensor *out, float *lse);                                  \
    mi_status prefix##vs_estimate(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,     \
                                  const mi_tensor *k, const int32_t *seq_lens,                     \
                                  const int32_t *vertical_size, const int32_t *slash_size,         \
                                  const mi_vs_params *params, float scale, mi_vs_index *index);    \
    mi_status prefix##vs_build_index(mi_context *ctx, int64_t L, const int32_t *seq_lens,          \
                                     const mi_vs_index *vs, mi_sparse_index *index);               \
    mi_status prefix##block_sparse_estimate(                                                       \
        mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q, const mi_tensor *k,           \
        const int32_t *seq_lens, const int32_t *top_k, mi_sparse_index *index);                    \
    mi_status prefix##attention_sparse(mi_context *ctx, const mi_attn_shape *s,                    \
                                       const mi_tensor *q, const mi_tensor *k, const mi_tensor *v, \
                                       const int32_t *seq_lens, const mi_sparse_index *index,      \
                                       float scale, mi_tensor *out, float *lse);                   \
    mi_status prefix##prefill_workspace_size(mi_context *ctx, const mi_attn_shape *s,              \
                                             const mi_head_pattern *patterns,                      \
                                             const mi_prefill_params *params, size_t *bytes);      \
    mi_status prefix##prefill_attention(                                                           \
        mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q, const mi_tensor *k,           \
        const mi_tensor *v, const int32_t *seq_lens, const mi_head_pattern *patterns,              \
        const mi_prefill_params *params, mi_tensor *out, float *lse, void *workspace,              \
        size_t workspace_size);

MI_BACKEND_DECLARE(mi_cpu_)
MI_BACKEND_DECLARE(mi_cuda_)

/* CUDA context hooks (cuda_absent.c answers NOT_BUILT / 0). */
mi_status mi_cuda_context_init(mi_context *ctx);
void mi_cuda_context_release(mi_context *ctx);
mi_status mi_cuda_synchronize(mi_context *ctx);
int mi_cuda_devices(void);
const char *mi_cuda_features(void); /* e.g. "cuda(sm_90a,sm_80)" or "" */

/* ---- CPU-only metrics (src/cpu/metrics.c) ---- */
mi_status mi_cpu_metrics_evaluate(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                                  const mi_tensor *k, const int32_t *seq_lens,
                                  const mi_head_pattern *patterns, const mi_prefill_params *params,
                                  mi_head_metrics *out);
mi_status mi_cpu_metrics_rel_l2(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *out,
                                const mi_tensor *ref, const int32_t *seq_lens, double *rel_err);

#ifdef __cplusplus
}
#endif

#endif /* MI_BACKEND_H */
