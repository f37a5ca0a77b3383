/* metrics_api.c: public entry points of the evaluation metrics (computed on the CPU). */
#include "backend.h"

mi_status mi_metrics_evaluate(mi_context *ctx, const mi_tensor *q, const mi_tensor *k,
                              const int32_t *seq_lens, const mi_head_pattern *patterns,
                              const mi_prefill_params *params, mi_head_metrics *out) {
    mi_attn_shape s;
    if (!ctx) return MI_STATUS_INVALID_ARGUMENT;
    mi_clear_error(ctx);
    if (ctx->params.device != MI_DEVICE_CPU)
        return mi_fail(ctx, MI_STATUS_UNSUPPORTED, "metrics are computed on CPU contexts");
    if (!k || !patterns || !out)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "k, patterns and out are required");
    mi_status st = mi_check_attention(ctx, q, k, NULL, NULL, seq_lens, &s);
    if (st != MI_STATUS_SUCCESS) return st;
    st = mi_check_patterns(ctx, patterns, s.heads_q);
    if (st != MI_STATUS_SUCCESS) return st;
    mi_prefill_params p = params ? *params : mi_prefill_default_params();
    st = mi_check_prefill_params(ctx, &p);
    if (st != MI_STATUS_SUCCESS) return st;
    p.softmax_scale = mi_resolve_scale(p.softmax_scale, s.head_dim);
    return mi_cpu_metrics_evaluate(ctx, &s, q, k, seq_lens, patterns, &p, out);
}

mi_status mi_metrics_rel_l2(mi_context *ctx, const mi_tensor *out, const mi_tensor *ref,
                            const int32_t *seq_lens, double *rel_err) {
    if (!ctx) return MI_STATUS_INVALID_ARGUMENT;
    mi_clear_error(ctx);
    if (!rel_err) return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "rel_err is NULL");
    if (ctx->params.device != MI_DEVICE_CPU)
        return mi_fail(ctx, MI_STATUS_UNSUPPORTED, "metrics are computed on CPU contexts");
    mi_status st = mi_check_tensor(ctx, out, "out");
    if (st == MI_STATUS_SUCCESS) st = mi_check_tensor(ctx, ref, "ref");
    if (st != MI_STATUS_SUCCESS) return st;
    /* Both operands are only read, so out and ref may be the same buffer. */
    for (int i = 0; i < 4; i++)
        if (out->shape[i] != ref->shape[i])
            return mi_fail(ctx, MI_STATUS_SHAPE_MISMATCH,
                           "out and ref differ in dim %d (%lld vs %lld)", i,
                           (long long)out->shape[i], (long long)ref->shape[i]);
    if (out->dtype != ref->dtype)
        return mi_fail(ctx, MI_STATUS_SHAPE_MISMATCH, "out is %s but ref is %s",
                       mi_dtype_name(out->dtype), mi_dtype_name(ref->dtype));
    if (out->device != MI_DEVICE_CPU || ref->device != MI_DEVICE_CPU)
        return mi_fail(ctx, MI_STATUS_UNSUPPORTED, "metrics read CPU tensors only");
    mi_attn_shape s;
    st = mi_check_attention(ctx, out, NULL, NULL, NULL, seq_lens, &s);
    if (st != MI_STATUS_SUCCESS) return st;
    return mi_cpu_metrics_rel_l2(ctx, &s, out, ref, seq_lens, rel_err);
}
