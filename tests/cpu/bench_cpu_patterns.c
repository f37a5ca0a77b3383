/*
 * bench_cpu_patterns.c: where each sparse pattern starts to pay on the CPU (benchmark, not a
 * test). Per length, the whole-layer prefill of one pattern on every head, forced sparse
 * (dense_below = 0: estimation and index included) and with the library's default fallback
 * (dense_below < 0), against mi_attention_dense on the same inputs. The CPU rule in
 * src/cpu/dense_fallback_cpu.h is drawn from these numbers, and tests/cpu/test_cpu_dense_fallback.c
 * checks it against the JSON this writes.
 *
 * usage: bench_cpu_patterns OUT.json [max_len] [repeats] [threads] [heads] [kv_heads] [head_dim]
 *   defaults 12288, 3, 0 (all cores), 4, 1, 128; bf16 inputs from mi_synth_generate (sinks,
 *   verticals, slashes, a local band), so the estimates find structure as on real heads.
 * Times: median process CPU time (MI_BENCH_WALL=1: wall time; bench_clock.h) of repeats calls
 * after one warm-up.
 */
#include "bench_clock.h"
#include "minference.h"
#include "minference_tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct inputs {
    mi_context *ctx;
    mi_tensor q, k, v, o;
} inputs;

/* dense_below: -2 for mi_attention_dense, else the prefill's parameter */
static double time_ms(inputs *in, const mi_head_pattern *pats, int32_t dense_below, int reps) {
    double t[16];
    mi_prefill_params pp = mi_prefill_default_params();
    pp.dense_below = dense_below;
    for (int i = 0; i <= reps; i++) {
        const double t0 = bench_now();
        const mi_status st =
            dense_below == -2
                ? mi_attention_dense(in->ctx, &in->q, &in->k, &in->v, NULL, 0.0f, &in->o, NULL)
                : mi_prefill_attention(in->ctx, &in->q, &in->k, &in->v, NULL, pats, &pp, &in->o,
                                       NULL, NULL, 0);
        if (st != MI_STATUS_SUCCESS) {
            fprintf(stderr, "error: %s\n", mi_context_last_error(in->ctx));
            exit(1);
        }
        if (i > 0) t[i - 1] = (bench_now() - t0) * 1e3; /* the first call is a warm-up */
    }
    qsort(t, (size_t)reps, sizeof(double), bench_cmp_double);
    return t[reps / 2];
}

typedef struct pattern_case {
    const char *label;
    mi_pattern_type type;
    int32_t a, b, c;
} pattern_case;

static const pattern_case CASES[] = {
    {"a_shape 128+3968", MI_PATTERN_A_SHAPE, 128, 3968, 0},
    {"a_shape 64+960", MI_PATTERN_A_SHAPE, 64, 960, 0},
    {"tri_shape 128+3968+100", MI_PATTERN_TRI_SHAPE, 128, 3968, 100},
    {"block_sparse 100", MI_PATTERN_BLOCK_SPARSE, 100, 0, 0},
    {"block_sparse 25", MI_PATTERN_BLOCK_SPARSE, 25, 0, 0},
    {"vertical_slash 1000+6096", MI_PATTERN_VERTICAL_SLASH, 1000, 6096, 0},
};

static mi_head_pattern pattern_of(const pattern_case *c) {
    mi_head_pattern p = mi_head_pattern_default(c->type);
    switch (c->type) {
    case MI_PATTERN_A_SHAPE:
    case MI_PATTERN_TRI_SHAPE:
        p.n_init = c->a, p.n_local = c->b;
        if (c->type == MI_PATTERN_TRI_SHAPE) p.n_last = c->c;
        break;
    case MI_PATTERN_BLOCK_SPARSE: p.top_k = c->a; break;
    default: p.vertical_size = c->a, p.slash_size = c->b; break;
    }
    return p;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_cpu_patterns OUT.json [max_len] [repeats] [threads] "
                        "[heads] [kv_heads] [head_dim]\n");
        return 2;
    }
    const int64_t max_len = argc > 2 ? atoll(argv[2]) : 12288;
    const int reps = argc > 3 ? atoi(argv[3]) : 3;
    const int threads = argc > 4 ? atoi(argv[4]) : 0;
    const int64_t H = argc > 5 ? atoll(argv[5]) : 4, Hk = argc > 6 ? atoll(argv[6]) : 1;
    const int64_t D = argc > 7 ? atoll(argv[7]) : 128;
    if (max_len < 1 || reps < 1 || reps > 15 || threads < 0 || H < 1 || H > 256 || Hk < 1 ||
        H % Hk != 0 || D < 1 || D > 256) {
        fprintf(stderr, "bad arguments: max_len >= 1, repeats 1..15, threads >= 0, heads 1..256 "
                        "divisible by kv_heads, head_dim 1..256\n");
        return 2;
    }
    FILE *out = fopen(argv[1], "w");
    if (!out) {
        perror(argv[1]);
        return 1;
    }
    mi_context_params cp = mi_context_default_params();
    cp.n_threads = threads;
    inputs in = {0};
    if (mi_context_create(&cp, &in.ctx) != MI_STATUS_SUCCESS) return 1;
    const int nt = mi_context_n_threads(in.ctx);
    printf("threads %d, %lld / %lld heads, head dim %lld, bf16, features %s\n", nt, (long long)H,
           (long long)Hk, (long long)D, mi_build_features());
    fprintf(out,
            "{\"experiment\": \"CPU prefill against dense per pattern and length (the CPU "
            "crossovers of src/cpu/dense_fallback_cpu.h)\", \"commit\": \"%s\", "
            "\"features\": \"%s\", "
            "\"threads\": %d, \"dtype\": \"bf16\", \"head_dim\": %lld, \"inputs\": "
            "\"mi_synth_generate defaults\", \"timing\": \"median of %d %s times after a "
            "warm-up call; sparse = mi_prefill_attention with dense_below = 0, default = -1, "
            "dense = mi_attention_dense\", \"rows\": [",
            mi_build_commit(), mi_build_features(), nt, (long long)D, reps, bench_clock_name());
    const int64_t lens[] = {1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768};
    const size_t n_cases = sizeof CASES / sizeof CASES[0];
    int first = 1;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0] && lens[li] <= max_len; li++) {
        const int64_t L = lens[li];
        const size_t nq = (size_t)(H * L * D), nk = (size_t)(Hk * L * D);
        uint16_t *q = calloc(nq, 2), *k = calloc(nk, 2), *v = calloc(nk, 2), *o = calloc(nq, 2);
        if (!q || !k || !v || !o) return 1;
        in.q = mi_tensor_bhld(q, MI_DTYPE_BF16, MI_DEVICE_CPU, 1, H, L, D);
        in.k = mi_tensor_bhld(k, MI_DTYPE_BF16, MI_DEVICE_CPU, 1, Hk, L, D);
        in.v = mi_tensor_bhld(v, MI_DTYPE_BF16, MI_DEVICE_CPU, 1, Hk, L, D);
        in.o = mi_tensor_bhld(o, MI_DTYPE_BF16, MI_DEVICE_CPU, 1, H, L, D);
        mi_synth_params sp = mi_synth_default_params();
        if (mi_synth_generate(in.ctx, &sp, &in.q, &in.k, &in.v, NULL) != MI_STATUS_SUCCESS) {
            fprintf(stderr, "synth: %s\n", mi_context_last_error(in.ctx));
            return 1;
        }
        const double dense = time_ms(&in, NULL, -2, reps);
        printf("L %6lld  dense %9.2f ms |", (long long)L, dense);
        for (size_t c = 0; c < n_cases; c++) {
            mi_head_pattern pats[256];
            for (int64_t h = 0; h < H; h++) pats[h] = pattern_of(&CASES[c]);
            const double sparse = time_ms(&in, pats, 0, reps);
            const double dflt = time_ms(&in, pats, -1, reps);
            printf(" %s %.2fx (default %.2fx) |", CASES[c].label, dense / sparse, dense / dflt);
            fprintf(out,
                    "%s\n {\"heads\": %lld, \"heads_kv\": %lld, \"head_dim\": %lld, \"L\": %lld, "
                    "\"pattern\": \"%s\", \"sparse_ms\": %.4f, \"default_ms\": %.4f, "
                    "\"dense_ms\": %.4f, \"speedup\": %.4f, \"default_speedup\": %.4f}",
                    first ? "" : ",", (long long)H, (long long)Hk, (long long)D, (long long)L,
                    CASES[c].label, sparse, dflt, dense, dense / sparse, dense / dflt);
            first = 0;
        }
        printf("\n");
        fflush(stdout);
        fflush(out);
        free(q);
        free(k);
        free(v);
        free(o);
    }
    fprintf(out, "\n]}\n");
    fclose(out);
    mi_context_destroy(in.ctx);
    return 0;
}
