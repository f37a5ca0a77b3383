/*
 * test_cpu_infllm.c: InfLLM on the CPU against a float64 re-computation of its definition
 * (docs/prefill-methods.md), written here from the definition and not from the kernel:
 *  - the memory of each chunk (sinks, blocks, tail), each block's representative (the mean of
 *    its repr_topk keys of highest window attention), and the blocks each chunk retrieves (the
 *    top_k by the summed score of the heads sharing the selection, or each head alone): the
 *    kernel's choice must be the reference's top_k, up to scores within rounding of each other;
 *  - the attention under the chosen blocks equals the float64 reference (fp32 and bf16, GQA,
 *    varlen, heads sharing a selection, a head of its own, a head with other fields, queries at
 *    an offset);
 *  - the recall mi_metrics_evaluate reports is the float64 recall under the same keys;
 *  - top_k covering every block, or a window covering the sequence, is dense attention;
 *  - names, spec strings and invalid fields.
 */
#include "cpu_common.h"
#include "pattern_table.h"
#include "test_qkvo.h"

#include <math.h>

static mi_head_pattern infllm(int32_t top_k, int32_t n_local, int32_t n_init, int32_t block,
                              int32_t repr, int32_t chunk, int32_t per_head) {
    mi_head_pattern p = mi_head_pattern_default(MI_PATTERN_INFLLM);
    p.top_k = top_k, p.n_local = n_local, p.n_init = n_init, p.block_size = block;
    p.repr_topk = repr, p.chunk_size = chunk, p.per_head = per_head;
    return p;
}

static bool same_fields(const mi_head_pattern *a, const mi_head_pattern *b) {
    return !a->per_head && !b->per_head && a->top_k == b->top_k && a->n_local == b->n_local &&
           a->n_init == b->n_init && a->block_size == b->block_size &&
           a->repr_topk == b->repr_topk && a->chunk_size == b->chunk_size;
}

static mi_attn_shape shape_of(const qkvo *t, int64_t q_off) {
    mi_attn_shape s;
    memset(&s, 0, sizeof s);
    s.batch = t->q.B;
    s.heads_q = t->q.H;
    s.heads_kv = t->k.H;
    s.len = t->k.L;
    s.head_dim = t->q.D;
    s.group = s.heads_q / s.heads_kv;
    s.dtype = t->q.t.dtype;
    s.device = MI_DEVICE_CPU;
    s.q_off = q_off;
    return s;
}

/* The stored (rounded) inputs, float64; rows at absolute positions. */
static double qv(const qkvo *t, int64_t b, int64_t h, int64_t i, int64_t d) {
    return t->q.ref[((b * t->q.H + h) * t->q.L + i) * t->q.D + d];
}
static const double *krow(const qkvo *t, int64_t b, int64_t hk, int64_t j) {
    return t->k.ref + ((b * t->k.H + hk) * t->k.L + j) * t->k.D;
}
static const double *vrow(const qkvo *t, int64_t b, int64_t hk, int64_t j) {
    return t->v.ref + ((b * t->v.H + hk) * t->v.L + j) * t->v.D;
}

/* The memory at chunk start st, from the definition: the keys every row of the chunk sees
 * beyond its window are the first st - n_local; of those the first n_init are sinks, and
 * whole blocks follow once the sinks are complete. */
static void memory_at(const mi_head_pattern *p, int64_t st, int64_t *init, int64_t *nb,
                      int64_t *rst) {
    int64_t gone = st - p->n_local;
    if (gone < 0) gone = 0;
    *init = gone < p->n_init ? gone : p->n_init;
    *nb = *init == p->n_init && gone > p->n_init ? (gone - p->n_init) / p->block_size : 0;
    *rst = *init + *nb * p->block_size;
}

/* The run of the kernel with its selection recorded; heads planned as the prefill plans them. */
typedef struct run {
    mi_cpu_infllm_trace tr;
    float *o;
} run;

static run traced_run(mi_context *ctx, const qkvo *t, const int32_t *lens,
                      const mi_head_pattern *pats, int64_t q_off, const mi_tensor *q) {
    mi_attn_shape s = shape_of(t, q_off);
    mi_prefill_params pp = mi_prefill_default_params();
    pp.dense_below = 0;
    mi_head_plan heads[16];
    mi_prefill_plan plan;
    mi_cpu_plan_heads(&s, lens, pats, &pp, heads, &plan);
    run r;
    memset(&r, 0, sizeof r);
    r.tr.n_chunks = s.len; /* chunk sizes >= 1 */
    r.tr.max_sel = 64;
    r.tr.count = calloc((size_t)(s.batch * s.heads_q * r.tr.n_chunks), sizeof(int32_t));
    r.tr.blocks = calloc((size_t)(s.batch * s.heads_q * r.tr.n_chunks * r.tr.max_sel), 4);
    const int64_t Lq = s.len - q_off;
    r.o = malloc((size_t)(s.batch * s.heads_q * Lq * s.head_dim) * sizeof(float));
    mi_tensor o =
        mi_tensor_bhld(r.o, MI_DTYPE_F32, MI_DEVICE_CPU, s.batch, s.heads_q, Lq, s.head_dim);
    CHECK_OK(mi_cpu_infllm_run(ctx, &s, q, &t->k.t, &t->v.t, lens, heads,
                               (float)(1.0 / sqrt((double)s.head_dim)), &o, NULL, &r.tr));
    return r;
}

static void run_free(run *r) {
    free(r->tr.count);
    free(r->tr.blocks);
    free(r->o);
}

static const int32_t *chosen(const run *r, int64_t H, int64_t b, int64_t h, int64_t kc,
                             int32_t *n) {
    const int64_t slot = (b * H + h) * r->tr.n_chunks + kc;
    *n = r->tr.count[slot];
    return r->tr.blocks + slot * r->tr.max_sel;
}

/* Whether row p attends to key j: sinks, the chunk's chosen blocks, and the tail up to p. */
static bool keeps(const mi_head_pattern *p, const int32_t *sel, int32_t n_sel, int64_t pos,
                  int64_t j) {
    int64_t init, nb, rst;
    memory_at(p, pos / p->chunk_size * p->chunk_size, &init, &nb, &rst);
    if (j > pos) return false;
    if (j < init || j >= rst) return true;
    for (int32_t x = 0; x < n_sel; x++)
        if (j >= p->n_init + (int64_t)sel[x] * p->block_size &&
            j < p->n_init + (int64_t)(sel[x] + 1) * p->block_size)
            return true;
    return false;
}

/* float64 simulation of (b, group) under the kernel's chosen blocks (teacher forcing): checks
 * each choice against the reference top-k and writes the reference rows ref [Hq][Lq][D]. */
static void simulate(const qkvo *t, const run *r, const mi_head_pattern *pats, int64_t b,
                     const int64_t *grp, int64_t n, int64_t len, int64_t q_off, double *ref) {
    const int64_t D = t->q.D, Hq = t->q.H, G = t->q.H / t->k.H, L = t->k.L, Lq = L - q_off;
    const mi_head_pattern *p = &pats[grp[0]];
    const double scale = 1.0 / sqrt((double)D);
    double *score = calloc((size_t)(n * L), sizeof(double));
    double *repr = calloc((size_t)(n * (L / p->block_size + 1) * D), sizeof(double));
    double *bs = malloc((size_t)(L + 1) * sizeof(double));
    double *sc = malloc((size_t)L * sizeof(double));
    char *used = malloc((size_t)L + 1);
    const int64_t max_nb = L / p->block_size + 1;
    for (int64_t kc = q_off / p->chunk_size; kc * p->chunk_size < len; kc++) {
        const int64_t st = kc * p->chunk_size, r0 = st > q_off ? st : q_off;
        const int64_t r1 = st + p->chunk_size < len ? st + p->chunk_size : len;
        int64_t init, nb, rst;
        memory_at(p, st, &init, &nb, &rst);
        /* representatives: every block from the scores so far (blocks cut earlier had all
         * their rows then already, so recomputing them here gives the same) */
        for (int64_t m = 0; m < n; m++)
            for (int64_t bi = 0; bi < nb; bi++) {
                const int64_t j0 = p->n_init + bi * p->block_size;
                double *rp = repr + (m * max_nb + bi) * D;
                for (int64_t d = 0; d < D; d++) rp[d] = 0.0;
                memset(used, 0, (size_t)p->block_size);
                for (int64_t c = 0; c < p->repr_topk; c++) {
                    int64_t best = -1;
                    for (int64_t x = 0; x < p->block_size; x++)
                        if (!used[x] &&
                            (best < 0 || score[m * L + j0 + x] > score[m * L + j0 + best]))
                            best = x;
                    used[best] = 1;
                    const double *kr = krow(t, b, grp[m] / G, j0 + best);
                    for (int64_t d = 0; d < D; d++) rp[d] += kr[d] / p->repr_topk;
                }
            }
        /* the choice: all blocks, or the top_k of the summed score */
        for (int64_t bi = 0; bi < nb; bi++) {
            bs[bi] = 0.0;
            for (int64_t m = 0; m < n; m++)
                for (int64_t d = 0; d < D; d++) {
                    double qm = 0.0;
                    for (int64_t i = r0; i < r1; i++) qm += qv(t, b, grp[m], i, d);
                    bs[bi] += qm / (double)(r1 - r0) * repr[(m * max_nb + bi) * D + d];
                }
        }
        for (int64_t m = 0; m < n; m++) {
            int32_t n_sel;
            const int32_t *sel = chosen(r, Hq, b, grp[m], kc, &n_sel);
            const int64_t want = nb < p->top_k ? nb : p->top_k;
            CHECK(n_sel == want, "b %lld h %lld chunk %lld: %d blocks, %lld expected", (long long)b,
                  (long long)grp[m], (long long)kc, n_sel, (long long)want);
            if (m > 0) {
                int32_t n0;
                const int32_t *s0 = chosen(r, Hq, b, grp[0], kc, &n0);
                CHECK(n0 == n_sel && memcmp(s0, sel, (size_t)n_sel * 4) == 0,
                      "b %lld chunk %lld: heads sharing a selection chose differently",
                      (long long)b, (long long)kc);
            }
            memset(used, 0, (size_t)nb + 1);
            double lo = INFINITY, hi = -INFINITY;
            for (int32_t x = 0; x < n_sel; x++) {
                CHECK(sel[x] >= 0 && sel[x] < nb && (x == 0 || sel[x] > sel[x - 1]),
                      "chunk %lld: block ids not ascending in range", (long long)kc);
                if (sel[x] < 0 || sel[x] >= nb) continue;
                used[sel[x]] = 1;
                lo = bs[sel[x]] < lo ? bs[sel[x]] : lo;
            }
            for (int64_t bi = 0; bi < nb; bi++)
                if (!used[bi]) hi = bs[bi] > hi ? bs[bi] : hi;
            CHECK(lo >= hi - 1e-3 * (1.0 + fabs(hi)),
                  "b %lld h %lld chunk %lld: a block scoring %.6g left out, one of %.6g taken",
                  (long long)b, (long long)grp[m], (long long)kc, hi, lo);
        }
        /* the rows under the kernel's choice; their window probabilities */
        for (int64_t m = 0; m < n; m++) {
            const int64_t h = grp[m], hk = h / G;
            int32_t n_sel;
            const int32_t *sel = chosen(r, Hq, b, h, kc, &n_sel);
            for (int64_t i = r0; i < r1; i++) {
                double mx = -INFINITY, sum = 0.0;
                for (int64_t j = 0; j <= i; j++) {
                    sc[j] = -INFINITY;
                    if (!keeps(p, sel, n_sel, i, j)) continue;
                    double dot = 0.0;
                    const double *kr = krow(t, b, hk, j);
                    for (int64_t d = 0; d < D; d++) dot += qv(t, b, h, i, d) * kr[d];
                    sc[j] = dot * scale;
                    mx = sc[j] > mx ? sc[j] : mx;
                }
                for (int64_t j = 0; j <= i; j++) sum += sc[j] > -INFINITY ? exp(sc[j] - mx) : 0.0;
                double *o = ref + (h * Lq + (i - q_off)) * D;
                for (int64_t d = 0; d < D; d++) o[d] = 0.0;
                for (int64_t j = 0; j <= i; j++) {
                    if (sc[j] == -INFINITY) continue;
                    const double pj = exp(sc[j] - mx) / sum;
                    const double *vr = vrow(t, b, hk, j);
                    for (int64_t d = 0; d < D; d++) o[d] += pj * vr[d];
                    if (i - j < p->n_local) score[m * L + j] += pj;
                }
            }
        }
    }
    free(score), free(repr), free(bs), free(sc), free(used);
}

/* out (a view of q_len rows) against the float64 rows of every head; rows past len are 0. */
static void compare_rows(const char *what, const tbuf *o, int64_t q_off, const double *ref,
                         int64_t b, int64_t len) {
    const tol tl = tol_for(o->t.dtype);
    const int64_t D = o->D, L = o->L, Lq = L - q_off;
    int64_t bad = 0;
    double num = 0.0, den = 0.0;
    for (int64_t h = 0; h < o->H; h++)
        for (int64_t i = 0; i < Lq; i++)
            for (int64_t d = 0; d < D; d++) {
                const double x = tb_get(o, b, h, q_off + i, d);
                const double rf = q_off + i < len ? ref[(h * Lq + i) * D + d] : 0.0;
                const double e = fabs(x - rf);
                if (!isfinite(x) || e > tl.atol + tl.rtol * fabs(rf)) bad++;
                num += e * e, den += rf * rf;
            }
    const double rel = den > 0 ? sqrt(num / den) : 0.0;
    CHECK(bad == 0 && rel <= tl.rel_l2, "%s b %lld: %lld bad elements, rel_l2 %.3g", what,
          (long long)b, (long long)bad, rel);
}

/* mi_prefill_attention under pats (q at q_off when > 0), checked against the simulation. */
static void check_case(mi_context *ctx, const char *what, qkvo *t, const int32_t *lens,
                       const mi_head_pattern *pats, int64_t q_off) {
    const int64_t B = t->q.B, Hq = t->q.H, D = t->q.D, L = t->k.L, Lq = L - q_off;
    mi_tensor q = t->q.t, o = t->o.t;
    const size_t esz = mi_dtype_size(q.dtype);
    q.data = (char *)q.data + (size_t)(q_off * q.stride[2]) * esz;
    o.data = (char *)o.data + (size_t)(q_off * o.stride[2]) * esz;
    q.shape[2] = o.shape[2] = Lq;
    mi_prefill_params pp = mi_prefill_default_params();
    pp.dense_below = 0;
    tb_poison(&t->o);
    CHECK_OK(mi_prefill_attention(ctx, &q, &t->k.t, &t->v.t, lens, pats, &pp, &o, NULL, NULL, 0));
    run r = traced_run(ctx, t, lens, pats, q_off, &q);
    double *ref = calloc((size_t)(Hq * Lq * D), sizeof(double));
    for (int64_t b = 0; b < B; b++) {
        const int64_t len = lens ? lens[b] : L;
        char done[16] = {0};
        for (int64_t h = 0; h < Hq; h++) {
            if (done[h]) continue;
            int64_t grp[16], n = 0;
            for (int64_t h2 = h; h2 < Hq; h2++)
                if (h2 == h || (!done[h2] && same_fields(&pats[h], &pats[h2])))
                    grp[n++] = h2, done[h2] = 1;
            simulate(t, &r, pats, b, grp, n, len, q_off, ref);
        }
        compare_rows(what, &t->o, q_off, ref, b, len);
    }
    free(ref);
    run_free(&r);
}

static void test_reference(mi_context *ctx, mi_dtype dt, rng *rg) {
    const int64_t B = 2, Hq = 4, Hkv = 2, L = 900, D = 32;
    const int32_t lens[2] = {900, 611};
    qkvo t = qkvo_new(dt, false, B, Hq, Hkv, L, D, 1.0, rg);
    /* heads 0 and 2 share a selection (equal fields; 0 and 2 read different KV heads), head 1
     * selects alone, head 3 has other fields (no sinks, a chunk not a multiple of 64) */
    const mi_head_pattern pats[4] = {
        infllm(3, 128, 16, 32, 4, 64, 0), infllm(3, 128, 16, 32, 4, 64, 1),
        infllm(3, 128, 16, 32, 4, 64, 0), infllm(2, 100, 0, 24, 1, 100, 0)};
    char what[64];
    snprintf(what, sizeof what, "infllm %s", mi_dtype_name(dt));
    check_case(ctx, what, &t, lens, pats, 0);
    qkvo_free(&t);
}

static void test_offset(mi_context *ctx, rng *rg) {
    qkvo t = qkvo_new(MI_DTYPE_F32, false, 1, 2, 1, 700, 16, 1.0, rg);
    const mi_head_pattern pats[2] = {infllm(2, 96, 8, 32, 2, 64, 0),
                                     infllm(2, 96, 8, 32, 2, 64, 1)};
    check_case(ctx, "infllm at offset 301", &t, NULL, pats, 301);
    qkvo_free(&t);
}

/* recall of mi_metrics_evaluate: the dense softmax mass on the keys the run chose */
static void test_metrics(mi_context *ctx, rng *rg) {
    const int64_t L = 500, D = 16;
    qkvo t = qkvo_new(MI_DTYPE_F32, false, 1, 2, 1, L, D, 1.0, rg);
    const mi_head_pattern pats[2] = {infllm(2, 64, 8, 16, 2, 32, 1),
                                     infllm(2, 64, 8, 16, 2, 32, 1)};
    mi_prefill_params pp = mi_prefill_default_params();
    pp.dense_below = 0;
    mi_head_metrics met[2];
    CHECK_OK(mi_metrics_evaluate(ctx, &t.q.t, &t.k.t, NULL, pats, &pp, met));
    run r = traced_run(ctx, &t, NULL, pats, 0, &t.q.t);
    double *s = malloc((size_t)L * sizeof(double));
    for (int64_t h = 0; h < 2; h++) {
        double rec = 0.0, vis = 0.0;
        for (int64_t i = 0; i < L; i++) {
            int32_t n_sel;
            const int32_t *sel = chosen(&r, 2, 0, h, i / pats[h].chunk_size, &n_sel);
            double mx = -INFINITY, sum = 0.0, kept = 0.0;
            for (int64_t j = 0; j <= i; j++) {
                s[j] = 0.0;
                for (int64_t d = 0; d < D; d++) s[j] += qv(&t, 0, h, i, d) * krow(&t, 0, 0, j)[d];
                s[j] /= sqrt((double)D);
                mx = s[j] > mx ? s[j] : mx;
            }
            for (int64_t j = 0; j <= i; j++) {
                sum += exp(s[j] - mx);
                if (keeps(&pats[h], sel, n_sel, i, j)) kept += exp(s[j] - mx), vis += 1.0;
            }
            rec += kept / sum;
        }
        CHECK_NEAR(met[h].recall, rec / L, 1e-4);
        CHECK_NEAR(met[h].density, vis / ((double)L * (L + 1) / 2.0), 1e-9);
        CHECK(met[h].recall < 0.999, "the budget is below the sequence: recall %.4f",
              met[h].recall);
    }
    free(s);
    run_free(&r);
    qkvo_free(&t);
}

/* every block retrieved, or a window over the whole sequence: dense */
static void test_dense(mi_context *ctx, mi_dtype dt, rng *rg) {
    const int32_t lens[2] = {777, 430};
    qkvo t = qkvo_new(dt, false, 2, 4, 2, 777, 32, 1.0, rg);
    /* 24 * 32 >= 777; the third's window is far past the sequence (as the search may scale it) */
    const mi_head_pattern all[4] = {
        infllm(1000, 64, 16, 32, 4, 64, 0), infllm(24, 100, 0, 32, 2, 64, 1),
        infllm(0, 1 << 28, 16, 32, 4, 64, 0), infllm(1000, 1, 0, 1, 1, 1, 1)};
    mi_prefill_params pp = mi_prefill_default_params();
    pp.dense_below = 0;
    CHECK_OK(
        mi_prefill_attention(ctx, &t.q.t, &t.k.t, &t.v.t, lens, all, &pp, &t.o.t, t.lse, NULL, 0));
    char what[64];
    snprintf(what, sizeof what, "infllm covering all %s", mi_dtype_name(dt));
    qkvo_check(what, &t, lens, 0, mask_all, NULL);
    qkvo_free(&t);
}

static void test_names(mi_context *ctx, rng *rg) {
    mi_pattern_type ty;
    CHECK_OK(mi_pattern_from_name("inf_llm", &ty));
    CHECK(ty == MI_PATTERN_INFLLM);
    CHECK_OK(mi_pattern_from_name("infllm", &ty));
    CHECK(ty == MI_PATTERN_INFLLM);
    mi_head_pattern p = mi_head_pattern_default(MI_PATTERN_INFLLM);
    CHECK(p.top_k == 16 && p.n_local == 4096 && p.n_init == 128 && p.block_size == 128 &&
          p.repr_topk == 4 && p.chunk_size == 512 && p.per_head == 0);
    CHECK_OK(mi_head_pattern_parse("infllm:8:2048", &p));
    CHECK(p.top_k == 8 && p.n_local == 2048 && p.n_init == 128 && p.block_size == 128);
    CHECK_OK(mi_head_pattern_parse("inf_llm:4:1024:64:64:2:256:1", &p));
    CHECK(p.n_init == 64 && p.block_size == 64 && p.repr_topk == 2 && p.chunk_size == 256 &&
          p.per_head == 1);
    CHECK_STATUS(mi_head_pattern_parse("infllm:8", &p), MI_STATUS_INVALID_ARGUMENT);
    int32_t s1, s2;
    CHECK_OK(mi_head_pattern_sizes(&p, &s1, &s2));
    CHECK(s1 == 4 && s2 == 1024);
    /* a config entry's sizes: top_k (0 is a budget), n_local (0 keeps the default) */
    CHECK_OK(mi_head_pattern_from_sizes(MI_PATTERN_INFLLM, 0, 0, &p));
    CHECK(p.top_k == 0 && p.n_local == 4096 && mi_pattern_valid(&p));
    /* invalid fields are refused */
    qkvo t = qkvo_new(MI_DTYPE_F32, false, 1, 1, 1, 128, 16, 1.0, rg);
    const mi_head_pattern bad[5] = {infllm(2, 64, 8, 16, 17, 32, 0), infllm(2, 64, 8, 16, 2, 0, 0),
                                    infllm(2, 64, 8, 0, 1, 32, 0), infllm(2, 0, 8, 16, 2, 32, 0),
                                    infllm(2, 64, 8, 16, 2, 32, 2)};
    mi_prefill_params pp = mi_prefill_default_params();
    pp.dense_below = 0;
    for (int i = 0; i < 5; i++)
        CHECK_STATUS(mi_prefill_attention(ctx, &t.q.t, &t.k.t, &t.v.t, NULL, &bad[i], &pp, &t.o.t,
                                          NULL, NULL, 0),
                     MI_STATUS_INVALID_ARGUMENT);
    qkvo_free(&t);
}

int main(int argc, char **argv) {
    const uint64_t seed = test_seed(argc, argv, 20261207);
    check_seed = seed;
    rng r = {seed};
    mi_context *ctx = test_context();
    test_names(ctx, &r);
    test_reference(ctx, MI_DTYPE_F32, &r);
    test_reference(ctx, MI_DTYPE_BF16, &r);
    test_offset(ctx, &r);
    test_metrics(ctx, &r);
    test_dense(ctx, MI_DTYPE_F32, &r);
    test_dense(ctx, MI_DTYPE_BF16, &r);
    mi_context_destroy(ctx);
    return check_finish("cpu_infllm");
}
