/*
 * prefill.c: one layer of prefill attention, every query head with its own pattern.
 *
 * q [B, H_q, L, D], k/v [B, H_kv, L, D], out like q, lse [B, H_q, L] (optional),
 * patterns [H_q], per-sequence lengths (varlen). Steps:
 *   1. plan: the heads' plan from src/core/prefill_plan.c (kernel, estimate, budgets, and the
 *      crossover of dense_fallback_cpu.h below which a sequence runs dense); one job per
 *      (b, h); heads with an estimate fill their index from q/k (in parallel over (b, h));
 *   2. run: every job's row blocks in one parallel loop (attn_core.c), so heads with different
 *      patterns share the threads evenly.
 * Workspace (caller memory or allocated here), 64-byte aligned parts:
 *   jobs      [B * H_q] mi_attn_job
 *   indices   per (b, h): vertical-slash: block_count [R], column_count [R],
 *             block_offset [R, ns + 1], column_index [R, nv]; block-sparse: block_count [R],
 *             column_count [R], block_offset [R, min(max(top_k, 2), R)]
 *   threads   per thread: the estimators' scratch (O(L) floats) and the vertical/slash sets
 * where nv / ns are the head's budgets clamped as in estimation with L for the length.
 * The attention engine's per-thread tiles (about 5 * 64 * D floats) are allocated by the engine.
 */
#include "cpu_common.h"
#include "dense_fallback_cpu.h"
#include "pattern_table.h"

#include <omp.h>

/* Sequences shorter than a head's crossover run it dense when params->dense_below < 0: the rule
 * and what it was fitted to are in dense_fallback_cpu.h. */

#define ALIGN64(x) (((x) + 63) / 64 * 64)

static mi_prefill_params resolve_params(const mi_prefill_params *params) {
    mi_prefill_params p = params ? *params : mi_prefill_default_params();
    return p;
}

/* The call's plan (src/core/prefill_plan.c) under the CPU's crossovers; heads [H_q]. */
void mi_cpu_plan_heads(const mi_attn_shape *s, const int32_t *seq_lens,
                       const mi_head_pattern *patterns, const mi_prefill_params *pp,
                       mi_head_plan *heads, mi_prefill_plan *plan) {
    mi_prefill_plan_build(s, seq_lens, patterns, pp, mi_cpu_dense_below_rule, NULL, heads, plan);
}
#define plan_heads mi_cpu_plan_heads

/* int32 count of one (b, h)'s index for head plan hp at padded length L: the columns (nv) and
 * 64-key ranges (maxb) per row block its estimate fills. */
static size_t head_index_ints(const mi_head_plan *hp, int64_t L, int32_t *nv, int32_t *maxb) {
    const int64_t R = (L + MI_BS - 1) / MI_BS;
    *nv = *maxb = 0;
    switch (hp->estimate) {
    case MI_PLAN_ESTIMATE_VS:
        *nv = hp->vertical;
        *maxb = hp->slash + 1;
        return (size_t)R * (2 + (size_t)*maxb + (size_t)*nv);
    case MI_PLAN_ESTIMATE_BLOCK:
        *maxb = (int32_t)mi_cpu_min64(mi_cpu_max64(hp->top_k, 2), R);
        return (size_t)R * (2 + (size_t)*maxb);
    case MI_PLAN_ESTIMATE_XATTN:
    case MI_PLAN_ESTIMATE_FLEX:
        /* a threshold may keep any number of blocks */
        *maxb = (int32_t)R;
        return (size_t)R * (2 + (size_t)R);
    case MI_PLAN_ESTIMATE_NONE:
    case MI_PLAN_ESTIMATES: break;
    }
    /* row-mask and InfLLM heads run as empty index jobs (their own kernels write the rows
     * after) */
    if (hp->kernel == MI_PLAN_KERNEL_ROWMASK || hp->kernel == MI_PLAN_KERNEL_INFLLM)
        return (size_t)R * 2;
    return 0;
}

typedef struct layout {
    size_t jobs, indices, threads, per_thread, ws_floats_off, sets_off, total;
    size_t index_ints; /* per batch row, all heads */
} layout;

static layout make_layout(const mi_context *ctx, const mi_attn_shape *s,
                          const mi_prefill_plan *plan) {
    layout lay;
    const int nt = ctx->n_threads > 0 ? ctx->n_threads : 1;
    lay.index_ints = 0;
    for (int64_t h = 0; h < s->heads_q; h++) {
        int32_t nv, maxb;
        lay.index_ints += head_index_ints(&plan->head[h], s->len, &nv, &maxb);
    }
    /* each estimate's per-thread scratch, the largest of those the call runs */
    size_t est_floats = 0;
    if (plan->pairs[MI_PLAN_ESTIMATE_VS]) est_floats = mi_cpu_vs_ws_floats(s->len);
    if (plan->pairs[MI_PLAN_ESTIMATE_BLOCK] &&
        mi_cpu_bs_ws_floats(s->len, s->head_dim) > est_floats) {
        est_floats = mi_cpu_bs_ws_floats(s->len, s->head_dim);
    }
    for (int64_t h = 0; h < s->heads_q; h++) {
        const mi_head_plan *hp = &plan->head[h];
        if (hp->estimate != MI_PLAN_ESTIMATE_XATTN) continue;
        const size_t x = mi_cpu_xattn_ws_floats(s->len, s->head_dim, hp->stride);
        if (x > est_floats) est_floats = x;
    }
    lay.jobs = 0;
    lay.indices = ALIGN64((size_t)(s->batch * s->heads_q) * sizeof(mi_attn_job));
    lay.threads = lay.indices + ALIGN64((size_t)s->batch * lay.index_ints * sizeof(int32_t));
    lay.ws_floats_off = 0;
    lay.sets_off = ALIGN64(est_floats * sizeof(float));
    /* vertical set, slash set, and the index builder's scratch (both again) */
    lay.per_thread =
        lay.sets_off + ALIGN64(2 * ((size_t)plan->max_vertical + (size_t)plan->max_slash + 1) * 4);
    /* + 64: a caller's workspace need not be aligned; the plan aligns its start */
    lay.total = lay.threads + (size_t)nt * lay.per_thread + 64;
    return lay;
}

mi_status mi_cpu_prefill_workspace_size(mi_context *ctx, const mi_attn_shape *s,
                                        const mi_head_pattern *patterns,
                                        const mi_prefill_params *params, size_t *bytes) {
    const mi_prefill_params pp = resolve_params(params);
    mi_head_plan *heads = malloc((size_t)s->heads_q * sizeof *heads);
    if (!heads) return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "prefill: out of memory");
    mi_prefill_plan plan;
    plan_heads(s, NULL, patterns, &pp, heads, &plan);
    *bytes = make_layout(ctx, s, &plan).total;
    free(heads);
    return MI_STATUS_SUCCESS;
}

/* Estimates the index of sparse job j (its slices laid out by the plan) on thread scratch; xtile
 * is the thread's tile for XAttention's reshaped rows. */
static void estimate_job(mi_tile *tile, mi_tile *xtile, const mi_attn_shape *s, const mi_tensor *q,
                         const mi_tensor *k, const mi_head_plan *hp, const mi_head_pattern *p,
                         const mi_prefill_params *pp, float scale, const layout *lay, char *mine,
                         mi_attn_job *j) {
    const int64_t L = s->len, R = (L + MI_BS - 1) / MI_BS;
    float *est = (float *)(mine + lay->ws_floats_off);
    switch (hp->estimate) {
    case MI_PLAN_ESTIMATE_BLOCK:
        mi_cpu_bs_estimate_head(tile, s, q, k, j->b, j->h, j->len, R, hp->top_k, est,
                                (int32_t *)j->block_count, (int32_t *)j->block_offset,
                                j->max_blocks, (int32_t *)j->column_count);
        break;
    case MI_PLAN_ESTIMATE_VS: {
        int32_t *vset = (int32_t *)(mine + lay->sets_off);
        int32_t *sset = vset + j->max_columns;
        int32_t *scratch = sset + j->max_blocks;
        int32_t nv = 0, ns = 0;
        mi_cpu_vs_estimate_head(tile, s, q, k, j->b, j->h, j->len, p->vertical_size, p->slash_size,
                                &pp->vs, scale, est, vset, &nv, sset, &ns);
        mi_cpu_vs_index_head(L, j->len, s->q_off, vset, nv, sset, ns, scratch,
                             (int32_t *)j->block_count, (int32_t *)j->block_offset, j->max_blocks,
                             (int32_t *)j->column_count, (int32_t *)j->column_index,
                             j->max_columns);
        break;
    }
    case MI_PLAN_ESTIMATE_XATTN:
        mi_cpu_xattn_estimate_head(xtile, s, q, k, j->b, j->h, j->len, R, hp->stride, hp->threshold,
                                   scale, est, (int32_t *)j->block_count,
                                   (int32_t *)j->block_offset, j->max_blocks,
                                   (int32_t *)j->column_count, NULL);
        break;
    case MI_PLAN_ESTIMATE_FLEX:
        mi_cpu_flex_estimate_head(tile, s, q, k, j->b, j->h, j->len, R, hp->threshold, hp->tau,
                                  scale, (int32_t *)j->block_count, (int32_t *)j->block_offset,
                                  j->max_blocks, (int32_t *)j->column_count, NULL);
        break;
    case MI_PLAN_ESTIMATE_NONE:
    case MI_PLAN_ESTIMATES: break;
    }
}

static mi_status plan_jobs(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                           const mi_tensor *k, const int32_t *seq_lens,
                           const mi_head_pattern *patterns, const mi_prefill_params *pp,
                           const mi_prefill_plan *plan, void *workspace, mi_attn_job **jobs_out) {
    const layout lay = make_layout(ctx, s, plan);
    const int nt = ctx->n_threads > 0 ? ctx->n_threads : 1;
    const int64_t L = s->len, R = (L + MI_BS - 1) / MI_BS, Hq = s->heads_q;
    const int64_t n_jobs = s->batch * Hq;
    const float scale = mi_resolve_scale(pp->softmax_scale, s->head_dim);
    char *ws = (char *)(((uintptr_t)workspace + 63) / 64 * 64);
    mi_attn_job *jobs = (mi_attn_job *)(ws + lay.jobs);
    int32_t *idx = (int32_t *)(ws + lay.indices);
    int need_estimate = 0;
    for (int64_t b = 0; b < s->batch; b++) {
        for (int64_t h = 0; h < Hq; h++) {
            mi_attn_job *j = &jobs[b * Hq + h];
            const mi_head_plan *hp = &plan->head[h];
            int32_t nv, maxb;
            const size_t n_ints = head_index_ints(hp, L, &nv, &maxb);
            memset(j, 0, sizeof *j);
            j->b = b;
            j->h = h;
            j->len = mi_seq_len(seq_lens, b, L);
            j->kind = MI_JOB_DENSE;
            if (!mi_head_plan_dense_at(hp, j->len)) {
                switch (hp->kernel) {
                case MI_PLAN_KERNEL_WINDOW:
                    mi_cpu_job_ashape(j, hp->n_init, hp->n_local, hp->n_last);
                    break;
                case MI_PLAN_KERNEL_INDEX: {
                    /* index slices; estimation fills them below */
                    j->kind = MI_JOB_SPARSE;
                    int32_t *bc = idx, *cc = idx + R, *bo = idx + 2 * R, *ci = bo + R * maxb;
                    j->block_count = bc;
                    j->column_count = cc;
                    j->block_offset = bo;
                    j->column_index = nv > 0 ? ci : bo;
                    j->max_blocks = maxb;
                    j->max_columns = nv;
                    need_estimate = 1;
                    break;
                }
                case MI_PLAN_KERNEL_ROWMASK:
                case MI_PLAN_KERNEL_INFLLM:
                    /* no keys here: mi_cpu_rowmask_run / mi_cpu_infllm_run write these rows
                     * after the engine */
                    j->kind = MI_JOB_SPARSE;
                    memset(idx, 0, 2 * (size_t)R * sizeof(int32_t));
                    j->block_count = j->block_offset = j->column_index = idx;
                    j->column_count = idx + R;
                    break;
                case MI_PLAN_KERNEL_DENSE: break;
                }
            }
            idx += n_ints;
        }
    }
    if (need_estimate) {
        mi_tile *tiles[nt], *xtiles[nt];
        int64_t xd = 0; /* XAttention's reshaped row width: the largest stride * D */
        for (int64_t h = 0; h < Hq; h++)
            if (plan->head[h].estimate == MI_PLAN_ESTIMATE_XATTN)
                xd = mi_cpu_max64(xd, (int64_t)plan->head[h].stride * s->head_dim);
        int ok = mi_cpu_scratch_alloc(ctx, nt, s->head_dim, 0, tiles, NULL);
        for (int i = 0; i < nt; i++) xtiles[i] = NULL;
        if (xd > 0) ok = mi_cpu_scratch_alloc(ctx, nt, xd, 0, xtiles, NULL) && ok;
        if (ok) {
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
            for (int64_t it = 0; it < n_jobs; it++) {
                mi_attn_job *j = &jobs[it];
                if (j->kind != MI_JOB_SPARSE) continue;
                const int tid = omp_get_thread_num();
                char *mine = ws + lay.threads + (size_t)tid * lay.per_thread;
                if (plan->head[j->h].kernel != MI_PLAN_KERNEL_INDEX) continue;
                estimate_job(tiles[tid], xtiles[tid], s, q, k, &plan->head[j->h], &patterns[j->h],
                             pp, scale, &lay, mine, j);
            }
        }
        mi_cpu_scratch_free(nt, tiles, NULL);
        if (xd > 0) mi_cpu_scratch_free(nt, xtiles, NULL);
        if (!ok) return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "prefill: out of memory");
    }
    *jobs_out = jobs;
    return MI_STATUS_SUCCESS;
}

mi_status mi_cpu_prefill_plan(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                              const mi_tensor *k, const int32_t *seq_lens,
                              const mi_head_pattern *patterns, const mi_prefill_params *params,
                              void *workspace, mi_attn_job **jobs_out) {
    const mi_prefill_params pp = resolve_params(params);
    mi_head_plan *heads = malloc((size_t)s->heads_q * sizeof *heads);
    if (!heads) return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "prefill: out of memory");
    mi_prefill_plan plan;
    plan_heads(s, seq_lens, patterns, &pp, heads, &plan);
    const mi_status st =
        plan_jobs(ctx, s, q, k, seq_lens, patterns, &pp, &plan, workspace, jobs_out);
    free(heads);
    return st;
}

mi_status mi_cpu_prefill_attention(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                                   const mi_tensor *k, const mi_tensor *v, const int32_t *seq_lens,
                                   const mi_head_pattern *patterns, const mi_prefill_params *params,
                                   mi_tensor *out, float *lse, void *workspace,
                                   size_t workspace_size) {
    size_t need = 0;
    mi_cpu_prefill_workspace_size(ctx, s, patterns, params, &need);
    void *owned = NULL;
    if (!workspace) {
        owned = aligned_alloc(64, ALIGN64(need));
        if (!owned) return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "prefill: out of memory");
        workspace = owned;
    } else if (workspace_size < need) {
        return mi_fail(ctx, MI_STATUS_WORKSPACE_TOO_SMALL,
                       "prefill: workspace of %zu bytes, %zu needed", workspace_size, need);
    }
    mi_attn_job *jobs = NULL;
    mi_status st = mi_cpu_prefill_plan(ctx, s, q, k, seq_lens, patterns, params, workspace, &jobs);
    if (st == MI_STATUS_SUCCESS) {
        const mi_prefill_params pp = resolve_params(params);
        const float scale = mi_resolve_scale(pp.softmax_scale, s->head_dim);
        st = mi_cpu_run_jobs(ctx, s, q, k, v, jobs, s->batch * s->heads_q, scale, out, lse);
        mi_head_plan *heads =
            st == MI_STATUS_SUCCESS ? malloc((size_t)s->heads_q * sizeof *heads) : NULL;
        if (st == MI_STATUS_SUCCESS && !heads)
            st = mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "prefill: out of memory");
        if (heads) {
            mi_prefill_plan plan;
            plan_heads(s, seq_lens, patterns, &pp, heads, &plan);
            st = mi_cpu_rowmask_run(ctx, s, q, k, v, seq_lens, heads, scale, out, lse);
            if (st == MI_STATUS_SUCCESS)
                st = mi_cpu_infllm_run(ctx, s, q, k, v, seq_lens, heads, scale, out, lse, NULL);
            free(heads);
        }
    }
    free(owned);
    return st;
}
