/*
 * cmd_scbench_prompt.c: the prompts of an SCBench example, as the original harness lays them
 * out (docs/scbench.md). Multi-turn: the first prompt is the task's template around the context
 * and the first question; each later one carries the previous turn's reference answer (the
 * "golden" history) and the next question. Multi-request: the context alone, then each query on
 * its own. With a chat template, the first prompt is one user message, and a later one closes
 * the assistant turn holding the previous answer and opens the next user message.
 */
#define _POSIX_C_SOURCE 200809L
#include "cmd_scbench.h"
#include "tool_util.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef tool_buf pbuf;

static void pb_add(pbuf *b, const char *s) { tool_buf_addn(b, s, strlen(s)); }

static char *pb_take(pbuf *b) {
    if (b->oom) {
        free(b->s);
        return NULL;
    }
    if (!b->s) return strdup("");
    return b->s;
}

/* Python's repr() of a string. */
static void py_repr_str(pbuf *b, const char *s) {
    const char q = strchr(s, '\'') && !strchr(s, '"') ? '"' : '\'';
    char c1[2] = {q, 0};
    pb_add(b, c1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char t[8];
        if (*p == '\\')
            pb_add(b, "\\\\");
        else if (*p == (unsigned char)q)
            snprintf(t, sizeof t, "\\%c", q), pb_add(b, t);
        else if (*p == '\n')
            pb_add(b, "\\n");
        else if (*p == '\t')
            pb_add(b, "\\t");
        else if (*p == '\r')
            pb_add(b, "\\r");
        else if (*p < 0x20 || *p == 0x7F)
            snprintf(t, sizeof t, "\\x%02x", *p), pb_add(b, t);
        else {
            t[0] = (char)*p, t[1] = 0;
            pb_add(b, t);
        }
    }
    pb_add(b, c1);
}

static void py_value(pbuf *b, const json_t *v, bool top);

static void py_number(pbuf *b, const json_t *v) {
    char t[64];
    if (json_is_integer(v))
        snprintf(t, sizeof t, "%lld", (long long)json_integer_value(v));
    else {
        const double d = json_real_value(v);
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(t, sizeof t, "%.*g", prec, d);
            if (strtod(t, NULL) == d) break;
        }
        if (!strpbrk(t, ".en")) strncat(t, ".0", sizeof t - strlen(t) - 1);
    }
    pb_add(b, t);
}

/* Python's str() of a JSON value (top) or repr() of an element. */
static void py_value(pbuf *b, const json_t *v, bool top) {
    if (json_is_string(v)) {
        if (top)
            pb_add(b, json_string_value(v));
        else
            py_repr_str(b, json_string_value(v));
    } else if (json_is_number(v))
        py_number(b, v);
    else if (json_is_array(v)) {
        pb_add(b, "[");
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) pb_add(b, ", ");
            py_value(b, json_array_get(v, i), false);
        }
        pb_add(b, "]");
    } else if (json_is_true(v))
        pb_add(b, "True");
    else if (json_is_false(v))
        pb_add(b, "False");
    else
        pb_add(b, "None");
}

static const char *str_field(const json_t *o, const char *k) {
    const json_t *v = json_object_get(o, k);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* Math find's "What is {target}?": target is the lower-cased text from the first "The " to the
 * last " is" on that line. */
static char *mf_prefix(const char *input) {
    for (const char *p = strstr(input, "The "); p; p = strstr(p + 1, "The ")) {
        const char *eol = strchr(p, '\n');
        if (!eol) eol = p + strlen(p);
        const char *last = NULL;
        for (const char *q = p + 5; q + 3 <= eol; q++)
            if (!strncmp(q, " is", 3)) last = q;
        if (!last) continue;
        pbuf b = {0};
        pb_add(&b, "What is ");
        char *t = malloc((size_t)(last - p) + 1);
        if (!t) return free(b.s), NULL;
        for (size_t i = 0; i < (size_t)(last - p); i++) t[i] = (char)tolower((unsigned char)p[i]);
        t[last - p] = 0;
        pb_add(&b, t);
        free(t);
        pb_add(&b, "?");
        return pb_take(&b);
    }
    return NULL;
}

/* The question text of a choice turn with its options. */
static bool add_choice(pbuf *b, const json_t *turn) {
    const json_t *o = json_object_get(turn, "options");
    if (json_array_size(o) < 4) return false;
    pb_add(b, "Question: ");
    pb_add(b, str_field(turn, "input"));
    for (int i = 0; i < 4; i++) {
        char l[8];
        snprintf(l, sizeof l, "\n%c. ", 'A' + i);
        pb_add(b, l);
        pbuf v = {0};
        py_value(&v, json_array_get(o, (size_t)i), true);
        pb_add(b, v.s ? v.s : "");
        free(v.s);
    }
    return true;
}

/* The user text of one turn as the chat templates and the multi-request queries write it (the
 * original's "in chat template" follow-up): choice, QA and math find carry a frame. */
static char *turn_text(const char *task, const json_t *turn, const char *choice_tail) {
    pbuf b = {0};
    const char *in = str_field(turn, "input");
    if (!strcmp(task, "scbench_choice_eng")) {
        if (!add_choice(&b, turn)) return free(b.s), NULL;
        pb_add(&b, "\n\n");
        pb_add(&b, choice_tail);
    } else if (!strcmp(task, "scbench_qa_eng")) {
        pb_add(&b, "Question: ");
        pb_add(&b, in);
        pb_add(&b, "\nAnswer:");
    } else if (!strcmp(task, "scbench_qa_chn")) {
        pb_add(&b, "问题：");
        pb_add(&b, in);
        pb_add(&b, "\n答案：");
    } else if (!strcmp(task, "scbench_mf")) {
        char *pre = mf_prefix(in);
        if (!pre) return free(b.s), NULL;
        pb_add(&b, pre);
        pb_add(&b, "\n\n");
        pb_add(&b, in);
        free(pre);
    } else {
        pb_add(&b, in);
    }
    return pb_take(&b);
}

/* The instruction that opens the context, per task. */
static const char *context_head(const char *task) {
    if (!strcmp(task, "scbench_kv") || !strcmp(task, "scbench_kv_hard"))
        return "Extract the value corresponding to the specified key in the JSON object "
               "below.\n\n";
    if (!strcmp(task, "scbench_kv_compressible"))
        return "Extract the value corresponding to the specified key in the following "
               "passage.\n\n";
    if (!strcmp(task, "scbench_passkey"))
        return "There is an important info hidden inside a lot of irrelevant text. Find it and "
               "memorize it. I will quiz you about the important information.\n\n";
    if (!strcmp(task, "scbench_choice_eng")) return "Read the book and answer the question.\n\n";
    if (!strcmp(task, "scbench_qa_eng"))
        return "Read the book and answer the question. Be very concise in your answer.\n\n";
    if (!strcmp(task, "scbench_qa_chn")) return "阅读以下书籍然后回答问题。\n\n";
    if (!strcmp(task, "scbench_repoqa"))
        return "Based on the function description and code context, please retrieve and repeat "
               "the exact described function from the code context in a code block wrapped by "
               "```:\n\n";
    return "";
}

void sc_free_prompts(char **prompts, int n) {
    for (int i = 0; prompts && i < n; i++) free(prompts[i]);
    free(prompts);
}

char *sc_turn_prompt_answered(const char *task, const json_t *example, const sc_chat_fmt *chat,
                              int i, const char *answer, int max_turns) {
    if (i < 1) return NULL;
    json_t *copy = json_deep_copy(example);
    json_t *prev = json_array_get(json_object_get(copy, "multi_turns"), (size_t)i - 1);
    char *out = NULL;
    if (prev && json_object_set_new(prev, "answer", json_string(answer ? answer : "")) == 0) {
        int np = 0;
        const char *why = NULL;
        char **p = sc_build_prompts(task, copy, false, chat, max_turns, &np, &why);
        if (p && i < np) {
            out = p[i];
            p[i] = NULL;
        }
        sc_free_prompts(p, np);
    }
    json_decref(copy);
    return out;
}

char **sc_build_prompts(const char *task, const json_t *example, bool multi_request,
                        const sc_chat_fmt *chat, int max_turns, int *n, const char **why) {
    *n = 0;
    *why = NULL;
    const char *context = str_field(example, "context");
    if (!context) context = str_field(example, "input");
    const json_t *turns = json_object_get(example, "multi_turns");
    int nt = (int)json_array_size(turns);
    if (max_turns > 0 && nt > max_turns) nt = max_turns;
    if (!task || !context || nt < 1) return *why = "an example needs a context and turns", NULL;
    for (int i = 0; i < nt; i++)
        if (!str_field(json_array_get(turns, (size_t)i), "input"))
            return *why = "a turn without an \"input\" string", NULL;
    if (chat && (!chat->prefix || !chat->between || !chat->tail)) chat = NULL;
    char **out = calloc((size_t)nt + 1, sizeof *out);
    if (!out) return *why = "out of memory", NULL;
    const json_t *t0 = json_array_get(turns, 0);
    const bool is_mf = !strcmp(task, "scbench_mf");
    bool ok = true;

    if (multi_request) {
        pbuf b = {0};
        if (chat) pb_add(&b, chat->prefix);
        if (is_mf) {
            pb_add(&b, str_field(t0, "input"));
            pb_add(&b, "\n\n");
        } else {
            pb_add(&b, context_head(task));
        }
        pb_add(&b, context);
        out[0] = pb_take(&b);
        ok = out[0] != NULL;
        for (int i = 0; ok && i < nt; i++) {
            char *q =
                turn_text(task, json_array_get(turns, (size_t)i), "The the correct answer is");
            if (!q) {
                ok = false;
                break;
            }
            pbuf qb = {0};
            if (chat) {
                pb_add(&qb, q);
                pb_add(&qb, chat->tail);
            } else {
                pb_add(&qb, q);
            }
            free(q);
            out[i + 1] = pb_take(&qb);
            ok = out[i + 1] != NULL;
        }
        *n = ok ? nt + 1 : 0;
    } else {
        /* first turn: the whole template */
        pbuf b = {0};
        char *first = turn_text(task, t0, "The the correct answer is");
        if (!first) ok = false;
        if (ok) {
            if (chat) pb_add(&b, chat->prefix);
            if (is_mf) {
                /* "{prefix}\n\n{context}\n\n{input}" */
                char *pre = mf_prefix(str_field(t0, "input"));
                if (!pre)
                    ok = false;
                else {
                    pb_add(&b, pre);
                    pb_add(&b, "\n\n");
                    pb_add(&b, context);
                    pb_add(&b, "\n\n");
                    pb_add(&b, str_field(t0, "input"));
                    free(pre);
                }
            } else {
                pb_add(&b, context_head(task));
                pb_add(&b, context);
                pb_add(&b, "\n\n");
                pb_add(&b, first);
            }
            if (chat) pb_add(&b, chat->tail);
        }
        free(first);
        out[0] = ok ? pb_take(&b) : (free(b.s), NULL);
        ok = ok && out[0];
        for (int i = 1; ok && i < nt; i++) {
            const json_t *prev = json_array_get(turns, (size_t)i - 1);
            const json_t *cur = json_array_get(turns, (size_t)i);
            pbuf fb = {0};
            pbuf ans = {0};
            py_value(&ans, json_object_get(prev, "answer"), true);
            if (chat) {
                char *q = turn_text(task, cur, "The the correct answer is");
                if (!q) {
                    free(ans.s), free(fb.s);
                    ok = false;
                    break;
                }
                pb_add(&fb, ans.s ? ans.s : "");
                pb_add(&fb, chat->between);
                pb_add(&fb, q);
                pb_add(&fb, chat->tail);
                if (!strcmp(task, "scbench_summary")) pb_add(&fb, "This paper");
                free(q);
            } else {
                /* "{pre_ans}\n\n..." (the pass key task puts a full stop after the answer) */
                pb_add(&fb, ans.s ? ans.s : "");
                pb_add(&fb, !strcmp(task, "scbench_passkey") ? ".\n\n" : "\n\n");
                char *q = turn_text(task, cur, "The letter of the correct answer is");
                if (!q) {
                    free(ans.s), free(fb.s);
                    ok = false;
                    break;
                }
                pb_add(&fb, q);
                free(q);
            }
            free(ans.s);
            out[i] = pb_take(&fb);
            ok = out[i] != NULL;
        }
        *n = ok ? nt : 0;
    }
    if (!ok) {
        sc_free_prompts(out, nt + 1);
        return *why = "a turn lacks what its task's template needs (options, \"The ... is\")", NULL;
    }
    return out;
}
