/*
 * test_cuda.c: every CUDA op against the CPU op, through the public API (a CPU context and a
 * CUDA context on the same inputs).
 *
 * Inputs: seeded random data and planted-structure data (sinks, heavy columns, slashes); awkward
 * shapes (L = 1, 63, 64, 65, 1000, 4099), GQA 1/4/8, D = 64/128, both layouts, batch 2 with
 * per-sequence lengths (the rows past a sequence's length NaN in Q, K and V, which no op may
 * read into a result), budgets 0 / tiny / > L, block-sparse estimation on rows of 2000+ blocks,
 * A-/Tri-shape windows up to 4096 keys (on and off 64-key pieces) on 5000-12000-token sequences.
 * GPU outputs are poisoned (all-ones bytes = NaN) before every run, every output is scanned for
 * NaN/Inf, and errors are judged per element (atol + rtol |ref|) and as a relative L2 norm.
 *
 * Exit status: 0 pass, 1 fail, 77 skipped (no GPU or a build without CUDA).
 * Usage: test_cuda [--quick] [--tuning name=value,...]
 *   --quick: a small subset, e.g. under compute-sanitizer;
 *   --tuning: the CUDA context's tuning for the whole run (mi_tuning_parse, e.g. sm90=-1 for the
 *   sm_80 kernels on Hopper); the tests that force a path add theirs to it.
 */
#include "minference.h"
#include "minference_cuda.h"

#include "dense_fallback.h" /* the rule the library applies, src/cuda */

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SKIP 77

/* Tolerances per output dtype, each with its reason.
 * bf16: 8-bit mantissa; the GPU rounds P to bf16 before P.V (the CPU keeps fp32) and the output
 *       is rounded to bf16 (relative 2^-9), so a few 1e-3 of the output scale. */
#define TOL_BF16_ATOL 1.5e-2
#define TOL_BF16_RTOL 2e-2
#define TOL_BF16_L2 1e-2
/* fp16: 11-bit mantissa, the same two roundings are 8x smaller. */
#define TOL_F16_ATOL 3e-3
#define TOL_F16_RTOL 5e-3
#define TOL_F16_L2 2.5e-3
/* LSE: fp32 on both sides from the same rounded inputs; only summation order differs. */
#define TOL_LSE 2e-3

static int g_fail = 0, g_pass = 0;
static mi_context *g_cpu, *g_gpu;
static mi_tuning g_tuning; /* --tuning: the GPU context's tuning where a test forces nothing */

#define CUDA_OK(x)                                                                                 \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define MI_OK(ctx, x)                                                                              \
    do {                                                                                           \
        mi_status s_ = (x);                                                                        \
        if (s_ != MI_STATUS_SUCCESS) {                                                             \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, mi_status_name(s_),             \
                    mi_context_last_error(ctx));                                                   \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* The GPU context's tuning: the run's (--tuning) with `spec` (NULL: nothing) on top. */
static void tune(const char *spec) {
    mi_tuning t = g_tuning;
    if (spec) MI_OK(g_gpu, mi_tuning_parse(g_gpu, spec, &t));
    MI_OK(g_gpu, mi_context_set_tuning(g_gpu, &t));
}

/* " tuning a=1,b=2" for the GPU context's tuning, "" for the default. */
static const char *tuning_str(char *buf, size_t n) {
    mi_tuning t;
    MI_OK(g_gpu, mi_context_get_tuning(g_gpu, &t));
    const int w = snprintf(buf, n, " tuning ");
    if (w < 0 || (size_t)w >= n || mi_tuning_format(&t, buf + w, n - (size_t)w) <= 0) buf[0] = '\0';
    return buf;
}

/* ------------------------------------------------------------------------------------------ */
/* Random numbers (seeded, printed on failure)                                                 */

static uint64_t g_rng;
static uint32_t rnd32(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_rng >> 33);
}
static float rndu(void) { return (float)(rnd32() & 0xffffff) / 16777216.0f; }
static float rndn(void) {
    float u1 = rndu() + 1e-7f, u2 = rndu();
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

/* ------------------------------------------------------------------------------------------ */
/* Host / device tensors                                                                       */

typedef struct pair {
    mi_tensor h, d; /* same shape and strides; host and device copies */
    size_t bytes;
} pair;

static mi_tensor make_desc(void *data, mi_dtype dt, mi_device_type dev, int64_t B, int64_t H,
                           int64_t L, int64_t D, int blhd) {
    return blhd ? mi_tensor_blhd(data, dt, dev, B, H, L, D)
                : mi_tensor_bhld(data, dt, dev, B, H, L, D);
}

static pair pair_alloc(mi_dtype dt, int64_t B, int64_t H, int64_t L, int64_t D, int blhd) {
    pair p;
    p.bytes = (size_t)(B * H * L * D) * mi_dtype_size(dt);
    void *hd = malloc(p.bytes);
    void *dd = NULL;
    CUDA_OK(cudaMalloc(&dd, p.bytes));
    p.h = make_desc(hd, dt, MI_DEVICE_CPU, B, H, L, D, blhd);
    p.d = make_desc(dd, dt, MI_DEVICE_CUDA, B, H, L, D, blhd);
    return p;
}

static void pair_free(pair *p) {
    free(p->h.data);
    cudaFree(p->d.data);
}

static float get_f(const mi_tensor *t, int64_t b, int64_t h, int64_t l, int64_t d) {
    const int64_t o = b * t->stride[0] + h * t->stride[1] + l * t->stride[2] + d;
    const uint16_t x = ((const uint16_t *)t->data)[o];
    return t->dtype == MI_DTYPE_BF16 ? mi_bf16_to_f32(x) : mi_f16_to_f32(x);
}
static void set_f(mi_tensor *t, int64_t b, int64_t h, int64_t l, int64_t d, float v) {
    const int64_t o = b * t->stride[0] + h * t->stride[1] + l * t->stride[2] + d;
    ((uint16_t *)t->data)[o] = t->dtype == MI_DTYPE_BF16 ? mi_f32_to_bf16(v) : mi_f32_to_f16(v);
}

static void upload(pair *p) {
    CUDA_OK(cudaMemcpy(p->d.data, p->h.data, p->bytes, cudaMemcpyHostToDevice));
}

/* Random N(0, 1) data, or planted structure: a few sink keys, heavy columns and slashes that
 * every query sees strongly (q and k share a direction), as real heads do. */
static void fill_inputs(pair *q, pair *k, pair *v, int structured) {
    const int64_t B = q->h.shape[0], H = q->h.shape[1], L = q->h.shape[2], D = q->h.shape[3];
    const int64_t Hk = k->h.shape[1];
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t l = 0; l < L; l++)
                for (int64_t d = 0; d < D; d++) set_f(&q->h, b, h, l, d, rndn());
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hk; h++)
            for (int64_t l = 0; l < L; l++)
                for (int64_t d = 0; d < D; d++) {
                    set_f(&k->h, b, h, l, d, rndn());
                    set_f(&v->h, b, h, l, d, rndn());
                }
    if (structured) {
        /* sinks 0..3 and every 97th key get a large component along dim 0; all queries too */
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < Hk; h++)
                for (int64_t l = 0; l < L; l++)
                    if (l < 4 || l % 97 == 13) set_f(&k->h, b, h, l, 0, 4.0f + (float)(l % 5));
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t l = 0; l < L; l++) set_f(&q->h, b, h, l, 0, 2.5f);
        /* slash at distance 300: q[l] ~ k[l-300] along dim 1 .. */
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < Hk; h++)
                for (int64_t l = 0; l < L; l++)
                    set_f(&k->h, b, h, l, 1, (l % 7 == 3) ? 6.0f : 0.0f);
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t l = 0; l < L; l++)
                    set_f(&q->h, b, h, l, 1, ((l - 300) % 7 == 3) ? 3.0f : 0.0f);
    }
    upload(q);
    upload(k);
    upload(v);
}

/* ------------------------------------------------------------------------------------------ */
/* Comparison                                                                                  */

static int compare_out(const char *what, const mi_tensor *ref, const mi_tensor *got_dev_desc,
                       const int32_t *seq_lens, const float *lse_ref, const float *lse_gpu_dev) {
    const int64_t B = ref->shape[0], H = ref->shape[1], L = ref->shape[2], D = ref->shape[3];
    const size_t bytes = (size_t)(B * H * L * D) * 2;
    mi_tensor got = *got_dev_desc;
    got.data = malloc(bytes);
    got.device = MI_DEVICE_CPU;
    CUDA_OK(cudaMemcpy(got.data, got_dev_desc->data, bytes, cudaMemcpyDeviceToHost));
    const int bf = ref->dtype == MI_DTYPE_BF16;
    const double atol = bf ? TOL_BF16_ATOL : TOL_F16_ATOL, rtol = bf ? TOL_BF16_RTOL : TOL_F16_RTOL;
    const double l2tol = bf ? TOL_BF16_L2 : TOL_F16_L2;
    double num = 0, den = 0, worst = 0;
    int64_t bad = 0, nonfinite = 0, first_bad[3] = {-1, -1, -1};
    for (int64_t b = 0; b < B; b++) {
        const int64_t len = seq_lens ? seq_lens[b] : L;
        for (int64_t h = 0; h < H; h++)
            for (int64_t l = 0; l < L; l++)
                for (int64_t d = 0; d < D; d++) {
                    const double r = get_f(ref, b, h, l, d), g = get_f(&got, b, h, l, d);
                    if (!isfinite(g)) {
                        nonfinite++;
                        continue;
                    }
                    if (l >= len && g != 0.0) {
                        bad++;
                        continue;
                    }
                    num += (g - r) * (g - r);
                    den += r * r;
                    const double ex = fabs(g - r) - (atol + rtol * fabs(r));
                    if (ex > 0) {
                        if (bad == 0) {
                            first_bad[0] = b * H + h;
                            first_bad[1] = l;
                            first_bad[2] = d;
                        }
                        bad++;
                    }
                    if (fabs(g - r) > worst) worst = fabs(g - r);
                }
    }
    const double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    int64_t lse_bad = 0;
    double lse_worst = 0;
    if (lse_ref && lse_gpu_dev) {
        const size_t n = (size_t)(B * H * L);
        float *lg = malloc(n * sizeof(float));
        CUDA_OK(cudaMemcpy(lg, lse_gpu_dev, n * sizeof(float), cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++) {
            const float r = lse_ref[i], g = lg[i];
            if (isnan(g)) {
                lse_bad++;
                continue;
            }
            if (isinf(r) || isinf(g)) {
                if (r != g) lse_bad++;
                continue;
            }
            const double e = fabs((double)r - g);
            if (e > lse_worst) lse_worst = e;
            if (e > TOL_LSE * (1 + fabs(r))) lse_bad++;
        }
        free(lg);
    }
    free(got.data);
    const int ok = bad == 0 && nonfinite == 0 && rel <= l2tol && lse_bad == 0;
    if (ok) {
        g_pass++;
    } else {
        g_fail++;
        printf("FAIL %s: bad %lld nonfinite %lld rel_l2 %.3g max_abs %.3g lse_bad %lld "
               "lse_max %.3g first bad (bh %lld, row %lld, d %lld)\n",
               what, (long long)bad, (long long)nonfinite, rel, worst, (long long)lse_bad,
               lse_worst, (long long)first_bad[0], (long long)first_bad[1],
               (long long)first_bad[2]);
    }
    return ok;
}

static void poison(void *dev, size_t bytes) { CUDA_OK(cudaMemset(dev, 0xff, bytes)); }

/* ------------------------------------------------------------------------------------------ */
/* Cases                                                                                       */

typedef struct shape {
    int64_t B, H, Hk, L, D;
    mi_dtype dt;
    int blhd;
    int32_t lens[2]; /* used when B == 2 */
} shape;

static const char *shape_str(const shape *s, char *buf, size_t n) {
    char tn[160]; /* named where a test sets it */
    snprintf(buf, n, "B%lld H%lld/%lld L%lld D%lld %s %s%s%s", (long long)s->B, (long long)s->H,
             (long long)s->Hk, (long long)s->L, (long long)s->D, mi_dtype_name(s->dt),
             s->blhd ? "blhd" : "bhld",
             s->B > 1 ? (s->lens[0] != s->lens[1] ? " varlen" : " equal lengths") : "",
             tuning_str(tn, sizeof tn));
    return buf;
}

typedef struct inputs {
    pair q, k, v, o_cpu, o_gpu;
    float *lse_cpu, *lse_gpu;
    const int32_t *lens;
} inputs;

/* NaN in every row past its sequence's length: no op may read a padding row into a result (a
 * zero probability times a NaN value is NaN), on the GPU or in the CPU reference. */
static void poison_padding(pair *p, const int32_t *lens) {
    const int64_t B = p->h.shape[0], H = p->h.shape[1], L = p->h.shape[2], D = p->h.shape[3];
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t l = lens[b]; l < L; l++)
                for (int64_t d = 0; d < D; d++) set_f(&p->h, b, h, l, d, NAN);
    upload(p);
}

static void inputs_make(inputs *in, const shape *s, int structured) {
    in->q = pair_alloc(s->dt, s->B, s->H, s->L, s->D, s->blhd);
    in->k = pair_alloc(s->dt, s->B, s->Hk, s->L, s->D, s->blhd);
    in->v = pair_alloc(s->dt, s->B, s->Hk, s->L, s->D, s->blhd);
    in->o_cpu = pair_alloc(s->dt, s->B, s->H, s->L, s->D, s->blhd);
    in->o_gpu = pair_alloc(s->dt, s->B, s->H, s->L, s->D, s->blhd);
    fill_inputs(&in->q, &in->k, &in->v, structured);
    if (s->B > 1) {
        poison_padding(&in->q, s->lens);
        poison_padding(&in->k, s->lens);
        poison_padding(&in->v, s->lens);
    }
    const size_t n = (size_t)(s->B * s->H * s->L);
    in->lse_cpu = malloc(n * sizeof(float));
    CUDA_OK(cudaMalloc((void **)&in->lse_gpu, n * sizeof(float)));
    in->lens = s->B > 1 ? s->lens : NULL;
}

static void inputs_poison(inputs *in) {
    poison(in->o_gpu.d.data, in->o_gpu.bytes);
    poison(in->lse_gpu, (size_t)(in->q.h.shape[0] * in->q.h.shape[1] * in->q.h.shape[2]) * 4);
}

static void inputs_free(inputs *in) {
    pair_free(&in->q);
    pair_free(&in->k);
    pair_free(&in->v);
    pair_free(&in->o_cpu);
    pair_free(&in->o_gpu);
    free(in->lse_cpu);
    cudaFree(in->lse_gpu);
}

static void test_dense(const shape *s) {
    char name[160], sh[128];
    inputs in;
    inputs_make(&in, s, 0);
    inputs_poison(&in);
    MI_OK(g_cpu, mi_attention_dense(g_cpu, &in.q.h, &in.k.h, &in.v.h, in.lens, 0, &in.o_cpu.h,
                                    in.lse_cpu));
    MI_OK(g_gpu, mi_attention_dense(g_gpu, &in.q.d, &in.k.d, &in.v.d, in.lens, 0, &in.o_gpu.d,
                                    in.lse_gpu));
    MI_OK(g_gpu, mi_context_synchronize(g_gpu));
    snprintf(name, sizeof name, "dense [%s]", shape_str(s, sh, sizeof sh));
    compare_out(name, &in.o_cpu.h, &in.o_gpu.d, in.lens, in.lse_cpu, in.lse_gpu);
    inputs_free(&in);
}

static void test_ashape(const shape *s, int32_t n_init, int32_t n_local, int32_t n_last) {
    char name[200], sh[128];
    inputs in;
    inputs_make(&in, s, 0);
    inputs_poison(&in);
    MI_OK(g_cpu, mi_attention_a_shape(g_cpu, &in.q.h, &in.k.h, &in.v.h, in.lens, n_init, n_local,
                                      n_last, 0, &in.o_cpu.h, in.lse_cpu));
    MI_OK(g_gpu, mi_attention_a_shape(g_gpu, &in.q.d, &in.k.d, &in.v.d, in.lens, n_init, n_local,
                                      n_last, 0, &in.o_gpu.d, in.lse_gpu));
    MI_OK(g_gpu, mi_context_synchronize(g_gpu));
    snprintf(name, sizeof name, "a_shape(%d,%d,%d) [%s]", n_init, n_local, n_last,
             shape_str(s, sh, sizeof sh));
    compare_out(name, &in.o_cpu.h, &in.o_gpu.d, in.lens, in.lse_cpu, in.lse_gpu);
    inputs_free(&in);
}

/* An index on the host and its device copy. */
typedef struct vs_pair {
    mi_vs_index h, d;
    void *hb, *db;
    size_t bytes;
} vs_pair;
typedef struct sp_pair {
    mi_sparse_index h, d;
    void *hb, *db;
    size_t bytes;
} sp_pair;

static void vs_alloc(vs_pair *p, int32_t B, int32_t H, int32_t mv, int32_t ms) {
    p->bytes = mi_vs_index_bytes(B, H, mv, ms);
    p->hb = calloc(1, p->bytes);
    CUDA_OK(cudaMalloc(&p->db, p->bytes));
    CUDA_OK(cudaMemset(p->db, 0xff, p->bytes));
    MI_OK(g_cpu, mi_vs_index_init(&p->h, B, H, mv, ms, p->hb, p->bytes));
    MI_OK(g_cpu, mi_vs_index_init(&p->d, B, H, mv, ms, p->db, p->bytes));
}
static void sp_alloc(sp_pair *p, int32_t B, int32_t H, int32_t R, int32_t mb, int32_t mc) {
    p->bytes = mi_sparse_index_bytes(B, H, R, mb, mc);
    p->hb = calloc(1, p->bytes);
    CUDA_OK(cudaMalloc(&p->db, p->bytes));
    CUDA_OK(cudaMemset(p->db, 0xff, p->bytes));
    MI_OK(g_cpu, mi_sparse_index_init(&p->h, B, H, R, mb, mc, p->hb, p->bytes));
    MI_OK(g_cpu, mi_sparse_index_init(&p->d, B, H, R, mb, mc, p->db, p->bytes));
}
static void vs_free(vs_pair *p) {
    free(p->hb);
    cudaFree(p->db);
}
static void sp_free(sp_pair *p) {
    free(p->hb);
    cudaFree(p->db);
}

/* The device side of a sparse index pair, copied to the host into *buf (to be freed). */
static mi_sparse_index sp_device_copy(const sp_pair *p, void **buf) {
    *buf = malloc(p->bytes);
    CUDA_OK(cudaMemcpy(*buf, p->db, p->bytes, cudaMemcpyDeviceToHost));
    mi_sparse_index g;
    MI_OK(g_cpu, mi_sparse_index_init(&g, p->h.batch, p->h.heads, p->h.row_blocks, p->h.max_blocks,
                                      p->h.max_columns, *buf, p->bytes));
    return g;
}

/* Whether row block i of index g differs from the host one of p: counts or used entries. */
static int sp_row_differs(const sp_pair *p, const mi_sparse_index *g, int64_t i) {
    int d = g->block_count[i] != p->h.block_count[i] || g->column_count[i] != p->h.column_count[i];
    for (int32_t j = 0; !d && j < p->h.block_count[i]; j++)
        d = g->block_offset[i * p->h.max_blocks + j] != p->h.block_offset[i * p->h.max_blocks + j];
    for (int32_t j = 0; !d && j < p->h.column_count[i]; j++)
        d = g->column_index[i * p->h.max_columns + j] !=
            p->h.column_index[i * p->h.max_columns + j];
    return d;
}

/* Compares a device sparse index with the host one: counts and the used entries. Returns the
 * number of differing row blocks. */
static int64_t sp_diff(const sp_pair *p) {
    void *tmp;
    const mi_sparse_index g = sp_device_copy(p, &tmp);
    int64_t diff = 0;
    const int64_t n = (int64_t)p->h.batch * p->h.heads * p->h.row_blocks;
    for (int64_t i = 0; i < n; i++) diff += sp_row_differs(p, &g, i);
    free(tmp);
    return diff;
}

/* Entries of the device vs index missing from the host one (sets per (b, h)); -1 when a count
 * differs. Order is checked too: verticals ascending, distances descending. */
static int64_t vs_diff(const vs_pair *p, int64_t *order_bad) {
    void *tmp = malloc(p->bytes);
    CUDA_OK(cudaMemcpy(tmp, p->db, p->bytes, cudaMemcpyDeviceToHost));
    mi_vs_index g;
    MI_OK(g_cpu, mi_vs_index_init(&g, p->h.batch, p->h.heads, p->h.max_vertical, p->h.max_slash,
                                  tmp, p->bytes));
    int64_t miss = 0;
    *order_bad = 0;
    const int64_t n = (int64_t)p->h.batch * p->h.heads;
    for (int64_t i = 0; i < n; i++) {
        if (g.vertical_count[i] != p->h.vertical_count[i] ||
            g.slash_count[i] != p->h.slash_count[i]) {
            free(tmp);
            return -1;
        }
        const int32_t *gv = g.vertical_idx + i * p->h.max_vertical;
        const int32_t *hv = p->h.vertical_idx + i * p->h.max_vertical;
        const int32_t *gs = g.slash_idx + i * p->h.max_slash;
        const int32_t *hs = p->h.slash_idx + i * p->h.max_slash;
        for (int32_t j = 1; j < g.vertical_count[i]; j++) *order_bad += gv[j] <= gv[j - 1];
        for (int32_t j = 1; j < g.slash_count[i]; j++) *order_bad += gs[j] >= gs[j - 1];
        /* both sorted: merge-count the common entries */
        int32_t a = 0, c = 0, common = 0;
        while (a < g.vertical_count[i] && c < g.vertical_count[i]) {
            if (gv[a] == hv[c]) {
                common++;
                a++;
                c++;
            } else if (gv[a] < hv[c])
                a++;
            else
                c++;
        }
        miss += g.vertical_count[i] - common;
        a = c = common = 0;
        while (a < g.slash_count[i] && c < g.slash_count[i]) {
            if (gs[a] == hs[c]) {
                common++;
                a++;
                c++;
            } else if (gs[a] > hs[c])
                a++;
            else
                c++;
        }
        miss += g.slash_count[i] - common;
    }
    free(tmp);
    return miss;
}

static void check(int ok, const char *fmt, const char *what) {
    if (ok) {
        g_pass++;
    } else {
        g_fail++;
        printf("FAIL %s: %s\n", what, fmt);
    }
}

/* Sparse attention over the host index on the CPU and over its device copy on the GPU, into
 * poisoned outputs. */
static void sparse_both(inputs *in, sp_pair *si) {
    CUDA_OK(cudaMemcpy(si->db, si->hb, si->bytes, cudaMemcpyHostToDevice));
    inputs_poison(in);
    MI_OK(g_cpu, mi_attention_sparse(g_cpu, &in->q.h, &in->k.h, &in->v.h, in->lens, &si->h, 0,
                                     &in->o_cpu.h, in->lse_cpu));
    MI_OK(g_gpu, mi_attention_sparse(g_gpu, &in->q.d, &in->k.d, &in->v.d, in->lens, &si->d, 0,
                                     &in->o_gpu.d, in->lse_gpu));
    MI_OK(g_gpu, mi_context_synchronize(g_gpu));
}

/* Runs a test's index on both sides, compares the outputs as "what [shape]", and frees the index
 * and the inputs. */
static void sparse_check_and_free(inputs *in, sp_pair *si, const char *what, const shape *s) {
    char name[220], sh[128];
    sparse_both(in, si);
    snprintf(name, sizeof name, "%s [%s]", what, shape_str(s, sh, sizeof sh));
    compare_out(name, &in->o_cpu.h, &in->o_gpu.d, in->lens, in->lse_cpu, in->lse_gpu);
    sp_free(si);
    inputs_free(in);
}

/* Estimate on both sides, compare the sets, then build the block index on both sides from the
 * CPU sets (so the comparison is exact), run the sparse kernel on both from that same index. */
static void test_vs(const shape *s, int32_t vsz, int32_t ssz, int structured) {
    char name[220], sh[128];
    inputs in;
    inputs_make(&in, s, structured);
    const int32_t B = (int32_t)s->B, H = (int32_t)s->H;
    const mi_vs_params vp = mi_vs_default_params();
    int32_t *vs = malloc(H * sizeof(int32_t)), *ss = malloc(H * sizeof(int32_t));
    for (int32_t h = 0; h < H; h++) {
        vs[h] = vsz + 7 * h; /* per-head budgets */
        ss[h] = ssz + 5 * h;
    }
    int32_t mv = 0, ms = 0;
    for (int32_t h = 0; h < H; h++) {
        int32_t a = vs[h] > vp.min_vertical ? vs[h] : vp.min_vertical;
        int32_t c = ss[h] > vp.min_slash ? ss[h] : vp.min_slash;
        if (a > s->L) a = (int32_t)s->L;
        if (c > s->L) c = (int32_t)s->L;
        if (a > mv) mv = a;
        if (c > ms) ms = c;
    }
    vs_pair vi;
    vs_alloc(&vi, B, H, mv, ms);
    MI_OK(g_cpu, mi_vs_estimate(g_cpu, &in.q.h, &in.k.h, in.lens, vs, ss, &vp, 0, &vi.h));
    MI_OK(g_gpu, mi_vs_estimate(g_gpu, &in.q.d, &in.k.d, in.lens, vs, ss, &vp, 0, &vi.d));
    MI_OK(g_gpu, mi_context_synchronize(g_gpu));
    int64_t order_bad = 0;
    const int64_t miss = vs_diff(&vi, &order_bad);
    /* near-ties of fp32 sums summed in another order may swap a boundary entry: allow 2 per
     * (b, h) and list, never a count or order difference */
    snprintf(name, sizeof name, "vs_estimate(%d,%d)%s [%s] missing %lld", vsz, ssz,
             structured ? " structured" : "", shape_str(s, sh, sizeof sh), (long long)miss);
    check(miss >= 0 && miss <= 4 * (int64_t)B * H && order_bad == 0, "sets differ", name);

    /* index from the CPU sets on both sides */
    const int32_t R = (int32_t)((s->L + 63) / 64);
    sp_pair si;
    sp_alloc(&si, B, H, R, ms + 1, mv);
    CUDA_OK(cudaMemcpy(vi.db, vi.hb, vi.bytes, cudaMemcpyHostToDevice));
    MI_OK(g_cpu, mi_vs_build_index(g_cpu, s->L, in.lens, &vi.h, &si.h));
    MI_OK(g_gpu, mi_vs_build_index(g_gpu, s->L, in.lens, &vi.d, &si.d));
    MI_OK(g_gpu, mi_context_synchronize(g_gpu));
    const int64_t idiff = sp_diff(&si);
    snprintf(name, sizeof name, "vs_build_index(%d,%d) [%s] differing row blocks %lld", vsz, ssz,
             shape_str(s, sh, sizeof sh), (long long)idiff);
    check(idiff == 0, "index differs", name);

    /* sparse attention over the CPU index */
    sparse_both(&in, &si);
    snprintf(name, sizeof name, "sparse vs(%d,%d) [%s]", vsz, ssz, shape_str(s, sh, sizeof sh));
    compare_out(name, &in.o_cpu.h, &in.o_gpu.d, in.lens, in.lse_cpu, in.lse_gpu);

    vs_free(&vi);
    sp_free(&si);
    free(vs);
    free(ss);
    inputs_free(&in);
}

/* The vertical-slash select on vectors of several of its chunks (4096 keys each): the sets of
 * random inputs against the CPU's, as in test_vs; with q = 0 (zero_q), every query attends
 * uniformly, so every column left of the last 64 has the same sum on each side, and the
 * tie rule (lowest positions first) must keep columns 0 .. k - 1 exactly, across chunks. */
static void test_vs_long(int64_t L, int zero_q, mi_dtype dt) {
    char name[220], sh[128];
    const int32_t L2 = (int32_t)(L / 2 + 1);
    const shape s = {2, 4, 2, L, 128, dt, 0, {(int32_t)L, L2}};
    inputs in;
    inputs_make(&in, &s, 0);
    if (zero_q) {
        memset(in.q.h.data, 0, in.q.bytes);
        upload(&in.q);
    }
    const int32_t B = 2, H = 4, vsz = 9000, ssz = 3000; /* 9000: a threshold past one chunk */
    const mi_vs_params vp = mi_vs_default_params();
    int32_t vs[4], ss[4];
    for (int32_t h = 0; h < H; h++) {
        vs[h] = vsz - 1000 * h;
        ss[h] = ssz + 5 * h;
    }
    vs_pair vi;
    vs_alloc(&vi, B, H, vsz, ssz + 15);
    MI_OK(g_cpu, mi_vs_estimate(g_cpu, &in.q.h, &in.k.h, in.lens, vs, ss, &vp, 0, &vi.h));
    MI_OK(g_gpu, mi_vs_estimate(g_gpu, &in.q.d, &in.k.d, in.lens, vs, ss, &vp, 0, &vi.d));
    MI_OK(g_gpu, mi_context_synchronize(g_gpu));
    int64_t order_bad = 0;
    const int64_t miss = vs_diff(&vi, &order_bad);
    snprintf(name, sizeof name, "vs_estimate long%s [%s] missing %lld", zero_q ? " q=0" : "",
             shape_str(&s, sh, sizeof sh), (long long)miss);
    if (!zero_q) {
        check(miss >= 0 && miss <= 4 * (int64_t)B * H && order_bad == 0, "sets differ", name);
    } else {
        /* the columns exactly; the diagonals' sums near chunk edges add in any order */
        int64_t bad = 0;
        int32_t *gv = malloc(vi.bytes);
        CUDA_OK(cudaMemcpy(gv, vi.db, vi.bytes, cudaMemcpyDeviceToHost));
        mi_vs_index g;
        MI_OK(g_cpu, mi_vs_index_init(&g, B, H, vsz, ssz + 15, gv, vi.bytes));
        for (int32_t i = 0; i < B * H; i++) {
            const int32_t k = g.vertical_count[i];
            bad += k != vi.h.vertical_count[i];
            for (int32_t j = 0; j < k && j < vsz; j++)
                bad += g.vertical_idx[(int64_t)i * vsz + j] != j ||
                       vi.h.vertical_idx[(int64_t)i * vsz + j] != j;
        }
        free(gv);
        check(bad == 0 && order_bad == 0, "columns differ from 0 .. k - 1", name);
    }
    vs_free(&vi);
    inputs_free(&in);
}

/* Sparse attention over a random index: unsorted range starts anywhere (before 0, past the
 * sequence, overlapping), ascending columns with out-of-range entries, empty row blocks, rows with
 * nothing but columns. Both kernels must read it as a list, like the CPU. */
/* A random index. subset = 0: each row block's columns a random ascending run over the whole
 * sequence and beyond it (a large union of columns, some out of range); subset = 1: random
 * subsets of one set of 200 keys per (b, h), as vertical-slash lists are (a small union, each
 * pair of row blocks listing different parts of it). */
static void test_sparse_random(const shape *s, int subset) {
    inputs in;
    inputs_make(&in, s, 0);
    const int32_t B = (int32_t)s->B, H = (int32_t)s->H, R = (int32_t)((s->L + 63) / 64);
    const int32_t mb = 12, mc = 300, L = (int32_t)s->L, nset = 200;
    int32_t set[200];
    sp_pair si;
    sp_alloc(&si, B, H, R, mb, mc);
    for (int64_t i = 0; i < (int64_t)B * H * R; i++) {
        if (subset && i % R == 0) { /* the next (b, h)'s set: ascending, distinct */
            int32_t c = -1;
            for (int32_t j = 0; j < nset; j++) {
                c += 1 + (int32_t)(rnd32() % (uint32_t)(L / nset + 1));
                set[j] = c < L ? c : L - 1;
            }
        }
        const uint32_t kind = rnd32() % 8;
        int32_t nb = kind == 0 ? 0 : (int32_t)(rnd32() % (uint32_t)(mb + 1));
        int32_t nc = kind == 1 ? 0 : (int32_t)(rnd32() % (uint32_t)(mc + 1));
        if (kind == 2) nb = 0; /* columns only */
        si.h.block_count[i] = nb;
        si.h.column_count[i] = nc;
        for (int32_t j = 0; j < mb; j++)
            si.h.block_offset[i * mb + j] = (int32_t)(rnd32() % (uint32_t)(L + 200)) - 100;
        int32_t c = -20;
        if (subset) {
            int32_t n = 0;
            for (int32_t j = 0; j < nset && n < nc; j++)
                if ((j == 0 || set[j] > set[j - 1]) && rnd32() % 4 != 0)
                    si.h.column_index[i * mc + n++] = set[j];
            si.h.column_count[i] = n;
            for (int32_t j = n; j < mc; j++) si.h.column_index[i * mc + j] = -1;
        } else {
            for (int32_t j = 0; j < mc; j++) {
                c += 1 + (int32_t)(rnd32() % (uint32_t)(L / 150 + 2));
                si.h.column_index[i * mc + j] = c;
            }
        }
    }
    sparse_check_and_free(
        &in, &si, subset ? "sparse random index (columns of one set)" : "sparse random index", s);
}

/* A band of adjacent 64-key pieces ending at the block that starts at r0 (a run of slash
 * diagonals), at most band pieces back: their starts into offs; returns how many, and the band's
 * first key in *first. */
static int32_t put_band(int32_t *offs, int32_t r0, int32_t band, int32_t *first) {
    int32_t n = 0;
    *first = r0 - 64 * band > 0 ? r0 - 64 * band : 0;
    for (int32_t o = *first; o <= r0; o += 64) offs[n++] = o;
    return n;
}

/* An index whose heads differ in kind, so that one launch splits its heads between the two
 * sm_90a sparse kernels (picked per head on the device): even heads a band of adjacent 64-key
 * pieces ending at the block (a run of slash diagonals) plus ascending columns left of it, odd
 * heads scattered ascending starts with gaps between them and the same kind of columns. */
static void test_sparse_mixed_heads(const shape *s) {
    inputs in;
    inputs_make(&in, s, 0);
    const int32_t B = (int32_t)s->B, H = (int32_t)s->H, R = (int32_t)((s->L + 63) / 64);
    const int32_t mb = 24, mc = 64, band = 20;
    sp_pair si;
    sp_alloc(&si, B, H, R, mb, mc);
    for (int64_t i = 0; i < (int64_t)B * H * R; i++) {
        const int32_t h = (int32_t)(i / R % H), r0 = (int32_t)(i % R) * 64;
        int32_t nb = 0, lo = r0;
        if (h % 2 == 0) {
            nb = put_band(si.h.block_offset + i * mb, r0, band, &lo);
        } else {
            int32_t o = (int32_t)(rnd32() % 64);
            while (o <= r0 && nb < mb) {
                si.h.block_offset[i * mb + nb++] = o;
                o += 130 + (int32_t)(rnd32() % 400); /* never the next piece */
            }
            lo = 0;
        }
        for (int32_t j = nb; j < mb; j++) si.h.block_offset[i * mb + j] = 0;
        si.h.block_count[i] = nb;
        int32_t nc = 0, c = (int32_t)(rnd32() % 5);
        while (c < lo && nc < mc) {
            si.h.column_index[i * mc + nc++] = c;
            c += 1 + (int32_t)(rnd32() % 90);
        }
        for (int32_t j = nc; j < mc; j++) si.h.column_index[i * mc + j] = -1;
        si.h.column_count[i] = nc;
    }
    sparse_check_and_free(&in, &si, "sparse band and scattered heads", s);
}

/* Vertical-slash-shaped lists, which the warp-specialised kernel reads from copies of the last
 * row block's columns: per (b, h) one ascending set of verticals; each row block a band of
 * adjacent 64-key pieces ending at the block and, as columns, the verticals left of the band (a
 * prefix of the last block's list). On odd heads one row block in five drops or adds a column,
 * so that its pair is gathered instead, in the same launch; head 2 lists more columns than a
 * pair can share (the gathered path with alternating tiles); the last head lists columns only,
 * up to the block's last row (tiles of the copies whose keys must be masked one by one). */
static void test_sparse_prefix_columns(const shape *s) {
    inputs in;
    inputs_make(&in, s, 0);
    const int32_t B = (int32_t)s->B, H = (int32_t)s->H, R = (int32_t)((s->L + 63) / 64);
    const int32_t L = (int32_t)s->L, band = 6, mb = band + 1, mc = 2300;
    int32_t *verts = malloc(sizeof(int32_t) * (size_t)mc);
    sp_pair si;
    sp_alloc(&si, B, H, R, mb, mc);
    int32_t nv = 0;
    for (int64_t i = 0; i < (int64_t)B * H * R; i++) {
        const int32_t h = (int32_t)(i / R % H), r0 = (int32_t)(i % R) * 64;
        if (i % R == 0) { /* the next (b, h)'s verticals: ascending, distinct */
            const int32_t want = h == 2 ? mc : 40 + (int32_t)(rnd32() % 150);
            int32_t c = (int32_t)(rnd32() % 3) - 1;
            nv = 0;
            while (nv < want) {
                c += 1 + (h == 2 ? 0 : (int32_t)(rnd32() % (uint32_t)(L / want + 1)));
                if (c >= L) break;
                verts[nv++] = c;
            }
        }
        /* the last head has no ranges and its columns reach into the block's own rows, so
         * that some keys of a column tile come after some of its rows (per-key masking) */
        const int only_columns = h == H - 1;
        int32_t first;
        int32_t nb = put_band(si.h.block_offset + i * mb, r0, band, &first);
        if (only_columns) nb = 0; /* its starts are zeroed next */
        for (int32_t j = nb; j < mb; j++) si.h.block_offset[i * mb + j] = 0;
        si.h.block_count[i] = nb;
        const int32_t limit = only_columns ? r0 + 64 : first;
        int32_t nc = 0;
        while (nc < nv && nc < mc && verts[nc] < limit) {
            si.h.column_index[i * mc + nc] = verts[nc];
            nc++;
        }
        if (h % 2 == 1 && !only_columns && i % R != R - 1 && rnd32() % 5 == 0 && nc > 2) {
            if (rnd32() % 2) { /* drop one */
                const int32_t k = (int32_t)(rnd32() % (uint32_t)nc);
                for (int32_t j = k; j + 1 < nc; j++)
                    si.h.column_index[i * mc + j] = si.h.column_index[i * mc + j + 1];
                nc--;
            } else if (nc < mc && si.h.column_index[i * mc + nc - 1] + 1 < first) { /* add one */
                si.h.column_index[i * mc + nc] = si.h.column_index[i * mc + nc - 1] + 1;
                nc++;
            }
        }
        for (int32_t j = nc; j < mc; j++) si.h.column_index[i * mc + j] = -1;
        si.h.column_count[i] = nc;
    }
    free(verts);
    sparse_check_and_free(&in, &si, "sparse band with prefix columns", s);
}

/* Uploads the lists, builds the block index from them on both sides, checks that it is the same
 * (reported as "what ... differing N", with the GPU context's tuning) and frees the lists. */
static void index_both_and_check(vs_pair *vi, int64_t L, const int32_t *lens, int32_t R,
                                 const char *what) {
    char name[260];
    const int32_t B = vi->h.batch, H = vi->h.heads;
    CUDA_OK(cudaMemcpy(vi->db, vi->hb, vi->bytes, cudaMemcpyHostToDevice));
    sp_pair si;
    sp_alloc(&si, B, H, R, vi->h.max_slash + 1, vi->h.max_vertical);
    MI_OK(g_cpu, mi_vs_build_index(g_cpu, L, lens, &vi->h, &si.h));
    MI_OK(g_gpu, mi_vs_build_index(g_gpu, L, lens, &vi->d, &si.d));
    MI_OK(g_gpu, mi_context_synchronize(g_gpu));
    const int64_t idiff = sp_diff(&si);
    char tn[160];
    snprintf(name, sizeof name, "%s%s differing %lld", what, tuning_str(tn, sizeof tn),
             (long long)idiff);
    check(idiff == 0, "index differs", name);
    vs_free(vi);
    sp_free(&si);
}

/* Unsorted sets with duplicates and out-of-range entries, built on both sides. */
static void test_index_messy(int64_t L, int32_t nv, int32_t ns, int with_small) {
    char name[160];
    const int32_t B = 2, H = 3, R = (int32_t)((L + 63) / 64);
    const int32_t lens[2] = {(int32_t)L, (int32_t)(L * 2 / 3 + 1)};
    vs_pair vi;
    vs_alloc(&vi, B, H, nv, ns);
    for (int32_t i = 0; i < B * H; i++) {
        vi.h.vertical_count[i] = nv - (i % 2);
        vi.h.slash_count[i] = ns - (i % 3);
        for (int32_t j = 0; j < nv; j++)
            vi.h.vertical_idx[i * nv + j] = (int32_t)(rnd32() % (uint32_t)(L + 40)) - 20;
        for (int32_t j = 0; j < ns; j++)
            vi.h.slash_idx[i * ns + j] = (int32_t)(rnd32() % (uint32_t)(L + 40)) - 20;
        if (with_small && ns > 3) {
            vi.h.slash_idx[i * ns] = 0;
            vi.h.slash_idx[i * ns + 1] = 5;
            vi.h.slash_idx[i * ns + 2] = 5; /* duplicate */
        }
    }
    snprintf(name, sizeof name, "vs_build_index messy L%lld nv%d ns%d%s", (long long)L, nv, ns,
             with_small ? " +d0" : "");
    index_both_and_check(&vi, L, lens, R, name);
}

/* Index from ordered lists without duplicates, as the estimator writes them, which the GPU walk
 * reads as such: bands of adjacent diagonals (runs it takes at once) at the start,
 * in the middle and reaching the end of the sequence, between scattered ones whose gaps take
 * every size around the 64 and 128 where windows stop merging, and verticals inside and
 * outside the bands, one in every vstep on average (the GPU keeps a row's columns as bits of the
 * vertical list, written 32 words at a time: more than 1024 verticals take several). */
static void test_index_bands(int64_t L, uint32_t vstep) {
    char name[160];
    const int32_t B = 2, H = 2, R = (int32_t)((L + 63) / 64);
    const int32_t lens[2] = {(int32_t)L, (int32_t)(L / 2 + 7)};
    uint8_t *mark = calloc((size_t)L, 1), *vmark = calloc((size_t)L, 1);
    int32_t ns = 0, nv = 0;
    for (int64_t d = 0; d < L; d++) {
        const int band =
            d < 300 || (d >= 1000 && d < 1100) || (d >= 5000 && d < 5040) || d >= L - 200;
        mark[d] = band || rnd32() % 97 == 0 || (d % 700 > 600 && rnd32() % 3 == 0);
        ns += mark[d];
        vmark[d] = d < 30 || rnd32() % vstep == 0;
        nv += vmark[d];
    }
    vs_pair vi;
    vs_alloc(&vi, B, H, nv, ns);
    for (int32_t i = 0; i < B * H; i++) {
        vi.h.vertical_count[i] = nv;
        vi.h.slash_count[i] = ns;
        int32_t a = 0, c = 0;
        for (int64_t x = 0; x < L; x++)
            if (vmark[x]) vi.h.vertical_idx[i * nv + a++] = (int32_t)x;
        for (int64_t x = L - 1; x >= 0; x--)
            if (mark[x]) vi.h.slash_idx[i * ns + c++] = (int32_t)x;
    }
    snprintf(name, sizeof name, "vs_build_index bands L%lld nv%d ns%d", (long long)L, nv, ns);
    index_both_and_check(&vi, L, lens, R, name);
    free(mark);
    free(vmark);
}

/* Rounds q and k to whole numbers past their planted dimensions 0 and 1 (whose values are
 * whole or halves already). The block-sparse estimate ranks pooled scores at bf16 precision; a
 * CPU and a GPU sum of one score that straddle a 16-bit boundary pick different blocks. With
 * whole numbers a full block's pooled values are multiples of 1/64 that bf16 holds exactly, and
 * their scores are exact fp32 sums on both sides. */
static void round_qk(inputs *in) {
    pair *t[2] = {&in->q, &in->k};
    for (int i = 0; i < 2; i++) {
        const mi_tensor *x = &t[i]->h;
        for (int64_t b = 0; b < x->shape[0]; b++)
            for (int64_t h = 0; h < x->shape[1]; h++)
                for (int64_t l = 0; l < x->shape[2]; l++)
                    for (int64_t d = 2; d < x->shape[3]; d++)
                        set_f(&t[i]->h, b, h, l, d, rintf(get_f(x, b, h, l, d)));
        upload(t[i]);
    }
}

/* A pooled 64-row block of (b, h) at d, as the estimate pools it: summed in row order, times the
 * reciprocal of its rows, rounded to the dtype. */
static float pooled_at(const mi_tensor *t, int64_t b, int64_t h, int64_t blk, int64_t len,
                       int64_t d) {
    const int64_t r0 = blk * 64, r1 = r0 + 64 < len ? r0 + 64 : len;
    float sum = 0.f;
    for (int64_t r = r0; r < r1; r++) sum += get_f(t, b, h, r, d);
    const float mean = sum * (1.0f / (float)(r1 - r0));
    return t->dtype == MI_DTYPE_BF16 ? mi_bf16_to_f32(mi_f32_to_bf16(mean))
                                     : mi_f16_to_f32(mi_f32_to_f16(mean));
}

/* Prints the first rows where the device index differs from the host one, with both sets'
 * pooled scores recomputed in double (and their bits as floats). */
static void bs_show_diff(const inputs *in, const shape *s, const sp_pair *sp) {
    const int32_t B = sp->h.batch, H = sp->h.heads, R = sp->h.row_blocks, mb = sp->h.max_blocks;
    void *g;
    const mi_sparse_index gi = sp_device_copy(sp, &g);
    int shown = 0;
    for (int64_t i = 0; i < (int64_t)B * H * R && shown < 3; i++) {
        const int32_t n = sp->h.block_count[i];
        if (!sp_row_differs(sp, &gi, i)) continue;
        const int64_t b = i / R / H, h = i / R % H, m = i % R;
        printf("    b %lld h %lld m %lld: cpu", (long long)b, (long long)h, (long long)m);
        for (int32_t j = 0; j < n; j++) printf(" %d", sp->h.block_offset[i * mb + j] / 64);
        printf(" | gpu");
        for (int32_t j = 0; j < gi.block_count[i]; j++)
            printf(" %d", gi.block_offset[i * mb + j] / 64);
        printf("\n");
        /* the pooled scores of both sets' blocks, in double, and their bits as floats */
        const int64_t len = in->lens ? in->lens[b] : s->L;
        float qm[128]; /* D is 64 or 128 on the GPU */
        for (int64_t d = 0; d < s->D; d++) qm[d] = pooled_at(&in->q.h, b, h, m, len, d);
        for (int side = 0; side < 2; side++)
            for (int32_t j = 0; j < (side ? gi.block_count[i] : n); j++) {
                const int64_t blk = (side ? gi.block_offset : sp->h.block_offset)[i * mb + j] / 64;
                double sc = 0.0;
                for (int64_t d = 0; d < s->D; d++)
                    sc += (double)qm[d] *
                          (double)pooled_at(&in->k.h, b, h / (s->H / s->Hk), blk, len, d);
                const float f = (float)sc;
                uint32_t u;
                memcpy(&u, &f, 4);
                printf("      %s block %lld score %.10g bits %08x\n", side ? "gpu" : "cpu",
                       (long long)blk, sc, u);
            }
        shown++;
    }
    free(g);
}

/* The block-sparse estimate on the CPU and the GPU, then sparse attention on the CPU's index.
 * Random inputs may differ in a few rows (a near-tie summed in another order); with `exact`, the
 * structured inputs rounded to whole numbers (round_qk), whose full blocks' pooled scores are
 * exact fp32 sums on both sides, must give the same index bit for bit, exact ties included (lower
 * block first), and the first rows that differ are printed. */
static void test_block_sparse(const shape *s, int32_t topk, int exact) {
    char name[200], sh[128];
    inputs in;
    inputs_make(&in, s, exact);
    if (exact) round_qk(&in);
    const int32_t B = (int32_t)s->B, H = (int32_t)s->H, R = (int32_t)((s->L + 63) / 64);
    int32_t *tk = malloc(H * sizeof(int32_t));
    for (int32_t h = 0; h < H; h++) tk[h] = topk + h % 3;
    int32_t mb = topk + 2 > 2 ? topk + 2 : 2;
    if (mb > R) mb = R;
    sp_pair si;
    sp_alloc(&si, B, H, R, mb, 1);
    MI_OK(g_cpu, mi_block_sparse_estimate(g_cpu, &in.q.h, &in.k.h, in.lens, tk, &si.h));
    MI_OK(g_gpu, mi_block_sparse_estimate(g_gpu, &in.q.d, &in.k.d, in.lens, tk, &si.d));
    MI_OK(g_gpu, mi_context_synchronize(g_gpu));
    const int64_t idiff = sp_diff(&si);
    const int64_t nrows = (int64_t)B * H * R;
    snprintf(name, sizeof name, "block_sparse_estimate%s(top %d) [%s] differing %lld / %lld",
             exact ? " exact " : "", topk, shape_str(s, sh, sizeof sh), (long long)idiff,
             (long long)nrows);
    check(exact ? idiff == 0 : idiff * 100 <= nrows, "index differs", name);
    if (exact && idiff) bs_show_diff(&in, s, &si);

    sparse_both(&in, &si);
    snprintf(name, sizeof name, "sparse block%s(top %d) [%s]", exact ? " exact " : "", topk,
             shape_str(s, sh, sizeof sh));
    compare_out(name, &in.o_cpu.h, &in.o_gpu.d, in.lens, in.lse_cpu, in.lse_gpu);
    sp_free(&si);
    free(tk);
    inputs_free(&in);
}

/* Which block-sparse estimate kernel test_block_sparse_long asks for. Top k up to 192 takes the
 * streaming kernel unless BS_ROWS: long rows with bounds (the default), without them, or with
 * bounds from a fixed number of groups per tile: 1 and 2 (maxima across the lanes of a quad), 32
 * (the groups of many tiles share the bound kernel's slots). BS_STREAM_POOL_1 pools with a thread
 * per value, as for rows that 16-byte loads cannot read. Top k up to 104 takes 128 candidate
 * slots a row where the CTAs outnumber the SMs, else 256 as larger top k: BS_STREAM_WIDE and
 * BS_STREAM_NARROW fix them. Few heads split their long row groups into chunks of key tiles;
 * BS_STREAM_NO_SPLIT never does, BS_STREAM_SPLIT_4 takes the shortest chunks (4 a group at the
 * end), also without bounds. The row-holding kernel (top k above 192,
 * or BS_ROWS) narrows long lists first and falls back when many keys lie near the top. */
typedef enum {
    BS_ROWS,
    BS_STREAM,
    BS_STREAM_NO_BOUND,
    BS_STREAM_BOUND_1,
    BS_STREAM_BOUND_2,
    BS_STREAM_BOUND_32,
    BS_STREAM_POOL_1,
    BS_STREAM_WIDE,
    BS_STREAM_NARROW,
    BS_STREAM_NO_SPLIT,
    BS_STREAM_SPLIT_4,
    BS_STREAM_SPLIT_4_NO_BOUND,
    BS_STREAM_NTILE_APPEND,
    BS_STREAM_NO_SCORES,
    BS_SCORES,
    BS_SCORES_MMA,
    BS_SCORES_NO_TMA,
    BS_SCORES_EXACT_BOUND,
    BS_SCORES_LOOSE_BOUND
} bs_kernel;

/* What each bs_kernel sets in the GPU context's tuning (NULL: the defaults) and how the check
 * names it. */
static const struct {
    const char *tuning, *label;
} bs_kernel_tuning[] = {
    [BS_ROWS] = {"bs_stream=-1", "rows"},
    [BS_STREAM] = {NULL, "streaming"},
    [BS_STREAM_NO_BOUND] = {"bs_bound=-1", "streaming, no bounds"},
    [BS_STREAM_BOUND_1] = {"bs_bound=1", "streaming, bounds of 1 group a tile"},
    [BS_STREAM_BOUND_2] = {"bs_bound=2", "streaming, bounds of 2 groups a tile"},
    [BS_STREAM_BOUND_32] = {"bs_bound=32", "streaming, bounds of 32 groups a tile"},
    [BS_STREAM_POOL_1] = {"bs_pool_vec=-1", "streaming, pooled a value a thread"},
    [BS_STREAM_WIDE] = {"bs_cap=256", "streaming, 256 slots a row"},
    [BS_STREAM_NARROW] = {"bs_cap=128", "streaming, 128 slots a row"},
    [BS_STREAM_NO_SPLIT] = {"bs_split=-1", "streaming, groups not split"},
    [BS_STREAM_SPLIT_4] = {"bs_split=1", "streaming, long groups in 4 chunks"},
    [BS_STREAM_SPLIT_4_NO_BOUND] = {"bs_split=1,bs_bound=-1",
                                    "streaming, long groups in 4 chunks, no bounds"},
    [BS_STREAM_NTILE_APPEND] = {"bs_mask_append=-1",
                                "streaming, plain tiles appended an n-tile at a time"},
    [BS_STREAM_NO_SCORES] = {"bs_scores=-1", "no scores in memory"},
    [BS_SCORES] = {"bs_scores=1", "scores in memory"},
    [BS_SCORES_MMA] = {"bs_scores=1,bs_wgmma=-1", "scores in memory by mma.sync"},
    [BS_SCORES_NO_TMA] = {"bs_scores=1,bs_score_tma=-1",
                          "scores in memory, tiles by 16-byte copies"},
    [BS_SCORES_EXACT_BOUND] = {"bs_scores=1,bs_bound_slack=-1",
                               "scores in memory, the exact bound"},
    [BS_SCORES_LOOSE_BOUND] = {"bs_scores=1,bs_bound_slack=400", "scores in memory, a loose bound"},
};

/* The kernels of the estimate through scores in memory: those whose tuning starts by turning the
 * scores on (read from the table, so that a new row needs no second list). */
static int bs_scores_path(bs_kernel kern) {
    static const char on[] = "bs_scores=1";
    const char *t = bs_kernel_tuning[kern].tuning;
    return t && strncmp(t, on, sizeof on - 1) == 0 &&
           (t[sizeof on - 1] == '\0' || t[sizeof on - 1] == ',');
}

/* The GPU context's tuning for an estimate on `kern`, after `extra` (NULL: nothing). The estimate
 * through scores in memory is the default from 128K on; a test of another path turns it off, so
 * that it runs the path it names. */
static void bs_tune(bs_kernel kern, const char *extra) {
    char spec[200];
    snprintf(spec, sizeof spec, "%s%sbs_scores=-1%s%s", extra ? extra : "", extra ? "," : "",
             bs_kernel_tuning[kern].tuning ? "," : "",
             bs_kernel_tuning[kern].tuning ? bs_kernel_tuning[kern].tuning : "");
    tune(spec);
}

/* The inputs of the long block-sparse tests: batch 2 (lengths L and 3 L / 5 + 1), 2 query heads
 * on one KV head. ramp: every key a multiple of one positive vector, growing towards block 0,
 * and positive queries, so that each block scores above every later one: walking down from the
 * diagonal, the streaming kernel keeps every candidate and compacts at every few tiles; rounded
 * to bf16, neighbouring blocks also pool to equal vectors (exact ties, lower block first). */
static void bs_long_inputs(int64_t L, int64_t D, int ramp, pair *q, pair *k, pair *v,
                           int32_t lens[2]) {
    const int32_t B = 2, H = 2, Hk = 1;
    lens[0] = (int32_t)L;
    lens[1] = (int32_t)(L * 3 / 5 + 1);
    *q = pair_alloc(MI_DTYPE_BF16, B, H, L, D, 0);
    *k = pair_alloc(MI_DTYPE_BF16, B, Hk, L, D, 0);
    *v = pair_alloc(MI_DTYPE_BF16, B, Hk, L, D, 0);
    fill_inputs(q, k, v, 0);
    if (!ramp) return;
    for (int64_t b = 0; b < B; b++)
        for (int64_t l = 0; l < L; l++)
            for (int64_t d = 0; d < D; d++) {
                const float base = 0.5f + 0.25f * (float)(d % 3);
                set_f(&k->h, b, 0, l, d, base * (1.0f + (float)(L - l) / (float)L));
                for (int64_t h = 0; h < H; h++)
                    set_f(&q->h, b, h, l, d, 0.3f + 0.1f * fabsf(rndn()));
            }
    upload(q);
    upload(k);
}

/* Block-sparse estimation alone on long sequences (thousands of blocks per row), on the inputs of
 * bs_long_inputs, on the kernel `kern` asks for. With rows > 0 the row-holding kernel's CTAs
 * take at most that many row blocks each, wide >= 0 forces its CTA size. */
static void test_block_sparse_long(int64_t L, int64_t D, int32_t topk, int rows, int wide,
                                   bs_kernel kern, int ramp) {
    char name[220], extra[48];
    const int32_t B = 2, H = 2, R = (int32_t)((L + 63) / 64);
    int32_t lens[2];
    pair q, k, v;
    bs_long_inputs(L, D, ramp, &q, &k, &v, lens);
    int32_t tk[2] = {topk, topk / 2 + 1};
    int32_t mb = topk < R ? topk : R;
    sp_pair si;
    sp_alloc(&si, B, H, R, mb, 1);
    const int force_wide = wide > 0 ? 1 : wide == 0 ? -1 : 0; /* -1: 256 threads, 0: auto */
    snprintf(extra, sizeof extra, "bs_rows=%d,bs_wide=%d", rows > 0 ? rows : 0, force_wide);
    bs_tune(kern, extra);
    MI_OK(g_cpu, mi_block_sparse_estimate(g_cpu, &q.h, &k.h, lens, tk, &si.h));
    MI_OK(g_gpu, mi_block_sparse_estimate(g_gpu, &q.d, &k.d, lens, tk, &si.d));
    MI_OK(g_gpu, mi_context_synchronize(g_gpu));
    tune(NULL);
    const int64_t idiff = sp_diff(&si);
    const int64_t nrows = (int64_t)B * H * R;
    snprintf(name, sizeof name,
             "block_sparse_estimate long L%lld D%lld top %d %s%s rows/CTA %d wide %d differing "
             "%lld / %lld",
             (long long)L, (long long)D, topk,
             topk > 192 && !bs_scores_path(kern) ? "rows" : bs_kernel_tuning[kern].label,
             ramp ? " ramp" : "", rows, wide, (long long)idiff, (long long)nrows);
    check(idiff * 100 <= nrows, "index differs", name);
    sp_free(&si);
    pair_free(&q);
    pair_free(&k);
    pair_free(&v);
}

/* Two block-sparse paths that score the pooled blocks with the same sums give the same index,
 * bit for bit: `kern` against `ref` on the inputs of bs_long_inputs, both with the tuning `extra`
 * where it is not NULL (the chunks, the slots). The streaming kernel's two ways of
 * appending a plain tile's candidates (at once where every row has room, else an n-tile at a
 * time), the two pooling kernels (16-byte loads, a value a thread: the same sums in row order),
 * the estimate through scores in memory against the streaming kernel, the wgmma score kernel's
 * tiles by TMA against 16-byte copies, and the select's bound search stopped early (the default,
 * and a slack of 400) against the search run to its end: a lower bound only filters. */
static void test_block_sparse_paths_agree(bs_kernel kern, bs_kernel ref, int64_t L, int64_t D,
                                          int32_t topk, int ramp, const char *extra) {
    char name[200];
    const int32_t B = 2, H = 2, R = (int32_t)((L + 63) / 64);
    int32_t lens[2];
    pair q, k, v;
    bs_long_inputs(L, D, ramp, &q, &k, &v, lens);
    int32_t tk[2] = {topk, topk / 2 + 1};
    sp_pair si;
    sp_alloc(&si, B, H, R, topk < R ? topk : R, 1);
    bs_tune(ref, extra);
    MI_OK(g_gpu, mi_block_sparse_estimate(g_gpu, &q.d, &k.d, lens, tk, &si.d));
    MI_OK(g_gpu, mi_context_synchronize(g_gpu));
    /* that index is the reference (the host side of the pair has the same layout) */
    CUDA_OK(cudaMemcpy(si.hb, si.db, si.bytes, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemset(si.db, 0xff, si.bytes));
    bs_tune(kern, extra);
    MI_OK(g_gpu, mi_block_sparse_estimate(g_gpu, &q.d, &k.d, lens, tk, &si.d));
    MI_OK(g_gpu, mi_context_synchronize(g_gpu));
    tune(NULL);
    const int64_t idiff = sp_diff(&si);
    snprintf(name, sizeof name,
             "block_sparse_estimate %s = %s: L%lld D%lld top %d%s %s, differing %lld / %lld",
             bs_kernel_tuning[kern].label, bs_kernel_tuning[ref].label, (long long)L, (long long)D,
             topk, ramp ? " ramp" : "", extra ? extra : "defaults", (long long)idiff,
             (long long)B * H * R);
    /* wgmma sums d in another order than mma.sync: near-ties may fall the other way, as
     * against the CPU; otherwise the same sums give the same index */
    if (kern == BS_SCORES && ref == BS_STREAM_NO_SCORES) {
        check(idiff * 100 <= (int64_t)B * H * R, "index differs", name);
        printf("  %s\n", name);
    } else {
        check(idiff == 0, "index differs", name);
    }
    sp_free(&si);
    pair_free(&q);
    pair_free(&k);
    pair_free(&v);
}

/* A whole layer with one pattern per head. `wide` budgets cover every key (estimation cannot
 * differ), otherwise structured inputs with whole-number q and k (round_qk) keep the estimate
 * away from near-ties. */
static void test_prefill(const shape *s, int wide, int use_workspace) {
    char name[200], sh[128];
    inputs in;
    inputs_make(&in, s, !wide);
    if (!wide) round_qk(&in);
    const int64_t H = s->H;
    mi_head_pattern *pat = malloc(H * sizeof(mi_head_pattern));
    for (int64_t h = 0; h < H; h++) {
        const mi_pattern_type t = (mi_pattern_type)(h % 5);
        pat[h] = mi_head_pattern_default(t);
        if (t == MI_PATTERN_A_SHAPE) {
            /* two windows: on full lengths the first A-shape head's takes the warp-specialised
             * kernel, the other the ring kernel */
            pat[h].n_init = 16;
            pat[h].n_local = h < 5 ? 200 : 300;
        }
        if (t == MI_PATTERN_TRI_SHAPE) {
            pat[h].n_init = 8;
            pat[h].n_local = 100;
            pat[h].n_last = 70;
        }
        if (t == MI_PATTERN_VERTICAL_SLASH && !wide) {
            pat[h].vertical_size = 100;
            pat[h].slash_size = 400;
        }
        if (t == MI_PATTERN_VERTICAL_SLASH && wide) {
            pat[h].vertical_size = (int32_t)s->L;
            pat[h].slash_size = (int32_t)s->L;
        }
        if (t == MI_PATTERN_BLOCK_SPARSE) pat[h].top_k = wide ? 100000 : 4;
    }
    mi_prefill_params pp = mi_prefill_default_params();
    pp.dense_below = 0;
    void *ws = NULL;
    size_t wsz = 0;
    if (use_workspace) {
        MI_OK(g_gpu, mi_prefill_workspace_size(g_gpu, &in.q.d, &in.k.d, pat, &pp, &wsz));
        CUDA_OK(cudaMalloc(&ws, wsz));
    }
    inputs_poison(&in);
    MI_OK(g_cpu, mi_prefill_attention(g_cpu, &in.q.h, &in.k.h, &in.v.h, in.lens, pat, &pp,
                                      &in.o_cpu.h, in.lse_cpu, NULL, 0));
    MI_OK(g_gpu, mi_prefill_attention(g_gpu, &in.q.d, &in.k.d, &in.v.d, in.lens, pat, &pp,
                                      &in.o_gpu.d, in.lse_gpu, ws, wsz));
    MI_OK(g_gpu, mi_context_synchronize(g_gpu));
    snprintf(name, sizeof name, "prefill %s%s [%s]", wide ? "wide" : "structured",
             use_workspace ? " workspace" : "", shape_str(s, sh, sizeof sh));
    compare_out(name, &in.o_cpu.h, &in.o_gpu.d, in.lens, in.lse_cpu, in.lse_gpu);
    if (ws) cudaFree(ws);
    free(pat);
    inputs_free(&in);
}

/* One call at an offset on the CPU and the GPU (GPU output poisoned first), compared; lse_cpu /
 * lse_gpu NULL: no LSE. */
static void offset_case(const char *what, const shape *s, int64_t q_len, pair *q, inputs *in,
                        const mi_head_pattern *pat, const mi_prefill_params *pp, pair *oc, pair *og,
                        float *lse_cpu, float *lse_gpu) {
    char name[220], sh[128];
    poison(og->d.data, og->bytes);
    MI_OK(g_cpu, mi_prefill_attention(g_cpu, &q->h, &in->k.h, &in->v.h, NULL, pat, pp, &oc->h,
                                      lse_cpu, NULL, 0));
    MI_OK(g_gpu, mi_prefill_attention(g_gpu, &q->d, &in->k.d, &in->v.d, NULL, pat, pp, &og->d,
                                      lse_gpu, NULL, 0));
    MI_OK(g_gpu, mi_context_synchronize(g_gpu));
    snprintf(name, sizeof name, "%s q_len %lld [%s]", what, (long long)q_len,
             shape_str(s, sh, sizeof sh));
    compare_out(name, &oc->h, &og->d, NULL, lse_cpu, lse_gpu);
}

/* Queries at an offset (a follow-up turn or a later chunk over a cache): the last q_len rows of
 * q against every key, one pattern per head as test_prefill, on the GPU against the CPU (a
 * block-sparse row block that starts before the offset pools the chunk's rows only). */
/* One layer of the heads' patterns pat on the GPU against the CPU reference (dense_below as
 * the prefill's), checked as "what [shape]"; with dense_too (patterns that keep every key), also
 * against dense attention. */
static void pattern_case(const shape *s, const mi_head_pattern *pat, int32_t dense_below,
                         const char *what, int dense_too) {
    char name[240], sh[128];
    inputs in;
    inputs_make(&in, s, 1);
    round_qk(&in); /* estimates away from near-ties */
    mi_prefill_params pp = mi_prefill_default_params();
    pp.dense_below = dense_below;
    inputs_poison(&in);
    MI_OK(g_cpu, mi_prefill_attention(g_cpu, &in.q.h, &in.k.h, &in.v.h, in.lens, pat, &pp,
                                      &in.o_cpu.h, in.lse_cpu, NULL, 0));
    MI_OK(g_gpu, mi_prefill_attention(g_gpu, &in.q.d, &in.k.d, &in.v.d, in.lens, pat, &pp,
                                      &in.o_gpu.d, in.lse_gpu, NULL, 0));
    MI_OK(g_gpu, mi_context_synchronize(g_gpu));
    snprintf(name, sizeof name, "%s [%s]", what, shape_str(s, sh, sizeof sh));
    compare_out(name, &in.o_cpu.h, &in.o_gpu.d, in.lens, in.lse_cpu, in.lse_gpu);
    if (dense_too) {
        MI_OK(g_cpu, mi_attention_dense(g_cpu, &in.q.h, &in.k.h, &in.v.h, in.lens, 0.0f,
                                        &in.o_cpu.h, in.lse_cpu));
        snprintf(name, sizeof name, "%s == dense [%s]", what, shape_str(s, sh, sizeof sh));
        compare_out(name, &in.o_cpu.h, &in.o_gpu.d, in.lens, in.lse_cpu, in.lse_gpu);
    }
    inputs_free(&in);
}

/* XAttention heads (threshold per mille; strides S and 2S alternate, so one launch mixes them),
 * with every third head vertical-slash and every third A-shape where mixed. */
static void xattn_patterns(mi_head_pattern *pat, int64_t H, int32_t stride, int32_t threshold,
                           int mixed) {
    for (int64_t h = 0; h < H; h++) {
        pat[h] = mi_head_pattern_default(MI_PATTERN_XATTENTION);
        pat[h].stride = h % 2 && 2 * stride <= 64 ? 2 * stride : stride;
        pat[h].threshold = threshold;
        if (mixed && h % 3 == 1) {
            pat[h] = mi_head_pattern_default(MI_PATTERN_VERTICAL_SLASH);
            pat[h].vertical_size = 100, pat[h].slash_size = 400;
        }
        if (mixed && h % 3 == 2) {
            pat[h] = mi_head_pattern_default(MI_PATTERN_A_SHAPE);
            pat[h].n_init = 16, pat[h].n_local = 200;
        }
    }
}

/* XAttention's estimate and the sparse kernel on the GPU against the CPU reference; a
 * threshold of 1000 keeps every block, so there the GPU must also equal dense attention. */
static void test_xattn(const shape *s, int32_t stride, int32_t threshold, int mixed) {
    char what[96];
    mi_head_pattern *pat = malloc(s->H * sizeof(mi_head_pattern));
    xattn_patterns(pat, s->H, stride, threshold, mixed);
    snprintf(what, sizeof what, "xattention stride %d threshold %d%s", stride, threshold,
             mixed ? " mixed" : "");
    pattern_case(s, pat, 0, what, threshold >= 1000 && !mixed);
    free(pat);
}

/* FlexPrefill heads (gamma and tau per mille), with every third head vertical-slash and every
 * third XAttention where mixed. */
static void flex_patterns(mi_head_pattern *pat, int64_t H, int32_t gamma, int32_t tau, int mixed) {
    for (int64_t h = 0; h < H; h++) {
        pat[h] = mi_head_pattern_default(MI_PATTERN_FLEXPREFILL);
        pat[h].threshold = gamma;
        pat[h].tau = tau;
        if (mixed && h % 3 == 1) {
            pat[h] = mi_head_pattern_default(MI_PATTERN_VERTICAL_SLASH);
            pat[h].vertical_size = 100, pat[h].slash_size = 400;
        }
        if (mixed && h % 3 == 2) {
            pat[h] = mi_head_pattern_default(MI_PATTERN_XATTENTION);
            pat[h].stride = 8, pat[h].threshold = 900;
        }
    }
}

/* FlexPrefill's estimate and the sparse kernel on the GPU against the CPU reference. tau 0
 * makes every head vertical-slash and 1000 every head query-aware (the square root of a
 * Jensen-Shannon divergence is at most 0.833), so the decision cannot flip on rounding there;
 * gamma 1000 keeps every block, which must equal dense attention. */
static void test_flex(const shape *s, int32_t gamma, int32_t tau, int mixed) {
    char what[96];
    mi_head_pattern *pat = malloc(s->H * sizeof(mi_head_pattern));
    flex_patterns(pat, s->H, gamma, tau, mixed);
    snprintf(what, sizeof what, "flexprefill gamma %d tau %d%s", gamma, tau, mixed ? " mixed" : "");
    pattern_case(s, pat, 0, what, gamma >= 1000 && !mixed);
    free(pat);
}

/* Dilated and strided heads (rowmask.cu: a fixed key set per row) on the GPU against the CPU.
 * Head h takes pattern h % 8 (h / 2 % 8 where mixed): dilated with sinks and dense local keys,
 * without either, with dilation 1 (a window), with the dilated2 shape scaled to L; strided with
 * periods that divide 64 (64), do not (7, 100), and one past a third of L (three rows a residue:
 * CTAs of few rows in the second pass). mixed: every odd head A-shape or vertical-slash, so that
 * one layer runs the rowmask kernel beside the others. dense_below > 0: every sparse head dense
 * on shorter sequences (the rowmask kernel must leave those rows to the dense one). q_len > 0:
 * the last q_len rows as queries at an offset (s->B == 1). Without any of these, a period of 1
 * keeps every key and must equal dense attention. */
static mi_head_pattern rowmask_pattern(int64_t i, int64_t L) {
    mi_head_pattern p =
        mi_head_pattern_default(i % 8 < 4 ? MI_PATTERN_DILATED : MI_PATTERN_STRIDED);
    const int32_t l = (int32_t)L;
    switch (i % 8) {
    case 0: p.n_init = 16, p.n_local = 300, p.stride = 3, p.dense_local = 40; break;
    case 1: p.n_init = 0, p.n_local = 250, p.stride = 2, p.dense_local = 0; break;
    case 2: p.n_init = 4, p.n_local = l / 2 + 1, p.stride = 1, p.dense_local = 0; break;
    case 3: p.n_init = l / 8, p.n_local = l * 3 / 4 + 1, p.stride = 2, p.dense_local = l / 4; break;
    case 4: p.stride = 64; break;
    case 5: p.stride = 7; break;
    case 6: p.stride = 100; break;
    case 7: p.stride = l / 3 + 1; break;
    }
    return p;
}

static void test_rowmask_rules(const shape *s, int mixed, int32_t dense_below, int64_t q_len) {
    const int64_t B = s->B, H = s->H, L = s->L, D = s->D;
    mi_head_pattern *pat = malloc(H * sizeof(mi_head_pattern));
    for (int64_t h = 0; h < H; h++) {
        pat[h] = rowmask_pattern(mixed ? h / 2 : h, L);
        if (mixed && h % 4 == 1) {
            pat[h] = mi_head_pattern_default(MI_PATTERN_A_SHAPE);
            pat[h].n_init = 16, pat[h].n_local = 200;
        }
        if (mixed && h % 4 == 3) {
            pat[h] = mi_head_pattern_default(MI_PATTERN_VERTICAL_SLASH);
            pat[h].vertical_size = 100, pat[h].slash_size = 400;
        }
    }
    mi_prefill_params pp = mi_prefill_default_params();
    pp.dense_below = dense_below;
    char what[96];
    snprintf(what, sizeof what, "dilated/strided%s%s", mixed ? " mixed" : "",
             dense_below > 0 ? " dense below" : "");
    if (q_len > 0) {
        inputs in;
        inputs_make(&in, s, 1);
        round_qk(&in); /* the vertical-slash heads' estimate away from near-ties */
        pair q = pair_alloc(s->dt, B, H, q_len, D, s->blhd);
        pair oc = pair_alloc(s->dt, B, H, q_len, D, s->blhd);
        pair og = pair_alloc(s->dt, B, H, q_len, D, s->blhd);
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t l = 0; l < q_len; l++)
                    for (int64_t d = 0; d < D; d++)
                        set_f(&q.h, b, h, l, d, get_f(&in.q.h, b, h, L - q_len + l, d));
        upload(&q);
        const size_t nl = (size_t)(B * H * q_len);
        float *lse_cpu = malloc(nl * sizeof(float)), *lse_gpu = NULL;
        CUDA_OK(cudaMalloc((void **)&lse_gpu, nl * sizeof(float)));
        poison(lse_gpu, nl * sizeof(float));
        strncat(what, " at offset", sizeof what - strlen(what) - 1);
        offset_case(what, s, q_len, &q, &in, pat, &pp, &oc, &og, lse_cpu, lse_gpu);
        cudaFree(lse_gpu);
        free(lse_cpu);
        pair_free(&q);
        pair_free(&oc);
        pair_free(&og);
        inputs_free(&in);
    } else {
        pattern_case(s, pat, dense_below, what, 0);
    }
    if (!mixed && dense_below <= 0 && q_len == 0) {
        /* strided period 1 and dilated with dilation 1 over the whole length: every key */
        for (int64_t h = 0; h < H; h++) {
            pat[h] = mi_head_pattern_default(h % 2 ? MI_PATTERN_STRIDED : MI_PATTERN_DILATED);
            pat[h].stride = 1;
            if (h % 2 == 0) pat[h].n_init = 3, pat[h].n_local = (int32_t)L;
        }
        pattern_case(s, pat, 0, "dilated/strided keeping every key", 1);
    }
    free(pat);
}

/* Dilated and strided heads (the row kernel) on the GPU against the CPU reference: set 0
 * dilated with sinks and a dilated span (stride 2), 1 dilated with a dense local band (stride
 * 3), 2 strided with a period dividing 64, 3 strided with one that does not, 4 strided with
 * period 1 (every key: dense), 5 alternating dilated and strided heads mixed with
 * vertical-slash and A-shape ones in one layer. */
static void test_rowmask(const shape *s, int set) {
    char what[64];
    mi_head_pattern *pat = malloc(s->H * sizeof(mi_head_pattern));
    for (int64_t h = 0; h < s->H; h++) {
        mi_head_pattern d = mi_head_pattern_default(MI_PATTERN_DILATED);
        d.n_init = 40, d.n_local = 300, d.stride = 2, d.dense_local = 0;
        if (set == 1) d.n_init = 7, d.n_local = 500, d.stride = 3, d.dense_local = 90;
        mi_head_pattern st = mi_head_pattern_default(MI_PATTERN_STRIDED);
        st.stride = set == 2 ? 32 : set == 3 ? 37 : set == 4 ? 1 : 48;
        pat[h] = set <= 1 ? d : st;
        if (set == 5) {
            if (h % 4 == 0) pat[h] = d;
            if (h % 4 == 2) {
                pat[h] = mi_head_pattern_default(MI_PATTERN_VERTICAL_SLASH);
                pat[h].vertical_size = 100, pat[h].slash_size = 400;
            }
            if (h % 4 == 3) {
                pat[h] = mi_head_pattern_default(MI_PATTERN_A_SHAPE);
                pat[h].n_init = 16, pat[h].n_local = 200;
            }
        }
    }
    snprintf(what, sizeof what, "row-mask set %d", set);
    pattern_case(s, pat, 0, what, set == 4);
    free(pat);
}

/* variant of test_prefill_offset: 0 the five base patterns, 1 XAttention mixed in, 2
 * FlexPrefill mixed in, 3 dilated and strided mixed in */
static void test_prefill_offset(const shape *s, int64_t q_len, int variant) {
    inputs in;
    inputs_make(&in, s, 1);
    round_qk(&in);
    const int64_t B = s->B, H = s->H, L = s->L, D = s->D;
    pair q = pair_alloc(s->dt, B, H, q_len, D, s->blhd);
    pair oc = pair_alloc(s->dt, B, H, q_len, D, s->blhd);
    pair og = pair_alloc(s->dt, B, H, q_len, D, s->blhd);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t l = 0; l < q_len; l++)
                for (int64_t d = 0; d < D; d++)
                    set_f(&q.h, b, h, l, d, get_f(&in.q.h, b, h, L - q_len + l, d));
    upload(&q);
    mi_head_pattern *pat = malloc(H * sizeof(mi_head_pattern));
    for (int64_t h = 0; h < H; h++) {
        const mi_pattern_type t = (mi_pattern_type)(h % 5);
        pat[h] = mi_head_pattern_default(t);
        if (t == MI_PATTERN_A_SHAPE) pat[h].n_init = 16, pat[h].n_local = 200;
        if (t == MI_PATTERN_TRI_SHAPE) pat[h].n_init = 8, pat[h].n_local = 100, pat[h].n_last = 70;
        if (t == MI_PATTERN_VERTICAL_SLASH) pat[h].vertical_size = 100, pat[h].slash_size = 400;
        if (t == MI_PATTERN_BLOCK_SPARSE) pat[h].top_k = 4;
    }
    if (variant == 1) xattn_patterns(pat, H, 8, 900, 1);
    if (variant == 2) flex_patterns(pat, H, 900, 1000, 1);
    for (int64_t h = 0; variant == 3 && h < H; h += 2) {
        pat[h] = mi_head_pattern_default(h % 4 ? MI_PATTERN_STRIDED : MI_PATTERN_DILATED);
        if (h % 4)
            pat[h].stride = 37;
        else
            pat[h].n_init = 40, pat[h].n_local = 300, pat[h].dense_local = 20;
    }
    mi_prefill_params pp = mi_prefill_default_params();
    pp.dense_below = 0;
    const size_t nl = (size_t)(B * H * q_len);
    float *lse_cpu = malloc(nl * sizeof(float)), *lse_gpu = NULL;
    CUDA_OK(cudaMalloc((void **)&lse_gpu, nl * sizeof(float)));
    poison(lse_gpu, nl * sizeof(float));
    offset_case(variant == 1   ? "xattention at offset"
                : variant == 2 ? "flexprefill at offset"
                : variant == 3 ? "dilated and strided at offset"
                               : "prefill at offset",
                s, q_len, &q, &in, pat, &pp, &oc, &og, lse_cpu, lse_gpu);
    /* every head dense: the plan's one dense launch */
    for (int64_t h = 0; h < H; h++) pat[h] = mi_head_pattern_default(MI_PATTERN_DENSE);
    offset_case("dense prefill at offset", s, q_len, &q, &in, pat, &pp, &oc, &og, NULL, NULL);
    cudaFree(lse_gpu);
    free(lse_cpu);
    free(pat);
    pair_free(&q);
    pair_free(&oc);
    pair_free(&og);
    inputs_free(&in);
}

/* Whether the library runs its sm_90a kernels here (as mi_cuda_sm90_on decides). */
static int gpu_runs_sm90(void) {
    int dev = 0, major = 0, minor = 0;
    CUDA_OK(cudaGetDevice(&dev));
    CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_OK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    mi_tuning t;
    MI_OK(g_gpu, mi_context_get_tuning(g_gpu, &t));
    return major == 9 && minor == 0 && strstr(mi_build_features(), "sm_90a") != NULL && t.sm90 >= 0;
}

/* The prefill's per-head dense fallback: the GPU with dense_below (-1: the library's rule,
 * dense_fallback.h) against the CPU run twice with dense_below = 0, with the patterns and with
 * every head dense; (b, h) must match the second where its sequence is shorter than the head's
 * crossover, else the first. Sequences that straddle some heads' crossovers run those heads
 * dense for one and sparse for the other (the ring kernel's per-(b, h) choice); full lengths
 * take the dense heads apart to the dense kernel on Hopper. */
static void test_prefill_crossover(const shape *s, const mi_head_pattern *pat,
                                   int32_t dense_below) {
    char name[320], sh[128];
    inputs in;
    inputs_make(&in, s, 0);
    round_qk(&in);
    const int64_t B = s->B, H = s->H, L = s->L, D = s->D;
    mi_head_pattern *dense = malloc(H * sizeof(mi_head_pattern));
    for (int64_t h = 0; h < H; h++) dense[h] = mi_head_pattern_default(MI_PATTERN_DENSE);
    const mi_cuda_pattern_counts counts = mi_cuda_count_patterns(pat, H, B);
    const int sm90 = gpu_runs_sm90();
    mi_prefill_params cpu_pp = mi_prefill_default_params(), gpu_pp = cpu_pp;
    cpu_pp.dense_below = 0;
    gpu_pp.dense_below = dense_below;
    const size_t nlse = (size_t)(B * H * L);
    float *lse_dense = malloc(nlse * sizeof(float));
    pair o_dense = pair_alloc(s->dt, B, H, L, D, s->blhd);
    MI_OK(g_cpu, mi_prefill_attention(g_cpu, &in.q.h, &in.k.h, &in.v.h, in.lens, pat, &cpu_pp,
                                      &in.o_cpu.h, in.lse_cpu, NULL, 0));
    MI_OK(g_cpu, mi_prefill_attention(g_cpu, &in.q.h, &in.k.h, &in.v.h, in.lens, dense, &cpu_pp,
                                      &o_dense.h, lse_dense, NULL, 0));
    int64_t n_dense = 0, n_sparse = 0; /* (b, h) of each kind, non-dense heads */
    for (int64_t b = 0; b < B; b++) {
        const int64_t len = in.lens ? in.lens[b] : L;
        for (int64_t h = 0; h < H; h++) {
            if (pat[h].type == MI_PATTERN_DENSE) continue;
            const int32_t from = mi_cuda_dense_below_of(&pat[h], dense_below, D, sm90, counts);
            if (from <= 0 || len >= from) {
                n_sparse++;
                continue;
            }
            n_dense++;
            for (int64_t l = 0; l < L; l++) {
                for (int64_t d = 0; d < D; d++)
                    set_f(&in.o_cpu.h, b, h, l, d, get_f(&o_dense.h, b, h, l, d));
                in.lse_cpu[(b * H + h) * L + l] = lse_dense[(b * H + h) * L + l];
            }
        }
    }
    inputs_poison(&in);
    MI_OK(g_gpu, mi_prefill_attention(g_gpu, &in.q.d, &in.k.d, &in.v.d, in.lens, pat, &gpu_pp,
                                      &in.o_gpu.d, in.lse_gpu, NULL, 0));
    MI_OK(g_gpu, mi_context_synchronize(g_gpu));
    snprintf(name, sizeof name,
             "prefill crossover dense_below %d (%lld (b, h) dense, %lld sparse) [%s]", dense_below,
             (long long)n_dense, (long long)n_sparse, shape_str(s, sh, sizeof sh));
    compare_out(name, &in.o_cpu.h, &in.o_gpu.d, in.lens, in.lse_cpu, in.lse_gpu);
    pair_free(&o_dense);
    free(lse_dense);
    free(dense);
    inputs_free(&in);
}

static void test_errors(void) {
    /* fp32 and D = 96 are refused with UNSUPPORTED and a message */
    void *d = NULL;
    CUDA_OK(cudaMalloc(&d, 4 << 20));
    char *c = d;
    mi_tensor q32 = mi_tensor_bhld(c, MI_DTYPE_F32, MI_DEVICE_CUDA, 1, 1, 64, 64);
    mi_tensor k32 = mi_tensor_bhld(c + (1 << 20), MI_DTYPE_F32, MI_DEVICE_CUDA, 1, 1, 64, 64);
    mi_tensor v32 = mi_tensor_bhld(c + (2 << 20), MI_DTYPE_F32, MI_DEVICE_CUDA, 1, 1, 64, 64);
    mi_tensor o32 = mi_tensor_bhld(c + (3 << 20), MI_DTYPE_F32, MI_DEVICE_CUDA, 1, 1, 64, 64);
    mi_status st = mi_attention_dense(g_gpu, &q32, &k32, &v32, NULL, 0, &o32, NULL);
    check(st == MI_STATUS_UNSUPPORTED && strlen(mi_context_last_error(g_gpu)) > 0,
          mi_context_last_error(g_gpu), "fp32 on CUDA is UNSUPPORTED");
    mi_tensor q96 = mi_tensor_bhld(q32.data, MI_DTYPE_BF16, MI_DEVICE_CUDA, 1, 1, 64, 96);
    mi_tensor k96 = mi_tensor_bhld(k32.data, MI_DTYPE_BF16, MI_DEVICE_CUDA, 1, 1, 64, 96);
    mi_tensor v96 = mi_tensor_bhld(v32.data, MI_DTYPE_BF16, MI_DEVICE_CUDA, 1, 1, 64, 96);
    mi_tensor o96 = mi_tensor_bhld(o32.data, MI_DTYPE_BF16, MI_DEVICE_CUDA, 1, 1, 64, 96);
    st = mi_attention_dense(g_gpu, &q96, &k96, &v96, NULL, 0, &o96, NULL);
    check(st == MI_STATUS_UNSUPPORTED && strlen(mi_context_last_error(g_gpu)) > 0,
          mi_context_last_error(g_gpu), "D = 96 on CUDA is UNSUPPORTED");
    /* the patterns without CUDA kernels are refused by name, never run wrong */
    mi_tensor qb = mi_tensor_bhld(q32.data, MI_DTYPE_BF16, MI_DEVICE_CUDA, 1, 1, 64, 64);
    mi_tensor kb = mi_tensor_bhld(k32.data, MI_DTYPE_BF16, MI_DEVICE_CUDA, 1, 1, 64, 64);
    mi_tensor vb = mi_tensor_bhld(v32.data, MI_DTYPE_BF16, MI_DEVICE_CUDA, 1, 1, 64, 64);
    mi_tensor ob = mi_tensor_bhld(o32.data, MI_DTYPE_BF16, MI_DEVICE_CUDA, 1, 1, 64, 64);
    const mi_pattern_type refused[1] = {MI_PATTERN_INFLLM};
    mi_prefill_params pp = mi_prefill_default_params();
    pp.dense_below = 0;
    for (int i = 0; i < 1; i++) {
        const mi_head_pattern p = mi_head_pattern_default(refused[i]);
        st = mi_prefill_attention(g_gpu, &qb, &kb, &vb, NULL, &p, &pp, &ob, NULL, NULL, 0);
        check(st == MI_STATUS_UNSUPPORTED &&
                  strstr(mi_context_last_error(g_gpu), mi_pattern_name(refused[i])) != NULL,
              mi_context_last_error(g_gpu), "a pattern without CUDA kernels is UNSUPPORTED");
    }
    cudaFree(d);
}

int main(int argc, char **argv) {
    int quick = 0;
    const char *tuning = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--tuning") == 0 && i + 1 < argc) {
            tuning = argv[++i];
        } else {
            fprintf(stderr, "usage: test_cuda [--quick] [--tuning name=value,...]\n");
            return 2;
        }
    }
    const char *seed_env = getenv("MI_TEST_SEED");
    const uint64_t seed = seed_env ? strtoull(seed_env, NULL, 10) : 20261130ull;
    g_rng = seed;
    if (mi_cuda_device_count() <= 0) {
        printf("SKIP: no CUDA device (or a build without CUDA)\n");
        return SKIP;
    }
    mi_context_params cp = mi_context_default_params();
    cp.device = MI_DEVICE_CPU;
    if (mi_context_create(&cp, &g_cpu) != MI_STATUS_SUCCESS) return 1;
    g_tuning = mi_tuning_default();
    if (tuning && mi_tuning_parse(g_cpu, tuning, &g_tuning) != MI_STATUS_SUCCESS) {
        fprintf(stderr, "test_cuda: %s\n", mi_context_last_error(g_cpu));
        return 2;
    }
    cp.device = MI_DEVICE_CUDA;
    cp.device_id = 0;
    mi_status st = mi_context_create(&cp, &g_gpu);
    if (st != MI_STATUS_SUCCESS) {
        printf("SKIP: CUDA context: %s\n", mi_status_name(st));
        return SKIP;
    }
    tune(NULL);
    /* what a saved log was measured on: the GPU and the library's commit */
    struct cudaDeviceProp prop;
    int dev = 0;
    CUDA_OK(cudaGetDevice(&dev));
    CUDA_OK(cudaGetDeviceProperties(&prop, dev));
    char tn[160];
    printf("seed %llu (MI_TEST_SEED), %s, commit %s, %s (%d SMs)%s\n", (unsigned long long)seed,
           mi_build_features(), mi_build_commit(), prop.name, prop.multiProcessorCount,
           tuning_str(tn, sizeof tn));

    const int64_t Ls_full[] = {1, 63, 64, 65, 1000, 4099};
    const int64_t Ls_quick[] = {1, 65, 1000};
    const int64_t *Ls = quick ? Ls_quick : Ls_full;
    const int nL = quick ? 3 : 6;
    const mi_dtype dts[2] = {MI_DTYPE_BF16, MI_DTYPE_F16};
    const int64_t gq[3][2] = {{4, 4}, {8, 2}, {8, 1}}; /* GQA 1, 4, 8 */

    test_errors();
    for (int li = 0; li < nL; li++) {
        for (int di = 0; di < 2; di++) {
            for (int g = 0; g < 3; g++) {
                if (quick && g == 1) continue;
                shape s = {1,       gq[g][0], gq[g][1], Ls[li], (li + g) % 2 ? 64 : 128,
                           dts[di], g == 2,   {0, 0}};
                test_dense(&s);
                test_ashape(&s, 4, 64, 0);
                test_ashape(&s, 128, 200, 30);
                if (!quick) test_ashape(&s, 0, 0, 0); /* rows with no key: 0, LSE -inf */
            }
            /* batch 2 with per-sequence lengths */
            shape sb = {2,   4,       2,       Ls[li],
                        128, dts[di], di == 1, {(int32_t)Ls[li], (int32_t)(Ls[li] / 2 + 1)}};
            test_dense(&sb);
            test_ashape(&sb, 16, 100, 20);
            /* batch 2 of full length: the warp-specialised dense kernel's batch coordinate, at
             * both head sizes */
            for (int64_t d = 64; d <= 128; d += 64) {
                shape se = {2, 8,       2,       Ls[li],
                            d, dts[di], di == 0, {(int32_t)Ls[li], (int32_t)Ls[li]}};
                test_dense(&se);
            }
        }
    }
    /* estimation, index, sparse and prefill */
    const int64_t Le_full[] = {1, 65, 1000, 4099};
    const int64_t Le_quick[] = {65, 1000};
    const int64_t *Le = quick ? Le_quick : Le_full;
    const int nLe = quick ? 2 : 4;
    for (int li = 0; li < nLe; li++) {
        for (int di = 0; di < 2; di++) {
            const int64_t L = Le[li];
            shape s1 = {1, 8, 2, L, di ? 64 : 128, dts[di], di, {0, 0}};
            shape s2 = {2, 4, 1, L, 128, dts[di], 0, {(int32_t)L, (int32_t)(L * 3 / 5 + 1)}};
            test_vs(&s1, 0, 0, 1);     /* minimum budgets 30 / 50 */
            test_vs(&s1, 200, 300, 1); /* structured */
            test_vs(&s2, 100, 500, 0); /* random, varlen */
            /* batch 2 of full length: the warp-specialised sparse kernel's batch coordinate */
            shape s3 = {2, 4, 2, L, 128, dts[di], di, {(int32_t)L, (int32_t)L}};
            test_vs(&s3, 100, 500, 0);
            test_block_sparse(&s3, 3, 0);
            if (!quick) test_vs(&s1, 100000, 100000, 0); /* budgets > L: every key */
            test_block_sparse(&s1, 0, 0);
            test_block_sparse(&s2, 5, 0);
            if (!quick) test_block_sparse(&s1, 100000, 0);
            const int32_t l2 = (int32_t)(L / 2 + 3 < L ? L / 2 + 3 : L);
            shape sp = {2, 10, 2, L, 128, dts[di], di, {(int32_t)L, l2}};
            test_prefill(&sp, 1, 0);
            test_prefill(&sp, 0, 1);
            test_block_sparse(&sp, 4, 1);
            test_block_sparse(&s1, 20, 1);
            /* full lengths: the sparse heads of the mixed launch may take the warp-specialised
             * sparse kernel, the others the ring kernel */
            shape sf = {1, 10, 2, L, 128, dts[di], di, {0, 0}};
            test_prefill(&sf, 1, 0);
            /* queries at an offset: one row, fewer than the estimate's 64, a row block's worth
             * off the block grid, and most of the sequence */
            if (L > 64) {
                const int64_t qls[] = {1, 40, 64 + 17, L - 100 > 0 ? L - 100 : 1};
                for (int qi = 0; qi < 4; qi++) {
                    shape so = {1, 10, 2, L, di ? 64 : 128, dts[di], di, {0, 0}};
                    if (qls[qi] < L) test_prefill_offset(&so, qls[qi], 0);
                    if (qls[qi] < L && qi >= 2) test_prefill_offset(&so, qls[qi], 1);
                    if (qls[qi] < L && qi >= 2) test_prefill_offset(&so, qls[qi], 2);
                    if (qls[qi] < L) test_prefill_offset(&so, qls[qi], 3);
                }
            }
            /* XAttention: strides 8 / 16 and 4 / 8, 1 and 64 (the extremes of a 64-row block),
             * thresholds 900, 0 (the two forced blocks) and 1000 (every block: dense), a varlen
             * batch, D = 64, and mixed with other patterns in one layer */
            test_xattn(&s1, 8, 900, 0);
            test_xattn(&s2, 4, 950, 0);
            test_xattn(&s1, 64, 800, 0);
            test_xattn(&sf, 1, 900, 0);
            test_xattn(&s1, 8, 0, 0);
            test_xattn(&s2, 8, 1000, 0);
            test_xattn(&sp, 8, 900, 1);
            shape sx = {1, 4, 2, L, 64, dts[di], !di, {0, 0}};
            test_xattn(&sx, 16, 900, 0);
            /* FlexPrefill: vertical-slash only (tau 0), query-aware only (1000), the default
             * tau on a varlen batch, every block (dense), none beyond the forced ones, D = 64,
             * and mixed with other patterns in one layer */
            test_flex(&s1, 900, 0, 0);
            test_flex(&s1, 900, 1000, 0);
            test_flex(&s2, 950, 100, 0);
            test_flex(&s2, 1000, 1000, 0);
            test_flex(&s1, 0, 1000, 0);
            test_flex(&sx, 800, 1000, 0);
            test_flex(&sp, 900, 1000, 1);
            /* dilated and strided: each rule, a varlen batch, D = 64, a mixed layer */
            for (int set = 0; set < 6; set++) test_rowmask(set % 2 ? &s2 : &s1, set);
            test_rowmask(&sx, 0);
            test_rowmask(&sx, 3);
            test_rowmask(&sp, 5);
            /* and every rule: one sequence, varlen D = 64, mixed with other patterns, the short
             * sequence dense by length, queries at an offset */
            test_rowmask_rules(&s1, 0, 0, 0);
            shape sr = {2, 8, 2, L, 64, dts[di], !di, {(int32_t)L, (int32_t)(L * 3 / 5 + 1)}};
            test_rowmask_rules(&sr, 0, 0, 0);
            shape srm = {2, 16, 4, L, 64, dts[di], di, {(int32_t)L, (int32_t)(L / 2 + 1)}};
            test_rowmask_rules(&srm, 1, 0, 0);
            if (L > 2) test_rowmask_rules(&srm, 1, (int32_t)(L * 3 / 4), 0);
            shape sro = {1, 8, 2, L, 64, dts[di], di, {0, 0}};
            if (L > 2) test_rowmask_rules(&sro, 1, 0, L / 3 + 1);
        }
    }
    for (int di = 0; di < 2; di++) {
        const int64_t Lr = quick ? 1000 : 4099;
        /* 32 heads: more work items than SMs, so that the persistent sparse kernel's CTAs
         * take several each */
        shape r1 = {1, 32, 8, Lr, 128, dts[di], di, {0, 0}};
        shape r2 = {2, 4, 1, 1000, 128, dts[di], !di, {1000, 1000}};
        shape r3 = {1, 2, 2, 130, 128, dts[di], 0, {0, 0}}; /* odd row-block count */
        for (int subset = 0; subset < 2; subset++) {
            test_sparse_random(&r1, subset);
            test_sparse_random(&r2, subset);
            test_sparse_random(&r3, subset);
        }
        shape m1 = {1, 6, 2, quick ? 1000 : 4099, 128, dts[di], di, {0, 0}};
        shape m2 = {2, 4, 2, 1000, 128, dts[di], !di, {1000, 1000}};
        test_sparse_mixed_heads(&m1);
        test_sparse_mixed_heads(&m2);
        shape c1 = {1, 6, 2, quick ? 1000 : 5000, 128, dts[di], di, {0, 0}};
        shape c2 = {2, 4, 4, 1300, 128, dts[di], !di, {1300, 1300}};
        test_sparse_prefix_columns(&c1);
        test_sparse_prefix_columns(&c2);
    }
    /* A-shape and Tri-shape at D = 128 and full lengths (the warp-specialised sparse kernel's
     * generated ranges): sinks and windows on and off 64-key pieces, the benchmark's 128 + 4096,
     * a window shorter than a piece, sinks past the sequence, last rows that straddle a row
     * block, 32 heads (several items per CTA), batch 2 */
    for (int di = 0; di < 2; di++) {
        const int64_t La = quick ? 5000 : 12000, Lb2 = quick ? 1300 : 3000;
        shape a1 = {1, 4, 2, La, 128, dts[di], di, {0, 0}};
        shape a2 = {2, 32, 8, Lb2, 128, dts[di], !di, {(int32_t)Lb2, (int32_t)Lb2}};
        test_ashape(&a1, 128, 4096, 0);
        test_ashape(&a1, 100, 1000, 0);
        test_ashape(&a1, 0, 63, 0);
        test_ashape(&a2, 64, 512, 0);
        test_ashape(&a2, 5000, 70, 0);
        test_ashape(&a1, 128, 4096, 64); /* Tri-shape: the last 64 rows see every key */
        test_ashape(&a2, 64, 512, 100);
        if (!quick) test_ashape(&a2, 1, 1, 0);
    }
    /* Tri-shape's last rows split over chunks of keys and merged (tuning tri_split=1: from the
     * first key on; 16384 keys by default): last rows inside one row block and across two or
     * three (Hopper computes row blocks in pairs: an odd count leaves a pair half outside), more
     * last rows than the sequence has (all but row 0 dense), a chunk of keys that starts inside
     * a pair's second row block (keys from 2048 on: none for the first), a varlen batch (each
     * sequence its own last rows; its padding is NaN, so Hopper runs those chunks on the sm_80
     * kernel) and a batch of equal lengths, GQA, both head sizes, and the layer call with mixed
     * heads */
    tune("tri_split=1");
    for (int di = 0; di < 2; di++) {
        const int64_t Lt = quick ? 3000 : 20000;
        shape t1 = {1, 4, 2, Lt, 128, dts[di], di, {0, 0}};
        shape t2 = {2, 8, 2, 2000, di ? 64 : 128, dts[di], !di, {2000, 1300}};
        shape t3 = {1, 4, 1, 2100, di ? 128 : 64, dts[di], di, {0, 0}};
        shape t4 = {2, 4, 2, 2100, di ? 64 : 128, dts[di], !di, {2100, 2100}};
        test_ashape(&t1, 128, 1024, 40);
        test_ashape(&t1, 16, 256, 100);
        test_ashape(&t3, 64, 256, 116);
        test_ashape(&t4, 64, 256, 116);
        test_ashape(&t2, 64, 512, 30);
        test_ashape(&t2, 0, 64, 5000);
        shape m3 = {1, 10, 2, quick ? 1000 : 4099, 128, dts[di], !di, {0, 0}};
        test_sparse_mixed_heads(&m3);
    }
    tune(NULL);
    /* The prefill's dense fallback per head: the library's rule (-1) on lengths that straddle
     * some heads' crossovers (A-shape 16 + 300 from 948 keys, 64 + 4000 from 12192, Tri-shape
     * 8 + 100 + 70 from 324, block-sparse top 4 from 12288 and top 100 from 19200 (one
     * estimate for both: the least crossover), vertical-slash from 40960 on so few heads; on
     * Hopper at D = 128) and one value for every head (2000) */
    {
        mi_head_pattern xp[8];
        for (int h = 0; h < 8; h++) xp[h] = mi_head_pattern_default((mi_pattern_type)(h % 5));
        xp[5] = mi_head_pattern_default(MI_PATTERN_BLOCK_SPARSE); /* top 100 */
        xp[1].n_init = 16, xp[1].n_local = 300;
        xp[6].n_init = 64, xp[6].n_local = 4000;
        xp[2].n_init = 8, xp[2].n_local = 100, xp[2].n_last = 70;
        xp[7].n_init = 8, xp[7].n_local = 100, xp[7].n_last = 70;
        xp[3].vertical_size = 100, xp[3].slash_size = 400;
        xp[4].top_k = 4;
        for (int di = 0; di < 2; di++) {
            shape x1 = {2, 8, 2, 3000, 128, dts[di], di, {3000, 700}};
            shape x2 = {2, 8, 2, 2500, 128, dts[di], !di, {1500, 2500}};
            test_prefill_crossover(&x1, xp, -1);
            test_prefill_crossover(&x2, xp, 2000);
            if (!quick) {
                shape x3 = {2, 8, 2, 13000, 128, dts[di], di, {13000, 5000}};
                shape x4 = {1, 8, 2, 13000, 128, dts[di], !di, {0, 0}};
                shape x5 = {2, 8, 2, 2500, 64, dts[di], di, {2500, 2500}};
                test_prefill_crossover(&x3, xp, -1);
                test_prefill_crossover(&x4, xp, -1);
                test_prefill_crossover(&x5, xp, 2000);
            }
        }
    }
    /* the select over vectors of several chunks */
    test_vs_long(quick ? 40000 : 100000, 0, MI_DTYPE_BF16);
    test_vs_long(40000, 1, MI_DTYPE_BF16);
    if (!quick) test_vs_long(40000, 1, MI_DTYPE_F16);
    /* the score kernels Hopper runs only when told to: the portable (mma.sync) one, and the
     * wgmma one with its keys by 16-byte copies instead of TMA; both head sizes and dtypes, a
     * (b, l, h, d) layout, varlen, several chunks */
    static const char *const vs_score_tunings[] = {"vs_wgmma=-1", "vs_score_tma=-1"};
    for (int vi = 0; vi < 2; vi++) {
        tune(vs_score_tunings[vi]);
        for (int di = 0; di < 2; di++) {
            shape p1 = {1, 8, 2, 4099, di ? 64 : 128, dts[di], di, {0, 0}};
            shape p2 = {2, 4, 1, 1000, 128, dts[di], !di, {1000, 601}};
            test_vs(&p1, 200, 300, 1);
            test_vs(&p2, 100, 500, 0);
        }
        test_vs_long(40000, 0, MI_DTYPE_BF16);
        tune(NULL);
    }
    /* the index build's walk: with its shortcuts (strictly ordered lists: the vertical prefix
     * counted by a search, runs of diagonals within 64 of each other taken at once), without
     * them, and with each kept column stored by its thread instead of as bits */
    static const char *const index_tunings[] = {NULL, "vs_index_shortcuts=-1", "vs_index_mask=-1"};
    for (int vi = 0; vi < 3; vi++) {
        tune(index_tunings[vi]);
        test_index_messy(1000, 40, 60, 0);
        test_index_messy(1000, 40, 60, 1);
        test_index_messy(4099, 300, 700, 1);
        test_index_messy(70, 5, 8, 0);
        test_index_bands(quick ? 9000 : 30000, 53);
        test_index_bands(quick ? 9000 : 30000, 9);
        tune(NULL);
    }

    /* block-sparse estimation on long rows. The streaming kernel: top 100 (the default here),
     * the largest top k it takes (192), D = 64, ramp inputs (compaction at every few tiles,
     * exact ties), and without bounds, with bounds of 1, 2 or 32 groups a tile (the last
     * sharing slots), pooled a value a thread, or with 256 or 128 candidate slots at top 100;
     * long row groups split into chunks (by default at Lb and Lr here: 4 (b, h) pairs), not
     * split, or split into the most chunks (4), with and without bounds; plain tiles appended
     * an n-tile at a time, and the index of that path against the default's, bit for bit.
     * The estimate through scores in memory (forced on): top 100, 192 at D = 64, ramp inputs,
     * top 300 (every key a candidate) and 2040 (more candidates than a warp's slots: the
     * select over the whole row), and its index against the streaming kernel's, bit for bit
     * (the same sums), also against split groups.
     * The row-holding kernel: its narrowing pass and (top 2040 of more than 2048) its
     * fallback, with 4 (the default here), 3, 2 and 1 row blocks per CTA, in CTAs of 256
     * threads (the default here) and in the wide ones of 512 */
    const int64_t Lb = quick ? 40000 : 140000, Lr = quick ? 20000 : 70000;
    test_block_sparse_long(Lb, 128, 100, 0, -1, BS_STREAM, 0);
    test_block_sparse_long(Lb, 128, 192, 0, -1, BS_STREAM, 0);
    test_block_sparse_long(Lb, 64, 100, 0, -1, BS_STREAM, 0);
    test_block_sparse_long(Lr, 128, 100, 0, -1, BS_STREAM, 1);
    test_block_sparse_long(Lb, 128, 100, 0, -1, BS_STREAM_NO_BOUND, 0);
    test_block_sparse_long(Lb, 128, 100, 0, -1, BS_STREAM_BOUND_1, 0);
    test_block_sparse_long(Lb, 64, 100, 0, -1, BS_STREAM_BOUND_2, 0);
    test_block_sparse_long(Lb, 128, 100, 0, -1, BS_STREAM_BOUND_32, 0);
    test_block_sparse_long(Lr, 128, 192, 0, -1, BS_STREAM_BOUND_32, 1);
    test_block_sparse_long(Lr, 128, 100, 0, -1, BS_STREAM_BOUND_2, 1);
    test_block_sparse_long(Lr, 64, 100, 0, -1, BS_STREAM_POOL_1, 0);
    test_block_sparse_long(Lb, 128, 100, 0, -1, BS_STREAM_WIDE, 0);
    test_block_sparse_long(Lr, 128, 100, 0, -1, BS_STREAM_WIDE, 1);
    test_block_sparse_long(Lb, 128, 100, 0, -1, BS_STREAM_NARROW, 0);
    test_block_sparse_long(Lr, 128, 100, 0, -1, BS_STREAM_NARROW, 1);
    test_block_sparse_long(Lr, 64, 100, 0, -1, BS_STREAM_NARROW, 0);
    test_block_sparse_long(Lb, 128, 100, 0, -1, BS_STREAM_NO_SPLIT, 0);
    test_block_sparse_long(Lr, 128, 100, 0, -1, BS_STREAM_NO_SPLIT, 1);
    test_block_sparse_long(Lb, 128, 100, 0, -1, BS_STREAM_SPLIT_4, 0);
    test_block_sparse_long(Lb, 128, 192, 0, -1, BS_STREAM_SPLIT_4, 0);
    test_block_sparse_long(Lb, 64, 100, 0, -1, BS_STREAM_SPLIT_4, 0);
    test_block_sparse_long(Lr, 128, 100, 0, -1, BS_STREAM_SPLIT_4, 1);
    test_block_sparse_long(Lr, 128, 192, 0, -1, BS_STREAM_SPLIT_4, 1);
    test_block_sparse_long(Lb, 128, 100, 0, -1, BS_STREAM_SPLIT_4_NO_BOUND, 0);
    test_block_sparse_long(Lr, 128, 100, 0, -1, BS_STREAM_SPLIT_4_NO_BOUND, 1);
    test_block_sparse_long(Lb, 128, 100, 0, -1, BS_STREAM_NTILE_APPEND, 0);
    test_block_sparse_long(Lr, 128, 100, 0, -1, BS_STREAM_NTILE_APPEND, 1);
    /* paths that score with the same sums give the same index, bit for bit: the streaming
     * kernel's two ways of appending, the two pooling kernels, and the scores in memory against
     * the streaming kernel */
    const struct {
        bs_kernel kern, ref;
        int64_t L, D;
        int32_t topk;
        int ramp;
        const char *extra;
    } agree[] = {
        {BS_STREAM, BS_STREAM_NTILE_APPEND, Lb, 128, 100, 0, NULL},
        {BS_STREAM, BS_STREAM_NTILE_APPEND, Lb, 128, 192, 0, NULL},
        {BS_STREAM, BS_STREAM_NTILE_APPEND, Lb, 64, 100, 0, NULL},
        {BS_STREAM, BS_STREAM_NTILE_APPEND, Lr, 128, 100, 1, NULL},
        {BS_STREAM, BS_STREAM_NTILE_APPEND, Lr, 128, 100, 1, "bs_cap=128"},
        {BS_STREAM, BS_STREAM_NTILE_APPEND, Lb, 128, 100, 0, "bs_cap=256"},
        {BS_STREAM, BS_STREAM_NTILE_APPEND, Lb, 128, 100, 0, "bs_split=-1"},
        {BS_STREAM, BS_STREAM_NTILE_APPEND, Lb, 128, 100, 0, "bs_split=1"},
        {BS_STREAM, BS_STREAM_NTILE_APPEND, Lr, 128, 100, 1, "bs_split=1"},
        {BS_STREAM, BS_STREAM_NTILE_APPEND, Lb, 128, 100, 0, "bs_bound=-1"},
        {BS_STREAM, BS_STREAM_POOL_1, Lb, 128, 100, 1, NULL},
        {BS_SCORES_MMA, BS_STREAM_NO_SCORES, Lb, 128, 100, 0, NULL},
        {BS_SCORES_MMA, BS_STREAM_NO_SCORES, Lb, 64, 192, 0, NULL},
        {BS_SCORES_MMA, BS_STREAM_NO_SCORES, Lr, 128, 100, 1, NULL},
        {BS_SCORES_MMA, BS_STREAM_NO_SCORES, Lr, 128, 192, 1, "bs_split=1"},
        {BS_SCORES, BS_STREAM_NO_SCORES, Lb, 128, 100, 0, NULL},
        {BS_SCORES, BS_STREAM_NO_SCORES, Lb, 64, 192, 0, NULL},
        {BS_SCORES, BS_STREAM_NO_SCORES, Lr, 128, 100, 1, NULL},
        {BS_SCORES, BS_SCORES_NO_TMA, Lb, 128, 100, 0, NULL},
        {BS_SCORES, BS_SCORES_NO_TMA, Lr, 128, 300, 1, NULL},
        {BS_SCORES, BS_SCORES_EXACT_BOUND, Lb, 128, 100, 0, NULL},
        {BS_SCORES, BS_SCORES_EXACT_BOUND, Lb, 64, 192, 0, NULL},
        {BS_SCORES, BS_SCORES_EXACT_BOUND, Lr, 128, 100, 1, NULL},
        {BS_SCORES_LOOSE_BOUND, BS_SCORES_EXACT_BOUND, Lr, 128, 100, 1, NULL},
        {BS_SCORES_LOOSE_BOUND, BS_SCORES_EXACT_BOUND, Lb, 128, 300, 0, NULL},
    };
    for (size_t i = 0; i < sizeof agree / sizeof agree[0]; i++)
        test_block_sparse_paths_agree(agree[i].kern, agree[i].ref, agree[i].L, agree[i].D,
                                      agree[i].topk, agree[i].ramp, agree[i].extra);
    test_block_sparse_long(Lb, 128, 100, 0, -1, BS_SCORES, 0);
    test_block_sparse_long(Lb, 64, 192, 0, -1, BS_SCORES, 0);
    test_block_sparse_long(Lr, 128, 100, 0, -1, BS_SCORES, 1);
    test_block_sparse_long(Lr, 128, 300, 0, -1, BS_SCORES, 1);
    test_block_sparse_long(Lb, 128, 2040, 0, -1, BS_SCORES, 0);
    test_block_sparse_long(Lb, 128, 100, 0, -1, BS_SCORES_MMA, 0);
    test_block_sparse_long(Lr, 128, 300, 0, -1, BS_SCORES_MMA, 1);
    if (!quick) test_block_sparse_long(70000, 128, 100, 0, -1, BS_STREAM_NO_BOUND, 1);
    test_block_sparse_long(Lb, 128, 100, 0, -1, BS_ROWS, 0);
    test_block_sparse_long(Lb, 128, 100, 0, 1, BS_ROWS, 0);
    test_block_sparse_long(Lb, 64, 100, 3, 1, BS_ROWS, 0);
    test_block_sparse_long(Lb, 128, 2040, 1, -1, BS_STREAM, 0);
    if (!quick) {
        test_block_sparse_long(Lb, 128, 700, 2, 1, BS_STREAM, 0);
        test_block_sparse_long(70000, 128, 100, 0, -1, BS_ROWS, 1);
    }

    printf("%s: %d passed, %d failed\n", g_fail ? "FAILED" : "OK", g_pass, g_fail);
    mi_context_destroy(g_gpu);
    mi_context_destroy(g_cpu);
    return g_fail ? 1 : 0;
}
