/*
 * bench_cpu.c: CPU kernel benchmark (not a test): dense attention GFLOP/s against OpenBLAS sgemm
 * in the same run, and the speed-up of vertical-slash / A-shape prefill over dense.
 *
 * usage: bench_cpu [max_len] [repeats] [threads] [head_dim]
 *   threads: 0 = all cores, for both libraries; head_dim 1..256, default 128
 * FLOPs: causal dense 2 L^2 D per head; sgemm 2 n^3 (BENCHMARKS.md).
 * Inputs come from mi_synth_generate (sinks, verticals, slashes, a local band) so that the
 * vertical-slash estimate finds structure as on a real head; random q/k would make it pick
 * random diagonals and run nearly dense. VS / A-shape run through mi_prefill_attention with the
 * default budgets (1000 / 6096; 128 / 3968) and no dense fallback; "est ms" is estimation plus
 * index building alone, "VS keys" the mean keys per row the index visits over the causal mean.
 */
#include "bench_clock.h"
#include "minference.h"
#include "minference_tools.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float *random_buf(size_t n, unsigned seed) {
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * 2.0f;
    }
    return p;
}

typedef struct run_args {
    mi_context *ctx;
    mi_tensor q, k, v, o;
    mi_head_pattern pat;
    int dense;
} run_args;

static double time_median(run_args *a, int reps) {
    double t[32];
    mi_prefill_params pp = mi_prefill_default_params();
    pp.dense_below = 0;
    for (int i = 0; i <= reps; i++) {
        const double t0 = bench_now();
        mi_status st =
            a->dense ? mi_attention_dense(a->ctx, &a->q, &a->k, &a->v, NULL, 0.0f, &a->o, NULL)
                     : mi_prefill_attention(a->ctx, &a->q, &a->k, &a->v, NULL, &a->pat, &pp, &a->o,
                                            NULL, NULL, 0);
        if (st != MI_STATUS_SUCCESS) {
            fprintf(stderr, "error: %s\n", mi_context_last_error(a->ctx));
            exit(1);
        }
        if (i > 0) t[i - 1] = bench_now() - t0; /* the first call is a warm-up */
    }
    qsort(t, (size_t)reps, sizeof(double), bench_cmp_double);
    return t[reps / 2];
}

int main(int argc, char **argv) {
    const int64_t max_len = argc > 1 ? atoll(argv[1]) : 32768;
    const int reps = argc > 2 ? atoi(argv[2]) : 5;
    const int threads = argc > 3 ? atoi(argv[3]) : 0;
    const int64_t D = argc > 4 ? atoll(argv[4]) : 128;
    if (max_len < 1 || reps < 1 || reps > 15 || threads < 0 || D < 1 || D > 256) {
        fprintf(stderr, "usage: bench_cpu [max_len >= 1] [repeats 1..15] [threads >= 0] "
                        "[head_dim 1..256]\n");
        return 2;
    }
    mi_context *ctx = NULL;
    mi_context_params cp = mi_context_default_params();
    cp.n_threads = threads;
    if (threads > 0) openblas_set_num_threads(threads);
    if (mi_context_create(&cp, &ctx) != MI_STATUS_SUCCESS) return 1;
    printf("threads %d, head dim %lld, features %s, %s time\n", mi_context_n_threads(ctx),
           (long long)D, mi_build_features(), bench_clock_name());
    const int nthreads = mi_context_n_threads(ctx);

    /* sgemm reference: square n = 2048, all threads */
    const int n = 2048;
    float *A = random_buf((size_t)n * n, 1), *B = random_buf((size_t)n * n, 2);
    float *C = calloc((size_t)n * n, sizeof(float));
    double ts[16];
    for (int i = 0; i <= reps; i++) {
        const double t0 = bench_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, A, n, B, n, 0.0f, C,
                    n);
        if (i > 0) ts[i - 1] = bench_now() - t0;
    }
    qsort(ts, (size_t)reps, sizeof(double), bench_cmp_double);
    const double cpu_scale = bench_wall() ? 1.0 : (double)nthreads; /* per core */
    const double sgemm_gf = 2.0 * n * (double)n * n / ts[reps / 2] * 1e-9 * cpu_scale;
    printf("sgemm %d^3: %.1f GFLOP/s\n", n, sgemm_gf);
    free(A);
    free(B);
    free(C);

    printf("%8s %10s %9s %7s %10s %8s %8s %6s %10s %9s\n", "L", "dense ms", "GFLOP/s", "/sgemm",
           "VS ms", "est ms", "VS keys", "VS x", "Ashape ms", "Ashape x");
    const int64_t lens[] = {1024,  2048,  4096,  6144,  8192,  12288,
                            16384, 24576, 32768, 49152, 65536, 131072};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0] && lens[li] <= max_len; li++) {
        const int64_t L = lens[li];
        const size_t e = (size_t)(L * D);
        run_args a = {0};
        a.ctx = ctx;
        float *q = random_buf(e, 3), *k = random_buf(e, 4), *v = random_buf(e, 5);
        float *o = malloc(e * sizeof(float));
        a.q = mi_tensor_bhld(q, MI_DTYPE_F32, MI_DEVICE_CPU, 1, 1, L, D);
        a.k = mi_tensor_bhld(k, MI_DTYPE_F32, MI_DEVICE_CPU, 1, 1, L, D);
        a.v = mi_tensor_bhld(v, MI_DTYPE_F32, MI_DEVICE_CPU, 1, 1, L, D);
        a.o = mi_tensor_bhld(o, MI_DTYPE_F32, MI_DEVICE_CPU, 1, 1, L, D);
        mi_synth_params sp = mi_synth_default_params();
        if (mi_synth_generate(ctx, &sp, &a.q, &a.k, &a.v, NULL) != MI_STATUS_SUCCESS) {
            fprintf(stderr, "synth: %s (random inputs instead)\n", mi_context_last_error(ctx));
        }
        /* estimation + index alone, and the index's density */
        const mi_head_pattern vsp = mi_head_pattern_default(MI_PATTERN_VERTICAL_SLASH);
        const mi_vs_params vp = mi_vs_default_params();
        const int32_t nv = vsp.vertical_size < L ? vsp.vertical_size : (int32_t)L;
        const int32_t ns = vsp.slash_size < L ? vsp.slash_size : (int32_t)L;
        const int32_t R = (int32_t)((L + 63) / 64);
        void *vmem = malloc(mi_vs_index_bytes(1, 1, nv, ns));
        void *smem = malloc(mi_sparse_index_bytes(1, 1, R, ns + 1, nv));
        mi_vs_index vx;
        mi_sparse_index sx;
        mi_vs_index_init(&vx, 1, 1, nv, ns, vmem, mi_vs_index_bytes(1, 1, nv, ns));
        mi_sparse_index_init(&sx, 1, 1, R, ns + 1, nv, smem,
                             mi_sparse_index_bytes(1, 1, R, ns + 1, nv));
        double te[16];
        for (int i = 0; i < 3; i++) {
            const double t0 = bench_now();
            mi_vs_estimate(ctx, &a.q, &a.k, NULL, &vsp.vertical_size, &vsp.slash_size, &vp, 0.0f,
                           &vx);
            mi_vs_build_index(ctx, L, NULL, &vx, &sx);
            te[i] = bench_now() - t0;
        }
        qsort(te, 3, sizeof(double), bench_cmp_double);
        double keys = 0.0;
        for (int32_t m = 0; m < R; m++) {
            const int64_t end = (int64_t)(m + 1) * 64 < L ? (int64_t)(m + 1) * 64 : L;
            int64_t kk = (int64_t)sx.column_count[m];
            for (int32_t i = 0; i < sx.block_count[m]; i++) {
                const int64_t lo = sx.block_offset[m * (ns + 1) + i];
                kk += (lo + 64 < end ? lo + 64 : end) - lo;
            }
            keys += (double)kk;
        }
        const double vs_keys = keys * 64.0 / ((double)L * (double)(L + 1) / 2.0);
        free(vmem);
        free(smem);
        const int r = L >= 32768 ? 3 : reps;
        a.dense = 1;
        const double td = time_median(&a, r);
        a.dense = 0;
        a.pat = mi_head_pattern_default(MI_PATTERN_VERTICAL_SLASH);
        const double tv = time_median(&a, r);
        a.pat = mi_head_pattern_default(MI_PATTERN_A_SHAPE);
        const double ta = time_median(&a, r);
        const double gf = 2.0 * (double)L * (double)L * (double)D / td * 1e-9 * cpu_scale;
        printf("%8lld %10.2f %9.1f %7.2f %10.2f %8.2f %8.3f %6.2f %10.2f %9.2f\n", (long long)L,
               td * 1e3, gf, gf / sgemm_gf, tv * 1e3, te[1] * 1e3, vs_keys, td / tv, ta * 1e3,
               td / ta);
        fflush(stdout);
        free(q);
        free(k);
        free(v);
        free(o);
    }
    mi_context_destroy(ctx);
    return 0;
}
