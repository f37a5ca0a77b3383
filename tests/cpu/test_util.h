/*
 * test_util.h: helpers of the CPU kernel tests: seeded data, a float64 reference attention under
 * an arbitrary element mask, tolerance checks, NaN/Inf scans and output poisoning.
 *
 * Header-only; every test program includes it once.
 */
#ifndef MI_TEST_UTIL_H
#define MI_TEST_UTIL_H

#include "minference.h"

#include "../check.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* RNG (splitmix64)                                                                             */

typedef struct rng {
    uint64_t s;
} rng;

static inline uint64_t rng_u64(rng *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [0, 1) */
static inline double rng_unif(rng *r) { return (double)(rng_u64(r) >> 11) * 0x1p-53; }

static inline int64_t rng_int(rng *r, int64_t n) { return (int64_t)(rng_u64(r) % (uint64_t)n); }

/* approximately standard normal (sum of 4 uniforms, rescaled): cheap and bounded */
static inline double rng_normal(rng *r) {
    double s = 0.0;
    for (int i = 0; i < 4; i++) s += rng_unif(r);
    return (s - 2.0) * 1.7320508075688772;
}

/* ------------------------------------------------------------------------------------------ */
/* Tensors with a float64 shadow of the stored (rounded) values                                */

typedef struct tbuf {
    mi_tensor t;
    void *data;
    double *ref; /* [B, H, L, D] logical order, the values exactly as stored */
    int64_t B, H, L, D;
} tbuf;

static inline double stored_value(mi_dtype dt, double x, uint16_t *bits16, float *f32) {
    if (dt == MI_DTYPE_F32) {
        *f32 = (float)x;
        return *f32;
    }
    if (dt == MI_DTYPE_F16) {
        *bits16 = mi_f32_to_f16((float)x);
        return mi_f16_to_f32(*bits16);
    }
    *bits16 = mi_f32_to_bf16((float)x);
    return mi_bf16_to_f32(*bits16);
}

static inline size_t tb_index(const tbuf *b, int64_t bi, int64_t h, int64_t l) {
    return (size_t)(bi * b->t.stride[0] + h * b->t.stride[1] + l * b->t.stride[2]);
}

/* blhd: [B, L, H, D] storage. Contents zero. */
static inline tbuf tb_new(mi_dtype dt, bool blhd, int64_t B, int64_t H, int64_t L, int64_t D) {
    tbuf b;
    memset(&b, 0, sizeof b);
    b.B = B;
    b.H = H;
    b.L = L;
    b.D = D;
    const size_t n = (size_t)(B * H * L * D);
    b.data = calloc(n ? n : 1, mi_dtype_size(dt));
    b.ref = calloc(n ? n : 1, sizeof(double));
    b.t = blhd ? mi_tensor_blhd(b.data, dt, MI_DEVICE_CPU, B, H, L, D)
               : mi_tensor_bhld(b.data, dt, MI_DEVICE_CPU, B, H, L, D);
    return b;
}

static inline void tb_set(tbuf *b, int64_t bi, int64_t h, int64_t l, int64_t d, double x) {
    const size_t i = tb_index(b, bi, h, l) + (size_t)d;
    uint16_t h16 = 0;
    float f = 0.0f;
    const double s = stored_value(b->t.dtype, x, &h16, &f);
    if (b->t.dtype == MI_DTYPE_F32) {
        ((float *)b->data)[i] = f;
    } else {
        ((uint16_t *)b->data)[i] = h16;
    }
    b->ref[(((size_t)bi * b->H + h) * b->L + l) * b->D + d] = s;
}

static inline double tb_get(const tbuf *b, int64_t bi, int64_t h, int64_t l, int64_t d) {
    const size_t i = tb_index(b, bi, h, l) + (size_t)d;
    if (b->t.dtype == MI_DTYPE_F32) return ((const float *)b->data)[i];
    if (b->t.dtype == MI_DTYPE_F16) return mi_f16_to_f32(((const uint16_t *)b->data)[i]);
    return mi_bf16_to_f32(((const uint16_t *)b->data)[i]);
}

static inline void tb_fill_normal(tbuf *b, rng *r, double scale) {
    for (int64_t bi = 0; bi < b->B; bi++)
        for (int64_t h = 0; h < b->H; h++)
            for (int64_t l = 0; l < b->L; l++)
                for (int64_t d = 0; d < b->D; d++) tb_set(b, bi, h, l, d, rng_normal(r) * scale);
}

/* Every byte 0xFF: NaN in fp32, fp16 and bf16, so any element a kernel fails to write shows. */
static inline void tb_poison(tbuf *b) {
    memset(b->data, 0xff, (size_t)(b->B * b->H * b->L * b->D) * mi_dtype_size(b->t.dtype));
}

/* NaN in every row past its sequence's length (lens NULL: none): no op may read a padding row
 * into a result (a zero probability times a NaN value is NaN), nor may the reference. */
static inline void tb_nan_padding(tbuf *b, const int32_t *lens) {
    if (!lens) return;
    for (int64_t bi = 0; bi < b->B; bi++)
        for (int64_t h = 0; h < b->H; h++)
            for (int64_t l = lens[bi] > 0 ? lens[bi] : 0; l < b->L; l++)
                for (int64_t d = 0; d < b->D; d++) tb_set(b, bi, h, l, d, NAN);
}

static inline void tb_free(tbuf *b) {
    free(b->data);
    free(b->ref);
    b->data = NULL;
    b->ref = NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Reference                                                                                   */

/* Element mask: does row i of (b, h) attend to key j? Causality and seq_len are applied by the
 * reference on top of it. */
typedef bool (*mask_fn)(void *ctx, int64_t b, int64_t h, int64_t i, int64_t j);

static inline bool mask_all(void *ctx, int64_t b, int64_t h, int64_t i, int64_t j) {
    (void)ctx, (void)b, (void)h, (void)i, (void)j;
    return true;
}

/* Rows the reference computes. Long sequences (> 1100) are checked on a deterministic sample:
 * the first and last 160 rows (every tile phase near both ends, the Tri-shape tail) and every
 * 13th row (13 is prime to 64, so every row offset inside a tile gets visited); the reference
 * is quadratic and would dominate the suite's time, notably under sanitizers. The kernel output
 * of every row is still scanned for NaN/Inf and unwritten (poisoned) elements. */
static inline bool ref_row_sampled(int64_t i, int64_t len) {
    return len <= 1100 || i < 160 || i >= len - 160 || i % 13 == 0;
}

/* float64 attention: out [B, Hq, L, D], lse [B, Hq, L] (natural log; -inf and 0 output for rows
 * without keys or beyond seq_len; NaN for rows outside the sample, which the comparisons skip). */
static inline void ref_attention(const tbuf *q, const tbuf *k, const tbuf *v,
                                 const int32_t *seq_lens, double scale, mask_fn mask, void *mctx,
                                 double *out, double *lse) {
    const int64_t B = q->B, Hq = q->H, L = q->L, D = q->D, group = q->H / k->H;
    double *s = malloc((size_t)L * sizeof(double));
    for (int64_t b = 0; b < B; b++) {
        const int64_t len = seq_lens ? seq_lens[b] : L;
        for (int64_t h = 0; h < Hq; h++) {
            const int64_t hk = h / group;
            for (int64_t i = 0; i < L; i++) {
                double *o = out + (((size_t)b * Hq + h) * L + i) * D;
                double *ls = lse + ((size_t)b * Hq + h) * L + i;
                for (int64_t d = 0; d < D; d++) o[d] = 0.0;
                *ls = -INFINITY;
                if (i >= len) continue;
                if (!ref_row_sampled(i, len)) {
                    for (int64_t d = 0; d < D; d++) o[d] = NAN;
                    *ls = NAN;
                    continue;
                }
                const double *qi = q->ref + (((size_t)b * Hq + h) * L + i) * D;
                double mx = -INFINITY;
                for (int64_t j = 0; j <= i; j++) {
                    s[j] = -INFINITY;
                    if (!mask(mctx, b, h, i, j)) continue;
                    const double *kj = k->ref + (((size_t)b * k->H + hk) * L + j) * D;
                    double dot = 0.0;
                    for (int64_t d = 0; d < D; d++) dot += qi[d] * kj[d];
                    s[j] = dot * scale;
                    if (s[j] > mx) mx = s[j];
                }
                if (mx == -INFINITY) continue;
                double sum = 0.0;
                for (int64_t j = 0; j <= i; j++) {
                    if (s[j] == -INFINITY) continue;
                    const double p = exp(s[j] - mx);
                    sum += p;
                    const double *vj = v->ref + (((size_t)b * v->H + hk) * L + j) * D;
                    for (int64_t d = 0; d < D; d++) o[d] += p * vj[d];
                }
                for (int64_t d = 0; d < D; d++) o[d] /= sum;
                *ls = mx + log(sum);
            }
        }
    }
    free(s);
}

/* ------------------------------------------------------------------------------------------ */
/* Tolerances                                                                                  */

typedef struct tol {
    double atol, rtol, rel_l2;
} tol;

static inline tol tol_for(mi_dtype dt) {
    tol t;
    if (dt == MI_DTYPE_F32) {
        /* fp32 scores and accumulation over <= ~4K keys plus a ~1-ulp exp2: errors ~1e-6 */
        t.atol = 2e-5;
        t.rtol = 1e-4;
        t.rel_l2 = 2e-5;
    } else if (dt == MI_DTYPE_F16) {
        /* inputs are exact in the reference; the fp16 output rounding (2^-11) dominates */
        t.atol = 3e-4;
        t.rtol = 2e-3;
        t.rel_l2 = 1e-3;
    } else {
        /* as fp16 but bf16 output rounding is 2^-8 */
        t.atol = 2e-3;
        t.rtol = 1.6e-2;
        t.rel_l2 = 8e-3;
    }
    return t;
}

/* LSE is fp32 whatever the dtype: scores are computed from the exact inputs in fp32 */
#define LSE_ATOL 2e-4

/* Compares out (kernel) with ref [B, H, L, D] over all rows (rows >= seq_len must be 0), checks
 * NaN/Inf, elementwise atol + rtol |ref| and the relative L2 over valid rows. Returns pass. */
static inline bool compare_out(const char *what, const tbuf *out, const double *ref,
                               const int32_t *seq_lens) {
    const tol t = tol_for(out->t.dtype);
    double num = 0.0, den = 0.0, worst = 0.0;
    int64_t bad = 0, nonfinite = 0;
    int64_t wb = 0, wh = 0, wl = 0, wd = 0;
    for (int64_t b = 0; b < out->B; b++) {
        const int64_t len = seq_lens ? seq_lens[b] : out->L;
        for (int64_t h = 0; h < out->H; h++)
            for (int64_t l = 0; l < out->L; l++)
                for (int64_t d = 0; d < out->D; d++) {
                    const double x = tb_get(out, b, h, l, d);
                    const double r = ref[(((size_t)b * out->H + h) * out->L + l) * out->D + d];
                    if (!isfinite(x)) {
                        nonfinite++;
                        continue;
                    }
                    if (r != r) continue; /* row not in the reference sample */
                    const double e = fabs(x - r);
                    const double lim = t.atol + t.rtol * fabs(r);
                    if (l >= len && x != 0.0) bad++;
                    if (e > lim) {
                        bad++;
                        if (e - lim > worst) {
                            worst = e - lim;
                            wb = b, wh = h, wl = l, wd = d;
                        }
                    }
                    if (l < len) {
                        num += e * e;
                        den += r * r;
                    }
                }
    }
    const double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    const bool ok = bad == 0 && nonfinite == 0 && rel <= t.rel_l2;
    CHECK(ok,
          "%s [%s]: %lld bad, %lld non-finite, rel_l2 %.3g (limit %.3g); worst excess %.3g at "
          "(%lld,%lld,%lld,%lld)",
          what, mi_dtype_name(out->t.dtype), (long long)bad, (long long)nonfinite, rel, t.rel_l2,
          worst, (long long)wb, (long long)wh, (long long)wl, (long long)wd);
    return ok;
}

static inline bool compare_lse(const char *what, const float *lse, const double *ref, int64_t n) {
    int64_t bad = 0;
    int64_t first = -1;
    for (int64_t i = 0; i < n; i++) {
        const double x = lse[i], r = ref[i];
        if (r != r) continue; /* row not in the reference sample */
        const bool ok =
            (r == -INFINITY) ? (x == -INFINITY) : (isfinite(x) && fabs(x - r) <= LSE_ATOL);
        if (!ok) {
            bad++;
            if (first < 0) first = i;
        }
    }
    CHECK(bad == 0, "%s: %lld LSE mismatches, first at %lld (%g vs %g)", what, (long long)bad,
          (long long)first, first >= 0 ? (double)lse[first] : 0.0, first >= 0 ? ref[first] : 0.0);
    return bad == 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Masks                                                                                       */

/* A-shape / Tri-shape element mask, independent of the kernel's tiling. */
typedef struct ashape_mask {
    int64_t n_init, n_local, n_last;
    const int32_t *seq_lens;
    int64_t L;
} ashape_mask;

static inline bool mask_ashape(void *ctx, int64_t b, int64_t h, int64_t i, int64_t j) {
    const ashape_mask *m = ctx;
    (void)h;
    const int64_t len = m->seq_lens ? m->seq_lens[b] : m->L;
    int64_t last = m->n_last < len - 1 ? m->n_last : len - 1;
    if (last < 0) last = 0;
    if (last > 0 && i >= len - last) return true;
    return j < m->n_init || i - j < m->n_local;
}

/* A block index expanded to elements: keys[((b * H + h) * R + m) * L + j] != 0 when row block m
 * of (b, h) lists key j (through a range or a column). Built straight from the index arrays. */
typedef struct key_mask {
    int64_t B, H, R, L;
    unsigned char *keys;
} key_mask;

static inline key_mask key_mask_from_index(const mi_sparse_index *x, int64_t L) {
    key_mask km;
    km.B = x->batch;
    km.H = x->heads;
    km.R = x->row_blocks;
    km.L = L;
    km.keys = calloc((size_t)(km.B * km.H * km.R * L) + 1, 1);
    for (int64_t bh = 0; bh < km.B * km.H; bh++) {
        for (int64_t m = 0; m < km.R; m++) {
            unsigned char *row = km.keys + (size_t)(bh * km.R + m) * (size_t)L;
            const int64_t nb = x->block_count[bh * km.R + m];
            for (int64_t i = 0; i < nb && i < x->max_blocks; i++) {
                const int64_t off = x->block_offset[(bh * km.R + m) * x->max_blocks + i];
                for (int64_t j = off; j < off + MI_BLOCK_SIZE; j++)
                    if (j >= 0 && j < L) row[j] = 1;
            }
            const int64_t nc = x->column_count[bh * km.R + m];
            for (int64_t i = 0; i < nc && i < x->max_columns; i++) {
                const int64_t c = x->column_index[(bh * km.R + m) * x->max_columns + i];
                if (c >= 0 && c < L) row[c] = 1;
            }
        }
    }
    return km;
}

static inline bool mask_keys(void *ctx, int64_t b, int64_t h, int64_t i, int64_t j) {
    const key_mask *km = ctx;
    return km->keys[(size_t)(((b * km->H + h) * km->R + i / MI_BLOCK_SIZE) * km->L + j)] != 0;
}

/* Index buffers owned by a test. */
typedef struct sparse_buf {
    mi_sparse_index x;
    void *mem;
} sparse_buf;

static inline sparse_buf sparse_new(int32_t B, int32_t H, int32_t R, int32_t max_blocks,
                                    int32_t max_columns) {
    sparse_buf s;
    const size_t n = mi_sparse_index_bytes(B, H, R, max_blocks, max_columns);
    s.mem = calloc(n, 1);
    if (mi_sparse_index_init(&s.x, B, H, R, max_blocks, max_columns, s.mem, n) !=
        MI_STATUS_SUCCESS) {
        fprintf(stderr, "mi_sparse_index_init failed\n");
        exit(2);
    }
    return s;
}

typedef struct vs_buf {
    mi_vs_index x;
    void *mem;
} vs_buf;

static inline vs_buf vs_new(int32_t B, int32_t H, int32_t max_v, int32_t max_s) {
    vs_buf s;
    const size_t n = mi_vs_index_bytes(B, H, max_v, max_s);
    s.mem = calloc(n, 1);
    if (mi_vs_index_init(&s.x, B, H, max_v, max_s, s.mem, n) != MI_STATUS_SUCCESS) {
        fprintf(stderr, "mi_vs_index_init failed\n");
        exit(2);
    }
    return s;
}

static const char *g_tuning_spec = NULL; /* --tuning, for test_context */

static inline mi_context *test_context(void) {
    mi_context_params p = mi_context_default_params();
    p.device = MI_DEVICE_CPU;
    mi_context *ctx = NULL;
    if (mi_context_create(&p, &ctx) != MI_STATUS_SUCCESS) {
        fprintf(stderr, "cannot create a CPU context\n");
        exit(2);
    }
    if (g_tuning_spec && mi_context_parse_tuning(ctx, g_tuning_spec) != MI_STATUS_SUCCESS) {
        fprintf(stderr, "--tuning: %s\n", mi_context_last_error(ctx));
        exit(2);
    }
    return ctx;
}

/* The arguments of a test program: [SEED] [--tuning name=value,...] (the tuning of the context
 * test_context makes, e.g. cpu_engine=1 for the build target's engine). Returns the seed. */
static inline uint64_t test_seed(int argc, char **argv, uint64_t dflt) {
    const char *seed = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--tuning") == 0 && i + 1 < argc)
            g_tuning_spec = argv[++i];
        else
            seed = argv[i];
    }
    if (seed) return strtoull(seed, NULL, 10);
    const char *e = getenv("MI_TEST_SEED");
    return e ? strtoull(e, NULL, 10) : dflt;
}

#endif /* MI_TEST_UTIL_H */
