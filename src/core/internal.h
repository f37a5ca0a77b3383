/*
 * internal.h: what every part of the library shares and callers never see: the context's
 * layout, error reporting, and the validated shape of an attention call.
 */
#ifndef MI_INTERNAL_H
#define MI_INTERNAL_H

#include "minference.h"
#include "minference_tools.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MI_ERROR_CAPACITY 1024

struct mi_context {
    mi_context_params params;
    int n_threads;
    void *stream;     /* cudaStream_t on CUDA contexts */
    mi_tuning tuning; /* the backends' choices (zero: their own heuristics) */
    char last_error[MI_ERROR_CAPACITY];
};

/* Records a formatted message on ctx (which may be NULL) and returns status, so that callers
 * write `return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "q is NULL");`. */
mi_status mi_fail(mi_context *ctx, mi_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
void mi_clear_error(mi_context *ctx);

/* The validated geometry of an attention call. */
typedef struct mi_attn_shape {
    int64_t batch, heads_q, heads_kv, len, head_dim; /* len: keys (and query positions) */
    int64_t group;                                   /* heads_q / heads_kv */
    mi_dtype dtype;
    mi_device_type device;
    /* Queries at an offset (mi_prefill_attention only): q holds the last len - q_off positions,
     * query row i sitting at absolute position q_off + i; 0 everywhere else. */
    int64_t q_off;
} mi_attn_shape;

/* Validates a single tensor descriptor: non-NULL data, known dtype, positive shape, stride[3]==1,
 * non-negative strides. `name` appears in the message. */
mi_status mi_check_tensor(mi_context *ctx, const mi_tensor *t, const char *name);

/* Validates q (and optionally k, v, out: NULL to skip) for an attention call and fills shape:
 * matching B, L, D, dtype and device, H_q % H_kv == 0, out shaped like q, device equal to the
 * context's, seq_lens in [0, L]. */
mi_status mi_check_attention(mi_context *ctx, const mi_tensor *q, const mi_tensor *k,
                             const mi_tensor *v, const mi_tensor *out, const int32_t *seq_lens,
                             mi_attn_shape *shape);

/* Per-head patterns [H]: known types, no negative budget. */
mi_status mi_check_patterns(mi_context *ctx, const mi_head_pattern *patterns, int64_t H);
/* Prefill parameters: finite scale, valid vertical-slash estimation parameters. */
mi_status mi_check_prefill_params(mi_context *ctx, const mi_prefill_params *p);

/* Valid length of sequence b. */
static inline int64_t mi_seq_len(const int32_t *seq_lens, int64_t b, int64_t L) {
    return seq_lens ? (int64_t)seq_lens[b] : L;
}

static inline float mi_resolve_scale(float scale, int64_t head_dim) {
    return scale > 0.0f ? scale : (float)(1.0 / sqrt((double)head_dim));
}

#ifdef __cplusplus
}
#endif

#endif /* MI_INTERNAL_H */
