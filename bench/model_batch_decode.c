/*
 * model_batch_decode.c: decode throughput of batches of sessions (mi_session_decode_batch)
 * against the same sessions decoded one at a time.
 *
 *   bench_model_batch_decode [--model PATH (default: SmolLM2)] [--threads N (2)]
 *                            [--batches 1,3,8] [--prompt-tokens N (100)] [--steps N (32)]
 *                            [--repeats N (3)]
 *
 * For every batch size B: B sessions prefilled with B different slices of real text (the
 * system's license texts), then --steps greedy decode steps as one batch per step, and the same
 * steps on forks of the prefilled sessions one session at a time. Prints decode tokens/s (B
 * tokens per step) and tokens per CPU-second of both, the best of --repeats runs (the machine
 * is shared: the best run is the one least disturbed).
 */
#define _POSIX_C_SOURCE 200809L
#include "minference_model.h"
#include "minference_session.h"
#include "tool_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_B 64

/* Process CPU time (all threads): on a shared machine, tokens per CPU-second are steadier than
 * wall-clock rates (waiting threads sleep, so they are not counted). */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const char *model_path = NULL, *batches = "1,3,8";
    int threads = 2, prompt_tokens = 100, steps = 32, repeats = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--model") == 0)
            model_path = argv[i + 1];
        else if (strcmp(argv[i], "--threads") == 0)
            threads = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--batches") == 0)
            batches = argv[i + 1];
        else if (strcmp(argv[i], "--prompt-tokens") == 0)
            prompt_tokens = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--steps") == 0)
            steps = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--repeats") == 0)
            repeats = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "bench_model_batch_decode: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (prompt_tokens < 1 || steps < 1 || repeats < 1 || threads < 0) {
        fprintf(stderr, "bench_model_batch_decode: bad numbers\n");
        return 2;
    }
    char *path = model_path ? strdup(model_path) : tool_default_model();
    if (!path) {
        fprintf(stderr, "bench_model_batch_decode: no model (scripts/fetch_model.sh)\n");
        return 1;
    }
    mi_model_params mp = mi_model_default_params();
    mp.n_threads = threads;
    mi_model *m = NULL;
    if (mi_model_load(NULL, path, &mp, &m) != MI_STATUS_SUCCESS) {
        fprintf(stderr, "bench_model_batch_decode: cannot load %s\n", path);
        return 1;
    }
    mi_model_set_attention(m, MI_ATTN_DENSE, NULL, -1);
    mi_model_info info;
    mi_model_get_info(m, &info);
    const int V = info.vocab;
    size_t text_len = 0;
    char *text = tool_license_text(&text_len);
    size_t n_text = 0;
    mi_model_tokenize(m, text, text_len, 0, 0, NULL, 0, &n_text);
    int32_t *all = malloc((n_text ? n_text : 1) * sizeof(int32_t));
    mi_model_tokenize(m, text, text_len, 0, 0, all, n_text, &n_text);
    free(text);
    float *lg = malloc((size_t)MAX_B * (size_t)V * sizeof(float));
    if (!all || !lg || n_text < (size_t)(MAX_B * prompt_tokens)) {
        fprintf(stderr, "bench_model_batch_decode: not enough text or memory\n");
        return 1;
    }
    printf("model %s, %d threads, prompts of %d tokens, %d decode steps, best of %d\n", path,
           threads, prompt_tokens, steps, repeats);
    printf("%6s %12s %14s %12s %14s %8s\n", "batch", "batch tok/s", "batch tok/cpu-s",
           "alone tok/s", "alone tok/cpu-s", "speedup");
    for (const char *b = batches; b && *b;) {
        const int B = atoi(b);
        b = strchr(b, ',');
        if (b) b++;
        if (B < 1 || B > MAX_B) continue;
        double best_batch = 0, best_single = 0, cpu_batch = 0, cpu_single = 0;
        for (int r = 0; r < repeats; r++) {
            mi_session *s[MAX_B], *f[MAX_B];
            int32_t next[MAX_B], nf[MAX_B];
            for (int i = 0; i < B; i++) {
                mi_session_create(m, NULL, &s[i]);
                if (mi_session_prefill(s[i], all + (size_t)i * prompt_tokens, (size_t)prompt_tokens,
                                       lg + (size_t)i * V) != 0) {
                    fprintf(stderr, "prefill: %s\n", mi_session_last_error(s[i]));
                    return 1;
                }
                mi_session_fork(s[i], &f[i]);
                next[i] = nf[i] = mi_argmax(lg + (size_t)i * V, V);
            }
            double t0 = tool_now_s(), c0 = cpu_s();
            for (int t = 0; t < steps; t++) {
                if (mi_session_decode_batch(s, next, (size_t)B, lg) != 0) {
                    fprintf(stderr, "decode batch: %s\n", mi_session_last_error(s[0]));
                    return 1;
                }
                for (int i = 0; i < B; i++) next[i] = mi_argmax(lg + (size_t)i * V, V);
            }
            const double tb = (double)B * steps / (tool_now_s() - t0);
            const double cb = (double)B * steps / (cpu_s() - c0);
            t0 = tool_now_s(), c0 = cpu_s();
            for (int t = 0; t < steps; t++)
                for (int i = 0; i < B; i++) {
                    mi_session_decode(f[i], &nf[i], 1, lg);
                    nf[i] = mi_argmax(lg, V);
                }
            const double ts = (double)B * steps / (tool_now_s() - t0);
            const double cs = (double)B * steps / (cpu_s() - c0);
            if (tb > best_batch) best_batch = tb;
            if (ts > best_single) best_single = ts;
            if (cb > cpu_batch) cpu_batch = cb;
            if (cs > cpu_single) cpu_single = cs;
            for (int i = 0; i < B; i++) {
                mi_session_destroy(s[i]);
                mi_session_destroy(f[i]);
            }
        }
        printf("%6d %12.1f %14.1f %12.1f %14.1f %7.2fx\n", B, best_batch, cpu_batch, best_single,
               cpu_single, cpu_batch / cpu_single);
        fflush(stdout);
    }
    free(all);
    free(lg);
    mi_model_destroy(m);
    free(path);
    return 0;
}
