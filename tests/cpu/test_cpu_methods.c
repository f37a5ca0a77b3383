/*
 * test_cpu_methods.c: the dilated, strided, XAttention and FlexPrefill patterns on the CPU.
 *  - dilated and strided: mi_prefill_attention equals the float64 reference under the rule's
 *    element mask (written here from the definitions, not from the kernel's key lists), for
 *    fp32 and bf16, GQA and varlen; their recall from mi_metrics_evaluate equals the float64
 *    recall under that mask; a span / period covering the sequence is dense;
 *  - XAttention: the block mass of the estimate equals a float64 re-computation of the
 *    antidiagonal scores; the blocks kept are the threshold rule applied to that mass (block 0
 *    and the diagonal, then by mass until the threshold is reached), a planted key block is
 *    kept by every later row block, the attention equals the float64 reference under the
 *    index's mask, and threshold 1000 is dense;
 *  - FlexPrefill: the decision (query-aware or vertical-slash) and the blocks kept equal a
 *    float64 re-computation wherever it is not within rounding of a boundary; sinks and the
 *    diagonal are always kept; attention under its index; gamma 1000 is dense;
 *  - invalid parameters are refused.
 */
#include "cpu_common.h"
#include "pattern_table.h"
#include "test_qkvo.h"

#include <math.h>

/* ---- helpers ---------------------------------------------------------------------------- */

static mi_status prefill(mi_context *ctx, qkvo *t, const int32_t *lens,
                         const mi_head_pattern *pats) {
    mi_prefill_params pp = mi_prefill_default_params();
    pp.dense_below = 0;
    return mi_prefill_attention(ctx, &t->q.t, &t->k.t, &t->v.t, lens, pats, &pp, &t->o.t, t->lse,
                                NULL, 0);
}

/* The block index the prefill plans for pats, expanded to a key mask (as key_mask_from_index). */
static key_mask plan_mask(mi_context *ctx, qkvo *t, const int32_t *lens,
                          const mi_head_pattern *pats) {
    mi_prefill_params pp = mi_prefill_default_params();
    pp.dense_below = 0;
    mi_attn_shape s;
    memset(&s, 0, sizeof s);
    s.batch = t->q.B;
    s.heads_q = t->q.H;
    s.heads_kv = t->k.H;
    s.len = t->q.L;
    s.head_dim = t->q.D;
    s.group = s.heads_q / s.heads_kv;
    s.dtype = t->q.t.dtype;
    s.device = MI_DEVICE_CPU;
    size_t bytes = 0;
    key_mask km = {s.batch, s.heads_q, (s.len + 63) / 64, s.len, NULL};
    km.keys = calloc((size_t)(km.B * km.H * km.R * km.L) + 1, 1);
    CHECK_OK(mi_cpu_prefill_workspace_size(ctx, &s, pats, &pp, &bytes));
    void *ws = aligned_alloc(64, (bytes + 63) / 64 * 64);
    mi_attn_job *jobs = NULL;
    CHECK_OK(mi_cpu_prefill_plan(ctx, &s, &t->q.t, &t->k.t, lens, pats, &pp, ws, &jobs));
    for (int64_t bh = 0; jobs && bh < km.B * km.H; bh++) {
        const mi_attn_job *j = &jobs[bh];
        CHECK(j->kind == MI_JOB_SPARSE);
        for (int64_t m = 0; m < km.R; m++) {
            unsigned char *row = km.keys + (size_t)(bh * km.R + m) * (size_t)km.L;
            CHECK(j->column_count[m] == 0);
            for (int64_t i = 0; i < j->block_count[m] && i < j->max_blocks; i++)
                for (int64_t c = j->block_offset[m * j->max_blocks + i];
                     c < j->block_offset[m * j->max_blocks + i] + 64 && c < km.L; c++)
                    row[c] = 1;
        }
    }
    free(ws);
    return km;
}

/* float64 dot of q row i of (b, h) and k row j of (b, hk). */
static double ddot(const qkvo *t, int64_t b, int64_t h, int64_t i, int64_t j) {
    const int64_t D = t->q.D, hk = h / (t->q.H / t->k.H);
    const double *qi = t->q.ref + ((b * t->q.H + h) * t->q.L + i) * D;
    const double *kj = t->k.ref + ((b * t->k.H + hk) * t->k.L + j) * D;
    double s = 0.0;
    for (int64_t d = 0; d < D; d++) s += qi[d] * kj[d];
    return s;
}

/* ---- dilated and strided ------------------------------------------------------------------ */

typedef struct rule_mask {
    const mi_head_pattern *pats;
} rule_mask;

static bool rule_keeps(const mi_head_pattern *p, int64_t i, int64_t j) {
    const int64_t d = i - j;
    if (p->type == MI_PATTERN_STRIDED) return d < p->stride || d % p->stride == 0;
    if (p->type == MI_PATTERN_DILATED)
        return j < p->n_init || d < p->dense_local ||
               (d < p->n_local && (d - p->dense_local) % p->stride == 0);
    return true;
}

static bool mask_rule(void *ctx, int64_t b, int64_t h, int64_t i, int64_t j) {
    (void)b;
    return rule_keeps(&((rule_mask *)ctx)->pats[h], i, j);
}

static mi_head_pattern dilated(int32_t n_init, int32_t n_local, int32_t stride, int32_t dense) {
    mi_head_pattern p = mi_head_pattern_default(MI_PATTERN_DILATED);
    p.n_init = n_init, p.n_local = n_local, p.stride = stride, p.dense_local = dense;
    return p;
}

static mi_head_pattern strided(int32_t stride) {
    mi_head_pattern p = mi_head_pattern_default(MI_PATTERN_STRIDED);
    p.stride = stride;
    return p;
}

static void test_rowmask(mi_context *ctx, mi_dtype dt, rng *r) {
    const int64_t B = 2, Hq = 4, Hkv = 2, L = 700, D = 32;
    const int32_t lens[2] = {700, 517};
    qkvo t = qkvo_new(dt, false, B, Hq, Hkv, L, D, 1.0, r);
    const mi_head_pattern pats[4] = {dilated(16, 300, 3, 40), dilated(0, 250, 2, 0), strided(64),
                                     strided(7)};
    CHECK_OK(prefill(ctx, &t, lens, pats));
    rule_mask rm = {pats};
    char what[96];
    snprintf(what, sizeof what, "dilated/strided %s", mi_dtype_name(dt));
    qkvo_check(what, &t, lens, 0, mask_rule, &rm);
    /* recall: the dense softmax's mass on the rule's keys, float64 */
    mi_head_metrics met[8];
    mi_prefill_params pp = mi_prefill_default_params();
    pp.dense_below = 0;
    CHECK_OK(mi_metrics_evaluate(ctx, &t.q.t, &t.k.t, lens, pats, &pp, met));
    double *s = malloc((size_t)L * sizeof(double));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++) {
            double rec = 0.0, vis = 0.0;
            for (int64_t i = 0; i < lens[b]; i++) {
                double mx = -INFINITY, sum = 0.0, kept = 0.0;
                for (int64_t j = 0; j <= i; j++) {
                    s[j] = ddot(&t, b, h, i, j) / sqrt((double)D);
                    mx = s[j] > mx ? s[j] : mx;
                }
                for (int64_t j = 0; j <= i; j++) {
                    const double e = exp(s[j] - mx);
                    sum += e;
                    if (rule_keeps(&pats[h], i, j)) kept += e, vis += 1.0;
                }
                rec += kept / sum;
            }
            CHECK_NEAR(met[b * Hq + h].recall, rec / lens[b], 1e-4);
            CHECK_NEAR(met[b * Hq + h].density, vis / ((double)lens[b] * (lens[b] + 1) / 2.0),
                       1e-9);
        }
    free(s);
    /* a span (period) covering the sequence keeps every key: dense */
    const mi_head_pattern all[4] = {dilated(0, 700, 1, 0), dilated(5, 0, 2, 700), strided(700),
                                    strided(1)};
    CHECK_OK(prefill(ctx, &t, lens, all));
    snprintf(what, sizeof what, "dilated/strided covering all %s", mi_dtype_name(dt));
    qkvo_check(what, &t, lens, 0, mask_all, NULL);
    qkvo_free(&t);
}

/* ---- XAttention ---------------------------------------------------------------------------- */

/* float64 block mass of (b, h) as the estimate defines it: mass [nb][nb]. */
static void ref_xattn_mass(const qkvo *t, int64_t b, int64_t h, int64_t len, int64_t S,
                           double *mass) {
    const int64_t nb = (len + 63) / 64, per = 64 / S, nr = nb * per, D = t->q.D;
    double *row = malloc((size_t)nr * sizeof(double));
    for (int64_t x = 0; x < nb * nb; x++) mass[x] = 0.0;
    for (int64_t r = 0; r < nr; r++) {
        if (r * S >= len) continue;
        double mx = -INFINITY, sum = 0.0;
        for (int64_t c = 0; c <= r; c++) {
            double a = 0.0;
            for (int64_t u = 0; u < S; u++) {
                const int64_t qi = r * S + S - 1 - u, kj = c * S + u;
                if (qi < len && kj < len) a += ddot(t, b, h, qi, kj);
            }
            row[c] = a / sqrt((double)D) / (double)S;
            mx = row[c] > mx ? row[c] : mx;
        }
        for (int64_t c = 0; c <= r; c++) sum += exp(row[c] - mx);
        for (int64_t c = 0; c <= r; c++) mass[(r / per) * nb + c / per] += exp(row[c] - mx) / sum;
    }
    free(row);
}

/* The threshold rule on row block m of mass (written from the definition). */
static void rule_select(const double *a, int64_t m, int32_t thr, bool *keep) {
    double total = 0.0;
    for (int64_t n = 0; n <= m; n++) total += a[n], keep[n] = thr >= 1000;
    keep[0] = keep[m] = true;
    double kept = a[0] + (m > 0 ? a[m] : 0.0);
    while (kept < total * thr / 1000.0) {
        int64_t best = -1;
        for (int64_t n = 1; n < m; n++)
            if (!keep[n] && (best < 0 || a[n] > a[best])) best = n;
        if (best < 0) break;
        keep[best] = true;
        kept += a[best];
    }
}

static mi_head_pattern xattn(int32_t stride, int32_t thr) {
    mi_head_pattern p = mi_head_pattern_default(MI_PATTERN_XATTENTION);
    p.stride = stride, p.threshold = thr;
    return p;
}

static void test_xattention(mi_context *ctx, mi_dtype dt, rng *r) {
    const int64_t B = 1, Hq = 4, Hkv = 2, L = 1000, D = 32;
    const int32_t lens[1] = {931};
    qkvo t = qkvo_new(dt, false, B, Hq, Hkv, L, D, 1.0, r);
    /* a planted key block (keys 320..383 of every KV head) that every query favours */
    for (int64_t h = 0; h < Hkv; h++)
        for (int64_t j = 320; j < 384; j++) tb_set(&t.k, 0, h, j, 0, 6.0);
    for (int64_t h = 0; h < Hq; h++)
        for (int64_t i = 0; i < L; i++) tb_set(&t.q, 0, h, i, 0, 1.5);
    const mi_head_pattern pats[4] = {xattn(8, 900), xattn(4, 800), xattn(16, 950), xattn(8, 0)};
    /* the estimate's mass and selection, head by head */
    mi_attn_shape s = {B, Hq, Hkv, L, D, Hq / Hkv, dt, MI_DEVICE_CPU, 0};
    const int64_t R = (L + 63) / 64, nb = (lens[0] + 63) / 64;
    double *mass = malloc((size_t)(nb * nb) * sizeof(double));
    double *ref = malloc((size_t)(nb * nb) * sizeof(double));
    int32_t *bc = malloc((size_t)R * sizeof(int32_t)), *cc = malloc((size_t)R * sizeof(int32_t));
    int32_t *bo = malloc((size_t)(R * R) * sizeof(int32_t));
    bool *keep = malloc((size_t)R);
    for (int64_t h = 0; h < Hq; h++) {
        const int32_t S = pats[h].stride;
        mi_tile *tile = mi_cpu_tile_alloc(D * S);
        float *ws = aligned_alloc(64, (mi_cpu_xattn_ws_floats(L, D, S) * 4 + 63) / 64 * 64);
        mi_cpu_xattn_estimate_head(tile, &s, &t.q.t, &t.k.t, 0, h, lens[0], R, S, pats[h].threshold,
                                   1.0f / sqrtf((float)D), ws, bc, bo, R, cc, mass);
        ref_xattn_mass(&t, 0, h, lens[0], S, ref);
        double worst = 0.0;
        for (int64_t m = 0; m < nb; m++) {
            double row = 0.0;
            for (int64_t n = 0; n <= m; n++) {
                worst = fmax(worst, fabs(mass[m * nb + n] - ref[m * nb + n]));
                row += mass[m * nb + n];
            }
            /* each reshaped row's probabilities sum to one */
            const int64_t per = 64 / S,
                          rows_real = (mi_cpu_min64((m + 1) * 64, lens[0]) - m * 64 + S - 1) / S;
            CHECK_NEAR(row, (double)mi_cpu_min64(per, rows_real), 1e-6 * per);
        }
        CHECK(worst < (dt == MI_DTYPE_F32 ? 1e-4 : 2e-2), "head %lld: mass off by %g", (long long)h,
              worst);
        for (int64_t m = 0; m < nb; m++) {
            rule_select(mass + m * nb, m, pats[h].threshold, keep);
            int32_t c = 0;
            bool same = true;
            for (int64_t n = 0; n <= m; n++)
                if (keep[n]) same = same && c < bc[m] && bo[m * R + c++] == n * 64;
            CHECK(same && c == bc[m], "head %lld row block %lld", (long long)h, (long long)m);
            /* the planted block (5) is kept by the later row blocks with a threshold */
            if (m > 5 && pats[h].threshold > 0)
                CHECK(keep[5], "head %lld row %lld", (long long)h, (long long)m);
        }
        free(ws);
        mi_cpu_tile_free(tile);
    }
    /* attention under the planned index, and threshold 1000: dense */
    CHECK_OK(prefill(ctx, &t, lens, pats));
    key_mask km = plan_mask(ctx, &t, lens, pats);
    qkvo_check("xattention", &t, lens, 0, mask_keys, &km);
    free(km.keys);
    const mi_head_pattern all[4] = {xattn(8, 1000), xattn(1, 1000), xattn(64, 1000),
                                    xattn(2, 1000)};
    CHECK_OK(prefill(ctx, &t, lens, all));
    qkvo_check("xattention threshold 1000", &t, lens, 0, mask_all, NULL);
    free(mass), free(ref), free(bc), free(cc), free(bo), free(keep);
    qkvo_free(&t);
}

/* ---- FlexPrefill --------------------------------------------------------------------------- */

typedef struct flex_ref {
    bool aware, fragile_decision, fragile_set;
    unsigned char *keep; /* [nb][nb] */
} flex_ref;

static int desc_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

/* Fewest entries reaching gamma (count with cumsum <= gamma, plus one); *fragile when a partial
 * sum lies within eps of gamma. */
static int64_t ref_cover(const double *x, int64_t n, double gamma, bool *fragile) {
    double *c = malloc((size_t)n * sizeof(double));
    memcpy(c, x, (size_t)n * sizeof(double));
    qsort(c, (size_t)n, sizeof(double), desc_d);
    double s = 0.0;
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        s += c[i];
        if (fabs(s - gamma) < 1e-5) *fragile = true;
        if (s <= gamma)
            k = i + 1;
        else
            break;
    }
    free(c);
    return k + 1;
}

/* The top k of x [n] with x[0] forced into keep; *fragile when the k-th and the next are within
 * eps. */
static void ref_top(const double *x, int64_t n, int64_t k, unsigned char *keep, bool *fragile) {
    double *c = malloc((size_t)n * sizeof(double));
    for (int64_t i = 0; i < n; i++) c[i] = i == 0 ? INFINITY : x[i];
    for (int64_t sel = 0; sel < k && sel < n; sel++) {
        int64_t best = -1;
        for (int64_t i = 0; i < n; i++)
            if (!keep[i] && (best < 0 || c[i] > c[best])) best = i;
        keep[best] = 1;
    }
    if (k < n && k > 1) {
        double lo = INFINITY, hi = -INFINITY;
        for (int64_t i = 1; i < n; i++)
            if (keep[i])
                lo = fmin(lo, c[i]);
            else
                hi = fmax(hi, c[i]);
        if (fabs(lo - hi) < 1e-6) *fragile = true;
    }
    free(c);
}

static void mean_block(const tbuf *x, int64_t b, int64_t h, int64_t r0, int64_t r1, double *p) {
    for (int64_t d = 0; d < x->D; d++) {
        double s = 0.0;
        for (int64_t r = r0; r < r1; r++) s += x->ref[((b * x->H + h) * x->L + r) * x->D + d];
        p[d] = s / (double)(r1 - r0);
    }
}

static flex_ref ref_flex(const qkvo *t, int64_t b, int64_t h, int64_t len, int32_t gamma_pm,
                         int32_t tau_pm) {
    const int64_t D = t->q.D, nb = (len + 63) / 64, hk = h / (t->q.H / t->k.H);
    const int64_t n = len < 64 ? len : 64;
    const double gamma = gamma_pm / 1000.0, sc = 1.0 / sqrt((double)D);
    flex_ref f = {false, false, false, calloc((size_t)(nb * nb), 1)};
    double *vert = calloc((size_t)len, sizeof(double)), *sl = calloc((size_t)len, sizeof(double));
    double *s = malloc((size_t)len * sizeof(double));
    for (int64_t i = len - n; i < len; i++) {
        double mx = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j <= i; j++) s[j] = ddot(t, b, h, i, j) * sc, mx = fmax(mx, s[j]);
        for (int64_t j = 0; j <= i; j++) sum += exp(s[j] - mx);
        for (int64_t j = 0; j <= i; j++) {
            const double p = exp(s[j] - mx) / sum / (double)n;
            vert[j] += p;
            sl[i - j] += p;
        }
    }
    double *vb = calloc((size_t)nb, sizeof(double)), *sb = calloc((size_t)nb, sizeof(double));
    for (int64_t j = 0; j < len; j++) vb[j / 64] += vert[j], sb[j / 64] += sl[j];
    int64_t nv = ref_cover(vert, len, gamma, &f.fragile_set) / 64 + 1;
    int64_t ns = ref_cover(sl, len, gamma, &f.fragile_set) / 64 + 1;
    double *qm = malloc((size_t)D * sizeof(double)), *kp = malloc((size_t)(nb * D) * 8);
    double *avg = malloc((size_t)nb * sizeof(double));
    mean_block(&t->q, b, h, len - n, len, qm);
    double mx = -INFINITY, sum = 0.0;
    for (int64_t m = 0; m < nb; m++) {
        mean_block(&t->k, b, hk, m * 64, m * 64 + 64 < len ? m * 64 + 64 : len, kp + m * D);
        avg[m] = 0.0;
        for (int64_t d = 0; d < D; d++) avg[m] += qm[d] * kp[m * D + d] * sc;
        mx = fmax(mx, avg[m]);
    }
    for (int64_t m = 0; m < nb; m++) sum += (avg[m] = exp(avg[m] - mx));
    double js = 0.0;
    for (int64_t m = 0; m < nb; m++) {
        const double p = avg[m] / sum, q = vb[m], mid = 0.5 * (p + q);
        if (p > 0) js += 0.5 * p * log(p / mid);
        if (q > 0) js += 0.5 * q * log(q / mid);
    }
    const double dist = sqrt(fmax(js, 0.0));
    f.aware = dist < tau_pm / 1000.0;
    f.fragile_decision = fabs(dist - tau_pm / 1000.0) < 1e-5;
    if (f.aware) nv = ns = 1;
    nv = nv < nb ? nv : nb;
    ns = ns < nb ? ns : nb;
    unsigned char *kv = calloc((size_t)nb, 1), *ks = calloc((size_t)nb, 1);
    ref_top(vb, nb, nv, kv, &f.fragile_set);
    ref_top(sb, nb, ns, ks, &f.fragile_set);
    for (int64_t m = 0; m < nb; m++)
        for (int64_t c = 0; c <= m; c++)
            f.keep[m * nb + c] = kv[c] || ks[m - c] || gamma_pm >= 1000;
    if (f.aware && gamma_pm < 1000) {
        /* query-aware pairs, by descending probability, until gamma * nb */
        const int64_t np = nb * (nb + 1) / 2;
        double *pv = malloc((size_t)np * sizeof(double));
        int64_t *pi = malloc((size_t)np * sizeof(int64_t)), w = 0;
        for (int64_t m = 0; m < nb; m++) {
            mean_block(&t->q, b, h, m * 64, m * 64 + 64 < len ? m * 64 + 64 : len, qm);
            double rm = -INFINITY, rs = 0.0;
            const int64_t w0 = w;
            for (int64_t c = 0; c <= m; c++, w++) {
                pv[w] = 0.0;
                for (int64_t d = 0; d < D; d++) pv[w] += qm[d] * kp[c * D + d] * sc;
                pi[w] = m * nb + c;
                rm = fmax(rm, pv[w]);
            }
            for (int64_t x = w0; x < w; x++) rs += (pv[x] = exp(pv[x] - rm));
            for (int64_t x = w0; x < w; x++) pv[x] /= rs;
        }
        double kept = 0.0;
        unsigned char *used = calloc((size_t)np, 1);
        while (kept < gamma * (double)nb) {
            int64_t best = -1;
            for (int64_t x = 0; x < np; x++)
                if (!used[x] && (best < 0 || pv[x] > pv[best])) best = x;
            if (best < 0) break;
            used[best] = 1;
            f.keep[pi[best]] = 1;
            kept += pv[best];
            if (fabs(kept - gamma * (double)nb) < 1e-4) f.fragile_set = true;
        }
        free(pv), free(pi), free(used);
    }
    free(vert), free(sl), free(s), free(vb), free(sb), free(qm), free(kp), free(avg), free(kv);
    free(ks);
    return f;
}

static mi_head_pattern flex(int32_t gamma, int32_t tau) {
    mi_head_pattern p = mi_head_pattern_default(MI_PATTERN_FLEXPREFILL);
    p.threshold = gamma, p.tau = tau;
    return p;
}

static void test_flexprefill(mi_context *ctx, mi_dtype dt, rng *r) {
    const int64_t B = 1, Hq = 4, Hkv = 2, L = 1200, D = 32;
    const int32_t lens[1] = {1130};
    qkvo t = qkvo_new(dt, false, B, Hq, Hkv, L, D, 1.0, r);
    /* head pair 0: a sink and a strong local band (vertical-slash-like); pair 1: noise */
    for (int64_t i = 0; i < L; i++) tb_set(&t.q, 0, 0, i, 1, 3.0), tb_set(&t.q, 0, 1, i, 1, 3.0);
    for (int64_t j = 0; j < 8; j++) tb_set(&t.k, 0, 0, j, 1, 4.0);
    /* tau 1000 forces query-aware (the distance is at most sqrt(ln 2) < 1), 0 vertical-slash */
    const mi_head_pattern pats[4] = {flex(900, 100), flex(950, 0), flex(900, 1000), flex(700, 100)};
    mi_attn_shape s = {B, Hq, Hkv, L, D, Hq / Hkv, dt, MI_DEVICE_CPU, 0};
    const int64_t R = (L + 63) / 64, nb = (lens[0] + 63) / 64;
    int32_t *bc = malloc((size_t)R * sizeof(int32_t)), *cc = malloc((size_t)R * sizeof(int32_t));
    int32_t *bo = malloc((size_t)(R * R) * sizeof(int32_t));
    mi_tile *tile = mi_cpu_tile_alloc(D);
    int compared = 0;
    for (int64_t h = 0; h < Hq; h++) {
        int aware = -1;
        mi_cpu_flex_estimate_head(tile, &s, &t.q.t, &t.k.t, 0, h, lens[0], R, pats[h].threshold,
                                  pats[h].tau, 1.0f / sqrtf((float)D), bc, bo, R, cc, &aware);
        flex_ref f = ref_flex(&t, 0, h, lens[0], pats[h].threshold, pats[h].tau);
        if (pats[h].tau == 1000) CHECK(aware == 1);
        if (pats[h].tau == 0) CHECK(aware == 0);
        if (!f.fragile_decision) CHECK(aware == (int)f.aware, "head %lld", (long long)h);
        for (int64_t m = 0; m < nb; m++) {
            /* block 0 and the diagonal always; ascending offsets */
            CHECK(bc[m] >= (m > 0 ? 2 : 1) && bo[m * R] == 0 && bo[m * R + bc[m] - 1] == m * 64);
            for (int32_t i = 1; i < bc[m]; i++) CHECK(bo[m * R + i] > bo[m * R + i - 1]);
        }
        if (!f.fragile_decision && !f.fragile_set && aware == (int)f.aware) {
            compared++;
            for (int64_t m = 0; m < nb; m++) {
                int32_t c = 0;
                bool same = true;
                for (int64_t n = 0; n <= m; n++)
                    if (f.keep[m * nb + n]) same = same && c < bc[m] && bo[m * R + c++] == n * 64;
                CHECK(same && c == bc[m], "head %lld row block %lld", (long long)h, (long long)m);
            }
        }
        free(f.keep);
    }
    CHECK(compared >= 3, "only %d heads away from a rounding boundary", compared);
    mi_cpu_tile_free(tile);
    CHECK_OK(prefill(ctx, &t, lens, pats));
    key_mask km = plan_mask(ctx, &t, lens, pats);
    qkvo_check("flexprefill", &t, lens, 0, mask_keys, &km);
    free(km.keys);
    const mi_head_pattern all[4] = {flex(1000, 100), flex(1000, 0), flex(1000, 1000),
                                    flex(1000, 500)};
    CHECK_OK(prefill(ctx, &t, lens, all));
    qkvo_check("flexprefill gamma 1000", &t, lens, 0, mask_all, NULL);
    free(bc), free(cc), free(bo);
    qkvo_free(&t);
}

/* ---- validation ------------------------------------------------------------------------------ */

static void test_validation(mi_context *ctx, rng *r) {
    qkvo t = qkvo_new(MI_DTYPE_F32, false, 1, 2, 1, 128, 16, 1.0, r);
    mi_head_pattern p[2] = {xattn(3, 900), xattn(8, 900)}; /* 3 does not split 64 rows */
    CHECK_STATUS(prefill(ctx, &t, NULL, p), MI_STATUS_INVALID_ARGUMENT);
    p[0] = xattn(8, 1001);
    CHECK_STATUS(prefill(ctx, &t, NULL, p), MI_STATUS_INVALID_ARGUMENT);
    p[0] = flex(900, -1);
    CHECK_STATUS(prefill(ctx, &t, NULL, p), MI_STATUS_INVALID_ARGUMENT);
    p[0] = dilated(4, 64, 0, 0);
    CHECK_STATUS(prefill(ctx, &t, NULL, p), MI_STATUS_INVALID_ARGUMENT);
    mi_head_pattern q;
    CHECK_OK(mi_head_pattern_parse("xattention:16:950", &q));
    CHECK(q.type == MI_PATTERN_XATTENTION && q.stride == 16 && q.threshold == 950);
    CHECK_OK(mi_head_pattern_parse("flexprefill:950:50", &q));
    CHECK(q.type == MI_PATTERN_FLEXPREFILL && q.threshold == 950 && q.tau == 50);
    CHECK_OK(mi_head_pattern_parse("dilated:1024:6144:2:2048", &q));
    CHECK(q.n_init == 1024 && q.n_local == 6144 && q.stride == 2 && q.dense_local == 2048);
    CHECK_OK(mi_head_pattern_parse("strided:256", &q));
    CHECK(q.type == MI_PATTERN_STRIDED && q.stride == 256);
    qkvo_free(&t);
}

int main(int argc, char **argv) {
    const uint64_t seed = test_seed(argc, argv, 20250611);
    check_seed = seed;
    rng r = {seed};
    mi_context *ctx = test_context();
    test_validation(ctx, &r);
    test_rowmask(ctx, MI_DTYPE_F32, &r);
    test_rowmask(ctx, MI_DTYPE_BF16, &r);
    test_xattention(ctx, MI_DTYPE_F32, &r);
    test_xattention(ctx, MI_DTYPE_BF16, &r);
    test_flexprefill(ctx, MI_DTYPE_F32, &r);
    test_flexprefill(ctx, MI_DTYPE_BF16, &r);
    mi_context_destroy(ctx);
    return check_finish("cpu_methods");
}
