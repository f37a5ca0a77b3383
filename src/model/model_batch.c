/*
 * model_batch.c: several sessions of one model in one forward pass (mi_session_prefill_batch,
 * mi_session_decode_batch).
 *
 * The rows of every session are stacked, [N = sum n_i, ...], for the per-token work: embeddings,
 * norms, the Q/K/V and O projections, RoPE (a table per session: its own positions, and its own
 * frequencies under dynamic scaling), the MLP and the LM head run once over all N rows, so each
 * weight matrix is read once per layer for the whole batch (the point of batching decode, whose
 * cost is reading the weights). Attention runs per session over its own cache, through exactly
 * the dispatch of a single call (model_forward.c): a fresh prompt through mi_prefill_attention
 * with the layer's patterns for its length, a long continuation through the queries-at-an-offset
 * prefill, a short one (decode) dense over the pages with the session's KV method selecting rows.
 * The library's varlen path (seq_lens) is not used: it pads every sequence to the longest, takes
 * one set of prefill parameters for all (the dense threshold and the sliding window depend on
 * the length), and covers fresh prompts only, while a batch mixes fresh prompts and continuations;
 * per-session calls are each parallel over heads already.
 *
 * The KV method's hooks run per session as in a single call (select inside the attention,
 * after_prefill / after_append once every layer has attended). A failure in the layers cuts every
 * session's layers back to their lengths before the call, so no session changes; a failure in a
 * method's compaction after the layers keeps the call's tokens in every session (as a single
 * call does), and is reported.
 *
 * With few rows (decode) each weight row is read once and multiplied with every session's row
 * (GEMV over N rows), which gives the same dot products, in the same order, as a single decode:
 * a decode batch of up to BATCH_GEMV_MAX_ROWS sessions equals single decodes bit for bit. More
 * rows go to mim_matmul (sgemm over the dequantised matrix), where the accumulation order may
 * differ from a single call's by float rounding.
 */
#include "minference_session.h"

#include "../kv/kv_method.h"
#include "minference_kv.h"
#include "model_runner.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Rows up to which the batch multiplies row by row over the encoded weights (see above). */
#define BATCH_GEMV_MAX_ROWS 16

/* Sessions of one call at most: far beyond any batch worth running on a CPU, and it keeps the
 * buffer sizes below int64_t overflow for every shape a model can load. */
#define BATCH_MAX_SESSIONS 65536

/* count (1..3) matrices of the same input x [n, cols]. */
static void bmatmul(mi_model *m, const float *x, int64_t n, int count, const mim_weight *const *ws,
                    float *const *outs, const int64_t *ldos) {
    if (n > BATCH_GEMV_MAX_ROWS && m->wscratch) {
        for (int i = 0; i < count; i++) mim_matmul(m, x, n, ws[i], outs[i], ldos[i]);
        return;
    }
    mim_matmul_rows(m, x, n, count, ws, outs, ldos);
}

static void bmatmul1(mi_model *m, const float *x, int64_t n, const mim_weight *w, float *out,
                     int64_t ldo) {
    bmatmul(m, x, n, 1, &w, &out, &ldo);
}

/* One session of the batch: its rows off..off+n-1 of the stacked buffers. */
typedef struct bseg {
    mi_session *s;
    mi_kv_seq *seq;
    kv_method *method;
    const int32_t *tokens;
    int64_t n, off;
    int64_t pos;    /* RoPE position of its first token (tokens seen) */
    int64_t n_past; /* rows before the call (differs from pos once a method dropped rows) */
    int64_t *rows0; /* [n_layers] rows per layer before the call */
    float *qkeep;   /* the method's queries per layer [n_layers][q_rows][qd], or NULL */
    int64_t q_rows;
} bseg;

typedef struct bbufs {
    float *x, *h, *q, *att, *g, *u, *cos_t, *sin_t, *inv_freq, *kn, *vn;
    int64_t *rows0;
    mi_head_pattern *pat;
} bbufs;

static void free_bbufs(bbufs *b, bseg *sg, int64_t ns) {
    free(b->x);
    free(b->h);
    free(b->q);
    free(b->att);
    free(b->g);
    free(b->u);
    free(b->cos_t);
    free(b->sin_t);
    free(b->inv_freq);
    free(b->kn);
    free(b->vn);
    free(b->rows0);
    free(b->pat);
    for (int64_t i = 0; i < ns; i++) free(sg[i].qkeep);
}

/* The attention of one session's rows in layer l, dispatched as model_forward.c does. */
static mi_status seg_attention(mi_model *m, const bseg *sg, int32_t l, const float *q, float *kc,
                               float *vc, float *att, mi_head_pattern *pat) {
    const int64_t n = sg->n, lp = sg->rows0[l];
    mi_status st;
    if (sg->n_past == 0 && n > 1) {
        if ((st = mim_layer_patterns(m, l, n, pat)) != MI_STATUS_SUCCESS) return st;
        const mi_prefill_params pp = mim_prefill_params_for(m, n);
        mi_tensor tq =
            mi_tensor_blhd((float *)q, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_heads, n, m->hd);
        mi_tensor tk = mi_tensor_blhd(kc, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_kv, n, m->hd);
        mi_tensor tv = mi_tensor_blhd(vc, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_kv, n, m->hd);
        mi_tensor to = mi_tensor_blhd(att, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_heads, n, m->hd);
        st = mi_prefill_attention(m->ctx, &tq, &tk, &tv, NULL, pat, &pp, &to, NULL, NULL, 0);
        if (st != MI_STATUS_SUCCESS)
            return mim_model_fail(m, st, "layer %d attention: %s", l,
                                  mi_context_last_error(m->ctx));
        return st;
    }
    if (n >= mim_seq_prefill_from(m))
        return mim_seq_prefill_attention(m, sg->seq, l, q, n, lp, att);
    const float scale = mim_prefill_params_for(m, n).softmax_scale;
    return mim_seq_attention(m, sg->seq, sg->method, l, q, n, lp, scale, att);
}

/* The forward pass of every segment. *kept: the layers succeeded, so every session keeps the
 * call's tokens even if a method's compaction then failed. */
static mi_status batch_forward(mi_model *m, bseg *sg, int64_t ns, int64_t N, float *logits,
                               bool *kept) {
    *kept = false;
    const double t_start = mim_now_s();
    double t_attn = 0.0, t_gemm = 0.0, t0;
    const int64_t D = m->hidden, qd = (int64_t)m->n_heads * m->hd, kvd = (int64_t)m->n_kv * m->hd;
    const int64_t chunk = N < m->params.mlp_chunk ? N : m->params.mlp_chunk;
    const int32_t half = m->rope.dim / 2;
    bool fresh = true;
    for (int64_t i = 0; i < ns; i++) fresh = fresh && sg[i].n_past == 0;
    if (N > BATCH_GEMV_MAX_ROWS) mim_ensure_wscratch(m);
    bbufs b;
    memset(&b, 0, sizeof(b));
    b.x = malloc((size_t)(N * D) * sizeof(float));
    b.h = malloc((size_t)(N * (D > qd ? D : qd)) * sizeof(float));
    b.q = malloc((size_t)(N * qd) * sizeof(float));
    b.att = malloc((size_t)(N * qd) * sizeof(float));
    b.g = malloc((size_t)(chunk * m->ffn) * sizeof(float));
    b.u = malloc((size_t)(chunk * m->ffn) * sizeof(float));
    b.cos_t = malloc((size_t)(N * half) * sizeof(float));
    b.sin_t = malloc((size_t)(N * half) * sizeof(float));
    b.inv_freq = malloc((size_t)(half ? half : 1) * sizeof(float));
    b.kn = malloc((size_t)(N * kvd) * sizeof(float));
    b.vn = malloc((size_t)(N * kvd) * sizeof(float));
    b.rows0 = malloc((size_t)(ns * m->n_layers) * sizeof(int64_t));
    b.pat = malloc((size_t)m->n_heads * sizeof(mi_head_pattern));
    bool ok = b.x && b.h && b.q && b.att && b.g && b.u && b.cos_t && b.sin_t && b.inv_freq &&
              b.kn && b.vn && b.rows0 && b.pat;
    for (int64_t i = 0; i < ns && ok; i++) {
        bseg *s = &sg[i];
        s->rows0 = b.rows0 + i * m->n_layers;
        for (int32_t l = 0; l < m->n_layers; l++) s->rows0[l] = mi_kv_seq_length(s->seq, l);
        if (s->method && s->method->q_rows > 0 && s->n >= 2) {
            s->q_rows = s->n < s->method->q_rows ? s->n : s->method->q_rows;
            s->qkeep = malloc((size_t)(m->n_layers * s->q_rows * qd) * sizeof(float));
            ok = s->qkeep != NULL;
        }
    }
    if (!ok) {
        free_bbufs(&b, sg, ns);
        return mim_model_fail(m, MI_STATUS_OUT_OF_MEMORY,
                              "out of memory for the activations of %lld tokens of %lld sessions",
                              (long long)N, (long long)ns);
    }
    for (int64_t i = 0; i < ns; i++) {
        const bseg *s = &sg[i];
        float mscale;
        mim_rope_freqs(&m->rope, s->pos + s->n, b.inv_freq, &mscale);
        mim_rope_table(b.inv_freq, mscale, m->rope.dim, s->pos, s->n, b.cos_t + s->off * half,
                       b.sin_t + s->off * half);
        for (int64_t t = 0; t < s->n; t++)
            mim_dequant_row(m->tok_embd.type,
                            (const unsigned char *)m->tok_embd.data +
                                (size_t)s->tokens[t] * m->tok_embd.row_bytes,
                            b.x + (s->off + t) * D, D);
    }

    mi_status st = MI_STATUS_SUCCESS;
    for (int32_t l = 0; l < m->n_layers && st == MI_STATUS_SUCCESS; l++) {
        const mim_layer *L = &m->layers[l];
        mim_rmsnorm(b.x, L->attn_norm, b.h, N, D, m->eps);
        {
            const mim_weight *ws[3] = {&L->wq, &L->wk, &L->wv};
            float *outs[3] = {b.q, b.kn, b.vn};
            const int64_t ldos[3] = {qd, kvd, kvd};
            t0 = mim_now_s();
            bmatmul(m, b.h, N, 3, ws, outs, ldos);
            t_gemm += mim_now_s() - t0;
        }
        mim_add_bias(b.q, L->bq, N, qd, qd);
        mim_add_bias(b.kn, L->bk, N, kvd, kvd);
        mim_add_bias(b.vn, L->bv, N, kvd, kvd);
        mim_rope_apply(&m->rope, b.q, N, m->n_heads, m->hd, qd, b.cos_t, b.sin_t);
        mim_rope_apply(&m->rope, b.kn, N, m->n_kv, m->hd, kvd, b.cos_t, b.sin_t);
        t0 = mim_now_s();
        for (int64_t i = 0; i < ns && st == MI_STATUS_SUCCESS; i++) {
            const bseg *s = &sg[i];
            float *kc = b.kn + s->off * kvd, *vc = b.vn + s->off * kvd;
            mi_tensor tk = mi_tensor_blhd(kc, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_kv, s->n, m->hd);
            mi_tensor tv = mi_tensor_blhd(vc, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_kv, s->n, m->hd);
            if ((st = mi_kv_seq_append(s->seq, l, &tk, &tv)) != MI_STATUS_SUCCESS) {
                mim_model_fail(m, st, "session %lld, layer %d: the KV cache: %s", (long long)i, l,
                               mi_kv_pool_last_error(mi_kv_seq_pool(s->seq)));
                break;
            }
            if (s->qkeep)
                memcpy(s->qkeep + (int64_t)l * s->q_rows * qd,
                       b.q + (s->off + s->n - s->q_rows) * qd,
                       (size_t)(s->q_rows * qd) * sizeof(float));
            st = seg_attention(m, s, l, b.q + s->off * qd, kc, vc, b.att + s->off * qd, b.pat);
            if (st != MI_STATUS_SUCCESS) {
                char msg[MIM_ERROR_CAPACITY];
                snprintf(msg, sizeof msg, "%s", m->last_error);
                mim_model_fail(m, st, "session %lld: %s", (long long)i, msg);
            }
        }
        t_attn += mim_now_s() - t0;
        if (st != MI_STATUS_SUCCESS) break;
        t0 = mim_now_s();
        bmatmul1(m, b.att, N, &L->wo, b.h, D);
        t_gemm += mim_now_s() - t0;
        for (int64_t i = 0; i < N * D; i++) b.x[i] += b.h[i];
        for (int64_t c0 = 0; c0 < N; c0 += chunk) {
            const int64_t c = N - c0 < chunk ? N - c0 : chunk;
            float *xc = b.x + c0 * D;
            mim_rmsnorm(xc, L->ffn_norm, b.h, c, D, m->eps);
            const mim_weight *ws[2] = {&L->wg, &L->wu};
            float *outs[2] = {b.g, b.u};
            const int64_t ldos[2] = {m->ffn, m->ffn};
            t0 = mim_now_s();
            bmatmul(m, b.h, c, 2, ws, outs, ldos);
            t_gemm += mim_now_s() - t0;
            for (int64_t i = 0; i < c * m->ffn; i++) {
                const float g = b.g[i];
                b.g[i] = g / (1.0f + expf(-g)) * b.u[i];
            }
            t0 = mim_now_s();
            bmatmul1(m, b.g, c, &L->wd, b.h, D);
            t_gemm += mim_now_s() - t0;
            for (int64_t i = 0; i < c * D; i++) xc[i] += b.h[i];
        }
        if (m->progress) m->progress(m->progress_user, l + 1, m->n_layers, N);
    }
    if (st != MI_STATUS_SUCCESS) {
        for (int64_t i = 0; i < ns; i++) /* no session loses or gains anything */
            for (int32_t l = 0; l < m->n_layers; l++)
                mi_kv_seq_truncate(sg[i].seq, l, sg[i].rows0[l]);
        free_bbufs(&b, sg, ns);
        return st;
    }
    if (logits) {
        /* the last row of each session, normed, through the LM head in one pass */
        for (int64_t i = 0; i < ns; i++)
            mim_rmsnorm(b.x + (sg[i].off + sg[i].n - 1) * D, m->out_norm, b.h + i * D, 1, D,
                        m->eps);
        t0 = mim_now_s();
        bmatmul1(m, b.h, ns, &m->output, logits, m->vocab);
        t_gemm += mim_now_s() - t0;
    }
    if (fresh) {
        m->timing.n_tokens = N;
        m->timing.total_s = mim_now_s() - t_start;
        m->timing.attention_s = t_attn;
        m->timing.gemm_s = t_gemm;
    }
    *kept = true;
    for (int64_t i = 0; i < ns; i++) {
        if (!sg[i].method) continue;
        mi_status ms =
            mim_method_after_call(m, sg[i].seq, sg[i].method, sg[i].qkeep, sg[i].q_rows, sg[i].n);
        if (ms != MI_STATUS_SUCCESS && st == MI_STATUS_SUCCESS) {
            char msg[MIM_ERROR_CAPACITY];
            snprintf(msg, sizeof msg, "%s", m->last_error);
            st = mim_model_fail(m, ms, "session %lld: kv method compaction: %s", (long long)i, msg);
        }
    }
    free_bbufs(&b, sg, ns);
    return st;
}

/* The message goes to every session of the batch (the ones that are not NULL) and to the model
 * of the first one. */
static mi_status bfail(mi_session *const *ss, size_t n, mi_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

static mi_status bfail(mi_session *const *ss, size_t n, mi_status st, const char *fmt, ...) {
    char msg[MIM_ERROR_CAPACITY];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mi_model *m = NULL;
    for (size_t i = 0; i < n; i++) {
        if (!ss[i]) continue;
        mim_session_fail(ss[i], st, msg);
        if (!m) m = mim_session_model(ss[i]);
    }
    if (m) mim_model_fail(m, st, "%s", msg);
    return st;
}

static mi_status run_batch(mi_session *const *ss, const int32_t *const *tokens,
                           const size_t *n_tokens, size_t n, float *logits, const char *what) {
    if (!ss || n == 0) return MI_STATUS_INVALID_ARGUMENT;
    for (size_t i = 0; i < n; i++)
        if (ss[i]) mim_session_fail(ss[i], MI_STATUS_SUCCESS, "");
    if (n > BATCH_MAX_SESSIONS)
        return bfail(ss, n, MI_STATUS_INVALID_ARGUMENT, "%s batch: %zu sessions, over %d", what, n,
                     BATCH_MAX_SESSIONS);
    for (size_t i = 0; i < n; i++)
        if (!ss[i])
            return bfail(ss, n, MI_STATUS_INVALID_ARGUMENT, "%s batch: session %zu is NULL", what,
                         i);
    mi_model *m = mim_session_model(ss[0]);
    for (size_t i = 1; i < n; i++)
        if (mim_session_model(ss[i]) != m)
            return bfail(ss, n, MI_STATUS_INVALID_ARGUMENT,
                         "%s batch: session %zu belongs to another model than session 0 (a batch "
                         "runs one model's weights)",
                         what, i);
    if (m->gpu && n == 1 && tokens && n_tokens && tokens[0] && n_tokens[0] > 0)
        return mi_session_prefill(ss[0], tokens[0], n_tokens[0], logits); /* a single call */
    if (m->gpu)
        return bfail(ss, n, MI_STATUS_UNSUPPORTED,
                     "batches of sessions run on the CPU model only (the CUDA model's sessions "
                     "take turns in its device cache: run them one call at a time)");
    /* a session twice would append its rows twice at the same positions; sort-free check, as
     * batches are small */
    for (size_t i = 1; i < n; i++)
        for (size_t k = 0; k < i; k++)
            if (ss[i] == ss[k])
                return bfail(ss, n, MI_STATUS_INVALID_ARGUMENT,
                             "%s batch: session %zu is session %zu again (each session may "
                             "appear once; fork it for a second sequence)",
                             what, i, k);
    if (!tokens || !n_tokens)
        return bfail(ss, n, MI_STATUS_INVALID_ARGUMENT, "%s batch: no tokens", what);
    int64_t N = 0;
    for (size_t i = 0; i < n; i++) {
        if (!tokens[i] || n_tokens[i] == 0)
            return bfail(ss, n, MI_STATUS_INVALID_ARGUMENT, "%s batch: no tokens for session %zu",
                         what, i);
        const int64_t past = mi_session_n_past(ss[i]), cap = mim_session_max_tokens(ss[i]);
        if (n_tokens[i] > (size_t)(INT64_MAX / 4) - (size_t)N)
            return bfail(ss, n, MI_STATUS_INVALID_ARGUMENT, "%s batch: too many tokens", what);
        if (cap > 0 && (int64_t)n_tokens[i] > cap - past)
            return bfail(ss, n, MI_STATUS_INVALID_ARGUMENT,
                         "%s batch: session %zu: %lld + %zu tokens exceed its max_tokens = %lld",
                         what, i, (long long)past, n_tokens[i], (long long)cap);
        for (size_t t = 0; t < n_tokens[i]; t++)
            if (tokens[i][t] < 0 || tokens[i][t] >= m->vocab)
                return bfail(ss, n, MI_STATUS_INVALID_ARGUMENT,
                             "%s batch: session %zu: token %d at %zu is outside the vocabulary "
                             "(%d)",
                             what, i, tokens[i][t], t, m->vocab);
        N += (int64_t)n_tokens[i];
    }
    bseg *sg = calloc(n, sizeof(*sg));
    if (!sg) return bfail(ss, n, MI_STATUS_OUT_OF_MEMORY, "out of memory for a batch");
    int64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        bseg *s = &sg[i];
        s->s = ss[i];
        s->seq = mim_session_seq(ss[i]);
        s->method = mim_session_method(ss[i]);
        s->tokens = tokens[i];
        s->n = (int64_t)n_tokens[i];
        s->off = off;
        s->pos = mi_session_n_past(ss[i]);
        s->n_past = mi_kv_seq_tokens(s->seq);
        off += s->n;
    }
    m->last_error[0] = 0;
    bool kept = false;
    mi_status st = batch_forward(m, sg, (int64_t)n, N, logits, &kept);
    if (kept)
        for (size_t i = 0; i < n; i++) mim_session_set_n_pos(ss[i], sg[i].pos + sg[i].n);
    free(sg);
    if (st != MI_STATUS_SUCCESS) {
        char msg[MIM_ERROR_CAPACITY];
        snprintf(msg, sizeof msg, "%s", m->last_error);
        bfail(ss, n, st, "%s batch: %s", what, msg);
    }
    return st;
}

mi_status mi_session_prefill_batch(mi_session *const *sessions, const int32_t *const *tokens,
                                   const size_t *n_tokens, size_t n, float *logits) {
    return run_batch(sessions, tokens, n_tokens, n, logits, "prefill");
}

mi_status mi_session_decode_batch(mi_session *const *sessions, const int32_t *tokens, size_t n,
                                  float *logits) {
    if (!sessions || n == 0) return MI_STATUS_INVALID_ARGUMENT;
    if (!tokens) return bfail(sessions, n, MI_STATUS_INVALID_ARGUMENT, "decode batch: no tokens");
    if (n > BATCH_MAX_SESSIONS) return run_batch(sessions, NULL, NULL, n, logits, "decode");
    const int32_t **tp = malloc(n * sizeof(*tp));
    size_t *np = malloc(n * sizeof(*np));
    mi_status st;
    if (!tp || !np) {
        st = bfail(sessions, n, MI_STATUS_OUT_OF_MEMORY, "out of memory for a batch");
    } else {
        for (size_t i = 0; i < n; i++) tp[i] = tokens + i, np[i] = 1;
        st = run_batch(sessions, tp, np, n, logits, "decode");
    }
    free(tp);
    free(np);
    return st;
}
