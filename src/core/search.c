/*
 * search.c: offline per-head pattern search (docs/algorithms.md §6), built only on the public
 * metrics and kernels, so it measures exactly what the runtime will compute and never holds an
 * L x L matrix.
 *
 * Every mode runs the same loop: for each candidate family, choose a budget scale per head (fixed,
 * FLOPs-matched or recall-targeted), measuring all heads of the layer in one mi_metrics_evaluate
 * call per step; then optionally score the kernel's output error, and pick a winner per head.
 */
#include "internal.h"
#include "pattern_table.h"

#include <stdlib.h>
#include <string.h>

/* Relative density tolerance at which the FLOPs match stops refining a head. */
#define MI_SEARCH_DENSITY_TOL 0.03

mi_search_params mi_search_default_params(void) {
    mi_search_params p;
    memset(&p, 0, sizeof p);
    p.candidates = NULL;
    p.n_candidates = 0;
    p.mode = MI_SEARCH_FIXED;
    p.target_density = 0.1;
    p.target_recall = 0.95;
    p.error_weight = 1.0;
    p.max_scale = 64.0;
    p.min_scale = 1.0 / 64.0;
    p.iterations = 6;
    p.prefill = mi_prefill_default_params();
    p.prefill.dense_below = 0;
    return p;
}

mi_status mi_search_default_candidates(int64_t sample_len, mi_head_pattern *out, int32_t capacity,
                                       int32_t *count) {
    if (!out || !count) return mi_fail(NULL, MI_STATUS_INVALID_ARGUMENT, "out and count required");
    if (sample_len <= 0 || sample_len > INT32_MAX)
        return mi_fail(NULL, MI_STATUS_INVALID_ARGUMENT, "sample_len %lld is out of range",
                       (long long)sample_len);
    static const int32_t vs[5][2] = {{30, 800}, {100, 750}, {500, 700}, {3500, 100}, {1000, 6096}};
    if (capacity < 7)
        return mi_fail(NULL, MI_STATUS_WORKSPACE_TOO_SMALL, "7 candidates, capacity %d", capacity);
    out[0] = mi_head_pattern_default(MI_PATTERN_A_SHAPE);
    out[0].n_init = 100;
    out[0].n_local = 800;
    for (int i = 0; i < 5; i++) {
        out[1 + i] = mi_head_pattern_default(MI_PATTERN_VERTICAL_SLASH);
        out[1 + i].vertical_size = vs[i][0];
        out[1 + i].slash_size = vs[i][1];
    }
    /* The original keeps 1/8 of the blocks of each block row; top_k is our kernel's form. */
    const int64_t rows = (sample_len + MI_BLOCK_SIZE - 1) / MI_BLOCK_SIZE;
    out[6] = mi_head_pattern_default(MI_PATTERN_BLOCK_SPARSE);
    out[6].top_k = (int32_t)((rows + 7) / 8);
    *count = 7;
    return MI_STATUS_SUCCESS;
}

static void scale_pattern(const mi_head_pattern *base, double s, mi_head_pattern *out) {
    mi_pattern_scale(base, s, out);
}

mi_status mi_search_scale_pattern(const mi_head_pattern *base, double s, mi_head_pattern *out) {
    if (!base || !out) return mi_fail(NULL, MI_STATUS_INVALID_ARGUMENT, "base and out required");
    if (!(s > 0.0) || !isfinite(s))
        return mi_fail(NULL, MI_STATUS_INVALID_ARGUMENT, "scale %g must be positive", s);
    if (!mi_pattern_valid(base))
        return mi_fail(NULL, MI_STATUS_INVALID_ARGUMENT, "invalid pattern");
    scale_pattern(base, s, out);
    return MI_STATUS_SUCCESS;
}

/* One candidate's per-head measurements, batch folded in. */
typedef struct head_eval {
    double recall, density, flops, dense_flops;
} head_eval;

typedef struct search_run {
    mi_context *ctx;
    const mi_tensor *q, *k, *v;
    const int32_t *seq_lens;
    const mi_search_params *p;
    int64_t B, H, L, D;
    mi_head_pattern *pats; /* [H] scratch */
    mi_head_metrics *met;  /* [B * H] scratch */
} search_run;

/* Measures the candidate at per-head scales s[H]; out [H]. */
static mi_status measure(search_run *r, const mi_head_pattern *base, const double *s,
                         head_eval *out) {
    for (int64_t h = 0; h < r->H; h++) scale_pattern(base, s[h], &r->pats[h]);
    mi_status st =
        mi_metrics_evaluate(r->ctx, r->q, r->k, r->seq_lens, r->pats, &r->p->prefill, r->met);
    if (st != MI_STATUS_SUCCESS) return st;
    for (int64_t h = 0; h < r->H; h++) {
        head_eval e = {0, 0, 0, 0};
        for (int64_t b = 0; b < r->B; b++) {
            const mi_head_metrics *m = &r->met[b * r->H + h];
            e.recall += m->recall;
            e.density += m->density;
            e.flops += m->flops;
            e.dense_flops += m->dense_flops;
        }
        e.recall /= (double)r->B;
        e.density /= (double)r->B;
        out[h] = e;
    }
    return MI_STATUS_SUCCESS;
}

static double log_density(double d) { return log(d > 1e-12 ? d : 1e-12); }

/*
 * FLOPs match: per head, a safeguarded secant on log(scale) -> log(density), which is close to
 * linear (density grows about in proportion to the budget until it saturates). The bracket keeps
 * it from wandering when a floor (forced keys, minimum budgets) or the ceiling flattens it.
 */
static mi_status match_flops(search_run *r, const mi_head_pattern *base, double *scale,
                             head_eval *best) {
    const int64_t H = r->H;
    const double lt = log(r->p->target_density);
    double *lo = malloc(sizeof(double) * (size_t)H * 5);
    if (!lo) return mi_fail(r->ctx, MI_STATUS_OUT_OF_MEMORY, "search: out of memory");
    double *hi = lo + H, *dlo = lo + 2 * H, *dhi = lo + 3 * H, *s = lo + 4 * H;
    head_eval *cur = malloc(sizeof(head_eval) * (size_t)H);
    if (!cur) {
        free(lo);
        return mi_fail(r->ctx, MI_STATUS_OUT_OF_MEMORY, "search: out of memory");
    }
    for (int64_t h = 0; h < H; h++) {
        lo[h] = log(r->p->min_scale);
        hi[h] = log(r->p->max_scale);
        dlo[h] = dhi[h] = NAN;
        s[h] = 1.0;
        best[h].density = -1.0;
        scale[h] = 1.0;
    }
    mi_status st = MI_STATUS_SUCCESS;
    /* A dense candidate has one cost; no scale changes it. */
    const int steps = !mi_pattern_has_budget(base->type) ? 1 : r->p->iterations + 2;
    for (int it = 0; it < steps; it++) {
        if ((st = measure(r, base, s, cur)) != MI_STATUS_SUCCESS) break;
        bool all_done = true;
        for (int64_t h = 0; h < H; h++) {
            const double x = log(s[h]), ld = log_density(cur[h].density);
            const double err = fabs(ld - lt);
            if (best[h].density < 0 || err < fabs(log_density(best[h].density) - lt)) {
                best[h] = cur[h];
                scale[h] = s[h];
            }
            if (ld < lt) {
                lo[h] = x;
                dlo[h] = ld;
            } else {
                hi[h] = x;
                dhi[h] = ld;
            }
            double nx;
            if (!isnan(dlo[h]) && !isnan(dhi[h]) && dhi[h] > dlo[h])
                nx = lo[h] + (lt - dlo[h]) * (hi[h] - lo[h]) / (dhi[h] - dlo[h]);
            else
                nx = x + (lt - ld); /* slope 1: density proportional to budget */
            /* Stay strictly inside the bracket so every step shrinks it. */
            const double w = hi[h] - lo[h], m = 0.1 * w;
            if (nx < lo[h] + m) nx = lo[h] + m;
            if (nx > hi[h] - m) nx = hi[h] - m;
            const bool done =
                fabs(log_density(best[h].density) - lt) < MI_SEARCH_DENSITY_TOL || w < 1e-3;
            if (!done) all_done = false;
            s[h] = done ? scale[h] : exp(nx);
        }
        if (all_done) break;
    }
    free(cur);
    free(lo);
    return st;
}

/*
 * Recall target: per head, the smallest scale whose recall reaches the target. Doubling (or
 * halving) from 1 brackets it, bisection on log(scale) narrows it. Recall grows with the budget,
 * so the bracket's upper end always meets the target once found. reached[h] says whether any
 * tried scale did; otherwise the largest scale's measurements are kept.
 */
static mi_status reach_recall(search_run *r, const mi_head_pattern *base, double *scale,
                              head_eval *best, bool *reached) {
    const int64_t H = r->H;
    const double target = r->p->target_recall;
    const double lmin = log(r->p->min_scale), lmax = log(r->p->max_scale);
    double *lo = malloc(sizeof(double) * (size_t)H * 3);
    int *phase = malloc(sizeof(int) * (size_t)H); /* 0 doubling, 1 halving, 2 bisect, 3 done */
    head_eval *cur = malloc(sizeof(head_eval) * (size_t)H);
    int *bis = calloc((size_t)H, sizeof(int));
    if (!lo || !phase || !cur || !bis) {
        free(lo);
        free(phase);
        free(cur);
        free(bis);
        return mi_fail(r->ctx, MI_STATUS_OUT_OF_MEMORY, "search: out of memory");
    }
    double *hi = lo + H, *s = lo + 2 * H;
    for (int64_t h = 0; h < H; h++) {
        s[h] = 1.0;
        phase[h] = -1; /* first measurement decides the direction */
        reached[h] = false;
        scale[h] = 1.0;
        lo[h] = lmin;
        hi[h] = lmax;
    }
    mi_status st = MI_STATUS_SUCCESS;
    const int max_steps = !mi_pattern_has_budget(base->type)
                              ? 1
                              : (int)ceil((lmax - lmin) / log(2.0)) + r->p->iterations + 2;
    for (int it = 0; it < max_steps; it++) {
        if ((st = measure(r, base, s, cur)) != MI_STATUS_SUCCESS) break;
        bool all_done = true;
        for (int64_t h = 0; h < H; h++) {
            if (phase[h] == 3) continue;
            const double x = log(s[h]);
            const bool ok = cur[h].recall >= target;
            if (ok) {
                /* Smallest passing scale so far: recall is monotone in the budget. */
                if (!reached[h] || s[h] <= scale[h]) {
                    best[h] = cur[h];
                    scale[h] = s[h];
                }
                reached[h] = true;
                hi[h] = x;
            } else {
                if (!reached[h] && (phase[h] < 0 || s[h] >= scale[h] || it == 0)) {
                    best[h] = cur[h];
                    scale[h] = s[h];
                }
                lo[h] = x;
            }
            if (phase[h] < 0 || phase[h] == 0 || phase[h] == 1) {
                if (phase[h] < 0) phase[h] = ok ? 1 : 0;
                if (phase[h] == 0 && ok)
                    phase[h] = 2; /* bracketed from below */
                else if (phase[h] == 1 && !ok)
                    phase[h] = 2; /* bracketed from above */
                else if (phase[h] == 0 && x + 1e-9 >= lmax)
                    phase[h] = 3;
                else if (phase[h] == 1 && x - 1e-9 <= lmin)
                    phase[h] = 3;
            }
            if (phase[h] == 2 && (bis[h]++ >= r->p->iterations || hi[h] - lo[h] < 0.02))
                phase[h] = 3;
            double nx = x;
            if (phase[h] == 0)
                nx = fmin(x + log(2.0), lmax);
            else if (phase[h] == 1)
                nx = fmax(x - log(2.0), lmin);
            else if (phase[h] == 2)
                nx = 0.5 * (lo[h] + hi[h]);
            if (phase[h] != 3) {
                all_done = false;
                s[h] = exp(nx);
            } else {
                s[h] = scale[h];
            }
        }
        if (all_done) break;
    }
    free(lo);
    free(phase);
    free(cur);
    free(bis);
    return st;
}

/* Relative output error of each head: out and ref [B, H, L, D] contiguous, in q's dtype. */
static mi_status head_errors(search_run *r, void *out, void *ref, double *err) {
    const size_t es = mi_dtype_size(r->q->dtype);
    for (int64_t h = 0; h < r->H; h++) {
        mi_tensor o = mi_tensor_bhld(out, r->q->dtype, MI_DEVICE_CPU, r->B, r->H, r->L, r->D);
        mi_tensor f = mi_tensor_bhld(ref, r->q->dtype, MI_DEVICE_CPU, r->B, r->H, r->L, r->D);
        /* A one-head view into the layer's buffer: same strides, offset data. */
        o.data = (char *)out + (size_t)(h * r->L * r->D) * es;
        f.data = (char *)ref + (size_t)(h * r->L * r->D) * es;
        o.shape[1] = f.shape[1] = 1;
        mi_status st = mi_metrics_rel_l2(r->ctx, &o, &f, r->seq_lens, &err[h]);
        if (st != MI_STATUS_SUCCESS) return st;
    }
    return MI_STATUS_SUCCESS;
}

static mi_status check_params(mi_context *ctx, const mi_search_params *p) {
    if (p->n_candidates < 0 || (p->n_candidates > 0 && !p->candidates) ||
        (p->candidates && p->n_candidates == 0))
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT,
                       "search: candidates and n_candidates "
                       "disagree");
    for (int32_t c = 0; c < p->n_candidates; c++)
        if (!mi_pattern_valid(&p->candidates[c]))
            return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "search: candidate %d is invalid", c);
    if (p->mode != MI_SEARCH_FIXED && p->mode != MI_SEARCH_FLOPS && p->mode != MI_SEARCH_ADAPTIVE)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "search: unknown mode %d", (int)p->mode);
    if (p->mode == MI_SEARCH_FLOPS && !(p->target_density > 0.0 && p->target_density <= 1.0))
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "search: target_density %g not in (0, 1]",
                       p->target_density);
    if (p->mode == MI_SEARCH_ADAPTIVE && !(p->target_recall > 0.0 && p->target_recall <= 1.0))
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "search: target_recall %g not in (0, 1]",
                       p->target_recall);
    if (!(p->error_weight >= 0.0) || !isfinite(p->error_weight))
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "search: error_weight must be >= 0");
    if (!(p->min_scale > 0.0) || !(p->max_scale >= p->min_scale) || !isfinite(p->max_scale) ||
        !(p->min_scale <= 1.0) || !(p->max_scale >= 1.0))
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT,
                       "search: need 0 < min_scale <= 1 <= max_scale (got %g, %g)", p->min_scale,
                       p->max_scale);
    if (p->iterations < 0 || p->iterations > 64)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "search: iterations %d not in [0, 64]",
                       p->iterations);
    return MI_STATUS_SUCCESS;
}

mi_status mi_search_layer(mi_context *ctx, const mi_tensor *q, const mi_tensor *k,
                          const mi_tensor *v, const int32_t *seq_lens,
                          const mi_search_params *params, mi_head_pattern *best, double *scores,
                          mi_head_metrics *metrics) {
    if (!ctx) return MI_STATUS_INVALID_ARGUMENT;
    mi_clear_error(ctx);
    if (ctx->params.device != MI_DEVICE_CPU)
        return mi_fail(ctx, MI_STATUS_UNSUPPORTED, "search runs on CPU contexts");
    if (!k || !v || !best)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "search: k, v and best are required");
    mi_attn_shape shape;
    mi_status st = mi_check_attention(ctx, q, k, v, NULL, seq_lens, &shape);
    if (st != MI_STATUS_SUCCESS) return st;
    mi_search_params p = params ? *params : mi_search_default_params();
    if ((st = check_params(ctx, &p)) != MI_STATUS_SUCCESS) return st;
    p.prefill.dense_below = 0; /* the search measures the sparse kernels at any length */

    mi_head_pattern defaults[7];
    if (!p.candidates) {
        st = mi_search_default_candidates(shape.len, defaults, 7, &p.n_candidates);
        if (st != MI_STATUS_SUCCESS) return mi_fail(ctx, st, "search: default candidates");
        p.candidates = defaults;
    }
    const int64_t H = shape.heads_q, C = p.n_candidates;
    search_run r = {ctx,  q,   k, v, seq_lens, &p, shape.batch, H, shape.len, shape.head_dim,
                    NULL, NULL};
    const size_t out_bytes =
        (size_t)(shape.batch * H * shape.len * shape.head_dim) * mi_dtype_size(shape.dtype);
    const bool use_err = p.error_weight > 0.0;
    r.pats = malloc(sizeof(mi_head_pattern) * (size_t)H);
    r.met = malloc(sizeof(mi_head_metrics) * (size_t)(shape.batch * H));
    double *scale = malloc(sizeof(double) * (size_t)(C * H));
    double *err = calloc((size_t)(C * H), sizeof(double));
    head_eval *ev = malloc(sizeof(head_eval) * (size_t)(C * H));
    bool *reached = malloc(sizeof(bool) * (size_t)(C * H));
    void *ref = use_err ? malloc(out_bytes) : NULL;
    void *out = use_err ? malloc(out_bytes) : NULL;
    if (!r.pats || !r.met || !scale || !err || !ev || !reached || (use_err && (!ref || !out))) {
        st = mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "search: out of memory");
        goto done;
    }

    for (int64_t c = 0; c < C; c++) {
        const mi_head_pattern *base = &p.candidates[c];
        double *sc = scale + c * H;
        head_eval *e = ev + c * H;
        bool *rc = reached + c * H;
        if (p.mode == MI_SEARCH_FLOPS) {
            st = match_flops(&r, base, sc, e);
        } else if (p.mode == MI_SEARCH_ADAPTIVE) {
            st = reach_recall(&r, base, sc, e, rc);
        } else {
            for (int64_t h = 0; h < H; h++) sc[h] = 1.0;
            st = measure(&r, base, sc, e);
        }
        if (st != MI_STATUS_SUCCESS) goto done;
    }

    if (use_err) {
        mi_tensor tref = mi_tensor_bhld(ref, shape.dtype, MI_DEVICE_CPU, shape.batch, H, shape.len,
                                        shape.head_dim);
        mi_tensor tout = mi_tensor_bhld(out, shape.dtype, MI_DEVICE_CPU, shape.batch, H, shape.len,
                                        shape.head_dim);
        st = mi_attention_dense(ctx, q, k, v, seq_lens, p.prefill.softmax_scale, &tref, NULL);
        if (st != MI_STATUS_SUCCESS) goto done;
        for (int64_t c = 0; c < C; c++) {
            for (int64_t h = 0; h < H; h++)
                scale_pattern(&p.candidates[c], scale[c * H + h], &r.pats[h]);
            st = mi_prefill_attention(ctx, q, k, v, seq_lens, r.pats, &p.prefill, &tout, NULL, NULL,
                                      0);
            if (st != MI_STATUS_SUCCESS) goto done;
            if ((st = head_errors(&r, out, ref, err + c * H)) != MI_STATUS_SUCCESS) goto done;
        }
    }

    for (int64_t h = 0; h < H; h++) {
        int64_t win = -1;
        double win_score = -INFINITY;
        for (int64_t c = 0; c < C; c++) {
            const head_eval *e = &ev[c * H + h];
            const double score = e->recall - p.error_weight * err[c * H + h];
            bool better;
            if (win < 0) {
                better = true;
            } else if (p.mode == MI_SEARCH_ADAPTIVE) {
                /* Reaching the target beats missing it; among those that reach it the cheaper
                 * wins; among those that miss it the higher score. */
                const bool rc = reached[c * H + h], rw = reached[win * H + h];
                const head_eval *w = &ev[win * H + h];
                if (rc != rw)
                    better = rc;
                else if (rc)
                    better = e->flops < w->flops;
                else
                    better = score > win_score;
            } else {
                better = score > win_score;
            }
            if (better) {
                win = c;
                win_score = score;
            }
        }
        scale_pattern(&p.candidates[win], scale[win * H + h], &best[h]);
        if (scores) scores[h] = win_score;
        if (metrics) {
            const head_eval *e = &ev[win * H + h];
            metrics[h].recall = e->recall;
            metrics[h].density = e->density;
            metrics[h].flops = e->flops;
            metrics[h].dense_flops = e->dense_flops;
        }
    }
    st = MI_STATUS_SUCCESS;

done:
    free(r.pats);
    free(r.met);
    free(scale);
    free(err);
    free(ev);
    free(reached);
    free(ref);
    free(out);
    return st;
}
