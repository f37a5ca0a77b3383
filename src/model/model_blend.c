/*
 * model_blend.c: CacheBlend (mi_session_prefill_blend). A prompt made of text chunks whose K and
 * V were computed elsewhere (each chunk alone, e.g. a retrieved passage) plus new tokens: the
 * cached keys are rotated to their new positions, every token is recomputed in the first layers
 * (0..check_layer), and past check_layer only the chunk tokens whose K and V deviate most from
 * the cache (they are the ones whose attention to earlier chunks matters) and the new tokens go
 * on through the layers; the others keep their cached K and V. Method and defaults:
 * docs/kv-retrieval.md (CacheBlend).
 *
 * Where every token is recomputed the layer runs as the forward pass of a fresh prompt does
 * (the same GEMMs, RoPE table and attention call), so a recompute ratio of 1 is a full prefill.
 */
#include "minference_session.h"

#include "minference_kv.h"
#include "model_runner.h"

#include <cblas.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

mi_blend_params mi_blend_default_params(void) {
    mi_blend_params p;
    memset(&p, 0, sizeof(p));
    p.recompute_ratio = 0.15f;
    p.check_layer = 1;
    return p;
}

/* Dense causal attention of a subset of rows (positions pos[i], ascending) over the layer's
 * rows k, v [N, n_kv * hd]: blocks of SUB_ROWS rows per query head, scores and weighted values
 * as two single-threaded sgemms over the keys the block's last row sees, then the causal (and
 * sliding-window) mask. */
#define SUB_ROWS 32

typedef struct sub_job {
    const float *q; /* [n, n_heads * hd] */
    const float *k, *v;
    float *out;
    const int64_t *pos;
    int64_t n, window;
    int32_t n_heads, n_kv, hd;
    float scale;
} sub_job;

static void sub_task(void *arg, int64_t b, int64_t e, int thread) {
    (void)thread;
    const sub_job *j = arg;
    const int64_t kvd = (int64_t)j->n_kv * j->hd, qd = (int64_t)j->n_heads * j->hd;
    const int32_t group = j->n_heads / j->n_kv, hd = j->hd;
    for (int64_t t = b; t < e; t++) {
        const int64_t r0 = (t / j->n_heads) * SUB_ROWS;
        const int64_t r1 = r0 + SUB_ROWS < j->n ? r0 + SUB_ROWS : j->n;
        const int64_t nb = r1 - r0;
        const int32_t h = (int32_t)(t % j->n_heads);
        int64_t first = 0;
        const int64_t last = j->pos[r1 - 1];
        if (j->window > 0 && j->pos[r0] + 1 > j->window) first = j->pos[r0] + 1 - j->window;
        const int64_t nk = last + 1 - first;
        float *sc = malloc((size_t)(nb * nk) * sizeof(float));
        const float *q = j->q + r0 * qd + (int64_t)h * hd;
        float *o = j->out + r0 * qd + (int64_t)h * hd;
        const float *kb = j->k + first * kvd + (int64_t)(h / group) * hd;
        const float *vb = j->v + first * kvd + (int64_t)(h / group) * hd;
        if (!sc) { /* out of memory: rows of zeros rather than a crash */
            for (int64_t i = 0; i < nb; i++) memset(o + i * qd, 0, (size_t)hd * sizeof(float));
            continue;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nb, (int)nk, hd, j->scale, q,
                    (int)qd, kb, (int)kvd, 0.0f, sc, (int)nk);
        for (int64_t i = 0; i < nb; i++) {
            float *row = sc + i * nk;
            const int64_t end = j->pos[r0 + i] + 1 - first; /* keys 0..end-1 of the block */
            int64_t beg = 0;
            if (j->window > 0 && end + first > j->window) beg = end + first - j->window - first;
            float mx = -INFINITY;
            for (int64_t p = beg; p < end; p++) mx = row[p] > mx ? row[p] : mx;
            float sum = 0.0f;
            for (int64_t p = 0; p < nk; p++) {
                const float w = p >= beg && p < end ? expf(row[p] - mx) : 0.0f;
                row[p] = w;
                sum += w;
            }
            const float inv = 1.0f / sum;
            for (int64_t p = beg; p < end; p++) row[p] *= inv;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nb, hd, (int)nk, 1.0f, sc,
                    (int)nk, vb, (int)kvd, 0.0f, o, (int)qd);
        free(sc);
    }
}

/* Rotates one row of n_heads heads by the angles whose cos / sin are c, s [dim / 2], in
 * float64 (a pure rotation: the table's mscale is already in the row). */
static void rotate_row(const mim_rope *r, float *x, int64_t n_heads, int64_t hd, const double *c,
                       const double *s) {
    const int32_t half = r->dim / 2;
    for (int64_t h = 0; h < n_heads; h++) {
        float *v = x + h * hd;
        for (int32_t i = 0; i < half; i++) {
            float *pa = r->neox ? &v[i] : &v[2 * i];
            float *pb = r->neox ? &v[i + half] : &v[2 * i + 1];
            const double a = *pa, b = *pb;
            *pa = (float)(a * c[i] - b * s[i]);
            *pb = (float)(b * c[i] + a * s[i]);
        }
    }
}

/* cos / sin [half] of the rotation from position o to p: the difference of the very fp32 angles
 * the forward pass takes at p and at o, in float64, so that a rotated key equals the key
 * computed at p up to the rounding of one rotation. */
static void shift_angles(const float *inv_freq, int32_t half, int64_t o, int64_t p, double *c,
                         double *s) {
    for (int32_t i = 0; i < half; i++) {
        const float ap = (float)p * inv_freq[i], ao = (float)o * inv_freq[i];
        const double d = (double)ap - (double)ao;
        c[i] = cos(d);
        s[i] = sin(d);
    }
}

mi_status mim_rope_shift(mi_model *m, float *k, int64_t n, int64_t from, int64_t to) {
    const int32_t half = m->rope.dim / 2;
    float inv_freq[512];
    double c[512], s[512];
    if (half > 512 || n < 0 || from < 0 || to < 0) return MI_STATUS_INVALID_ARGUMENT;
    float mscale;
    mim_rope_freqs(&m->rope, to + n, inv_freq, &mscale);
    const int64_t kvd = (int64_t)m->n_kv * m->hd;
    for (int64_t r = 0; r < n; r++) {
        shift_angles(inv_freq, half, from + r, to + r, c, s);
        rotate_row(&m->rope, k + r * kvd, m->n_kv, m->hd, c, s);
    }
    return MI_STATUS_SUCCESS;
}

/* Indices of the k largest dev[0..n-1] (ties: the lower index), in ascending index order. */
static int cmp_dev_desc(const void *a, const void *b, const double *dev) {
    const int64_t i = *(const int64_t *)a, j = *(const int64_t *)b;
    if (dev[i] > dev[j]) return -1;
    if (dev[i] < dev[j]) return 1;
    return i < j ? -1 : (i > j);
}

static const double *g_dev; /* qsort has no user pointer in C11; one call at a time per model */
static int cmp_dev(const void *a, const void *b) { return cmp_dev_desc(a, b, g_dev); }
static int cmp_i64(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : (x > y);
}

int64_t mim_blend_select(const double *dev, int64_t n, int64_t k, int64_t *idx) {
    if (k > n) k = n;
    if (k <= 0) return 0;
    for (int64_t i = 0; i < n; i++) idx[i] = i;
    g_dev = dev;
    qsort(idx, (size_t)n, sizeof(int64_t), cmp_dev);
    g_dev = NULL;
    qsort(idx, (size_t)k, sizeof(int64_t), cmp_i64);
    return k;
}

typedef struct blend_bufs {
    float *x, *h, *q, *att, *kn, *vn, *K, *V, *g, *u, *cos_t, *sin_t, *inv_freq;
    double *rc, *rs, *dev;
    int32_t *tok;
    int64_t *act, *cpos, *sel;
    mi_head_pattern *pat;
} blend_bufs;

static void free_blend(blend_bufs *b) {
    void *ps[] = {b->x,  b->h,   b->q,   b->att,   b->kn,    b->vn,       b->K,
                  b->V,  b->g,   b->u,   b->cos_t, b->sin_t, b->inv_freq, b->rc,
                  b->rs, b->dev, b->tok, b->act,   b->cpos,  b->sel,      b->pat};
    for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++) free(ps[i]);
}

static mi_status bfail(mi_session *s, mi_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static mi_status bfail(mi_session *s, mi_status st, const char *fmt, ...) {
    char msg[MIM_ERROR_CAPACITY];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return mim_session_fail(s, st, msg);
}

mi_status mi_session_prefill_blend(mi_session *s, const mi_blend_chunk *chunks, size_t n_chunks,
                                   const int32_t *suffix, size_t n_suffix,
                                   const mi_blend_params *params, float *logits,
                                   mi_blend_stats *stats) {
    if (!s) return MI_STATUS_INVALID_ARGUMENT;
    mim_session_fail(s, MI_STATUS_SUCCESS, "");
    const double t_start = mim_now_s();
    mi_model *m = mim_session_model(s);
    mi_kv_seq *seq = mim_session_seq(s);
    const mi_blend_params p = params ? *params : mi_blend_default_params();
    if (stats) memset(stats, 0, sizeof(*stats));
    if (m->gpu) return bfail(s, MI_STATUS_UNSUPPORTED, "CacheBlend runs on the CPU model only");
    if (m->rope.scaling.type == MI_ROPE_DYNAMIC)
        return bfail(s, MI_STATUS_UNSUPPORTED,
                     "CacheBlend: dynamic RoPE scaling changes the frequencies with the length, "
                     "so cached keys cannot be rotated to new positions");
    if (n_chunks > 0 && !chunks) return bfail(s, MI_STATUS_INVALID_ARGUMENT, "chunks is NULL");
    if (!suffix || n_suffix == 0)
        return bfail(s, MI_STATUS_INVALID_ARGUMENT,
                     "CacheBlend needs at least one new token after the chunks");
    if (!(p.recompute_ratio >= 0.0f && p.recompute_ratio <= 1.0f))
        return bfail(s, MI_STATUS_INVALID_ARGUMENT, "recompute_ratio %g is not in [0, 1]",
                     (double)p.recompute_ratio);
    if (p.check_layer < 0 || p.check_layer >= m->n_layers)
        return bfail(s, MI_STATUS_INVALID_ARGUMENT, "check_layer %d is not in [0, %d)",
                     p.check_layer, m->n_layers);
    if (!mim_session_dense(s))
        return bfail(s, MI_STATUS_UNSUPPORTED,
                     "CacheBlend fills a session without a KV method (its rows are its tokens)");
    if (mi_kv_seq_tokens(seq) != 0 || mi_session_n_past(s) != 0)
        return bfail(s, MI_STATUS_INVALID_ARGUMENT,
                     "CacheBlend fills an empty session; this one holds %lld tokens",
                     (long long)mi_kv_seq_tokens(seq));
    int64_t n_chunk_tok = 0;
    for (size_t c = 0; c < n_chunks; c++) {
        const mi_blend_chunk *ch = &chunks[c];
        if (!ch->tokens || ch->n_tokens == 0 || !ch->cache)
            return bfail(s, MI_STATUS_INVALID_ARGUMENT, "chunk %zu: no tokens or no cache", c);
        if (ch->cache == s || mim_session_model(ch->cache) != m)
            return bfail(s, MI_STATUS_INVALID_ARGUMENT,
                         "chunk %zu: the cache must be another session of the same model", c);
        if (!mim_session_dense(ch->cache))
            return bfail(s, MI_STATUS_UNSUPPORTED,
                         "chunk %zu: its cache session has a KV method (rows are not positions)",
                         c);
        const int64_t have = mi_kv_seq_tokens(mim_session_seq(ch->cache));
        if (ch->cache_row < 0 || ch->cache_row > have ||
            (int64_t)ch->n_tokens > have - ch->cache_row)
            return bfail(s, MI_STATUS_INVALID_ARGUMENT,
                         "chunk %zu: rows %lld..+%zu are not in its cache of %lld tokens", c,
                         (long long)ch->cache_row, ch->n_tokens, (long long)have);
        n_chunk_tok += (int64_t)ch->n_tokens;
    }
    const int64_t N = n_chunk_tok + (int64_t)n_suffix;
    const int64_t max_tokens = mim_session_max_tokens(s);
    if (max_tokens > 0 && N > max_tokens)
        return bfail(s, MI_STATUS_INVALID_ARGUMENT,
                     "%lld tokens exceed the session's max_tokens = %lld", (long long)N,
                     (long long)max_tokens);

    const int64_t D = m->hidden, qd = (int64_t)m->n_heads * m->hd, kvd = (int64_t)m->n_kv * m->hd;
    const int32_t half = m->rope.dim / 2;
    const int64_t chunk = N < m->params.mlp_chunk ? N : m->params.mlp_chunk;
    blend_bufs b;
    memset(&b, 0, sizeof(b));
    b.tok = malloc((size_t)N * sizeof(int32_t));
    b.x = malloc((size_t)(N * D) * sizeof(float));
    b.h = malloc((size_t)(N * (D > qd ? D : qd)) * sizeof(float));
    b.q = malloc((size_t)(N * qd) * sizeof(float));
    b.att = malloc((size_t)(N * qd) * sizeof(float));
    b.kn = malloc((size_t)(N * kvd) * sizeof(float));
    b.vn = malloc((size_t)(N * kvd) * sizeof(float));
    b.K = malloc((size_t)(N * kvd) * sizeof(float));
    b.V = malloc((size_t)(N * kvd) * sizeof(float));
    b.g = malloc((size_t)(chunk * m->ffn) * sizeof(float));
    b.u = malloc((size_t)(chunk * m->ffn) * sizeof(float));
    b.cos_t = malloc((size_t)(N * half) * sizeof(float));
    b.sin_t = malloc((size_t)(N * half) * sizeof(float));
    b.inv_freq = malloc((size_t)half * sizeof(float));
    b.rc = malloc((size_t)((n_chunk_tok ? n_chunk_tok : 1) * half) * sizeof(double));
    b.rs = malloc((size_t)((n_chunk_tok ? n_chunk_tok : 1) * half) * sizeof(double));
    b.dev = malloc((size_t)(n_chunk_tok ? n_chunk_tok : 1) * sizeof(double));
    b.act = malloc((size_t)N * sizeof(int64_t));
    b.cpos = malloc((size_t)(n_chunk_tok ? n_chunk_tok : 1) * sizeof(int64_t));
    b.sel = malloc((size_t)(n_chunk_tok ? n_chunk_tok : 1) * sizeof(int64_t));
    b.pat = malloc((size_t)m->n_heads * sizeof(mi_head_pattern));
    if (!b.tok || !b.x || !b.h || !b.q || !b.att || !b.kn || !b.vn || !b.K || !b.V || !b.g ||
        !b.u || !b.cos_t || !b.sin_t || !b.inv_freq || !b.rc || !b.rs || !b.dev || !b.act ||
        !b.cpos || !b.sel || !b.pat) {
        free_blend(&b);
        return bfail(s, MI_STATUS_OUT_OF_MEMORY, "out of memory for blending %lld tokens",
                     (long long)N);
    }
    if (N > 4 && !m->wscratch) { /* as the forward pass: sgemm needs the expanded weight */
        size_t most = 0;
        const mim_layer *L = &m->layers[0];
        const mim_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wg, &L->wu, &L->wd};
        for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]); i++)
            if ((size_t)(ws[i]->rows * ws[i]->cols) > most)
                most = (size_t)(ws[i]->rows * ws[i]->cols);
        m->wscratch = malloc(most * sizeof(float));
        m->wscratch_floats = most;
    }
    {
        int64_t r = 0;
        for (size_t c = 0; c < n_chunks; c++) {
            memcpy(b.tok + r, chunks[c].tokens, chunks[c].n_tokens * sizeof(int32_t));
            for (size_t i = 0; i < chunks[c].n_tokens; i++)
                b.cpos[r + (int64_t)i] = chunks[c].cache_row + (int64_t)i;
            r += (int64_t)chunks[c].n_tokens;
        }
        memcpy(b.tok + r, suffix, n_suffix * sizeof(int32_t));
    }
    mi_status st = MI_STATUS_SUCCESS;
    for (int64_t i = 0; i < N; i++)
        if (b.tok[i] < 0 || b.tok[i] >= m->vocab) {
            const int32_t bad = b.tok[i];
            free_blend(&b);
            return bfail(s, MI_STATUS_INVALID_ARGUMENT,
                         "token %d at %lld is outside the vocabulary (%d)", bad, (long long)i,
                         m->vocab);
        }
    float mscale;
    mim_rope_freqs(&m->rope, N, b.inv_freq, &mscale);
    mim_rope_table(b.inv_freq, mscale, m->rope.dim, 0, N, b.cos_t, b.sin_t);
    for (int64_t r = 0; r < n_chunk_tok; r++)
        shift_angles(b.inv_freq, half, b.cpos[r], r, b.rc + r * half, b.rs + r * half);
    for (int64_t i = 0; i < N; i++) {
        b.act[i] = i;
        mim_dequant_row(m->tok_embd.type,
                        (const unsigned char *)m->tok_embd.data +
                            (size_t)b.tok[i] * m->tok_embd.row_bytes,
                        b.x + i * D, D);
    }
    int64_t n_act = N, n_recomputed = n_chunk_tok;
    const mi_prefill_params pp = mim_prefill_params_for(m, N);
    const bool select = p.recompute_ratio < 1.0f && n_chunk_tok > 0;

    for (int32_t l = 0; l < m->n_layers && st == MI_STATUS_SUCCESS; l++) {
        const mim_layer *L = &m->layers[l];
        const bool all = n_act == N;
        /* the cached rows, rotated, where they are kept or compared */
        if (n_chunk_tok > 0 && (l >= p.check_layer && (select || !all))) {
            int64_t r = 0;
            for (size_t c = 0; c < n_chunks && st == MI_STATUS_SUCCESS; c++) {
                const int64_t n = (int64_t)chunks[c].n_tokens;
                mi_tensor tk = mi_tensor_blhd(b.K + r * kvd, MI_DTYPE_F32, MI_DEVICE_CPU, 1,
                                              m->n_kv, n, m->hd);
                mi_tensor tv = mi_tensor_blhd(b.V + r * kvd, MI_DTYPE_F32, MI_DEVICE_CPU, 1,
                                              m->n_kv, n, m->hd);
                st = mi_kv_seq_read(mim_session_seq(chunks[c].cache), l, chunks[c].cache_row, n,
                                    &tk, &tv);
                r += n;
            }
            if (st != MI_STATUS_SUCCESS) {
                bfail(s, st, "layer %d: reading a chunk's cache: %s", l,
                      mi_kv_pool_last_error(m->kv_pool));
                break;
            }
            for (int64_t i = 0; i < n_chunk_tok; i++)
                rotate_row(&m->rope, b.K + i * kvd, m->n_kv, m->hd, b.rc + i * half,
                           b.rs + i * half);
        }
        mim_rmsnorm(b.x, L->attn_norm, b.h, n_act, D, m->eps);
        mim_matmul(m, b.h, n_act, &L->wq, b.q, qd);
        mim_matmul(m, b.h, n_act, &L->wk, b.kn, kvd);
        mim_matmul(m, b.h, n_act, &L->wv, b.vn, kvd);
        mim_add_bias(b.q, L->bq, n_act, qd, qd);
        mim_add_bias(b.kn, L->bk, n_act, kvd, kvd);
        mim_add_bias(b.vn, L->bv, n_act, kvd, kvd);
        if (all) {
            mim_rope_apply(&m->rope, b.q, N, m->n_heads, m->hd, qd, b.cos_t, b.sin_t);
            mim_rope_apply(&m->rope, b.kn, N, m->n_kv, m->hd, kvd, b.cos_t, b.sin_t);
        } else {
            for (int64_t i = 0; i < n_act; i++) {
                const int64_t ps = b.act[i];
                mim_rope_apply(&m->rope, b.q + i * qd, 1, m->n_heads, m->hd, qd,
                               b.cos_t + ps * half, b.sin_t + ps * half);
                mim_rope_apply(&m->rope, b.kn + i * kvd, 1, m->n_kv, m->hd, kvd,
                               b.cos_t + ps * half, b.sin_t + ps * half);
            }
        }
        int64_t n_sel = 0;
        if (l == p.check_layer && select) {
            /* all rows are active here: row i is position i */
            for (int64_t i = 0; i < n_chunk_tok; i++) {
                double d2 = 0.0;
                const float *a = b.kn + i * kvd, *c = b.K + i * kvd;
                const float *va = b.vn + i * kvd, *vc = b.V + i * kvd;
                for (int64_t k = 0; k < kvd; k++) {
                    const double dk = (double)a[k] - c[k], dv = (double)va[k] - vc[k];
                    d2 += dk * dk + dv * dv;
                }
                b.dev[i] = d2;
            }
            const int64_t want = (int64_t)ceil((double)p.recompute_ratio * (double)n_chunk_tok);
            n_sel = mim_blend_select(b.dev, n_chunk_tok, want, b.sel);
            n_recomputed = n_sel;
        }
        for (int64_t i = 0; i < n_act; i++) {
            memcpy(b.K + b.act[i] * kvd, b.kn + i * kvd, (size_t)kvd * sizeof(float));
            memcpy(b.V + b.act[i] * kvd, b.vn + i * kvd, (size_t)kvd * sizeof(float));
        }
        {
            mi_tensor tk = mi_tensor_blhd(b.K, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_kv, N, m->hd);
            mi_tensor tv = mi_tensor_blhd(b.V, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_kv, N, m->hd);
            if ((st = mi_kv_seq_append(seq, l, &tk, &tv)) != MI_STATUS_SUCCESS) {
                bfail(s, st, "layer %d: the KV cache: %s", l, mi_kv_pool_last_error(m->kv_pool));
                break;
            }
        }
        if (all) {
            if ((st = mim_layer_patterns(m, l, N, b.pat)) != MI_STATUS_SUCCESS) {
                bfail(s, st, "%s", m->last_error);
                break;
            }
            mi_tensor tq =
                mi_tensor_blhd(b.q, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_heads, N, m->hd);
            mi_tensor tk = mi_tensor_blhd(b.K, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_kv, N, m->hd);
            mi_tensor tv = mi_tensor_blhd(b.V, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_kv, N, m->hd);
            mi_tensor to =
                mi_tensor_blhd(b.att, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_heads, N, m->hd);
            st = mi_prefill_attention(m->ctx, &tq, &tk, &tv, NULL, b.pat, &pp, &to, NULL, NULL, 0);
            if (st != MI_STATUS_SUCCESS) {
                bfail(s, st, "layer %d attention: %s", l, mi_context_last_error(m->ctx));
                break;
            }
        } else {
            sub_job j = {
                b.q,        b.K,     b.V,   b.att,           b.act, n_act, m->sliding_window,
                m->n_heads, m->n_kv, m->hd, pp.softmax_scale};
            mim_pool_run(m->pool, (n_act + SUB_ROWS - 1) / SUB_ROWS * m->n_heads, sub_task, &j);
        }
        mim_matmul(m, b.att, n_act, &L->wo, b.h, D);
        for (int64_t i = 0; i < n_act * D; i++) b.x[i] += b.h[i];
        for (int64_t c0 = 0; c0 < n_act; c0 += chunk) {
            const int64_t c = n_act - c0 < chunk ? n_act - c0 : chunk;
            float *xc = b.x + c0 * D;
            mim_rmsnorm(xc, L->ffn_norm, b.h, c, D, m->eps);
            mim_matmul(m, b.h, c, &L->wg, b.g, m->ffn);
            mim_matmul(m, b.h, c, &L->wu, b.u, m->ffn);
            for (int64_t i = 0; i < c * m->ffn; i++) {
                const float g = b.g[i];
                b.g[i] = g / (1.0f + expf(-g)) * b.u[i];
            }
            mim_matmul(m, b.g, c, &L->wd, b.h, D);
            for (int64_t i = 0; i < c * D; i++) xc[i] += b.h[i];
        }
        if (l == p.check_layer && select) {
            /* go on with the selected chunk rows and the suffix (rows are positions here) */
            int64_t k = 0;
            for (int64_t i = 0; i < n_sel; i++) b.act[k++] = b.sel[i];
            for (int64_t i = n_chunk_tok; i < N; i++) b.act[k++] = i;
            for (int64_t i = 0; i < k; i++)
                if (b.act[i] != i)
                    memmove(b.x + i * D, b.x + b.act[i] * D, (size_t)D * sizeof(float));
            n_act = k;
        }
    }
    if (st == MI_STATUS_SUCCESS && logits) {
        mim_rmsnorm(b.x + (n_act - 1) * D, m->out_norm, b.h, 1, D, m->eps);
        mim_matmul(m, b.h, 1, &m->output, logits, m->vocab);
    }
    if (st != MI_STATUS_SUCCESS)
        mi_kv_seq_truncate(seq, MI_KV_ALL_LAYERS, 0);
    else
        mim_session_set_n_pos(s, N);
    free_blend(&b);
    if (st == MI_STATUS_SUCCESS && stats) {
        stats->n_tokens = N;
        stats->n_chunk_tokens = n_chunk_tok;
        stats->n_recomputed = n_recomputed;
        stats->seconds = mim_now_s() - t_start;
    }
    return st;
}
