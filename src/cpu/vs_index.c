/*
 * vs_index.c: vertical/slash sets -> block index (docs/algorithms.md §2), causal-safe for any
 * input.
 *
 * In:  per (b, h) verticals (key columns) and slashes (distances d = i - j), any order.
 * Out: block_count [B, H, R], block_offset [B, H, R, max_blocks], column_count [B, H, R],
 *      column_index [B, H, R, max_columns], R = ceil(L / 64).
 *
 * A copy of each set is filtered to [0, len), sorted and de-duplicated once per (b, h). For row
 * block m (keys start = 64m .. end = start + 64), diagonal d covers a 64-wide key band ending at
 * e = max(end - d, 64); bands are merged left to right (largest distance first) exactly as the
 * original: a band starting more than one block after the current range's end opens a new range,
 * one that ends past the range end extends it by one block (possibly past end; the kernel masks).
 * Verticals left of the current range become gathered columns, verticals inside a range are
 * dropped. Differences from the original, all for safety:
 *   - no out-of-bounds read when no distance is < end (then no ranges; verticals < start are all
 *     columns), and out-of-range / duplicate entries are ignored;
 *   - verticals after the last range but before the row block start (possible only without small
 *     distances) are kept as columns instead of being lost;
 *   - every column is < start, so columns are causally visible to the whole row block;
 *   - writes never exceed max_blocks / max_columns.
 * With the same inputs as the original (sorted, in range, d = 0 present) the output is identical,
 * e.g. the worked example of docs/algorithms.md §2.
 */
#include "cpu_common.h"

#include <omp.h>

/* Appends the 64-wide blocks of range [rs, re). */
static void emit(int64_t rs, int64_t re, int32_t *offs, int32_t *count, int64_t cap) {
    for (int64_t x = rs; x < re; x += MI_BS) {
        if (*count < cap) offs[(*count)++] = (int32_t)x;
    }
}

void mi_cpu_vs_index_head(int64_t L, int64_t len, int64_t first, const int32_t *verticals,
                          int32_t nv, const int32_t *slashes, int32_t ns, int32_t *scratch,
                          int32_t *block_count, int32_t *block_offset, int64_t max_blocks,
                          int32_t *column_count, int32_t *column_index, int64_t max_columns) {
    const int64_t R = (L + MI_BS - 1) / MI_BS;
    int32_t *V = scratch, *S = scratch + (nv > 0 ? nv : 0);
    int32_t n_v = 0, n_s = 0;
    for (int32_t i = 0; i < nv; i++) {
        if (verticals[i] >= 0 && verticals[i] < len) V[n_v++] = verticals[i];
    }
    for (int32_t i = 0; i < ns; i++) {
        if (slashes[i] >= 0 && slashes[i] < len) S[n_s++] = slashes[i];
    }
    n_v = mi_cpu_sort_unique(V, n_v);
    n_s = mi_cpu_sort_unique(S, n_s); /* ascending; walked from the back = largest d first */
    /* S[0 .. s_hi) holds the distances < end of the current row block; end only grows */
    int32_t s_hi = 0;
    for (int64_t m = 0; m < R; m++) {
        const int64_t start = m * MI_BS, end = start + MI_BS;
        int32_t *offs = block_offset + m * max_blocks;
        int32_t *cols = column_index + m * max_columns;
        int32_t bc = 0, cc = 0;
        if (start < len && end > first) {
            while (s_hi < n_s && S[s_hi] < end) s_hi++;
            int32_t si = s_hi - 1; /* next distance to merge, walking down */
            int32_t vi = 0;
            int64_t rs = 0, re = 0;
            if (si >= 0) {
                const int64_t e = mi_cpu_max64(end - S[si--], MI_BS);
                rs = e - MI_BS;
                re = e;
                for (;;) {
                    if (vi < n_v && V[vi] < re) {
                        if (V[vi] < rs && cc < max_columns) cols[cc++] = V[vi];
                        vi++;
                    } else if (si >= 8 && S[si - 8] >= end - re) {
                        /* distances whose band ends inside the range change nothing: a long run
                         * of them (a band of near diagonals) is skipped with a galloping search
                         * down S (ascending) for the last index below end - re, O(log run);
                         * short runs take the plain steps below, which are cheaper on a CPU */
                        const int64_t thr = end - re;
                        int32_t hi = si - 8, lo = hi - 1, step = 1; /* S[hi] >= thr */
                        while (lo >= 0 && S[lo] >= thr) {
                            hi = lo;
                            step <<= 1;
                            lo = hi - step;
                        }
                        if (lo < -1) lo = -1; /* now S[lo] < thr, or lo = -1 */
                        while (hi - lo > 1) {
                            const int32_t mid = lo + (hi - lo) / 2;
                            if (S[mid] >= thr)
                                hi = mid;
                            else
                                lo = mid;
                        }
                        si = lo;
                    } else if (si >= 0) {
                        const int64_t e2 = mi_cpu_max64(end - S[si--], MI_BS);
                        if (e2 > re + MI_BS) {
                            emit(rs, re, offs, &bc, max_blocks);
                            rs = e2 - MI_BS;
                            re = e2;
                        } else if (e2 > re) {
                            re += MI_BS;
                        }
                    } else {
                        emit(rs, re, offs, &bc, max_blocks);
                        break;
                    }
                }
            }
            /* verticals right of the last range that every row of the block still sees */
            for (; vi < n_v && V[vi] < start; vi++) {
                if (V[vi] >= re && cc < max_columns) cols[cc++] = V[vi];
            }
        }
        block_count[m] = bc;
        column_count[m] = cc;
    }
}

mi_status mi_cpu_vs_build_index(mi_context *ctx, int64_t L, const int32_t *seq_lens,
                                const mi_vs_index *vs, mi_sparse_index *index) {
    const int nt = ctx->n_threads > 0 ? ctx->n_threads : 1;
    const int64_t n_jobs = (int64_t)index->batch * index->heads;
    const int64_t R = index->row_blocks;
    const size_t scratch_n = (size_t)vs->max_vertical + (size_t)vs->max_slash + 1;
    int32_t *scratch = malloc((size_t)nt * scratch_n * sizeof(int32_t));
    if (!scratch) return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "vs index: out of memory");
    const int64_t R_used = mi_cpu_min64(R, (L + MI_BS - 1) / MI_BS);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t it = 0; it < n_jobs; it++) {
        const int64_t b = it / index->heads;
        const int64_t len = mi_seq_len(seq_lens, b, L);
        /* counts come from the caller: clamp them to the capacities */
        const int32_t nv =
            (int32_t)mi_cpu_max64(0, mi_cpu_min64(vs->vertical_count[it], vs->max_vertical));
        const int32_t ns =
            (int32_t)mi_cpu_max64(0, mi_cpu_min64(vs->slash_count[it], vs->max_slash));
        int32_t *bcnt = index->block_count + it * R, *ccnt = index->column_count + it * R;
        mi_cpu_vs_index_head(
            R_used * MI_BS < L ? R_used * MI_BS : L, len, 0,
            vs->vertical_idx + it * vs->max_vertical, nv, vs->slash_idx + it * vs->max_slash, ns,
            scratch + (size_t)omp_get_thread_num() * scratch_n, bcnt,
            index->block_offset + it * R * index->max_blocks, index->max_blocks, ccnt,
            index->column_index + it * R * index->max_columns, index->max_columns);
        for (int64_t m = R_used; m < R; m++) bcnt[m] = ccnt[m] = 0;
    }
    free(scratch);
    return MI_STATUS_SUCCESS;
}
