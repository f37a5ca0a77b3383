/*
 * test_search.c: the pattern search recovers planted patterns.
 *
 * Three hand-built heads whose attention logits are exact bilinear forms (softmax scale 1):
 *   head 0  sinks + a narrow local band             -> A-shape is the cheapest to cover it
 *   head 1  one far diagonal + scattered columns    -> vertical-slash
 *   head 2  64-key blocks grouped into topics       -> block-sparse
 * A Gaussian band -alpha (i - j - d)^2 is bilinear in (i, j) up to a per-row constant, which the
 * softmax ignores: 2 alpha (i - d) j - alpha j^2. A key given its own coordinate gets a
 * fixed logit boost instead, so sinks and columns stay flat across all rows.
 */
#include "../check.h"
#include "minference.h"
#include "minference_tools.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define L 1024
#define D 64
#define H 3
#define ALPHA 0.02

static float q[H * L * D], k[H * L * D], v[H * L * D];

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double uniform(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}
static double gauss(void) {
    double u = uniform() + 1e-12, w = uniform();
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * w);
}

/* Positions in units of 64 keep the quadratic terms small in fp32. */
static double pos(int i) { return (double)i / 64.0; }

static void build(void) {
    memset(q, 0, sizeof q);
    memset(k, 0, sizeof k);
    const double a = ALPHA * 64.0 * 64.0; /* alpha in position units of 64 */
    for (int h = 0; h < H; h++) {
        float *qh = q + h * L * D, *kh = k + h * L * D;
        for (int i = 0; i < L; i++) {
            /* small background noise in the last 8 coordinates (logit noise ~ 0.3) */
            for (int c = D - 8; c < D; c++) {
                qh[i * D + c] = (float)(0.2 * gauss());
                kh[i * D + c] = (float)(0.2 * gauss());
            }
        }
    }
    /* head 0: sinks 0..3 and the local band d = 0 */
    {
        float *qh = q, *kh = k;
        for (int i = 0; i < L; i++) {
            const double x = pos(i);
            qh[i * D + 0] = (float)(2 * a * x);
            qh[i * D + 1] = (float)(-a);
            qh[i * D + 2] = (float)(a * x * x); /* sink boost: the row's local peak */
            if (i < 4) {
                kh[i * D + 2] = 1.0f;
            } else {
                kh[i * D + 0] = (float)x;
                kh[i * D + 1] = (float)(x * x);
            }
        }
    }
    /* head 1: the diagonal d = 300 and 12 columns, all as strong as the diagonal's peak */
    {
        float *qh = q + L * D, *kh = k + L * D;
        const double d = pos(300);
        int cols[12];
        for (int c = 0; c < 12; c++) cols[c] = 100 + (int)(uniform() * (L - 200));
        for (int i = 0; i < L; i++) {
            const double x = pos(i);
            qh[i * D + 0] = (float)(2 * a * (x - d));
            qh[i * D + 1] = (float)(-a);
            /* the peak of row i's band is a (x - d)^2 above the j^2 form; columns match it */
            qh[i * D + 3] = (float)(a * (x - d) * (x - d));
            kh[i * D + 0] = (float)x;
            kh[i * D + 1] = (float)(x * x);
        }
        for (int c = 0; c < 12; c++) {
            float *kr = kh + cols[c] * D;
            kr[0] = kr[1] = 0.0f;
            kr[3] = 1.0f;
        }
        /* Rows before the diagonal exists peak at key 0 through the band; harmless. */
    }
    /* head 2: each 64-key block has one of 4 topics; a row attends to its topic's keys */
    {
        float *qh = q + 2 * L * D, *kh = k + 2 * L * D;
        int topic[L / 64];
        for (int b = 0; b < L / 64; b++) topic[b] = (int)(uniform() * 4);
        for (int i = 0; i < L; i++) {
            qh[i * D + topic[i / 64]] = 3.0f;
            kh[i * D + topic[i / 64]] = 3.0f;
        }
    }
    for (int i = 0; i < H * L * D; i++) v[i] = (float)gauss();
}

static const char *name(mi_pattern_type t) { return mi_pattern_name(t); }

static void report(const char *mode, const mi_head_pattern *best, const double *scores,
                   const mi_head_metrics *m) {
    for (int h = 0; h < H; h++)
        fprintf(stderr,
                "%s head %d: %s v=%d s=%d init=%d local=%d top_k=%d score=%.4f recall=%.4f "
                "density=%.4f\n",
                mode, h, name(best[h].type), best[h].vertical_size, best[h].slash_size,
                best[h].n_init, best[h].n_local, best[h].top_k, scores[h], m[h].recall,
                m[h].density);
}

static void test_adaptive(mi_context *ctx, const mi_tensor *tq, const mi_tensor *tk,
                          const mi_tensor *tv) {
    mi_search_params p = mi_search_default_params();
    p.mode = MI_SEARCH_ADAPTIVE;
    p.target_recall = 0.95;
    p.prefill.softmax_scale = 1.0f;
    mi_head_pattern best[H];
    double scores[H];
    mi_head_metrics m[H];
    CHECK_STATUS(mi_search_layer(ctx, tq, tk, tv, NULL, &p, best, scores, m), MI_STATUS_SUCCESS);
    report("adaptive", best, scores, m);
    CHECK(best[0].type == MI_PATTERN_A_SHAPE);
    CHECK(best[1].type == MI_PATTERN_VERTICAL_SLASH);
    CHECK(best[2].type == MI_PATTERN_BLOCK_SPARSE);
    for (int h = 0; h < H; h++) {
        CHECK(m[h].recall >= 0.95);
        CHECK(m[h].density < 0.6); /* far from dense: the search found a cheap budget */
    }
    /* Re-measuring the chosen patterns gives the reported recall. */
    mi_head_metrics again[H];
    CHECK_STATUS(mi_metrics_evaluate(ctx, tq, tk, NULL, best, &p.prefill, again),
                 MI_STATUS_SUCCESS);
    for (int h = 0; h < H; h++) CHECK(fabs(again[h].recall - m[h].recall) < 1e-9);
}

static void test_flops_matched(mi_context *ctx, const mi_tensor *tq, const mi_tensor *tk,
                               const mi_tensor *tv) {
    mi_search_params p = mi_search_default_params();
    p.mode = MI_SEARCH_FLOPS;
    p.target_density = 0.35;
    p.prefill.softmax_scale = 1.0f;
    mi_head_pattern best[H];
    double scores[H];
    mi_head_metrics m[H];
    CHECK_STATUS(mi_search_layer(ctx, tq, tk, tv, NULL, &p, best, scores, m), MI_STATUS_SUCCESS);
    report("flops", best, scores, m);
    CHECK(best[1].type == MI_PATTERN_VERTICAL_SLASH);
    CHECK(best[2].type == MI_PATTERN_BLOCK_SPARSE);
    for (int h = 0; h < H; h++) CHECK(m[h].recall > 0.8);
    /* Budgets matched: every head's chosen density is near the target. */
    for (int h = 0; h < H; h++) CHECK(fabs(m[h].density - 0.35) < 0.1);
}

static void test_fixed_and_bad_input(mi_context *ctx, const mi_tensor *tq, const mi_tensor *tk,
                                     const mi_tensor *tv) {
    mi_head_pattern best[H];
    double scores[H];
    /* The original's list at its own budgets: (1000, 6096) covers a 1K sample, so recall 1. */
    CHECK_STATUS(mi_search_layer(ctx, tq, tk, tv, NULL, NULL, best, scores, NULL),
                 MI_STATUS_SUCCESS);
    for (int h = 0; h < H; h++) CHECK(scores[h] > 0.99);

    mi_head_pattern cands[7];
    int32_t n = 0;
    CHECK_STATUS(mi_search_default_candidates(L, cands, 7, &n), MI_STATUS_SUCCESS);
    CHECK(n == 7 && cands[0].type == MI_PATTERN_A_SHAPE && cands[0].n_init == 100 &&
          cands[0].n_local == 800 && cands[5].vertical_size == 1000 && cands[6].top_k == 2);
    CHECK_STATUS(mi_search_default_candidates(L, cands, 6, &n), MI_STATUS_WORKSPACE_TOO_SMALL);

    mi_head_pattern sc;
    CHECK_STATUS(mi_search_scale_pattern(&cands[1], 0.5, &sc), MI_STATUS_SUCCESS);
    CHECK(sc.vertical_size == 15 && sc.slash_size == 400);
    CHECK_STATUS(mi_search_scale_pattern(&cands[0], 2.0, &sc), MI_STATUS_SUCCESS);
    CHECK(sc.n_init == 100 && sc.n_local == 1600);
    CHECK_STATUS(mi_search_scale_pattern(&cands[0], 0.0, &sc), MI_STATUS_INVALID_ARGUMENT);

    mi_search_params p = mi_search_default_params();
    best[0].type = MI_PATTERN_DENSE;
    best[0].top_k = -7;
    p.mode = MI_SEARCH_FLOPS;
    p.target_density = 0.0;
    CHECK_STATUS(mi_search_layer(ctx, tq, tk, tv, NULL, &p, best, NULL, NULL),
                 MI_STATUS_INVALID_ARGUMENT);
    CHECK(best[0].top_k == -7); /* nothing written on failure */
    CHECK(strlen(mi_context_last_error(ctx)) > 0);
    p = mi_search_default_params();
    p.n_candidates = 3; /* without a list */
    CHECK_STATUS(mi_search_layer(ctx, tq, tk, tv, NULL, &p, best, NULL, NULL),
                 MI_STATUS_INVALID_ARGUMENT);
    p = mi_search_default_params();
    p.min_scale = 2.0;
    CHECK_STATUS(mi_search_layer(ctx, tq, tk, tv, NULL, &p, best, NULL, NULL),
                 MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_search_layer(ctx, tq, tk, NULL, NULL, NULL, best, NULL, NULL),
                 MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_search_layer(ctx, tq, tk, tv, NULL, NULL, NULL, NULL, NULL),
                 MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_search_layer(NULL, tq, tk, tv, NULL, NULL, best, NULL, NULL),
                 MI_STATUS_INVALID_ARGUMENT);
    CHECK(best[0].top_k == -7);
}

/* GQA (2 query heads per KV head), a batch of two with a short second sequence, bf16 inputs:
 * the adaptive target holds for the batch-averaged recall and every output is a valid pattern. */
static void test_gqa_batch(mi_context *ctx) {
    enum { B = 2, HQ = 4, HKV = 2, LL = 384, DD = 32 };
    uint16_t *buf = calloc((size_t)B * (HQ + 2 * HKV) * LL * DD, sizeof(uint16_t));
    if (!buf) return;
    mi_tensor tq = mi_tensor_bhld(buf, MI_DTYPE_BF16, MI_DEVICE_CPU, B, HQ, LL, DD);
    mi_tensor tk =
        mi_tensor_bhld(buf + B * HQ * LL * DD, MI_DTYPE_BF16, MI_DEVICE_CPU, B, HKV, LL, DD);
    mi_tensor tv = mi_tensor_bhld(buf + B * (HQ + HKV) * LL * DD, MI_DTYPE_BF16, MI_DEVICE_CPU, B,
                                  HKV, LL, DD);
    mi_synth_params sp = mi_synth_default_params();
    sp.seed = 7;
    CHECK_STATUS(mi_synth_generate(ctx, &sp, &tq, &tk, &tv, NULL), MI_STATUS_SUCCESS);
    const int32_t lens[B] = {LL, 200};
    mi_search_params p = mi_search_default_params();
    p.mode = MI_SEARCH_ADAPTIVE;
    p.target_recall = 0.9;
    p.iterations = 3;
    mi_head_pattern best[HQ];
    double scores[HQ];
    mi_head_metrics m[HQ];
    CHECK_STATUS(mi_search_layer(ctx, &tq, &tk, &tv, lens, &p, best, scores, m), MI_STATUS_SUCCESS);
    for (int h = 0; h < HQ; h++) {
        CHECK(mi_pattern_name(best[h].type) != NULL);
        CHECK(m[h].recall >= 0.9 && m[h].recall <= 1.0 + 1e-6);
        CHECK(m[h].density > 0.0 && m[h].density <= 1.0 + 1e-6);
        CHECK(scores[h] <= 1.0 + 1e-6);
    }
    /* The kernel error term runs the real prefill on the batch. */
    p.mode = MI_SEARCH_FIXED;
    p.error_weight = 1.0;
    CHECK_STATUS(mi_search_layer(ctx, &tq, &tk, &tv, lens, &p, best, scores, m), MI_STATUS_SUCCESS);
    for (int h = 0; h < HQ; h++) {
        fprintf(stderr, "fixed+error head %d: %s score %.4f\n", h, mi_pattern_name(best[h].type),
                scores[h]);
        CHECK(scores[h] > 0.9 && scores[h] <= 1.0 + 1e-6);
    }
    free(buf);
}

int main(void) {
    build();
    mi_context *ctx = NULL;
    mi_context_params cp = mi_context_default_params();
    CHECK_STATUS(mi_context_create(&cp, &ctx), MI_STATUS_SUCCESS);
    if (!ctx) return check_finish("search");
    mi_tensor tq = mi_tensor_bhld(q, MI_DTYPE_F32, MI_DEVICE_CPU, 1, H, L, D);
    mi_tensor tk = mi_tensor_bhld(k, MI_DTYPE_F32, MI_DEVICE_CPU, 1, H, L, D);
    mi_tensor tv = mi_tensor_bhld(v, MI_DTYPE_F32, MI_DEVICE_CPU, 1, H, L, D);
    test_adaptive(ctx, &tq, &tk, &tv);
    test_flops_matched(ctx, &tq, &tk, &tv);
    test_fixed_and_bad_input(ctx, &tq, &tk, &tv);
    test_gqa_batch(ctx);
    mi_context_destroy(ctx);
    return check_finish("search");
}
