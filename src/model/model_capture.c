/*
 * model_capture.c: a measurement prefill for the pattern search and the perplexity harness.
 *
 * The search needs every layer's post-RoPE q/k/v on a sample prompt, and perplexity needs the
 * log-probability of every next token, not only the last position's logits. Both come from the
 * forward pass itself (mim_forward with a capture: the hook is called after each layer's RoPE,
 * and the final residuals go through the LM head here), so the measured model is exactly the
 * generating one. The cache is left empty afterwards.
 */
#include "model_runner.h"

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

mi_status mim_token_log_probs(mi_model *m, const float *x, const int32_t *tokens, int64_t n,
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
    return mim_forward(m, tokens, (int64_t)n_tokens, true, NULL, capture);
}
