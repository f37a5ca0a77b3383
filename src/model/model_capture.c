/*
 * model_capture.c: a measurement prefill for the pattern search and the perplexity harness.
 *
 * The search needs every layer's post-RoPE q/k/v on a sample prompt, and perplexity needs the
 * log-probability of every next token, not only the last position's logits. Both come from one
 * pass of the same llama-family layer as model_forward.c (RMSNorm, projections, RoPE, attention
 * through mi_prefill_attention with the model's patterns, chunked SwiGLU MLP), written against
 * the runner's shared layout so the generation path stays untouched. Its K/V live in per-call
 * buffers; the model's cache is not written.
 */
#include "model_gpu.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Rows per LM-head GEMM: bounds the logits buffer to rows x vocab floats. */
#define CAPTURE_HEAD_ROWS 128

typedef struct lp_job {
    const float *logits; /* [rows, vocab] */
    const int32_t *next; /* [rows] */
    double *out;         /* [rows] */
    int32_t vocab;
} lp_job;

static void lp_task(void *arg, int64_t b, int64_t e, int thread) {
    (void)thread;
    const lp_job *j = arg;
    for (int64_t r = b; r < e; r++) {
        const float *z = j->logits + r * j->vocab;
        float mx = z[0];
        for (int32_t i = 1; i < j->vocab; i++) mx = z[i] > mx ? z[i] : mx;
        double s = 0.0;
        for (int32_t i = 0; i < j->vocab; i++) s += exp((double)(z[i] - mx));
        j->out[r] = (double)(z[j->next[r]] - mx) - log(s);
    }
}

/* log p(tokens[i + 1]) for i in [0, n - 1) from the final hidden states x [n, hidden]. */
static mi_status cap_log_probs(mi_model *m, const float *x, const int32_t *tokens, int64_t n,
                               double *out) {
    const int64_t Dm = m->hidden, V = m->vocab, rows = n - 1;
    if (rows <= 0) return MI_STATUS_SUCCESS;
    const mim_weight *w = &m->output;
    float *wf = NULL;
    const float *wp = w->data;
    if (w->type != MIM_TYPE_F32) {
        /* The whole head once as fp32: the per-layer scratch is sized for layer weights only. */
        wf = malloc((size_t)(V * Dm) * sizeof(float));
        if (!wf) return mim_model_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory for the LM head");
        mim_dequant_matrix(m, w, wf);
        wp = wf;
    }
    float *h = malloc((size_t)(CAPTURE_HEAD_ROWS * Dm) * sizeof(float));
    float *z = malloc((size_t)(CAPTURE_HEAD_ROWS * V) * sizeof(float));
    if (!h || !z) {
        free(wf);
        free(h);
        free(z);
        return mim_model_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory for the logits");
    }
    for (int64_t r0 = 0; r0 < rows; r0 += CAPTURE_HEAD_ROWS) {
        const int64_t c = rows - r0 < CAPTURE_HEAD_ROWS ? rows - r0 : CAPTURE_HEAD_ROWS;
        mim_rmsnorm(x + r0 * Dm, m->out_norm, h, c, Dm, m->eps);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)c, (int)V, (int)Dm, 1.0f, h,
                    (int)Dm, wp, (int)Dm, 0.0f, z, (int)V);
        lp_job j = {z, tokens + r0 + 1, out + r0, (int32_t)V};
        mim_pool_run(m->pool, c, lp_task, &j);
    }
    free(wf);
    free(h);
    free(z);
    return MI_STATUS_SUCCESS;
}

mi_status mi_model_prefill_capture(mi_model *m, const int32_t *tokens, size_t n_tokens,
                                   const mi_model_capture *capture) {
    if (!m) return MI_STATUS_INVALID_ARGUMENT;
    m->last_error[0] = 0;
    if (!tokens || n_tokens == 0 || !capture)
        return mim_model_fail(m, MI_STATUS_INVALID_ARGUMENT, "tokens and capture are required");
    if (n_tokens > (size_t)INT32_MAX)
        return mim_model_fail(m, MI_STATUS_INVALID_ARGUMENT, "too many tokens");
    const int64_t n = (int64_t)n_tokens;
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->vocab)
            return mim_model_fail(m, MI_STATUS_INVALID_ARGUMENT,
                                  "token %d at %lld is outside the vocabulary (%d)", tokens[i],
                                  (long long)i, m->vocab);
    /* The cache no longer matches what a decode would continue from. */
    m->n_past = 0;
    if (m->gpu) return mim_gpu_forward(m, tokens, n, true, NULL, capture);
    const double t_start = mim_now_s();
    double t_attn = 0.0;
    const int64_t Dm = m->hidden, qd = (int64_t)m->n_heads * m->hd;
    const int64_t kvd = (int64_t)m->n_kv * m->hd;
    const int64_t chunk = n < m->params.mlp_chunk ? n : m->params.mlp_chunk;
    const int32_t half = m->rope.dim / 2;
    if (!m->wscratch && n > 4) {
        /* The forward's sgemm scratch, sized as it sizes it; NULL keeps matmuls on GEMV. */
        size_t most = 0;
        const mim_layer *L0 = &m->layers[0];
        const mim_weight *ws[] = {&L0->wq, &L0->wk, &L0->wv, &L0->wo, &L0->wg, &L0->wu, &L0->wd};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
            if ((size_t)(ws[i]->rows * ws[i]->cols) > most)
                most = (size_t)(ws[i]->rows * ws[i]->cols);
        m->wscratch = malloc(most * sizeof(float));
        m->wscratch_floats = m->wscratch ? most : 0;
    }
    float *x = malloc((size_t)(n * Dm) * sizeof(float));
    float *h = malloc((size_t)(n * (Dm > qd ? Dm : qd)) * sizeof(float));
    float *q = malloc((size_t)(n * qd) * sizeof(float));
    float *kb = malloc((size_t)(n * kvd) * sizeof(float));
    float *vb = malloc((size_t)(n * kvd) * sizeof(float));
    float *att = malloc((size_t)(n * qd) * sizeof(float));
    float *g = malloc((size_t)(chunk * m->ffn) * sizeof(float));
    float *u = malloc((size_t)(chunk * m->ffn) * sizeof(float));
    float *cos_t = malloc((size_t)(n * half) * sizeof(float));
    float *sin_t = malloc((size_t)(n * half) * sizeof(float));
    float *inv_freq = malloc((size_t)(half > 0 ? half : 1) * sizeof(float));
    mi_head_pattern *pat = malloc((size_t)m->n_heads * sizeof(mi_head_pattern));
    mi_status st = MI_STATUS_SUCCESS;
    if (!x || !h || !q || !kb || !vb || !att || !g || !u || !cos_t || !sin_t || !inv_freq || !pat) {
        st = mim_model_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory for %lld tokens",
                            (long long)n);
        goto done;
    }
    float mscale;
    mim_rope_freqs(&m->rope, n, inv_freq, &mscale);
    mim_rope_table(inv_freq, mscale, m->rope.dim, 0, n, cos_t, sin_t);
    for (int64_t i = 0; i < n; i++)
        mim_dequant_row(m->tok_embd.type,
                        (const unsigned char *)m->tok_embd.data +
                            (size_t)tokens[i] * m->tok_embd.row_bytes,
                        x + i * Dm, Dm);
    const mi_prefill_params pp = mim_prefill_params_for(m, n);

    for (int32_t l = 0; l < m->n_layers; l++) {
        const mim_layer *L = &m->layers[l];
        mim_rmsnorm(x, L->attn_norm, h, n, Dm, m->eps);
        mim_matmul(m, h, n, &L->wq, q, qd);
        mim_matmul(m, h, n, &L->wk, kb, kvd);
        mim_matmul(m, h, n, &L->wv, vb, kvd);
        mim_add_bias(q, L->bq, n, qd, qd);
        mim_add_bias(kb, L->bk, n, kvd, kvd);
        mim_add_bias(vb, L->bv, n, kvd, kvd);
        mim_rope_apply(&m->rope, q, n, m->n_heads, m->hd, qd, cos_t, sin_t);
        mim_rope_apply(&m->rope, kb, n, m->n_kv, m->hd, kvd, cos_t, sin_t);
        mi_tensor tq = mi_tensor_blhd(q, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_heads, n, m->hd);
        mi_tensor tk = mi_tensor_blhd(kb, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_kv, n, m->hd);
        mi_tensor tv = mi_tensor_blhd(vb, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_kv, n, m->hd);
        mi_tensor to = mi_tensor_blhd(att, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_heads, n, m->hd);
        if (capture->on_layer) {
            st = capture->on_layer(capture->user, l, &tq, &tk, &tv);
            if (st != MI_STATUS_SUCCESS) {
                mim_model_fail(m, st, "capture stopped at layer %d", l);
                goto done;
            }
        }
        if ((st = mim_layer_patterns(m, l, n, pat)) != MI_STATUS_SUCCESS) goto done;
        const double t0 = mim_now_s();
        st = mi_prefill_attention(m->ctx, &tq, &tk, &tv, NULL, pat, &pp, &to, NULL, NULL, 0);
        t_attn += mim_now_s() - t0;
        if (st != MI_STATUS_SUCCESS) {
            mim_model_fail(m, st, "layer %d attention: %s", l, mi_context_last_error(m->ctx));
            goto done;
        }
        mim_matmul(m, att, n, &L->wo, h, Dm);
        for (int64_t i = 0; i < n * Dm; i++) x[i] += h[i];
        for (int64_t c0 = 0; c0 < n; c0 += chunk) {
            const int64_t c = n - c0 < chunk ? n - c0 : chunk;
            float *xc = x + c0 * Dm;
            mim_rmsnorm(xc, L->ffn_norm, h, c, Dm, m->eps);
            mim_matmul(m, h, c, &L->wg, g, m->ffn);
            mim_matmul(m, h, c, &L->wu, u, m->ffn);
            for (int64_t i = 0; i < c * m->ffn; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
            mim_matmul(m, g, c, &L->wd, h, Dm);
            for (int64_t i = 0; i < c * Dm; i++) xc[i] += h[i];
        }
        if (m->progress) m->progress(m->progress_user, l + 1, m->n_layers, n);
    }
    if (capture->token_log_probs) st = cap_log_probs(m, x, tokens, n, capture->token_log_probs);
    if (st == MI_STATUS_SUCCESS) {
        m->timing.n_tokens = n;
        m->timing.total_s = mim_now_s() - t_start;
        m->timing.attention_s = t_attn;
        m->timing.gemm_s = 0.0; /* not separated in the measuring pass */
    }

done:
    free(x);
    free(h);
    free(q);
    free(kb);
    free(vb);
    free(att);
    free(g);
    free(u);
    free(cos_t);
    free(sin_t);
    free(inv_freq);
    free(pat);
    return st;
}
