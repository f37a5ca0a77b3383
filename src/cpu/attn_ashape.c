/*
 * attn_ashape.c: A-shape ("stream_llm") and Tri-shape attention.
 *
 * q [B, H_q, L, D], k/v [B, H_kv, L, D], out like q, lse [B, H_q, L] (optional).
 * Row i of a sequence of length len sees keys {j <= i : i - j < n_local} ∪ {j < n_init}; with
 * n_last > 0 the last min(n_last, len - 1) rows see all their causal keys (Tri-shape).
 * One pass per 64-row block (unlike the original's two stages with an LSE merge): the block visits
 * the sink range [0, min(n_init, r1)) and the window range [r0 - n_local + 1, r1) (merged when
 * they touch), or [0, r1) when it holds Tri rows; the per-key mask in attn_core.c cuts each
 * row's exact set. Results equal the two-stage form up to rounding.
 */
#include "cpu_common.h"

mi_status mi_cpu_attention_a_shape(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                                   const mi_tensor *k, const mi_tensor *v, const int32_t *seq_lens,
                                   int32_t n_init, int32_t n_local, int32_t n_last, float scale,
                                   mi_tensor *out, float *lse) {
    mi_attn_job *jobs = mi_cpu_jobs_new(s, seq_lens);
    if (!jobs) return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "a-shape attention: out of memory");
    const int64_t n = s->batch * s->heads_q;
    for (int64_t i = 0; i < n; i++) mi_cpu_job_ashape(&jobs[i], n_init, n_local, n_last);
    const mi_status st = mi_cpu_run_jobs(ctx, s, q, k, v, jobs, n, scale, out, lse);
    free(jobs);
    return st;
}
