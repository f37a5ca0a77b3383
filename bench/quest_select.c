/*
 * quest_select.c: the host cost of Quest's page selection per decode step, the part of a Quest
 * decode step that grows with the context whatever the token budget.
 *
 *   bench_quest_select [--lens 131072,1048576] [--heads 32] [--kv-heads 8] [--dim 128]
 *                      [--budget 4096] [--dtype 0|3] [--repeats 5]
 *
 * One layer of random keys (fp8 pages with --dtype 3, so that 1M tokens fit), then the median
 * time of kv_method_select for one query row of every head (a decode step's layer); the
 * per-token figure multiplies by 32 layers (the LLaMA-3-8B shape).
 */
#include "args.h"
#include "kv_method.h"
#include "minference_kv.h"
#include "tool_util.h"

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

static const char usage_text[] =
    "usage: bench_quest_select [--lens L1,L2,...] [--heads H] [--kv-heads H] [--dim D]\n"
    "         [--budget TOKENS] [--dtype 0 (f32 pages) | 3 (fp8 pages)] [--repeats R]\n";

int main(int argc, char **argv) {
    const char *lens_s = "131072,1048576";
    int heads = 32, kv_heads = 8, dim = 128, budget = 4096, dtype = MI_KV_FP8_E4M3, repeats = 5;
    const arg_spec specs[] = {
        {"lens", ARG_STR, &lens_s, 0, 0, NULL},         {"heads", ARG_INT, &heads, 1, 256, NULL},
        {"kv-heads", ARG_INT, &kv_heads, 1, 256, NULL}, {"dim", ARG_INT, &dim, 1, 256, NULL},
        {"budget", ARG_INT, &budget, 1, 1 << 30, NULL}, {"dtype", ARG_INT, &dtype, 0, 3, NULL},
        {"repeats", ARG_INT, &repeats, 1, 100, NULL},
    };
    args_result ar =
        args_parse("bench_quest_select", usage_text, specs, (int)(sizeof specs / sizeof specs[0]),
                   argc - 1, argv + 1, NULL, 0, NULL);
    if (ar != ARGS_OK) return ar == ARGS_HELP ? 0 : 2;
    if (heads % kv_heads || (dtype != MI_KV_F32 && dtype != MI_KV_FP8_E4M3))
        return args_error("bench_quest_select", usage_text,
                          "--heads must be a multiple of --kv-heads, --dtype 0 or 3");
    printf("%10s %12s %14s\n", "tokens", "ms / layer", "ms / token (32)");
    for (const char *p = lens_s; p && *p;) {
        char *end = NULL;
        const long long L = strtoll(p, &end, 10);
        if (end == p || L < 1) {
            return args_error("bench_quest_select", usage_text, "bad --lens '%s'", lens_s);
        }
        p = *end == ',' ? end + 1 : NULL;
        mi_kv_pool_params pp = mi_kv_pool_default_params();
        pp.n_layers = 1, pp.n_kv_heads = kv_heads, pp.head_dim = dim;
        pp.dtype = (mi_kv_dtype)dtype;
        pp.meta_kinds = MI_KV_META_KEY_MINMAX;
        mi_kv_pool *pool = NULL;
        mi_kv_seq *seq = NULL;
        if (mi_kv_pool_create(NULL, &pp, &pool) != MI_STATUS_SUCCESS ||
            mi_kv_seq_create(pool, &seq) != MI_STATUS_SUCCESS) {
            fprintf(stderr, "bench_quest_select: cannot create the cache\n");
            return 1;
        }
        mi_kv_page_layout lay;
        mi_kv_pool_layout(pool, &lay);
        /* the keys and values in slabs of 16K rows */
        const int64_t slab = 16384;
        float *k = malloc((size_t)(kv_heads * slab * dim) * sizeof(float));
        if (!k) return 1;
        for (int64_t at = 0; at < L; at += slab) {
            const int64_t n = L - at < slab ? L - at : slab;
            for (int64_t i = 0; i < kv_heads * n * dim; i++) k[i] = rnd();
            mi_tensor t = mi_tensor_bhld(k, MI_DTYPE_F32, MI_DEVICE_CPU, 1, kv_heads, n, dim);
            if (mi_kv_seq_append(seq, 0, &t, &t) != MI_STATUS_SUCCESS) {
                fprintf(stderr, "bench_quest_select: %s\n", mi_kv_pool_last_error(pool));
                return 1;
            }
        }
        free(k);
        char spec_s[96], err[256];
        snprintf(spec_s, sizeof spec_s, "quest:token_budget=%d,dense_layers=0,chunk_size=%d",
                 budget, lay.page_tokens);
        kv_spec spec;
        kv_method *m = NULL;
        const kv_geometry geo = {1, heads, kv_heads, dim, lay.page_tokens};
        if (kv_spec_parse(spec_s, &spec, err, sizeof err) != MI_STATUS_SUCCESS ||
            kv_method_create(&spec, &geo, &m, err, sizeof err) != MI_STATUS_SUCCESS) {
            fprintf(stderr, "bench_quest_select: %s\n", err);
            return 1;
        }
        float *q = malloc((size_t)(heads * dim) * sizeof(float));
        for (int i = 0; i < heads * dim; i++) q[i] = rnd();
        kv_selection sel;
        kv_selection_init(&sel);
        double t[100];
        for (int r = 0; r <= repeats; r++) { /* the first, untimed, warms the pages */
            const double t0 = tool_now_s();
            if (kv_method_select(m, seq, 0, q, 1, &sel) != MI_STATUS_SUCCESS) {
                fprintf(stderr, "bench_quest_select: %s\n", m->error);
                return 1;
            }
            if (r > 0) t[r - 1] = tool_now_s() - t0;
        }
        qsort(t, (size_t)repeats, sizeof(double), cmp_double);
        const double ms = 1e3 * t[repeats / 2];
        printf("%10lld %12.3f %14.1f\n", L, ms, 32 * ms);
        kv_selection_free(&sel);
        kv_method_destroy(m);
        free(q);
        mi_kv_seq_destroy(seq);
        mi_kv_pool_destroy(pool);
    }
    return 0;
}
