/* tool_util.c: helpers shared by the subcommands. */
#include "tool_util.h"

#include "minference_model.h"
#include "minference_tools.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

double tool_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

char *tool_default_model(void) {
    const char *env = getenv("MI_MODEL"); /* the one place the CLI reads it */
    if (env && *env) return strdup(env);
    return mi_model_default_path();
}

char *tool_read_file(const char *path, size_t *len, const char **why) {
    const char *dummy;
    if (!why) why = &dummy;
    if (len) *len = 0;
    /* Only regular files: a FIFO would block forever and /dev/zero would never end. */
    struct stat stt;
    if (stat(path, &stt) != 0) {
        *why = strerror(errno);
        return NULL;
    }
    if (S_ISDIR(stt.st_mode)) {
        *why = "is a directory";
        return NULL;
    }
    if (!S_ISREG(stt.st_mode)) {
        *why = "is not a regular file";
        return NULL;
    }
    if ((uint64_t)stt.st_size > TOOL_MAX_FILE_BYTES) {
        *why = "is larger than 1 GiB";
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        *why = strerror(errno);
        return NULL;
    }
    const size_t size = (size_t)stt.st_size;
    char *buf = malloc(size + 1);
    size_t n = buf ? fread(buf, 1, size, f) : 0;
    const int failed = !buf || ferror(f) || n != size;
    const int err = errno;
    fclose(f);
    if (failed) {
        *why = !buf ? "out of memory" : n != size ? "changed while being read" : strerror(err);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

char *tool_license_text(size_t *len) {
    static const char *files[] = {"GPL-3",    "GFDL-1.3", "Apache-2.0", "MPL-2.0",
                                  "LGPL-2.1", "Artistic", "GPL-2"};
    size_t total = 0;
    char *out = NULL;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[256];
        snprintf(path, sizeof path, "/usr/share/common-licenses/%s", files[i]);
        size_t n = 0;
        char *t = tool_read_file(path, &n, NULL);
        if (!t) continue;
        char *p = realloc(out, total + n + 3);
        if (!p) {
            free(t);
            break;
        }
        out = p;
        memcpy(out + total, t, n);
        total += n;
        out[total++] = '\n';
        out[total++] = '\n';
        out[total] = '\0';
        free(t);
    }
    if (len) *len = total;
    return out;
}

bool tool_write_file(const char *cmd, const char *path, const void *data, size_t n) {
    mi_context *ctx = NULL;
    mi_context_create(NULL, &ctx); /* only for the message: without one the cause is lost */
    const mi_status st = mi_file_write_atomic(ctx, path, data, n);
    if (st != MI_STATUS_SUCCESS)
        fprintf(stderr, "minference %s: cannot write %s: %s\n", cmd, path,
                ctx ? mi_context_last_error(ctx) : mi_status_string(st));
    mi_context_destroy(ctx);
    return st == MI_STATUS_SUCCESS;
}

bool tool_append_file(const char *cmd, const char *path, const void *data, size_t n) {
    size_t old_n = 0;
    const char *why = NULL;
    char *old = tool_read_file(path, &old_n, &why);
    if (!old && access(path, F_OK) == 0) {
        fprintf(stderr, "minference %s: cannot append to %s: it %s\n", cmd, path,
                why ? why : "cannot be read");
        return false;
    }
    char *all = malloc(old_n + n + 1);
    if (!all) {
        free(old);
        fprintf(stderr, "minference %s: out of memory appending to %s\n", cmd, path);
        return false;
    }
    if (old_n) memcpy(all, old, old_n);
    if (n) memcpy(all + old_n, data, n);
    free(old);
    const bool ok = tool_write_file(cmd, path, all, old_n + n);
    free(all);
    return ok;
}

mi_config *tool_load_config(const char *cmd, const char *path) {
    mi_context *ctx = NULL;
    mi_context_create(NULL, &ctx); /* for the loader's message */
    mi_config *config = NULL;
    const mi_status st = mi_config_load(ctx, path, &config);
    if (st != MI_STATUS_SUCCESS)
        fprintf(stderr, "minference %s: cannot load config %s: %s\n", cmd, path,
                ctx ? mi_context_last_error(ctx) : mi_status_string(st));
    mi_context_destroy(ctx);
    return config;
}

const char *tool_config_path(const char *arg, const char *model_path, const char *cmd,
                             char **owned) {
    *owned = NULL;
    if (!arg || strcmp(arg, "auto") != 0) return arg;
    const char *file = model_path ? mi_config_model_file(model_path) : NULL;
    const char *dir = getenv("MI_CONFIG_DIR");
    if (file && dir && *dir) {
        const size_t n = strlen(dir) + strlen(file) + 2;
        char *path = malloc(n);
        struct stat stt;
        if (path) {
            snprintf(path, n, "%s/%s", dir, file);
            if (stat(path, &stt) == 0) return *owned = path;
            free(path);
        }
    }
    if (file) *owned = mi_config_model_path(model_path);
    if (!*owned)
        fprintf(stderr,
                "minference %s: --config auto: %s for %s; every head keeps the default "
                "pattern\n",
                cmd, file ? "the shipped config file is not installed" : "no shipped config",
                model_path ? model_path : "(no model)");
    return *owned;
}

int tool_tri_mix_parse(const char *spec, int *minference, int32_t *start) {
    const char *rest;
    if (!spec) return 0;
    if (strncmp(spec, "tri_mix_minference", 18) == 0) {
        *minference = 1;
        rest = spec + 18;
    } else if (strncmp(spec, "tri_mix", 7) == 0) {
        *minference = 0;
        rest = spec + 7;
    } else {
        return 0;
    }
    *start = 16;
    if (!*rest) return 1;
    if (*rest != ':') return 0; /* another name that starts alike */
    char *end;
    errno = 0;
    const long v = strtol(rest + 1, &end, 10);
    if (end == rest + 1 || *end || errno || v < 0 || v > (1 << 20)) return -1;
    *start = (int32_t)v;
    return 1;
}

int tool_tri_mix_config(int minference, int32_t start, int32_t n_layers, int32_t n_heads,
                        mi_config **config) {
    mi_config *out = NULL;
    mi_head_pattern *lower = malloc((size_t)n_heads * sizeof *lower);
    mi_head_pattern tri = mi_head_pattern_default(MI_PATTERN_TRI_SHAPE);
    tri.n_init = 8;
    tri.n_local = 512;
    tri.n_last = 128;
    if (!lower || mi_config_create(NULL, n_layers, n_heads, &tri, &out) != MI_STATUS_SUCCESS) {
        free(lower);
        return -1;
    }
    int ok = 1;
    for (int32_t l = 0; ok && l < n_layers && l < start; l++) {
        if (minference && *config) {
            ok = mi_config_layer(NULL, *config, l, n_heads, lower, NULL) == MI_STATUS_SUCCESS;
        } else {
            for (int32_t h = 0; h < n_heads; h++)
                lower[h] = mi_head_pattern_default(minference ? MI_PATTERN_VERTICAL_SLASH
                                                              : MI_PATTERN_DENSE);
        }
        for (int32_t h = 0; ok && h < n_heads; h++)
            ok = mi_config_set_head(NULL, out, l, h, &lower[h], NAN) == MI_STATUS_SUCCESS;
    }
    for (int32_t l = start; ok && l < n_layers; l++)
        for (int32_t h = 0; ok && h < n_heads; h++)
            ok = mi_config_set_head(NULL, out, l, h, &tri, NAN) == MI_STATUS_SUCCESS;
    free(lower);
    if (!ok) {
        mi_config_destroy(out);
        return -1;
    }
    mi_config_destroy(*config);
    *config = out;
    return 0;
}

void tool_buf_addn(tool_buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n + 1) c *= 2;
        char *t = realloc(b->s, c);
        if (!t) {
            b->oom = true;
            return;
        }
        b->s = t, b->cap = c;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

mi_model *tool_bench_model(const char *who, const char *path, const mi_model_params *params) {
    mi_context *ectx = NULL; /* receives the loader's message */
    mi_context_create(NULL, &ectx);
    mi_model *model = NULL;
    mi_status st;
    if (!path) {
        mi_model_shape shape = mi_model_shape_llama3_8b();
        st = mi_model_create_random(ectx, &shape, 1, params, &model);
    } else {
        st = mi_model_load(ectx, path, params, &model);
    }
    if (st != MI_STATUS_SUCCESS)
        fprintf(stderr, "%s: cannot load the model: %s\n", who, mi_context_last_error(ectx));
    mi_context_destroy(ectx);
    return model;
}

int32_t *tool_bench_prompt(const char *who, mi_model *text_model, const char *text_path,
                           int64_t n) {
    int32_t *prompt = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    if (!prompt) {
        fprintf(stderr, "%s: out of memory for a prompt of %lld tokens\n", who, (long long)n);
        return NULL;
    }
    if (!text_model) {
        uint64_t s = 12345;
        for (int64_t i = 0; i < n; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            prompt[i] = (int32_t)((s >> 33) % 256); /* byte tokens */
        }
        return prompt;
    }
    size_t text_len = 0, n_text = 0;
    char *text =
        text_path ? tool_read_file(text_path, &text_len, NULL) : tool_license_text(&text_len);
    int32_t *tt = NULL;
    if (text &&
        mi_model_tokenize(text_model, text, text_len, 0, 0, NULL, 0, &n_text) ==
            MI_STATUS_WORKSPACE_TOO_SMALL &&
        n_text > 0 && (tt = malloc(n_text * sizeof(int32_t))) &&
        mi_model_tokenize(text_model, text, text_len, 0, 0, tt, n_text, &n_text) ==
            MI_STATUS_SUCCESS) {
        for (int64_t i = 0; i < n; i++) prompt[i] = tt[i % (int64_t)n_text];
        mi_model_info info;
        mi_model_get_info(text_model, &info);
        if (info.bos >= 0 && n > 0) prompt[0] = info.bos;
    } else {
        fprintf(stderr, "%s: no prompt text (%s)\n", who,
                text_path ? text_path : "/usr/share/common-licenses");
        free(prompt);
        prompt = NULL;
    }
    free(tt);
    free(text);
    return prompt;
}
