/*
 * model_forward.c: the llama-family forward pass on the CPU.
 *
 * Per layer, for n new tokens at positions n_past..n_past+n-1:
 *   h = RMSNorm(x); q, k, v = h Wq, h Wk, h Wv (+ biases); RoPE on q and k;
 *   k, v are written straight into the layer's cache rows ([pos][n_kv * hd], which is the
 *   [B, L, H, D] layout mi_tensor_blhd describes, so no copy or transpose is needed); for a
 *   session they go to a buffer and are appended to its pages (model_session.c);
 *   attention: a fresh prompt goes through mi_prefill_attention with the layer's per-head
 *   patterns; a later call of at least MIM_SEQ_PREFILL_FROM tokens (follow-up turn, chunk) goes
 *   through it too, the queries at an offset over the cache (model_seq_prefill.c);
 *   shorter continuations (decode) are dense over the cache;
 *   x += attn Wo; then the MLP in chunks of mlp_chunk rows, so that the [n, ffn] intermediates
 *   never exist for the whole prompt: x += (silu(h Wg) * (h Wu)) Wd with h = RMSNorm(x).
 * The final norm and LM head run for the last position only.
 */
#define _POSIX_C_SOURCE 200809L
#include "../kv/kv_method.h"
#include "minference_kv.h"
#include "model_gpu.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Matmul                                                                                      */

typedef struct gemv_job {
    const mim_weight *w;
    const float *x;
    int64_t n, ldo;
    float *out;
} gemv_job;

static void gemv_task(void *arg, int64_t b, int64_t e, int thread) {
    (void)thread;
    const gemv_job *j = arg;
    const unsigned char *base = j->w->data;
    for (int64_t r = b; r < e; r++) {
        const void *row = base + (size_t)r * j->w->row_bytes;
        for (int64_t i = 0; i < j->n; i++)
            j->out[i * j->ldo + r] =
                mim_dot_row(j->w->type, row, j->x + i * j->w->cols, j->w->cols);
    }
}

typedef struct dequant_job {
    const mim_weight *w;
    int64_t first; /* weight row of dst row 0 */
    float *dst;
} dequant_job;

static void dequant_task(void *arg, int64_t b, int64_t e, int thread) {
    (void)thread;
    const dequant_job *j = arg;
    const unsigned char *base = j->w->data;
    for (int64_t r = b; r < e; r++)
        mim_dequant_row(j->w->type, base + (size_t)(j->first + r) * j->w->row_bytes,
                        j->dst + r * j->w->cols, j->w->cols);
}

/* Below this many rows of x, reading each encoded weight row once per x row beats expanding
 * the matrix for sgemm (decode is n = 1). */
#define GEMV_MAX_ROWS 4

typedef struct sgemm_job {
    const float *x, *w;
    int64_t n, k, ldo;
    float *out;
} sgemm_job;

/* Each thread multiplies x by its own slice of weight rows (output columns) with a
 * single-threaded sgemm, so no BLAS thread pool competes with the OpenMP team. */
static void sgemm_task(void *arg, int64_t b, int64_t e, int thread) {
    (void)thread;
    const sgemm_job *j = arg;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)j->n, (int)(e - b), (int)j->k, 1.0f,
                j->x, (int)j->k, j->w + b * j->k, (int)j->k, 0.0f, j->out + b, (int)j->ldo);
}

void mim_ensure_wscratch(mi_model *m) {
    if (m->wscratch) return;
    size_t most = 0;
    const mim_layer *L = &m->layers[0];
    const mim_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wg, &L->wu, &L->wd};
    for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]); i++)
        if ((size_t)(ws[i]->rows * ws[i]->cols) > most) most = (size_t)(ws[i]->rows * ws[i]->cols);
    m->wscratch = malloc(most * sizeof(float));
    m->wscratch_floats = most; /* NULL is fine: the matmuls then stay on their GEMV paths */
}

void mim_dequant_matrix(mi_model *m, const mim_weight *w, float *dst) {
    mim_dequant_rows(m, w, 0, w->rows, dst);
}

void mim_dequant_rows(mi_model *m, const mim_weight *w, int64_t first, int64_t count, float *dst) {
    dequant_job j = {w, first, dst};
    mim_pool_run(m->pool, count, dequant_task, &j);
}

void mim_matmul(mi_model *m, const float *x, int64_t n, const mim_weight *w, float *out,
                int64_t ldo) {
    if (n <= 0) return;
    if (n <= GEMV_MAX_ROWS || !m->wscratch) {
        gemv_job j = {w, x, n, ldo, out};
        mim_pool_run(m->pool, w->rows, gemv_task, &j);
        return;
    }
    const float *wf = w->data;
    if (w->type != MIM_TYPE_F32) {
        mim_dequant_matrix(m, w, m->wscratch);
        wf = m->wscratch;
    }
    sgemm_job j = {x, wf, n, w->cols, ldo, out};
    mim_pool_run(m->pool, w->rows, sgemm_task, &j);
}

/* Several matrices of the same input x [n, cols] in one parallel region (q/k/v, gate/up),
 * each encoded weight row read once for every row of x (mim_dot_rows, whose arithmetic per row
 * is mim_dot_row's): decode is a chain of short GEMVs, and each region costs a fork/join. */
typedef struct rows_job {
    const mim_weight *w[3];
    float *out[3];
    int64_t ldo[3];
    int64_t first[4]; /* global row index where each matrix starts; first[count] = total */
    int count;
    const float *x;
    int64_t n;
} rows_job;

#define ROWS_PER_DOT 16 /* rows of x per mim_dot_rows call (its output buffer) */

static void rows_task(void *arg, int64_t b, int64_t e, int thread) {
    (void)thread;
    const rows_job *j = arg;
    int k = 0;
    float d[ROWS_PER_DOT];
    for (int64_t g = b; g < e; g++) {
        while (g >= j->first[k + 1]) k++;
        const mim_weight *w = j->w[k];
        const int64_t r = g - j->first[k];
        const unsigned char *row = (const unsigned char *)w->data + (size_t)r * w->row_bytes;
        for (int64_t i0 = 0; i0 < j->n; i0 += ROWS_PER_DOT) {
            const int64_t c = j->n - i0 < ROWS_PER_DOT ? j->n - i0 : ROWS_PER_DOT;
            mim_dot_rows(w->type, row, j->x + i0 * w->cols, w->cols, c, w->cols, d);
            for (int64_t i = 0; i < c; i++) j->out[k][(i0 + i) * j->ldo[k] + r] = d[i];
        }
    }
}

void mim_matmul_rows(mi_model *m, const float *x, int64_t n, int count, const mim_weight *const *ws,
                     float *const *outs, const int64_t *ldos) {
    rows_job j;
    memset(&j, 0, sizeof(j));
    j.count = count;
    j.x = x;
    j.n = n;
    for (int i = 0; i < count; i++) {
        j.w[i] = ws[i];
        j.out[i] = outs[i];
        j.ldo[i] = ldos[i];
        j.first[i + 1] = j.first[i] + ws[i]->rows;
    }
    mim_pool_run(m->pool, j.first[count], rows_task, &j);
}

/* Prefill rows go to mim_matmul, decode's one row to mim_matmul_rows. */
static void matmul_multi(mi_model *m, const float *x, int64_t n, int count,
                         const mim_weight *const *ws, float *const *outs, const int64_t *ldos) {
    if (n != 1) {
        for (int i = 0; i < count; i++) mim_matmul(m, x, n, ws[i], outs[i], ldos[i]);
        return;
    }
    mim_matmul_rows(m, x, n, count, ws, outs, ldos);
}

/* ------------------------------------------------------------------------------------------ */
/* Elementwise pieces                                                                          */

void mim_rmsnorm(const float *x, const float *w, float *out, int64_t n, int64_t dim, float eps) {
    for (int64_t i = 0; i < n; i++) {
        const float *xi = x + i * dim;
        double ss = 0.0;
        for (int64_t k = 0; k < dim; k++) ss += (double)xi[k] * xi[k];
        float r = (float)(1.0 / sqrt(ss / (double)dim + (double)eps));
        for (int64_t k = 0; k < dim; k++) out[i * dim + k] = xi[k] * r * w[k];
    }
}

void mim_add_bias(float *x, const float *b, int64_t n, int64_t dim, int64_t ld) {
    if (!b) return;
    for (int64_t i = 0; i < n; i++)
        for (int64_t k = 0; k < dim; k++) x[i * ld + k] += b[k];
}

/* ------------------------------------------------------------------------------------------ */
/* Dense attention over the cache for rows that continue a sequence                           */

typedef struct cont_job {
    const float *q; /* [n, n_heads * hd] */
    const float *k, *v;
    float *out;
    int64_t n, n_past;
    int32_t n_heads, n_kv, hd;
    float scale;
    int64_t window; /* keys per query; 0: all */
} cont_job;

/* One (row, head) per task item, in three passes over the keys (scores, exponentials, weighted
 * values) so that each inner loop is a plain vectorisable loop over head_dim; the scores need
 * one buffer of the context length per task range. */
static void cont_task(void *arg, int64_t b, int64_t e, int thread) {
    (void)thread;
    const cont_job *j = arg;
    const int64_t kvd = (int64_t)j->n_kv * j->hd;
    const int32_t group = j->n_heads / j->n_kv, hd = j->hd;
    float *sc = malloc((size_t)(j->n_past + j->n) * sizeof(float));
    float acc[1024];
    for (int64_t t = b; t < e; t++) {
        int64_t row = t / j->n_heads;
        int32_t h = (int32_t)(t % j->n_heads);
        const float *q = j->q + row * (int64_t)j->n_heads * hd + (int64_t)h * hd;
        const float *kb = j->k + (int64_t)(h / group) * hd;
        const float *vb = j->v + (int64_t)(h / group) * hd;
        float *o = j->out + row * (int64_t)j->n_heads * hd + (int64_t)h * hd;
        int64_t n_keys = j->n_past + row + 1;
        if (j->window > 0 && n_keys > j->window) { /* the window's keys, at their positions */
            kb += (n_keys - j->window) * kvd;
            vb += (n_keys - j->window) * kvd;
            n_keys = j->window;
        }
        if (!sc) { /* out of memory: a row of zeros rather than a crash */
            memset(o, 0, (size_t)hd * sizeof(float));
            continue;
        }
        float mx = -INFINITY;
        for (int64_t p = 0; p < n_keys; p++) {
            /* a float reduction does not vectorise by itself (no reassociation): use the
             * explicit vector dot */
            sc[p] = mim_dot_row(MIM_TYPE_F32, kb + p * kvd, q, hd) * j->scale;
            mx = sc[p] > mx ? sc[p] : mx;
        }
        float sum = 0.0f;
        for (int64_t p = 0; p < n_keys; p++) {
            sc[p] = expf(sc[p] - mx);
            sum += sc[p];
        }
        for (int32_t d = 0; d < hd; d++) acc[d] = 0.0f;
        for (int64_t p = 0; p < n_keys; p++) {
            const float *vp = vb + p * kvd;
            const float w = sc[p];
            for (int32_t d = 0; d < hd; d++) acc[d] += w * vp[d];
        }
        const float inv = 1.0f / sum;
        for (int32_t d = 0; d < hd; d++) o[d] = acc[d] * inv;
    }
    free(sc);
}

/* ------------------------------------------------------------------------------------------ */

mi_status mim_cache_capacity(mi_model *m, int64_t need, int64_t current, int64_t *cap_out) {
    if (m->params.max_context > 0 && need > m->params.max_context)
        return mim_model_fail(m, MI_STATUS_INVALID_ARGUMENT,
                              "%lld tokens exceed the KV cache capacity max_context = %lld",
                              (long long)need, (long long)m->params.max_context);
    /* A prompt gets what it needs plus room for a generation; decode growth is geometric (by a
     * quarter) so appending stays amortised O(1) without doubling a long prompt's cache. */
    int64_t cap = need + 1024;
    if (current > 0 && cap < current + current / 4) cap = current + current / 4;
    cap = (cap + 255) / 256 * 256;
    if (m->params.max_context > 0 && cap > m->params.max_context) cap = m->params.max_context;
    *cap_out = cap;
    return MI_STATUS_SUCCESS;
}

static mi_status ensure_cache(mi_model *m, int64_t need) {
    if (need <= m->cache_cap) return MI_STATUS_SUCCESS;
    int64_t cap = 0; /* always set on success; gcc cannot tell once the call is inlined */
    mi_status st = mim_cache_capacity(m, need, m->cache_cap, &cap);
    if (st != MI_STATUS_SUCCESS) return st;
    const size_t row = (size_t)m->n_kv * m->hd * sizeof(float);
    if (!m->k_cache) {
        m->k_cache = calloc((size_t)m->n_layers, sizeof(float *));
        m->v_cache = calloc((size_t)m->n_layers, sizeof(float *));
        if (!m->k_cache || !m->v_cache)
            return mim_model_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory for the KV cache");
    }
    for (int l = 0; l < m->n_layers; l++) {
        float *k = realloc(m->k_cache[l], (size_t)cap * row);
        if (k) m->k_cache[l] = k;
        float *v = realloc(m->v_cache[l], (size_t)cap * row);
        if (v) m->v_cache[l] = v;
        if (!k || !v)
            return mim_model_fail(m, MI_STATUS_OUT_OF_MEMORY,
                                  "out of memory for a KV cache of %lld tokens", (long long)cap);
    }
    m->cache_cap = cap;
    return MI_STATUS_SUCCESS;
}

/* Whether a pattern reads field (mi_pattern_field). */
static bool reads_field(mi_pattern_type type, const char *field) {
    for (int32_t i = 0; mi_pattern_field(type, i); i++)
        if (strcmp(mi_pattern_field(type, i), field) == 0) return true;
    return false;
}

/* Under a sliding window W a query sees keys i - W < j <= i: the A-shape with no sinks and a
 * local part of W, exactly. A head's pattern is intersected with it: a pattern with a local
 * window (n_local: A- and Tri-shape) keeps it (clamped to W, sinks dropped, as they fall outside
 * the window); every other pattern becomes the window itself, which is exact and already W/L of
 * dense. */
static void apply_window(const mi_model *m, int64_t n, mi_head_pattern *pat) {
    if (m->sliding_window <= 0 || n <= m->sliding_window) return;
    const int32_t w = m->sliding_window > INT32_MAX ? INT32_MAX : (int32_t)m->sliding_window;
    for (int32_t h = 0; h < m->n_heads; h++) {
        int32_t local = w;
        if (reads_field(pat[h].type, "n_local") && pat[h].n_local < w) local = pat[h].n_local;
        pat[h] = mi_head_pattern_default(MI_PATTERN_A_SHAPE);
        pat[h].n_init = 0;
        pat[h].n_local = local;
    }
}

mi_prefill_params mim_prefill_params_for(const mi_model *m, int64_t n) {
    mi_prefill_params pp = mi_prefill_default_params();
    pp.softmax_scale = 1.0f / sqrtf((float)m->hd);
    pp.dense_below = m->dense_below;
    /* the library's dense fallback would see past the window */
    if (m->sliding_window > 0 && n > m->sliding_window) pp.dense_below = 0;
    return pp;
}

mi_status mim_layer_patterns(mi_model *m, int32_t layer, int64_t n, mi_head_pattern *pat) {
    mi_status st = MI_STATUS_SUCCESS;
    mi_pattern_type t = (mi_pattern_type)m->pattern;
    if (m->pattern < 0) {
        if (m->config) {
            st = mi_config_layer(m->ctx, m->config, layer, m->n_heads, pat, NULL);
            if (st != MI_STATUS_SUCCESS)
                return mim_model_fail(m, st, "pattern config, layer %d: %s", layer,
                                      mi_context_last_error(m->ctx));
            apply_window(m, n, pat);
            return MI_STATUS_SUCCESS;
        }
        t = MI_PATTERN_VERTICAL_SLASH;
    }
    for (int32_t h = 0; h < m->n_heads; h++) pat[h] = mi_head_pattern_default(t);
    apply_window(m, n, pat);
    return st;
}

typedef struct fwd_bufs {
    float *x, *h, *q, *att, *g, *u, *cos_t, *sin_t, *inv_freq;
    float *kn, *vn; /* a session's new K and V rows before they go into its pages */
    float *qkeep;   /* a KV method's queries per layer: [n_layers][q_rows][n_heads * hd] */
    int64_t q_rows;
    int64_t *rows0; /* a session's rows per layer before the call (a KV method may make them
                     * differ: PyramidKV) */
    mi_head_pattern *pat;
} fwd_bufs;

static void free_bufs(fwd_bufs *b) {
    free(b->x);
    free(b->h);
    free(b->q);
    free(b->att);
    free(b->g);
    free(b->u);
    free(b->cos_t);
    free(b->sin_t);
    free(b->inv_freq);
    free(b->pat);
    free(b->kn);
    free(b->vn);
    free(b->qkeep);
    free(b->rows0);
}

mi_status mim_method_after_call(mi_model *m, mi_kv_seq *seq, kv_method *method, const float *qkeep,
                                int64_t q_rows, int64_t n) {
    const int64_t qd = (int64_t)m->n_heads * m->hd;
    kv_method_appended(method, n);
    for (int32_t l = 0; l < m->n_layers; l++) {
        mi_status st = MI_STATUS_SUCCESS;
        if (n >= 2 && qkeep)
            st = kv_method_after_prefill(method, seq, l, qkeep + (int64_t)l * q_rows * qd, q_rows);
        if (st == MI_STATUS_SUCCESS) st = kv_method_after_append(method, seq, l, n);
        if (st != MI_STATUS_SUCCESS) return mim_model_fail(m, st, "layer %d: %s", l, method->error);
    }
    return MI_STATUS_SUCCESS;
}

/* seq NULL: the model's own cache (fresh: from position 0); else a session's pages, appended,
 * the first token at RoPE position pos, with an optional KV method. */
static mi_status forward(mi_model *m, mi_kv_seq *seq, kv_method *method, int64_t pos,
                         const int32_t *tokens, int64_t n, bool fresh, float *logits,
                         const mi_model_capture *capture, bool *kept) {
    if (kept) *kept = false;
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->vocab)
            return mim_model_fail(m, MI_STATUS_INVALID_ARGUMENT,
                                  "token %d at %lld is outside the vocabulary (%d)", tokens[i],
                                  (long long)i, m->vocab);
    if (m->gpu && seq) {
        fwd_bufs b;
        memset(&b, 0, sizeof(b));
        const int64_t qd = (int64_t)m->n_heads * m->hd;
        if (method && method->q_rows > 0 && n >= 2) {
            b.q_rows = n < method->q_rows ? n : method->q_rows;
            if (!(b.qkeep = malloc((size_t)(m->n_layers * b.q_rows * qd) * sizeof(float))))
                return mim_model_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory for queries");
        }
        const mim_gpu_seq_call call = {seq, method, pos, b.qkeep, b.q_rows};
        mi_status st = mim_gpu_forward_seq(m, &call, tokens, n, logits);
        if (st == MI_STATUS_SUCCESS && method) { /* as below: the call's rows stay */
            st = mim_method_after_call(m, seq, method, b.qkeep, b.q_rows, n);
            if (kept) *kept = true;
        }
        free(b.qkeep);
        return st;
    }
    if (m->gpu) return mim_gpu_forward(m, tokens, n, fresh, logits, capture);
    const double t_start = mim_now_s();
    double t_attn = 0.0, t_gemm = 0.0, t0;
    if (fresh && !seq) m->n_past = 0;
    /* rows already in the cache, and the position of the first new token: the same except in a
     * session whose KV method dropped rows */
    const int64_t n_past = seq ? mi_kv_seq_tokens(seq) : m->n_past;
    if (!seq) pos = n_past;
    mi_status st = seq ? MI_STATUS_SUCCESS : ensure_cache(m, n_past + n);
    if (st != MI_STATUS_SUCCESS) return st;
    const int64_t D = m->hidden, qd = (int64_t)m->n_heads * m->hd, kvd = (int64_t)m->n_kv * m->hd;
    const int64_t chunk = n < m->params.mlp_chunk ? n : m->params.mlp_chunk;
    const int32_t half = m->rope.dim / 2;
    if (n > GEMV_MAX_ROWS) mim_ensure_wscratch(m);
    fwd_bufs b;
    memset(&b, 0, sizeof(b));
    b.x = malloc((size_t)(n * D) * sizeof(float));
    b.h = malloc((size_t)(n * (D > qd ? D : qd)) * sizeof(float));
    b.q = malloc((size_t)(n * qd) * sizeof(float));
    b.att = malloc((size_t)(n * qd) * sizeof(float));
    b.g = malloc((size_t)(chunk * m->ffn) * sizeof(float));
    b.u = malloc((size_t)(chunk * m->ffn) * sizeof(float));
    b.cos_t = malloc((size_t)(n * half) * sizeof(float));
    b.sin_t = malloc((size_t)(n * half) * sizeof(float));
    b.inv_freq = malloc((size_t)half * sizeof(float));
    b.pat = malloc((size_t)m->n_heads * sizeof(mi_head_pattern));
    if (seq) {
        b.kn = malloc((size_t)(n * kvd) * sizeof(float));
        b.vn = malloc((size_t)(n * kvd) * sizeof(float));
        b.rows0 = malloc((size_t)m->n_layers * sizeof(int64_t));
        if (b.rows0)
            for (int32_t l = 0; l < m->n_layers; l++) b.rows0[l] = mi_kv_seq_length(seq, l);
    }
    if (method && method->q_rows > 0 && n >= 2) {
        b.q_rows = n < method->q_rows ? n : method->q_rows;
        b.qkeep = malloc((size_t)(m->n_layers * b.q_rows * qd) * sizeof(float));
    }
    if (!b.x || !b.h || !b.q || !b.att || !b.g || !b.u || !b.cos_t || !b.sin_t || !b.inv_freq ||
        !b.pat || (seq && (!b.kn || !b.vn || !b.rows0)) || (b.q_rows && !b.qkeep)) {
        free_bufs(&b);
        return mim_model_fail(m, MI_STATUS_OUT_OF_MEMORY,
                              "out of memory for the activations of %lld tokens", (long long)n);
    }
    float mscale;
    mim_rope_freqs(&m->rope, pos + n, b.inv_freq, &mscale);
    mim_rope_table(b.inv_freq, mscale, m->rope.dim, pos, n, b.cos_t, b.sin_t);
    for (int64_t i = 0; i < n; i++)
        mim_dequant_row(m->tok_embd.type,
                        (const unsigned char *)m->tok_embd.data +
                            (size_t)tokens[i] * m->tok_embd.row_bytes,
                        b.x + i * D, D);
    const mi_prefill_params pp = mim_prefill_params_for(m, n);
    const float scale = pp.softmax_scale;

    for (int32_t l = 0; l < m->n_layers && st == MI_STATUS_SUCCESS; l++) {
        const mim_layer *L = &m->layers[l];
        const int64_t lp = seq ? b.rows0[l] : n_past; /* this layer's rows before the call */
        float *kc = seq ? b.kn : m->k_cache[l] + n_past * kvd;
        float *vc = seq ? b.vn : m->v_cache[l] + n_past * kvd;
        mim_rmsnorm(b.x, L->attn_norm, b.h, n, D, m->eps);
        {
            const mim_weight *ws[3] = {&L->wq, &L->wk, &L->wv};
            float *outs[3] = {b.q, kc, vc};
            const int64_t ldos[3] = {qd, kvd, kvd};
            t0 = mim_now_s();
            matmul_multi(m, b.h, n, 3, ws, outs, ldos);
            t_gemm += mim_now_s() - t0;
        }
        mim_add_bias(b.q, L->bq, n, qd, qd);
        mim_add_bias(kc, L->bk, n, kvd, kvd);
        mim_add_bias(vc, L->bv, n, kvd, kvd);
        mim_rope_apply(&m->rope, b.q, n, m->n_heads, m->hd, qd, b.cos_t, b.sin_t);
        mim_rope_apply(&m->rope, kc, n, m->n_kv, m->hd, kvd, b.cos_t, b.sin_t);
        if (seq) {
            mi_tensor tk = mi_tensor_blhd(kc, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_kv, n, m->hd);
            mi_tensor tv = mi_tensor_blhd(vc, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_kv, n, m->hd);
            if ((st = mi_kv_seq_append(seq, l, &tk, &tv)) != MI_STATUS_SUCCESS) {
                mim_model_fail(m, st, "layer %d: the KV cache: %s", l,
                               mi_kv_pool_last_error(mi_kv_seq_pool(seq)));
                break;
            }
            if (b.qkeep)
                memcpy(b.qkeep + (int64_t)l * b.q_rows * qd, b.q + (n - b.q_rows) * qd,
                       (size_t)(b.q_rows * qd) * sizeof(float));
        }
        if (capture && capture->on_layer) {
            /* a capture is a fresh prompt: the cache rows are this prompt's k and v */
            mi_tensor tq =
                mi_tensor_blhd(b.q, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_heads, n, m->hd);
            mi_tensor tk = mi_tensor_blhd(kc, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_kv, n, m->hd);
            mi_tensor tv = mi_tensor_blhd(vc, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_kv, n, m->hd);
            if ((st = capture->on_layer(capture->user, l, &tq, &tk, &tv)) != MI_STATUS_SUCCESS) {
                mim_model_fail(m, st, "capture stopped at layer %d", l);
                break;
            }
        }
        if (n_past == 0 && n > 1) {
            if ((st = mim_layer_patterns(m, l, n, b.pat)) != MI_STATUS_SUCCESS) break;
            mi_tensor tq =
                mi_tensor_blhd(b.q, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_heads, n, m->hd);
            mi_tensor tk = mi_tensor_blhd(seq ? kc : m->k_cache[l], MI_DTYPE_F32, MI_DEVICE_CPU, 1,
                                          m->n_kv, n, m->hd);
            mi_tensor tv = mi_tensor_blhd(seq ? vc : m->v_cache[l], MI_DTYPE_F32, MI_DEVICE_CPU, 1,
                                          m->n_kv, n, m->hd);
            mi_tensor to =
                mi_tensor_blhd(b.att, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_heads, n, m->hd);
            t0 = mim_now_s();
            /* static keeps its sets per layer; a sliding window past its length rules instead */
            if (m->pattern == MIM_PATTERN_STATIC &&
                !(m->sliding_window > 0 && n > m->sliding_window))
                st = mim_static_attention(m, l, b.pat, &tq, &tk, &tv, &to);
            else
                st = mi_prefill_attention(m->ctx, &tq, &tk, &tv, NULL, b.pat, &pp, &to, NULL, NULL,
                                          0);
            t_attn += mim_now_s() - t0;
            if (st != MI_STATUS_SUCCESS) {
                mim_model_fail(m, st, "layer %d attention: %s", l, mi_context_last_error(m->ctx));
                break;
            }
        } else if (n >= mim_seq_prefill_from(m)) {
            t0 = mim_now_s();
            if (seq) {
                st = mim_seq_prefill_attention(m, seq, l, b.q, n, lp, b.att);
            } else {
                const int64_t kl = n_past + n;
                mi_tensor tk = mi_tensor_blhd(m->k_cache[l], MI_DTYPE_F32, MI_DEVICE_CPU, 1,
                                              m->n_kv, kl, m->hd);
                mi_tensor tv = mi_tensor_blhd(m->v_cache[l], MI_DTYPE_F32, MI_DEVICE_CPU, 1,
                                              m->n_kv, kl, m->hd);
                st = mim_prefill_at_offset(m, l, b.q, n, &tk, &tv, b.att);
            }
            t_attn += mim_now_s() - t0;
            if (st != MI_STATUS_SUCCESS) break;
        } else if (seq) {
            t0 = mim_now_s();
            st = mim_seq_attention(m, seq, method, l, b.q, n, lp, scale, b.att);
            t_attn += mim_now_s() - t0;
            if (st != MI_STATUS_SUCCESS) break;
        } else {
            cont_job j = {b.q,   m->k_cache[l], m->v_cache[l],    b.att,
                          n,     n_past,        m->n_heads,       m->n_kv,
                          m->hd, scale,         m->sliding_window};
            mim_pool_run(m->pool, n * m->n_heads, cont_task, &j);
        }
        t0 = mim_now_s();
        mim_matmul(m, b.att, n, &L->wo, b.h, D);
        t_gemm += mim_now_s() - t0;
        for (int64_t i = 0; i < n * D; i++) b.x[i] += b.h[i];
        for (int64_t c0 = 0; c0 < n; c0 += chunk) {
            int64_t c = n - c0 < chunk ? n - c0 : chunk;
            float *xc = b.x + c0 * D;
            mim_rmsnorm(xc, L->ffn_norm, b.h, c, D, m->eps);
            const mim_weight *ws[2] = {&L->wg, &L->wu};
            float *outs[2] = {b.g, b.u};
            const int64_t ldos[2] = {m->ffn, m->ffn};
            t0 = mim_now_s();
            matmul_multi(m, b.h, c, 2, ws, outs, ldos);
            t_gemm += mim_now_s() - t0;
            for (int64_t i = 0; i < c * m->ffn; i++) {
                float g = b.g[i];
                b.g[i] = g / (1.0f + expf(-g)) * b.u[i];
            }
            t0 = mim_now_s();
            mim_matmul(m, b.g, c, &L->wd, b.h, D);
            t_gemm += mim_now_s() - t0;
            for (int64_t i = 0; i < c * D; i++) xc[i] += b.h[i];
        }
        if (m->progress) m->progress(m->progress_user, l + 1, m->n_layers, n);
    }
    if (st == MI_STATUS_SUCCESS && capture && capture->token_log_probs)
        st = mim_token_log_probs(m, b.x, tokens, n, capture->token_log_probs);

    if (st == MI_STATUS_SUCCESS) {
        /* a capture measures; it leaves no cache to continue from */
        if (!seq) m->n_past = capture ? 0 : n_past + n;
        if (logits) {
            mim_rmsnorm(b.x + (n - 1) * D, m->out_norm, b.h, 1, D, m->eps);
            t0 = mim_now_s();
            mim_matmul(m, b.h, 1, &m->output, logits, m->vocab);
            t_gemm += mim_now_s() - t0;
        }
        if (fresh) {
            m->timing.n_tokens = n;
            m->timing.total_s = mim_now_s() - t_start;
            m->timing.attention_s = t_attn;
            m->timing.gemm_s = t_gemm;
        }
        if (seq && method) {
            /* every layer holds the call's rows and the logits are out; a compaction that fails
             * here keeps the call's tokens (layers compacted before it cannot be restored): the
             * session sees more rows than before the call and counts them */
            st = mim_method_after_call(m, seq, method, b.qkeep, b.q_rows, n);
            if (kept) *kept = true;
        }
    } else if (seq) {
        for (int32_t l = 0; l < m->n_layers; l++) /* the session loses nothing */
            mi_kv_seq_truncate(seq, l, b.rows0[l]);
    } else if (fresh) {
        m->n_past = 0;
    }
    free_bufs(&b);
    return st;
}

mi_status mim_forward(mi_model *m, const int32_t *tokens, int64_t n, bool fresh, float *logits,
                      const mi_model_capture *capture) {
    if (capture || (m->gpu && !m->params.kv_offload)) {
        /* a capture measures a fresh prompt in the contiguous cache and leaves none; the CUDA
         * model's device cache is its own sequence (sessions mirror their pages into it) */
        mi_session_destroy(m->own_session);
        m->own_session = NULL;
        return forward(m, NULL, NULL, 0, tokens, n, fresh, logits, capture, NULL);
    }
    /* the model's own sequence is a session of its own (with kv_offload, the only place its
     * rows live) */
    int64_t cap;
    const int64_t past = fresh || !m->own_session ? 0 : mi_session_n_past(m->own_session);
    mi_status st = mim_cache_capacity(m, past + n, 0, &cap); /* max_context, as before */
    if (st != MI_STATUS_SUCCESS) return st;
    if (fresh || !m->own_session) {
        mi_session_destroy(m->own_session);
        m->own_session = NULL;
        if ((st = mi_session_create(m, NULL, &m->own_session)) != MI_STATUS_SUCCESS) return st;
    }
    st = mi_session_prefill(m->own_session, tokens, (size_t)n, logits);
    if (st != MI_STATUS_SUCCESS) mim_model_fail(m, st, "%s", mi_session_last_error(m->own_session));
    m->n_past = mi_session_n_past(m->own_session);
    return st;
}

mi_status mim_forward_seq(mi_model *m, mi_kv_seq *seq, kv_method *method, int64_t pos,
                          const int32_t *tokens, int64_t n, float *logits, bool *kept) {
    if (kept) *kept = false;
    return forward(m, seq, method, pos, tokens, n, mi_kv_seq_tokens(seq) == 0, logits, NULL, kept);
}

mi_status mi_model_prefill(mi_model *m, const int32_t *tokens, size_t n, float *logits) {
    if (!m) return MI_STATUS_INVALID_ARGUMENT;
    m->last_error[0] = 0;
    if (!tokens || n == 0)
        return mim_model_fail(m, MI_STATUS_INVALID_ARGUMENT, "no tokens to prefill");
    return mim_forward(m, tokens, (int64_t)n, true, logits, NULL);
}

mi_status mi_model_decode(mi_model *m, const int32_t *tokens, size_t n, float *logits) {
    if (!m) return MI_STATUS_INVALID_ARGUMENT;
    m->last_error[0] = 0;
    if (!tokens || n == 0)
        return mim_model_fail(m, MI_STATUS_INVALID_ARGUMENT, "no tokens to decode");
    return mim_forward(m, tokens, (int64_t)n, false, logits, NULL);
}

int64_t mi_model_n_past(const mi_model *m) {
    if (!m) return 0;
    return m->own_session ? mi_session_n_past(m->own_session) : m->n_past;
}

mi_status mi_model_last_timing(const mi_model *m, mi_model_timing *out) {
    if (!m || !out) return MI_STATUS_INVALID_ARGUMENT;
    *out = m->timing;
    return MI_STATUS_SUCCESS;
}

int32_t mi_argmax(const float *logits, int32_t n) {
    if (!logits || n <= 0) return -1;
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

/* ------------------------------------------------------------------------------------------ */
/* Settings                                                                                    */

/* The pattern of each mi_attn_mode (< 0: from the config); the enum is a fixed shorthand, so
 * new patterns are reached by name (mi_model_set_attention_name). */
static const int32_t mode_patterns[] = {MI_PATTERN_DENSE, -1, MI_PATTERN_A_SHAPE,
                                        MI_PATTERN_TRI_SHAPE, MI_PATTERN_BLOCK_SPARSE};
#define MI_ATTN_MODES ((int)(sizeof mode_patterns / sizeof mode_patterns[0]))

/* "minference" for the config, else the pattern's short name (its first alias, or its name). */
static const char *attention_name(int32_t pattern) {
    if (pattern == MIM_PATTERN_STATIC) return "static";
    if (pattern < 0) return "minference";
    const char *alias = mi_pattern_alias((mi_pattern_type)pattern, 0);
    return alias ? alias : mi_pattern_name((mi_pattern_type)pattern);
}

/* The pattern of a name (< 0: from the config), as mi_model_set_attention_name reads it. */
static mi_status attention_from_name(const char *name, int32_t *pattern) {
    mi_pattern_type t;
    if (!name || strcmp(name, "minference") == 0) {
        *pattern = -1;
        return MI_STATUS_SUCCESS;
    }
    if (strcmp(name, "static") == 0 || (strncmp(name, "static:", 7) == 0 && name[7])) {
        *pattern = MIM_PATTERN_STATIC;
        return MI_STATUS_SUCCESS;
    }
    if (mi_pattern_from_name(name, &t) != MI_STATUS_SUCCESS) return MI_STATUS_INVALID_ARGUMENT;
    /* the original's "vertical_and_slash" run is MInference: the config, else its default */
    *pattern = t == MI_PATTERN_VERTICAL_SLASH ? -1 : (int32_t)t;
    return MI_STATUS_SUCCESS;
}

const char *mi_attn_mode_name(mi_attn_mode mode) {
    if ((int)mode < 0 || (int)mode >= MI_ATTN_MODES) return NULL;
    return attention_name(mode_patterns[mode]);
}

mi_status mi_attn_mode_from_name(const char *name, mi_attn_mode *out) {
    int32_t pattern;
    if (!name || !out || attention_from_name(name, &pattern) != MI_STATUS_SUCCESS)
        return MI_STATUS_INVALID_ARGUMENT;
    for (int i = 0; i < MI_ATTN_MODES; i++)
        if (mode_patterns[i] == pattern) {
            *out = (mi_attn_mode)i;
            return MI_STATUS_SUCCESS;
        }
    return MI_STATUS_INVALID_ARGUMENT;
}

static mi_status set_attention(mi_model *m, int32_t pattern, const mi_config *config,
                               int32_t dense_below) {
    if (config) {
        mi_status st = mi_config_check(m->ctx, config, m->n_layers, m->n_heads);
        if (st != MI_STATUS_SUCCESS)
            return mim_model_fail(m, st,
                                  "pattern config does not fit the model (%d layers, %d "
                                  "heads): %s",
                                  m->n_layers, m->n_heads, mi_context_last_error(m->ctx));
    }
    mim_static_free(m);
    m->pattern = pattern;
    m->config = config;
    m->dense_below = dense_below;
    return MI_STATUS_SUCCESS;
}

mi_status mi_model_set_attention(mi_model *m, mi_attn_mode mode, const mi_config *config,
                                 int32_t dense_below) {
    if (!m) return MI_STATUS_INVALID_ARGUMENT;
    if (!mi_attn_mode_name(mode))
        return mim_model_fail(m, MI_STATUS_INVALID_ARGUMENT, "unknown attention mode %d",
                              (int)mode);
    return set_attention(m, mode_patterns[mode], config, dense_below);
}

mi_status mi_model_set_attention_name(mi_model *m, const char *attention, const mi_config *config,
                                      int32_t dense_below) {
    int32_t pattern;
    if (!m) return MI_STATUS_INVALID_ARGUMENT;
    if (attention_from_name(attention, &pattern) != MI_STATUS_SUCCESS)
        return mim_model_fail(m, MI_STATUS_INVALID_ARGUMENT, "unknown attention '%.64s'",
                              attention);
    if (pattern == MIM_PATTERN_STATIC && m->gpu)
        return mim_model_fail(m, MI_STATUS_UNSUPPORTED,
                              "static attention runs on the CPU model only");
    mi_status st = set_attention(m, pattern, config, dense_below);
    if (st == MI_STATUS_SUCCESS && pattern == MIM_PATTERN_STATIC && attention[6] == ':') {
        m->static_dir = strdup(attention + 7);
        if (!m->static_dir) st = mim_model_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    return st;
}

mi_status mi_model_set_progress(mi_model *m, mi_model_progress_fn fn, void *user) {
    if (!m) return MI_STATUS_INVALID_ARGUMENT;
    m->progress = fn;
    m->progress_user = user;
    return MI_STATUS_SUCCESS;
}
