/*
 * model_ttft.c: time to first token of a whole model, dense against sparse prefill.
 *
 *   bench_model_ttft [--model PATH (default: SmolLM2) | --random llama3-8b] [--device cuda|cpu]
 *                    [--lens 32768,131072,...] [--methods dense,minference,...]
 *                    [--config CFG.json] [--text FILE] [--decode N] [--gpu NAME]
 *                    [--commit SHA] [--json OUT]
 *
 * The prompt is real text (--text, default: the license texts of the system) tokenized once and
 * repeated to each length; a random-weights model gets random tokens instead. For every length
 * and method it runs one prefill and reports TTFT (prefill wall time, including the last
 * position's logits), the attention and GEMM parts the runner measured, the rest (norms, RoPE,
 * embeddings, transfers), decode speed after the prefill, and the device memory peak.
 */
#include "minference_model.h"
#include "args.h"
#include "tool_util.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char usage_text[] =
    "usage: bench_model_ttft [--model PATH | --random llama3-8b] [--device cuda|cpu]\n"
    "         [--lens L1,L2,...] [--methods dense,minference,a_shape,...]\n"
    "         [--config CFG.json] [--text FILE] [--decode N] [--warmup N]\n"
    "         [--gpu NAME] [--commit SHA] [--json OUT]\n";

static void on_progress(void *user, int32_t layer, int32_t n_layers, int64_t n_tokens) {
    (void)user;
    fprintf(stderr, "\r  layer %d/%d (%lld tokens)   ", layer, n_layers, (long long)n_tokens);
    if (layer == n_layers) fprintf(stderr, "\r%40s\r", "");
}

static int parse_list(const char *s, char items[][32], int cap) {
    int n = 0;
    while (s && *s && n < cap) {
        const char *e = strchr(s, ',');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if (len == 0 || len >= 32) return -1;
        memcpy(items[n], s, len);
        items[n][len] = 0;
        n++;
        s = e ? e + 1 : NULL;
    }
    return n;
}

int main(int argc, char **argv) {
    const char *model_path = NULL, *random = NULL, *device = "cuda", *lens_s = "32768,131072";
    const char *methods_s = "dense,minference", *config_path = NULL, *text_path = NULL;
    const char *gpu = "", *commit = "", *json_path = NULL;
    int n_decode = 16, warmup = 4096;
    const arg_spec specs[] = {
        {"model", ARG_STR, &model_path, 0, 0, NULL},
        {"random", ARG_STR, &random, 0, 0, NULL},
        {"device", ARG_STR, &device, 0, 0, NULL},
        {"lens", ARG_STR, &lens_s, 0, 0, NULL},
        {"methods", ARG_STR, &methods_s, 0, 0, NULL},
        {"config", ARG_STR, &config_path, 0, 0, NULL},
        {"text", ARG_STR, &text_path, 0, 0, NULL},
        {"gpu", ARG_STR, &gpu, 0, 0, NULL},
        {"commit", ARG_STR, &commit, 0, 0, NULL},
        {"json", ARG_STR, &json_path, 0, 0, NULL},
        {"decode", ARG_INT, &n_decode, 0, 1 << 20, NULL},
        {"warmup", ARG_INT, &warmup, 0, 1 << 24, NULL},
    };
    args_result ar =
        args_parse("bench_model_ttft", usage_text, specs, (int)(sizeof specs / sizeof specs[0]),
                   argc - 1, argv + 1, NULL, 0, NULL);
    if (ar != ARGS_OK) return ar == ARGS_HELP ? 0 : 2;
    char lens_items[16][32], method_items[8][32];
    int n_lens = parse_list(lens_s, lens_items, 16);
    int n_methods = parse_list(methods_s, method_items, 8);
    char *default_model = NULL;
    if (!model_path && !random) model_path = default_model = tool_default_model();
    if (n_lens <= 0 || n_methods <= 0 || (!model_path == !random) ||
        (random && strcmp(random, "llama3-8b") != 0) ||
        (strcmp(device, "cpu") != 0 && strcmp(device, "cuda") != 0))
        return args_error("bench_model_ttft", usage_text,
                          "bad --lens, --methods, --device or --random (or both --model and "
                          "--random)");
    int64_t lens[16];
    mi_attn_mode modes[8];
    for (int i = 0; i < n_lens; i++) {
        lens[i] = strtoll(lens_items[i], NULL, 10);
        if (lens[i] <= 1) {
            fprintf(stderr, "bench_model_ttft: bad length '%s'\n", lens_items[i]);
            return 2;
        }
    }
    for (int i = 0; i < n_methods; i++)
        if (mi_attn_mode_from_name(method_items[i], &modes[i]) != MI_STATUS_SUCCESS) {
            fprintf(stderr, "bench_model_ttft: unknown method '%s'\n", method_items[i]);
            return 2;
        }

    mi_model_params mp = mi_model_default_params();
    mp.device = strcmp(device, "cpu") == 0 ? MI_DEVICE_CPU : MI_DEVICE_CUDA;
    double t_load = tool_now_s();
    mi_model *model = tool_bench_model("bench_model_ttft", random ? NULL : model_path, &mp);
    if (!model) return 1;
    mi_status st;
    t_load = tool_now_s() - t_load;
    mi_model_info info;
    mi_model_get_info(model, &info);
    mi_config *config = NULL;
    if (config_path && mi_config_load(NULL, config_path, &config) != MI_STATUS_SUCCESS) {
        fprintf(stderr, "bench_model_ttft: cannot load %s\n", config_path);
        mi_model_destroy(model);
        return 1;
    }

    /* the prompt: text tokens repeated, or seeded random tokens for a random model */
    int64_t max_len = warmup;
    for (int i = 0; i < n_lens; i++) max_len = lens[i] > max_len ? lens[i] : max_len;
    int32_t *prompt =
        tool_bench_prompt("bench_model_ttft", random ? NULL : model, text_path, max_len);
    float *logits = malloc((size_t)info.vocab * sizeof(float));
    if (!prompt || !logits) {
        fprintf(stderr, "bench_model_ttft: no prompt or out of memory\n");
        return 1;
    }

    fprintf(stderr,
            "model %s: %d layers, %d/%d heads of %d, hidden %d, ffn %d; %s; loaded in %.1f s\n",
            random ? "random llama3-8b shape" : model_path, info.n_layers, info.n_heads,
            info.n_kv_heads, info.head_dim, info.hidden, info.ffn, device, t_load);
    if (warmup > 1) { /* kernels, cuBLAS heuristics and buffers of a first call */
        mi_model_set_attention(model, MI_ATTN_DENSE, NULL, -1);
        mi_model_prefill(model, prompt, (size_t)warmup, logits);
    }

    json_t *rows = json_array();
    printf("%9s %-12s %9s %9s %6s %9s %6s %9s %10s %9s\n", "tokens", "method", "TTFT s", "attn s",
           "attn%", "GEMM s", "GEMM%", "other s", "decode t/s", "peak GiB");
    int failures = 0;
    for (int li = 0; li < n_lens; li++) {
        for (int mi = 0; mi < n_methods; mi++) {
            const int64_t L = lens[li];
            if ((st = mi_model_set_attention(
                     model, modes[mi], modes[mi] == MI_ATTN_MINFERENCE ? config : NULL, -1))) {
                fprintf(stderr, "%s\n", mi_model_last_error(model));
                return 1;
            }
            mi_model_set_progress(model, on_progress, NULL);
            double t0 = tool_now_s();
            st = mi_model_prefill(model, prompt, (size_t)L, logits);
            double ttft = tool_now_s() - t0;
            mi_model_set_progress(model, NULL, NULL);
            if (st != MI_STATUS_SUCCESS) {
                fprintf(stderr, "%lld %s: %s\n", (long long)L, method_items[mi],
                        mi_model_last_error(model));
                failures++;
                continue;
            }
            mi_model_timing tm;
            mi_model_last_timing(model, &tm);
            int32_t first = mi_argmax(logits, info.vocab), next = first;
            double td = tool_now_s();
            for (long d = 0; d < n_decode && st == MI_STATUS_SUCCESS; d++) {
                st = mi_model_decode(model, &next, 1, logits);
                next = mi_argmax(logits, info.vocab);
            }
            td = tool_now_s() - td;
            const double dec = n_decode > 0 && td > 0 ? (double)n_decode / td : 0.0;
            const double other = ttft - tm.attention_s - tm.gemm_s;
            printf("%9lld %-12s %9.3f %9.3f %5.1f%% %9.3f %5.1f%% %9.3f %10.1f %9.2f\n",
                   (long long)L, method_items[mi], ttft, tm.attention_s,
                   100.0 * tm.attention_s / ttft, tm.gemm_s, 100.0 * tm.gemm_s / ttft, other, dec,
                   (double)tm.device_peak_bytes / (1u << 30));
            fflush(stdout);
            json_t *r = json_object();
            json_object_set_new(r, "tokens", json_integer(L));
            json_object_set_new(r, "method", json_string(method_items[mi]));
            json_object_set_new(r, "ttft_s", json_real(ttft));
            json_object_set_new(r, "attention_s", json_real(tm.attention_s));
            json_object_set_new(r, "gemm_s", json_real(tm.gemm_s));
            json_object_set_new(r, "other_s", json_real(other));
            json_object_set_new(r, "attention_share", json_real(tm.attention_s / ttft));
            json_object_set_new(r, "gemm_share", json_real(tm.gemm_s / ttft));
            json_object_set_new(r, "decode_tokens_per_s", json_real(dec));
            json_object_set_new(r, "first_token", json_integer(first));
            json_object_set_new(r, "device_peak_bytes",
                                json_integer((json_int_t)tm.device_peak_bytes));
            json_array_append_new(rows, r);
        }
    }
    if (json_path) {
        time_t now = time(NULL);
        char date[32];
        strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
        json_t *root = json_object();
        json_object_set_new(root, "date", json_string(date));
        json_object_set_new(root, "gpu", json_string(gpu));
        json_object_set_new(root, "commit", json_string(commit));
        json_object_set_new(root, "library", json_string(mi_version()));
        json_object_set_new(root, "device", json_string(device));
        json_object_set_new(root, "model",
                            json_string(random ? "random weights, LLaMA-3-8B shape" : model_path));
        json_t *shape = json_object();
        json_object_set_new(shape, "layers", json_integer(info.n_layers));
        json_object_set_new(shape, "hidden", json_integer(info.hidden));
        json_object_set_new(shape, "ffn", json_integer(info.ffn));
        json_object_set_new(shape, "heads", json_integer(info.n_heads));
        json_object_set_new(shape, "kv_heads", json_integer(info.n_kv_heads));
        json_object_set_new(shape, "head_dim", json_integer(info.head_dim));
        json_object_set_new(shape, "vocab", json_integer(info.vocab));
        json_object_set_new(shape, "weights",
                            json_string(mp.device == MI_DEVICE_CUDA ? "bf16" : "as stored"));
        json_object_set_new(root, "shape", shape);
        char prompt_desc[1200];
        if (random)
            snprintf(prompt_desc, sizeof prompt_desc, "random byte tokens");
        else if (text_path)
            snprintf(prompt_desc, sizeof prompt_desc, "the text of %s, tokenized and repeated",
                     text_path);
        else
            snprintf(prompt_desc, sizeof prompt_desc,
                     "system license texts, tokenized and repeated");
        json_object_set_new(root, "prompt", json_string(prompt_desc));
        json_object_set_new(root, "config",
                            json_string(config_path ? config_path : "default budgets"));
        json_object_set_new(root, "decode_tokens", json_integer(n_decode));
        json_object_set_new(root, "rows", rows);
        if (json_dump_file(root, json_path, JSON_INDENT(1)) != 0) {
            fprintf(stderr, "bench_model_ttft: cannot write %s\n", json_path);
            failures++;
        }
        json_decref(root);
    } else {
        json_decref(rows);
    }
    free(prompt);
    free(logits);
    mi_config_destroy(config);
    mi_model_destroy(model);
    free(default_model);
    return failures ? 1 : 0;
}
