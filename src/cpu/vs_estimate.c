/*
 * vs_estimate.c: vertical-slash estimation (docs/algorithms.md §1), per (b, h), all heads in
 * parallel.
 *
 * q [B, H_q, L, D], k [B, H_kv, L, D]; output per (b, h): vertical columns (ascending) and slash
 * distances d = i - j (descending) in an mi_vs_index.
 *
 * For a sequence of length len and n = min(last_q, len):
 *   S = scale * q[len-n:len] k[0:len]^T in fp32, causal (only the n x n corner is affected),
 *   P = softmax_fp32(S) per row,  vert[j] = sum_r P[r][j],  slash[d] = sum_r P[r][r' - d]
 * computed directly (no strided-view trick, so any B and H work) in two blockwise passes over the
 * keys (row LSE, then the normalised sums) so memory stays O(len) per head instead of n x len.
 * Then vert[0:forced_columns] = slash[0:forced_diagonals] = +inf, budgets
 * nv = min(len, max(vertical_size[h], min_vertical)), ns = min(len, max(slash_size[h], min_slash)),
 * and a deterministic top-k (ties: lower column / lower distance first, so with a budget below the
 * forced count the smallest distances and first columns win).
 */
#include "cpu_common.h"

#include <math.h>
#include <omp.h>

size_t mi_cpu_vs_ws_floats(int64_t len) { return 3 * (size_t)(len > 0 ? len : 1); }

void mi_cpu_vs_estimate_head(mi_tile *t, const mi_attn_shape *s, const mi_tensor *q,
                             const mi_tensor *k, int64_t b, int64_t h, int64_t len,
                             int32_t vertical_size, int32_t slash_size, const mi_vs_params *p,
                             float scale, float *ws, int32_t *vidx, int32_t *vcount, int32_t *sidx,
                             int32_t *scount) {
    *vcount = 0;
    *scount = 0;
    if (len <= 0) return;
    float *vert = ws, *slash = ws + len;
    int32_t *tmp = (int32_t *)(ws + 2 * len);
    memset(vert, 0, (size_t)len * sizeof(float));
    memset(slash, 0, (size_t)len * sizeof(float));
    /* queries at an offset: the chunk's own last rows, against all keys */
    const int64_t n = mi_cpu_max64(0, mi_cpu_min64(p->last_q, len - s->q_off));
    if (n > 0) mi_cpu_vs_sums(t, s, q, k, b, h, len, n, scale, vert, slash);
    const int64_t fc = mi_cpu_max64(0, mi_cpu_min64(p->forced_columns, len));
    const int64_t fd = mi_cpu_max64(0, mi_cpu_min64(p->forced_diagonals, len));
    for (int64_t j = 0; j < fc; j++) vert[j] = INFINITY;
    for (int64_t d = 0; d < fd; d++) slash[d] = INFINITY;
    const int32_t nv = mi_cpu_vs_budget(vertical_size, p->min_vertical, len);
    const int32_t ns = mi_cpu_vs_budget(slash_size, p->min_slash, len);
    mi_cpu_topk(vert, (int32_t)len, nv, tmp, vidx);
    mi_cpu_topk(slash, (int32_t)len, ns, tmp, sidx);
    for (int32_t i = 0; i < ns / 2; i++) { /* ascending -> descending distances */
        const int32_t x = sidx[i];
        sidx[i] = sidx[ns - 1 - i];
        sidx[ns - 1 - i] = x;
    }
    *vcount = nv;
    *scount = ns;
}

mi_status mi_cpu_vs_estimate(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                             const mi_tensor *k, const int32_t *seq_lens,
                             const int32_t *vertical_size, const int32_t *slash_size,
                             const mi_vs_params *params, float scale, mi_vs_index *index) {
    const int nt = ctx->n_threads > 0 ? ctx->n_threads : 1;
    const int64_t n_jobs = s->batch * s->heads_q;
    const size_t ws_floats = mi_cpu_vs_ws_floats(s->len);
    mi_tile *tiles[nt];
    float *ws[nt];
    const int ok = mi_cpu_scratch_alloc(ctx, nt, s->head_dim, ws_floats, tiles, ws);
    /* Scratch for the top-k results beyond the index capacity is never needed: the API checks
     * max_vertical / max_slash against the clamped budgets; we clamp again for safety. */
    if (ok) {
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
        for (int64_t it = 0; it < n_jobs; it++) {
            const int tid = omp_get_thread_num();
            const int64_t b = it / s->heads_q, h = it % s->heads_q;
            const int64_t len = mi_seq_len(seq_lens, b, s->len);
            int32_t vs = vertical_size[h], ss = slash_size[h];
            if (mi_cpu_vs_budget(vs, params->min_vertical, len) > index->max_vertical) {
                vs = index->max_vertical;
            }
            if (mi_cpu_vs_budget(ss, params->min_slash, len) > index->max_slash) {
                ss = index->max_slash;
            }
            /* the minimum budgets could still exceed a too-small capacity: clamp them too */
            mi_vs_params p = *params;
            if (p.min_vertical > index->max_vertical) p.min_vertical = index->max_vertical;
            if (p.min_slash > index->max_slash) p.min_slash = index->max_slash;
            mi_cpu_vs_estimate_head(
                tiles[tid], s, q, k, b, h, len, vs, ss, &p, scale, ws[tid],
                index->vertical_idx + it * index->max_vertical, index->vertical_count + it,
                index->slash_idx + it * index->max_slash, index->slash_count + it);
        }
    }
    mi_cpu_scratch_free(nt, tiles, ws);
    return ok ? MI_STATUS_SUCCESS
              : mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "vs estimation: out of memory");
}
