/*
 * metrics.c: exact recall, density and FLOPs of each head's pattern, and relative L2 error.
 *
 * q [B, H_q, L, D], k [B, H_kv, L, D], patterns [H_q]; out [B * H_q].
 * The pattern of each (b, h) is planned exactly as mi_prefill_attention plans it (same dense
 * fallback, estimation and index), so the key set measured is the very set the kernel visits.
 * Per 64-row block: pass 1 the dense LSE of each row (online, over all causal keys); pass 2 the
 * sum of exp(s - lse) over the visited keys after the causal mask. recall = mean over valid rows,
 * density = visited causal pairs / all causal pairs, flops = 4 D visited, dense_flops = 4 D causal
 * pairs. Memory is O(64 x 64) per thread; no L x L matrix.
 */
#include "cpu_common.h"
#include "pattern_table.h"

#include <math.h>
#include <omp.h>

/* Runs the call's InfLLM heads (if any) into a scratch output, recording their blocks. */
static mi_status infllm_trace(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                              const mi_tensor *k, const int32_t *seq_lens,
                              const mi_head_plan *heads, float scale, mi_cpu_infllm_trace *trace,
                              float **scratch_out) {
    int64_t chunks = 0, max_sel = 1;
    for (int64_t h = 0; h < s->heads_q; h++) {
        if (heads[h].kernel != MI_PLAN_KERNEL_INFLLM) continue;
        chunks = mi_cpu_max64(chunks, (s->len + heads[h].chunk_size - 1) / heads[h].chunk_size);
        max_sel = mi_cpu_max64(max_sel, heads[h].top_k);
    }
    if (chunks == 0) return MI_STATUS_SUCCESS;
    const int64_t Lq = s->len - s->q_off, n = s->batch * s->heads_q;
    trace->n_chunks = chunks;
    trace->max_sel = max_sel;
    trace->count = calloc((size_t)(n * chunks), sizeof(int32_t));
    trace->blocks = malloc((size_t)(n * chunks * max_sel) * sizeof(int32_t));
    *scratch_out = malloc((size_t)(n * Lq * s->head_dim) * sizeof(float));
    if (!trace->count || !trace->blocks || !*scratch_out)
        return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "metrics: out of memory");
    mi_tensor o = mi_tensor_bhld(*scratch_out, MI_DTYPE_F32, MI_DEVICE_CPU, s->batch, s->heads_q,
                                 Lq, s->head_dim);
    return mi_cpu_infllm_run(ctx, s, q, k, k, seq_lens, heads, scale, &o, NULL, trace);
}

mi_status mi_cpu_metrics_evaluate(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                                  const mi_tensor *k, const int32_t *seq_lens,
                                  const mi_head_pattern *patterns, const mi_prefill_params *params,
                                  mi_head_metrics *out) {
    const mi_prefill_params pp = params ? *params : mi_prefill_default_params();
    const int nt = ctx->n_threads > 0 ? ctx->n_threads : 1;
    const int64_t L = s->len, R = (L + MI_BS - 1) / MI_BS, n_jobs = s->batch * s->heads_q;
    const float scale = mi_resolve_scale(pp.softmax_scale, s->head_dim);
    size_t need = 0;
    mi_cpu_prefill_workspace_size(ctx, s, patterns, &pp, &need);
    void *ws = aligned_alloc(64, (need + 63) / 64 * 64);
    double *mass = malloc((size_t)(n_jobs * R) * 2 * sizeof(double));
    mi_tile *tiles[nt];
    int ok = ws && mass;
    ok = mi_cpu_scratch_alloc(ctx, nt, s->head_dim, 0, tiles, NULL) && ok;
    mi_status st = ok ? MI_STATUS_SUCCESS : MI_STATUS_OUT_OF_MEMORY;
    mi_attn_job *jobs = NULL;
    /* row-mask heads (dilated, strided) have a key set per row, which their own pass measures */
    mi_head_plan *heads = malloc((size_t)s->heads_q * sizeof *heads);
    mi_prefill_plan plan;
    if (heads) mi_cpu_plan_heads(s, seq_lens, patterns, &pp, heads, &plan);
    ok = ok && heads;
    if (!ok) st = MI_STATUS_OUT_OF_MEMORY;
    if (ok) st = mi_cpu_prefill_plan(ctx, s, q, k, seq_lens, patterns, &pp, ws, &jobs);
    /* InfLLM heads choose their blocks as they run: a run records the choice */
    mi_cpu_infllm_trace trace;
    memset(&trace, 0, sizeof trace);
    float *scratch_out = NULL;
    if (st == MI_STATUS_SUCCESS)
        st = infllm_trace(ctx, s, q, k, seq_lens, heads, scale, &trace, &scratch_out);
    if (st == MI_STATUS_SUCCESS) {
        double *visited = mass + n_jobs * R;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
        for (int64_t it = 0; it < n_jobs * R; it++) {
            const mi_attn_job *j = &jobs[it / R];
            const int64_t r0 = (it % R) * MI_BS;
            double row_mass[MI_BS];
            mass[it] = visited[it] = 0.0;
            if (r0 >= j->len) continue;
            const mi_head_plan *hp = &heads[j->h];
            if (hp->kernel == MI_PLAN_KERNEL_INFLLM && !mi_head_plan_dense_at(hp, j->len)) {
                const int64_t a = mi_cpu_max64(r0, s->q_off);
                const int64_t nr = mi_cpu_min64(MI_BS, j->len - r0) - (a - r0);
                for (int64_t i = 0; i < MI_BS; i++) row_mass[i] = 0.0;
                if (nr > 0)
                    mi_cpu_infllm_mass(s, q, k, hp, &trace, j->b, j->h, j->len, a, nr, scale,
                                       row_mass + (a - r0), &visited[it]);
            } else if (hp->kernel == MI_PLAN_KERNEL_ROWMASK && !mi_head_plan_dense_at(hp, j->len)) {
                /* rows from the first query on (queries at an offset) */
                const int64_t a = mi_cpu_max64(r0, s->q_off);
                const int64_t nr = mi_cpu_min64(MI_BS, j->len - r0) - (a - r0);
                for (int64_t i = 0; i < MI_BS; i++) row_mass[i] = 0.0;
                if (nr > 0)
                    mi_cpu_rowmask_mass(s, q, k, hp, j->b, j->h, j->len, a, nr, scale,
                                        row_mass + (a - r0), &visited[it]);
            } else {
                mi_cpu_job_mass(tiles[omp_get_thread_num()], s, q, k, j, scale, r0, row_mass,
                                &visited[it]);
            }
            const int64_t nr = mi_cpu_min64(MI_BS, j->len - r0);
            for (int64_t i = 0; i < nr; i++) mass[it] += row_mass[i];
        }
        /* reduced in a fixed order: results do not depend on the thread count */
        for (int64_t j = 0; j < n_jobs; j++) {
            double m = 0.0, vis = 0.0;
            for (int64_t r = 0; r < R; r++) {
                m += mass[j * R + r];
                vis += visited[j * R + r];
            }
            const double len = (double)jobs[j].len;
            const double causal = len * (len + 1.0) / 2.0;
            out[j].recall = len > 0 ? m / len : 1.0;
            out[j].density = causal > 0 ? vis / causal : 0.0;
            out[j].flops = 4.0 * (double)s->head_dim * vis;
            out[j].dense_flops = 4.0 * (double)s->head_dim * causal;
        }
    }
    mi_cpu_scratch_free(nt, tiles, NULL);
    free(trace.count);
    free(trace.blocks);
    free(scratch_out);
    free(heads);
    free(mass);
    free(ws);
    if (st == MI_STATUS_OUT_OF_MEMORY) return mi_fail(ctx, st, "metrics: out of memory");
    return st;
}

mi_status mi_cpu_metrics_rel_l2(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *out,
                                const mi_tensor *ref, const int32_t *seq_lens, double *rel_err) {
    const int64_t D = s->head_dim;
    float *a = malloc((size_t)D * 2 * sizeof(float));
    if (!a) return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "rel_l2: out of memory");
    float *r = a + D;
    double num = 0.0, den = 0.0;
    for (int64_t b = 0; b < s->batch; b++) {
        const int64_t len = mi_seq_len(seq_lens, b, s->len);
        for (int64_t h = 0; h < s->heads_q; h++) {
            for (int64_t i = 0; i < len; i++) {
                mi_cpu_load_f32(a, mi_cpu_row(out, b, h, i), out->dtype, D, 1.0f);
                mi_cpu_load_f32(r, mi_cpu_row(ref, b, h, i), ref->dtype, D, 1.0f);
                for (int64_t d = 0; d < D; d++) {
                    const double e = (double)a[d] - (double)r[d];
                    num += e * e;
                    den += (double)r[d] * (double)r[d];
                }
            }
        }
    }
    free(a);
    *rel_err = den > 0.0 ? sqrt(num / den) : (num > 0.0 ? INFINITY : 0.0);
    return MI_STATUS_SUCCESS;
}
