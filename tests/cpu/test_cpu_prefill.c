/*
 * test_cpu_prefill.c: a whole layer with a different pattern per head (mi_prefill_attention)
 * and the metrics of those patterns (mi_metrics_evaluate, mi_metrics_rel_l2).
 *  - every head against the float64 reference under its own element mask: dense, A-shape,
 *    Tri-shape, empty A-shape, vertical-slash (index from mi_vs_estimate + mi_vs_build_index),
 *    block-sparse (mi_block_sparse_estimate); batch 2 with different lengths, GQA 4;
 *  - the dense fallback below dense_below (explicit, and the library default, per head);
 *  - a caller workspace gives the same bytes as the internal one;
 *  - metrics: recall and density equal a float64 computation over the same masks.
 */
#include "minference_tools.h"
#include "test_qkvo.h"

typedef struct layer_mask {
    const mi_head_pattern *pat;
    const int32_t *lens;
    int64_t L;
    key_mask vs, bs;
} layer_mask;

static bool mask_layer(void *ctx, int64_t b, int64_t h, int64_t i, int64_t j) {
    const layer_mask *m = ctx;
    const mi_head_pattern *p = &m->pat[h];
    switch (p->type) {
    case MI_PATTERN_DENSE: return true;
    case MI_PATTERN_A_SHAPE:
    case MI_PATTERN_TRI_SHAPE: {
        ashape_mask a = {p->n_init, p->n_local, p->type == MI_PATTERN_TRI_SHAPE ? p->n_last : 0,
                         m->lens, m->L};
        return mask_ashape(&a, b, h, i, j);
    }
    case MI_PATTERN_VERTICAL_SLASH: return mask_keys((void *)&m->vs, b, h, i, j);
    case MI_PATTERN_BLOCK_SPARSE: return mask_keys((void *)&m->bs, b, h, i, j);
    default: break; /* the other patterns have tests of their own */
    }
    return false;
}

static mi_head_pattern pat(mi_pattern_type t, int32_t a, int32_t b, int32_t c) {
    mi_head_pattern p = mi_head_pattern_default(t);
    if (t == MI_PATTERN_VERTICAL_SLASH) p.vertical_size = a, p.slash_size = b;
    if (t == MI_PATTERN_A_SHAPE || t == MI_PATTERN_TRI_SHAPE) p.n_init = a, p.n_local = b;
    if (t == MI_PATTERN_TRI_SHAPE) p.n_last = c;
    if (t == MI_PATTERN_BLOCK_SPARSE) p.top_k = a;
    return p;
}

/* float64 recall and visited pairs of (b, h) under mask */
static void ref_metrics(const tbuf *q, const tbuf *k, int64_t b, int64_t h, int64_t len,
                        mask_fn mask, void *mctx, double *recall, double *visited) {
    const int64_t D = q->D, hk = h / (q->H / k->H);
    double *s = malloc((size_t)(len > 0 ? len : 1) * sizeof(double));
    double rec = 0.0, vis = 0.0;
    for (int64_t i = 0; i < len; i++) {
        const double *qi = q->ref + ((b * q->H + h) * q->L + i) * D;
        double mx = -INFINITY, sum = 0.0, kept = 0.0;
        for (int64_t j = 0; j <= i; j++) {
            const double *kj = k->ref + ((b * k->H + hk) * k->L + j) * D;
            double dot = 0.0;
            for (int64_t d = 0; d < D; d++) dot += qi[d] * kj[d];
            s[j] = dot / sqrt((double)D);
            mx = s[j] > mx ? s[j] : mx;
        }
        for (int64_t j = 0; j <= i; j++) {
            const double p = exp(s[j] - mx);
            sum += p;
            if (mask(mctx, b, h, i, j)) {
                kept += p;
                vis += 1.0;
            }
        }
        rec += kept / sum;
    }
    *recall = len > 0 ? rec / (double)len : 1.0;
    *visited = vis;
    free(s);
}

/* The default fallback decides per (b, h) by each head's pattern (dense_fallback_cpu.h): at 3200
 * and 2000 keys an A-shape head of 16 + 496 keys (crossover 3072, the floor) and a block-sparse
 * head of top 4 (3072) run sparse on the longer sequence only, a vertical-slash head (8192)
 * dense on both.
 * Each (b, h) of the default call must equal, bit for bit, a call that forces that choice. */
static void test_default_per_head(mi_context *ctx, rng *r) {
    const int64_t B = 2, Hq = 4, Hkv = 1, L = 3200, D = 32;
    const int32_t lens[2] = {3200, 2000};
    const mi_head_pattern dflt[4] = {
        pat(MI_PATTERN_A_SHAPE, 16, 496, 0), pat(MI_PATTERN_VERTICAL_SLASH, 1000, 6096, 0),
        pat(MI_PATTERN_BLOCK_SPARSE, 4, 0, 0), pat(MI_PATTERN_DENSE, 0, 0, 0)};
    mi_head_pattern longer[4], dense[4]; /* what sequence 0 and sequence 1 must run */
    for (int h = 0; h < 4; h++) {
        longer[h] = dflt[h].type == MI_PATTERN_VERTICAL_SLASH ? dflt[3] : dflt[h];
        dense[h] = dflt[3];
    }
    qkvo t = qkvo_new(MI_DTYPE_F32, false, B, Hq, Hkv, L, D, 2.0, r);
    tbuf o_long = tb_new(MI_DTYPE_F32, false, B, Hq, L, D);
    tbuf o_dense = tb_new(MI_DTYPE_F32, false, B, Hq, L, D);
    mi_prefill_params forced = mi_prefill_default_params();
    forced.dense_below = 0;
    CHECK_OK(
        mi_prefill_attention(ctx, &t.q.t, &t.k.t, &t.v.t, lens, dflt, NULL, &t.o.t, NULL, NULL, 0));
    CHECK_OK(mi_prefill_attention(ctx, &t.q.t, &t.k.t, &t.v.t, lens, longer, &forced, &o_long.t,
                                  NULL, NULL, 0));
    CHECK_OK(mi_prefill_attention(ctx, &t.q.t, &t.k.t, &t.v.t, lens, dense, &forced, &o_dense.t,
                                  NULL, NULL, 0));
    for (int64_t b = 0; b < B; b++) {
        const tbuf *want = b == 0 ? &o_long : &o_dense;
        for (int64_t h = 0; h < Hq; h++) {
            const size_t at = tb_index(&t.o, b, h, 0);
            const size_t n = (size_t)lens[b] * (size_t)D * sizeof(float);
            CHECK(memcmp((float *)t.o.data + at, (float *)want->data + at, n) == 0,
                  "default fallback: sequence %lld, head %lld (%s) ran the wrong way", (long long)b,
                  (long long)h, mi_pattern_name(dflt[h].type));
        }
    }
    /* not vacuous: on the longer sequence the A-shape and block-sparse heads differ from dense */
    for (int64_t h = 0; h < Hq; h += 2) {
        const size_t at = tb_index(&t.o, 0, h, 0);
        CHECK(memcmp((float *)o_long.data + at, (float *)o_dense.data + at,
                     (size_t)L * (size_t)D * sizeof(float)) != 0,
              "head %lld: the sparse pattern gave the dense output", (long long)h);
    }
    tb_free(&o_long);
    tb_free(&o_dense);
    qkvo_free(&t);
}

int main(int argc, char **argv) {
    check_seed = test_seed(argc, argv, 99);
    rng r = {check_seed};
    mi_context *ctx = test_context();
    const int64_t B = 2, Hq = 8, Hkv = 2, L = 720, D = 64;
    const int32_t lens[2] = {720, 450};
    const mi_head_pattern pats[8] = {
        pat(MI_PATTERN_DENSE, 0, 0, 0),        pat(MI_PATTERN_A_SHAPE, 4, 100, 0),
        pat(MI_PATTERN_TRI_SHAPE, 4, 100, 50), pat(MI_PATTERN_VERTICAL_SLASH, 40, 60, 0),
        pat(MI_PATTERN_BLOCK_SPARSE, 3, 0, 0), pat(MI_PATTERN_VERTICAL_SLASH, 5000, 5000, 0),
        pat(MI_PATTERN_A_SHAPE, 0, 0, 0),      pat(MI_PATTERN_BLOCK_SPARSE, 0, 0, 0),
    };
    for (int dti = 0; dti < 2; dti++) {
        const mi_dtype dt = dti == 0 ? MI_DTYPE_F32 : MI_DTYPE_BF16;
        const bool blhd = dti == 1;
        qkvo t = qkvo_new(dt, blhd, B, Hq, Hkv, L, D, 2.0, &r);
        qkvo_nan_padding(&t, lens);
        tbuf o2 = tb_new(dt, blhd, B, Hq, L, D);
        mi_prefill_params pp = mi_prefill_default_params();
        pp.dense_below = 0;

        /* the expected per-head key sets, from the public estimators */
        int32_t vsz[8], ssz[8], tk[8];
        for (int h = 0; h < 8; h++) {
            vsz[h] = pats[h].type == MI_PATTERN_VERTICAL_SLASH ? pats[h].vertical_size : 0;
            ssz[h] = pats[h].type == MI_PATTERN_VERTICAL_SLASH ? pats[h].slash_size : 0;
            tk[h] = pats[h].type == MI_PATTERN_BLOCK_SPARSE ? pats[h].top_k : 0;
        }
        const int32_t R = (int32_t)((L + 63) / 64);
        vs_buf vb = vs_new((int32_t)B, (int32_t)Hq, (int32_t)L, (int32_t)L);
        sparse_buf vsx = sparse_new((int32_t)B, (int32_t)Hq, R, (int32_t)L + 1, (int32_t)L);
        sparse_buf bsx = sparse_new((int32_t)B, (int32_t)Hq, R, R, 0);
        CHECK_OK(mi_vs_estimate(ctx, &t.q.t, &t.k.t, lens, vsz, ssz, &pp.vs, 0.0f, &vb.x));
        CHECK_OK(mi_vs_build_index(ctx, L, lens, &vb.x, &vsx.x));
        CHECK_OK(mi_block_sparse_estimate(ctx, &t.q.t, &t.k.t, lens, tk, &bsx.x));
        layer_mask lm = {pats, lens, L, key_mask_from_index(&vsx.x, L),
                         key_mask_from_index(&bsx.x, L)};

        float *lse2 = malloc(t.n_rows * sizeof(float));
        CHECK_OK(mi_prefill_attention(ctx, &t.q.t, &t.k.t, &t.v.t, lens, pats, &pp, &t.o.t, t.lse,
                                      NULL, 0));
        qkvo_check("prefill mixed patterns", &t, lens, 1.0 / 8.0, mask_layer, &lm);

        /* caller workspace: identical bytes */
        size_t need = 0;
        CHECK_OK(mi_prefill_workspace_size(ctx, &t.q.t, &t.k.t, pats, &pp, &need));
        void *ws = malloc(need + 3);
        tb_poison(&o2);
        CHECK_OK(mi_prefill_attention(ctx, &t.q.t, &t.k.t, &t.v.t, lens, pats, &pp, &o2.t, lse2,
                                      (char *)ws + 3, need));
        const size_t bytes = t.n_rows * (size_t)D * mi_dtype_size(dt);
        CHECK(memcmp(t.o.data, o2.data, bytes) == 0,
              "prefill: caller workspace changes the output");
        CHECK(memcmp(t.lse, lse2, t.n_rows * sizeof(float)) == 0, "prefill: workspace changes LSE");
        free(ws);

        /* metrics over the same patterns */
        mi_head_metrics met[16];
        CHECK_OK(mi_metrics_evaluate(ctx, &t.q.t, &t.k.t, lens, pats, &pp, met));
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < Hq; h++) {
                double rec = 0.0, vis = 0.0;
                ref_metrics(&t.q, &t.k, b, h, lens[b], mask_layer, &lm, &rec, &vis);
                const mi_head_metrics *m = &met[b * Hq + h];
                const double causal = (double)lens[b] * (lens[b] + 1) / 2.0;
                CHECK(fabs(m->recall - rec) < 1e-4, "metrics b%lld h%lld: recall %.6f vs %.6f",
                      (long long)b, (long long)h, m->recall, rec);
                CHECK(fabs(m->density - vis / causal) < 1e-12,
                      "metrics b%lld h%lld: density %.6f vs %.6f", (long long)b, (long long)h,
                      m->density, vis / causal);
                CHECK(m->flops == 4.0 * D * vis && m->dense_flops == 4.0 * D * causal,
                      "metrics b%lld h%lld: flops", (long long)b, (long long)h);
            }
        CHECK(met[0].recall > 0.999999 && met[0].density == 1.0, "dense head: recall %.9f",
              met[0].recall);

        /* rel_l2 of the kernel output against itself and against the float64 reference */
        double rel = -1.0;
        CHECK_OK(mi_metrics_rel_l2(ctx, &t.o.t, &o2.t, lens, &rel));
        CHECK(rel == 0.0, "rel_l2 of identical tensors = %g", rel);

        /* dense fallback: every sequence shorter than dense_below runs dense */
        pp.dense_below = 2000;
        tb_poison(&o2);
        CHECK_OK(mi_prefill_attention(ctx, &t.q.t, &t.k.t, &t.v.t, lens, pats, &pp, &o2.t, lse2,
                                      NULL, 0));
        ref_attention(&t.q, &t.k, &t.v, lens, 1.0 / 8.0, mask_all, NULL, t.ref, t.ref_lse);
        compare_out("prefill dense fallback", &o2, t.ref, lens);
        compare_lse("prefill dense fallback", lse2, t.ref_lse, (int64_t)t.n_rows);
        /* the default crossover is above these lengths, so defaults run dense too */
        tb_poison(&o2);
        CHECK_OK(mi_prefill_attention(ctx, &t.q.t, &t.k.t, &t.v.t, lens, pats, NULL, &o2.t, NULL,
                                      NULL, 0));
        compare_out("prefill default fallback", &o2, t.ref, lens);
        /* fallback only for the short sequence: batch 1 (450) dense, batch 0 (720) sparse */
        pp.dense_below = 600;
        tb_poison(&o2);
        CHECK_OK(mi_prefill_attention(ctx, &t.q.t, &t.k.t, &t.v.t, lens, pats, &pp, &o2.t, NULL,
                                      NULL, 0));
        const size_t half = bytes / 2;
        CHECK(memcmp(t.o.data, o2.data, blhd ? 0 : half) == 0, "fallback changed batch 0");
        double *ref1 = malloc(t.n_rows * (size_t)D * sizeof(double));
        memcpy(ref1, t.ref, t.n_rows * (size_t)D * sizeof(double)); /* dense reference */
        ref_attention(&t.q, &t.k, &t.v, lens, 1.0 / 8.0, mask_layer, &lm, t.ref, t.ref_lse);
        memcpy(t.ref + t.n_rows * (size_t)D / 2, ref1 + t.n_rows * (size_t)D / 2,
               t.n_rows * (size_t)D / 2 * sizeof(double));
        compare_out("prefill partial fallback", &o2, t.ref, lens);
        free(ref1);

        free(lm.vs.keys);
        free(lm.bs.keys);
        free(vb.mem);
        free(vsx.mem);
        free(bsx.mem);
        free(lse2);
        tb_free(&o2);
        qkvo_free(&t);
    }
    test_default_per_head(ctx, &r);
    mi_context_destroy(ctx);
    return check_finish("test_cpu_prefill");
}
