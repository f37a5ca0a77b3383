/*
 * test_cpu_block_sparse.c: block-sparse estimation (mi_block_sparse_estimate) and attention on
 * its index.
 *  - structure: min(max(top_k, forced), m + 1) blocks per row block (forced: block 0 and the
 *    diagonal, so top_k = 0 keeps just those), ascending multiples of 64, column_count 0, no
 *    blocks for row blocks after the sequence;
 *  - the selection is a true top-k of a float64 re-computation of the pooled scores, with the
 *    partial last block pooled over its real rows only and the means rounded to the input
 *    dtype (as the original's pooled tensors); for 16-bit inputs, of those scores cut to bf16
 *    precision (a pick and a block left out may share their cut score);
 *  - a planted key block is found by every later row block;
 *  - attention on the index equals the float64 reference under the expanded mask; top_k >= R
 *    is dense;
 *  - for 16-bit inputs, two blocks whose scores are equal once cut to bf16 precision rank by
 *    position, lower block first, even where the uncut scores say otherwise (run_cut_ties).
 */
#include "test_qkvo.h"

/* float64 pooled means of (b, h) over the real rows of each 64-row block, rounded to the input
 * dtype: p [nb][D] */
static void ref_pool(const tbuf *t, int64_t b, int64_t h, int64_t len, double *p) {
    const int64_t D = t->D, nb = (len + 63) / 64;
    for (int64_t m = 0; m < nb; m++) {
        const int64_t r0 = 64 * m, r1 = r0 + 64 < len ? r0 + 64 : len;
        for (int64_t d = 0; d < D; d++) {
            double s = 0.0;
            for (int64_t r = r0; r < r1; r++) s += t->ref[((b * t->H + h) * t->L + r) * D + d];
            uint16_t bits;
            float f;
            p[m * D + d] = stored_value(t->t.dtype, s / (double)(r1 - r0), &bits, &f);
        }
    }
}

/* a score cut to its upper 16 bits as a float (the estimate's rank for 16-bit inputs) */
static double bf16_cut(double x) {
    const float f = (float)x;
    uint32_t u;
    memcpy(&u, &f, 4);
    u &= 0xffff0000u;
    float g;
    memcpy(&g, &u, 4);
    return g;
}

static void run_case(mi_context *ctx, mi_dtype dt, bool blhd, int64_t B, int64_t Hq, int64_t Hkv,
                     int64_t L, int64_t D, const int32_t *lens, const int32_t *top_k,
                     int plant_block, rng *r) {
    char name[160];
    snprintf(name, sizeof name, "block-sparse %s %s L%lld B%lld Hq%lld Hkv%lld D%lld%s",
             mi_dtype_name(dt), blhd ? "blhd" : "bhld", (long long)L, (long long)B, (long long)Hq,
             (long long)Hkv, (long long)D, lens ? " varlen" : "");
    qkvo t = qkvo_new(dt, blhd, B, Hq, Hkv, L, D, 1.0, r);
    if (plant_block >= 0) {
        /* every q row and the keys of one block share a strong direction */
        for (int64_t b = 0; b < B; b++) {
            for (int64_t h = 0; h < Hq; h++)
                for (int64_t i = 0; i < L; i++)
                    tb_set(&t.q, b, h, i, 0, 4.0 + 0.1 * tb_get(&t.q, b, h, i, 0));
            for (int64_t h = 0; h < Hkv; h++)
                for (int64_t j = 64 * plant_block; j < 64 * plant_block + 64 && j < L; j++)
                    tb_set(&t.k, b, h, j, 0, 4.0);
        }
    }
    qkvo_nan_padding(&t, lens);
    const int32_t R = (int32_t)((L + 63) / 64);
    int32_t maxb = 2;
    for (int64_t h = 0; h < Hq; h++) maxb = top_k[h] > maxb ? top_k[h] : maxb;
    maxb = maxb < R ? maxb : R;
    sparse_buf sb = sparse_new((int32_t)B, (int32_t)Hq, R, maxb, 0);
    memset(sb.x.block_count, 0xff, (size_t)(B * Hq * R) * 4);
    memset(sb.x.column_count, 0xff, (size_t)(B * Hq * R) * 4);
    CHECK_OK(mi_block_sparse_estimate(ctx, &t.q.t, &t.k.t, lens, top_k, &sb.x));
    double *qp = malloc((size_t)(R * D) * sizeof(double)), *kp = malloc((size_t)(R * D) * 8);
    double *sc = malloc((size_t)R * sizeof(double));
    for (int64_t b = 0; b < B; b++) {
        const int64_t len = lens ? lens[b] : L, nb = (len + 63) / 64;
        for (int64_t h = 0; h < Hq; h++) {
            const int64_t bh = b * Hq + h;
            ref_pool(&t.q, b, h, len, qp);
            ref_pool(&t.k, b, h / (Hq / Hkv), len, kp);
            for (int64_t m = 0; m < R; m++) {
                const int32_t bc = sb.x.block_count[bh * R + m];
                const int32_t *offs = sb.x.block_offset + (bh * R + m) * maxb;
                CHECK(sb.x.column_count[bh * R + m] == 0, "%s: column_count != 0", name);
                if (m >= nb) {
                    CHECK(bc == 0, "%s: blocks after the sequence", name);
                    continue;
                }
                int64_t want = top_k[h] < m + 1 ? top_k[h] : m + 1;
                const int64_t forced = m > 0 ? 2 : 1;
                want = want > forced ? want : forced;
                CHECK(bc == want, "%s: row block %lld has %d blocks, want %lld (top_k %d)", name,
                      (long long)m, bc, (long long)want, top_k[h]);
                if (bc != want) continue;
                bool has0 = false, hasm = false;
                for (int32_t i = 0; i < bc; i++) {
                    CHECK(offs[i] % 64 == 0 && offs[i] >= 0 && offs[i] <= 64 * m,
                          "%s: bad offset %d", name, offs[i]);
                    if (i > 0) CHECK(offs[i] > offs[i - 1], "%s: offsets not ascending", name);
                    has0 |= offs[i] == 0;
                    hasm |= offs[i] == 64 * m;
                }
                CHECK(has0 && hasm, "%s: forced blocks missing in row block %lld", name,
                      (long long)m);
                /* the free picks are a top-k of the float64 scores of the other blocks */
                double lo = INFINITY, hi = -INFINITY;
                unsigned char in[4096] = {0};
                for (int64_t n = 0; n <= m; n++) {
                    double s = 0.0;
                    for (int64_t d = 0; d < D; d++) s += qp[m * D + d] * kp[n * D + d];
                    sc[n] = s;
                }
                for (int32_t i = 0; i < bc; i++) {
                    const int64_t n = offs[i] / 64;
                    in[n] = 1;
                    if (n != 0 && n != m && sc[n] < lo) lo = sc[n];
                }
                for (int64_t n = 1; n < m; n++)
                    if (!in[n] && sc[n] > hi) hi = sc[n];
                /* 16-bit inputs rank the scores cut to bf16 precision, equal ones by position */
                const bool cut = dt != MI_DTYPE_F32 && bf16_cut(hi) <= bf16_cut(lo);
                CHECK(cut || hi <= lo + 1e-3 * (1.0 + fabs(lo)),
                      "%s: row block %lld not a top-k "
                      "(%g > %g)",
                      name, (long long)m, hi, lo);
                if (plant_block > 0 && m > plant_block && top_k[h] >= 3)
                    CHECK(in[plant_block], "%s: planted block %d not found in row block %lld", name,
                          plant_block, (long long)m);
            }
        }
    }
    CHECK_OK(mi_attention_sparse(ctx, &t.q.t, &t.k.t, &t.v.t, lens, &sb.x, 0.0f, &t.o.t, t.lse));
    key_mask km = key_mask_from_index(&sb.x, L);
    qkvo_check(name, &t, lens, 0.0, mask_keys, &km);
    bool all_dense = true;
    for (int64_t h = 0; h < Hq; h++) all_dense &= top_k[h] >= R;
    if (all_dense) {
        ref_attention(&t.q, &t.k, &t.v, lens, 1.0 / sqrt((double)D), mask_all, NULL, t.ref,
                      t.ref_lse);
        compare_out("block-sparse top_k >= R = dense", &t.o, t.ref, lens);
    }
    free(km.keys);
    free(qp);
    free(kp);
    free(sc);
    free(sb.mem);
    qkvo_free(&t);
}

/* The bf16-precision rank of 16-bit inputs, decided: q = (1, 1, 0 ..), and key blocks whose
 * pooled scores k0 + k1 differ below bf16 precision. Block 5 scores 0.96975 (0.96875 cut), blocks
 * 7 and 9 0.96313 and 0.96460 (both 0.9609375 cut), every other block 0.1. Row block 10 keeps
 * blocks 0 and 10 (forced) and 5 with top 3; with top 4 also 7, the lower of the two that tie once
 * cut, where the fp32 rank would keep 9. */
static void run_cut_ties(mi_context *ctx, mi_dtype dt) {
    const int64_t L = 11 * 64, D = 64, R = 11;
    tbuf q = tb_new(dt, false, 1, 1, L, D), k = tb_new(dt, false, 1, 1, L, D);
    for (int64_t l = 0; l < L; l++) {
        tb_set(&q, 0, 0, l, 0, 1.0);
        tb_set(&q, 0, 0, l, 1, 1.0);
        const int64_t n = l / 64;
        const double k0 = n == 7 || n == 9 ? 0.9609375 : n == 5 ? 0.96875 : 0.1;
        const double k1 = n == 7 ? 0.002197265625 : n == 9 ? 0.003662109375 : n == 5 ? 0.001 : 0.0;
        tb_set(&k, 0, 0, l, 0, k0);
        tb_set(&k, 0, 0, l, 1, k1);
    }
    for (int32_t top = 3; top <= 4; top++) {
        const size_t bytes = mi_sparse_index_bytes(1, 1, (int32_t)R, 4, 1);
        void *buf = calloc(1, bytes);
        mi_sparse_index si;
        CHECK_OK(mi_sparse_index_init(&si, 1, 1, (int32_t)R, 4, 1, buf, bytes));
        CHECK_OK(mi_block_sparse_estimate(ctx, &q.t, &k.t, NULL, &top, &si));
        const int32_t want3[3] = {0, 5, 10}, want4[4] = {0, 5, 7, 10};
        const int32_t *want = top == 3 ? want3 : want4;
        CHECK(si.block_count[10] == top, "%s top %d: row 10 keeps %d blocks", mi_dtype_name(dt),
              top, si.block_count[10]);
        for (int32_t j = 0; j < top && j < si.block_count[10]; j++)
            CHECK(si.block_offset[10 * 4 + j] == 64 * want[j],
                  "%s top %d: pick %d is block %d, not %d", mi_dtype_name(dt), top, j,
                  si.block_offset[10 * 4 + j] / 64, want[j]);
        free(buf);
    }
    tb_free(&q);
    tb_free(&k);
}

int main(int argc, char **argv) {
    check_seed = test_seed(argc, argv, 2024);
    rng r = {check_seed};
    mi_context *ctx = test_context();
    const int32_t tk4[4] = {0, 1, 3, 100};
    const int32_t tk8[8] = {0, 2, 3, 4, 5, 6, 7, 100};
    const int32_t tk2[2] = {3, 5};
    const int32_t full[4] = {100, 100, 100, 100};
    run_case(ctx, MI_DTYPE_F32, false, 1, 4, 1, 1, 64, NULL, tk4, -1, &r);
    run_case(ctx, MI_DTYPE_F16, true, 1, 4, 4, 63, 128, NULL, tk4, -1, &r);
    run_case(ctx, MI_DTYPE_BF16, false, 1, 4, 1, 64, 64, NULL, tk4, -1, &r);
    run_case(ctx, MI_DTYPE_F32, true, 1, 8, 1, 65, 128, NULL, tk8, -1, &r);
    run_case(ctx, MI_DTYPE_F32, false, 1, 8, 2, 1000, 64, NULL, tk8, -1, &r);
    run_case(ctx, MI_DTYPE_F16, false, 1, 4, 1, 1000, 128, NULL, tk4, 5, &r);
    const int32_t lens[2] = {700, 100};
    run_case(ctx, MI_DTYPE_BF16, true, 2, 2, 1, 700, 64, lens, tk2, 3, &r);
    const int32_t lens0[2] = {0, 130};
    run_case(ctx, MI_DTYPE_F32, false, 2, 4, 2, 130, 64, lens0, tk4, -1, &r);
    run_case(ctx, MI_DTYPE_F32, false, 1, 4, 1, 300, 64, NULL, full, -1, &r);
    const int32_t tk1[1] = {20};
    run_case(ctx, MI_DTYPE_F32, false, 1, 1, 1, 4099, 128, NULL, tk1, 17, &r);
    run_cut_ties(ctx, MI_DTYPE_BF16);
    run_cut_ties(ctx, MI_DTYPE_F16);
    mi_context_destroy(ctx);
    return check_finish("test_cpu_block_sparse");
}
