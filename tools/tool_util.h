/* tool_util.h: small helpers the subcommands share (timing, whole-file reads, default text). */
#ifndef MI_TOOL_UTIL_H
#define MI_TOOL_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct mi_config;

/* A growable NUL-terminated string; oom is set (and later appends ignored) when memory ran out. */
typedef struct tool_buf {
    char *s;
    size_t n, cap;
    bool oom;
} tool_buf;
void tool_buf_addn(tool_buf *b, const char *s, size_t n);

/* Monotonic wall-clock seconds. */
double tool_now_s(void);

/* The whole of a regular file of at most TOOL_MAX_FILE_BYTES, NUL-terminated, malloc'ed; *len
 * gets its size. NULL if it cannot be read, with *why (may be NULL) saying why. */
#define TOOL_MAX_FILE_BYTES ((uint64_t)1 << 30)
char *tool_read_file(const char *path, size_t *len, const char **why);

/* The model a subcommand loads when none is given: $MI_MODEL when set, else the demo model
 * (mi_model_default_path). malloc'ed, or NULL. */
char *tool_default_model(void);

/* Real English text present on every Debian system: the license texts of
 * /usr/share/common-licenses, concatenated with blank lines between them. NULL if none. */
char *tool_license_text(size_t *len);

/* The benchmarks' model: the GGUF / Hugging Face directory at path, or with path NULL seeded
 * random weights of the LLaMA-3-8B shape. On failure prints "WHO: cannot load the model: ..."
 * and returns NULL. */
typedef struct mi_model mi_model;
typedef struct mi_model_params mi_model_params;
mi_model *tool_bench_model(const char *who, const char *path, const mi_model_params *params);

/* The benchmarks' prompt of n tokens: for a random model (text_model NULL) seeded random byte
 * tokens; else the text of text_path (NULL: tool_license_text) tokenized and repeated, the
 * first token BOS where the vocabulary has one. malloc'ed; NULL (after a message) on failure. */
int32_t *tool_bench_prompt(const char *who, mi_model *text_model, const char *text_path, int64_t n);

/* A pattern config; on failure prints "minference CMD: cannot load config PATH: reason" with the
 * loader's detailed reason and returns NULL. */
typedef struct mi_config mi_config;
mi_config *tool_load_config(const char *cmd, const char *path);

/* data [n] as path, whole or not at all (mi_file_write_atomic); on failure prints
 * "minference CMD: cannot write PATH: reason" and returns false. */
bool tool_write_file(const char *cmd, const char *path, const void *data, size_t n);

/* Appends data [n] to path the same way: the old contents and the new rows are written as a new
 * file that replaces the old one only when complete (a missing file starts empty). */
bool tool_append_file(const char *cmd, const char *path, const void *data, size_t n);

/* The config a model command loads for --config ARG: ARG itself, or for "auto" the shipped config
 * of the model at model_path (its path names the model: mi_config_model_file), looked up first
 * in $MI_CONFIG_DIR, then where the library finds it. *owned gets what to free (may be NULL).
 * NULL when arg is NULL, or for "auto" when no shipped config names this model (a note to
 * stderr under cmd's name says so: every head keeps the default pattern). */
const char *tool_config_path(const char *arg, const char *model_path, const char *cmd,
                             char **owned);

/* Whether attn is "static" or "static:DIR": MInference w/ static in the model runner
 * (mi_model_set_attention_name reads it; the sets are kept in DIR when given). */
static inline int tool_is_static_attn(const char *attn) {
    return strcmp(attn, "static") == 0 || (strncmp(attn, "static:", 7) == 0 && attn[7] != '\0');
}

/* TriangleMix (the original's tri_mix and tri_mix_minference): "tri_mix[:START]" or
 * "tri_mix_minference[:START]", START the first Tri-shape layer (default 16, as the original's
 * scripts). Returns 1 when spec names one (*minference, *start set), 0 when it names none, -1
 * when it is malformed. */
int tool_tri_mix_parse(const char *spec, int *minference, int32_t *start);
/* The per-layer config of TriangleMix: layers below start dense (tri_mix) or as *config has them
 * (tri_mix_minference; NULL: vertical-slash 1000/6096), the others Tri-shape with n_init 8,
 * n_local 512, n_last 128 (the original's TriangleMix defaults). Replaces *config. */
int tool_tri_mix_config(int minference, int32_t start, int32_t n_layers, int32_t n_heads,
                        struct mi_config **config);

#endif
