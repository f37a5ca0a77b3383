/*
 * model_kv_cache.c: mi_kv_cache, a session's pages and KV method without its model. The
 * transformers patch runs the forward pass in torch and hands each layer's call here; the pool,
 * the method's hooks and the attention over the pages (mim_seq_attend) are the sessions' own.
 */
#include "minference_session.h"
#include "../kv/kv_method.h"
#include "model_runner.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct mi_kv_cache {
    mi_kv_cache_params p;
    mi_kv_seq *seq;
    kv_method *method;
    mim_pool *threads;
    int64_t *tokens; /* per layer */
    char last_error[512];
};

static mi_status cfail(mi_kv_cache *c, mi_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static mi_status cfail(mi_kv_cache *c, mi_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->last_error, sizeof c->last_error, fmt, ap);
    va_end(ap);
    return st;
}

mi_kv_cache_params mi_kv_cache_default_params(void) {
    mi_kv_cache_params p;
    memset(&p, 0, sizeof p);
    return p;
}

void mi_kv_cache_destroy(mi_kv_cache *c) {
    if (!c) return;
    kv_method_destroy(c->method);
    mi_kv_seq_destroy(c->seq);
    mim_pool_destroy(c->threads);
    free(c->tokens);
    free(c);
}

mi_status mi_kv_cache_create(const mi_kv_cache_params *params, mi_kv_cache **out, char *msg,
                             size_t msg_size) {
    if (msg && msg_size) msg[0] = 0;
    if (!out || !params)
        return mim_fail(msg, msg_size, MI_STATUS_INVALID_ARGUMENT,
                        "mi_kv_cache_create: params and out are required");
    *out = NULL;
    const mi_kv_cache_params *p = params;
    if (p->n_layers <= 0 || p->n_heads <= 0 || p->n_kv_heads <= 0 || p->head_dim <= 0 ||
        p->n_heads % p->n_kv_heads || p->head_dim > 1024)
        return mim_fail(msg, msg_size, MI_STATUS_INVALID_ARGUMENT,
                        "mi_kv_cache_create: n_layers %d, n_heads %d, n_kv_heads %d, head_dim %d "
                        "(all positive, n_heads a multiple of n_kv_heads, head_dim at most 1024)",
                        p->n_layers, p->n_heads, p->n_kv_heads, p->head_dim);
    kv_spec spec;
    char err[KV_METHOD_ERROR_MAX];
    mi_status st = kv_spec_parse(p->kv, &spec, err, sizeof err);
    if (st != MI_STATUS_SUCCESS) return mim_fail(msg, msg_size, st, "%s", err);

    mi_kv_pool_params pp = mi_kv_pool_default_params();
    pp.n_layers = p->n_layers, pp.n_kv_heads = p->n_kv_heads, pp.head_dim = p->head_dim;
    pp.dtype = MI_KV_F32;
    pp.capacity_bytes = p->pool_bytes;
    pp.meta_kinds = MI_KV_META_KEY_MINMAX; /* Quest's page bounds, as a session's pool */
    const kv_geometry geo = {p->n_layers, p->n_heads, p->n_kv_heads, p->head_dim, pp.page_tokens};
    kv_method *method = NULL;
    if ((st = kv_method_create(&spec, &geo, &method, err, sizeof err)) != MI_STATUS_SUCCESS)
        return mim_fail(msg, msg_size, st, "%s", err);
    if (method && method->entry->storage) method->entry->storage(method, &pp); /* KIVI */

    mi_kv_cache *c = calloc(1, sizeof *c);
    int nt = p->n_threads;
    if (nt <= 0) {
        const long cores = sysconf(_SC_NPROCESSORS_ONLN);
        nt = cores > 0 ? (int)cores : 1;
    }
    if (!c || !(c->tokens = calloc((size_t)p->n_layers, sizeof(int64_t))) ||
        !(c->threads = mim_pool_create(nt))) {
        kv_method_destroy(method);
        mi_kv_cache_destroy(c);
        return mim_fail(msg, msg_size, MI_STATUS_OUT_OF_MEMORY, "out of memory for a KV cache");
    }
    c->p = *p;
    c->p.kv = NULL; /* the caller's string is not kept */
    c->method = method;
    mi_kv_pool *pool = NULL;
    if ((st = mi_kv_pool_create(NULL, &pp, &pool)) == MI_STATUS_SUCCESS) {
        st = mi_kv_seq_create(pool, &c->seq);
        mi_kv_pool_destroy(pool); /* the sequence holds it */
    }
    if (st != MI_STATUS_SUCCESS) {
        mi_kv_cache_destroy(c);
        return mim_fail(msg, msg_size, st, "cannot create the KV cache's pages");
    }
    *out = c;
    return MI_STATUS_SUCCESS;
}

const char *mi_kv_cache_last_error(const mi_kv_cache *c) { return c ? c->last_error : ""; }

int64_t mi_kv_cache_rows(const mi_kv_cache *c, int32_t layer) {
    if (!c || layer < 0 || layer >= c->p.n_layers) return -1;
    return mi_kv_seq_length(c->seq, layer);
}

int64_t mi_kv_cache_tokens(const mi_kv_cache *c, int32_t layer) {
    if (!c || layer < 0 || layer >= c->p.n_layers) return -1;
    return c->tokens[layer];
}

uint64_t mi_kv_cache_bytes(const mi_kv_cache *c) {
    mi_kv_seq_stats st;
    if (!c || mi_kv_seq_stats_get(c->seq, &st) != MI_STATUS_SUCCESS) return 0;
    return st.bytes;
}

/* [1, H, L, D] f32 CPU with a contiguous last dimension and the given H, D (L > 0; n: its L). */
static bool tensor_ok(const mi_tensor *t, int32_t H, int32_t D, int64_t n) {
    return t && t->data && t->dtype == MI_DTYPE_F32 && t->device == MI_DEVICE_CPU &&
           t->shape[0] == 1 && t->shape[1] == H && t->shape[2] > 0 && (n < 0 || t->shape[2] == n) &&
           t->shape[3] == D && t->stride[3] == 1;
}

mi_status mi_kv_cache_call(mi_kv_cache *c, int32_t layer, const mi_tensor *q, const mi_tensor *k,
                           const mi_tensor *v, float scale, mi_tensor *out) {
    if (!c) return MI_STATUS_INVALID_ARGUMENT;
    c->last_error[0] = 0;
    const mi_kv_cache_params *p = &c->p;
    if (layer < 0 || layer >= p->n_layers)
        return cfail(c, MI_STATUS_INVALID_ARGUMENT, "mi_kv_cache_call: layer %d of %d", layer,
                     p->n_layers);
    if (!tensor_ok(k, p->n_kv_heads, p->head_dim, -1))
        return cfail(c, MI_STATUS_INVALID_ARGUMENT,
                     "mi_kv_cache_call: k must be [1, %d, n, %d] f32 on the CPU with a contiguous "
                     "last dimension",
                     p->n_kv_heads, p->head_dim);
    const int64_t n = k->shape[2];
    if (!tensor_ok(v, p->n_kv_heads, p->head_dim, n) ||
        (q && !tensor_ok(q, p->n_heads, p->head_dim, n)) ||
        (out && !tensor_ok(out, p->n_heads, p->head_dim, n)))
        return cfail(c, MI_STATUS_INVALID_ARGUMENT,
                     "mi_kv_cache_call: v must be [1, %d, %lld, %d], q and out [1, %d, %lld, %d], "
                     "f32 on the CPU with a contiguous last dimension",
                     p->n_kv_heads, (long long)n, p->head_dim, p->n_heads, (long long)n,
                     p->head_dim);
    if (out && !q) return cfail(c, MI_STATUS_INVALID_ARGUMENT, "mi_kv_cache_call: out needs q");
    if (out && !(scale > 0.0f && scale < 1e30f))
        return cfail(c, MI_STATUS_INVALID_ARGUMENT, "mi_kv_cache_call: scale %g is not positive",
                     (double)scale);
    const bool wants_q = c->method && c->method->q_rows > 0 && n >= 2;
    if (wants_q && !q)
        return cfail(c, MI_STATUS_INVALID_ARGUMENT,
                     "mi_kv_cache_call: kv method %s reads the queries of a call of %lld tokens: "
                     "q is required",
                     c->method->entry->name, (long long)n);

    /* the queries token-major, [n][n_heads * head_dim], as the sessions' attention reads them */
    const int64_t qd = (int64_t)p->n_heads * p->head_dim;
    float *qb = NULL, *ob = NULL;
    if (q) {
        qb = malloc((size_t)(n * qd) * sizeof(float));
        ob = out ? malloc((size_t)(n * qd) * sizeof(float)) : NULL;
        if (!qb || (out && !ob)) {
            free(qb), free(ob);
            return cfail(c, MI_STATUS_OUT_OF_MEMORY, "out of memory for %lld queries",
                         (long long)n);
        }
        const float *base = q->data;
        for (int64_t i = 0; i < n; i++)
            for (int32_t h = 0; h < p->n_heads; h++)
                memcpy(qb + i * qd + (int64_t)h * p->head_dim,
                       base + h * q->stride[1] + i * q->stride[2],
                       (size_t)p->head_dim * sizeof(float));
    }
    const int64_t before = mi_kv_seq_length(c->seq, layer);
    mi_status st = mi_kv_seq_append(c->seq, layer, k, v);
    if (st != MI_STATUS_SUCCESS) {
        free(qb), free(ob);
        return cfail(c, st, "layer %d: %s", layer, mi_kv_pool_last_error(mi_kv_seq_pool(c->seq)));
    }
    if (out) {
        const mim_seq_shape sh = {p->n_heads, p->n_kv_heads, p->head_dim, 0, c->threads};
        char err[256];
        st = mim_seq_attend(&sh, c->seq, c->method, layer, qb, n, before, scale, ob, err,
                            sizeof err);
        if (st != MI_STATUS_SUCCESS) {
            mi_kv_seq_truncate(c->seq, layer, before);
            free(qb), free(ob);
            return cfail(c, st, "%s", err);
        }
        float *base = out->data;
        for (int64_t i = 0; i < n; i++)
            for (int32_t h = 0; h < p->n_heads; h++)
                memcpy(base + h * out->stride[1] + i * out->stride[2],
                       ob + i * qd + (int64_t)h * p->head_dim, (size_t)p->head_dim * sizeof(float));
    }
    c->tokens[layer] += n;
    if (c->method) {
        c->method->exact_tail[layer] += n;
        if (wants_q) {
            const int64_t rows = n < c->method->q_rows ? n : c->method->q_rows;
            st = kv_method_after_prefill(c->method, c->seq, layer, qb + (n - rows) * qd, rows);
        }
        if (st == MI_STATUS_SUCCESS) st = kv_method_after_append(c->method, c->seq, layer, n);
        if (st != MI_STATUS_SUCCESS) st = cfail(c, st, "layer %d: %s", layer, c->method->error);
    }
    free(qb), free(ob);
    return st;
}
