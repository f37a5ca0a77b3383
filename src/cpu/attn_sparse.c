/*
 * attn_sparse.c: attention over a compiled block index (docs/algorithms.md §3, made causal-safe).
 *
 * q [B, H_q, L, D], k/v [B, H_kv, L, D], out like q, lse [B, H_q, L] (optional);
 * index: block_count [B, H_q, R], block_offset [B, H_q, R, max_blocks], column_count [B, H_q, R],
 * column_index [B, H_q, R, max_columns].
 * Row block m: phase 1 visits each 64-wide key range [offset, offset + 64) clipped to the
 * sequence; phase 2 the gathered columns, 64 per tile; one online softmax across both phases.
 * Unlike the original, the causal mask is applied in both phases, so any index is safe: keys after
 * a row (and keys >= seq_len) never contribute, whatever the index holds. Counts are clamped to
 * the index capacities and out-of-range entries skipped. The index is read as a list: a key
 * listed twice (overlapping ranges, or a column inside a range) is counted twice, as in the
 * original; the library's own index builders never list a key twice.
 */
#include "cpu_common.h"

void mi_cpu_job_sparse(mi_attn_job *job, const mi_sparse_index *index) {
    const int64_t bh = job->b * index->heads + job->h;
    const int64_t R = index->row_blocks;
    job->kind = MI_JOB_SPARSE;
    job->max_blocks = index->max_blocks;
    job->max_columns = index->max_columns;
    job->block_count = index->block_count + bh * R;
    job->column_count = index->column_count + bh * R;
    job->block_offset = index->block_offset + bh * R * index->max_blocks;
    job->column_index = index->column_index + bh * R * index->max_columns;
}

mi_status mi_cpu_attention_sparse(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                                  const mi_tensor *k, const mi_tensor *v, const int32_t *seq_lens,
                                  const mi_sparse_index *index, float scale, mi_tensor *out,
                                  float *lse) {
    mi_attn_job *jobs = mi_cpu_jobs_new(s, seq_lens);
    if (!jobs) return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "sparse attention: out of memory");
    const int64_t n = s->batch * s->heads_q;
    for (int64_t i = 0; i < n; i++) mi_cpu_job_sparse(&jobs[i], index);
    const mi_status st = mi_cpu_run_jobs(ctx, s, q, k, v, jobs, n, scale, out, lse);
    free(jobs);
    return st;
}
