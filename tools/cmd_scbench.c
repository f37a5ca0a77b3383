/*
 * cmd_scbench.c: `minference scbench`: SCBench's tasks in its two shared-context modes, for each
 * prefill attention pattern x KV-cache method (docs/scbench.md).
 *
 *   multi-turn     one session: the first prompt (context + first question) is prefilled with the
 *                  method's attention, each later turn (the previous reference answer, the next
 *                  question) is appended to the same cache; each answer is decoded greedily on a
 *                  fork of the session, so the cache carries the prompts and reference answers
 *                  only, as the original's "golden context" mode does.
 *   multi-request  the context is prefilled once into a session; each query runs on its own
 *                  fork of it. --reprefill also times the same queries with the context
 *                  prefilled again for each, the cost that sharing saves.
 * Data: --data DIR reads DIR/<task>.jsonl (the public files, unchanged); otherwise the offline
 * generators make each task's examples at --length tokens. Outputs: a text table on stdout,
 * --json (every prediction and score, per turn), --png (tasks x methods heat map) and
 * --curves (per-turn accuracy); files are written atomically.
 */
#define _POSIX_C_SOURCE 200809L
#include "minference.h"
#include "minference_model.h"
#include "minference_session.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "args.h"
#include "cli.h"
#include "cmd_scbench.h"
#include "heatmap_png.h"
#include "tool_util.h"

#define MAX_LIST 16
#define MAX_TURNS 64

static const char usage_text[] =
    "usage: minference scbench [--model PATH] [--tasks LIST] [--data DIR] [--length N]\n"
    "           [--turns N] [--examples N] [--seed N] [--mode multi-turn|multi-request|both]\n"
    "           [--attn LIST] [--kv LIST] [--config CFG.json] [--max-new-tokens N]\n"
    "           [--max-length N] [--chat auto|chatml|llama3|none] [--reprefill]\n"
    "           [--no-golden-context]\n"
    "           [--json FILE] [--png FILE] [--curves FILE] [--save-data DIR]\n"
    "           [--icl-csv FILE] [--text-src FILE] [--py-src DIR] [--threads N]\n"
    "           [--dense-below N] [--device cpu|cuda] [--quiet]\n"
    "\n"
    "SCBench (shared-context benchmark): each task's turns share one long context, in two\n"
    "modes: multi-turn (one session, turns in order, the cache kept) and multi-request (the\n"
    "context prefilled once, each query on a fork of that session).\n"
    "  --tasks      comma list (default: the generated ones: scbench_kv,\n"
    "               scbench_prefix_suffix, scbench_vt, scbench_mf, scbench_many_shot,\n"
    "               scbench_summary_with_needles, scbench_repoqa, scbench_repoqa_and_kv);\n"
    "               with --data also scbench_qa_eng, scbench_qa_chn, scbench_choice_eng,\n"
    "               scbench_summary\n"
    "  --data       read DIR/<task>.jsonl (the public SCBench files, unchanged) instead of\n"
    "               generating\n"
    "  --length     generated context length in the model's tokens (default 1024)\n"
    "  --turns      turns (queries) per example (default 5, as the original's max_turns)\n"
    "  --examples   examples per task (default 1; with --data: the first N, 0 all)\n"
    "  --attn       prefill patterns, comma list (default dense): dense, minference, a_shape,\n"
    "               tri_shape, block_sparse, any name `minference info` lists, or\n"
    "               NAME:V1[:V2...] with the pattern's budgets (a_shape:64:512, vs:100:500);\n"
    "               all: every pattern at its defaults\n"
    "  --kv         KV-cache methods (default dense), separated by ';' or ',' (a ',' before\n"
    "               key=value continues a spec); each is passed to the session as its kv\n"
    "               spec (\"METHOD[:key=value,...]\"); one the library refuses is reported\n"
    "               as unsupported; all: every KV method at its defaults. Every attn x kv\n"
    "               pair runs (attn-major)\n"
    "  --max-new-tokens  cap on each turn's new tokens (default 0: the task's own)\n"
    "  --max-length the longest sequence (default: the model's context length); the first\n"
    "               prompt is cut in the middle to fit, as the original does\n"
    "  --chat       chat template (default auto: from the vocabulary; none: plain text)\n"
    "  --reprefill  multi-request: also time each query with the context prefilled again\n"
    "  --no-golden-context  multi-turn: a later turn carries the model's own previous\n"
    "               answer, not the reference one (the original's --disable_golden_context)\n"
    "  --json, --png, --curves  result files (--png: tasks x methods per mode; --curves:\n"
    "               mean accuracy per turn, one line per method)\n"
    "  --save-data  write the generated examples to DIR/<task>.jsonl\n"
    "  --icl-csv    many-shot: a labelled CSV in scikit-learn's layout (default its iris.csv)\n"
    "  --text-src   summary_with_needles: a dpkg status file (default /var/lib/dpkg/status)\n"
    "  --py-src     repoqa: a directory of Python files (default python3's standard library)\n"
    "  --dense-below  sequences shorter than this prefill densely (default 0: never)\n"
    "  --device     cpu (default) or cuda: the model on GPU 0, its sessions' pages mirrored\n"
    "               on the device (a KV method attends on the host after the first call)\n"
    "  --quiet      no progress on stderr\n";

/* ------------------------------------------------------------------------------------------ */

typedef struct sc_method {
    char attn[48];
    char kv[96];
    bool unsupported;
    char why[200];
} sc_method;

/* Scores of one (mode, method, task). */
typedef struct sc_cell {
    double turn_sum[MAX_TURNS];
    int turn_n[MAX_TURNS];
    double sum;
    int n;
    double prefill_s, decode_s, total_s, reprefill_s, reprefill_sum;
    int reprefill_n, errors;
    int64_t tokens;
} sc_cell;

typedef struct sc_run {
    mi_model *model;
    mi_model_info info;
    float *logits;
    int max_new_cap;
    int64_t max_length;
    bool quiet, reprefill;
    bool own_answers; /* multi-turn history: the model's answers (no golden context) */
    sc_chat_fmt chat;
    char *chat_prefix, *chat_tail;
    json_t *runs; /* one object per (mode, method, task, example) */
} sc_run;

static size_t count_tokens(void *user, const char *text, size_t len) {
    size_t n = 0;
    mi_status st = mi_model_tokenize((mi_model *)user, text, len, 0, 0, NULL, 0, &n);
    return st == MI_STATUS_SUCCESS || st == MI_STATUS_WORKSPACE_TOO_SMALL ? n : 0;
}

static int32_t *tokenize(mi_model *m, const char *text, int add_bos, size_t *n) {
    size_t count = 0;
    const size_t len = strlen(text);
    mi_status st = mi_model_tokenize(m, text, len, add_bos, 1, NULL, 0, &count);
    if (st != MI_STATUS_SUCCESS && st != MI_STATUS_WORKSPACE_TOO_SMALL) return NULL;
    int32_t *t = malloc((count ? count : 1) * sizeof *t);
    if (!t) return NULL;
    if (mi_model_tokenize(m, text, len, add_bos, 1, t, count, &count) != MI_STATUS_SUCCESS) {
        free(t);
        return NULL;
    }
    *n = count;
    return t;
}

/* The decoded text of tokens. */
static char *detok(const mi_model *m, const int32_t *t, int n) {
    size_t cap = 256, len = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    for (int i = 0; i < n; i++) {
        if (mi_model_token_is_control(m, t[i])) continue;
        size_t pl = 0;
        char piece[256];
        if (mi_model_token_to_piece(m, t[i], piece, sizeof piece, &pl) != MI_STATUS_SUCCESS)
            continue;
        if (pl > sizeof piece) pl = sizeof piece;
        if (len + pl + 1 > cap) {
            while (len + pl + 1 > cap) cap *= 2;
            char *u = realloc(s, cap);
            if (!u) return free(s), NULL;
            s = u;
        }
        memcpy(s + len, piece, pl);
        len += pl;
    }
    s[len] = 0;
    return s;
}

/* Greedy decoding on session s from logits (the last prefill's): at most max_new tokens, stopping
 * at an end-of-generation token. The text is malloc'ed; NULL on failure. */
static char *generate(sc_run *r, mi_session *s, int max_new, double *decode_s) {
    int32_t *out = malloc(((size_t)max_new + 1) * sizeof *out);
    if (!out) return NULL;
    int n = 0;
    const double t0 = tool_now_s();
    bool ok = true;
    for (int i = 0; i < max_new; i++) {
        const int32_t next = mi_argmax(r->logits, r->info.vocab);
        if (mi_model_token_is_eog(r->model, next)) break;
        out[n++] = next;
        if (i + 1 == max_new) break;
        if (mi_session_decode(s, &next, 1, r->logits) != MI_STATUS_SUCCESS) {
            ok = false;
            break;
        }
    }
    *decode_s += tool_now_s() - t0;
    char *text = ok ? detok(r->model, out, n) : NULL;
    free(out);
    return text;
}

/* A session with the method's kv spec; NULL with why filled when the library refuses it. */
static mi_session *new_session(sc_run *r, const sc_method *m, char *why, size_t cap) {
    mi_session_params sp = mi_session_default_params();
    sp.max_tokens = r->max_length;
    sp.kv = m->kv;
    mi_session *s = NULL;
    if (mi_session_create(r->model, &sp, &s) != MI_STATUS_SUCCESS) {
        snprintf(why, cap, "%s", mi_model_last_error(r->model));
        return NULL;
    }
    return s;
}

/* The first prompt's tokens cut in the middle to at most max_in (the original's truncation). */
static void truncate_middle(int32_t *t, size_t *n, int64_t max_in) {
    if (max_in <= 0 || (int64_t)*n <= max_in) return;
    const size_t half = (size_t)max_in / 2;
    memmove(t + half, t + *n - half, half * sizeof *t);
    *n = 2 * half;
}

typedef struct needles {
    sc_needle *v;
    int n;
} needles;

/* The reference functions of the task's examples (RepoQA scores against all of a repository's
 * needles; the generated and public files name one repository per example set). */
static needles collect_needles(const json_t *examples) {
    needles nd = {0};
    size_t total = 0;
    for (size_t e = 0; e < json_array_size(examples); e++)
        total += json_array_size(json_object_get(json_array_get(examples, e), "multi_turns"));
    nd.v = calloc(total + 1, sizeof *nd.v);
    for (size_t e = 0; nd.v && e < json_array_size(examples); e++) {
        const json_t *turns = json_object_get(json_array_get(examples, e), "multi_turns");
        for (size_t t = 0; t < json_array_size(turns); t++) {
            const json_t *tu = json_array_get(turns, t);
            const json_t *name = json_object_get(tu, "name"), *ans = json_object_get(tu, "answer");
            const json_t *task = json_object_get(tu, "task");
            if (task &&
                strcmp(json_string_value(task) ? json_string_value(task) : "", "scbench_repoqa"))
                continue;
            if (json_is_string(name) && json_is_string(ans))
                nd.v[nd.n++] = (sc_needle){json_string_value(name), json_string_value(ans)};
        }
    }
    return nd;
}

/* Scores one answer, adds it to the cell and the run's JSON. */
static void record(sc_cell *c, json_t *preds, const char *task, const json_t *turn, int idx,
                   const char *pred, const needles *nd) {
    const json_t *sub = json_object_get(turn, "task");
    const char *scorer = json_is_string(sub) ? json_string_value(sub) : task;
    const json_t *name = json_object_get(turn, "name");
    double s =
        pred ? sc_score_turn(scorer, pred, json_object_get(turn, "answer"),
                             json_object_get(turn, "options"),
                             json_is_string(name) ? json_string_value(name) : NULL, nd->v, nd->n)
             : 0;
    if (s < 0) s = 0;
    if (idx < MAX_TURNS) c->turn_sum[idx] += s, c->turn_n[idx]++;
    c->sum += s, c->n++;
    json_t *o = json_object();
    json_object_set_new(o, "turn", json_integer(idx));
    json_object_set_new(o, "task", json_string(scorer));
    json_object_set_new(o, "prediction", pred ? json_string(pred) : json_null());
    json_object_set(o, "answer", json_object_get(turn, "answer"));
    json_object_set_new(o, "score", json_real(s));
    if (pred && !strcmp(scorer, "scbench_repoqa")) {
        /* how close the answer came: the best BLEU over the needles (pass needs >= 0.8) */
        double sim = 0;
        sc_repoqa_pass(pred, json_is_string(name) ? json_string_value(name) : "", nd->v, nd->n,
                       &sim);
        json_object_set_new(o, "similarity", json_real(sim));
    }
    json_array_append_new(preds, o);
}

static int turn_max_new(const sc_run *r, const char *task, const json_t *turn) {
    const json_t *sub = json_object_get(turn, "task");
    int n =
        sc_task_max_new(sc_task_find(task), json_is_string(sub) ? json_string_value(sub) : NULL);
    if (n <= 0) n = 100;
    if (r->max_new_cap > 0 && n > r->max_new_cap) n = r->max_new_cap;
    return n;
}

/* One example in one mode with one method: fills the cell. false on an error that stops the
 * method (the session cannot be made). */
static bool run_example(sc_run *r, sc_method *m, const char *task, const json_t *ex,
                        bool multi_request, int max_turns, const needles *nd, sc_cell *c,
                        json_t *rec) {
    int np = 0;
    const char *why = NULL;
    char **prompts = sc_build_prompts(task, ex, multi_request, r->chat.prefix ? &r->chat : NULL,
                                      max_turns, &np, &why);
    const json_t *turns = json_object_get(ex, "multi_turns");
    json_t *preds = json_array();
    json_object_set_new(rec, "predictions", preds);
    if (!prompts) {
        json_object_set_new(rec, "error", json_string(why));
        c->errors++;
        return true;
    }
    const int nt = multi_request ? np - 1 : np;
    /* the first prompt leaves room for the answers (the original's rule; multi-request keeps
     * 1000 tokens more for the queries) */
    int64_t new_total = 0;
    for (int i = 0; i < nt; i++)
        new_total += turn_max_new(r, task, json_array_get(turns, (size_t)i));
    const int64_t max_in = r->max_length - new_total - (multi_request ? 1000 : 0);
    size_t n0 = 0;
    int32_t *t0 = tokenize(r->model, prompts[0], -1, &n0);
    char err[256] = "";
    mi_session *s = t0 ? new_session(r, m, err, sizeof err) : NULL;
    if (!s) {
        free(t0);
        sc_free_prompts(prompts, np);
        if (!t0) json_object_set_new(rec, "error", json_string("cannot tokenize the prompt"));
        snprintf(m->why, sizeof m->why, "%s", err);
        return true;
    }
    const size_t before = n0;
    truncate_middle(t0, &n0, max_in > 64 ? max_in : 64);
    json_object_set_new(rec, "context_tokens", json_integer((json_int_t)n0));
    if (n0 < before)
        json_object_set_new(rec, "truncated_tokens", json_integer((json_int_t)(before - n0)));
    c->tokens += (int64_t)n0;
    const double start = tool_now_s();
    double prefill_s = 0, decode_s = 0;
    double t = tool_now_s();
    mi_status st = mi_session_prefill(s, t0, n0, r->logits);
    prefill_s += tool_now_s() - t;
    if (st != MI_STATUS_SUCCESS) { /* every turn then scores 0 */
        json_object_set_new(rec, "error", json_string(mi_session_last_error(s)));
        c->errors++;
    }
    char *prev_pred = NULL; /* the model's answer of the previous turn (own_answers) */
    for (int i = 0; i < nt; i++) {
        const json_t *turn = json_array_get(turns, (size_t)i);
        const int max_new = turn_max_new(r, task, turn);
        char *pred = NULL;
        if (st == MI_STATUS_SUCCESS) {
            if (!multi_request && i > 0) {
                size_t nq = 0;
                char *own =
                    r->own_answers
                        ? sc_turn_prompt_answered(task, ex, r->chat.prefix ? &r->chat : NULL, i,
                                                  prev_pred, max_turns)
                        : NULL;
                int32_t *tq = tokenize(r->model, own ? own : prompts[i], 0, &nq);
                free(own);
                t = tool_now_s();
                st = tq ? mi_session_prefill(s, tq, nq, r->logits) : MI_STATUS_OUT_OF_MEMORY;
                prefill_s += tool_now_s() - t;
                free(tq);
            }
            mi_session *f = NULL;
            if (st == MI_STATUS_SUCCESS) st = mi_session_fork(s, &f);
            if (st == MI_STATUS_SUCCESS && multi_request) {
                size_t nq = 0;
                int32_t *tq = tokenize(r->model, prompts[i + 1], 0, &nq);
                t = tool_now_s();
                st = tq ? mi_session_prefill(f, tq, nq, r->logits) : MI_STATUS_OUT_OF_MEMORY;
                prefill_s += tool_now_s() - t;
                free(tq);
            }
            if (st == MI_STATUS_SUCCESS) pred = generate(r, f, max_new, &decode_s);
            if (st != MI_STATUS_SUCCESS || !pred) {
                json_object_set_new(
                    rec, "error",
                    json_string(f ? mi_session_last_error(f) : mi_session_last_error(s)));
                c->errors++;
            }
            mi_session_destroy(f);
            /* a failed query leaves the shared session usable for the next one */
            if (multi_request) st = MI_STATUS_SUCCESS;
        }
        record(c, preds, task, turn, i, pred, nd);
        if (!r->quiet)
            fprintf(stderr, "    turn %d: %.2f  %.60s\n", i,
                    json_real_value(json_object_get(json_array_get(preds, (size_t)i), "score")),
                    pred ? pred : "(failed)");
        free(prev_pred);
        prev_pred = pred;
    }
    free(prev_pred);
    const double total = tool_now_s() - start;
    c->prefill_s += prefill_s, c->decode_s += decode_s, c->total_s += total;
    json_object_set_new(rec, "prefill_s", json_real(prefill_s));
    json_object_set_new(rec, "decode_s", json_real(decode_s));
    json_object_set_new(rec, "total_s", json_real(total));
    mi_session_destroy(s);

    if (multi_request && r->reprefill) {
        /* the same queries with the context prefilled again for each: the cost without sharing */
        double rt = 0, rsum = 0;
        for (int i = 0; i < nt; i++) {
            const json_t *turn = json_array_get(turns, (size_t)i);
            size_t nq = 0;
            int32_t *tq = tokenize(r->model, prompts[i + 1], 0, &nq);
            int32_t *all = tq ? malloc((n0 + nq) * sizeof *all) : NULL;
            mi_session *f = all ? new_session(r, m, err, sizeof err) : NULL;
            char *pred = NULL;
            const double ts = tool_now_s();
            if (f) {
                memcpy(all, t0, n0 * sizeof *all);
                memcpy(all + n0, tq, nq * sizeof *all);
                double dummy = 0;
                if (mi_session_prefill(f, all, n0 + nq, r->logits) == MI_STATUS_SUCCESS)
                    pred = generate(r, f, turn_max_new(r, task, turn), &dummy);
            }
            rt += tool_now_s() - ts;
            const json_t *sub = json_object_get(turn, "task");
            const json_t *name = json_object_get(turn, "name");
            if (pred) {
                const double sc = sc_score_turn(
                    json_is_string(sub) ? json_string_value(sub) : task, pred,
                    json_object_get(turn, "answer"), json_object_get(turn, "options"),
                    json_is_string(name) ? json_string_value(name) : NULL, nd->v, nd->n);
                rsum += sc > 0 ? sc : 0;
            }
            free(pred), free(all), free(tq);
            mi_session_destroy(f);
        }
        c->reprefill_s += rt, c->reprefill_sum += rsum, c->reprefill_n += nt;
        json_object_set_new(rec, "reprefill_total_s", json_real(rt));
    }
    free(t0);
    sc_free_prompts(prompts, np);
    return true;
}

/* ------------------------------------------------------------------------------------------ */
/* Output                                                                                      */

static bool write_json(json_t *root, const char *path) {
    char *text = json_dumps(root, JSON_INDENT(1));
    const bool ok = text && tool_write_file("scbench", path, text, strlen(text));
    free(text);
    return ok;
}

static double cell_mean(const sc_cell *c) { return c->n ? c->sum / c->n : NAN; }

static void method_label(const sc_method *m, char *out, size_t cap) {
    snprintf(out, cap, "%.47s+%.95s", m->attn, m->kv[0] ? m->kv : "dense");
}

/* ------------------------------------------------------------------------------------------ */

static int split_list(char *s, char **out, int max) {
    int n = 0;
    for (char *save = NULL, *t = strtok_r(s, ",", &save); t && n < max;
         t = strtok_r(NULL, ",", &save))
        if (*t) out[n++] = t;
    return n;
}

/* The chat pieces of the model's template. */
static bool chat_setup(sc_run *r, const char *name) {
    if (!strcmp(name, "none")) return true;
    mi_chat_template tmpl = MI_CHAT_AUTO;
    if (!strcmp(name, "chatml"))
        tmpl = MI_CHAT_CHATML;
    else if (!strcmp(name, "llama3"))
        tmpl = MI_CHAT_LLAMA3;
    else if (strcmp(name, "auto"))
        return false;
    static const char delim[] = "[SEPSEPSEP]";
    char *full = NULL;
    if (mi_model_chat_prompt(r->model, tmpl, NULL, delim, &full) != MI_STATUS_SUCCESS) {
        if (tmpl == MI_CHAT_AUTO) return true; /* no template: plain text */
        return false;
    }
    char *d = strstr(full, delim);
    if (!d) {
        mi_free(full);
        return false;
    }
    r->chat_prefix = strndup(full, (size_t)(d - full));
    r->chat_tail = strdup(d + strlen(delim));
    const bool chatml = strstr(full, "<|im_start|>") != NULL;
    mi_free(full);
    r->chat.prefix = r->chat_prefix;
    r->chat.tail = r->chat_tail;
    r->chat.between = chatml ? "<|im_end|>\n<|im_start|>user\n"
                             : "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n";
    return r->chat_prefix && r->chat_tail;
}

static bool is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Everything measured so far (methods [0, nm)) to the table (print_table), --json, --png and
 * --curves; called after each method so that a long run leaves results as it goes. */
static int emit(const sc_run *r, const sc_method *methods, int nm, char **task_names, int n_tasks,
                const sc_cell *cells, int nm_all, int turns, bool do_mt, bool do_mr, bool reprefill,
                const char *json_path, const char *png_path, const char *curves_path,
                const char *model_path, long long length, long long seed, const char *data_dir,
                bool print_table) {
    const int n_modes = 2;
#define CELL(md, m, t) cells[((size_t)(md) * nm_all + (m)) * n_tasks + (t)]
    /* the table: per mode, methods down, tasks across (score x 100), then per turn */
    for (int md = 0; md < n_modes && print_table; md++) {
        if ((md == 0 && !do_mt) || (md == 1 && !do_mr)) continue;
        printf("\n%s (score x 100, mean over examples and turns)\n%-26s",
               md ? "multi-request" : "multi-turn", "method");
        for (int ti = 0; ti < n_tasks; ti++) printf(" %10.10s", task_names[ti] + 8);
        printf(" %8s %9s\n", "mean", "time_s");
        for (int mi = 0; mi < nm; mi++) {
            char label[160];
            method_label(&methods[mi], label, sizeof label);
            printf("%-26.26s", label);
            if (methods[mi].unsupported) {
                printf(" unsupported: %.80s\n", methods[mi].why);
                continue;
            }
            double tot = 0, time_s = 0;
            for (int ti = 0; ti < n_tasks; ti++) {
                const double v = cell_mean(&CELL(md, mi, ti));
                printf(" %10.1f", 100 * v);
                tot += v;
                time_s += CELL(md, mi, ti).total_s;
            }
            printf(" %8.1f %9.1f\n", 100 * tot / n_tasks, time_s);
        }
        printf("%s per turn (score x 100, mean over tasks)\n%-26s",
               md ? "multi-request" : "multi-turn", "method");
        for (int t = 0; t < turns; t++) printf(" %6d", t + 1);
        printf("\n");
        for (int mi = 0; mi < nm; mi++) {
            if (methods[mi].unsupported) continue;
            char label[160];
            method_label(&methods[mi], label, sizeof label);
            printf("%-26.26s", label);
            for (int t = 0; t < turns; t++) {
                double s = 0;
                int n = 0;
                for (int ti = 0; ti < n_tasks; ti++) {
                    const sc_cell *c = &CELL(md, mi, ti);
                    if (c->turn_n[t]) s += c->turn_sum[t] / c->turn_n[t], n++;
                }
                if (n)
                    printf(" %6.1f", 100 * s / n);
                else
                    printf(" %6s", "-");
            }
            printf("\n");
        }
        if (md == 1 && reprefill) {
            printf("multi-request sharing: seconds for all queries (shared context vs the context "
                   "prefilled per query)\n");
            for (int mi = 0; mi < nm; mi++) {
                if (methods[mi].unsupported) continue;
                char label[160];
                method_label(&methods[mi], label, sizeof label);
                double a = 0, b = 0, sa = 0, sb = 0;
                int na = 0, nb = 0;
                for (int ti = 0; ti < n_tasks; ti++) {
                    const sc_cell *c = &CELL(md, mi, ti);
                    a += c->total_s, b += c->reprefill_s, sa += c->sum, na += c->n;
                    sb += c->reprefill_sum, nb += c->reprefill_n;
                }
                printf("%-26.26s shared %8.1f s  re-prefill %8.1f s  (x%.2f)  score %.1f vs %.1f\n",
                       label, a, b, a > 0 ? b / a : 0, na ? 100 * sa / na : 0,
                       nb ? 100 * sb / nb : 0);
            }
        }
    }

    /* JSON */
    json_t *root = json_object();
    json_object_set_new(root, "model", json_string(model_path));
    json_object_set_new(root, "length", json_integer(data_dir ? 0 : length));
    json_object_set_new(root, "max_length", json_integer(r->max_length));
    json_object_set_new(root, "turns", json_integer(turns));
    /* 0: each task's own new-token limits; N: every limit lowered to at most N */
    json_object_set_new(root, "max_new_tokens_cap", json_integer(r->max_new_cap));
    json_object_set_new(root, "seed", json_integer(seed));
    json_object_set_new(root, "data", json_string(data_dir ? data_dir : "generated"));
    json_object_set_new(root, "chat", json_boolean(r->chat.prefix != NULL));
    /* multi-turn history: the reference answers (the original's default) or the model's own */
    json_object_set_new(root, "golden_context", json_boolean(!r->own_answers));
    json_t *jt = json_array(), *jm = json_array(), *jres = json_array();
    for (int ti = 0; ti < n_tasks; ti++) json_array_append_new(jt, json_string(task_names[ti]));
    for (int mi = 0; mi < nm; mi++) {
        json_t *o = json_object();
        json_object_set_new(o, "attn", json_string(methods[mi].attn));
        json_object_set_new(o, "kv", json_string(methods[mi].kv));
        json_object_set_new(o, "supported", json_boolean(!methods[mi].unsupported));
        if (methods[mi].unsupported) json_object_set_new(o, "why", json_string(methods[mi].why));
        json_array_append_new(jm, o);
    }
    for (int md = 0; md < n_modes; md++) {
        if ((md == 0 && !do_mt) || (md == 1 && !do_mr)) continue;
        for (int mi = 0; mi < nm; mi++)
            for (int ti = 0; ti < n_tasks; ti++) {
                const sc_cell *c = &CELL(md, mi, ti);
                if (methods[mi].unsupported) continue;
                json_t *o = json_object(), *pt = json_array();
                json_object_set_new(o, "mode", json_string(md ? "multi-request" : "multi-turn"));
                json_object_set_new(o, "attn", json_string(methods[mi].attn));
                json_object_set_new(o, "kv", json_string(methods[mi].kv));
                json_object_set_new(o, "task", json_string(task_names[ti]));
                json_object_set_new(o, "score", c->n ? json_real(cell_mean(c)) : json_null());
                for (int t = 0; t < turns; t++)
                    json_array_append_new(
                        pt, c->turn_n[t] ? json_real(c->turn_sum[t] / c->turn_n[t]) : json_null());
                json_object_set_new(o, "per_turn", pt);
                json_object_set_new(o, "prefill_s", json_real(c->prefill_s));
                json_object_set_new(o, "decode_s", json_real(c->decode_s));
                json_object_set_new(o, "total_s", json_real(c->total_s));
                json_object_set_new(o, "context_tokens", json_integer(c->tokens));
                json_object_set_new(o, "errors", json_integer(c->errors));
                if (c->reprefill_n) {
                    json_object_set_new(o, "reprefill_total_s", json_real(c->reprefill_s));
                    json_object_set_new(o, "reprefill_score",
                                        json_real(c->reprefill_sum / c->reprefill_n));
                }
                json_array_append_new(jres, o);
            }
    }
    /* the matrix's axes, in the order the methods cross them (attn-major) */
    json_t *ja = json_array(), *jk = json_array();
    for (int mi = 0; mi < nm; mi++) {
        bool seen_a = false, seen_k = false;
        for (int j = 0; j < mi; j++) {
            seen_a |= !strcmp(methods[j].attn, methods[mi].attn);
            seen_k |= !strcmp(methods[j].kv, methods[mi].kv);
        }
        if (!seen_a) json_array_append_new(ja, json_string(methods[mi].attn));
        if (!seen_k) json_array_append_new(jk, json_string(methods[mi].kv));
    }
    json_object_set_new(root, "attn", ja);
    json_object_set_new(root, "kv", jk);
    json_object_set_new(root, "tasks", jt);
    json_object_set_new(root, "methods", jm);
    json_object_set_new(root, "results", jres);
    json_object_set(root, "runs", r->runs);
    int rc = 0;
    if (json_path && !write_json(root, json_path)) rc = 1;
    if (png_path || curves_path) {
        if (!heatmap_png_supported()) {
            fprintf(stderr, "minference scbench: this build writes no PNG (no libpng)\n");
            rc = 1;
        }
    }
    if (png_path && heatmap_png_supported()) {
        /* panels: the modes; columns: methods (table order); rows: tasks (table order) */
        double *g = malloc((size_t)n_modes * nm * n_tasks * sizeof *g);
        long long *ml = malloc((size_t)nm * sizeof *ml), *tl = malloc((size_t)n_tasks * sizeof *tl);
        int np = 0;
        for (int md = 0; g && ml && tl && md < n_modes; md++) {
            if ((md == 0 && !do_mt) || (md == 1 && !do_mr)) continue;
            for (int mi = 0; mi < nm; mi++)
                for (int ti = 0; ti < n_tasks; ti++)
                    g[((size_t)np * nm + mi) * n_tasks + ti] =
                        methods[mi].unsupported ? NAN : cell_mean(&CELL(md, mi, ti));
            np++;
        }
        for (int mi = 0; ml && mi < nm; mi++) ml[mi] = mi + 1;
        for (int ti = 0; tl && ti < n_tasks; ti++) tl[ti] = ti + 1;
        if (!g || !ml || !tl || !heatmap_write_png(png_path, g, np, nm, n_tasks, ml, tl)) rc = 1;
        free(g), free(ml), free(tl);
    }
    if (curves_path && heatmap_png_supported()) {
        /* mean over tasks per turn: the modes side by side, one line per method */
        const int nmodes_on = do_mt + do_mr;
        double *acc = malloc((size_t)nmodes_on * nm * turns * sizeof *acc);
        int p = 0;
        for (int md = 0; acc && md < n_modes; md++) {
            if ((md == 0 && !do_mt) || (md == 1 && !do_mr)) continue;
            for (int mi = 0; mi < nm; mi++)
                for (int t = 0; t < turns; t++) {
                    double s = 0;
                    int n = 0;
                    for (int ti = 0; ti < n_tasks && !methods[mi].unsupported; ti++) {
                        const sc_cell *c = &CELL(md, mi, ti);
                        if (c->turn_n[t]) s += c->turn_sum[t] / c->turn_n[t], n++;
                    }
                    acc[((size_t)p * nm + mi) * turns + t] = n ? s / n : NAN;
                }
            p++;
        }
        if (!acc || !sc_write_curves_png(curves_path, acc, nmodes_on, nm, turns)) rc = 1;
        free(acc);
    }
#undef CELL
    json_decref(root);
    return rc;
}

int mi_cmd_scbench(int argc, char **argv) {
    const char *model_path = NULL, *tasks_arg = NULL, *data_dir = NULL, *mode = "both";
    const char *attn_arg = "dense", *kv_arg = "dense", *config_path = NULL, *chat_name = "auto";
    const char *json_path = NULL, *png_path = NULL, *curves_path = NULL, *save_dir = NULL;
    const char *icl_csv = NULL, *text_src = NULL, *py_src = NULL;
    long long length = 1024, max_length = 0, seed = 1;
    int turns = 5, examples = 1, max_new = 0, threads = 0, dense_below = 0;
    const char *device_name = "cpu";
    bool reprefill = false, quiet = false, no_golden = false;
    const arg_spec specs[] = {
        {"model", ARG_STR, &model_path, 0, 0, NULL},
        {"tasks", ARG_STR, &tasks_arg, 0, 0, NULL},
        {"data", ARG_STR, &data_dir, 0, 0, NULL},
        {"length", ARG_INT64, &length, 64, 1 << 24, NULL},
        {"turns", ARG_INT, &turns, 1, MAX_TURNS, NULL},
        {"examples", ARG_INT, &examples, 0, 100000, NULL},
        {"seed", ARG_INT64, &seed, 0, (long long)1 << 62, NULL},
        {"mode", ARG_STR, &mode, 0, 0, NULL},
        {"attn", ARG_STR, &attn_arg, 0, 0, NULL},
        {"kv", ARG_STR, &kv_arg, 0, 0, NULL},
        {"config", ARG_STR, &config_path, 0, 0, NULL},
        {"max-new-tokens", ARG_INT, &max_new, 0, 1 << 20, NULL},
        {"max-length", ARG_INT64, &max_length, 0, (long long)1 << 30, NULL},
        {"chat", ARG_STR, &chat_name, 0, 0, NULL},
        {"reprefill", ARG_BOOL, &reprefill, 0, 0, NULL},
        {"no-golden-context", ARG_BOOL, &no_golden, 0, 0, NULL},
        {"json", ARG_STR, &json_path, 0, 0, NULL},
        {"png", ARG_STR, &png_path, 0, 0, NULL},
        {"curves", ARG_STR, &curves_path, 0, 0, NULL},
        {"save-data", ARG_STR, &save_dir, 0, 0, NULL},
        {"icl-csv", ARG_STR, &icl_csv, 0, 0, NULL},
        {"text-src", ARG_STR, &text_src, 0, 0, NULL},
        {"py-src", ARG_STR, &py_src, 0, 0, NULL},
        {"threads", ARG_INT, &threads, 0, 1024, NULL},
        {"device", ARG_STR, &device_name, 0, 0, NULL},
        {"dense-below", ARG_INT, &dense_below, 0, 1 << 30, NULL},
        {"quiet", ARG_BOOL, &quiet, 0, 0, NULL},
    };
    const args_result ar = args_parse("scbench", usage_text, specs, sizeof specs / sizeof *specs,
                                      argc, argv, NULL, 0, NULL);
    if (ar != ARGS_OK) return ar == ARGS_HELP ? 0 : 2;
    if (strcmp(device_name, "cpu") != 0 && strcmp(device_name, "cuda") != 0)
        return args_error("scbench", usage_text, "unknown --device '%s' (cpu or cuda)",
                          device_name);
    const bool do_mt = !strcmp(mode, "both") || !strcmp(mode, "multi-turn");
    const bool do_mr = !strcmp(mode, "both") || !strcmp(mode, "multi-request");
    if (!do_mt && !do_mr) return args_error("scbench", usage_text, "unknown --mode '%s'", mode);
    if (strcmp(chat_name, "auto") && strcmp(chat_name, "chatml") && strcmp(chat_name, "llama3") &&
        strcmp(chat_name, "none"))
        return args_error("scbench", usage_text, "unknown --chat '%s'", chat_name);
    if (data_dir && !is_dir(data_dir))
        return args_error("scbench", usage_text, "--data %s is not a directory", data_dir);
    if (save_dir && !is_dir(save_dir))
        return args_error("scbench", usage_text, "--save-data %s is not a directory", save_dir);

    char *task_names[MAX_LIST * 2], *attns[MAX_LIST] = {0}, *kvs[MAX_LIST] = {0};
    char *tasks_copy = strdup(tasks_arg ? tasks_arg
                                        : "scbench_kv,scbench_prefix_suffix,scbench_vt,scbench_mf,"
                                          "scbench_many_shot,scbench_summary_with_needles,"
                                          "scbench_repoqa,scbench_repoqa_and_kv");
    char lwhy[128] = "";
    const int n_tasks = tasks_copy ? split_list(tasks_copy, task_names, MAX_LIST * 2) : 0;
    const int n_attn = sc_attn_list(attn_arg, attns, MAX_LIST, lwhy, sizeof lwhy);
    const int n_kv = n_attn > 0 ? sc_kv_list(kv_arg, kvs, MAX_LIST, lwhy, sizeof lwhy) : -1;
    int rc = 1;
    if (!n_tasks || n_attn <= 0 || n_kv <= 0) {
        free(tasks_copy), sc_free_list(attns, MAX_LIST), sc_free_list(kvs, MAX_LIST);
        return args_error("scbench", usage_text, "%s", n_tasks ? lwhy : "empty --tasks");
    }
    for (int i = 0; i < n_tasks; i++) {
        const sc_task_info *ti = sc_task_find(task_names[i]);
        if (!ti || (!ti->generated && !data_dir)) {
            args_error("scbench", usage_text,
                       ti ? "task %s needs the public data (--data DIR)" : "unknown task '%s'",
                       task_names[i]);
            free(tasks_copy), sc_free_list(attns, MAX_LIST), sc_free_list(kvs, MAX_LIST);
            return 2;
        }
    }
    for (int i = 0; i < n_attn; i++) {
        mi_pattern_type pt;
        mi_head_pattern hp;
        if (strchr(attns[i], ':') ? mi_head_pattern_parse(attns[i], &hp) != MI_STATUS_SUCCESS
                                  : strcmp(attns[i], "minference") &&
                                        mi_pattern_from_name(attns[i], &pt) != MI_STATUS_SUCCESS) {
            args_error("scbench", usage_text, "unknown --attn '%s'", attns[i]);
            free(tasks_copy), sc_free_list(attns, MAX_LIST), sc_free_list(kvs, MAX_LIST);
            return 2;
        }
    }

    mi_cli_prepare_runtime();
    char *default_model = model_path ? NULL : tool_default_model();
    if (!model_path) model_path = default_model;
    if (!model_path) {
        fprintf(stderr, "minference scbench: no model (--model, $MI_MODEL or the demo model)\n");
        free(tasks_copy), sc_free_list(attns, MAX_LIST), sc_free_list(kvs, MAX_LIST);
        return 1;
    }
    mi_context *ctx = NULL;
    mi_context_params cp = mi_context_default_params();
    cp.n_threads = threads;
    mi_model_params mp = mi_model_default_params();
    mp.n_threads = threads;
    mp.device = strcmp(device_name, "cuda") == 0 ? MI_DEVICE_CUDA : MI_DEVICE_CPU;
    mi_config *config = NULL, *own_configs[MAX_LIST] = {0};
    int n_own = 0;
    sc_run r = {0};
    r.quiet = quiet, r.reprefill = reprefill, r.max_new_cap = max_new;
    r.own_answers = no_golden;
    sc_method methods[MAX_LIST * MAX_LIST];
    int nm = 0;
    json_t *data[MAX_LIST * 2] = {0};
    sc_cell *cells = NULL;
    json_t *root = NULL;
    if (mi_context_create(&cp, &ctx) != MI_STATUS_SUCCESS ||
        mi_model_load(ctx, model_path, &mp, &r.model) != MI_STATUS_SUCCESS) {
        fprintf(stderr, "minference scbench: cannot load %s: %s\n", model_path,
                ctx ? mi_context_last_error(ctx) : "no context");
        goto out;
    }
    mi_model_get_info(r.model, &r.info);
    r.max_length = max_length > 0              ? max_length
                   : r.info.context_length > 0 ? r.info.context_length
                                               : 8192;
    r.logits = malloc((size_t)r.info.vocab * sizeof *r.logits);
    if (!r.logits || !chat_setup(&r, chat_name)) {
        fprintf(stderr, "minference scbench: no chat template '%s' fits this model\n", chat_name);
        goto out;
    }
    if (config_path && mi_config_load(NULL, config_path, &config) != MI_STATUS_SUCCESS) {
        fprintf(stderr, "minference scbench: cannot load config %s\n", config_path);
        goto out;
    }
    for (int a = 0; a < n_attn; a++)
        for (int k = 0; k < n_kv; k++) {
            sc_method *m = &methods[nm++];
            memset(m, 0, sizeof *m);
            snprintf(m->attn, sizeof m->attn, "%s", attns[a]);
            snprintf(m->kv, sizeof m->kv, "%s", kvs[k]);
        }

    /* the data: read or generated once, shared by every method */
    for (int i = 0; i < n_tasks; i++) {
        if (data_dir) {
            char path[4096], why[512];
            snprintf(path, sizeof path, "%s/%s.jsonl", data_dir, task_names[i]);
            data[i] = sc_read_jsonl(path, examples, why, sizeof why);
            if (!data[i]) {
                fprintf(stderr, "minference scbench: %s\n", why);
                goto out;
            }
        } else {
            sc_gen_params gp = {(uint64_t)seed, length,  turns,   examples > 0 ? examples : 1,
                                count_tokens,   r.model, icl_csv, text_src,
                                py_src};
            const char *why = NULL;
            data[i] = json_array();
            if (!sc_generate(task_names[i], &gp, data[i], &why)) {
                fprintf(stderr, "minference scbench: %s: %s\n", task_names[i], why);
                goto out;
            }
        }
        if (save_dir) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s.jsonl", save_dir, task_names[i]);
            if (!sc_write_jsonl(data[i], path)) {
                fprintf(stderr, "minference scbench: cannot write %s\n", path);
                goto out;
            }
        }
    }

    const int n_modes = 2;
    cells = calloc((size_t)n_modes * nm * n_tasks, sizeof *cells);
    r.runs = json_array();
    if (!cells || !r.runs) goto out;
#define CELL(md, m, t) cells[((size_t)(md) * nm + (m)) * n_tasks + (t)]
    for (int mi = 0; mi < nm; mi++) {
        sc_method *m = &methods[mi];
        /* "NAME:V1[:V2...]": that pattern with these budgets on every head, via a config */
        mi_config *own = NULL;
        mi_head_pattern hp;
        mi_status ast;
        if (strchr(m->attn, ':')) {
            ast = mi_head_pattern_parse(m->attn, &hp);
            if (ast == MI_STATUS_SUCCESS)
                ast = mi_config_create(ctx, r.info.n_layers, r.info.n_heads, &hp, &own);
            if (ast == MI_STATUS_SUCCESS)
                ast = mi_model_set_attention(r.model, MI_ATTN_MINFERENCE, own, dense_below);
        } else {
            ast = mi_model_set_attention_name(r.model, m->attn, config, dense_below);
        }
        if (own) {
            if (n_own < MAX_LIST)
                own_configs[n_own++] = own; /* borrowed by the model */
            else
                mi_config_destroy(own), ast = MI_STATUS_INVALID_ARGUMENT;
        }
        if (ast != MI_STATUS_SUCCESS) {
            m->unsupported = true;
            snprintf(m->why, sizeof m->why, "%s", mi_model_last_error(r.model));
            continue;
        }
        for (int ti = 0; ti < n_tasks && !m->unsupported; ti++) {
            needles nd = collect_needles(data[ti]);
            for (int md = 0; md < n_modes && !m->unsupported; md++) {
                if ((md == 0 && !do_mt) || (md == 1 && !do_mr)) continue;
                for (size_t e = 0; e < json_array_size(data[ti]) && !m->unsupported; e++) {
                    char label[160];
                    method_label(m, label, sizeof label);
                    if (!quiet)
                        fprintf(stderr, "scbench: %s %s %s example %zu\n", task_names[ti],
                                md ? "multi-request" : "multi-turn", label, e);
                    json_t *rec = json_object();
                    json_object_set_new(rec, "task", json_string(task_names[ti]));
                    json_object_set_new(rec, "mode",
                                        json_string(md ? "multi-request" : "multi-turn"));
                    json_object_set_new(rec, "attn", json_string(m->attn));
                    json_object_set_new(rec, "kv", json_string(m->kv));
                    json_object_set(rec, "id", json_object_get(json_array_get(data[ti], e), "id"));
                    if (!run_example(&r, m, task_names[ti], json_array_get(data[ti], e), md == 1,
                                     turns, &nd, &CELL(md, mi, ti), rec)) {
                        json_decref(rec);
                        goto out;
                    }
                    if (m->why[0]) {
                        m->unsupported = true; /* the library refused the method */
                        json_decref(rec);
                    } else {
                        json_array_append_new(r.runs, rec);
                    }
                }
            }
            free(nd.v);
        }
        if (m->unsupported && !quiet)
            fprintf(stderr, "scbench: %s / %s unsupported: %s\n", m->attn, m->kv, m->why);
        emit(&r, methods, mi + 1, task_names, n_tasks, cells, nm, turns, do_mt, do_mr, reprefill,
             json_path, png_path, curves_path, model_path, length, seed, data_dir, false);
    }

    rc = emit(&r, methods, nm, task_names, n_tasks, cells, nm, turns, do_mt, do_mr, reprefill,
              json_path, png_path, curves_path, model_path, length, seed, data_dir, true);
#undef CELL
out:
    for (int i = 0; i < n_tasks; i++) json_decref(data[i]);
    json_decref(root);
    json_decref(r.runs);
    free(cells);
    free(r.logits);
    free(r.chat_prefix), free(r.chat_tail);
    mi_model_destroy(r.model);
    mi_config_destroy(config);
    for (int i = 0; i < n_own; i++) mi_config_destroy(own_configs[i]);
    mi_context_destroy(ctx);
    free(default_model);
    free(tasks_copy), sc_free_list(attns, MAX_LIST), sc_free_list(kvs, MAX_LIST);
    return rc;
}
