/*
 * test_cpu_offset.c: queries at an offset (mi_prefill_attention with q_len < k_len: q holds the
 * last q_len positions of the keys, a later chunk or turn over a cache).
 *  - one call with a pattern per head (dense, A-shape, Tri-shape, vertical-slash, block-sparse;
 *    GQA 2) at q_len in {1, 63, 64, 65, 200} and k_len up to 2048:
 *      dense, A-shape and Tri-shape rows against the float64 reference of the whole sequence under
 *      the same element mask (by absolute position; Tri-shape's dense rows are the sequence's);
 *      every head's rows bitwise equal to the same rows of the whole-sequence call wherever the
 *      pattern sees the same thing: dense / A / Tri always, vertical-slash when the chunk holds
 *      the estimate's 64 last queries, block-sparse in the row blocks wholly inside the chunk
 *      (row blocks are aligned to absolute positions; the chunk's first block, when partial, is
 *      pooled over its own rows only);
 *  - budgets covering everything (all columns and diagonals, every block) give dense at the
 *    offset (float64 reference);
 *  - q_len > k_len, and seq_lens with an offset, are refused.
 */
#include "test_qkvo.h"

enum { NP = 5 }; /* patterns, one per head pair */

static mi_head_pattern head_pattern(int t, int64_t K, bool cover_all) {
    static const mi_pattern_type types[NP] = {MI_PATTERN_DENSE, MI_PATTERN_A_SHAPE,
                                              MI_PATTERN_TRI_SHAPE, MI_PATTERN_VERTICAL_SLASH,
                                              MI_PATTERN_BLOCK_SPARSE};
    mi_head_pattern p = mi_head_pattern_default(types[t]);
    p.n_init = 48;
    p.n_local = 200;
    p.n_last = 100;
    p.vertical_size = cover_all ? (int32_t)K : 100;
    p.slash_size = cover_all ? (int32_t)K : 200;
    p.top_k = cover_all ? (int32_t)((K + 63) / 64) : 4;
    return p;
}

typedef struct offset_mask {
    int64_t K;
    bool cover_all;
} offset_mask;

static bool mask_offset(void *ctx, int64_t b, int64_t h, int64_t i, int64_t j) {
    const offset_mask *m = ctx;
    const mi_head_pattern p = head_pattern((int)(h % NP), m->K, m->cover_all);
    if (p.type != MI_PATTERN_A_SHAPE && p.type != MI_PATTERN_TRI_SHAPE) return true;
    ashape_mask a = {p.n_init, p.n_local, p.type == MI_PATTERN_TRI_SHAPE ? p.n_last : 0, NULL,
                     m->K};
    return mask_ashape(&a, b, h, i, j);
}

/* The view of rows [off, off + n) of t (same strides). */
static mi_tensor rows_view(const tbuf *t, int64_t off, int64_t n) {
    mi_tensor v = t->t;
    const size_t esz = v.dtype == MI_DTYPE_F32 ? 4 : 2;
    v.data = (char *)v.data + (size_t)(off * v.stride[2]) * esz;
    v.shape[2] = n;
    return v;
}

static void run_case(mi_context *ctx, mi_dtype dt, int64_t K, bool cover_all, rng *r) {
    const int64_t B = 1, Hq = 2 * NP, Hkv = NP, D = 64;
    qkvo t = qkvo_new(dt, false, B, Hq, Hkv, K, D, 1.5, r);
    mi_head_pattern pats[2 * NP];
    for (int64_t h = 0; h < Hq; h++) pats[h] = head_pattern((int)(h % NP), K, cover_all);
    mi_prefill_params pp = mi_prefill_default_params();
    pp.dense_below = 0; /* the sparse kernels at every length */
    /* the whole sequence: the reference of every row at the offset */
    CHECK_OK(
        mi_prefill_attention(ctx, &t.q.t, &t.k.t, &t.v.t, NULL, pats, &pp, &t.o.t, t.lse, NULL, 0));
    offset_mask om = {K, cover_all};
    ref_attention(&t.q, &t.k, &t.v, NULL, 1.0 / sqrt((double)D), mask_offset, &om, t.ref,
                  t.ref_lse);
    const tol tl = tol_for(dt);
    /* "the same rows": up to the rounding of a different key-tile split (a window starting at the
     * chunk's first row rather than at its row block's) and, for 16-bit outputs, one output ulp */
    const double same_atol = dt == MI_DTYPE_F32 ? 2e-6 : 1e-3;
    const double same_rtol = dt == MI_DTYPE_F32 ? 1e-5 : 0x1p-7;
    static const int64_t q_lens[] = {1, 63, 64, 65, 200};
    for (size_t c = 0; c < sizeof q_lens / sizeof q_lens[0]; c++) {
        const int64_t n = q_lens[c], off = K - n;
        if (n > K) continue;
        tbuf o = tb_new(dt, false, B, Hq, n, D);
        tb_poison(&o);
        float *lse = malloc((size_t)(B * Hq * n) * sizeof(float));
        const mi_tensor qv = rows_view(&t.q, off, n);
        CHECK_OK(
            mi_prefill_attention(ctx, &qv, &t.k.t, &t.v.t, NULL, pats, &pp, &o.t, lse, NULL, 0));
        int64_t bad_ref = 0, bad_same = 0, nonfinite = 0, bad_lse = 0;
        for (int64_t h = 0; h < Hq; h++) {
            const mi_pattern_type ty = pats[h].type;
            const bool exact_mask = cover_all || ty == MI_PATTERN_DENSE ||
                                    ty == MI_PATTERN_A_SHAPE || ty == MI_PATTERN_TRI_SHAPE;
            for (int64_t i = 0; i < n; i++) {
                const int64_t a = off + i; /* absolute position */
                bool same = exact_mask;
                if (ty == MI_PATTERN_VERTICAL_SLASH) same = n >= 64;
                if (ty == MI_PATTERN_BLOCK_SPARSE) same = a / 64 * 64 >= off;
                const size_t ri = (size_t)h * K + (size_t)a;
                const double rl = t.ref_lse[ri];
                if (exact_mask && rl == rl && fabs(lse[h * n + i] - rl) > LSE_ATOL) bad_lse++;
                if (same && fabs(lse[h * n + i] - t.lse[ri]) > 1e-5) bad_same++;
                for (int64_t d = 0; d < D; d++) {
                    const double x = tb_get(&o, 0, h, i, d), full = tb_get(&t.o, 0, h, a, d);
                    if (!isfinite(x)) nonfinite++;
                    if (same && fabs(x - full) > same_atol + same_rtol * fabs(full)) bad_same++;
                    const double ref = t.ref[ri * D + d];
                    if (exact_mask && ref == ref && fabs(x - ref) > tl.atol + tl.rtol * fabs(ref))
                        bad_ref++;
                }
            }
        }
        CHECK(bad_ref == 0 && bad_same == 0 && nonfinite == 0 && bad_lse == 0,
              "offset %s K %lld q_len %lld%s: %lld off the reference, %lld unlike the whole "
              "call, %lld non-finite, %lld LSE",
              mi_dtype_name(dt), (long long)K, (long long)n, cover_all ? " cover-all" : "",
              (long long)bad_ref, (long long)bad_same, (long long)nonfinite, (long long)bad_lse);
        free(lse);
        tb_free(&o);
    }
    qkvo_free(&t);
}

static void refusals(mi_context *ctx, rng *r) {
    qkvo t = qkvo_new(MI_DTYPE_F32, false, 1, 2, 1, 100, 32, 1.0, r);
    mi_head_pattern pats[2] = {mi_head_pattern_default(MI_PATTERN_DENSE),
                               mi_head_pattern_default(MI_PATTERN_DENSE)};
    /* k shorter than q */
    const mi_tensor kv = rows_view(&t.k, 10, 90), vv = rows_view(&t.v, 10, 90);
    CHECK(mi_prefill_attention(ctx, &t.q.t, &kv, &vv, NULL, pats, NULL, &t.o.t, NULL, NULL, 0) ==
              MI_STATUS_SHAPE_MISMATCH,
          "q_len > k_len must be refused");
    /* seq_lens with an offset */
    const mi_tensor qv = rows_view(&t.q, 20, 80);
    mi_tensor ov = rows_view(&t.o, 0, 80);
    const int32_t lens[1] = {100};
    CHECK(mi_prefill_attention(ctx, &qv, &t.k.t, &t.v.t, lens, pats, NULL, &ov, NULL, NULL, 0) ==
              MI_STATUS_UNSUPPORTED,
          "seq_lens with an offset must be refused");
    /* the single-kernel entry points keep q_len == k_len */
    CHECK(mi_attention_dense(ctx, &qv, &t.k.t, &t.v.t, NULL, 0.0f, &ov, NULL) ==
              MI_STATUS_SHAPE_MISMATCH,
          "mi_attention_dense keeps q_len == k_len");
    qkvo_free(&t);
}

int main(int argc, char **argv) {
    check_seed = test_seed(argc, argv, 4711);
    rng r = {check_seed};
    mi_context *ctx = test_context();
    static const int64_t lens[] = {200, 777, 2048};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        run_case(ctx, MI_DTYPE_F32, lens[i], false, &r);
        run_case(ctx, MI_DTYPE_F32, lens[i], true, &r);
    }
    run_case(ctx, MI_DTYPE_BF16, 1000, false, &r);
    run_case(ctx, MI_DTYPE_BF16, 1000, true, &r);
    refusals(ctx, &r);
    mi_context_destroy(ctx);
    return check_finish("test_cpu_offset");
}
