/*
 * bench_cpu_methods.c (a benchmark, not a test): per head, the estimation cost and the total
 * prefill time of every prefill method next to dense, with recall, density and the output's
 * relative L2 error against dense, on the synthetic position-coded data (mi_synth_generate).
 *
 *   bench_cpu_methods [--len N]... [--method SPEC]... [--dim D] [--heads H] [--threads T]
 *                     [--dtype bf16|f32]
 *
 * SPEC: a pattern spec (mi_head_pattern_parse); dense is always run first, as the baseline.
 *
 * Estimation is timed as the prefill's plan step (estimate and index, no attention kernel);
 * the total is mi_prefill_attention. Times are the median of 3 runs on the process CPU clock
 * divided by the threads (MI_BENCH_WALL=1: wall clock), per head.
 */
#include "bench_clock.h"
#include "cpu_common.h"
#include "minference_tools.h"
#include "pattern_table.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static double median3(double a, double b, double c) {
    double x[3] = {a, b, c};
    qsort(x, 3, sizeof(double), bench_cmp_double);
    return x[1];
}

/* InfLLM chooses its blocks while it runs (each chunk after the previous one's attention): its
 * estimation is the time a traced run spends choosing (representatives, query means, scores,
 * top-k), scaled as the clock in use counts. */
static double infllm_select_s(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                              const mi_tensor *k, const mi_tensor *v, const mi_head_pattern *pats,
                              const mi_prefill_params *pp, mi_tensor *out) {
    mi_head_plan heads[64];
    mi_prefill_plan plan;
    mi_cpu_plan_heads(s, NULL, pats, pp, heads, &plan);
    mi_cpu_infllm_trace tr;
    memset(&tr, 0, sizeof tr);
    tr.n_chunks = (s->len + heads[0].chunk_size - 1) / heads[0].chunk_size;
    tr.max_sel = heads[0].top_k > 0 ? heads[0].top_k : 1;
    tr.count = calloc((size_t)(s->heads_q * tr.n_chunks), sizeof(int32_t));
    tr.blocks = calloc((size_t)(s->heads_q * tr.n_chunks * tr.max_sel), sizeof(int32_t));
    const double t0 = bench_now();
    mi_cpu_infllm_run(ctx, s, q, k, v, NULL, heads, 1.0f / sqrtf((float)s->head_dim), out, NULL,
                      &tr);
    const double clock = bench_now() - t0;
    free(tr.count), free(tr.blocks);
    /* the part of this run's clock the choice took */
    return tr.total_s > 0 ? clock * tr.select_s / tr.total_s : 0.0;
}

int main(int argc, char **argv) {
    int64_t lens[8] = {32768, 65536};
    const char *defaults[] = {"dense",
                              "vertical_and_slash:1000:6096",
                              "block_sparse:100",
                              "xattention:8:900",
                              "xattention:8:950",
                              "flexprefill:900:100",
                              "flexprefill:950:100",
                              "dilated:1024:8192:2:0",
                              "dilated:1024:6144:2:2048",
                              "strided:128",
                              "stream_llm:128:3968",
                              "inf_llm:16:4096"};
    const char *methods[32] = {"dense"};
    int nm = 1;
    int n_lens = 0, D = 128, H = 1, threads = 2;
    mi_dtype dt = MI_DTYPE_BF16;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--len") && i + 1 < argc && n_lens < 8)
            lens[n_lens++] = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--method") && i + 1 < argc && nm < 32)
            methods[nm++] = argv[++i];
        else if (!strcmp(argv[i], "--dim") && i + 1 < argc)
            D = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--heads") && i + 1 < argc)
            H = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc)
            dt = !strcmp(argv[++i], "f32") ? MI_DTYPE_F32 : MI_DTYPE_BF16;
        else {
            fprintf(stderr, "usage: bench_cpu_methods [--len N]... [--method SPEC]... [--dim D] "
                            "[--heads H] "
                            "[--threads T] [--dtype bf16|f32]\n");
            return 2;
        }
    }
    if (n_lens == 0) n_lens = 2;
    if (nm == 1)
        for (size_t i = 1; i < sizeof defaults / sizeof defaults[0]; i++)
            methods[nm++] = defaults[i];
    mi_context_params cp = mi_context_default_params();
    cp.n_threads = threads;
    mi_context *ctx = NULL;
    if (mi_context_create(&cp, &ctx) != MI_STATUS_SUCCESS) return 1;
    printf("bench_cpu_methods: D=%d heads=%d %s threads=%d, %s clock, per head\n", D, H,
           mi_dtype_name(dt), threads, bench_clock_name());
    for (int li = 0; li < n_lens; li++) {
        const int64_t L = lens[li];
        const size_t esz = dt == MI_DTYPE_F32 ? 4 : 2, n = (size_t)(H * L * D);
        void *q = malloc(n * esz), *k = malloc(n * esz), *v = malloc(n * esz);
        void *o = malloc(n * esz), *ref = malloc(n * esz);
        mi_tensor tq = mi_tensor_bhld(q, dt, MI_DEVICE_CPU, 1, H, L, D);
        mi_tensor tk = mi_tensor_bhld(k, dt, MI_DEVICE_CPU, 1, H, L, D);
        mi_tensor tv = mi_tensor_bhld(v, dt, MI_DEVICE_CPU, 1, H, L, D);
        mi_tensor to = mi_tensor_bhld(o, dt, MI_DEVICE_CPU, 1, H, L, D);
        mi_tensor tr = mi_tensor_bhld(ref, dt, MI_DEVICE_CPU, 1, H, L, D);
        mi_synth_params sp = mi_synth_default_params();
        if (mi_synth_generate(ctx, &sp, &tq, &tk, &tv, NULL) != MI_STATUS_SUCCESS) return 1;
        mi_prefill_params pp = mi_prefill_default_params();
        pp.dense_below = 0;
        mi_attn_shape s = {1, H, H, L, D, 1, dt, MI_DEVICE_CPU, 0};
        printf("\nL=%lld\n%-28s %10s %10s %7s %8s %8s %9s\n", (long long)L, "method", "est ms",
               "total ms", "est %", "density", "recall", "rel_err");
        double dense_ms = 0.0;
        for (int m = 0; m < nm; m++) {
            mi_head_pattern p;
            if (mi_head_pattern_parse(methods[m], &p) != MI_STATUS_SUCCESS) return 1;
            mi_head_pattern pats[64];
            for (int h = 0; h < H && h < 64; h++) pats[h] = p;
            size_t bytes = 0;
            mi_prefill_workspace_size(ctx, &tq, &tk, pats, &pp, &bytes);
            void *ws = aligned_alloc(64, (bytes + 63) / 64 * 64);
            double est[3] = {0, 0, 0}, tot[3];
            for (int r = 0; r < 3; r++) {
                mi_attn_job *jobs = NULL;
                double t0 = bench_now();
                if (p.type != MI_PATTERN_DENSE)
                    mi_cpu_prefill_plan(ctx, &s, &tq, &tk, NULL, pats, &pp, ws, &jobs);
                est[r] = bench_now() - t0;
                if (p.type == MI_PATTERN_INFLLM)
                    est[r] = infllm_select_s(ctx, &s, &tq, &tk, &tv, pats, &pp, &to);
                t0 = bench_now();
                mi_prefill_attention(ctx, &tq, &tk, &tv, NULL, pats, &pp, m == 0 ? &tr : &to, NULL,
                                     ws, bytes);
                tot[r] = bench_now() - t0;
            }
            free(ws);
            const double div = bench_wall() ? 1.0 : (double)threads;
            const double e_ms = 1e3 * median3(est[0], est[1], est[2]) / div / H;
            const double t_ms = 1e3 * median3(tot[0], tot[1], tot[2]) / div / H;
            if (m == 0) dense_ms = t_ms;
            mi_head_metrics met[64];
            double err = 0.0, rec = 0.0, dens = 0.0;
            if (m > 0) {
                mi_metrics_evaluate(ctx, &tq, &tk, NULL, pats, &pp, met);
                mi_metrics_rel_l2(ctx, &to, &tr, NULL, &err);
                for (int h = 0; h < H; h++) rec += met[h].recall / H, dens += met[h].density / H;
            } else {
                rec = dens = 1.0;
            }
            printf("%-28s %10.1f %10.1f %6.1f%% %8.4f %8.4f %9.2e   %.2fx\n", methods[m], e_ms,
                   t_ms, t_ms > 0 ? 100.0 * e_ms / t_ms : 0.0, dens, rec, err,
                   t_ms > 0 ? dense_ms / t_ms : 0.0);
            fflush(stdout);
        }
        free(q), free(k), free(v), free(o), free(ref);
    }
    mi_context_destroy(ctx);
    return 0;
}
