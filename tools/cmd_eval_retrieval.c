/*
 * cmd_eval_retrieval.c: the retrieval tasks of `minference eval`: passkey, niah and kv-retrieval.
 * Every (length, depth, sample) prompt is built once and answered by every method (a sparse
 * prefill, then greedy dense decoding), so the methods see identical inputs.
 */
#define _POSIX_C_SOURCE 200809L
#include "minference.h"
#include "minference_model.h"
#include "minference_session.h"
#include "minference_tools.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_eval.h"
#include "tool_util.h"

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The byte length of the first n_tok tokens of tokens[] (pieces concatenate to the text). */
static size_t token_bytes(mi_model *model, const int32_t *tokens, size_t n_tok) {
    size_t bytes = 0;
    for (size_t i = 0; i < n_tok; i++) {
        char buf[256];
        size_t l = 0;
        if (mi_model_token_to_piece(model, tokens[i], buf, sizeof buf, &l) == MI_STATUS_SUCCESS)
            bytes += l;
    }
    return bytes;
}

/* Greedy answer after a sparse prefill of the prompt; *out malloc'ed. */
static mi_status answer(eval_state *e, const int32_t *tokens, size_t n, int max_new, char **out,
                        double *prefill_s) {
    float *logits = malloc((size_t)e->info.vocab * sizeof(float));
    size_t cap = 1024, len = 0;
    char *text = malloc(cap);
    if (!logits || !text) {
        free(logits);
        free(text);
        return MI_STATUS_OUT_OF_MEMORY;
    }
    text[0] = '\0';
    /* with --kv the prompt runs in a session with the method's cache */
    mi_session *sess = NULL;
    mi_status st = MI_STATUS_SUCCESS;
    if (e->kv) {
        mi_session_params sp = mi_session_default_params();
        sp.kv = e->kv;
        st = mi_session_create(e->model, &sp, &sess);
    }
    double t0 = tool_now_s();
    if (st == MI_STATUS_SUCCESS)
        st = sess ? mi_session_prefill(sess, tokens, n, logits)
                  : mi_model_prefill(e->model, tokens, n, logits);
    *prefill_s = tool_now_s() - t0;
    for (int i = 0; i < max_new && st == MI_STATUS_SUCCESS; i++) {
        int32_t tok = mi_argmax(logits, e->info.vocab);
        if (mi_model_token_is_eog(e->model, tok)) break;
        char piece[256];
        size_t pl = 0;
        if (!mi_model_token_is_control(e->model, tok) &&
            mi_model_token_to_piece(e->model, tok, piece, sizeof piece, &pl) == MI_STATUS_SUCCESS) {
            if (pl > sizeof piece) pl = sizeof piece;
            if (len + pl + 1 < cap) {
                memcpy(text + len, piece, pl);
                len += pl;
                text[len] = '\0';
            }
        }
        /* One line answers: a newline after some text ends the answer. */
        if (len > 0 && strchr(text, '\n') && strspn(text, " \n") < len) break;
        st = sess ? mi_session_decode(sess, &tok, 1, logits)
                  : mi_model_decode(e->model, &tok, 1, logits);
    }
    if (sess && st != MI_STATUS_SUCCESS) /* the message goes where the caller looks */
        fprintf(stderr, "minference eval: kv %s: %s\n", e->kv, mi_session_last_error(sess));
    mi_session_destroy(sess);
    free(logits);
    if (st != MI_STATUS_SUCCESS) {
        free(text);
        return st;
    }
    *out = text;
    return MI_STATUS_SUCCESS;
}

static const char *cities[] = {"Chicago", "Yangon",  "Antananarivo", "Colombo", "Almaty",
                               "Sydney",  "Lisbon",  "Montevideo",   "Dakar",   "Helsinki",
                               "Lima",    "Tbilisi", "Nairobi",      "Oslo",    "Hanoi"};
static const char *words[] = {"apple", "river",  "candle", "forest", "marble",  "violin",
                              "tiger", "harbor", "pepper", "saddle", "lantern", "meadow"};

typedef struct prompt {
    char *text;
    char answer[32];
    char distract[4][32];
    int n_distract;
} prompt;

/* The task's own text of one prompt: the answer and distractors in p, the needles, the prefix
 * and the question. extra[] (the distractor needles) are malloc'ed. */
typedef struct task_text {
    char needle[512], prefix[512], question[512];
    char *extra[3];
} task_text;

/* A pass key in repeated filler (InfiniteBench / LongLLaMA); the first integer must equal it. */
static bool passkey_text(uint64_t *rng, prompt *p, task_text *t) {
    snprintf(p->answer, sizeof p->answer, "%05llu",
             (unsigned long long)(rng_next(rng) % 90000 + 10000));
    snprintf(t->prefix, sizeof t->prefix,
             "There is an important info hidden inside a lot of irrelevant text. Find it and "
             "memorize it. I will quiz you about the important information there.\n\n");
    snprintf(t->needle, sizeof t->needle, "The pass key is %s. Remember it. %s is the pass key.",
             p->answer, p->answer);
    snprintf(t->question, sizeof t->question, "\n\nWhat is the pass key? The pass key is");
    return true;
}

/* "The special magic {city} number is: N." in real text; N's digits must appear. */
static bool niah_text(uint64_t *rng, prompt *p, task_text *t) {
    const char *city = cities[rng_next(rng) % (sizeof cities / sizeof cities[0])];
    snprintf(p->answer, sizeof p->answer, "%07llu",
             (unsigned long long)(rng_next(rng) % 9000000 + 1000000));
    snprintf(t->prefix, sizeof t->prefix,
             "Write a high-quality answer for the given question using only the provided "
             "search results (some of which might be irrelevant).\n");
    snprintf(t->needle, sizeof t->needle, "The special magic %s number is: %s.", city, p->answer);
    snprintf(t->question, sizeof t->question,
             "\n\nQuestion: What is the special magic %s number? Don't give information "
             "outside the document or repeat your findings. Keep your response short and "
             "direct. Answer: The special magic %s number is:",
             city, city);
    return true;
}

/* Four keyed needles in filler (RULER niah_multikey_1); the asked value must appear, the other
 * keys' values must not. */
static bool kv_text(uint64_t *rng, prompt *p, task_text *t) {
    const size_t nw = sizeof words / sizeof words[0];
    size_t pick[4];
    for (int i = 0; i < 4; i++) {
        bool dup;
        do {
            pick[i] = rng_next(rng) % nw;
            dup = false;
            for (int j = 0; j < i; j++) dup = dup || pick[j] == pick[i];
        } while (dup);
    }
    snprintf(p->answer, sizeof p->answer, "%07llu",
             (unsigned long long)(rng_next(rng) % 9000000 + 1000000));
    snprintf(t->prefix, sizeof t->prefix,
             "Some special magic numbers are hidden within the following text. Make sure to "
             "memorize them. I will quiz you about the numbers afterwards.\n");
    snprintf(t->needle, sizeof t->needle, "One of the special magic numbers for %s is: %s.",
             words[pick[0]], p->answer);
    for (int i = 0; i < 3; i++) {
        snprintf(p->distract[i], sizeof p->distract[i], "%07llu",
                 (unsigned long long)(rng_next(rng) % 9000000 + 1000000));
        char buf[256];
        snprintf(buf, sizeof buf, "One of the special magic numbers for %s is: %s.",
                 words[pick[i + 1]], p->distract[i]);
        t->extra[i] = strdup(buf);
        if (!t->extra[i]) return false;
    }
    p->n_distract = 3;
    snprintf(t->question, sizeof t->question,
             "\n\nWhat is the special magic number for %s mentioned in the provided text? "
             "The special magic number for %s mentioned in the provided text is",
             words[pick[0]], words[pick[0]]);
    return true;
}

static int passkey_score(const prompt *p, const char *out) {
    int match = 0;
    mi_eval_passkey_match(out, p->answer, &match);
    return match;
}

static int niah_score(const prompt *p, const char *out) {
    int match = 0;
    mi_eval_needle_match(out, p->answer, &match);
    return match;
}

static int kv_score(const prompt *p, const char *out) {
    int match = 0;
    const char *d[4];
    for (int i = 0; i < p->n_distract; i++) d[i] = p->distract[i];
    mi_eval_kv_match(out, p->answer, d, p->n_distract, &match);
    return match;
}

typedef struct retrieval_task {
    const char *name;
    int max_new; /* tokens of the answer */
    bool (*text)(uint64_t *rng, prompt *p, task_text *t);
    int (*score)(const prompt *p, const char *out);
} retrieval_task;

static const retrieval_task retrieval_tasks[] = {
    {"passkey", 10, passkey_text, passkey_score},
    {"niah", 16, niah_text, niah_score},
    {"kv-retrieval", 16, kv_text, kv_score},
};

/* Builds the prompt of one (task, length, depth, sample): prefix + haystack (cut to fill the
 * length) with needle(s) + question. */
static bool build_prompt(eval_state *e, const retrieval_task *task, const char *hay, size_t hay_len,
                         const int32_t *hay_tok, size_t hay_ntok, long long length, double depth,
                         uint64_t *rng, prompt *p) {
    memset(p, 0, sizeof *p);
    task_text tt;
    memset(&tt, 0, sizeof tt);
    char *const *extra = tt.extra;
    const char *needle = tt.needle, *prefix = tt.prefix, *question = tt.question;
    if (!task->text(rng, p, &tt)) goto fail;
    size_t n1, n2, n3;
    int32_t *t1 = eval_tokenize(e->model, prefix, strlen(prefix), 1, &n1);
    int32_t *t2 = eval_tokenize(e->model, question, strlen(question), 0, &n2);
    int32_t *t3 = eval_tokenize(e->model, needle, strlen(needle), 0, &n3);
    free(t1);
    free(t2);
    free(t3);
    if (!t1 || !t2 || !t3) goto fail;
    long long budget = length - (long long)(n1 + n2 + n3 * (size_t)(1 + p->n_distract)) - 4;
    if (budget < 16) budget = 16;
    if ((size_t)budget > hay_ntok) budget = (long long)hay_ntok;
    size_t cut = token_bytes(e->model, hay_tok, (size_t)budget);
    if (cut > hay_len) cut = hay_len;
    /* Distractor needles first at their own random depths, then the asked one at depth%. */
    char *cur = malloc(cut + 1);
    if (!cur) goto fail;
    memcpy(cur, hay, cut);
    cur[cut] = '\0';
    size_t cur_len = cut;
    for (int i = 0; i < p->n_distract; i++) {
        char *next = NULL;
        double d = (double)(rng_next(rng) % 1000) / 10.0;
        if (mi_eval_insert_needle(cur, cur_len, extra[i], d, &next, NULL) != MI_STATUS_SUCCESS) {
            free(cur);
            goto fail;
        }
        free(cur);
        cur = next;
        cur_len = strlen(cur);
    }
    char *with = NULL;
    if (mi_eval_insert_needle(cur, cur_len, needle, depth, &with, NULL) != MI_STATUS_SUCCESS) {
        free(cur);
        goto fail;
    }
    free(cur);
    size_t total = strlen(prefix) + strlen(with) + strlen(question) + 1;
    p->text = malloc(total);
    if (!p->text) {
        mi_free(with);
        goto fail;
    }
    snprintf(p->text, total, "%s%s%s", prefix, with, question);
    mi_free(with);
    for (int i = 0; i < 3; i++) free(extra[i]);
    return true;
fail:
    for (int i = 0; i < 3; i++) free(extra[i]);
    return false;
}

/* One (length, depth, sample) prompt, answered by every method. */
static bool run_prompt(eval_state *e, const retrieval_task *task, const char *hay, size_t hay_len,
                       const int32_t *hay_tok, size_t hay_ntok, int li, int di, int s,
                       uint64_t *rng) {
    const int nl = e->nl, nd = e->nd, samples = e->samples;
    prompt p;
    if (!build_prompt(e, task, hay, hay_len, hay_tok, hay_ntok, e->lengths[li],
                      (double)e->depths[di], rng, &p)) {
        fprintf(stderr, "minference eval: cannot build a prompt\n");
        return false;
    }
    size_t n = 0;
    int32_t *tok = eval_tokenize(e->model, p.text, strlen(p.text), 1, &n);
    free(p.text);
    if (!tok) {
        fprintf(stderr, "minference eval: tokenizer failed\n");
        return false;
    }
    for (int m = 0; m < e->nm; m++) {
        const method *me = &e->methods[m];
        char *ans = NULL;
        double secs = 0;
        mi_status st = eval_use_method(e, me);
        if (st == MI_STATUS_SUCCESS) st = answer(e, tok, n, task->max_new, &ans, &secs);
        if (st != MI_STATUS_SUCCESS) {
            fprintf(stderr, "minference eval: %s: %s\n", me->name, mi_model_last_error(e->model));
            free(tok);
            return false;
        }
        const int ok = task->score(&p, ans);
        const size_t cell = ((size_t)m * nl + li) * nd + di;
        e->grid[cell] += (double)ok / samples;
        e->aux[cell] += secs / samples;
        char *nl_at = strchr(ans, '\n');
        if (!e->quiet)
            fprintf(stderr,
                    "%-22s len %6zu depth %3lld%%: %s want %s got \"%.*s\""
                    " (%.1f s)\n",
                    me->name, n, e->depths[di], ok ? "PASS" : "fail", p.answer,
                    nl_at ? (int)(nl_at - ans) : (int)strlen(ans), ans, secs);
        json_array_append_new(e->runs,
                              json_pack("{s:s, s:I, s:I, s:I, s:i, s:s, s:s, s:i, s:f}", "method",
                                        me->name, "length", e->lengths[li], "tokens", (json_int_t)n,
                                        "depth", e->depths[di], "sample", s, "answer", p.answer,
                                        "output", ans, "correct", ok, "prefill_s", secs));
        free(ans);
    }
    free(tok);
    return true;
}

bool eval_retrieval(eval_state *e, const char *task_name) {
    const retrieval_task *task = NULL;
    for (size_t i = 0; i < sizeof retrieval_tasks / sizeof retrieval_tasks[0]; i++)
        if (strcmp(task_name, retrieval_tasks[i].name) == 0) task = &retrieval_tasks[i];
    if (!task) return false;
    /* A haystack with room for the longest prompt, tokenized once; repeated RULER filler for
     * passkey / kv-retrieval (the needle must be the only content), real text for niah. */
    char *hay = NULL;
    size_t hay_len = 0;
    mi_status st = mi_eval_haystack(e->text, e->text ? e->text_len : 0, (size_t)e->max_len * 8,
                                    &hay, &hay_len);
    size_t hay_ntok = 0;
    int32_t *hay_tok =
        st == MI_STATUS_SUCCESS ? eval_tokenize(e->model, hay, hay_len, 0, &hay_ntok) : NULL;
    if (!hay_tok) {
        fprintf(stderr, "minference eval: cannot build the haystack\n");
        mi_free(hay);
        return false;
    }
    bool ok = true;
    uint64_t rng = e->seed;
    const int nl = e->nl, nd = e->nd, samples = e->samples;
    for (int li = 0; li < nl && ok; li++)
        for (int di = 0; di < nd && ok; di++)
            for (int s = 0; s < samples && ok; s++)
                ok = run_prompt(e, task, hay, hay_len, hay_tok, hay_ntok, li, di, s, &rng);
    free(hay_tok);
    mi_free(hay);
    return ok;
}
