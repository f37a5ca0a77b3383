/* cuda_absent.c: the CUDA backend of a build without nvcc. Every entry answers NOT_BUILT, so a
 * CPU-only library still links and tells the caller clearly what is missing. */
#include "backend.h"

#define MI_NOT_BUILT(ctx)                                                                          \
    mi_fail((ctx), MI_STATUS_NOT_BUILT, "this build of libminference has no CUDA support")

mi_status mi_cuda_context_init(mi_context *ctx) { return MI_NOT_BUILT(ctx); }
void mi_cuda_context_release(mi_context *ctx) { (void)ctx; }
mi_status mi_cuda_synchronize(mi_context *ctx) { return MI_NOT_BUILT(ctx); }
int mi_cuda_devices(void) { return 0; }
const char *mi_cuda_features(void) { return ""; }

mi_status mi_cuda_attention_dense(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                                  const mi_tensor *k, const mi_tensor *v, const int32_t *seq_lens,
                                  float scale, mi_tensor *out, float *lse) {
    (void)s, (void)q, (void)k, (void)v, (void)seq_lens, (void)scale, (void)out, (void)lse;
    return MI_NOT_BUILT(ctx);
}

mi_status mi_cuda_attention_a_shape(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                                    const mi_tensor *k, const mi_tensor *v, const int32_t *seq_lens,
                                    int32_t n_init, int32_t n_local, int32_t n_last, float scale,
                                    mi_tensor *out, float *lse) {
    (void)s, (void)q, (void)k, (void)v, (void)seq_lens, (void)n_init, (void)n_local;
    (void)n_last, (void)scale, (void)out, (void)lse;
    return MI_NOT_BUILT(ctx);
}

mi_status mi_cuda_vs_estimate(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                              const mi_tensor *k, const int32_t *seq_lens,
                              const int32_t *vertical_size, const int32_t *slash_size,
                              const mi_vs_params *params, float scale, mi_vs_index *index) {
    (void)s, (void)q, (void)k, (void)seq_lens, (void)vertical_size, (void)slash_size;
    (void)params, (void)scale, (void)index;
    return MI_NOT_BUILT(ctx);
}

mi_status mi_cuda_vs_build_index(mi_context *ctx, int64_t L, const int32_t *seq_lens,
                                 const mi_vs_index *vs, mi_sparse_index *index) {
    (void)L, (void)seq_lens, (void)vs, (void)index;
    return MI_NOT_BUILT(ctx);
}

mi_status mi_cuda_block_sparse_estimate(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                                        const mi_tensor *k, const int32_t *seq_lens,
                                        const int32_t *top_k, mi_sparse_index *index) {
    (void)s, (void)q, (void)k, (void)seq_lens, (void)top_k, (void)index;
    return MI_NOT_BUILT(ctx);
}

mi_status mi_cuda_attention_sparse(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                                   const mi_tensor *k, const mi_tensor *v, const int32_t *seq_lens,
                                   const mi_sparse_index *index, float scale, mi_tensor *out,
                                   float *lse) {
    (void)s, (void)q, (void)k, (void)v, (void)seq_lens, (void)index, (void)scale, (void)out;
    (void)lse;
    return MI_NOT_BUILT(ctx);
}

mi_status mi_cuda_prefill_workspace_size(mi_context *ctx, const mi_attn_shape *s,
                                         const mi_head_pattern *patterns,
                                         const mi_prefill_params *params, size_t *bytes) {
    (void)s, (void)patterns, (void)params, (void)bytes;
    return MI_NOT_BUILT(ctx);
}

mi_status mi_cuda_prefill_attention(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                                    const mi_tensor *k, const mi_tensor *v, const int32_t *seq_lens,
                                    const mi_head_pattern *patterns,
                                    const mi_prefill_params *params, mi_tensor *out, float *lse,
                                    void *workspace, size_t workspace_size) {
    (void)s, (void)q, (void)k, (void)v, (void)seq_lens, (void)patterns, (void)params;
    (void)out, (void)lse, (void)workspace, (void)workspace_size;
    return MI_NOT_BUILT(ctx);
}
