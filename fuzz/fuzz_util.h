/*
 * fuzz_util.h: shared pieces of the libFuzzer targets (header-only; each target is one
 * translation unit). The loaders take paths, so every target writes its input into a private
 * temporary folder (one per process, removed at exit) and loads from there.
 */
#ifndef MI_FUZZ_UTIL_H
#define MI_FUZZ_UTIL_H

#include "minference_model.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static char fz_dir_path[512];

/* Removes every file in the folder (the targets create no subfolders). */
static inline void fz_clear(void) {
    DIR *d = opendir(fz_dir_path);
    if (!d) return;
    struct dirent *e;
    char path[1024];
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2])))
            continue;
        snprintf(path, sizeof(path), "%s/%s", fz_dir_path, e->d_name);
        unlink(path);
    }
    closedir(d);
}

static inline void fz_remove_dir(void) {
    fz_clear();
    rmdir(fz_dir_path);
}

/* The process's temporary folder, created on first use. */
static inline const char *fz_dir(void) {
    if (!fz_dir_path[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(fz_dir_path, sizeof(fz_dir_path), "%s/mi_fuzz_XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(fz_dir_path)) {
            perror("mkdtemp");
            abort();
        }
        atexit(fz_remove_dir);
    }
    return fz_dir_path;
}

/* Writes data to <dir>/<name>; returns the path (static storage, valid until the next call). */
static inline const char *fz_write(const char *name, const void *data, size_t size) {
    static char path[1024];
    snprintf(path, sizeof(path), "%s/%s", fz_dir(), name);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        perror(path);
        abort();
    }
    return path;
}

/* Loader parameters for fuzzing: one thread, a small cache. */
static inline mi_model_params fz_model_params(void) {
    mi_model_params p = mi_model_default_params();
    p.n_threads = 1;
    p.max_context = 64;
    return p;
}

/* Uses a model that loaded: the calls a caller makes first, so that whatever the loader accepted
 * is also read (token pieces, the chat template, a short prefill over every weight). */
static inline void fz_exercise_model(mi_model *m) {
    mi_model_info info;
    if (mi_model_get_info(m, &info) != MI_STATUS_SUCCESS) abort();
    /* Special ids the loader accepted must name tokens of the model (-1: none). */
    const int32_t ids[3] = {info.bos, info.eos, info.eot};
    for (int i = 0; i < 3; i++)
        if (ids[i] < -1 || ids[i] >= info.vocab) {
            fprintf(stderr, "loaded model has special token id %d outside its vocabulary (%d)\n",
                    ids[i], info.vocab);
            abort();
        }
    static const char text[] = "Hello world <|im_start|>user\n 12345 caf\xc3\xa9 \xe4\xb8\xad";
    int32_t tokens[64];
    size_t n = 0;
    /* With BOS asked for explicitly, whatever the model's default: the id the file names */
    if (mi_model_tokenize(m, text, sizeof(text) - 1, 1, 1, tokens, 64, &n) != MI_STATUS_SUCCESS)
        n = 0;
    char piece[64];
    for (size_t i = 0; i < n; i++) {
        size_t len;
        if (tokens[i] < 0 || tokens[i] >= info.vocab) abort(); /* a token the model cannot embed */
        mi_model_token_to_piece(m, tokens[i], piece, sizeof(piece), &len);
        mi_model_token_is_eog(m, tokens[i]);
        mi_model_token_is_control(m, tokens[i]);
    }
    for (int32_t id = -2; id < 4; id++) {
        size_t len;
        mi_model_token_to_piece(m, id, piece, sizeof(piece), &len);
        mi_model_token_to_piece(m, info.vocab - 2 + id, piece, sizeof(piece), &len);
    }
    char *chat = NULL;
    if (mi_model_chat_prompt(m, MI_CHAT_AUTO, NULL, "hi", &chat) == MI_STATUS_SUCCESS)
        mi_free(chat);
    /* The forward pass reads every weight; bounded so that a large accepted model stays cheap. */
    if (n > 4) n = 4;
    if (n > 0 && info.weight_bytes <= ((uint64_t)8 << 20) && info.vocab <= (1 << 16)) {
        float *logits = malloc((size_t)info.vocab * sizeof(float));
        if (logits) {
            if (mi_model_prefill(m, tokens, n, logits) == MI_STATUS_SUCCESS)
                mi_model_decode(m, tokens, 1, logits);
            free(logits);
        }
    }
}

#endif /* MI_FUZZ_UTIL_H */
