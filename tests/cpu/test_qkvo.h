/*
 * test_qkvo.h: the q / k / v / o tensors of one attention call with the buffers that check it
 * (kernel LSE, float64 reference output and LSE), set up and torn down in one place.
 *
 * Header-only, on top of test_util.h.
 */
#ifndef MI_TEST_QKVO_H
#define MI_TEST_QKVO_H

#include "test_util.h"

typedef struct qkvo {
    tbuf q, k, v, o; /* q and o [B, Hq, L, D]; k and v [B, Hkv, L, D] */
    size_t n_rows;   /* B * Hq * L */
    float *lse;      /* [n_rows] for the kernel, poisoned (NaN) */
    double *ref;     /* [n_rows * D] reference output */
    double *ref_lse; /* [n_rows] reference LSE */
} qkvo;

/* Fills q with normals times q_scale, then k and v with standard normals (in that order, from r),
 * and poisons o and lse so that any element a kernel fails to write shows. */
static inline qkvo qkvo_new(mi_dtype dt, bool blhd, int64_t B, int64_t Hq, int64_t Hkv, int64_t L,
                            int64_t D, double q_scale, rng *r) {
    qkvo t;
    t.q = tb_new(dt, blhd, B, Hq, L, D);
    t.k = tb_new(dt, blhd, B, Hkv, L, D);
    t.v = tb_new(dt, blhd, B, Hkv, L, D);
    t.o = tb_new(dt, blhd, B, Hq, L, D);
    tb_fill_normal(&t.q, r, q_scale);
    tb_fill_normal(&t.k, r, 1.0);
    tb_fill_normal(&t.v, r, 1.0);
    tb_poison(&t.o);
    t.n_rows = (size_t)(B * Hq * L);
    t.lse = malloc((t.n_rows + 1) * sizeof(float)); /* + 1: never malloc(0) */
    memset(t.lse, 0xff, (t.n_rows + 1) * sizeof(float));
    t.ref = malloc((t.n_rows * (size_t)D + 1) * sizeof(double));
    t.ref_lse = malloc((t.n_rows + 1) * sizeof(double));
    return t;
}

/* The float64 reference under mask into ref / ref_lse (scale 0: 1 / sqrt(D), as the kernels),
 * then o and lse compared with it: two checks. */
static inline void qkvo_check(const char *what, qkvo *t, const int32_t *lens, double scale,
                              mask_fn mask, void *mctx) {
    if (scale <= 0) scale = 1.0 / sqrt((double)t->q.D);
    ref_attention(&t->q, &t->k, &t->v, lens, scale, mask, mctx, t->ref, t->ref_lse);
    compare_out(what, &t->o, t->ref, lens);
    compare_lse(what, t->lse, t->ref_lse, (int64_t)t->n_rows);
}

/* NaN in the padding rows of q, k and v (tb_nan_padding); returns lens. */
static inline const int32_t *qkvo_nan_padding(qkvo *t, const int32_t *lens) {
    tb_nan_padding(&t->q, lens);
    tb_nan_padding(&t->k, lens);
    tb_nan_padding(&t->v, lens);
    return lens;
}

static inline void qkvo_free(qkvo *t) {
    free(t->lse);
    free(t->ref);
    free(t->ref_lse);
    tb_free(&t->q);
    tb_free(&t->k);
    tb_free(&t->v);
    tb_free(&t->o);
}

#endif /* MI_TEST_QKVO_H */
