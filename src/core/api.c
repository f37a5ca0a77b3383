/*
 * api.c: the public kernel entry points. Each validates every argument, so that a caller's
 * mistake becomes a status and a message, then hands the call to the backend of the context's
 * device. Backends may assume what is checked here.
 */
#include "backend.h"
#include "pattern_table.h"

#include <stdint.h>
#include <string.h>

#define MI_MAX_HEAD_DIM 256

#define MI_DISPATCH(ctx, fn, ...)                                                                  \
    ((ctx)->params.device == MI_DEVICE_CUDA ? mi_cuda_##fn(ctx, __VA_ARGS__)                       \
                                            : mi_cpu_##fn(ctx, __VA_ARGS__))

mi_status mi_check_tensor(mi_context *ctx, const mi_tensor *t, const char *name) {
    if (!t) return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "%s is NULL", name);
    if (!t->data) return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "%s->data is NULL", name);
    if (mi_dtype_size(t->dtype) == 0)
        return mi_fail(ctx, MI_STATUS_UNSUPPORTED, "%s has unknown dtype %d", name, (int)t->dtype);
    if (t->device != MI_DEVICE_CPU && t->device != MI_DEVICE_CUDA)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "%s has unknown device %d", name,
                       (int)t->device);
    for (int i = 0; i < 4; i++) {
        if (t->shape[i] <= 0 || t->shape[i] > INT32_MAX)
            return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "%s->shape[%d] = %lld is out of range",
                           name, i, (long long)t->shape[i]);
        if (t->stride[i] < 0)
            return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "%s->stride[%d] is negative", name, i);
    }
    if (t->stride[3] != 1)
        return mi_fail(ctx, MI_STATUS_UNSUPPORTED,
                       "%s: the head dimension must be contiguous (stride[3] = %lld)", name,
                       (long long)t->stride[3]);
    return MI_STATUS_SUCCESS;
}

/* With at_offset, k and v may be longer than q (queries at an offset, the last q_len positions
 * of the keys); shape->len is then the key length and shape->q_off = k_len - q_len. */
static mi_status check_attention(mi_context *ctx, const mi_tensor *q, const mi_tensor *k,
                                 const mi_tensor *v, const mi_tensor *out, const int32_t *seq_lens,
                                 bool at_offset, mi_attn_shape *shape) {
    mi_status st;
    if ((st = mi_check_tensor(ctx, q, "q")) != MI_STATUS_SUCCESS) return st;
    if (k && (st = mi_check_tensor(ctx, k, "k")) != MI_STATUS_SUCCESS) return st;
    if (v && (st = mi_check_tensor(ctx, v, "v")) != MI_STATUS_SUCCESS) return st;
    if (out && (st = mi_check_tensor(ctx, out, "out")) != MI_STATUS_SUCCESS) return st;

    const int64_t B = q->shape[0], Hq = q->shape[1], L = q->shape[2], D = q->shape[3];
    if (q->device != ctx->params.device)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT,
                       "q is on the %s but the context is on the %s",
                       q->device == MI_DEVICE_CUDA ? "GPU" : "CPU",
                       ctx->params.device == MI_DEVICE_CUDA ? "GPU" : "CPU");
    if (D > MI_MAX_HEAD_DIM)
        return mi_fail(ctx, MI_STATUS_UNSUPPORTED, "head_dim %lld > %d is not supported",
                       (long long)D, MI_MAX_HEAD_DIM);
    const mi_tensor *kv[3] = {k, v, out};
    const char *names[3] = {"k", "v", "out"};
    int64_t Hkv = Hq;
    for (int i = 0; i < 3; i++) {
        const mi_tensor *t = kv[i];
        if (!t) continue;
        if (t->dtype != q->dtype)
            return mi_fail(ctx, MI_STATUS_SHAPE_MISMATCH, "%s is %s but q is %s", names[i],
                           mi_dtype_name(t->dtype), mi_dtype_name(q->dtype));
        if (t->device != q->device)
            return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "%s and q are on different devices",
                           names[i]);
        const int64_t Lt = at_offset && i < 2 && k ? k->shape[2] : L; /* out is shaped like q */
        if (t->shape[0] != B || t->shape[2] != Lt || t->shape[3] != D)
            return mi_fail(ctx, MI_STATUS_SHAPE_MISMATCH,
                           "%s is [%lld, %lld, %lld, %lld] but q is [%lld, %lld, %lld, %lld]",
                           names[i], (long long)t->shape[0], (long long)t->shape[1],
                           (long long)t->shape[2], (long long)t->shape[3], (long long)B,
                           (long long)Hq, (long long)L, (long long)D);
        if (t->data == q->data && t != q && i == 2)
            return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "out may not alias q");
    }
    if (k) Hkv = k->shape[1];
    if (v && k && v->shape[1] != k->shape[1])
        return mi_fail(ctx, MI_STATUS_SHAPE_MISMATCH, "k has %lld heads but v has %lld",
                       (long long)k->shape[1], (long long)v->shape[1]);
    if (v && !k) Hkv = v->shape[1];
    if (Hq % Hkv != 0)
        return mi_fail(ctx, MI_STATUS_SHAPE_MISMATCH,
                       "query heads (%lld) must be a multiple of KV heads (%lld)", (long long)Hq,
                       (long long)Hkv);
    if (out && out->shape[1] != Hq)
        return mi_fail(ctx, MI_STATUS_SHAPE_MISMATCH, "out has %lld heads but q has %lld",
                       (long long)out->shape[1], (long long)Hq);
    if (out && (out->data == (k ? k->data : NULL) || out->data == (v ? v->data : NULL)))
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "out may not alias k or v");
    const int64_t Lk = k ? k->shape[2] : L;
    if (Lk < L)
        return mi_fail(ctx, MI_STATUS_SHAPE_MISMATCH,
                       "k has %lld positions but q has %lld: queries are the last positions of the "
                       "keys",
                       (long long)Lk, (long long)L);
    if (Lk != L && seq_lens)
        return mi_fail(ctx, MI_STATUS_UNSUPPORTED,
                       "seq_lens with queries at an offset (q_len %lld < k_len %lld) is not "
                       "supported",
                       (long long)L, (long long)Lk);
    if (seq_lens) {
        for (int64_t b = 0; b < B; b++) {
            if (seq_lens[b] < 0 || seq_lens[b] > L)
                return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT,
                               "seq_lens[%lld] = %d is outside [0, %lld]", (long long)b,
                               (int)seq_lens[b], (long long)L);
        }
    }
    if (shape) {
        shape->batch = B;
        shape->heads_q = Hq;
        shape->heads_kv = Hkv;
        shape->len = Lk;
        shape->q_off = Lk - L;
        shape->head_dim = D;
        shape->group = Hq / Hkv;
        shape->dtype = q->dtype;
        shape->device = q->device;
    }
    return MI_STATUS_SUCCESS;
}

mi_status mi_check_attention(mi_context *ctx, const mi_tensor *q, const mi_tensor *k,
                             const mi_tensor *v, const mi_tensor *out, const int32_t *seq_lens,
                             mi_attn_shape *shape) {
    return check_attention(ctx, q, k, v, out, seq_lens, false, shape);
}

static mi_status check_ctx(mi_context *ctx) {
    if (!ctx) return MI_STATUS_INVALID_ARGUMENT;
    mi_clear_error(ctx);
    return MI_STATUS_SUCCESS;
}

static mi_status check_lse(mi_context *ctx, const float *lse) {
    if (lse && (uintptr_t)lse % sizeof(float))
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "lse is not 4-byte aligned");
    return MI_STATUS_SUCCESS;
}

static mi_status check_scale(mi_context *ctx, float scale) {
    if (scale != scale || scale > 1e30f)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "softmax scale is not finite");
    return MI_STATUS_SUCCESS;
}

#define MI_TRY(expr)                                                                               \
    do {                                                                                           \
        mi_status st_ = (expr);                                                                    \
        if (st_ != MI_STATUS_SUCCESS) return st_;                                                  \
    } while (0)

/* The checks every attention kernel call shares: context, operands, LSE buffer, scale. */
static mi_status check_attention_call(mi_context *ctx, const mi_tensor *q, const mi_tensor *k,
                                      const mi_tensor *v, const mi_tensor *out,
                                      const int32_t *seq_lens, const float *lse, float scale,
                                      mi_attn_shape *s) {
    MI_TRY(check_ctx(ctx));
    if (!k || !v || !out)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "k, v and out are required");
    MI_TRY(mi_check_attention(ctx, q, k, v, out, seq_lens, s));
    MI_TRY(check_lse(ctx, lse));
    return check_scale(ctx, scale);
}

mi_status mi_attention_dense(mi_context *ctx, const mi_tensor *q, const mi_tensor *k,
                             const mi_tensor *v, const int32_t *seq_lens, float scale,
                             mi_tensor *out, float *lse) {
    mi_attn_shape s;
    MI_TRY(check_attention_call(ctx, q, k, v, out, seq_lens, lse, scale, &s));
    scale = mi_resolve_scale(scale, s.head_dim);
    return MI_DISPATCH(ctx, attention_dense, &s, q, k, v, seq_lens, scale, out, lse);
}

mi_status mi_attention_a_shape(mi_context *ctx, const mi_tensor *q, const mi_tensor *k,
                               const mi_tensor *v, const int32_t *seq_lens, int32_t n_init,
                               int32_t n_local, int32_t n_last, float scale, mi_tensor *out,
                               float *lse) {
    mi_attn_shape s;
    MI_TRY(check_attention_call(ctx, q, k, v, out, seq_lens, lse, scale, &s));
    if (n_init < 0 || n_local < 0 || n_last < 0)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT,
                       "n_init (%d), n_local (%d) and n_last (%d) must be >= 0", (int)n_init,
                       (int)n_local, (int)n_last);
    scale = mi_resolve_scale(scale, s.head_dim);
    return MI_DISPATCH(ctx, attention_a_shape, &s, q, k, v, seq_lens, n_init, n_local, n_last,
                       scale, out, lse);
}

static mi_status check_vs_params(mi_context *ctx, const mi_vs_params *p) {
    if (p->last_q < 1 || p->forced_columns < 0 || p->forced_diagonals < 0 || p->min_vertical < 0 ||
        p->min_slash < 0)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT,
                       "vertical-slash params: last_q must be >= 1 and the others >= 0");
    return MI_STATUS_SUCCESS;
}

/* The budget a head really gets: the minimum applied, then clamped to the sequence. */
static int64_t clamp_budget(int64_t budget, int64_t minimum, int64_t len) {
    int64_t b = budget > minimum ? budget : minimum;
    return b < len ? b : len;
}

static mi_status check_vs_index(mi_context *ctx, const mi_vs_index *x, int64_t B, int64_t H) {
    if (!x) return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "vs index is NULL");
    if (!x->vertical_count || !x->slash_count || (!x->vertical_idx && x->max_vertical > 0) ||
        (!x->slash_idx && x->max_slash > 0))
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "vs index has NULL arrays");
    if (x->batch != B || x->heads != H)
        return mi_fail(ctx, MI_STATUS_SHAPE_MISMATCH,
                       "vs index is for batch %d x heads %d, the call has %lld x %lld",
                       (int)x->batch, (int)x->heads, (long long)B, (long long)H);
    if (x->max_vertical < 0 || x->max_slash < 0)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "vs index capacities are negative");
    return MI_STATUS_SUCCESS;
}

mi_status mi_vs_estimate(mi_context *ctx, const mi_tensor *q, const mi_tensor *k,
                         const int32_t *seq_lens, const int32_t *vertical_size,
                         const int32_t *slash_size, const mi_vs_params *params, float scale,
                         mi_vs_index *index) {
    mi_attn_shape s;
    MI_TRY(check_ctx(ctx));
    if (!k) return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "k is NULL");
    MI_TRY(mi_check_attention(ctx, q, k, NULL, NULL, seq_lens, &s));
    MI_TRY(check_scale(ctx, scale));
    if (!vertical_size || !slash_size)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT,
                       "vertical_size and slash_size are required");
    mi_vs_params p = params ? *params : mi_vs_default_params();
    MI_TRY(check_vs_params(ctx, &p));
    MI_TRY(check_vs_index(ctx, index, s.batch, s.heads_q));
    for (int64_t h = 0; h < s.heads_q; h++) {
        if (vertical_size[h] < 0 || slash_size[h] < 0)
            return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "head %lld has a negative budget",
                           (long long)h);
        const int64_t nv = clamp_budget(vertical_size[h], p.min_vertical, s.len);
        const int64_t ns = clamp_budget(slash_size[h], p.min_slash, s.len);
        if (nv > index->max_vertical || ns > index->max_slash)
            return mi_fail(ctx, MI_STATUS_WORKSPACE_TOO_SMALL,
                           "head %lld needs %lld columns and %lld diagonals but the index holds "
                           "%d and %d",
                           (long long)h, (long long)nv, (long long)ns, (int)index->max_vertical,
                           (int)index->max_slash);
    }
    scale = mi_resolve_scale(scale, s.head_dim);
    return MI_DISPATCH(ctx, vs_estimate, &s, q, k, seq_lens, vertical_size, slash_size, &p, scale,
                       index);
}

static mi_status check_sparse_index(mi_context *ctx, const mi_sparse_index *x, int64_t B, int64_t H,
                                    int64_t L) {
    if (!x) return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "sparse index is NULL");
    if (!x->block_count || !x->column_count || (!x->block_offset && x->max_blocks > 0) ||
        (!x->column_index && x->max_columns > 0))
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "sparse index has NULL arrays");
    const int64_t R = (L + MI_BLOCK_SIZE - 1) / MI_BLOCK_SIZE;
    if (x->batch != B || x->heads != H || x->row_blocks != R)
        return mi_fail(ctx, MI_STATUS_SHAPE_MISMATCH,
                       "sparse index is [%d, %d, %d row blocks], the call needs [%lld, %lld, %lld]",
                       (int)x->batch, (int)x->heads, (int)x->row_blocks, (long long)B, (long long)H,
                       (long long)R);
    if (x->max_blocks < 0 || x->max_columns < 0)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "sparse index capacities are negative");
    return MI_STATUS_SUCCESS;
}

mi_status mi_vs_build_index(mi_context *ctx, int64_t L, const int32_t *seq_lens,
                            const mi_vs_index *vs, mi_sparse_index *index) {
    MI_TRY(check_ctx(ctx));
    if (L <= 0 || L > INT32_MAX)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "L = %lld is out of range", (long long)L);
    if (!vs) return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "vs index is NULL");
    MI_TRY(check_vs_index(ctx, vs, vs->batch, vs->heads));
    if (vs->batch <= 0 || vs->heads <= 0)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "vs index has no (batch, head) entries");
    MI_TRY(check_sparse_index(ctx, index, vs->batch, vs->heads, L));
    if (seq_lens) {
        for (int32_t b = 0; b < vs->batch; b++)
            if (seq_lens[b] < 0 || seq_lens[b] > L)
                return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT,
                               "seq_lens[%d] = %d is outside [0, %lld]", (int)b, (int)seq_lens[b],
                               (long long)L);
    }
    const int64_t R = index->row_blocks;
    const int64_t need_blocks =
        (int64_t)vs->max_slash + 1 < R + 1 ? (int64_t)vs->max_slash + 1 : R + 1;
    const int64_t need_cols = vs->max_vertical < L ? vs->max_vertical : L;
    if (index->max_blocks < need_blocks || index->max_columns < need_cols)
        return mi_fail(ctx, MI_STATUS_WORKSPACE_TOO_SMALL,
                       "sparse index holds %d blocks and %d columns per row block; this vs index "
                       "needs %lld and %lld",
                       (int)index->max_blocks, (int)index->max_columns, (long long)need_blocks,
                       (long long)need_cols);
    if (ctx->params.device == MI_DEVICE_CPU) {
        /* Counts live in host memory here, so a corrupt count is caught instead of trusted. */
        const int64_t n = (int64_t)vs->batch * vs->heads;
        for (int64_t i = 0; i < n; i++)
            if (vs->vertical_count[i] < 0 || vs->vertical_count[i] > vs->max_vertical ||
                vs->slash_count[i] < 0 || vs->slash_count[i] > vs->max_slash)
                return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT,
                               "vs index entry %lld has counts outside its capacity", (long long)i);
    }
    return MI_DISPATCH(ctx, vs_build_index, L, seq_lens, vs, index);
}

mi_status mi_block_sparse_estimate(mi_context *ctx, const mi_tensor *q, const mi_tensor *k,
                                   const int32_t *seq_lens, const int32_t *top_k,
                                   mi_sparse_index *index) {
    mi_attn_shape s;
    MI_TRY(check_ctx(ctx));
    if (!k) return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "k is NULL");
    MI_TRY(mi_check_attention(ctx, q, k, NULL, NULL, seq_lens, &s));
    if (!top_k) return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "top_k is NULL");
    MI_TRY(check_sparse_index(ctx, index, s.batch, s.heads_q, s.len));
    const int64_t R = index->row_blocks;
    for (int64_t h = 0; h < s.heads_q; h++) {
        if (top_k[h] < 0)
            return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "top_k[%lld] is negative",
                           (long long)h);
        int64_t need = top_k[h] > 2 ? top_k[h] : 2; /* block 0 and the diagonal are forced */
        if (need > R) need = R;
        if (index->max_blocks < need)
            return mi_fail(ctx, MI_STATUS_WORKSPACE_TOO_SMALL,
                           "head %lld keeps up to %lld blocks but the index holds %d", (long long)h,
                           (long long)need, (int)index->max_blocks);
    }
    return MI_DISPATCH(ctx, block_sparse_estimate, &s, q, k, seq_lens, top_k, index);
}

mi_status mi_attention_sparse(mi_context *ctx, const mi_tensor *q, const mi_tensor *k,
                              const mi_tensor *v, const int32_t *seq_lens,
                              const mi_sparse_index *index, float scale, mi_tensor *out,
                              float *lse) {
    mi_attn_shape s;
    MI_TRY(check_attention_call(ctx, q, k, v, out, seq_lens, lse, scale, &s));
    MI_TRY(check_sparse_index(ctx, index, s.batch, s.heads_q, s.len));
    if (ctx->params.device == MI_DEVICE_CPU) {
        const int64_t n = (int64_t)index->batch * index->heads * index->row_blocks;
        for (int64_t i = 0; i < n; i++)
            if (index->block_count[i] < 0 || index->block_count[i] > index->max_blocks ||
                index->column_count[i] < 0 || index->column_count[i] > index->max_columns)
                return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT,
                               "sparse index row block %lld has counts outside its capacity",
                               (long long)i);
    }
    scale = mi_resolve_scale(scale, s.head_dim);
    return MI_DISPATCH(ctx, attention_sparse, &s, q, k, v, seq_lens, index, scale, out, lse);
}

mi_status mi_check_patterns(mi_context *ctx, const mi_head_pattern *patterns, int64_t H) {
    if (!patterns) return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "patterns is NULL");
    for (int64_t h = 0; h < H; h++) {
        const mi_head_pattern *p = &patterns[h];
        if (!mi_pattern_name(p->type))
            return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "head %lld has unknown pattern %d",
                           (long long)h, (int)p->type);
        if (p->vertical_size < 0 || p->slash_size < 0 || p->n_init < 0 || p->n_local < 0 ||
            p->n_last < 0 || p->top_k < 0)
            return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "head %lld has a negative budget",
                           (long long)h);
        if (!mi_pattern_valid(p))
            return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT,
                           "head %lld: %s with stride %d, threshold %d, tau %d, dense_local %d: "
                           "docs/prefill-methods.md gives the valid values",
                           (long long)h, mi_pattern_name(p->type), (int)p->stride,
                           (int)p->threshold, (int)p->tau, (int)p->dense_local);
    }
    return MI_STATUS_SUCCESS;
}

mi_status mi_check_prefill_params(mi_context *ctx, const mi_prefill_params *p) {
    MI_TRY(check_scale(ctx, p->softmax_scale));
    return check_vs_params(ctx, &p->vs);
}

mi_status mi_prefill_workspace_size(mi_context *ctx, const mi_tensor *q, const mi_tensor *k,
                                    const mi_head_pattern *patterns,
                                    const mi_prefill_params *params, size_t *bytes) {
    mi_attn_shape s;
    MI_TRY(check_ctx(ctx));
    if (!k || !bytes) return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "k and bytes are required");
    MI_TRY(check_attention(ctx, q, k, NULL, NULL, NULL, true, &s));
    MI_TRY(mi_check_patterns(ctx, patterns, s.heads_q));
    mi_prefill_params p = params ? *params : mi_prefill_default_params();
    MI_TRY(mi_check_prefill_params(ctx, &p));
    return MI_DISPATCH(ctx, prefill_workspace_size, &s, patterns, &p, bytes);
}

mi_status mi_prefill_attention(mi_context *ctx, const mi_tensor *q, const mi_tensor *k,
                               const mi_tensor *v, const int32_t *seq_lens,
                               const mi_head_pattern *patterns, const mi_prefill_params *params,
                               mi_tensor *out, float *lse, void *workspace, size_t workspace_size) {
    mi_attn_shape s;
    MI_TRY(check_ctx(ctx));
    if (!k || !v || !out)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "k, v and out are required");
    MI_TRY(check_attention(ctx, q, k, v, out, seq_lens, true, &s));
    MI_TRY(check_lse(ctx, lse));
    MI_TRY(mi_check_patterns(ctx, patterns, s.heads_q));
    mi_prefill_params p = params ? *params : mi_prefill_default_params();
    MI_TRY(mi_check_prefill_params(ctx, &p));
    if (workspace) {
        size_t need = 0;
        MI_TRY(MI_DISPATCH(ctx, prefill_workspace_size, &s, patterns, &p, &need));
        if (workspace_size < need)
            return mi_fail(ctx, MI_STATUS_WORKSPACE_TOO_SMALL,
                           "workspace holds %zu bytes, this call needs %zu", workspace_size, need);
    }
    p.softmax_scale = mi_resolve_scale(p.softmax_scale, s.head_dim);
    return MI_DISPATCH(ctx, prefill_attention, &s, q, k, v, seq_lens, patterns, &p, out, lse,
                       workspace, workspace_size);
}
