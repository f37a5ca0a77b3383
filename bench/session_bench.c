/*
 * session_bench.c: what sessions buy over re-reading a long context, per context length.
 *
 *   bench_session [--model PATH (default: SmolLM2) | --random llama3-8b] [--device cuda|cpu]
 *                 [--lens 32768,131072,...] [--method minference|dense|...] [--followup N]
 *                 [--requests R] [--question Q] [--decode N] [--reprefill 0|1] [--offload 0|1]
 *                 [--kv-dtype 0..3] [--kv SPEC[;SPEC...]] [--chunk N] [--pinned 0|1]
 *                 [--json OUT]
 *
 * For each length L, on one session: the prefill of L tokens (TTFT, with the attention method;
 * --chunk N: in calls of N tokens, each after the first attending to the cache at an offset);
 * a fork of it (time, and the pool's bytes before and after: a fork copies no page); a follow-up
 * turn of --followup tokens on the fork (0: none; time, and its share of the prefill's); decode on the
 * parent (tokens/s; the fork ran last, so this includes switching back); then --requests
 * questions of --question tokens, each on a fresh fork of the context (multi-request), against
 * re-prefilling context + question for each (--reprefill 1, the default). Prompts are random
 * byte tokens for a random model, else the system's license texts repeated. Several --kv
 * methods (separated by ';') run one after another on the one loaded model, a row each.
 */
#include "minference_session.h"
#include "args.h"
#include "tool_util.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char usage_text[] =
    "usage: bench_session [--model PATH | --random llama3-8b] [--device cuda|cpu]\n"
    "         [--lens L1,L2,...] [--method NAME] [--followup N] [--requests R]\n"
    "         [--question Q] [--decode N] [--reprefill 0|1] [--offload 0|1]\n"
    "         [--kv-dtype N (0: the model's own precision, 1 f16, 2 bf16, 3 fp8)]\n"
    "         [--kv METHOD[:key=value,...][;METHOD...]] [--chunk N] [--pinned 0|1]\n"
    "         [--gpu NAME]\n"
    "         [--json OUT]\n";

typedef struct row {
    int64_t tokens;
    double prefill_s, fork_s, followup_s, decode_tps, multi_s, reprefill_s;
    double pool_before, pool_after, peak_gib;
    int64_t device_calls;                    /* calls whose KV method attended on the device */
    double decode_first_s, decode_later_tps; /* the first decode step; tokens/s of the others */
} row;

static double used_mib(const mi_session *s) {
    mi_session_stats st;
    if (mi_session_stats_get(s, &st) != MI_STATUS_SUCCESS) return -1;
    return (double)st.pool_used_bytes / (1024.0 * 1024.0);
}

static int run_length(mi_model *model, const int32_t *prompt, int64_t L, int followup, int requests,
                      int question, int n_decode, int reprefill, int kv_dtype, const char *kv,
                      int64_t chunk, float *logits, int32_t vocab, row *r) {
    memset(r, 0, sizeof *r);
    r->tokens = L;
    mi_session *s = NULL, *f = NULL;
    mi_session_params sp = mi_session_default_params();
    sp.kv_dtype = kv_dtype;
    sp.kv = kv;
    if (mi_session_create(model, &sp, &s) != MI_STATUS_SUCCESS) {
        fprintf(stderr, "session: %s\n", mi_model_last_error(model));
        return 1;
    }
    int rc = 1;
    double t = tool_now_s();
    for (int64_t at = 0; at < L;) { /* the whole prompt, or chunk tokens a call */
        const int64_t n = chunk > 0 && L - at > chunk ? chunk : L - at;
        if (mi_session_prefill(s, prompt + at, (size_t)n, logits) != MI_STATUS_SUCCESS) goto fail_s;
        at += n;
    }
    r->prefill_s = tool_now_s() - t;
    mi_model_timing tm;
    mi_model_last_timing(model, &tm);
    r->peak_gib = (double)tm.device_peak_bytes / (1u << 30);
    /* each phase as it ends: a long run stopped by a time limit still tells how far it got */
    fprintf(stderr, "%lld tokens: prefill %.3f s, device peak %.2f GiB\n", (long long)L,
            r->prefill_s, r->peak_gib);
    r->pool_before = used_mib(s);
    t = tool_now_s();
    if (mi_session_fork(s, &f) != MI_STATUS_SUCCESS) goto fail_s;
    r->fork_s = tool_now_s() - t;
    r->pool_after = used_mib(s);
    /* the follow-up turn: the prompt's next tokens as a stand-in for new text */
    t = tool_now_s();
    if (followup > 0 &&
        mi_session_prefill(f, prompt + L, (size_t)followup, logits) != MI_STATUS_SUCCESS) {
        fprintf(stderr, "%lld tokens, follow-up: %s\n", (long long)L, mi_session_last_error(f));
        mi_session_destroy(f);
        mi_session_destroy(s);
        return 1;
    }
    r->followup_s = tool_now_s() - t;
    if (followup > 0)
        fprintf(stderr, "%lld tokens: %d-token turn %.3f s\n", (long long)L, followup,
                r->followup_s);
    mi_session_destroy(f);
    f = NULL;
    int32_t next = mi_argmax(logits, vocab);
    /* the first step apart too: it may carry one-time work (a device copy of Quest's bounds) */
    double t_first = 0;
    t = tool_now_s();
    for (int i = 0; i < n_decode; i++) {
        if (mi_session_decode(s, &next, 1, logits) != MI_STATUS_SUCCESS) goto fail_s;
        next = mi_argmax(logits, vocab);
        if (i == 0) t_first = tool_now_s() - t;
    }
    t = tool_now_s() - t;
    r->decode_tps = n_decode > 0 && t > 0 ? n_decode / t : 0;
    r->decode_first_s = t_first;
    r->decode_later_tps = n_decode > 1 && t > t_first ? (n_decode - 1) / (t - t_first) : 0;
    mi_session_stats ds;
    if (mi_session_stats_get(s, &ds) == MI_STATUS_SUCCESS) r->device_calls = ds.kv_device_calls;
    if (n_decode > 0)
        fprintf(stderr,
                "%lld tokens: decode %.3f tokens/s (first step %.3f s, then %.3f tokens/s; %lld "
                "calls selected on the device)\n",
                (long long)L, r->decode_tps, r->decode_first_s, r->decode_later_tps,
                (long long)r->device_calls);
    if (mi_session_rewind(s, n_decode) != MI_STATUS_SUCCESS) goto fail_s;
    /* multi-request: each question on a fork of the context */
    t = tool_now_s();
    for (int q = 0; q < requests; q++) {
        if (mi_session_fork(s, &f) != MI_STATUS_SUCCESS) goto fail_s;
        if (mi_session_prefill(f, prompt + L + followup + (int64_t)q * question, (size_t)question,
                               logits) != MI_STATUS_SUCCESS) {
            fprintf(stderr, "request %d: %s\n", q, mi_session_last_error(f));
            goto fail_s;
        }
        mi_session_destroy(f);
        f = NULL;
    }
    r->multi_s = tool_now_s() - t;
    mi_session_destroy(s);
    s = NULL;
    if (reprefill) { /* the same questions, each re-reading the context */
        int32_t *p = malloc((size_t)(L + question) * sizeof(int32_t));
        if (!p) return 1;
        memcpy(p, prompt, (size_t)L * sizeof(int32_t));
        t = tool_now_s();
        for (int q = 0; q < requests; q++) {
            memcpy(p + L, prompt + L + followup + (int64_t)q * question,
                   (size_t)question * sizeof(int32_t));
            if (mi_model_prefill(model, p, (size_t)(L + question), logits) != MI_STATUS_SUCCESS) {
                fprintf(stderr, "re-prefill: %s\n", mi_model_last_error(model));
                free(p);
                return 1;
            }
        }
        r->reprefill_s = tool_now_s() - t;
        free(p);
    }
    return 0;
fail_s:
    fprintf(stderr, "%lld tokens: %s\n", (long long)L, s ? mi_session_last_error(s) : "");
    mi_session_destroy(f);
    mi_session_destroy(s);
    return rc;
}

typedef struct run_meta {
    const char *gpu, *device, *model, *method, *kv;
    int offload, kv_dtype, pinned;
} run_meta;

/* The run's JSON with the rows so far: rewritten after each row, so a run stopped by a time
 * limit keeps what it measured. */
static int write_json(const char *path, const run_meta *meta, json_t *rows) {
    time_t now = time(NULL);
    char date[32];
    strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    json_t *root = json_object();
    json_object_set_new(root, "bench", json_string("session"));
    json_object_set_new(root, "date", json_string(date));
    json_object_set_new(root, "gpu", json_string(meta->gpu));
    json_object_set_new(root, "device", json_string(meta->device));
    json_object_set_new(root, "library", json_string(mi_version()));
    json_object_set_new(root, "commit", json_string(mi_build_commit()));
    json_object_set_new(root, "model", json_string(meta->model));
    json_object_set_new(root, "method", json_string(meta->method));
    json_object_set_new(root, "kv_offload", json_boolean(meta->offload));
    json_object_set_new(root, "kv_dtype", json_integer(meta->kv_dtype));
    if (meta->pinned) json_object_set_new(root, "kv_pinned", json_true());
    json_object_set_new(root, "kv", json_string(meta->kv ? meta->kv : "dense"));
    json_object_set(root, "rows", rows);
    const int rc = json_dump_file(root, path, JSON_INDENT(1));
    if (rc != 0) fprintf(stderr, "bench_session: cannot write %s\n", path);
    json_decref(root);
    return rc != 0;
}

int main(int argc, char **argv) {
    const char *model_path = NULL, *random = NULL, *device = "cuda", *lens_s = "32768,131072";
    const char *method = "minference", *gpu = "", *json_path = NULL;
    int followup = 1024, requests = 2, question = 64, n_decode = 16, reprefill = 1, offload = 0;
    int kv_dtype = 0, pinned = 0;
    long long chunk = 0;
    const char *kv = NULL;
    const arg_spec specs[] = {
        {"model", ARG_STR, &model_path, 0, 0, NULL},
        {"random", ARG_STR, &random, 0, 0, NULL},
        {"device", ARG_STR, &device, 0, 0, NULL},
        {"lens", ARG_STR, &lens_s, 0, 0, NULL},
        {"method", ARG_STR, &method, 0, 0, NULL},
        {"followup", ARG_INT, &followup, 0, 1 << 20, NULL},
        {"requests", ARG_INT, &requests, 0, 64, NULL},
        {"question", ARG_INT, &question, 1, 1 << 16, NULL},
        {"decode", ARG_INT, &n_decode, 0, 1 << 16, NULL},
        {"reprefill", ARG_INT, &reprefill, 0, 1, NULL},
        {"offload", ARG_INT, &offload, 0, 1, NULL},
        {"kv-dtype", ARG_INT, &kv_dtype, 0, 3, NULL},
        {"kv", ARG_STR, &kv, 0, 0, NULL},
        {"chunk", ARG_INT64, &chunk, 0, 1LL << 40, NULL},
        {"pinned", ARG_INT, &pinned, 0, 1, NULL},
        {"gpu", ARG_STR, &gpu, 0, 0, NULL},
        {"json", ARG_STR, &json_path, 0, 0, NULL},
    };
    args_result ar =
        args_parse("bench_session", usage_text, specs, (int)(sizeof specs / sizeof specs[0]),
                   argc - 1, argv + 1, NULL, 0, NULL);
    if (ar != ARGS_OK) return ar == ARGS_HELP ? 0 : 2;
    int64_t lens[16];
    int n_lens = 0;
    for (const char *p = lens_s; p && *p && n_lens < 16;) {
        char *end = NULL;
        lens[n_lens] = strtoll(p, &end, 10);
        if (end == p || lens[n_lens] < 2 || (*end && *end != ','))
            return args_error("bench_session", usage_text, "bad --lens '%s'", lens_s);
        n_lens++;
        p = *end ? end + 1 : NULL;
    }
    if (n_lens == 0 || (model_path && random) || (random && strcmp(random, "llama3-8b") != 0) ||
        (strcmp(device, "cpu") != 0 && strcmp(device, "cuda") != 0))
        return args_error("bench_session", usage_text,
                          "bad --lens, --device or --random (or both --model and --random)");
    char *default_model = NULL;
    if (!model_path && !random) model_path = default_model = tool_default_model();
    if (!model_path && !random) {
        fprintf(stderr, "bench_session: no model: pass --model or --random llama3-8b\n");
        return 1;
    }
    mi_model_params mp = mi_model_default_params();
    mp.device = strcmp(device, "cpu") == 0 ? MI_DEVICE_CPU : MI_DEVICE_CUDA;
    mp.kv_offload = offload;
    mp.kv_pinned = pinned;
    mi_model *model = tool_bench_model("bench_session", random ? NULL : model_path, &mp);
    if (!model) return 1;
    if (mi_model_set_attention_name(model, method, NULL, -1) != MI_STATUS_SUCCESS) {
        fprintf(stderr, "bench_session: %s\n", mi_model_last_error(model));
        return 2;
    }
    mi_model_info info;
    mi_model_get_info(model, &info);
    int64_t max_len = 0;
    for (int i = 0; i < n_lens; i++) max_len = lens[i] > max_len ? lens[i] : max_len;
    const int64_t total = max_len + followup + (int64_t)requests * question;
    int32_t *prompt = tool_bench_prompt("bench_session", random ? NULL : model, NULL, total);
    float *logits = malloc((size_t)info.vocab * sizeof(float));
    if (!prompt || !logits) return 1;
    fprintf(stderr, "model %s on %s, method %s, kv %s\n",
            random ? "random llama3-8b shape" : model_path, device, method, kv ? kv : "dense");
    printf("%9s %9s %8s %9s %9s %7s %10s %9s %9s %9s %8s  %s\n", "tokens", "prefill s", "fork ms",
           "pool MiB", "+fork MiB", "turn s", "turn/pref", "decode/s", "multi s", "re-pref s",
           "peak GiB", "kv");
    json_t *rows = json_array();
    int failures = 0;
    const run_meta meta = {
        gpu,      device, random ? "random weights, LLaMA-3-8B shape" : model_path,
        method,   kv,     offload,
        kv_dtype, pinned};
    /* the KV methods: none (dense), one spec, or several separated by ';' (specs hold commas) */
    char *kv_list = kv ? strdup(kv) : NULL, *kv_save = NULL;
    const char *specs_kv[16] = {NULL};
    int n_kv = 1;
    if (kv && !kv_list) return 1;
    if (kv_list) {
        n_kv = 0;
        for (char *t = strtok_r(kv_list, ";", &kv_save); t; t = strtok_r(NULL, ";", &kv_save)) {
            if (n_kv == 16) {
                free(kv_list);
                return args_error("bench_session", usage_text, "more than 16 --kv methods");
            }
            specs_kv[n_kv++] = t;
        }
        if (n_kv == 0) {
            free(kv_list);
            return args_error("bench_session", usage_text, "empty --kv");
        }
    }
    for (int k = 0; k < n_kv; k++) {
        const char *spec = specs_kv[k];
        for (int i = 0; i < n_lens; i++) {
            row r;
            if (run_length(model, prompt, lens[i], followup, requests, question, n_decode,
                           reprefill, kv_dtype, spec, chunk, logits, info.vocab, &r) != 0) {
                failures++;
                continue;
            }
            printf("%9lld %9.3f %8.3f %9.1f %9.1f %7.3f %9.2f%% %9.2f %9.3f %9.3f %8.2f  %s\n",
                   (long long)r.tokens, r.prefill_s, 1e3 * r.fork_s, r.pool_before,
                   r.pool_after - r.pool_before, r.followup_s, 100.0 * r.followup_s / r.prefill_s,
                   r.decode_tps, r.multi_s, r.reprefill_s, r.peak_gib, spec ? spec : "dense");
            fflush(stdout);
            json_t *o = json_object();
            json_object_set_new(o, "tokens", json_integer(r.tokens));
            json_object_set_new(o, "kv", json_string(spec ? spec : "dense"));
            json_object_set_new(o, "chunk", json_integer(chunk));
            json_object_set_new(o, "prefill_s", json_real(r.prefill_s));
            json_object_set_new(o, "fork_s", json_real(r.fork_s));
            json_object_set_new(o, "pool_mib", json_real(r.pool_before));
            json_object_set_new(o, "fork_added_mib", json_real(r.pool_after - r.pool_before));
            json_object_set_new(o, "followup_tokens", json_integer(followup));
            json_object_set_new(o, "followup_s", json_real(r.followup_s));
            json_object_set_new(o, "decode_tokens_per_s", json_real(r.decode_tps));
            json_object_set_new(o, "requests", json_integer(requests));
            json_object_set_new(o, "question_tokens", json_integer(question));
            json_object_set_new(o, "multi_request_s", json_real(r.multi_s));
            json_object_set_new(o, "reprefill_s", json_real(r.reprefill_s));
            json_object_set_new(o, "kv_device_calls", json_integer(r.device_calls));
            json_object_set_new(o, "decode_first_s", json_real(r.decode_first_s));
            json_object_set_new(o, "decode_later_tokens_per_s", json_real(r.decode_later_tps));
            json_object_set_new(o, "device_peak_gib", json_real(r.peak_gib));
            json_array_append_new(rows, o);
            if (json_path && write_json(json_path, &meta, rows) != 0) failures++;
        }
    }
    free(kv_list);
    if (json_path && write_json(json_path, &meta, rows) != 0) failures++;
    json_decref(rows);
    free(prompt);
    free(logits);
    free(default_model);
    mi_model_destroy(model);
    return failures ? 1 : 0;
}
