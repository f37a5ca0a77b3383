/*
 * flex_estimate.c: FlexPrefill's block selection (docs/prefill-methods.md), in 64-token blocks.
 *
 * 1. The last 64 queries (fewer for a short sequence) against every key, exact softmax: the
 *    vertical distribution v[j] (mean mass of key j) and the slash distribution s[d] (mean mass
 *    at distance d), each summing to 1.
 * 2. Budgets: the fewest keys (distances) whose mass reaches gamma, as 64-token blocks plus one,
 *    between 1 and all blocks.
 * 3. The decision: the mean of those queries against the mean-pooled key blocks, softmaxed over
 *    the blocks, is compared with v pooled into blocks by the square root of their Jensen-Shannon
 *    divergence; below tau the head is query-aware (its vertical and slash budgets drop to one
 *    block each), else vertical-slash.
 * 4. Vertical-slash: the top key blocks of v and the top distance blocks of s (key block 0 and
 *    distance block 0 forced), each row block m keeping the key blocks n <= m they name.
 *    Query-aware: mean-pooled query blocks against mean-pooled key blocks (causal, softmax per
 *    row block), all (m, n) pairs by descending probability, kept until their sum reaches gamma
 *    times the number of row blocks; unioned with the forced vertical-slash blocks.
 * gamma >= 1000 keeps every block. On an allocation failure every block is kept (dense: a
 * correct result, only slower).
 */
#include "cpu_common.h"

#include <math.h>
#include <stdlib.h>

static int desc_f32(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* Fewest entries of x [n] (summing to about 1) whose mass reaches gamma: count with cumsum <=
 * gamma, plus one (the original's rule); tmp [n]. */
static int64_t cover_count(const float *x, int64_t n, double gamma, float *tmp) {
    memcpy(tmp, x, (size_t)n * sizeof(float));
    qsort(tmp, (size_t)n, sizeof(float), desc_f32);
    double c = 0.0;
    int64_t k = 0;
    while (k < n && (c += tmp[k]) <= gamma) k++;
    return k + 1;
}

typedef struct pair {
    float v;
    int32_t m, n;
} pair;

static int desc_pair(const void *a, const void *b) {
    const pair *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    if (x->m != y->m) return (x->m > y->m) - (x->m < y->m);
    return (x->n > y->n) - (x->n < y->n);
}

/* Mean of rows [r0, r1) of (b, hh) of t (rows from off on), times mul, into p [D]. */
static void mean_rows(const mi_tensor *t, int64_t b, int64_t hh, int64_t off, int64_t r0,
                      int64_t r1, int64_t D, float mul, float *p, float *row) {
    for (int64_t d = 0; d < D; d++) p[d] = 0.0f;
    for (int64_t r = r0; r < r1; r++) {
        mi_cpu_load_f32(row, mi_cpu_row(t, b, hh, r - off), t->dtype, D, 1.0f);
        for (int64_t d = 0; d < D; d++) p[d] += row[d];
    }
    const float inv = mul / (float)(r1 - r0);
    for (int64_t d = 0; d < D; d++) p[d] *= inv;
}

/* sqrt of the Jensen-Shannon divergence of p and q [n] (natural log). */
double mi_cpu_sqrt_js(const double *p, const double *q, int64_t n) {
    double js = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double m = 0.5 * (p[i] + q[i]);
        if (p[i] > 0.0) js += 0.5 * p[i] * log(p[i] / m);
        if (q[i] > 0.0) js += 0.5 * q[i] * log(q[i] / m);
    }
    return sqrt(js > 0.0 ? js : 0.0);
}

void mi_cpu_flex_estimate_head(mi_tile *t, const mi_attn_shape *s, const mi_tensor *q,
                               const mi_tensor *k, int64_t b, int64_t h, int64_t len,
                               int64_t row_blocks, int32_t gamma_pm, int32_t tau_pm, float scale,
                               int32_t *block_count, int32_t *block_offset, int64_t max_blocks,
                               int32_t *column_count, int *query_aware) {
    const int64_t D = s->head_dim, hk = h / s->group, nb = (len + MI_BS - 1) / MI_BS;
    const int64_t mfirst = s->q_off / MI_BS;
    for (int64_t m = 0; m < row_blocks; m++) block_count[m] = column_count[m] = 0;
    if (query_aware) *query_aware = 0;
    if (nb <= 0 || max_blocks <= 0) return;
    const double gamma = (double)gamma_pm / 1000.0;
    const int64_t n_last = mi_cpu_min64(MI_BS, len - s->q_off);
    float *vert = calloc((size_t)len, sizeof(float)), *slash = calloc((size_t)len, sizeof(float));
    float *tmp = malloc((size_t)(len + 3 * nb) * sizeof(float));
    float *kp = malloc((size_t)(nb * D + 2 * D) * sizeof(float));
    double *vb = calloc((size_t)nb * 3, sizeof(double));
    uint8_t *mark = calloc((size_t)nb, 1);
    int32_t *vsel = malloc((size_t)nb * 2 * sizeof(int32_t));
    uint8_t *qa = NULL; /* query-aware blocks, [nb][nb] */
    pair *pairs = NULL;
    float *qp = NULL;
    bool all = gamma_pm >= 1000 || n_last <= 0;
    bool ok = vert && slash && tmp && kp && vb && mark && vsel;
    if (ok && !all) {
        double *sb = vb + nb, *avg = sb + nb;
        float *qm = kp + nb * D, *row = qm + D;
        mi_cpu_vs_sums(t, s, q, k, b, h, len, n_last, scale, vert, slash);
        const float inv = 1.0f / (float)n_last;
        for (int64_t j = 0; j < len; j++) {
            vert[j] *= inv;
            slash[j] *= inv;
            vb[j / MI_BS] += vert[j];
            sb[j / MI_BS] += slash[j];
        }
        int64_t nv = cover_count(vert, len, gamma, tmp) / MI_BS + 1;
        int64_t ns = cover_count(slash, len, gamma, tmp) / MI_BS + 1;
        /* the decision: pooled last queries against pooled key blocks, vs the pooled vertical */
        mean_rows(q, b, h, s->q_off, len - n_last, len, D, scale, qm, row);
        double mx = -INFINITY, sum = 0.0;
        for (int64_t n = 0; n < nb; n++) {
            mean_rows(k, b, hk, 0, n * MI_BS, mi_cpu_min64(n * MI_BS + MI_BS, len), D, 1.0f,
                      kp + n * D, row);
            avg[n] = mi_cpu_dot8(qm, kp + n * D, D);
            mx = avg[n] > mx ? avg[n] : mx;
        }
        for (int64_t n = 0; n < nb; n++) sum += (avg[n] = exp(avg[n] - mx));
        for (int64_t n = 0; n < nb; n++) avg[n] /= sum;
        const bool aware = mi_cpu_sqrt_js(avg, vb, nb) < (double)tau_pm / 1000.0;
        if (query_aware) *query_aware = aware;
        if (aware) nv = ns = 1;
        nv = mi_cpu_min64(nv, nb);
        ns = mi_cpu_min64(ns, nb);
        /* top blocks, block 0 and distance block 0 first */
        float *fv = tmp, *fs = tmp + nb;
        for (int64_t n = 0; n < nb; n++) {
            fv[n] = n == 0 ? INFINITY : (float)vb[n];
            fs[n] = n == 0 ? INFINITY : (float)sb[n];
        }
        int32_t *tidx = (int32_t *)(tmp + 2 * nb);
        mi_cpu_topk(fv, (int32_t)nb, (int32_t)nv, tidx, vsel);
        mi_cpu_topk(fs, (int32_t)nb, (int32_t)ns, tidx, vsel + nv);
        /* mark[] below: bit 0 vertical block, bit 1 slash distance */
        for (int64_t i = 0; i < nv; i++) mark[vsel[i]] |= 1;
        for (int64_t i = 0; i < ns; i++) mark[vsel[nv + i]] |= 2;
        if (aware) {
            const int64_t np = nb * (nb + 1) / 2;
            qa = calloc((size_t)(nb * nb), 1);
            pairs = malloc((size_t)np * sizeof *pairs);
            qp = malloc((size_t)D * sizeof(float));
            ok = qa && pairs && qp;
            int64_t w = 0, rows_q = 0;
            for (int64_t m = mfirst; ok && m < nb; m++, rows_q++) {
                mean_rows(q, b, h, s->q_off, mi_cpu_max64(m * MI_BS, s->q_off),
                          mi_cpu_min64(m * MI_BS + MI_BS, len), D, scale, qp, row);
                const int64_t w0 = w;
                float rm = -INFINITY;
                for (int64_t n = 0; n <= m; n++) {
                    pairs[w] = (pair){mi_cpu_dot8(qp, kp + n * D, D), (int32_t)m, (int32_t)n};
                    rm = pairs[w].v > rm ? pairs[w].v : rm;
                    w++;
                }
                double rs = 0.0;
                for (int64_t i = w0; i < w; i++) rs += (pairs[i].v = expf(pairs[i].v - rm));
                for (int64_t i = w0; i < w; i++) pairs[i].v = (float)(pairs[i].v / rs);
            }
            if (ok) {
                qsort(pairs, (size_t)w, sizeof *pairs, desc_pair);
                const double need = gamma * (double)rows_q;
                double c = 0.0;
                for (int64_t i = 0; i < w && c < need; i++) {
                    qa[pairs[i].m * nb + pairs[i].n] = 1;
                    c += pairs[i].v;
                }
            }
        }
    }
    all = all || !ok;
    for (int64_t m = mfirst; m < nb && m < row_blocks; m++) {
        int32_t *offs = block_offset + m * max_blocks;
        int32_t c = 0;
        for (int64_t n = 0; n <= m && c < max_blocks; n++) {
            const bool keep = all || (mark[n] & 1) || (mark[m - n] & 2) || (qa && qa[m * nb + n]);
            if (keep) offs[c++] = (int32_t)(n * MI_BS);
        }
        block_count[m] = c;
    }
    free(vert);
    free(slash);
    free(tmp);
    free(kp);
    free(vb);
    free(mark);
    free(vsel);
    free(qa);
    free(pairs);
    free(qp);
}
