/*
 * test_synth.c: the synthetic data generator. The planted structure must be a true property of
 * the data: it is recovered here by top-k on dense attention computed with a naive float64
 * reference, never read back from the generator's internals. Also: determinism, layouts, dtypes,
 * GQA, batch, and argument errors.
 */
#include "../check.h"
#include "minference.h"
#include "minference_tools.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

enum { NS = 4, NV = 8, NSL = 3, NN = 3 };

/* Dense causal softmax of row i of one head: P[0..i]. q, k are f32 [L, D]. */
static void attn_row(const float *q, const float *k, int64_t D, int64_t i, double *P) {
    const double scale = 1.0 / sqrt((double)D);
    double mx = -INFINITY, z = 0.0;
    for (int64_t j = 0; j <= i; j++) {
        double s = 0.0;
        for (int64_t d = 0; d < D; d++) s += (double)q[i * D + d] * (double)k[j * D + d];
        P[j] = s * scale;
        if (P[j] > mx) mx = P[j];
    }
    for (int64_t j = 0; j <= i; j++) z += (P[j] = exp(P[j] - mx));
    for (int64_t j = 0; j <= i; j++) P[j] /= z;
}

/* Is key j among the top n of P[lo..hi] (inclusive)? */
static bool in_top(const double *P, int64_t lo, int64_t hi, int64_t j, int n) {
    int above = 0;
    for (int64_t x = lo; x <= hi; x++)
        if (P[x] > P[j]) above++;
    return above < n;
}

static void test_structure(int64_t L, int64_t D, uint64_t seed) {
    const int32_t dists[NSL] = {(int32_t)(L * 2 / 15), (int32_t)(L * 3 / 10),
                                (int32_t)(L * 17 / 30)};
    mi_synth_params p = mi_synth_default_params();
    p.seed = seed;
    p.n_sinks = NS;
    p.n_verticals = NV;
    p.n_slashes = NSL;
    p.slash_distances = dists;
    p.local_window = 64;
    p.n_needles = NN;
    float *q = malloc((size_t)(L * D) * sizeof(float));
    float *k = malloc((size_t)(L * D) * sizeof(float));
    float *v = malloc((size_t)(L * D) * sizeof(float));
    double *P = malloc((size_t)L * sizeof(double));
    double *diag = calloc((size_t)L, sizeof(double));
    int32_t vc[NV], sd[NSL], nr[NN], nc[NN];
    mi_synth_truth truth = {vc, sd, nr, nc};
    mi_tensor tq = mi_tensor_bhld(q, MI_DTYPE_F32, MI_DEVICE_CPU, 1, 1, L, D);
    mi_tensor tk = mi_tensor_bhld(k, MI_DTYPE_F32, MI_DEVICE_CPU, 1, 1, L, D);
    mi_tensor tv = mi_tensor_bhld(v, MI_DTYPE_F32, MI_DEVICE_CPU, 1, 1, L, D);
    CHECK(q && k && v && P && diag);
    if (!q || !k || !v || !P || !diag) goto done;
    CHECK_STATUS(mi_synth_generate(NULL, &p, &tq, &tk, &tv, &truth), MI_STATUS_SUCCESS);
    for (int s = 0; s < NSL; s++) CHECK(sd[s] == dists[s]);
    for (int i = 1; i < NV; i++) CHECK(vc[i] >= vc[i - 1] && vc[i] >= NS && vc[i] < L);

    const int64_t w = p.local_window, far = 2 * w;
    /* Planted columns, to tell them from the ordinary keys. */
    unsigned char *planted = calloc((size_t)L, 1);
    double *col = calloc((size_t)L, sizeof(double));
    int64_t *col_n = calloc((size_t)L, sizeof(int64_t));
    CHECK(planted && col && col_n);
    if (!planted || !col || !col_n) {
        free(planted), free(col), free(col_n);
        goto done;
    }
    for (int s = 0; s < NS; s++) planted[s] = 1;
    for (int c = 0; c < NV; c++) planted[vc[c]] = 1;
    for (int n = 0; n < NN; n++) planted[nc[n]] = 1;
    double near_mass = 0.0, far_mass = 0.0;
    int64_t near_n = 0, far_n = 0;
    for (int64_t i = 0; i < L; i++) {
        attn_row(q, k, D, i, P);
        bool needle_row = false;
        for (int n = 0; n < NN; n++) needle_row |= nr[n] == i;
        if (needle_row) continue;
        /* Column means away from the local band; diagonal sums over the ordinary keys only
         * (planted columns cross every diagonal once and would blur them). */
        for (int64_t j = 0; j + far <= i; j++) col[j] += P[j], col_n[j]++;
        for (int64_t j = 0; j <= i; j++)
            if (!planted[j]) diag[i - j] += P[j];
        for (int64_t x = 1; x <= w / 8 && x <= i; x++)
            if (!planted[i - x]) near_mass += P[i - x], near_n++;
        for (int64_t x = far; x <= i; x += 7)
            if (!planted[i - x]) far_mass += P[i - x], far_n++;
    }
    for (int64_t j = 0; j < L; j++) col[j] = col_n[j] >= 64 ? col[j] / (double)col_n[j] : 0.0;
    /* Sinks are the heaviest columns, verticals come next (those with enough rows after them). */
    int vert_total = 0, vert_hits = 0;
    for (int s = 0; s < NS; s++) CHECK(in_top(col, 0, L - 1, s, NS));
    for (int c = 0; c < NV; c++) {
        if (col_n[vc[c]] < 64) continue;
        vert_total++;
        vert_hits += in_top(col, 0, L - 1, vc[c], NS + NV);
    }
    fprintf(stderr, "  L=%lld D=%lld: verticals %d/%d in the top columns, near/far weight %.3g\n",
            (long long)L, (long long)D, vert_hits, vert_total,
            (near_mass / (double)near_n) / (far_mass / (double)far_n));
    CHECK(vert_hits == vert_total);
    /* Local decay: the first keys behind the diagonal outweigh keys far behind it. */
    CHECK(near_mass / (double)near_n > 10.0 * (far_mass / (double)far_n));

    /* Slash lines: the heaviest diagonals beyond the local band, far above their neighbours. */
    for (int64_t d = 0; d < L; d++) diag[d] /= (double)(L - d);
    for (int s = 0; s < NSL; s++) {
        const int64_t d = dists[s];
        double around = 0.0;
        int n_around = 0;
        for (int64_t x = d - 64; x <= d + 64; x++) {
            if (x < far || x >= L || llabs(x - d) < 4) continue;
            around += diag[x];
            n_around++;
        }
        around /= n_around > 0 ? n_around : 1;
        const bool top = in_top(diag, far, L - 1, d, NSL);
        fprintf(stderr, "  slash d=%lld: %.3g x its neighbours, %s\n", (long long)d,
                diag[d] / around, top ? "a top diagonal" : "NOT a top diagonal");
        CHECK(diag[d] > 10.0 * around);
        CHECK(top);
    }
    free(planted), free(col), free(col_n);

    /* Needles: the row's heaviest key is the planted far key. */
    for (int n = 0; n < NN; n++) {
        attn_row(q, k, D, nr[n], P);
        int64_t best = 0;
        for (int64_t j = 1; j <= nr[n]; j++)
            if (P[j] > P[best]) best = j;
        CHECK(best == nc[n]);
        CHECK(P[nc[n]] > 0.3);
        CHECK(nr[n] - nc[n] >= nr[n] / 4);
    }
done:
    free(q);
    free(k);
    free(v);
    free(P);
    free(diag);
}

/* Reads element (b, h, l, d) of t as float. */
static float get(const mi_tensor *t, int64_t b, int64_t h, int64_t l, int64_t d) {
    const int64_t off = b * t->stride[0] + h * t->stride[1] + l * t->stride[2] + d;
    switch (t->dtype) {
    case MI_DTYPE_F32: return ((const float *)t->data)[off];
    case MI_DTYPE_F16: return mi_f16_to_f32(((const uint16_t *)t->data)[off]);
    case MI_DTYPE_BF16: return mi_bf16_to_f32(((const uint16_t *)t->data)[off]);
    }
    return NAN;
}

static void test_layouts_and_determinism(void) {
    const int64_t B = 2, Hq = 4, Hkv = 2, L = 333, D = 64;
    const size_t nq = (size_t)(B * Hq * L * D), nk = (size_t)(B * Hkv * L * D);
    float *q1 = malloc(nq * 4), *k1 = malloc(nk * 4), *v1 = malloc(nk * 4);
    float *q2 = malloc(nq * 4), *k2 = malloc(nk * 4), *v2 = malloc(nk * 4);
    uint16_t *qh = malloc(nq * 2), *kh = malloc(nk * 2), *vh = malloc(nk * 2);
    int32_t vc[Hq * 16];
    mi_synth_truth truth = {vc, NULL, NULL, NULL};
    CHECK(q1 && k1 && v1 && q2 && k2 && v2 && qh && kh && vh);
    if (!(q1 && k1 && v1 && q2 && k2 && v2 && qh && kh && vh)) goto done;
    mi_synth_params p = mi_synth_default_params();
    mi_tensor a_q = mi_tensor_bhld(q1, MI_DTYPE_F32, MI_DEVICE_CPU, B, Hq, L, D);
    mi_tensor a_k = mi_tensor_bhld(k1, MI_DTYPE_F32, MI_DEVICE_CPU, B, Hkv, L, D);
    mi_tensor a_v = mi_tensor_bhld(v1, MI_DTYPE_F32, MI_DEVICE_CPU, B, Hkv, L, D);
    mi_tensor b_q = mi_tensor_blhd(q2, MI_DTYPE_F32, MI_DEVICE_CPU, B, Hq, L, D);
    mi_tensor b_k = mi_tensor_blhd(k2, MI_DTYPE_F32, MI_DEVICE_CPU, B, Hkv, L, D);
    mi_tensor b_v = mi_tensor_blhd(v2, MI_DTYPE_F32, MI_DEVICE_CPU, B, Hkv, L, D);
    CHECK_STATUS(mi_synth_generate(NULL, &p, &a_q, &a_k, &a_v, &truth), MI_STATUS_SUCCESS);
    CHECK_STATUS(mi_synth_generate(NULL, &p, &b_q, &b_k, &b_v, NULL), MI_STATUS_SUCCESS);
    /* The same values whatever the memory layout. */
    bool same = true, finite = true;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t l = 0; l < L; l++)
                for (int64_t d = 0; d < D; d++) {
                    float x = get(&a_q, b, h, l, d);
                    same &= x == get(&b_q, b, h, l, d);
                    finite &= isfinite(x);
                    if (h < Hkv) {
                        same &= get(&a_k, b, h, l, d) == get(&b_k, b, h, l, d);
                        same &= get(&a_v, b, h, l, d) == get(&b_v, b, h, l, d);
                    }
                }
    CHECK(same);
    CHECK(finite);
    /* Heads of one GQA group share the planted columns; batches differ in their noise. */
    CHECK(memcmp(&vc[0], &vc[16], 16 * sizeof(int32_t)) == 0);
    CHECK(memcmp(&vc[32], &vc[48], 16 * sizeof(int32_t)) == 0);
    CHECK(memcmp(k1, k1 + Hkv * L * D, (size_t)(Hkv * L * D) * 4) != 0);

    /* Deterministic given the seed; another seed gives other data. */
    CHECK_STATUS(mi_synth_generate(NULL, &p, &b_q, &b_k, &b_v, NULL), MI_STATUS_SUCCESS);
    b_q = mi_tensor_bhld(q2, MI_DTYPE_F32, MI_DEVICE_CPU, B, Hq, L, D);
    b_k = mi_tensor_bhld(k2, MI_DTYPE_F32, MI_DEVICE_CPU, B, Hkv, L, D);
    b_v = mi_tensor_bhld(v2, MI_DTYPE_F32, MI_DEVICE_CPU, B, Hkv, L, D);
    CHECK_STATUS(mi_synth_generate(NULL, &p, &b_q, &b_k, &b_v, NULL), MI_STATUS_SUCCESS);
    CHECK(memcmp(q1, q2, nq * 4) == 0 && memcmp(k1, k2, nk * 4) == 0 &&
          memcmp(v1, v2, nk * 4) == 0);
    p.seed++;
    CHECK_STATUS(mi_synth_generate(NULL, &p, &b_q, &b_k, &b_v, NULL), MI_STATUS_SUCCESS);
    CHECK(memcmp(q1, q2, nq * 4) != 0);
    p.seed--;

    /* Half precision: the f32 values rounded. */
    const mi_dtype halves[2] = {MI_DTYPE_BF16, MI_DTYPE_F16};
    for (int t = 0; t < 2; t++) {
        mi_tensor h_q = mi_tensor_bhld(qh, halves[t], MI_DEVICE_CPU, B, Hq, L, D);
        mi_tensor h_k = mi_tensor_bhld(kh, halves[t], MI_DEVICE_CPU, B, Hkv, L, D);
        mi_tensor h_v = mi_tensor_bhld(vh, halves[t], MI_DEVICE_CPU, B, Hkv, L, D);
        CHECK_STATUS(mi_synth_generate(NULL, &p, &h_q, &h_k, &h_v, NULL), MI_STATUS_SUCCESS);
        bool rounded = true;
        for (size_t i = 0; i < nq; i++) {
            uint16_t want =
                halves[t] == MI_DTYPE_BF16 ? mi_f32_to_bf16(q1[i]) : mi_f32_to_f16(q1[i]);
            rounded &= qh[i] == want;
        }
        CHECK(rounded);
    }
done:
    free(q1), free(k1), free(v1), free(q2), free(k2), free(v2), free(qh), free(kh), free(vh);
}

static void test_errors(void) {
    mi_context *ctx = NULL;
    CHECK_STATUS(mi_context_create(NULL, &ctx), MI_STATUS_SUCCESS);
    float buf[4 * 8 * 16];
    mi_tensor q = mi_tensor_bhld(buf, MI_DTYPE_F32, MI_DEVICE_CPU, 1, 2, 8, 16);
    mi_tensor k = mi_tensor_bhld(buf, MI_DTYPE_F32, MI_DEVICE_CPU, 1, 1, 8, 16);
    mi_tensor v = k;
    mi_synth_params p = mi_synth_default_params();
    CHECK_STATUS(mi_synth_generate(ctx, NULL, &q, &k, &v, NULL), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_synth_generate(ctx, &p, NULL, &k, &v, NULL), MI_STATUS_INVALID_ARGUMENT);
    CHECK(strlen(mi_context_last_error(ctx)) > 0);
    mi_synth_params bad = p;
    bad.n_sinks = -1;
    CHECK_STATUS(mi_synth_generate(ctx, &bad, &q, &k, &v, NULL), MI_STATUS_INVALID_ARGUMENT);
    bad = p;
    bad.strength = NAN;
    CHECK_STATUS(mi_synth_generate(ctx, &bad, &q, &k, &v, NULL), MI_STATUS_INVALID_ARGUMENT);
    bad = p;
    bad.local_window = 0;
    CHECK_STATUS(mi_synth_generate(ctx, &bad, &q, &k, &v, NULL), MI_STATUS_INVALID_ARGUMENT);
    const int32_t neg[4] = {1, -2, 3, 4};
    bad = p;
    bad.slash_distances = neg;
    CHECK_STATUS(mi_synth_generate(ctx, &bad, &q, &k, &v, NULL), MI_STATUS_INVALID_ARGUMENT);
    mi_tensor k3 = mi_tensor_bhld(buf, MI_DTYPE_F32, MI_DEVICE_CPU, 1, 3, 8, 16);
    CHECK_STATUS(mi_synth_generate(ctx, &p, &q, &k3, &k3, NULL), MI_STATUS_SHAPE_MISMATCH);
    mi_tensor k_short = mi_tensor_bhld(buf, MI_DTYPE_F32, MI_DEVICE_CPU, 1, 1, 7, 16);
    CHECK_STATUS(mi_synth_generate(ctx, &p, &q, &k_short, &k_short, NULL),
                 MI_STATUS_SHAPE_MISMATCH);
    CHECK_STATUS(mi_synth_generate(ctx, &p, &q, &k, &k_short, NULL), MI_STATUS_SHAPE_MISMATCH);
    mi_tensor no_data = k;
    no_data.data = NULL;
    CHECK_STATUS(mi_synth_generate(ctx, &p, &q, &no_data, &v, NULL), MI_STATUS_INVALID_ARGUMENT);
    mi_tensor gpu = k;
    gpu.device = MI_DEVICE_CUDA;
    CHECK(mi_synth_generate(ctx, &p, &q, &gpu, &gpu, NULL) != MI_STATUS_SUCCESS);
    /* Tiny shapes work: L = 1, tiny D, more planted items than positions. */
    const int64_t dims[] = {1, 2, 5, 8, 33};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        for (int64_t L = 1; L <= 3; L++) {
            mi_tensor a = mi_tensor_bhld(buf, MI_DTYPE_F32, MI_DEVICE_CPU, 1, 1, L, dims[i]);
            mi_tensor b = mi_tensor_bhld(buf + 200, MI_DTYPE_F32, MI_DEVICE_CPU, 1, 1, L, dims[i]);
            mi_tensor c = mi_tensor_bhld(buf + 350, MI_DTYPE_F32, MI_DEVICE_CPU, 1, 1, L, dims[i]);
            CHECK_STATUS(mi_synth_generate(ctx, &p, &a, &b, &c, NULL), MI_STATUS_SUCCESS);
            for (int64_t x = 0; x < L * dims[i]; x++) CHECK(isfinite(buf[x]));
        }
    }
    mi_context_destroy(ctx);
}

int main(void) {
    test_structure(3000, 64, 7);
    test_structure(3000, 128, 11);
    test_structure(4159, 128, 1234);
    test_layouts_and_determinism();
    test_errors();
    return check_finish("test_synth");
}
