/*
 * cmd_bench.c: `minference bench`: dense causal attention against every sparse pattern, on the
 * CPU or (--device cuda) on a GPU, on synthetic data with real-head structure
 * (mi_synth_generate), one pattern for all heads.
 *
 * Per method: median wall time of mi_prefill_attention (estimation and index building included;
 * on the GPU up to the stream's end, after one untimed call), speed-up over dense, density /
 * recall / FLOPs from mi_metrics_evaluate, and the relative L2 error of the output against the
 * dense output. The metrics are exact, so they cost about a dense attention pass on the CPU: on
 * the GPU they are computed only with --metrics (the error against dense always is). On the CPU,
 * an OpenBLAS sgemm of the attention's shape (min(L, 4096)^2 x D) gives the machine's practical
 * GEMM rate to read the dense kernel against.
 *
 * The default length, 32768, keeps the whole run (five methods, three repeats, exact metrics)
 * well under a minute on a 2-core machine (about 12 s when it is otherwise idle); the sparse
 * patterns' defaults are made for 64K and beyond, so expect modest speed-ups at this length.
 */
#include "args.h"
#include "cli.h"
#include "minference.h"
#include "minference_cuda.h"
#include "minference_model.h"
#include "minference_session.h"
#include "minference_tools.h"
#include "tool_util.h"

#include <cblas.h>
#ifdef MI_TOOLS_CUDA
#include <cuda_runtime_api.h>
#endif
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char usage[] =
    "usage: minference bench [--device cpu|cuda] [--len L] [--heads H] [--kv-heads H_KV]\n"
    "                        [--dim D] [--dtype T] [--threads N] [--seed S] [--repeats R]\n"
    "                        [--methods M] [--metrics] [--tuning T] [--json FILE]\n"
    "\n"
    "Dense causal attention against every sparse pattern (library defaults: a_shape 128/3968,\n"
    "tri_shape 128/3968 + last 100 rows, vertical_and_slash 1000/6096, block_sparse top-100) on\n"
    "synthetic data with sinks, a local band, slash lines, vertical columns and needles.\n"
    "\n"
    "  --device D     cpu, or cuda: the attention on GPU 0 (a build with CUDA; default cpu)\n"
    "  --len L        sequence length (default 32768; 131072 on cuda)\n"
    "  --heads H      query heads (default 1; 32 on cuda)\n"
    "  --kv-heads H   key/value heads, dividing --heads (default: --heads; 8 on cuda with the\n"
    "                 default heads)\n"
    "  --dim D        head dimension (default 128)\n"
    "  --dtype T      f32, f16 or bf16 (default bf16; cuda: f16 or bf16)\n"
    "  --threads N    CPU threads (default 0: all online cores)\n"
    "  --seed S       data seed (default 1234)\n"
    "  --repeats R    timed runs per method; the median is reported (default 3; 5 on cuda)\n"
    "  --methods M    comma-separated subset of the patterns (a_shape, tri_shape, vertical_slash,\n"
    "                 block_sparse, or any name `minference info` lists; default: all; dense\n"
    "                 always runs, as the reference)\n"
    "  --metrics      on cuda, also the density, recall and FLOPs of each pattern, computed\n"
    "                 exactly on the CPU (about a dense attention pass there; always on the CPU)\n"
    "  --tuning T     the kernels' tuning as name=value,... (mi_tuning in minference.h; e.g.\n"
    "                 sm90_sparse=1 or cpu_engine=1; default: every choice automatic)\n"
    "  --json FILE    also append the results to FILE as rows of the results store\n"
    "\n"
    "KV methods (--kv SPEC;SPEC;...): decode on a model instead, per KV method: a session\n"
    "prefills --len tokens of text (default 8000), then --decode greedy steps (default 32) are\n"
    "timed; reported: prefill time, decode tokens/s (and CPU seconds), rows kept and KV bytes.\n"
    "  --kv SPECS     ';'-separated, e.g. \"dense;quest:token_budget=1024\" (docs/kv-methods.md)\n"
    "  --model PATH   the model (default: as generate)\n"
    "  --decode N     decode steps timed per method\n";

/* Process CPU seconds: next to wall time they show when other processes held the cores. */
static double bench_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The --kv benchmark: decode speed and cache size of each KV method at one context length. */
static int bench_kv(const char *specs_s, const char *model_arg, int len, int steps, int threads) {
    mi_cli_prepare_runtime(); /* as generate: sleeping OpenMP threads, the right BLAS kernels */
    char *path = model_arg ? strdup(model_arg) : tool_default_model();
    if (!path) {
        fprintf(stderr, "minference bench: no model: pass --model or set MI_MODEL\n");
        return 1;
    }
    mi_model_params mp = mi_model_default_params();
    mp.n_threads = threads;
    mi_model *model = NULL;
    mi_context *ectx = NULL;
    mi_context_create(NULL, &ectx);
    mi_status st = mi_model_load(ectx, path, &mp, &model);
    if (st != MI_STATUS_SUCCESS)
        fprintf(stderr, "minference bench: %s: %s\n", path, mi_context_last_error(ectx));
    mi_context_destroy(ectx);
    if (st != MI_STATUS_SUCCESS) {
        free(path);
        return 1;
    }
    mi_model_info info;
    mi_model_get_info(model, &info);
    /* real text, repeated to the length: the license texts every Debian system has */
    size_t text_len = 0;
    char *text = tool_license_text(&text_len);
    size_t n_text = 0;
    int32_t *tok = malloc(((size_t)len + (size_t)steps + 1) * sizeof(int32_t));
    int32_t *text_tok = NULL;
    float *logits = malloc((size_t)info.vocab * sizeof(float));
    int rc = 1;
    if (!text || !tok || !logits) {
        fprintf(stderr, "minference bench: no text (/usr/share/common-licenses) or no memory\n");
        goto out;
    }
    mi_model_tokenize(model, text, text_len, 1, 0, NULL, 0, &n_text);
    text_tok = malloc((n_text + 1) * sizeof(int32_t));
    if (!text_tok ||
        mi_model_tokenize(model, text, text_len, 1, 0, text_tok, n_text, &n_text) !=
            MI_STATUS_SUCCESS ||
        n_text < 2) {
        fprintf(stderr, "minference bench: cannot tokenize the text\n");
        goto out;
    }
    for (int i = 0; i < len; i++) tok[i] = text_tok[i == 0 ? 0 : 1 + (i - 1) % (n_text - 1)];
    mi_model_set_attention(model, MI_ATTN_DENSE, NULL, -1);
    printf("decode with KV methods: %s, %d-token context, %d steps\n", path, len, steps);
    printf("%-44s %10s %12s %9s %10s %10s\n", "kv", "prefill s", "decode tok/s", "cpu s",
           "rows kept", "KV MiB");
    char *list = strdup(specs_s);
    rc = 0;
    for (char *save = NULL, *spec = strtok_r(list, ";", &save); spec && rc == 0;
         spec = strtok_r(NULL, ";", &save)) {
        char msg[512];
        if (mi_session_kv_check(spec, msg, sizeof msg) != MI_STATUS_SUCCESS) {
            fprintf(stderr, "minference bench: --kv '%s': %s\n", spec, msg);
            rc = 2;
            break;
        }
        mi_session_params sp = mi_session_default_params();
        sp.kv = spec;
        mi_session *s = NULL;
        if (mi_session_create(model, &sp, &s) != MI_STATUS_SUCCESS) {
            fprintf(stderr, "minference bench: %s\n", mi_model_last_error(model));
            rc = 1;
            break;
        }
        double t0 = tool_now_s();
        st = mi_session_prefill(s, tok, (size_t)len, logits);
        const double t_prefill = tool_now_s() - t0;
        t0 = tool_now_s();
        const double c0 = bench_cpu_s();
        for (int i = 0; i < steps && st == MI_STATUS_SUCCESS; i++) {
            int32_t next = mi_argmax(logits, info.vocab);
            st = mi_session_decode(s, &next, 1, logits);
        }
        const double t_dec = tool_now_s() - t0, c_dec = bench_cpu_s() - c0;
        mi_session_stats ss;
        if (st == MI_STATUS_SUCCESS) st = mi_session_stats_get(s, &ss);
        if (st != MI_STATUS_SUCCESS) {
            fprintf(stderr, "minference bench: %s: %s\n", spec, mi_session_last_error(s));
            rc = 1;
        } else {
            printf("%-44s %10.2f %12.2f %9.2f %10lld %10.1f\n", spec, t_prefill,
                   t_dec > 0 ? steps / t_dec : 0.0, c_dec, (long long)ss.kv_rows,
                   (double)ss.bytes / (1024.0 * 1024.0));
            fflush(stdout);
        }
        mi_session_destroy(s);
    }
    free(list);
out:
    free(text);
    free(text_tok);
    free(tok);
    free(logits);
    mi_model_destroy(model);
    free(path);
    return rc;
}

/* The methods are the library's patterns in its order (dense first: the reference), each under
 * its short name (its first alias, else its config name): dense, a_shape, tri_shape,
 * vertical_slash, block_sparse, ... */
#define MAX_METHODS 32
#define N_METHODS (mi_pattern_count() < MAX_METHODS ? (int)mi_pattern_count() : MAX_METHODS)

typedef struct method {
    const char *name;
    mi_pattern_type type;
} method;

static method methods[MAX_METHODS];

/* Fills methods[] from the library's pattern table. */
static void init_methods(void) {
    for (int m = 0; m < N_METHODS; m++) {
        const mi_pattern_type t = (mi_pattern_type)m;
        const char *alias = mi_pattern_alias(t, 0);
        methods[m].name = alias ? alias : mi_pattern_name(t);
        methods[m].type = t;
    }
}

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

/* Marks the methods named in a comma-separated list (any pattern name or alias); false on an
 * unknown name. */
static bool select_methods(const char *list, result *res) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    res[0].run = true;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        mi_pattern_type t;
        if (mi_pattern_from_name(tok, &t) != MI_STATUS_SUCCESS || (int)t >= N_METHODS) return false;
        res[t].run = true;
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

/* The attention's buffers: host memory on the CPU, device memory on the GPU. Without CUDA in the
 * build, gpu is never true here (the command stops before, at the context). */
static void *mem_alloc(bool gpu, size_t bytes) {
#ifdef MI_TOOLS_CUDA
    if (gpu) {
        void *p = NULL;
        return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
    }
#endif
    (void)gpu;
    return malloc(bytes);
}

static void mem_free(bool gpu, void *p) {
#ifdef MI_TOOLS_CUDA
    if (gpu) {
        if (p) cudaFree(p);
        return;
    }
#endif
    (void)gpu;
    free(p);
}

/* Host to device (to_device) or back; false with a message on failure. */
static bool mem_copy(void *dst, const void *src, size_t bytes, bool to_device) {
#ifdef MI_TOOLS_CUDA
    cudaError_t e =
        cudaMemcpy(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
    if (e == cudaSuccess) return true;
    fprintf(stderr, "\nminference bench: copy of %zu bytes %s the GPU failed: %s\n", bytes,
            to_device ? "to" : "from", cudaGetErrorString(e));
#else
    (void)dst, (void)src, (void)bytes, (void)to_device;
#endif
    return false;
}

/* "NVIDIA H200, 132 SMs" for GPU 0. */
static void gpu_name(char *buf, size_t size) {
    snprintf(buf, size, "unknown GPU");
#ifdef MI_TOOLS_CUDA
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
        snprintf(buf, size, "%s, %d SMs", prop.name, prop.multiProcessorCount);
#endif
}

/* What a run was: its shape and where it ran, as printed and written to JSON. */
typedef struct bench_setup {
    const char *machine, *gpu; /* gpu: NULL on the CPU */
    int threads, len, heads, kv_heads, dim, seed, repeats;
    mi_dtype dtype;
    bool metrics;
    double sgemm;     /* GFLOP/s; NAN on the GPU */
    char tuning[512]; /* the run's tuning as mi_tuning_format writes it; "" for auto */
} bench_setup;

/* One row of the results store (scripts/results.py: one JSON object a line, one schema): the
 * run's commit, date, machine and GPU, the problem's shape, and one method's metric. Nothing for
 * a value not measured (NAN). */
static void json_row(FILE *f, const bench_setup *b, const char *date, const char *method,
                     const char *metric, double value, const char *unit) {
    if (!isfinite(value)) return;
    fputs("{\"commit\": ", f);
    json_string(f, mi_build_commit());
    fprintf(f, ", \"date\": \"%s\", \"machine\": ", date);
    json_string(f, b->machine);
    fputs(", \"gpu\": ", f);
    if (b->gpu)
        json_string(f, b->gpu);
    else
        fputs("null", f);
    fprintf(f,
            ", \"benchmark\": \"minference-bench\", \"shape\": {\"device\": \"%s\", "
            "\"len\": %d, \"heads\": %d, \"kv_heads\": %d, \"dim\": %d, \"dtype\": \"%s\", "
            "\"threads\": %d",
            b->gpu ? "cuda" : "cpu", b->len, b->heads, b->kv_heads, b->dim, mi_dtype_name(b->dtype),
            b->threads);
    /* a forced kernel path is part of what was measured: rows of other tunings stay apart */
    if (b->tuning[0]) {
        fputs(", \"tuning\": ", f);
        json_string(f, b->tuning);
    }
    fputs("}, \"method\": ", f);
    json_string(f, method);
    fprintf(f, ", \"metric\": \"%s\", \"value\": ", metric);
    json_number(f, value);
    if (unit) fprintf(f, ", \"unit\": \"%s\"", unit);
    fputs("}\n", f);
}

/* Appends the run's rows to path (JSON lines), so that `--json bench/results.jsonl` adds them
 * to the store; every row of one run carries the same date. */
static int write_json(const char *path, const bench_setup *b, const result *res) {
    char *rows = NULL;
    size_t rows_n = 0;
    FILE *f = open_memstream(&rows, &rows_n);
    if (!f) {
        perror("open_memstream");
        return 1;
    }
    char date[64];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
    for (int m = 0; m < N_METHODS; m++) {
        const result *r = &res[m];
        if (!r->run) continue;
        json_row(f, b, date, methods[m].name, "ms", r->ms, "ms");
        json_row(f, b, date, methods[m].name, "speedup", r->speedup, "x");
        json_row(f, b, date, methods[m].name, "density", r->density, NULL);
        json_row(f, b, date, methods[m].name, "recall", r->recall, NULL);
        json_row(f, b, date, methods[m].name, "rel_err", r->rel_err, NULL);
        json_row(f, b, date, methods[m].name, "gflops", r->gflops, "GFLOP/s");
    }
    json_row(f, b, date, "openblas sgemm", "gflops", b->sgemm, "GFLOP/s");
    if (fclose(f) != 0) {
        perror("open_memstream");
        free(rows);
        return 1;
    }
    /* the store gains the whole run or nothing */
    const bool ok = tool_append_file("bench", path, rows, rows_n);
    free(rows);
    return ok ? 0 : 1;
}

/* A number in a table column, or "-" where it was not measured (NAN). */
static void print_cell(int width, const char *fmt, double v) {
    char cell[32];
    if (isfinite(v))
        snprintf(cell, sizeof cell, fmt, v);
    else
        snprintf(cell, sizeof cell, "-");
    printf(" %*s", width, cell);
}

static void print_table(const bench_setup *b, const result *res) {
    const double scale = b->gpu ? 1e-3 : 1.0; /* GFLOP/s on the CPU, TFLOP/s on the GPU */
    printf("\nminference bench  %s  L=%d  heads=%d (kv %d)  D=%d  %s  threads=%d  seed=%d\n",
           b->gpu ? "cuda" : "cpu", b->len, b->heads, b->kv_heads, b->dim, mi_dtype_name(b->dtype),
           b->threads, b->seed);
    printf("machine: %s\n", b->machine);
    if (b->gpu) {
        printf("GPU: %s; dense attention reaches %.1f TFLOP/s\n", b->gpu, res[0].gflops * scale);
        if (!b->metrics)
            printf("density, recall and sparse FLOP/s: with --metrics (computed on the CPU)\n");
        printf("\n");
    } else {
        const int64_t gemm_n = b->len < 4096 ? b->len : 4096;
        printf("OpenBLAS sgemm (%lldx%lldx%d): %.1f GFLOP/s; dense attention reaches %.1f "
               "GFLOP/s (%.0f%% of sgemm)\n\n",
               (long long)gemm_n, (long long)gemm_n, b->dim, b->sgemm, res[0].gflops,
               100.0 * res[0].gflops / b->sgemm);
    }
    printf("%-15s %10s %8s %8s %8s %10s %9s\n", "method", "ms", "speedup", "density", "recall",
           "rel_err", b->gpu ? "TFLOP/s" : "GFLOP/s");
    for (int m = 0; m < N_METHODS; m++) {
        const result *r = &res[m];
        if (!r->run) continue;
        printf("%-15s", methods[m].name);
        print_cell(10, "%.2f", r->ms);
        print_cell(8, "%.2fx", r->speedup);
        print_cell(8, "%.4f", r->density);
        print_cell(8, "%.4f", r->recall);
        print_cell(10, "%.2e", r->rel_err);
        print_cell(9, "%.1f", r->gflops * scale);
        printf("\n");
    }
}

int mi_cmd_bench(int argc, char **argv) {
    int len = 32768, heads = 1, kv_heads = 0, dim = 128, threads = 0, seed = 1234, repeats = 3;
    const char *dtype_name = "bf16", *json_path = NULL, *method_list = NULL, *device_name = "cpu";
    const char *tuning = NULL, *kv = NULL, *model_path = NULL;
    int decode_steps = 32;
    bool len_seen = false, heads_seen = false, kv_seen = false, repeats_seen = false;
    bool metrics_flag = false;
    init_methods();
    const arg_spec specs[] = {
        {"device", ARG_STR, &device_name, 0, 0, NULL},
        {"len", ARG_INT, &len, 1, 1 << 24, &len_seen},
        {"heads", ARG_INT, &heads, 1, 1024, &heads_seen},
        {"kv-heads", ARG_INT, &kv_heads, 0, 1024, &kv_seen},
        {"dim", ARG_INT, &dim, 1, 256, NULL},
        {"dtype", ARG_STR, &dtype_name, 0, 0, NULL},
        {"threads", ARG_INT, &threads, 0, MI_MAX_THREADS, NULL},
        {"seed", ARG_INT, &seed, 0, INT32_MAX, NULL},
        {"repeats", ARG_INT, &repeats, 1, 1000, &repeats_seen},
        {"json", ARG_STR, &json_path, 0, 0, NULL},
        {"methods", ARG_STR, &method_list, 0, 0, NULL},
        {"metrics", ARG_BOOL, &metrics_flag, 0, 0, NULL},
        {"tuning", ARG_STR, &tuning, 0, 0, NULL},
        {"kv", ARG_STR, &kv, 0, 0, NULL},
        {"model", ARG_STR, &model_path, 0, 0, NULL},
        {"decode", ARG_INT, &decode_steps, 1, 1 << 20, NULL},
    };
    const char *pos[1];
    int np = 0;
    args_result ar = args_parse("bench", usage, specs, (int)(sizeof specs / sizeof specs[0]), argc,
                                argv, pos, 0, &np);
    if (ar != ARGS_OK) return ar == ARGS_HELP ? 0 : 2;
    if (kv) {
        if (strcmp(device_name, "cpu") != 0)
            return args_error("bench", usage, "--kv runs on the CPU model (sessions)");
        return bench_kv(kv, model_path, len_seen ? len : 8000, decode_steps, threads);
    }
    const bool gpu = strcmp(device_name, "cuda") == 0;
    if (!gpu && strcmp(device_name, "cpu") != 0)
        return args_error("bench", usage, "bad value '%s' for '--device' (cpu or cuda)",
                          device_name);
    mi_dtype dtype;
    if (!parse_dtype(dtype_name, &dtype))
        return args_error("bench", usage, "bad value '%s' for '--dtype' (f32, f16 or bf16)",
                          dtype_name);
    if (gpu && dtype == MI_DTYPE_F32)
        return args_error("bench", usage, "the CUDA kernels take f16 or bf16, not f32");
    if (gpu) { /* a layer of LLaMA-3-8B at 128K: long enough for the sparse kernels to pay */
        if (!len_seen) len = 131072;
        if (!heads_seen) {
            heads = 32;
            if (!kv_seen) kv_heads = 8;
        }
        if (!repeats_seen) repeats = 5;
    }
    result res[MAX_METHODS];
    memset(res, 0, sizeof res);
    if (method_list) {
        if (!select_methods(method_list, res))
            return args_error("bench", usage, "bad value '%s' for '--methods'", method_list);
    } else {
        for (int m = 0; m < N_METHODS; m++) res[m].run = true;
    }
    int n_run = 0;
    for (int m = 0; m < N_METHODS; m++) n_run += res[m].run;
    if (kv_heads == 0) kv_heads = heads;
    if (heads % kv_heads != 0)
        return args_error("bench", usage, "--heads %d is not a multiple of --kv-heads %d", heads,
                          kv_heads);
    const bool metrics = !gpu || metrics_flag;

    /* The CPU context makes the data and the metrics; the attention runs on run_ctx. */
    mi_context *ctx = NULL, *gpu_ctx = NULL;
    mi_context_params cp = mi_context_default_params();
    cp.n_threads = threads;
    mi_status st = mi_context_create(&cp, &ctx);
    if (st != MI_STATUS_SUCCESS) {
        fprintf(stderr, "minference bench: cannot create a CPU context: %s\n",
                mi_status_string(st));
        return 1;
    }
    threads = mi_context_n_threads(ctx);
    if (gpu) {
        /* this tool copies with cudart, so it needs a CUDA build of its own too */
        bool built = strstr(mi_build_features(), "cuda") != NULL;
#ifndef MI_TOOLS_CUDA
        built = false;
#endif
        mi_context_params gp = mi_context_default_params();
        gp.device = MI_DEVICE_CUDA;
        const char *why = !built                       ? "this build has no CUDA backend"
                          : mi_cuda_device_count() < 1 ? "no usable CUDA device"
                          : (st = mi_context_create(&gp, &gpu_ctx)) != MI_STATUS_SUCCESS
                              ? mi_status_string(st)
                              : NULL;
        if (why) {
            fprintf(stderr, "minference bench: --device cuda: %s\n", why);
            mi_context_destroy(ctx);
            return 1;
        }
    }
    mi_context *run_ctx = gpu ? gpu_ctx : ctx;
    if (tuning && (st = mi_context_parse_tuning(run_ctx, tuning)) != MI_STATUS_SUCCESS) {
        fprintf(stderr, "minference bench: --tuning: %s\n", mi_context_last_error(run_ctx));
        mi_context_destroy(gpu_ctx);
        mi_context_destroy(ctx);
        return 2;
    }
    const mi_device_type dev = gpu ? MI_DEVICE_CUDA : MI_DEVICE_CPU;

    const size_t es = mi_dtype_size(dtype);
    const size_t n_q = (size_t)heads * (size_t)len * (size_t)dim;
    const size_t n_kv = (size_t)kv_heads * (size_t)len * (size_t)dim;
    /* host copies (the data is made there; the metrics read them) */
    void *hq = malloc(n_q * es), *hk = malloc(n_kv * es), *hv = malloc(n_kv * es);
    void *href = malloc(n_q * es), *hout = malloc(n_q * es);
    mi_head_pattern *pats = malloc((size_t)heads * sizeof *pats);
    mi_head_metrics *hm = malloc((size_t)heads * sizeof *hm);
    double *times = malloc((size_t)repeats * sizeof(double));
    /* what the attention reads and writes: the same buffers on the CPU */
    void *q = NULL, *k = NULL, *v = NULL, *ref = NULL, *out = NULL, *ws = NULL;
    int rc = 1, index = 0;
    if (!hq || !hk || !hv || !href || !hout || !pats || !hm || !times) {
        fprintf(stderr, "minference bench: out of memory for L=%d, H=%d, D=%d\n", len, heads, dim);
        goto done;
    }
    if (gpu) {
        q = mem_alloc(true, n_q * es);
        k = mem_alloc(true, n_kv * es);
        v = mem_alloc(true, n_kv * es);
        ref = mem_alloc(true, n_q * es);
        out = mem_alloc(true, n_q * es);
        if (!q || !k || !v || !ref || !out) {
            fprintf(stderr, "minference bench: out of GPU memory for L=%d, H=%d, D=%d\n", len,
                    heads, dim);
            goto done;
        }
    } else {
        q = hq, k = hk, v = hv, ref = href, out = hout;
    }
    mi_tensor hq_t = mi_tensor_bhld(hq, dtype, MI_DEVICE_CPU, 1, heads, len, dim);
    mi_tensor hk_t = mi_tensor_bhld(hk, dtype, MI_DEVICE_CPU, 1, kv_heads, len, dim);
    mi_tensor hv_t = mi_tensor_bhld(hv, dtype, MI_DEVICE_CPU, 1, kv_heads, len, dim);
    mi_tensor href_t = mi_tensor_bhld(href, dtype, MI_DEVICE_CPU, 1, heads, len, dim);
    mi_tensor hout_t = mi_tensor_bhld(hout, dtype, MI_DEVICE_CPU, 1, heads, len, dim);
    mi_tensor tq = mi_tensor_bhld(q, dtype, dev, 1, heads, len, dim);
    mi_tensor tk = mi_tensor_bhld(k, dtype, dev, 1, kv_heads, len, dim);
    mi_tensor tv = mi_tensor_bhld(v, dtype, dev, 1, kv_heads, len, dim);
    mi_tensor tref = mi_tensor_bhld(ref, dtype, dev, 1, heads, len, dim);
    mi_tensor tout = mi_tensor_bhld(out, dtype, dev, 1, heads, len, dim);

    /* Kernels are measured as they are: no fallback to dense below the crossover. */
    mi_prefill_params pp = mi_prefill_default_params();
    pp.dense_below = 0;
    /* Every method's workspace size first: it also checks the shape against the device (head
     * dimension, dtype) before the data is made. */
    size_t ws_size = 0;
    for (int m = 0; m < N_METHODS; m++) {
        if (!res[m].run) continue;
        res[m].pattern = mi_head_pattern_default(methods[m].type);
        for (int h = 0; h < heads; h++) pats[h] = res[m].pattern;
        size_t bytes = 0;
        if ((st = mi_prefill_workspace_size(run_ctx, &tq, &tk, pats, &pp, &bytes))) {
            rc = fail_status(run_ctx, methods[m].name, st);
            goto done;
        }
        if (bytes > ws_size) ws_size = bytes;
    }
    if (ws_size && !(ws = mem_alloc(gpu, ws_size))) {
        fprintf(stderr, "minference bench: out of %s memory for a %zu-byte workspace\n",
                gpu ? "GPU" : "host", ws_size);
        goto done;
    }

    char machine[384], gpu_buf[320];
    machine_name(machine, sizeof machine);
    if (gpu) gpu_name(gpu_buf, sizeof gpu_buf);
    fprintf(stderr, "minference bench: %s L=%d heads=%d/%d D=%d %s, %d threads, seed %d\n",
            gpu ? gpu_buf : "cpu", len, heads, kv_heads, dim, mi_dtype_name(dtype), threads, seed);
    double t0 = tool_now_s();
    mi_synth_params sp = mi_synth_default_params();
    sp.seed = (uint64_t)seed;
    if ((st = mi_synth_generate(ctx, &sp, &hq_t, &hk_t, &hv_t, NULL)) != MI_STATUS_SUCCESS) {
        rc = fail_status(ctx, "synthetic data", st);
        goto done;
    }
    if (gpu && (!mem_copy(q, hq, n_q * es, true) || !mem_copy(k, hk, n_kv * es, true) ||
                !mem_copy(v, hv, n_kv * es, true)))
        goto done;
    fprintf(stderr, "  synthetic data: %.2f s\n", tool_now_s() - t0);

    for (int m = 0; m < N_METHODS; m++) {
        result *r = &res[m];
        if (!r->run) continue;
        for (int h = 0; h < heads; h++) pats[h] = r->pattern;
        mi_tensor *dst = m == 0 ? &tref : &tout;
        double t_start = tool_now_s();
        /* on the GPU one untimed call first: the first launch of a kernel loads its module */
        for (int rep = gpu ? -1 : 0; rep < repeats; rep++) {
            progress(index, n_run, methods[m].name, rep + 1, repeats + 2);
            double ts = tool_now_s();
            st = mi_prefill_attention(run_ctx, &tq, &tk, &tv, NULL, pats, &pp, dst, NULL, ws,
                                      ws_size);
            if (gpu && st == MI_STATUS_SUCCESS) st = mi_context_synchronize(run_ctx);
            if (rep >= 0) times[rep] = tool_now_s() - ts;
            if (st != MI_STATUS_SUCCESS) break;
        }
        if (st != MI_STATUS_SUCCESS) {
            rc = fail_status(run_ctx, methods[m].name, st);
            goto done;
        }
        r->ms = 1e3 * median(times, repeats);
        progress(index, n_run, methods[m].name, repeats + 1, repeats + 2);
        if (gpu && !mem_copy(m == 0 ? href : hout, m == 0 ? ref : out, n_q * es, false)) goto done;
        double dense_flops = 0.0;
        if (metrics) {
            if ((st = mi_metrics_evaluate(ctx, &hq_t, &hk_t, NULL, pats, &pp, hm))) {
                rc = fail_status(ctx, "metrics", st);
                goto done;
            }
            for (int h = 0; h < heads; h++) {
                r->density += hm[h].density / heads;
                r->recall += hm[h].recall / heads;
                r->flops += hm[h].flops;
                dense_flops += hm[h].dense_flops;
            }
        } else { /* dense needs no metrics: 4 D per causal (row, key) pair */
            dense_flops = 4.0 * dim * heads * ((double)len * (len + 1) / 2);
            r->density = r->recall = r->flops = m == 0 ? 1.0 : NAN;
        }
        if (m == 0) {
            r->rel_err = 0.0;
            r->flops = dense_flops;
        } else if ((st = mi_metrics_rel_l2(ctx, &hout_t, &href_t, NULL, &r->rel_err))) {
            rc = fail_status(ctx, "rel_l2", st);
            goto done;
        }
        r->speedup = res[0].ms / r->ms;
        r->gflops = r->flops / (r->ms * 1e6);
        if (isatty(2)) fprintf(stderr, "\r");
        fprintf(stderr, "[%d/%d] %-15s %10.2f ms  (%.1f s in all)\n", ++index, n_run,
                methods[m].name, r->ms, tool_now_s() - t_start);
    }

    bench_setup b = {machine, gpu ? gpu_buf : NULL,
                     threads, len,
                     heads,   kv_heads,
                     dim,     seed,
                     repeats, dtype,
                     metrics, NAN,
                     ""};
    mi_context_format_tuning(run_ctx, b.tuning, sizeof b.tuning);
    if (!gpu) {
        /* After the attention runs: OpenBLAS's worker threads keep spinning for a while after a
         * call and would steal cores from the library's threads. */
        const int64_t gemm_n = len < 4096 ? len : 4096;
        b.sgemm = sgemm_gflops(gemm_n, dim, threads, repeats);
        fprintf(stderr, "  OpenBLAS sgemm %lldx%lldx%d: %.1f GFLOP/s\n", (long long)gemm_n,
                (long long)gemm_n, dim, b.sgemm);
    }
    print_table(&b, res);
    rc = 0;
    if (json_path) {
        rc = write_json(json_path, &b, res);
        if (rc == 0) fprintf(stderr, "wrote %s\n", json_path);
    }
done:
    if (gpu) {
        mem_free(true, q), mem_free(true, k), mem_free(true, v);
        mem_free(true, ref), mem_free(true, out);
    }
    mem_free(gpu, ws);
    free(hq);
    free(hk);
    free(hv);
    free(href);
    free(hout);
    free(pats);
    free(hm);
    free(times);
    mi_context_destroy(gpu_ctx);
    mi_context_destroy(ctx);
    return rc;
}
