/*
 * model_session.c: sessions of the model runner (include/minference_session.h) over the paged
 * KV cache (src/kv). The forward pass itself is model_forward.c's, which appends each layer's
 * K and V to the session's sequence; this file holds the session objects, their files and the
 * dense attention of queries at an offset that reads the pages in place.
 */
#define _POSIX_C_SOURCE 200809L
#include "minference_session.h"

#include "../kv/kv_method.h"
#include "minference_kv.h"
#include "model_gpu.h"
#include "model_runner.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mi_session {
    mi_model *model;
    mi_kv_seq *seq;
    kv_method *method;  /* the KV method; NULL: dense */
    int64_t n_pos;      /* tokens seen: the next RoPE position (rows kept may be fewer) */
    int64_t max_tokens; /* 0: no limit */
    char last_error[MIM_ERROR_CAPACITY];
};

static mi_status sfail(const mi_session *cs, mi_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static mi_status sfail(const mi_session *cs, mi_status st, const char *fmt, ...) {
    mi_session *s = (mi_session *)cs; /* the message is not part of the session's state */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->last_error, sizeof(s->last_error), fmt, ap);
    va_end(ap);
    return st;
}

mi_session_params mi_session_default_params(void) {
    mi_session_params p;
    memset(&p, 0, sizeof(p));
    return p;
}

int32_t mi_session_kv_method_count(void) { return kv_method_count(); }

const char *mi_session_kv_method_name(int32_t i) {
    const kv_method_entry *e = kv_method_at(i);
    return e ? e->name : NULL;
}

mi_status mi_session_kv_check(const char *spec, char *msg, size_t msg_size) {
    kv_spec ks;
    mi_status st = kv_spec_parse(spec, &ks, msg, msg_size);
    if (st != MI_STATUS_SUCCESS) return st;
    if (ks.entry->unsupported) {
        if (msg && msg_size)
            snprintf(msg, msg_size, "kv method %s: %s", ks.entry->name, ks.entry->unsupported);
        return MI_STATUS_UNSUPPORTED;
    }
    kv_spec_format(&ks, msg, msg_size);
    return MI_STATUS_SUCCESS;
}

mi_status mi_session_create(mi_model *m, const mi_session_params *params, mi_session **out) {
    if (!out) return MI_STATUS_INVALID_ARGUMENT;
    *out = NULL;
    if (!m) return MI_STATUS_INVALID_ARGUMENT;
    mi_session_params p = params ? *params : mi_session_default_params();
    kv_spec spec;
    char err[KV_METHOD_ERROR_MAX];
    mi_status kst = kv_spec_parse(p.kv, &spec, err, sizeof err);
    if (kst != MI_STATUS_SUCCESS) return mim_model_fail(m, kst, "%s", err);
    /* On the CUDA model a session's pages are host pages that the device cache mirrors
     * (model_gpu.cu): f32 there means the model's own precision, the bf16 pages of the model's
     * pool. A KV method attends on the host after the first call: its pages are the CPU's. */
    const bool gpu_dense = m->gpu && strcmp(spec.entry->name, "dense") == 0;
    if (gpu_dense && p.kv_dtype == MI_KV_BF16) p.kv_dtype = MI_KV_F32;
    if (!m->kv_pool) {
        mi_kv_pool_params pp = mi_kv_pool_default_params();
        pp.n_layers = m->n_layers;
        pp.n_kv_heads = m->n_kv;
        pp.head_dim = m->hd;
        /* the forward pass's own precision: a session equals the model */
        pp.dtype = m->gpu ? MI_KV_BF16 : MI_KV_F32;
        pp.capacity_bytes = p.pool_bytes;
        /* per-page key bounds for Quest: 2 * head_dim floats per KV head, 1.6 % of an f32 page
         * (the CUDA model runs no method that reads them) */
        pp.meta_kinds = m->gpu ? 0 : MI_KV_META_KEY_MINMAX;
        mim_gpu_pool_memory(m, &pp);
        mi_status st = mi_kv_pool_create(m->ctx, &pp, &m->kv_pool);
        if (st != MI_STATUS_SUCCESS)
            return mim_model_fail(m, st, "cannot create the KV page pool: %s",
                                  mi_context_last_error(m->ctx));
    }
    mi_kv_page_layout lay;
    mi_status st = mi_kv_pool_layout(m->kv_pool, &lay);
    if (st != MI_STATUS_SUCCESS)
        return mim_model_fail(m, st, "%s", mi_kv_pool_last_error(m->kv_pool));
    const kv_geometry geo = {m->n_layers, m->n_heads, m->n_kv, m->hd, lay.page_tokens};
    kv_method *method = NULL;
    if ((st = kv_method_create(&spec, &geo, &method, err, sizeof err)) != MI_STATUS_SUCCESS)
        return mim_model_fail(m, st, "%s", err);
    if (p.kv_dtype != MI_KV_F32) {
        const char *why = NULL;
        st = MI_STATUS_INVALID_ARGUMENT;
        if (p.kv_dtype != MI_KV_F16 && p.kv_dtype != MI_KV_BF16 && p.kv_dtype != MI_KV_FP8_E4M3)
            why = "is not f32 (0), f16 (1), bf16 (2) or fp8_e4m3 (3)";
        else if (method && method->entry->storage)
            why = "with a kv method that keeps its own storage format";
        if (why) {
            kv_method_destroy(method);
            return mim_model_fail(m, st, "kv_dtype %d %s", (int)p.kv_dtype, why);
        }
    }
    mi_session *s = calloc(1, sizeof(*s));
    if (!s) {
        kv_method_destroy(method);
        return mim_model_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory for a session");
    }
    /* a storage method (KIVI) gets a pool of its own format; its sequence keeps it alive */
    mi_kv_pool *pool = m->kv_pool;
    mi_kv_pool_params qp = mi_kv_pool_default_params();
    qp.n_layers = m->n_layers, qp.n_kv_heads = m->n_kv, qp.head_dim = m->hd;
    qp.dtype = MI_KV_F32, qp.page_tokens = lay.page_tokens, qp.capacity_bytes = p.pool_bytes;
    bool own = method && method->entry->storage && method->entry->storage(method, &qp);
    if (p.kv_dtype != MI_KV_F32) { /* pages of another precision: a pool of that dtype */
        qp.dtype = (mi_kv_dtype)p.kv_dtype;
        if (kv_method_selects(method)) qp.meta_kinds = MI_KV_META_KEY_MINMAX; /* Quest's bounds */
        own = true;
    } else if (m->gpu && !gpu_dense && !own) { /* a method's f32 pages, with Quest's bounds */
        qp.meta_kinds = MI_KV_META_KEY_MINMAX;
        own = true;
    }
    /* pages the device reads: pinned where kv_pinned asks for it (uploads; Quest's decode steps,
     * whose f32 pages the device reads too) */
    if (own && (qp.dtype == MI_KV_BF16 || qp.dtype == MI_KV_F16 || qp.dtype == MI_KV_FP8_E4M3 ||
                (qp.dtype == MI_KV_F32 && kv_method_selects(method))))
        mim_gpu_pool_memory(m, &qp);
    if (own && (st = mi_kv_pool_create(m->ctx, &qp, &pool)) != MI_STATUS_SUCCESS) {
        kv_method_destroy(method);
        free(s);
        return mim_model_fail(m, st, "cannot create the session's KV pool: %s",
                              mi_context_last_error(m->ctx));
    }
    st = mi_kv_seq_create(pool, &s->seq);
    if (own) mi_kv_pool_destroy(pool); /* the sequence holds it now */
    if (st != MI_STATUS_SUCCESS) {
        kv_method_destroy(method);
        free(s);
        return mim_model_fail(m, st, "cannot create a session: %s",
                              own ? "out of memory" : mi_kv_pool_last_error(m->kv_pool));
    }
    s->method = method;
    s->model = m;
    s->max_tokens = p.max_tokens > 0 ? p.max_tokens : m->params.max_context;
    if (s->max_tokens < 0) s->max_tokens = 0;
    *out = s;
    return MI_STATUS_SUCCESS;
}

void mi_session_destroy(mi_session *s) {
    if (!s) return;
    kv_method_destroy(s->method);
    mi_kv_seq_destroy(s->seq);
    free(s);
}

const char *mi_session_last_error(const mi_session *s) { return s ? s->last_error : ""; }

static mi_status run(mi_session *s, const int32_t *tokens, size_t n, float *logits,
                     const char *what) {
    if (!s) return MI_STATUS_INVALID_ARGUMENT;
    s->last_error[0] = 0;
    if (!tokens || n == 0) return sfail(s, MI_STATUS_INVALID_ARGUMENT, "no tokens to %s", what);
    const int64_t past = s->n_pos;
    if (s->max_tokens > 0 && (int64_t)n > s->max_tokens - past)
        return sfail(s, MI_STATUS_INVALID_ARGUMENT,
                     "%lld + %zu tokens exceed the session's max_tokens = %lld", (long long)past, n,
                     (long long)s->max_tokens);
    mi_model *m = s->model;
    m->last_error[0] = 0;
    bool kept = false;
    mi_status st =
        mim_forward_seq(m, s->seq, s->method, s->n_pos, tokens, (int64_t)n, logits, &kept);
    /* a failure inside the layers cuts the rows back; one in the method's compaction after them
     * keeps the call's tokens (model_forward.c) */
    if (st == MI_STATUS_SUCCESS || kept) s->n_pos += (int64_t)n;
    if (st != MI_STATUS_SUCCESS) sfail(s, st, "%s", m->last_error);
    return st;
}

mi_status mi_session_prefill(mi_session *s, const int32_t *tokens, size_t n, float *logits) {
    return run(s, tokens, n, logits, "prefill");
}

mi_status mi_session_decode(mi_session *s, const int32_t *tokens, size_t n, float *logits) {
    return run(s, tokens, n, logits, "decode");
}

int64_t mi_session_n_past(const mi_session *s) { return s ? s->n_pos : 0; }

mi_status mi_session_rewind(mi_session *s, int64_t n) {
    if (!s) return MI_STATUS_INVALID_ARGUMENT;
    s->last_error[0] = 0;
    const int64_t past = s->n_pos;
    if (n < 0 || n > past)
        return sfail(s, MI_STATUS_INVALID_ARGUMENT, "cannot rewind %lld of %lld tokens",
                     (long long)n, (long long)past);
    if (n > kv_method_rewindable(s->method))
        return sfail(s, MI_STATUS_INVALID_ARGUMENT,
                     "cannot rewind %lld tokens: kv method %s kept only the last %lld in order "
                     "(the earlier ones were evicted or compacted)",
                     (long long)n, s->method->entry->name,
                     (long long)kv_method_rewindable(s->method));
    mi_status st = mi_kv_seq_rewind(s->seq, n);
    if (st != MI_STATUS_SUCCESS)
        return sfail(s, st, "%s", mi_kv_pool_last_error(mi_kv_seq_pool(s->seq)));
    s->n_pos -= n;
    kv_method_rewound(s->method, n);
    return st;
}

mi_status mi_session_fork(const mi_session *s, mi_session **out) {
    if (!out) return MI_STATUS_INVALID_ARGUMENT;
    *out = NULL;
    if (!s) return MI_STATUS_INVALID_ARGUMENT;
    mi_session *c = calloc(1, sizeof(*c));
    if (!c) return sfail(s, MI_STATUS_OUT_OF_MEMORY, "out of memory for a session");
    char err[KV_METHOD_ERROR_MAX];
    mi_status st = kv_method_clone(s->method, &c->method, err, sizeof err);
    if (st != MI_STATUS_SUCCESS) {
        free(c);
        return sfail(s, st, "fork: %s", err);
    }
    st = mi_kv_seq_fork(s->seq, &c->seq);
    if (st != MI_STATUS_SUCCESS) {
        kv_method_destroy(c->method);
        free(c);
        return sfail(s, st, "fork: %s", mi_kv_pool_last_error(mi_kv_seq_pool(s->seq)));
    }
    c->model = s->model;
    c->n_pos = s->n_pos;
    c->max_tokens = s->max_tokens;
    *out = c;
    return MI_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Files                                                                                       */

static uint64_t hash_weight(uint64_t h, const char *role, int64_t index, const mim_weight *w) {
    h = mi_kv_hash64(h, role, strlen(role));
    h = mi_kv_hash64(h, &index, sizeof(index));
    h = mi_kv_hash64(h, &w->type, sizeof(w->type));
    h = mi_kv_hash64(h, &w->rows, sizeof(w->rows));
    h = mi_kv_hash64(h, &w->cols, sizeof(w->cols));
    /* types and shapes alone cannot tell two checkpoints of one architecture apart: the first
     * bytes of the data can, at the cost of one page read per tensor */
    size_t lead = w->row_bytes < 64 ? w->row_bytes : 64;
    if (w->data && lead) h = mi_kv_hash64(h, w->data, lead);
    return h;
}

static uint64_t weights_hash(mi_model *m) {
    if (m->weights_hash) return m->weights_hash;
    uint64_t h = mi_kv_hash64(0, m->info.arch, strnlen(m->info.arch, sizeof(m->info.arch)));
    h = hash_weight(h, "token_embd", 0, &m->tok_embd);
    h = hash_weight(h, "output", 0, &m->output);
    for (int32_t l = 0; l < m->n_layers; l++) {
        const mim_layer *L = &m->layers[l];
        const mim_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wg, &L->wu, &L->wd};
        static const char *const names[] = {"q", "k", "v", "o", "gate", "up", "down"};
        for (int i = 0; i < 7; i++) h = hash_weight(h, names[i], l, ws[i]);
    }
    const double rope[2] = {m->rope.theta, m->eps};
    h = mi_kv_hash64(h, rope, sizeof(rope));
    m->weights_hash = h ? h : 1;
    return m->weights_hash;
}

static void model_id(mi_model *m, mi_kv_model_id *id) {
    memset(id, 0, sizeof(*id));
    snprintf(id->arch, sizeof(id->arch), "%s", m->info.arch);
    id->n_layers = m->n_layers;
    id->n_heads = m->n_heads;
    id->n_kv_heads = m->n_kv;
    id->head_dim = m->hd;
    id->hidden = m->hidden;
    id->vocab = m->vocab;
    id->weights_hash = weights_hash(m);
}

mi_status mi_session_save(const mi_session *s, const char *path) {
    if (!s) return MI_STATUS_INVALID_ARGUMENT;
    ((mi_session *)s)->last_error[0] = 0;
    if (!path) return sfail(s, MI_STATUS_INVALID_ARGUMENT, "no path to save to");
    for (int32_t l = 0; l < s->model->n_layers; l++)
        if (mi_kv_seq_length(s->seq, l) != s->n_pos)
            return sfail(s, MI_STATUS_UNSUPPORTED,
                         "kv method %s kept %lld rows of %lld tokens in layer %d: the session "
                         "file stores one row per token, so a compacted cache cannot be saved",
                         s->method ? s->method->entry->name : "dense",
                         (long long)mi_kv_seq_length(s->seq, l), (long long)s->n_pos, l);
    mi_kv_model_id id;
    model_id(s->model, &id);
    mi_status st = mi_kv_seq_save(s->seq, path, &id);
    if (st != MI_STATUS_SUCCESS)
        return sfail(s, st, "%s", mi_kv_pool_last_error(mi_kv_seq_pool(s->seq)));
    return st;
}

mi_status mi_session_load(mi_session *s, const char *path) {
    if (!s) return MI_STATUS_INVALID_ARGUMENT;
    s->last_error[0] = 0;
    if (!path) return sfail(s, MI_STATUS_INVALID_ARGUMENT, "no path to load from");
    mi_kv_model_id id;
    model_id(s->model, &id);
    /* loaded into a scratch sequence first, so that max_tokens can refuse it unchanged */
    mi_kv_seq *tmp = NULL;
    mi_status st = mi_kv_seq_create(mi_kv_seq_pool(s->seq), &tmp);
    if (st == MI_STATUS_SUCCESS) st = mi_kv_seq_load(tmp, path, &id);
    if (st != MI_STATUS_SUCCESS) {
        sfail(s, st, "%s", mi_kv_pool_last_error(mi_kv_seq_pool(s->seq)));
        mi_kv_seq_destroy(tmp);
        return st;
    }
    const int64_t n = mi_kv_seq_tokens(tmp);
    for (int32_t l = 0; l < s->model->n_layers; l++)
        if (mi_kv_seq_length(tmp, l) != n) {
            mi_kv_seq_destroy(tmp);
            return sfail(s, MI_STATUS_PARSE_ERROR,
                         "%s: layers of different lengths: not a model session", path);
        }
    if (s->max_tokens > 0 && n > s->max_tokens) {
        mi_kv_seq_destroy(tmp);
        return sfail(s, MI_STATUS_INVALID_ARGUMENT, "%s holds %lld tokens, over max_tokens %lld",
                     path, (long long)n, (long long)s->max_tokens);
    }
    mi_kv_seq_destroy(s->seq);
    s->seq = tmp;
    s->n_pos = n;
    kv_method_reset_tails(s->method, s->seq);
    return MI_STATUS_SUCCESS;
}

mi_status mi_session_stats_get(const mi_session *s, mi_session_stats *out) {
    if (!s || !out) return MI_STATUS_INVALID_ARGUMENT;
    memset(out, 0, sizeof(*out));
    mi_kv_seq_stats ss;
    mi_kv_pool_stats ps;
    mi_kv_page_layout lay;
    mi_status st = mi_kv_seq_stats_get(s->seq, &ss);
    if (st == MI_STATUS_SUCCESS) st = mi_kv_pool_stats_get(mi_kv_seq_pool(s->seq), &ps);
    if (st == MI_STATUS_SUCCESS) st = mi_kv_pool_layout(mi_kv_seq_pool(s->seq), &lay);
    if (st != MI_STATUS_SUCCESS) return st;
    out->n_tokens = s->n_pos;
    out->kv_rows = ss.tokens;
    out->kv_device_calls = s->method ? s->method->device_calls : 0;
    out->max_tokens = s->max_tokens;
    out->bytes = ss.bytes;
    out->shared_bytes = ss.shared_bytes;
    out->pool_used_bytes = ps.used_bytes;
    out->pool_allocated_bytes = ps.allocated_bytes;
    out->pool_capacity_bytes =
        ps.capacity_pages < 0 ? 0 : (uint64_t)ps.capacity_pages * ps.page_bytes;
    out->pool_sessions = ps.live_sequences;
    out->page_tokens = lay.page_tokens;
    return MI_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Dense attention over the pages                                                              */

/* Query heads per KV head, and head size, that attend_group takes (beyond: one head at a time;
 * its accumulators live on the stack). */
#define MI_GQA_MAX 16
#define MI_GQA_MAX_DIM 256

typedef struct seq_job {
    const float *q; /* [n, n_heads * hd] */
    float *out;
    const float *const *kp, *const *vp; /* per page: K and V of KV head 0 */
    int64_t n, n_past, window;
    int32_t n_heads, n_kv, hd, pt;
    int64_t head_stride; /* floats between KV heads inside a page */
    float scale;
    const kv_selection *sel; /* per (row, head): the row spans to read; NULL: every visible row */
    /* pages that are not f32 (KIVI) or a method that prunes key channels (LeanK): every row is
     * read through mi_kv_seq_attend, which reads each storage format in place */
    const mi_kv_seq *seq;
    const kv_method *method;
    int32_t layer;
    bool reader;
} seq_job;

/* The one place that turns a page and a row into K or V floats (head kvh, rows r.. of the
 * page): the pages are f32 today; a storage format that is not floats decodes here. */
static inline const float *seq_rows(const seq_job *j, int kv, int64_t page, int32_t kvh,
                                    int64_t r) {
    return (kv ? j->vp : j->kp)[page] + (int64_t)kvh * j->head_stride + r * j->hd;
}

/* K (kv 0) or V (1) rows p..stop-1 of KV head kvh, all in one page: the page's own rows where
 * they are f32, else decoded into buf (pt * hd floats); NULL where they cannot be read. */
static const float *span_rows(const seq_job *j, int kv, int64_t p, int64_t stop, int32_t kvh,
                              float *buf) {
    if (j->kp) return seq_rows(j, kv, p / j->pt, kvh, p % j->pt);
    if (!buf ||
        mi_kv_seq_read_tile(j->seq, j->layer, kvh, kv, p, stop - p, buf) != MI_STATUS_SUCCESS)
        return NULL;
    return buf;
}

/* Without a selection, the same arithmetic in the same order as the contiguous cache's dense
 * continuation (model_forward.c), so a session and the model's own cache give equal logits; only
 * the addressing differs: key p is row p % pt of page p / pt. With one, the keys are the spans'
 * rows, in ascending order (a selection of every row is therefore bit for bit dense). */
/* Query heads h0..h0+ng-1 of one row, which share KV head kvh, over every visible key (no
 * selection, f32 pages): each K and V row is read once for all of them (a decode step reads
 * the whole cache and is bound by memory), and each head's arithmetic runs in the order of the
 * one-head loop below, so the results are the same bit for bit. sc: ng * (keys) floats. */
static void attend_group(const seq_job *j, int64_t row, int32_t h0, int32_t ng, int64_t first,
                         int64_t end, float *sc) {
    const int32_t hd = j->hd, kvh = h0 / (j->n_heads / j->n_kv);
    const int64_t n = end - first;
    const float *q[MI_GQA_MAX], *k;
    float mx[MI_GQA_MAX], sum[MI_GQA_MAX], acc[MI_GQA_MAX][MI_GQA_MAX_DIM];
    for (int32_t g = 0; g < ng; g++) {
        q[g] = j->q + row * (int64_t)j->n_heads * hd + (int64_t)(h0 + g) * hd;
        mx[g] = -INFINITY, sum[g] = 0.0f;
        for (int32_t d = 0; d < hd; d++) acc[g][d] = 0.0f;
    }
    for (int64_t p = first, i = 0; p < end;) {
        const int64_t pg = p / j->pt, stop = (pg + 1) * j->pt < end ? (pg + 1) * j->pt : end;
        k = seq_rows(j, 0, pg, kvh, p % j->pt);
        for (; p < stop; p++, i++, k += hd)
            for (int32_t g = 0; g < ng; g++) {
                const float v = mim_dot_row(MIM_TYPE_F32, k, q[g], hd) * j->scale;
                sc[g * n + i] = v;
                mx[g] = v > mx[g] ? v : mx[g];
            }
    }
    for (int32_t g = 0; g < ng; g++)
        for (int64_t i = 0; i < n; i++) {
            sc[g * n + i] = expf(sc[g * n + i] - mx[g]);
            sum[g] += sc[g * n + i];
        }
    for (int64_t p = first, i = 0; p < end;) {
        const int64_t pg = p / j->pt, stop = (pg + 1) * j->pt < end ? (pg + 1) * j->pt : end;
        const float *v = seq_rows(j, 1, pg, kvh, p % j->pt);
        for (; p < stop; p++, i++, v += hd)
            for (int32_t g = 0; g < ng; g++) {
                const float w = sc[g * n + i];
                for (int32_t d = 0; d < hd; d++) acc[g][d] += w * v[d];
            }
    }
    for (int32_t g = 0; g < ng; g++) {
        float *o = j->out + row * (int64_t)j->n_heads * hd + (int64_t)(h0 + g) * hd;
        const float inv = 1.0f / sum[g];
        for (int32_t d = 0; d < hd; d++) o[d] = acc[g][d] * inv;
    }
}

static void seq_task(void *arg, int64_t b, int64_t e, int thread) {
    (void)thread;
    const seq_job *j = arg;
    const int32_t group = j->n_heads / j->n_kv, hd = j->hd;
    /* a group's scores where its heads go together (attend_group), else one head's */
    const bool grouped = !j->reader && group > 1 && group <= MI_GQA_MAX && hd <= MI_GQA_MAX_DIM;
    /* the reader takes a group's queries in one call too, each row decoded once for them */
    const bool read_grouped = j->reader && !j->sel && group > 1 && group <= 8;
    float *sc = malloc((size_t)(grouped || read_grouped ? group : 1) * (size_t)(j->n_past + j->n) *
                       sizeof(float));
    /* a selection over pages that are not f32 decodes a page's rows at a time */
    float *tile = j->sel && !j->kp ? malloc((size_t)j->pt * (size_t)hd * sizeof(float)) : NULL;
    float acc[1024];
    for (int64_t t = b; t < e; t++) {
        const int64_t row = t / j->n_heads;
        const int32_t h = (int32_t)(t % j->n_heads), kvh = h / group;
        if (grouped && sc && h % group == 0 && t + group <= e) {
            const int64_t end = j->n_past + row + 1;
            int64_t first = j->window > 0 && end > j->window ? end - j->window : 0, last = end;
            /* a selection that gives the group's heads one and the same span (Quest's dense
             * layers, a short context) reads as no selection over that span */
            bool same = true;
            if (j->sel) {
                const int64_t *o = j->sel->offsets, *sp = j->sel->spans;
                same = o[t + 1] - o[t] == 1;
                for (int32_t g = 1; same && g < group; g++)
                    same = o[t + g + 1] - o[t + g] == 1 && sp[2 * o[t + g]] == sp[2 * o[t]] &&
                           sp[2 * o[t + g] + 1] == sp[2 * o[t] + 1];
                if (same) {
                    first = sp[2 * o[t]];
                    last = sp[2 * o[t] + 1] < end ? sp[2 * o[t] + 1] : end;
                    same = first < last;
                }
            }
            if (same) {
                attend_group(j, row, h, group, first, last, sc);
                t += group - 1;
                continue;
            }
        }
        const float *q = j->q + row * (int64_t)j->n_heads * hd + (int64_t)h * hd;
        float *o = j->out + row * (int64_t)j->n_heads * hd + (int64_t)h * hd;
        const int64_t end = j->n_past + row + 1;
        int64_t first = 0;
        if (j->window > 0 && end > j->window) first = end - j->window;
        const int64_t whole[2] = {first, end};
        const int64_t *spans = whole;
        int64_t n_spans = 1;
        if (j->sel) {
            const int64_t a = j->sel->offsets[t], z = j->sel->offsets[t + 1];
            spans = j->sel->spans + 2 * a;
            n_spans = z - a;
        }
        if (!sc || n_spans == 0) { /* out of memory, or nothing selected: zeros, not a crash */
            memset(o, 0, (size_t)hd * sizeof(float));
            continue;
        }
        if (j->reader && !j->sel) {
            mi_kv_attend_params ap = {first, end, j->scale, NULL, 0, 0};
            if (j->method && j->method->entry->key_channels) {
                int64_t sink = 0, recent = 0;
                ap.channel_mask =
                    j->method->entry->key_channels(j->method, j->layer, kvh, &sink, &recent);
                ap.mask_first = sink;
                ap.mask_end = end - recent;
            }
            /* a head that keeps every channel of f32 pages reads them as dense does */
            if (ap.channel_mask || !j->kp) {
                const int32_t ng = read_grouped && h % group == 0 && t + group <= e ? group : 1;
                if (mi_kv_seq_attend_heads(j->seq, j->layer, kvh, q, ng, &ap, sc, o) !=
                    MI_STATUS_SUCCESS)
                    memset(o, 0, (size_t)ng * hd * sizeof(float)); /* arguments checked before */
                t += ng - 1;
                continue;
            }
        }
        float mx = -INFINITY;
        int64_t n_keys = 0;
        bool unread = false;
        for (int64_t si = 0; si < n_spans && !unread; si++) {
            const int64_t s1 = spans[2 * si + 1] < end ? spans[2 * si + 1] : end;
            for (int64_t p = spans[2 * si]; p < s1 && !unread;) {
                const int64_t pg = p / j->pt;
                const int64_t stop = (pg + 1) * j->pt < s1 ? (pg + 1) * j->pt : s1;
                const float *k = span_rows(j, 0, p, stop, kvh, tile);
                if (!k) {
                    unread = true;
                    break;
                }
                for (; p < stop; p++, k += hd) {
                    float v = mim_dot_row(MIM_TYPE_F32, k, q, hd) * j->scale;
                    sc[n_keys++] = v;
                    mx = v > mx ? v : mx;
                }
            }
        }
        if (unread) { /* out of memory for the tile (the spans were checked): zeros */
            memset(o, 0, (size_t)hd * sizeof(float));
            continue;
        }
        float sum = 0.0f;
        for (int64_t i = 0; i < n_keys; i++) {
            sc[i] = expf(sc[i] - mx);
            sum += sc[i];
        }
        for (int32_t d = 0; d < hd; d++) acc[d] = 0.0f;
        int64_t i = 0;
        for (int64_t si = 0; si < n_spans && !unread; si++) {
            const int64_t s1 = spans[2 * si + 1] < end ? spans[2 * si + 1] : end;
            for (int64_t p = spans[2 * si]; p < s1 && !unread;) {
                const int64_t pg = p / j->pt;
                const int64_t stop = (pg + 1) * j->pt < s1 ? (pg + 1) * j->pt : s1;
                const float *v = span_rows(j, 1, p, stop, kvh, tile);
                if (!v) {
                    unread = true;
                    break;
                }
                for (; p < stop; p++, v += hd) {
                    const float w = sc[i++];
                    for (int32_t d = 0; d < hd; d++) acc[d] += w * v[d];
                }
            }
        }
        if (n_keys == 0 || unread) {
            memset(o, 0, (size_t)hd * sizeof(float));
            continue;
        }
        const float inv = 1.0f / sum;
        for (int32_t d = 0; d < hd; d++) o[d] = acc[d] * inv;
    }
    free(sc);
    free(tile);
}

mi_status mim_seq_attend(const mim_seq_shape *sh, const mi_kv_seq *seq, kv_method *method,
                         int32_t layer, const float *q, int64_t n, int64_t n_past, float scale,
                         float *out, char *err, size_t err_size) {
    mi_kv_page_layout lay;
    const int32_t *ids = NULL;
    int64_t n_pages = 0;
    mi_kv_pool *pool = mi_kv_seq_pool(seq);
    mi_status st = mi_kv_pool_layout(pool, &lay);
    if (st == MI_STATUS_SUCCESS) st = mi_kv_seq_page_table(seq, layer, &ids, &n_pages);
    const bool reader = lay.dtype != MI_KV_F32 || (method && method->entry->key_channels);
    if (st == MI_STATUS_SUCCESS && kv_method_selects(method) && method->entry->key_channels)
        st = MI_STATUS_UNSUPPORTED; /* no method both selects rows and prunes key channels */
    if (st != MI_STATUS_SUCCESS || sh->hd > 1024) {
        snprintf(err, err_size, "layer %d: unreadable KV pages", layer);
        return st != MI_STATUS_SUCCESS ? st : MI_STATUS_INTERNAL;
    }
    kv_selection sel;
    kv_selection_init(&sel);
    const bool selects = kv_method_selects(method);
    if (selects) {
        if ((st = kv_method_select(method, seq, layer, q, n, &sel)) != MI_STATUS_SUCCESS) {
            kv_selection_free(&sel);
            snprintf(err, err_size, "layer %d: %s", layer, method->error);
            return st;
        }
        if (sel.n_lists != n * sh->n_heads || sel.open != sel.n_lists) {
            kv_selection_free(&sel);
            snprintf(err, err_size, "layer %d: kv method %s selected %lld lists for %lld", layer,
                     method->entry->name, (long long)sel.open, (long long)(n * sh->n_heads));
            return MI_STATUS_INTERNAL;
        }
    }
    const float **kp = malloc((size_t)(2 * (n_pages ? n_pages : 1)) * sizeof(float *));
    if (!kp) {
        kv_selection_free(&sel);
        snprintf(err, err_size, "out of memory for a page table");
        return MI_STATUS_OUT_OF_MEMORY;
    }
    const float **vp = kp + n_pages;
    for (int64_t i = 0; i < n_pages && lay.dtype == MI_KV_F32; i++) {
        const unsigned char *base = mi_kv_pool_page_data(pool, ids[i]);
        kp[i] = (const float *)(base + lay.k_offset);
        vp[i] = (const float *)(base + lay.v_offset);
    }
    seq_job j = {q,
                 out,
                 lay.dtype == MI_KV_F32 ? kp : NULL,
                 vp,
                 n,
                 n_past,
                 sh->window,
                 sh->n_heads,
                 sh->n_kv,
                 sh->hd,
                 lay.page_tokens,
                 (int64_t)(lay.head_stride / sizeof(float)),
                 scale,
                 selects ? &sel : NULL,
                 seq,
                 method,
                 layer,
                 reader};
    mim_pool_run(sh->pool, n * sh->n_heads, seq_task, &j);
    free(kp);
    kv_selection_free(&sel);
    return MI_STATUS_SUCCESS;
}

mi_status mim_seq_attention(mi_model *m, const mi_kv_seq *seq, kv_method *method, int32_t layer,
                            const float *q, int64_t n, int64_t n_past, float scale, float *out) {
    const mim_seq_shape sh = {m->n_heads, m->n_kv, m->hd, m->sliding_window, m->pool};
    char err[256];
    const mi_status st =
        mim_seq_attend(&sh, seq, method, layer, q, n, n_past, scale, out, err, sizeof err);
    return st == MI_STATUS_SUCCESS ? st : mim_model_fail(m, st, "%s", err);
}

/* ------------------------------------------------------------------------------------------ */
/* For the session operations of other files (model_blend.c)                                    */

mi_model *mim_session_model(const mi_session *s) { return s->model; }

mi_kv_seq *mim_session_seq(const mi_session *s) { return s->seq; }

int64_t mim_session_max_tokens(const mi_session *s) { return s->max_tokens; }

bool mim_session_dense(const mi_session *s) { return s->method == NULL; }

void mim_session_set_n_pos(mi_session *s, int64_t n_pos) { s->n_pos = n_pos; }

mi_status mim_session_fail(const mi_session *s, mi_status st, const char *msg) {
    return sfail(s, st, "%s", msg);
}

kv_method *mim_session_method(const mi_session *s) { return s->method; }
