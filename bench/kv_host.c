/*
 * kv_host.c: the host cost of the KV methods, per layer: the work that runs on the host after a
 * prefill (also a CUDA one: a method's session keeps host pages) and at every decode step.
 *
 *   bench_kv_host [--lens 131072,...] [--heads 32] [--kv-heads 8] [--dim 128] [--layers 32]
 *                 [--layer 16] [--kv "snapkv;pyramidkv;kivi:bits=2;quest:token_budget=4096;..."]
 *                 [--dtype 0|3] [--repeats 3] [--threads N] [--sweep N]
 *
 * Per method and length, one layer of random rows (the LLaMA-3-8B shape by default; layer 16, past
 * Quest's dense first layers, in the middle of PyramidKV's budgets):
 *   append         the rows into the method's pool (f32 pages with Quest's key bounds, as a CUDA
 *                  model's method sessions keep, fp8 with --dtype 3; KIVI its own quantized
 *                  pages), which includes the encoding;
 *   after prefill  the method's step after the prompt (SnapKV and PyramidKV: the observation
 *                  window's scores, the ranking and the compaction; RetrievalAttention: the
 *                  index), on a fork of the layer with the window's queries; with --sweep N,
 *                  on N consecutive layers (the same rows) by one method, as a call's layers
 *                  follow each other (a method may keep its buffers from one to the next);
 *   select         one decode row's selection (Quest's page ranking, RetrievalAttention's search);
 *   decode         one decode row's whole host attention (mim_seq_attend: the selection, then
 *                  the attention over what it picked, on --threads threads), the part of a CUDA
 *                  model's decode step that a method runs on the host, per layer;
 *   read           the whole layer read back into bf16 rows, as a CUDA model's upload from
 *                  pageable pages does (an offloaded layer's every call).
 * Medians of --repeats runs; the per-token columns multiply by --layers. Random rows make every
 * row about as likely as any other: the cost, not the choice, is what this measures.
 */
#include "args.h"
#include "kv_method.h"
#include "minference_kv.h"
#include "model_runner.h"
#include "tool_util.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static uint64_t rng = 88172645463325252ull;
static float rnd(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static double median(double *t, int n) {
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    return t[n / 2];
}

static const char usage_text[] =
    "usage: bench_kv_host [--lens L1,L2,...] [--heads H] [--kv-heads H] [--dim D]\n"
    "         [--layers N] [--layer I] [--kv METHOD[:key=value,...][;METHOD...]]\n"
    "         [--dtype 0 (f32 pages) | 3 (fp8 pages)] [--repeats R] [--threads N]\n"
    "         [--sweep N]\n";

typedef struct bench_cfg {
    int heads, kv_heads, dim, layers, layer, dtype, repeats, threads, sweep;
    mim_pool *pool;
} bench_cfg;

/* One method at one length: prints a row; nonzero on failure. */
static int run_one(const bench_cfg *c, const char *spec_s, long long L) {
    char err[256];
    kv_spec spec;
    if (kv_spec_parse(spec_s, &spec, err, sizeof err) != MI_STATUS_SUCCESS) {
        fprintf(stderr, "bench_kv_host: %s\n", err);
        return 1;
    }
    mi_kv_pool_params pp = mi_kv_pool_default_params();
    pp.n_layers = c->layer + c->sweep, pp.n_kv_heads = c->kv_heads, pp.head_dim = c->dim;
    pp.dtype = (mi_kv_dtype)c->dtype;
    pp.meta_kinds = MI_KV_META_KEY_MINMAX;
    const kv_geometry geo = {c->layers, c->heads, c->kv_heads, c->dim, pp.page_tokens};
    kv_method *m = NULL;
    if (kv_method_create(&spec, &geo, &m, err, sizeof err) != MI_STATUS_SUCCESS) {
        fprintf(stderr, "bench_kv_host: %s\n", err);
        return 1;
    }
    /* dense (m NULL): the CUDA model's dense sessions keep no bounds; KIVI its own format */
    if (!m || (m->entry->storage && m->entry->storage(m, &pp))) pp.meta_kinds = 0;
    mi_kv_pool *pool = NULL;
    mi_kv_seq *seq = NULL;
    if (mi_kv_pool_create(NULL, &pp, &pool) != MI_STATUS_SUCCESS ||
        mi_kv_seq_create(pool, &seq) != MI_STATUS_SUCCESS) {
        fprintf(stderr, "bench_kv_host: cannot create the cache\n");
        return 1;
    }
    /* the rows, in slabs of 16K: appending is timed, generating them is not */
    const int64_t slab = 16384;
    float *k = malloc((size_t)(c->kv_heads * slab * c->dim) * sizeof(float));
    float *v = malloc((size_t)(c->kv_heads * slab * c->dim) * sizeof(float));
    if (!k || !v) return 1;
    double append_s = 0.0;
    for (int64_t at = 0; at < L; at += slab) {
        const int64_t n = L - at < slab ? L - at : slab;
        for (int64_t i = 0; i < c->kv_heads * n * c->dim; i++) k[i] = rnd(), v[i] = rnd();
        mi_tensor tk = mi_tensor_bhld(k, MI_DTYPE_F32, MI_DEVICE_CPU, 1, c->kv_heads, n, c->dim);
        mi_tensor tv = mi_tensor_bhld(v, MI_DTYPE_F32, MI_DEVICE_CPU, 1, c->kv_heads, n, c->dim);
        for (int l = c->layer; l < c->layer + c->sweep; l++) {
            const double t0 = tool_now_s();
            if (mi_kv_seq_append(seq, l, &tk, &tv) != MI_STATUS_SUCCESS) {
                fprintf(stderr, "bench_kv_host: %s\n", mi_kv_pool_last_error(pool));
                return 1;
            }
            if (l == c->layer) append_s += tool_now_s() - t0;
        }
    }
    free(k);
    free(v);
    /* the window's queries (the call's last ones) and one decode row */
    const int64_t qd = (int64_t)c->heads * c->dim;
    const int64_t nq = m && m->q_rows > 1 ? m->q_rows : 2;
    float *q = malloc((size_t)(nq * qd) * sizeof(float));
    if (!q) return 1;
    for (int64_t i = 0; i < nq * qd; i++) q[i] = rnd();
    double t_after[100 * 64], t_sel[100], t_dec[100], t_read[100];
    int n_after = 0;
    int rc = 0;
    kv_method *last = NULL;
    mi_kv_seq *last_seq = NULL;
    const bool has_after = m && m->entry->after_prefill != NULL;
    for (int r = 0; r < c->repeats && has_after && rc == 0; r++) {
        kv_method *mr = NULL;
        mi_kv_seq *f = NULL;
        if (kv_method_create(&spec, &geo, &mr, err, sizeof err) != MI_STATUS_SUCCESS ||
            mi_kv_seq_fork(seq, &f) != MI_STATUS_SUCCESS) {
            fprintf(stderr, "bench_kv_host: %s\n", err);
            rc = 1;
            break;
        }
        for (int l = c->layer; l < c->layer + c->sweep && rc == 0; l++) {
            const double t0 = tool_now_s();
            if (kv_method_after_prefill(mr, f, l, q, nq) != MI_STATUS_SUCCESS) {
                fprintf(stderr, "bench_kv_host: %s\n", mr->error);
                rc = 1;
            }
            t_after[n_after++] = tool_now_s() - t0;
        }
        kv_method_destroy(last);
        mi_kv_seq_destroy(last_seq);
        last = mr, last_seq = f;
    }
    if (!last) last = m, last_seq = seq;
    const bool has_select = m && m->entry->select != NULL;
    kv_selection sel;
    kv_selection_init(&sel);
    for (int r = 0; r <= c->repeats && has_select && rc == 0; r++) { /* the first warms pages */
        const double t0 = tool_now_s();
        if (kv_method_select(last, last_seq, c->layer, q + (nq - 1) * qd, 1, &sel) !=
            MI_STATUS_SUCCESS) {
            fprintf(stderr, "bench_kv_host: %s\n", last->error);
            rc = 1;
        }
        if (r > 0) t_sel[r - 1] = tool_now_s() - t0;
    }
    /* the whole host attention of one decode row: the last row attends to the rows before it */
    const mim_seq_shape sh = {c->heads, c->kv_heads, c->dim, 0, c->pool};
    const int64_t rows = mi_kv_seq_length(last_seq, c->layer);
    float *out = malloc((size_t)qd * sizeof(float));
    for (int r = 0; r <= c->repeats && rc == 0; r++) {
        char e[256];
        const double t0 = tool_now_s();
        if (!out ||
            mim_seq_attend(&sh, last_seq, last, c->layer, q + (nq - 1) * qd, 1, rows - 1,
                           1.0f / sqrtf((float)c->dim), out, e, sizeof e) != MI_STATUS_SUCCESS) {
            fprintf(stderr, "bench_kv_host: decode: %s\n", out ? e : "out of memory");
            rc = 1;
        }
        if (r > 0) t_dec[r - 1] = tool_now_s() - t0;
    }
    free(out);
    /* the layer read back as bf16 [H][L][D] rows (KIVI pools are read through their own path) */
    const size_t half_rows = (size_t)L * (size_t)(c->kv_heads * c->dim);
    uint16_t *rk = malloc(half_rows * 2), *rv = malloc(half_rows * 2);
    for (int r = 0; r <= c->repeats && rc == 0 && rk && rv; r++) {
        mi_tensor tk = mi_tensor_bhld(rk, MI_DTYPE_BF16, MI_DEVICE_CPU, 1, c->kv_heads, L, c->dim);
        mi_tensor tv = mi_tensor_bhld(rv, MI_DTYPE_BF16, MI_DEVICE_CPU, 1, c->kv_heads, L, c->dim);
        const double t0 = tool_now_s();
        if (mi_kv_seq_read(seq, c->layer, 0, L, &tk, &tv) != MI_STATUS_SUCCESS) {
            fprintf(stderr, "bench_kv_host: read: %s\n", mi_kv_pool_last_error(pool));
            rc = 1;
        }
        if (r > 0) t_read[r - 1] = tool_now_s() - t0;
    }
    free(rk);
    free(rv);
    if (rc == 0) {
        const double a = has_after ? 1e3 * median(t_after, n_after) : -1.0;
        const double s = has_select ? 1e3 * median(t_sel, c->repeats) : -1.0;
        const double d = 1e3 * median(t_dec, c->repeats);
        const double rd = 1e3 * median(t_read, c->repeats);
        char ac[32] = "-", sc[32] = "-", at[32] = "-", st[32] = "-";
        if (has_after) {
            snprintf(ac, sizeof ac, "%.1f", a);
            snprintf(at, sizeof at, "%.2f", a * c->layers / 1e3);
        }
        if (has_select) {
            snprintf(sc, sizeof sc, "%.2f", s);
            snprintf(st, sizeof st, "%.1f", s * c->layers);
        }
        printf("%-28s %9lld %10.1f %12s %12s %10s %12s %10.2f %12.1f %10.1f\n", spec_s, L,
               1e3 * append_s, ac, at, sc, st, d, d * c->layers, rd);
        fflush(stdout);
    }
    kv_selection_free(&sel);
    if (last != m) {
        kv_method_destroy(last);
        mi_kv_seq_destroy(last_seq);
    }
    kv_method_destroy(m);
    free(q);
    mi_kv_seq_destroy(seq);
    mi_kv_pool_destroy(pool);
    return rc;
}

int main(int argc, char **argv) {
    const char *lens_s = "131072";
    const char *kv = "snapkv;pyramidkv;kivi:bits=2;kivi:bits=4;quest:token_budget=4096;retr_attn";
    bench_cfg c = {32, 8, 128, 32, 16, MI_KV_F32, 3, 0, 1, NULL};
    const arg_spec specs[] = {
        {"lens", ARG_STR, &lens_s, 0, 0, NULL},
        {"heads", ARG_INT, &c.heads, 1, 256, NULL},
        {"kv-heads", ARG_INT, &c.kv_heads, 1, 256, NULL},
        {"dim", ARG_INT, &c.dim, 1, 256, NULL},
        {"layers", ARG_INT, &c.layers, 1, 1024, NULL},
        {"layer", ARG_INT, &c.layer, 0, 1023, NULL},
        {"kv", ARG_STR, &kv, 0, 0, NULL},
        {"dtype", ARG_INT, &c.dtype, 0, 3, NULL},
        {"repeats", ARG_INT, &c.repeats, 1, 100, NULL},
        {"threads", ARG_INT, &c.threads, 0, 1024, NULL},
        {"sweep", ARG_INT, &c.sweep, 1, 64, NULL},
    };
    args_result ar =
        args_parse("bench_kv_host", usage_text, specs, (int)(sizeof specs / sizeof specs[0]),
                   argc - 1, argv + 1, NULL, 0, NULL);
    if (ar != ARGS_OK) return ar == ARGS_HELP ? 0 : 2;
    openblas_set_num_threads(1); /* as a loaded model sets it: the threads come from OpenMP */
    if (c.heads % c.kv_heads || (c.dtype != MI_KV_F32 && c.dtype != MI_KV_FP8_E4M3) ||
        c.layer + c.sweep > c.layers)
        return args_error("bench_kv_host", usage_text,
                          "--heads must be a multiple of --kv-heads, --dtype 0 or 3, --layer "
                          "+ --sweep at most --layers");
    if (c.threads <= 0) c.threads = omp_get_num_procs();
    c.pool = mim_pool_create(c.threads);
    if (!c.pool) return 1;
    printf("%-28s %9s %10s %12s %12s %10s %12s %10s %12s %10s\n", "method", "tokens", "append ms",
           "after-pf ms", "after-pf s", "select ms", "sel ms/tok", "decode ms", "dec ms/tok",
           "read ms");
    char *save = NULL;
    int failures = 0;
    for (const char *p = lens_s; p && *p;) {
        char *end = NULL;
        const long long L = strtoll(p, &end, 10);
        if (end == p || L < 2)
            return args_error("bench_kv_host", usage_text, "bad --lens '%s'", lens_s);
        p = *end == ',' ? end + 1 : NULL;
        char *copy = strdup(kv);
        if (!copy) break;
        for (char *s = strtok_r(copy, ";", &save); s; s = strtok_r(NULL, ";", &save))
            failures += run_one(&c, s, L);
        free(copy);
    }
    mim_pool_destroy(c.pool);
    return failures ? 1 : 0;
}
