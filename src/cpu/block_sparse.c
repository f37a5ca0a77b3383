/*
 * block_sparse.c: block-sparse estimation (docs/algorithms.md §4, with the fixes below).
 *
 * q [B, H_q, L, D], k [B, H_kv, L, D]; writes per (b, h): block_count [R], block_offset
 * [R, max_blocks] = 64 * selected key block, ascending, column_count [R] = 0.
 *
 * qp[m] / kp[n] = mean of the rows of 64-row block m / n over the block's real rows (a partial
 * last block is averaged over its len % 64 rows, not diluted by padding), rounded to the input
 * dtype (as the original, whose pooled means are bf16 or fp16 tensors). Block scores
 * qp[m] . kp[n] for n <= m (no scale: it does not change the ranking), computed 64 x 64 blocks at
 * a time with the attention micro-kernel. For 16-bit inputs the scores rank at bf16 precision:
 * each is cut to its upper 16 bits (bf16_score_rank), and blocks whose cut scores are equal rank
 * by position, lower block first (the original ranks the bf16 or fp16 product of its pooled
 * tensors, ties in no set order). The CUDA estimate keeps 16 bits a score in memory on this
 * account (docs/architecture.md). Row block m keeps its diagonal block m and block 0
 * always (the original forces neither and gives NaN rows when L < 64), plus the best other blocks
 * up to min(top_k, m + 1) in total. top_k <= 0 keeps only the forced blocks. With
 * max_blocks < 2 only the diagonal block is kept, so no row is ever left without its own block.
 */
#include "cpu_common.h"

#include <float.h>
#include <math.h>
#include <omp.h>

size_t mi_cpu_bs_ws_floats(int64_t len, int64_t D) {
    const size_t nb = (size_t)((len + MI_BS - 1) / MI_BS) + 1;
    return 2 * nb * (size_t)D + (size_t)MI_BS * nb + (size_t)MI_BS * MI_BS + (size_t)D + 2 * nb;
}

/* Mean of the rows of each 64-row block of (b, h) over its real rows: p [nb][D]. t holds the
 * positions from off on (queries at an offset): blocks before off / 64 are left alone, and the
 * block holding off is pooled over its rows >= off. */
static void pool(const mi_tensor *t, int64_t off, int64_t b, int64_t h, int64_t len, int64_t D,
                 float *p, float *row) {
    const int64_t nb = (len + MI_BS - 1) / MI_BS;
    for (int64_t m = off / MI_BS; m < nb; m++) {
        float *pm = p + m * D;
        const int64_t r0 = mi_cpu_max64(m * MI_BS, off), r1 = mi_cpu_min64(m * MI_BS + MI_BS, len);
        for (int64_t d = 0; d < D; d++) pm[d] = 0.0f;
        for (int64_t r = r0; r < r1; r++) {
            mi_cpu_load_f32(row, mi_cpu_row(t, b, h, r - off), t->dtype, D, 1.0f);
            for (int64_t d = 0; d < D; d++) pm[d] += row[d];
        }
        const float inv = 1.0f / (float)(r1 - r0);
        for (int64_t d = 0; d < D; d++) pm[d] *= inv;
        /* rounded to the input dtype, as the original's pooling and the CUDA estimate do */
        mi_cpu_store(row, t->dtype, pm, D);
        mi_cpu_load_f32(pm, row, t->dtype, D, 1.0f);
    }
}

/* A score as a 16-bit input's estimate ranks it: its upper 16 bits (bf16 precision, toward zero),
 * NaN left as it is (the ranking puts it last). NaN is told from the bits: with `x != x` first,
 * gcc 12 -O2 compiled the loop below to leave some scores uncut. */
static float bf16_score_rank(float x) {
    const uint32_t u = mi_cpu_f32_bits(x);
    return (u & 0x7fffffffu) > 0x7f800000u ? x : mi_cpu_bits_f32(u & 0xffff0000u);
}

void mi_cpu_bs_estimate_head(mi_tile *t, const mi_attn_shape *s, const mi_tensor *q,
                             const mi_tensor *k, int64_t b, int64_t h, int64_t len,
                             int64_t row_blocks, int32_t top_k, float *ws, int32_t *block_count,
                             int32_t *block_offset, int64_t max_blocks, int32_t *column_count) {
    const int64_t D = s->head_dim;
    const int64_t nb = (len + MI_BS - 1) / MI_BS;
    for (int64_t m = 0; m < row_blocks; m++) block_count[m] = column_count[m] = 0;
    if (nb <= 0 || max_blocks <= 0) return;
    float *qp = ws, *kp = qp + nb * D, *rows = kp + nb * D, *sc = rows + MI_BS * nb;
    float *row = sc + MI_BS * MI_BS;
    int32_t *tmp = (int32_t *)(row + D), *sel = tmp + nb;
    const bool cut = q->dtype != MI_DTYPE_F32;
    pool(q, s->q_off, b, h, len, D, qp, row);
    pool(k, 0, b, h / s->group, len, D, kp, row);
    /* queries at an offset: only the row blocks that hold queries, aligned to absolute positions */
    for (int64_t m0 = s->q_off / MI_BS; m0 < nb; m0 += MI_BS) {
        const int64_t nq = mi_cpu_min64(MI_BS, nb - m0);
        /* rows[i * nb + n] = score of query block m0 + i against key block n, n <= m0 + i */
        for (int64_t n0 = 0; n0 < m0 + nq; n0 += MI_BS) {
            const int64_t nk = mi_cpu_min64(MI_BS, m0 + nq - n0);
            mi_cpu_block_scores(t, D, qp + m0 * D, nq, kp + n0 * D, nk, sc);
            for (int64_t j = 0; j < nk; j++) {
                for (int64_t i = 0; i < nq; i++) rows[i * nb + n0 + j] = sc[j * MI_BS + i];
            }
        }
        for (int64_t i = 0; i < nq; i++) {
            const int64_t m = m0 + i;
            if (m >= row_blocks) break;
            float *val = rows + i * nb;
            if (cut)
                for (int64_t n = 0; n < m; n++) val[n] = bf16_score_rank(val[n]);
            int64_t want = mi_cpu_min64(mi_cpu_max64(top_k, 0), m + 1);
            want = mi_cpu_max64(want, m > 0 ? 2 : 1);
            want = mi_cpu_min64(want, max_blocks);
            /* forced blocks outrank every score; the diagonal first */
            val[m] = INFINITY;
            if (m > 0) val[0] = FLT_MAX;
            mi_cpu_topk(val, (int32_t)(m + 1), (int32_t)want, tmp, sel);
            int32_t *offs = block_offset + m * max_blocks;
            for (int64_t j = 0; j < want; j++) offs[j] = sel[j] * MI_BS;
            block_count[m] = (int32_t)want;
        }
    }
}

mi_status mi_cpu_block_sparse_estimate(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                                       const mi_tensor *k, const int32_t *seq_lens,
                                       const int32_t *top_k, mi_sparse_index *index) {
    const int nt = ctx->n_threads > 0 ? ctx->n_threads : 1;
    const int64_t n_jobs = s->batch * s->heads_q;
    const int64_t R = index->row_blocks;
    const size_t ws_floats = mi_cpu_bs_ws_floats(s->len, s->head_dim);
    mi_tile *tiles[nt];
    float *ws[nt];
    const int ok = mi_cpu_scratch_alloc(ctx, nt, s->head_dim, ws_floats, tiles, ws);
    if (ok) {
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
        for (int64_t it = 0; it < n_jobs; it++) {
            const int tid = omp_get_thread_num();
            const int64_t b = it / s->heads_q, h = it % s->heads_q;
            mi_cpu_bs_estimate_head(tiles[tid], s, q, k, b, h, mi_seq_len(seq_lens, b, s->len), R,
                                    top_k[h], ws[tid], index->block_count + it * R,
                                    index->block_offset + it * R * index->max_blocks,
                                    index->max_blocks, index->column_count + it * R);
        }
    }
    mi_cpu_scratch_free(nt, tiles, ws);
    return ok ? MI_STATUS_SUCCESS
              : mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "block-sparse estimation: out of memory");
}
