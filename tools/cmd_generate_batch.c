/*
 * cmd_generate_batch.c: `minference generate --prompts FILE.jsonl`. Every line is a JSON object
 * with "prompt" (text) and optionally "max_new_tokens" and "id" (echoed). The prompts run in
 * sessions, up to --batch of them in one forward pass: each step is one mi_session_prefill_batch
 * call in which the sessions already running append their last token and the ones just admitted
 * their whole prompt (continuous batching: a finished prompt's place goes to the next one at
 * the next step). Each prompt samples with its own sampler of the same seed, so its text is the
 * one `minference generate --prompt` gives it alone (greedy: the same tokens up to float
 * rounding of the stacked matmuls). Results are printed in the file's order, one JSON line each.
 */
#define _POSIX_C_SOURCE 200809L
#include "generate_batch.h"
#include "minference.h"
#include "minference_session.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tool_util.h"

typedef struct job {
    json_t *line; /* the parsed object (its "id" is echoed) */
    int line_no, max_new;
    int32_t *tok;
    size_t n_tok;
    mi_session *s;
    mi_sampler *smp;
    tool_buf text;
    int n_gen;
    int32_t feed; /* the token the next step appends (once started) */
    bool started, done, eog;
} job;

/* The whole input: a file, or stdin for "-". */
static char *read_input(const char *path, size_t *len, const char **why) {
    if (strcmp(path, "-") != 0) return tool_read_file(path, len, why);
    tool_buf b = {0};
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, stdin)) > 0) tool_buf_addn(&b, chunk, n);
    if (b.oom || ferror(stdin)) {
        *why = b.oom ? "out of memory" : "read error";
        free(b.s);
        return NULL;
    }
    *len = b.n;
    if (!b.s) b.s = calloc(1, 1);
    return b.s;
}

/* text with every invalid UTF-8 sequence replaced by U+FFFD (a token may end inside a
 * character; JSON strings must be valid UTF-8). */
static void utf8_clean(const char *s, size_t n, tool_buf *out) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        const unsigned c = p[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = len > 0 && i + len <= n && !(len == 2 && c < 0xC2) && !(c > 0xF4);
        for (size_t k = 1; ok && k < len; k++) ok = (p[i + k] & 0xC0) == 0x80;
        if (ok && len == 3) {
            const unsigned c1 = p[i + 1];
            ok = !(c == 0xE0 && c1 < 0xA0) && !(c == 0xED && c1 >= 0xA0); /* overlong, surrogate */
        }
        if (ok && len == 4) {
            const unsigned c1 = p[i + 1];
            ok = !(c == 0xF0 && c1 < 0x90) && !(c == 0xF4 && c1 >= 0x90);
        }
        if (ok) {
            tool_buf_addn(out, s + i, len);
            i += len;
        } else {
            tool_buf_addn(out, "\xEF\xBF\xBD", 3);
            i++;
        }
    }
}

static int parse_lines(const generate_batch_opts *o, char *data, size_t len, job **out,
                       int *n_out) {
    int cap = 0, n = 0;
    job *jobs = NULL;
    int line_no = 0;
    for (size_t at = 0; at < len;) {
        char *nl = memchr(data + at, '\n', len - at);
        const size_t end = nl ? (size_t)(nl - data) : len;
        line_no++;
        char *line = data + at;
        size_t ll = end - at;
        at = end + 1;
        if (ll && line[ll - 1] == '\r') ll--;
        size_t k = 0;
        while (k < ll && (line[k] == ' ' || line[k] == '\t')) k++;
        if (k == ll) continue; /* a blank line */
        json_error_t err;
        json_t *obj = json_loadb(line, ll, JSON_REJECT_DUPLICATES, &err);
        const char *why = NULL;
        char whybuf[256];
        json_t *p = obj ? json_object_get(obj, "prompt") : NULL;
        json_t *mn = obj ? json_object_get(obj, "max_new_tokens") : NULL;
        if (!obj)
            snprintf(whybuf, sizeof whybuf, "not JSON: %s (column %d)", err.text, err.column),
                why = whybuf;
        else if (!json_is_object(obj))
            why = "not a JSON object";
        else if (!json_is_string(p))
            why = "no \"prompt\" string";
        else if (json_string_length(p) == 0)
            why = "an empty \"prompt\"";
        else if (mn && !(json_is_integer(mn) && json_integer_value(mn) >= 0 &&
                         json_integer_value(mn) <= (1 << 30)))
            why = "\"max_new_tokens\" is not an integer in [0, 2^30]";
        else if (strlen(json_string_value(p)) != json_string_length(p))
            why = "the \"prompt\" holds a NUL character";
        if (why) {
            fprintf(stderr, "minference generate: %s, line %d: %s\n", o->path, line_no, why);
            json_decref(obj);
            goto fail;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            job *nj = realloc(jobs, (size_t)cap * sizeof(*nj));
            if (!nj) {
                json_decref(obj);
                fprintf(stderr, "minference generate: out of memory\n");
                goto fail;
            }
            jobs = nj;
        }
        memset(&jobs[n], 0, sizeof(jobs[n]));
        jobs[n].line = obj;
        jobs[n].line_no = line_no;
        jobs[n].max_new = mn ? (int)json_integer_value(mn) : o->max_new;
        n++;
    }
    *out = jobs;
    *n_out = n;
    return 0;
fail:
    for (int i = 0; i < n; i++) json_decref(jobs[i].line);
    free(jobs);
    return 1;
}

/* The prompt's tokens (chat-wrapped with --chat). */
static int tokenize_job(const generate_batch_opts *o, const mi_model_info *info, job *j) {
    const char *prompt = json_string_value(json_object_get(j->line, "prompt"));
    char *chat_text = NULL;
    const char *text = prompt;
    int add_bos = -1;
    if (o->chat) {
        if (mi_model_chat_prompt(o->model, o->tmpl, o->system, prompt, &chat_text) !=
            MI_STATUS_SUCCESS) {
            fprintf(stderr, "minference generate: no chat template fits this model\n");
            return 1;
        }
        text = chat_text;
        if (strncmp(text, "<|begin_of_text|>", 17) == 0) add_bos = 0;
    }
    size_t n = 0;
    mi_model_tokenize(o->model, text, strlen(text), add_bos, 1, NULL, 0, &n);
    j->tok = malloc((n ? n : 1) * sizeof(int32_t));
    mi_status st =
        j->tok ? mi_model_tokenize(o->model, text, strlen(text), add_bos, 1, j->tok, n, &j->n_tok)
               : MI_STATUS_OUT_OF_MEMORY;
    free(chat_text);
    if (st != MI_STATUS_SUCCESS || j->n_tok == 0) {
        fprintf(stderr, "minference generate: %s, line %d: %s\n", o->path, j->line_no,
                st == MI_STATUS_OUT_OF_MEMORY ? "out of memory" : "the prompt has no tokens");
        return 1;
    }
    if (!o->long_context && info->context_length > 0 &&
        (long long)j->n_tok > (long long)info->context_length) {
        fprintf(stderr,
                "minference generate: %s, line %d: %zu prompt tokens exceed the model's context "
                "of %lld (--allow-long-context runs them anyway)\n",
                o->path, j->line_no, j->n_tok, (long long)info->context_length);
        return 1;
    }
    return 0;
}

typedef struct step_stats {
    double decode_s; /* calls of decode rows only */
    long long decode_rows, calls, splits;
} step_stats;

/* One step for k sessions: a prompt for the ones not started, their last token for the others;
 * logits [k, vocab]. Out of memory with k > 1 runs the two halves one after the other (a failed
 * batch changes no session, so nothing is redone twice). */
static mi_status run_step(job **act, int k, float *logits, int32_t vocab, step_stats *ss) {
    mi_session **sess = malloc((size_t)k * sizeof(*sess));
    const int32_t **tp = malloc((size_t)k * sizeof(*tp));
    size_t *np = malloc((size_t)k * sizeof(*np));
    if (!sess || !tp || !np) {
        free(sess), free(tp), free(np);
        return MI_STATUS_OUT_OF_MEMORY;
    }
    bool decode_only = true;
    for (int i = 0; i < k; i++) {
        sess[i] = act[i]->s;
        tp[i] = act[i]->started ? &act[i]->feed : act[i]->tok;
        np[i] = act[i]->started ? 1 : act[i]->n_tok;
        decode_only = decode_only && act[i]->started;
    }
    const double t0 = tool_now_s();
    mi_status st = mi_session_prefill_batch(sess, tp, np, (size_t)k, logits);
    ss->calls++;
    free(sess), free(tp), free(np);
    if (st == MI_STATUS_SUCCESS && decode_only) {
        ss->decode_s += tool_now_s() - t0;
        ss->decode_rows += k;
    }
    /* out of memory: halves; a model that runs no batches (CUDA): down to single calls */
    if ((st == MI_STATUS_OUT_OF_MEMORY || st == MI_STATUS_UNSUPPORTED) && k > 1) {
        ss->splits++;
        const int h = k / 2;
        st = run_step(act, h, logits, vocab, ss);
        if (st == MI_STATUS_SUCCESS)
            st = run_step(act + h, k - h, logits + (size_t)h * vocab, vocab, ss);
    }
    return st;
}

static void print_job(const job *j, int index) {
    json_t *o = json_object();
    json_t *id = json_object_get(j->line, "id");
    if (id) json_object_set(o, "id", id);
    json_object_set_new(o, "index", json_integer(index));
    tool_buf clean = {0};
    utf8_clean(j->text.s ? j->text.s : "", j->text.n, &clean);
    json_object_set_new(o, "text", json_stringn(clean.s ? clean.s : "", clean.n));
    json_object_set_new(o, "prompt_tokens", json_integer((json_int_t)j->n_tok));
    json_object_set_new(o, "generated_tokens", json_integer(j->n_gen));
    json_object_set_new(o, "stop", json_string(j->eog ? "eog" : "length"));
    char *s = json_dumps(o, JSON_COMPACT);
    if (s) {
        fputs(s, stdout);
        fputc('\n', stdout);
        fflush(stdout);
        free(s);
    }
    free(clean.s);
    json_decref(o);
}

int mi_generate_batch(const generate_batch_opts *o) {
    size_t len = 0;
    const char *why = NULL;
    char *data = read_input(o->path, &len, &why);
    if (!data) {
        fprintf(stderr, "minference generate: cannot read %s: %s\n", o->path, why);
        return 1;
    }
    job *jobs = NULL;
    int n = 0;
    int rc = parse_lines(o, data, len, &jobs, &n);
    free(data);
    if (rc) return 1;
    if (n == 0) {
        fprintf(stderr, "minference generate: %s holds no prompt\n", o->path);
        free(jobs);
        return 1;
    }
    mi_model_info info;
    mi_model_get_info(o->model, &info);
    const int32_t V = info.vocab;
    rc = 1;
    job **act = calloc((size_t)n, sizeof(*act));
    float *logits = malloc((size_t)(o->batch < n ? o->batch : n) * (size_t)V * sizeof(float));
    long long prompt_tokens = 0, generated = 0;
    step_stats ss = {0};
    if (!act || !logits) {
        fprintf(stderr, "minference generate: out of memory\n");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        if (tokenize_job(o, &info, &jobs[i])) goto done;
        prompt_tokens += (long long)jobs[i].n_tok;
    }
    mi_session_params sp = mi_session_default_params();
    sp.kv = o->kv;
    sp.kv_dtype = o->kv_dtype;
    const double t0 = tool_now_s();
    int next = 0, printed = 0, n_act = 0, limit = o->batch;
    char piece[256];
    while (printed < n) {
        while (n_act < limit && next < n) {
            job *j = &jobs[next++];
            if (j->max_new == 0) {
                j->done = true;
                continue;
            }
            if (mi_session_create(o->model, &sp, &j->s) != MI_STATUS_SUCCESS ||
                mi_sampler_create(o->temperature, o->top_k, o->top_p, o->seed, V, &j->smp) !=
                    MI_STATUS_SUCCESS) {
                fprintf(stderr, "minference generate: line %d: %s\n", j->line_no,
                        mi_model_last_error(o->model));
                goto done;
            }
            act[n_act++] = j;
        }
        if (n_act > 0) {
            const long long splits = ss.splits;
            mi_status st = run_step(act, n_act, logits, V, &ss);
            if (st != MI_STATUS_SUCCESS) {
                fprintf(stderr, "minference generate: %s\n",
                        st == MI_STATUS_OUT_OF_MEMORY && !mi_session_last_error(act[0]->s)[0]
                            ? "out of memory"
                            : mi_session_last_error(act[0]->s));
                goto done;
            }
            /* out of memory split the step: admit fewer prompts from now on */
            if (ss.splits > splits && limit > 1) limit = n_act / 2 > 1 ? n_act / 2 : 1;
            int kept = 0;
            for (int i = 0; i < n_act; i++) {
                job *j = act[i];
                j->started = true;
                const int32_t t = mi_sampler_sample(j->smp, logits + (size_t)i * V, V);
                if (t < 0) {
                    fprintf(stderr,
                            "minference generate: line %d: the model produced NaN or infinite "
                            "logits\n",
                            j->line_no);
                    goto done;
                }
                if (mi_model_token_is_eog(o->model, t)) {
                    j->eog = j->done = true;
                } else {
                    size_t pl = 0;
                    if (!mi_model_token_is_control(o->model, t) &&
                        mi_model_token_to_piece(o->model, t, piece, sizeof piece, &pl) ==
                            MI_STATUS_SUCCESS)
                        tool_buf_addn(&j->text, piece, pl < sizeof piece ? pl : sizeof piece);
                    j->n_gen++;
                    generated++;
                    j->feed = t;
                    j->done = j->n_gen >= j->max_new;
                }
                if (j->done) {
                    mi_session_destroy(j->s);
                    j->s = NULL;
                } else {
                    act[kept++] = j;
                }
            }
            n_act = kept;
        }
        for (; printed < n && jobs[printed].done; printed++) print_job(&jobs[printed], printed);
    }
    const double total = tool_now_s() - t0;
    if (!o->quiet)
        fprintf(stderr,
                "prompts: %d, prompt tokens: %lld, generated tokens: %lld, batch %d\n"
                "total: %.3f s (%.1f generated tokens/s), %lld forward passes\n"
                "decode: %.1f tokens/s over %lld tokens of decode-only passes\n",
                n, prompt_tokens, generated, o->batch, total,
                total > 0 ? (double)generated / total : 0.0, ss.calls,
                ss.decode_s > 0 ? (double)ss.decode_rows / ss.decode_s : 0.0, ss.decode_rows);
    rc = 0;
done:
    for (int i = 0; i < n; i++) {
        mi_session_destroy(jobs[i].s);
        mi_sampler_destroy(jobs[i].smp);
        free(jobs[i].tok);
        free(jobs[i].text.s);
        json_decref(jobs[i].line);
    }
    free(jobs);
    free(act);
    free(logits);
    return rc;
}
