/*
 * cmd_bench.c: `minference bench`: dense causal attention against every sparse pattern on the
 * CPU, on synthetic data with real-head structure (mi_synth_generate), one pattern for all heads.
 *
 * Per method: median wall time of mi_prefill_attention (estimation and index building included),
 * speed-up over dense, density / recall / FLOPs from mi_metrics_evaluate, and the relative L2
 * error of the output against the dense output. An OpenBLAS sgemm of the attention's shape
 * (min(L, 4096)^2 x D) gives the machine's practical GEMM rate to read the dense kernel against.
 *
 * The default length, 32768, keeps the whole run (five methods, three repeats, exact metrics)
 * well under a minute on a 2-core machine (about 12 s when it is otherwise idle); the sparse
 * patterns' defaults are made for 64K and beyond, so expect modest speed-ups at this length.
 */
#include "args.h"
#include "cli.h"
#include "minference.h"
#include "tool_util.h"

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char usage[] =
    "usage: minference bench [--len L] [--heads H] [--kv-heads H_KV] [--dim D] [--dtype T]\n"
    "                        [--threads N] [--seed S] [--repeats R] [--methods M] [--json FILE]\n"
    "\n"
    "Dense causal attention against every sparse pattern (library defaults: a_shape 128/3968,\n"
    "tri_shape 128/3968 + last 100 rows, vertical_and_slash 1000/6096, block_sparse top-100) on\n"
    "synthetic data with sinks, a local band, slash lines, vertical columns and needles.\n"
    "\n"
    "  --len L        sequence length (default 32768)\n"
    "  --heads H      query heads (default 1)\n"
    "  --kv-heads H   key/value heads, dividing --heads (default: --heads)\n"
    "  --dim D        head dimension (default 128)\n"
    "  --dtype T      f32, f16 or bf16 (default bf16)\n"
    "  --threads N    CPU threads (default 0: all online cores)\n"
    "  --seed S       data seed (default 1234)\n"
    "  --repeats R    timed runs per method; the median is reported (default 3)\n"
    "  --methods M    comma-separated subset of a_shape, tri_shape, vertical_slash, block_sparse\n"
    "                 (default: all; dense always runs, as the reference)\n"
    "  --json FILE    also write the results as one JSON object\n";

typedef struct method {
    const char *name;
    mi_pattern_type type;
} method;

static const method methods[] = {
    {"dense", MI_PATTERN_DENSE},
    {"a_shape", MI_PATTERN_A_SHAPE},
    {"tri_shape", MI_PATTERN_TRI_SHAPE},
    {"vertical_slash", MI_PATTERN_VERTICAL_SLASH},
    {"block_sparse", MI_PATTERN_BLOCK_SPARSE},
};
#define N_METHODS ((int)(sizeof methods / sizeof methods[0]))

typedef struct result {
    bool run;
    double ms, speedup, density, recall, rel_err, gflops, flops;
    mi_head_pattern pattern;
} result;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static bool parse_dtype(const char *s, mi_dtype *out) {
    if (!strcmp(s, "f32") || !strcmp(s, "fp32") || !strcmp(s, "float32"))
        *out = MI_DTYPE_F32;
    else if (!strcmp(s, "f16") || !strcmp(s, "fp16") || !strcmp(s, "float16"))
        *out = MI_DTYPE_F16;
    else if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16"))
        *out = MI_DTYPE_BF16;
    else
        return false;
    return true;
}

/* "CPU model, N cores" from /proc/cpuinfo where there is one. */
static void machine_name(char *buf, size_t size) {
    char line[512], model[256] = "unknown CPU";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "model name", 10) == 0) {
                const char *c = strchr(line, ':');
                if (c) {
                    c++;
                    while (*c == ' ' || *c == '\t') c++;
                    snprintf(model, sizeof model, "%s", c);
                    model[strcspn(model, "\n")] = '\0';
                }
                break;
            }
        }
        fclose(f);
    }
    snprintf(buf, size, "%s, %ld cores", model, sysconf(_SC_NPROCESSORS_ONLN));
}

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* JSON has no NaN or infinity: write null for them. */
static void json_number(FILE *f, double v) {
    if (isfinite(v))
        fprintf(f, "%.6g", v);
    else
        fputs("null", f);
}

static void progress(int index, int count, const char *name, int done, int total) {
    static const char spin[] = "|/-\\";
    if (isatty(2))
        fprintf(stderr, "\r[%d/%d] %-15s %c %3d%%", index + 1, count, name, spin[done % 4],
                total ? 100 * done / total : 100);
}

/* Marks the methods named in a comma-separated list; false on an unknown name. */
static bool select_methods(const char *list, result *res) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    res[0].run = true;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        bool found = false;
        for (int m = 0; m < N_METHODS; m++) {
            if (strcmp(tok, methods[m].name) == 0) {
                res[m].run = true;
                found = true;
            }
        }
        if (!found) return false;
    }
    return true;
}

void mi_bench_prepare_blas(char **argv) {
    /* OpenBLAS picks its kernels from the CPU model; on CPUs it does not know (common in
     * virtual machines) it falls back to SSE3 code at a fifth of the machine's speed, which
     * would make the sgemm reference meaningless. The core type can only be chosen before the
     * library initialises, so set it from the CPU's features and run the tool again. */
#if defined(__x86_64__) && defined(__GNUC__)
    const char *config = openblas_get_config();
    if (getenv("OPENBLAS_CORETYPE") || !config || !argv || !argv[0]) return;
    if (!strstr(config, "Prescott") && !strstr(config, "Core2") && !strstr(config, "Nehalem") &&
        !strstr(config, "Katmai") && !strstr(config, "Atom"))
        return;
    const char *core = NULL;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        core = "SkylakeX";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        core = "Haswell";
    if (!core) return;
    setenv("OPENBLAS_CORETYPE", core, 1);
    execv("/proc/self/exe", argv);
    /* exec failed: carry on with the kernels OpenBLAS chose. */
#else
    (void)argv;
#endif
}

/* Median GFLOP/s of C = A B^T with A, B [n x d] fp32 (the score GEMM of attention). */
static double sgemm_gflops(int64_t n, int64_t d, int threads, int repeats) {
    float *a = malloc((size_t)(n * d) * sizeof(float));
    float *b = malloc((size_t)(n * d) * sizeof(float));
    float *c = malloc((size_t)(n * n) * sizeof(float));
    double *t = malloc((size_t)repeats * sizeof(double));
    double result = NAN;
    if (a && b && c && t) {
        for (int64_t i = 0; i < n * d; i++) {
            a[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
            b[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
        }
        openblas_set_num_threads(threads);
        /* One untimed call: OpenBLAS starts its threads and the pages get touched. */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)n, (int)d, 1.0f, a,
                    (int)d, b, (int)d, 0.0f, c, (int)n);
        for (int r = 0; r < repeats; r++) {
            double t0 = tool_now_s();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)n, (int)d, 1.0f, a,
                        (int)d, b, (int)d, 0.0f, c, (int)n);
            t[r] = tool_now_s() - t0;
        }
        result = 2.0 * (double)n * (double)n * (double)d / median(t, repeats) * 1e-9;
    }
    free(a);
    free(b);
    free(c);
    free(t);
    return result;
}

static int fail_status(mi_context *ctx, const char *what, mi_status st) {
    fprintf(stderr, "\nminference bench: %s failed: %s: %s\n", what, mi_status_name(st),
            mi_context_last_error(ctx));
    return 1;
}

static int write_json(const char *path, const char *machine, int threads, int len, int heads,
                      int kv_heads, int dim, mi_dtype dtype, int seed, int repeats, double sgemm,
                      const result *res) {
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return 1;
    }
    char date[64];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
    fprintf(f, "{\n  \"date\": \"%s\",\n  \"machine\": ", date);
    json_string(f, machine);
    fprintf(f,
            ",\n  \"library_version\": \"%s\",\n  \"threads\": %d,\n  \"len\": %d,\n"
            "  \"heads\": %d,\n  \"kv_heads\": %d,\n  \"dim\": %d,\n  \"dtype\": \"%s\",\n"
            "  \"seed\": %d,\n  \"repeats\": %d,\n  \"blas\": ",
            mi_version(), threads, len, heads, kv_heads, dim, mi_dtype_name(dtype), seed, repeats);
    json_string(f, openblas_get_config());
    fprintf(f, ",\n  \"sgemm_gflops\": ");
    json_number(f, sgemm);
    fprintf(f, ",\n  \"results\": [\n");
    int last = 0;
    for (int m = 0; m < N_METHODS; m++)
        if (res[m].run) last = m;
    for (int m = 0; m < N_METHODS; m++) {
        const result *r = &res[m];
        if (!r->run) continue;
        fprintf(f, "    {\"method\": \"%s\", \"pattern\": \"%s\", \"ms\": ", methods[m].name,
                mi_pattern_name(methods[m].type));
        json_number(f, r->ms);
        fprintf(f, ", \"speedup\": ");
        json_number(f, r->speedup);
        fprintf(f, ", \"density\": ");
        json_number(f, r->density);
        fprintf(f, ", \"recall\": ");
        json_number(f, r->recall);
        fprintf(f, ", \"rel_err\": ");
        json_number(f, r->rel_err);
        fprintf(f, ", \"gflops\": ");
        json_number(f, r->gflops);
        fprintf(f, ", \"flops\": ");
        json_number(f, r->flops);
        fprintf(f,
                ", \"vertical_size\": %d, \"slash_size\": %d, \"n_init\": %d, \"n_local\": %d, "
                "\"n_last\": %d, \"top_k\": %d}%s\n",
                (int)r->pattern.vertical_size, (int)r->pattern.slash_size, (int)r->pattern.n_init,
                (int)r->pattern.n_local, (int)r->pattern.n_last, (int)r->pattern.top_k,
                m < last ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    if (fclose(f) != 0) {
        perror(path);
        return 1;
    }
    return 0;
}

int mi_cmd_bench(int argc, char **argv) {
    int len = 32768, heads = 1, kv_heads = 0, dim = 128, threads = 0, seed = 1234, repeats = 3;
    const char *dtype_name = "bf16", *json_path = NULL, *method_list = NULL;
    const arg_spec specs[] = {
        {"len", ARG_INT, &len, 1, 1 << 24, NULL},
        {"heads", ARG_INT, &heads, 1, 1024, NULL},
        {"kv-heads", ARG_INT, &kv_heads, 0, 1024, NULL},
        {"dim", ARG_INT, &dim, 1, 256, NULL},
        {"dtype", ARG_STR, &dtype_name, 0, 0, NULL},
        {"threads", ARG_INT, &threads, 0, 4096, NULL},
        {"seed", ARG_INT, &seed, 0, INT32_MAX, NULL},
        {"repeats", ARG_INT, &repeats, 1, 1000, NULL},
        {"json", ARG_STR, &json_path, 0, 0, NULL},
        {"methods", ARG_STR, &method_list, 0, 0, NULL},
    };
    const char *pos[1];
    int np = 0;
    args_result ar = args_parse("bench", usage, specs, (int)(sizeof specs / sizeof specs[0]), argc,
                                argv, pos, 0, &np);
    if (ar != ARGS_OK) return ar == ARGS_HELP ? 0 : 2;
    mi_dtype dtype;
    if (!parse_dtype(dtype_name, &dtype)) {
        fprintf(stderr, "minference bench: bad value '%s' for '--dtype' (f32, f16 or bf16)\n\n%s",
                dtype_name, usage);
        return 2;
    }
    result res[N_METHODS];
    memset(res, 0, sizeof res);
    if (method_list) {
        if (!select_methods(method_list, res)) {
            fprintf(stderr, "minference bench: bad value '%s' for '--methods'\n\n%s", method_list,
                    usage);
            return 2;
        }
    } else {
        for (int m = 0; m < N_METHODS; m++) res[m].run = true;
    }
    int n_run = 0;
    for (int m = 0; m < N_METHODS; m++) n_run += res[m].run;
    if (kv_heads == 0) kv_heads = heads;
    if (heads % kv_heads != 0) {
        fprintf(stderr, "minference bench: --heads %d is not a multiple of --kv-heads %d\n\n%s",
                heads, kv_heads, usage);
        return 2;
    }

    mi_context *ctx = NULL;
    mi_context_params cp = mi_context_default_params();
    cp.n_threads = threads;
    mi_status st = mi_context_create(&cp, &ctx);
    if (st != MI_STATUS_SUCCESS) {
        fprintf(stderr, "minference bench: cannot create a CPU context: %s\n",
                mi_status_string(st));
        return 1;
    }
    threads = mi_context_n_threads(ctx);

    const size_t es = mi_dtype_size(dtype);
    const size_t n_q = (size_t)heads * (size_t)len * (size_t)dim;
    const size_t n_kv = (size_t)kv_heads * (size_t)len * (size_t)dim;
    void *q = malloc(n_q * es), *k = malloc(n_kv * es), *v = malloc(n_kv * es);
    void *out_dense = malloc(n_q * es), *out = malloc(n_q * es);
    mi_head_pattern *pats = malloc((size_t)heads * sizeof *pats);
    mi_head_metrics *hm = malloc((size_t)heads * sizeof *hm);
    double *times = malloc((size_t)repeats * sizeof(double));
    int rc = 1, index = 0;
    if (!q || !k || !v || !out_dense || !out || !pats || !hm || !times) {
        fprintf(stderr, "minference bench: out of memory for L=%d, H=%d, D=%d\n", len, heads, dim);
        goto done;
    }
    mi_tensor tq = mi_tensor_bhld(q, dtype, MI_DEVICE_CPU, 1, heads, len, dim);
    mi_tensor tk = mi_tensor_bhld(k, dtype, MI_DEVICE_CPU, 1, kv_heads, len, dim);
    mi_tensor tv = mi_tensor_bhld(v, dtype, MI_DEVICE_CPU, 1, kv_heads, len, dim);
    mi_tensor tref = mi_tensor_bhld(out_dense, dtype, MI_DEVICE_CPU, 1, heads, len, dim);
    mi_tensor tout = mi_tensor_bhld(out, dtype, MI_DEVICE_CPU, 1, heads, len, dim);

    char machine[384];
    machine_name(machine, sizeof machine);
    fprintf(stderr, "minference bench: L=%d heads=%d/%d D=%d %s, %d threads, seed %d\n", len, heads,
            kv_heads, dim, mi_dtype_name(dtype), threads, seed);
    double t0 = tool_now_s();
    mi_synth_params sp = mi_synth_default_params();
    sp.seed = (uint64_t)seed;
    if ((st = mi_synth_generate(ctx, &sp, &tq, &tk, &tv, NULL)) != MI_STATUS_SUCCESS) {
        rc = fail_status(ctx, "synthetic data", st);
        goto done;
    }
    fprintf(stderr, "  synthetic data: %.2f s\n", tool_now_s() - t0);

    /* Kernels are measured as they are: no fallback to dense below the crossover. */
    mi_prefill_params pp = mi_prefill_default_params();
    pp.dense_below = 0;
    for (int m = 0; m < N_METHODS; m++) {
        const mi_head_pattern hp = mi_head_pattern_default(methods[m].type);
        result *r = &res[m];
        if (!r->run) continue;
        r->pattern = hp;
        for (int h = 0; h < heads; h++) pats[h] = hp;
        size_t ws_size = 0;
        if ((st = mi_prefill_workspace_size(ctx, &tq, &tk, pats, &pp, &ws_size))) {
            rc = fail_status(ctx, methods[m].name, st);
            goto done;
        }
        void *ws = ws_size ? malloc(ws_size) : NULL;
        if (ws_size && !ws) {
            fprintf(stderr, "minference bench: out of memory for a %zu-byte workspace\n", ws_size);
            goto done;
        }
        mi_tensor *dst = m == 0 ? &tref : &tout;
        double t_start = tool_now_s();
        for (int rep = 0; rep < repeats; rep++) {
            progress(index, n_run, methods[m].name, rep, repeats + 1);
            double ts = tool_now_s();
            st = mi_prefill_attention(ctx, &tq, &tk, &tv, NULL, pats, &pp, dst, NULL, ws, ws_size);
            times[rep] = tool_now_s() - ts;
            if (st != MI_STATUS_SUCCESS) break;
        }
        free(ws);
        if (st != MI_STATUS_SUCCESS) {
            rc = fail_status(ctx, methods[m].name, st);
            goto done;
        }
        r->ms = 1e3 * median(times, repeats);
        progress(index, n_run, methods[m].name, repeats, repeats + 1);
        if ((st = mi_metrics_evaluate(ctx, &tq, &tk, NULL, pats, &pp, hm))) {
            rc = fail_status(ctx, "metrics", st);
            goto done;
        }
        double dense_flops = 0.0;
        for (int h = 0; h < heads; h++) {
            r->density += hm[h].density / heads;
            r->recall += hm[h].recall / heads;
            r->flops += hm[h].flops;
            dense_flops += hm[h].dense_flops;
        }
        if (m == 0) {
            r->rel_err = 0.0;
            r->flops = dense_flops;
        } else if ((st = mi_metrics_rel_l2(ctx, &tout, &tref, NULL, &r->rel_err))) {
            rc = fail_status(ctx, "rel_l2", st);
            goto done;
        }
        r->speedup = res[0].ms / r->ms;
        r->gflops = r->flops / (r->ms * 1e6);
        if (isatty(2)) fprintf(stderr, "\r");
        fprintf(stderr, "[%d/%d] %-15s %10.2f ms  (%.1f s with metrics)\n", ++index, n_run,
                methods[m].name, r->ms, tool_now_s() - t_start);
    }

    /* After the attention runs: OpenBLAS's worker threads keep spinning for a while after a
     * call and would steal cores from the library's threads. */
    const int64_t gemm_n = len < 4096 ? len : 4096;
    const double sgemm = sgemm_gflops(gemm_n, dim, threads, repeats);
    fprintf(stderr, "  OpenBLAS sgemm %lldx%lldx%d: %.1f GFLOP/s\n", (long long)gemm_n,
            (long long)gemm_n, dim, sgemm);

    printf("\nminference bench  L=%d  heads=%d (kv %d)  D=%d  %s  threads=%d  seed=%d\n", len,
           heads, kv_heads, dim, mi_dtype_name(dtype), threads, seed);
    printf("machine: %s\n", machine);
    printf("OpenBLAS sgemm (%lldx%lldx%d): %.1f GFLOP/s; dense attention reaches %.1f GFLOP/s "
           "(%.0f%% of sgemm)\n\n",
           (long long)gemm_n, (long long)gemm_n, dim, sgemm, res[0].gflops,
           100.0 * res[0].gflops / sgemm);
    printf("%-15s %10s %8s %8s %8s %10s %9s\n", "method", "ms", "speedup", "density", "recall",
           "rel_err", "GFLOP/s");
    for (int m = 0; m < N_METHODS; m++) {
        const result *r = &res[m];
        if (!r->run) continue;
        printf("%-15s %10.2f %7.2fx %8.4f %8.4f %10.2e %9.1f\n", methods[m].name, r->ms, r->speedup,
               r->density, r->recall, r->rel_err, r->gflops);
    }
    rc = 0;
    if (json_path) {
        rc = write_json(json_path, machine, threads, len, heads, kv_heads, dim, dtype, seed,
                        repeats, sgemm, res);
        if (rc == 0) fprintf(stderr, "wrote %s\n", json_path);
    }
done:
    free(q);
    free(k);
    free(v);
    free(out_dense);
    free(out);
    free(pats);
    free(hm);
    free(times);
    mi_context_destroy(ctx);
    return rc;
}
