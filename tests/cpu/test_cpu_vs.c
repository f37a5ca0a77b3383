/*
 * test_cpu_vs.c: vertical-slash estimation (mi_vs_estimate) and index conversion
 * (mi_vs_build_index), then the sparse kernel on the built index.
 *  - the worked example of docs/algorithms.md §2, exactly, from clean and from messy (shuffled,
 *    duplicated, out-of-range) inputs;
 *  - random sets, with and without small distances: every column < its row block start, sorted,
 *    unique; every causal pair named by the sets is covered; the index equals a one-step-per-
 *    distance reference walk (also on bands of distances, which the library skips in runs); the
 *    sparse output equals the float64 reference under the built index expanded to elements;
 *  - estimation: planted columns and diagonals are found, forced entries always present, minimum
 *    budgets and clamping to the length, output order, and a float64 re-computation of the
 *    column / diagonal sums confirms the selection is a true top-k;
 *  - budgets >= L give dense attention.
 */
#include "test_qkvo.h"

static int cmp_int(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void worked_example(mi_context *ctx, bool messy) {
    const int64_t L = 300;
    const int32_t R = 5;
    vs_buf vb = vs_new(1, 1, 12, 12);
    const int32_t clean_v[] = {0, 3, 10, 64, 100, 130, 250};
    const int32_t clean_s[] = {200, 150, 70, 5, 2, 1, 0};
    const int32_t messy_v[] = {250, 64, -4, 0, 130, 3, 300, 100, 10, 3, 1000};
    const int32_t messy_s[] = {1, 0, 150, 70, -1, 5, 2, 200, 0, 300, 150, 512};
    const int32_t *vv = messy ? messy_v : clean_v, *ss = messy ? messy_s : clean_s;
    const int32_t nv = messy ? 11 : 7, ns = messy ? 12 : 7;
    memcpy(vb.x.vertical_idx, vv, (size_t)nv * 4);
    memcpy(vb.x.slash_idx, ss, (size_t)ns * 4);
    vb.x.vertical_count[0] = nv;
    vb.x.slash_count[0] = ns;
    sparse_buf sb = sparse_new(1, 1, R, 13, 12);
    CHECK_OK(mi_vs_build_index(ctx, L, NULL, &vb.x, &sb.x));
    const int32_t want_offs[] = {56, 120, 186, 251, 315};
    const int32_t want_cols[] = {0, 3, 10, 250};
    CHECK(sb.x.block_count[4] == 5, "worked example%s: block_count %d, want 5",
          messy ? " (messy)" : "", sb.x.block_count[4]);
    CHECK(sb.x.column_count[4] == 4, "worked example%s: column_count %d, want 4",
          messy ? " (messy)" : "", sb.x.column_count[4]);
    if (sb.x.block_count[4] == 5)
        CHECK(memcmp(sb.x.block_offset + 4 * 13, want_offs, sizeof want_offs) == 0,
              "worked example offsets");
    if (sb.x.column_count[4] == 4)
        CHECK(memcmp(sb.x.column_index + 4 * 12, want_cols, sizeof want_cols) == 0,
              "worked example columns");
    free(sb.mem);
    free(vb.mem);
}

/* The merge of docs/algorithms.md §2 one step per distance, the reference for the library's walk,
 * which skips runs of distances that change nothing. V ascending, S descending, both unique and
 * within the sequence. */
static void ref_walk(const int32_t *V, int32_t nv, const int32_t *S, int32_t ns, int64_t start,
                     int32_t max_b, int32_t max_c, int32_t *offs, int32_t *bc, int32_t *cols,
                     int32_t *cc) {
    const int64_t end = start + 64;
    int32_t si = 0, vi = 0;
    int64_t rs = 0, re = 0;
    *bc = *cc = 0;
    while (si < ns && S[si] >= end) si++;
    if (si < ns) {
        const int64_t e = end - S[si] > 64 ? end - S[si] : 64;
        si++;
        rs = e - 64;
        re = e;
        for (;;) {
            if (vi < nv && V[vi] < re) {
                if (V[vi] < rs && *cc < max_c) cols[(*cc)++] = V[vi];
                vi++;
                continue;
            }
            const bool last = si >= ns;
            const int64_t e2 = last ? 0 : (end - S[si] > 64 ? end - S[si] : 64);
            if (last || e2 > re + 64) {
                for (int64_t x = rs; x < re; x += 64)
                    if (*bc < max_b) offs[(*bc)++] = (int32_t)x;
                if (last) break;
                rs = e2 - 64;
                re = e2;
            } else if (e2 > re) {
                re += 64;
            }
            si++;
        }
    }
    for (; vi < nv && V[vi] < start; vi++)
        if (V[vi] >= re && *cc < max_c) cols[(*cc)++] = V[vi];
}

/* Structural checks of a built index plus coverage of the sets it was built from, and equality
 * with the reference walk. */
static void check_index(const char *what, const mi_sparse_index *x, int64_t L, const int32_t *lens,
                        const mi_vs_index *vs) {
    const int64_t R = x->row_blocks;
    for (int64_t b = 0; b < x->batch; b++) {
        const int64_t len = lens ? lens[b] : L;
        for (int64_t h = 0; h < x->heads; h++) {
            const int64_t bh = b * x->heads + h;
            /* the sets, filtered, for coverage */
            unsigned char *inV = calloc((size_t)L + 1, 1), *inS = calloc((size_t)L + 1, 1);
            for (int32_t i = 0; i < vs->vertical_count[bh]; i++) {
                const int32_t c = vs->vertical_idx[bh * vs->max_vertical + i];
                if (c >= 0 && c < len) inV[c] = 1;
            }
            for (int32_t i = 0; i < vs->slash_count[bh]; i++) {
                const int32_t d = vs->slash_idx[bh * vs->max_slash + i];
                if (d >= 0 && d < len) inS[d] = 1;
            }
            unsigned char *row = malloc((size_t)L + 1);
            int32_t *V = malloc(((size_t)L + 1) * 4), *S = malloc(((size_t)L + 1) * 4);
            int32_t nv = 0, ns = 0;
            for (int64_t j = 0; j < len; j++)
                if (inV[j]) V[nv++] = (int32_t)j;
            for (int64_t d = len - 1; d >= 0; d--)
                if (inS[d]) S[ns++] = (int32_t)d;
            int32_t *want_offs = malloc((size_t)x->max_blocks * 4 + 4);
            int32_t *want_cols = malloc((size_t)x->max_columns * 4 + 4);
            for (int64_t m = 0; m < R; m++) {
                const int32_t bc = x->block_count[bh * R + m], cc = x->column_count[bh * R + m];
                const int32_t *offs = x->block_offset + (bh * R + m) * x->max_blocks;
                const int32_t *cols = x->column_index + (bh * R + m) * x->max_columns;
                const int64_t start = 64 * m;
                CHECK(bc >= 0 && bc <= x->max_blocks && cc >= 0 && cc <= x->max_columns,
                      "%s: counts %d/%d outside capacity", what, bc, cc);
                if (start >= len) {
                    CHECK(bc == 0 && cc == 0, "%s: row block %lld after the sequence has keys",
                          what, (long long)m);
                    continue;
                }
                for (int32_t i = 0; i < cc; i++) {
                    CHECK(cols[i] >= 0 && cols[i] < start, "%s: column %d not < start %lld", what,
                          cols[i], (long long)start);
                    if (i > 0) CHECK(cols[i] > cols[i - 1], "%s: columns not ascending", what);
                }
                memset(row, 0, (size_t)L + 1);
                for (int32_t i = 0; i < bc; i++) {
                    if (i > 0) CHECK(offs[i] > offs[i - 1], "%s: offsets not ascending", what);
                    for (int64_t j = offs[i]; j < offs[i] + 64; j++)
                        if (j >= 0 && j < L) {
                            CHECK(!row[j] || j >= len, "%s: key %lld listed twice", what,
                                  (long long)j);
                            row[j] = 1;
                        }
                }
                for (int32_t i = 0; i < cc; i++) {
                    CHECK(!row[cols[i]], "%s: column %d inside a range", what, cols[i]);
                    row[cols[i]] = 1;
                }
                /* coverage: every causal pair named by a diagonal, by a vertical left of the
                 * block, or by a vertical inside the block when d = 0 is in the set */
                const int64_t end = start + 64 < len ? start + 64 : len;
                int64_t missing = 0;
                for (int64_t i = start; i < end; i++)
                    for (int64_t j = 0; j <= i; j++) {
                        const bool named = inS[i - j] || (inV[j] && (j < start || inS[0]));
                        if (named && !row[j]) missing++;
                    }
                CHECK(missing == 0, "%s: row block %lld misses %lld named pairs", what,
                      (long long)m, (long long)missing);
                int32_t wb, wc;
                ref_walk(V, nv, S, ns, start, x->max_blocks, x->max_columns, want_offs, &wb,
                         want_cols, &wc);
                CHECK(bc == wb && cc == wc && !memcmp(offs, want_offs, (size_t)bc * 4) &&
                          !memcmp(cols, want_cols, (size_t)cc * 4),
                      "%s: row block %lld differs from the reference walk (%d/%d ranges, %d/%d "
                      "columns)",
                      what, (long long)m, bc, wb, cc, wc);
            }
            free(want_offs);
            free(want_cols);
            free(V);
            free(S);
            free(row);
            free(inV);
            free(inS);
        }
    }
}

typedef struct vs_case {
    mi_dtype dt;
    bool blhd;
    int64_t B, Hq, Hkv, L, D;
    int32_t seq_lens[2];
    bool use_lens;
    int32_t nv, ns; /* random set sizes */
    bool small_d;   /* include distances 0..63 */
    bool band;      /* distances mostly one run 0, 1, 2, ... (long runs the walk skips) */
} vs_case;

/* Random sets -> build -> sparse, against the reference under the expanded index. */
static void random_sets(mi_context *ctx, const vs_case *c, rng *r) {
    char name[160];
    snprintf(name, sizeof name, "vs index %s L%lld B%lld Hq%lld nv %d ns %d%s%s",
             mi_dtype_name(c->dt), (long long)c->L, (long long)c->B, (long long)c->Hq, c->nv, c->ns,
             c->small_d ? "" : " (no small d)", c->use_lens ? " varlen" : "");
    const int32_t R = (int32_t)((c->L + 63) / 64);
    vs_buf vb = vs_new((int32_t)c->B, (int32_t)c->Hq, c->nv, c->ns);
    for (int64_t bh = 0; bh < c->B * c->Hq; bh++) {
        vb.x.vertical_count[bh] = c->nv;
        vb.x.slash_count[bh] = c->ns;
        for (int32_t i = 0; i < c->nv; i++)
            vb.x.vertical_idx[bh * c->nv + i] = (int32_t)(rng_int(r, c->L + 20) - 10);
        for (int32_t i = 0; i < c->ns; i++) {
            int64_t d = rng_int(r, c->L + 20) - 10;
            if (c->band && rng_int(r, 8) != 0) d = i; /* a band with a few strays */
            if (c->small_d && i < 3) d = i;           /* 0, 1, 2 */
            if (!c->small_d && d >= 0 && d < 64) d += 64;
            vb.x.slash_idx[bh * c->ns + i] = (int32_t)d;
        }
    }
    sparse_buf sb = sparse_new((int32_t)c->B, (int32_t)c->Hq, R, c->ns + 1, c->nv);
    const int32_t *lens = c->use_lens ? c->seq_lens : NULL;
    CHECK_OK(mi_vs_build_index(ctx, c->L, lens, &vb.x, &sb.x));
    check_index(name, &sb.x, c->L, lens, &vb.x);

    qkvo t = qkvo_new(c->dt, c->blhd, c->B, c->Hq, c->Hkv, c->L, c->D, 1.5, r);
    qkvo_nan_padding(&t, lens);
    CHECK_OK(mi_attention_sparse(ctx, &t.q.t, &t.k.t, &t.v.t, lens, &sb.x, 0.0f, &t.o.t, t.lse));
    key_mask km = key_mask_from_index(&sb.x, c->L);
    qkvo_check(name, &t, lens, 0.0, mask_keys, &km);
    free(km.keys);
    qkvo_free(&t);
    free(sb.mem);
    free(vb.mem);
}

/* float64 column and diagonal sums of docs/algorithms.md §1 for (b, h), forced entries +inf. */
static void ref_vs_sums(const tbuf *q, const tbuf *k, int64_t b, int64_t h, int64_t len,
                        const mi_vs_params *p, double *vert, double *slash) {
    const int64_t D = q->D, hk = h / (q->H / k->H), n = p->last_q < len ? p->last_q : len;
    const double scale = 1.0 / sqrt((double)D);
    double *s = malloc((size_t)len * sizeof(double));
    for (int64_t j = 0; j < len; j++) vert[j] = slash[j] = 0.0;
    for (int64_t i = len - n; i < len; i++) {
        const double *qi = q->ref + ((b * q->H + h) * q->L + i) * D;
        double mx = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j <= i; j++) {
            const double *kj = k->ref + ((b * k->H + hk) * k->L + j) * D;
            double dot = 0.0;
            for (int64_t d = 0; d < D; d++) dot += qi[d] * kj[d];
            s[j] = dot * scale;
            if (s[j] > mx) mx = s[j];
        }
        for (int64_t j = 0; j <= i; j++) sum += exp(s[j] - mx);
        for (int64_t j = 0; j <= i; j++) {
            const double pr = exp(s[j] - mx) / sum;
            vert[j] += pr;
            slash[i - j] += pr;
        }
    }
    for (int64_t j = 0; j < p->forced_columns && j < len; j++) vert[j] = INFINITY;
    for (int64_t d = 0; d < p->forced_diagonals && d < len; d++) slash[d] = INFINITY;
    free(s);
}

/* sel (count n, sorted) is a top-n of val[0..len) up to tol. */
static bool is_topk(const double *val, int64_t len, const int32_t *sel, int32_t n, double tol) {
    unsigned char *in = calloc((size_t)len + 1, 1);
    double lo = INFINITY, hi = -INFINITY;
    for (int32_t i = 0; i < n; i++) {
        if (sel[i] < 0 || sel[i] >= len || in[sel[i]]) {
            free(in);
            return false;
        }
        in[sel[i]] = 1;
        if (val[sel[i]] < lo) lo = val[sel[i]];
    }
    for (int64_t j = 0; j < len; j++)
        if (!in[j] && val[j] > hi) hi = val[j];
    free(in);
    return hi <= lo + tol;
}

static void estimate_random(mi_context *ctx, mi_dtype dt, bool blhd, int64_t B, int64_t Hq,
                            int64_t Hkv, int64_t L, int64_t D, const int32_t *lens,
                            const int32_t *vsz, const int32_t *ssz, const mi_vs_params *p, rng *r) {
    char name[160];
    snprintf(name, sizeof name, "vs estimate %s L%lld B%lld Hq%lld Hkv%lld D%lld last_q %d",
             mi_dtype_name(dt), (long long)L, (long long)B, (long long)Hq, (long long)Hkv,
             (long long)D, p->last_q);
    tbuf q = tb_new(dt, blhd, B, Hq, L, D), k = tb_new(dt, blhd, B, Hkv, L, D);
    tb_fill_normal(&q, r, 2.0);
    tb_fill_normal(&k, r, 1.0);
    tb_nan_padding(&q, lens);
    tb_nan_padding(&k, lens);
    int32_t maxv = 0, maxs = 0;
    for (int64_t h = 0; h < Hq; h++) {
        const int32_t a = vsz[h] > p->min_vertical ? vsz[h] : p->min_vertical;
        const int32_t c = ssz[h] > p->min_slash ? ssz[h] : p->min_slash;
        maxv = a > maxv ? a : maxv;
        maxs = c > maxs ? c : maxs;
    }
    maxv = maxv < L ? maxv : (int32_t)L;
    maxs = maxs < L ? maxs : (int32_t)L;
    vs_buf vb = vs_new((int32_t)B, (int32_t)Hq, maxv, maxs);
    memset(vb.x.vertical_idx, 0xff, (size_t)(B * Hq * maxv) * 4);
    CHECK_OK(mi_vs_estimate(ctx, &q.t, &k.t, lens, vsz, ssz, p, 0.0f, &vb.x));
    double *vert = malloc((size_t)L * sizeof(double)), *slash = malloc((size_t)L * sizeof(double));
    for (int64_t b = 0; b < B; b++) {
        const int64_t len = lens ? lens[b] : L;
        for (int64_t h = 0; h < Hq; h++) {
            const int64_t bh = b * Hq + h;
            int64_t wv = vsz[h] > p->min_vertical ? vsz[h] : p->min_vertical;
            int64_t ws = ssz[h] > p->min_slash ? ssz[h] : p->min_slash;
            wv = wv < len ? wv : len;
            ws = ws < len ? ws : len;
            const int32_t nv = vb.x.vertical_count[bh], ns = vb.x.slash_count[bh];
            CHECK(nv == wv && ns == ws, "%s: counts %d/%d, want %lld/%lld (b %lld h %lld)", name,
                  nv, ns, (long long)wv, (long long)ws, (long long)b, (long long)h);
            if (nv != wv || ns != ws) continue;
            const int32_t *vi = vb.x.vertical_idx + bh * maxv, *si = vb.x.slash_idx + bh * maxs;
            for (int32_t i = 1; i < nv; i++)
                CHECK(vi[i] > vi[i - 1], "%s: verticals not ascending", name);
            for (int32_t i = 1; i < ns; i++)
                CHECK(si[i] < si[i - 1], "%s: slashes not descending", name);
            if (len == 0) continue;
            ref_vs_sums(&q, &k, b, h, len, p, vert, slash);
            int32_t *sorted = malloc((size_t)(ns > 0 ? ns : 1) * 4);
            memcpy(sorted, si, (size_t)ns * 4);
            qsort(sorted, (size_t)ns, 4, cmp_int);
            /* sums of probabilities over <= last_q rows: fp32 error well below 1e-4 */
            CHECK(is_topk(vert, len, vi, nv, 1e-4),
                  "%s: verticals are not a top-%d (b %lld h %lld)", name, nv, (long long)b,
                  (long long)h);
            CHECK(is_topk(slash, len, sorted, ns, 1e-4), "%s: slashes are not a top-%d", name, ns);
            /* forced entries present whenever the budget allows */
            const int64_t fc = p->forced_columns < len ? p->forced_columns : len;
            const int64_t fd = p->forced_diagonals < len ? p->forced_diagonals : len;
            for (int64_t j = 0; j < fc && j < nv; j++)
                CHECK(vi[j] == j, "%s: forced column %lld missing", name, (long long)j);
            for (int64_t d = 0; d < fd && d < ns; d++)
                CHECK(sorted[d] == d, "%s: forced diagonal %lld missing", name, (long long)d);
            free(sorted);
        }
    }
    free(vert);
    free(slash);
    free(vb.mem);
    tb_free(&q);
    tb_free(&k);
}

/* Planted structure: the last rows attend strongly to 3 columns and to one diagonal, with
 * logits of about 8 each (balanced, so neither kind of structure hides the other). */
static void planted(mi_context *ctx, mi_dtype dt) {
    const int64_t L = 1000, D = 64;
    rng r = {check_seed + 99};
    tbuf q = tb_new(dt, false, 1, 2, L, D), k = tb_new(dt, false, 1, 1, L, D);
    const int32_t cols[3] = {137, 555, 800};
    const int64_t dslash = 300;
    /* dims 0..47: a random unit code per position; dims 48..63: the column magnet */
    double *code = malloc((size_t)L * 48 * sizeof(double));
    for (int64_t p = 0; p < L; p++) {
        double n2 = 0.0;
        for (int d = 0; d < 48; d++) {
            code[p * 48 + d] = rng_normal(&r);
            n2 += code[p * 48 + d] * code[p * 48 + d];
        }
        for (int d = 0; d < 48; d++) code[p * 48 + d] /= sqrt(n2);
    }
    for (int64_t j = 0; j < L; j++) {
        bool is_col = j == cols[0] || j == cols[1] || j == cols[2];
        for (int d = 0; d < 48; d++) tb_set(&k, 0, 0, j, d, 8.0 * code[j * 48 + d]);
        for (int d = 48; d < 64; d++) tb_set(&k, 0, 0, j, d, is_col ? 2.0 : 0.1 * rng_normal(&r));
    }
    for (int64_t h = 0; h < 2; h++)
        for (int64_t i = 0; i < L; i++) {
            const int64_t src = i - dslash;
            for (int d = 0; d < 48; d++)
                tb_set(&q, 0, h, i, d, src >= 0 ? 8.0 * code[src * 48 + d] : 0.0);
            for (int d = 48; d < 64; d++) tb_set(&q, 0, h, i, d, 2.0);
        }
    mi_vs_params p = mi_vs_default_params();
    const int32_t vsz[2] = {33, 0}, ssz[2] = {101, 0};
    vs_buf vb = vs_new(1, 2, 50, 101);
    CHECK_OK(mi_vs_estimate(ctx, &q.t, &k.t, NULL, vsz, ssz, &p, 0.0f, &vb.x));
    /* head 0: 30 forced + the 3 planted columns; 100 forced diagonals + the planted one */
    CHECK(vb.x.vertical_count[0] == 33 && vb.x.slash_count[0] == 101, "planted: counts %d %d",
          vb.x.vertical_count[0], vb.x.slash_count[0]);
    int32_t want_v[33];
    for (int i = 0; i < 30; i++) want_v[i] = i;
    memcpy(want_v + 30, cols, sizeof cols);
    CHECK(memcmp(vb.x.vertical_idx, want_v, sizeof want_v) == 0,
          "planted [%s]: columns %d %d %d, want 137 555 800", mi_dtype_name(dt),
          vb.x.vertical_idx[30], vb.x.vertical_idx[31], vb.x.vertical_idx[32]);
    CHECK(vb.x.slash_idx[0] == dslash && vb.x.slash_idx[1] == 99 && vb.x.slash_idx[100] == 0,
          "planted [%s]: slashes start %d %d, end %d", mi_dtype_name(dt), vb.x.slash_idx[0],
          vb.x.slash_idx[1], vb.x.slash_idx[100]);
    /* head 1: zero budgets -> the minimum budgets (30 / 50), the first columns and diagonals */
    CHECK(vb.x.vertical_count[1] == 30 && vb.x.slash_count[1] == 50, "minimum budgets: %d %d",
          vb.x.vertical_count[1], vb.x.slash_count[1]);
    bool forced_ok = true;
    for (int i = 0; i < 30; i++) forced_ok &= vb.x.vertical_idx[50 + i] == i;
    for (int i = 0; i < 50; i++) forced_ok &= vb.x.slash_idx[101 + i] == 49 - i;
    CHECK(forced_ok, "minimum budgets: not the forced entries");
    free(code);
    free(vb.mem);
    tb_free(&q);
    tb_free(&k);
}

/* Budgets >= L: the estimated index covers every causal key, the result is dense attention. */
static void full_budget(mi_context *ctx, mi_dtype dt, int64_t L, rng *r) {
    const int64_t B = 2, Hq = 4, Hkv = 1, D = 64;
    const int32_t lens[2] = {(int32_t)L, (int32_t)(L / 2)};
    qkvo t = qkvo_new(dt, true, B, Hq, Hkv, L, D, 1.5, r);
    const int32_t big[4] = {(int32_t)L + 5, (int32_t)L + 5, (int32_t)L + 5, (int32_t)L + 5};
    mi_vs_params p = mi_vs_default_params();
    vs_buf vb = vs_new((int32_t)B, (int32_t)Hq, (int32_t)L, (int32_t)L);
    const int32_t R = (int32_t)((L + 63) / 64);
    sparse_buf sb = sparse_new((int32_t)B, (int32_t)Hq, R, (int32_t)L + 1, (int32_t)L);
    CHECK_OK(mi_vs_estimate(ctx, &t.q.t, &t.k.t, lens, big, big, &p, 0.0f, &vb.x));
    CHECK_OK(mi_vs_build_index(ctx, L, lens, &vb.x, &sb.x));
    CHECK_OK(mi_attention_sparse(ctx, &t.q.t, &t.k.t, &t.v.t, lens, &sb.x, 0.0f, &t.o.t, t.lse));
    qkvo_check("vs full budget = dense", &t, lens, 1.0 / 8.0, mask_all, NULL);
    free(sb.mem);
    free(vb.mem);
    qkvo_free(&t);
}

int main(int argc, char **argv) {
    check_seed = test_seed(argc, argv, 31337);
    rng r = {check_seed};
    mi_context *ctx = test_context();
    worked_example(ctx, false);
    worked_example(ctx, true);
    const vs_case cases[] = {
        {MI_DTYPE_F32, false, 1, 1, 1, 1, 64, {0, 0}, false, 3, 3, true, false},
        {MI_DTYPE_F32, true, 1, 2, 1, 63, 64, {0, 0}, false, 5, 4, true, false},
        {MI_DTYPE_F16, false, 1, 4, 1, 64, 128, {0, 0}, false, 8, 6, false, false},
        {MI_DTYPE_BF16, true, 1, 8, 1, 65, 64, {0, 0}, false, 8, 6, true, false},
        {MI_DTYPE_F32, false, 1, 4, 1, 1000, 128, {0, 0}, false, 40, 30, true, false},
        {MI_DTYPE_F32, true, 1, 2, 2, 1000, 64, {0, 0}, false, 40, 30, false, false},
        {MI_DTYPE_F16, false, 2, 4, 2, 700, 64, {700, 250}, true, 25, 40, true, false},
        {MI_DTYPE_BF16, false, 2, 2, 1, 300, 128, {0, 299}, true, 0, 10, false, false},
        {MI_DTYPE_F32, false, 1, 1, 1, 300, 64, {0, 0}, false, 10, 0, true, false},
        {MI_DTYPE_F32, false, 1, 1, 1, 4099, 128, {0, 0}, false, 200, 300, true, false},
        {MI_DTYPE_F32, false, 1, 2, 1, 3000, 64, {0, 0}, false, 60, 400, true, true},
        {MI_DTYPE_BF16, true, 2, 2, 2, 2000, 64, {2000, 1300}, true, 30, 700, false, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) random_sets(ctx, &cases[i], &r);

    mi_vs_params p = mi_vs_default_params();
    const int32_t v4[4] = {0, 40, 100, 5000}, s4[4] = {0, 60, 200, 5000};
    estimate_random(ctx, MI_DTYPE_F32, false, 1, 4, 1, 1000, 128, NULL, v4, s4, &p, &r);
    estimate_random(ctx, MI_DTYPE_BF16, true, 1, 4, 4, 1, 64, NULL, v4, s4, &p, &r);
    estimate_random(ctx, MI_DTYPE_F16, false, 1, 4, 2, 40, 64, NULL, v4, s4, &p, &r);
    const int32_t lens2[2] = {333, 65};
    estimate_random(ctx, MI_DTYPE_F32, true, 2, 4, 1, 400, 64, lens2, v4, s4, &p, &r);
    mi_vs_params p2 = p;
    p2.last_q = 150; /* more than one 64-row chunk */
    p2.forced_columns = 0;
    p2.forced_diagonals = 3;
    p2.min_vertical = 0;
    p2.min_slash = 1;
    estimate_random(ctx, MI_DTYPE_F32, false, 1, 4, 2, 500, 64, NULL, v4, s4, &p2, &r);
    const int32_t lens3[2] = {0, 64};
    estimate_random(ctx, MI_DTYPE_F16, false, 2, 4, 1, 64, 64, lens3, v4, s4, &p, &r);

    planted(ctx, MI_DTYPE_F32);
    planted(ctx, MI_DTYPE_BF16);
    full_budget(ctx, MI_DTYPE_F32, 300, &r);
    full_budget(ctx, MI_DTYPE_F16, 65, &r);
    mi_context_destroy(ctx);
    return check_finish("test_cpu_vs");
}
