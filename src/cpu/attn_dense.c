/*
 * attn_dense.c: dense causal attention (flash-style) and the job list helper.
 *
 * q [B, H_q, L, D], k/v [B, H_kv, L, D], out like q, lse [B, H_q, L] (optional).
 * Each (b, h, 64-row block) visits the key tiles [0, r1) through attn_core.c: 64 x 64 tiles,
 * online softmax in fp32, the causal mask only on the tiles that straddle the diagonal.
 *
 * Inner loops: the register-blocked micro-kernel of attn_engine.h (faster than cblas_sgemm per
 * tile; numbers in attn_core.c).
 */
#include "cpu_common.h"

mi_attn_job *mi_cpu_jobs_new(const mi_attn_shape *s, const int32_t *seq_lens) {
    const int64_t n = s->batch * s->heads_q;
    mi_attn_job *jobs = calloc((size_t)(n > 0 ? n : 1), sizeof *jobs);
    if (!jobs) return NULL;
    for (int64_t b = 0; b < s->batch; b++) {
        for (int64_t h = 0; h < s->heads_q; h++) {
            mi_attn_job *j = &jobs[b * s->heads_q + h];
            j->b = b;
            j->h = h;
            j->len = mi_seq_len(seq_lens, b, s->len);
            j->kind = MI_JOB_DENSE;
        }
    }
    return jobs;
}

mi_status mi_cpu_attention_dense(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                                 const mi_tensor *k, const mi_tensor *v, const int32_t *seq_lens,
                                 float scale, mi_tensor *out, float *lse) {
    mi_attn_job *jobs = mi_cpu_jobs_new(s, seq_lens);
    if (!jobs) return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "dense attention: out of memory");
    const mi_status st =
        mi_cpu_run_jobs(ctx, s, q, k, v, jobs, s->batch * s->heads_q, scale, out, lse);
    free(jobs);
    return st;
}
