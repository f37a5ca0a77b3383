/*
 * model_text.c: the public tokenizer entry points and the chat templates.
 */
#define _POSIX_C_SOURCE 200809L
#include "model_runner.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

mi_status mi_model_tokenize(mi_model *m, const char *text, size_t length, int add_bos,
                            int parse_special, int32_t *tokens, size_t capacity, size_t *n_tokens) {
    if (!m || !n_tokens || (!text && length) || (!tokens && capacity))
        return MI_STATUS_INVALID_ARGUMENT;
    int32_t *ids = NULL;
    size_t n = 0;
    bool bos = add_bos < 0 ? m->tok->add_bos : add_bos != 0;
    if (!mim_tokenize(m->tok, text ? text : "", length, bos, parse_special != 0, &ids, &n))
        return mim_model_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory while tokenizing");
    *n_tokens = n;
    mi_status st = MI_STATUS_SUCCESS;
    if (n > capacity)
        st = mim_model_fail(m, MI_STATUS_WORKSPACE_TOO_SMALL, "%zu tokens, capacity %zu", n,
                            capacity);
    else if (n)
        memcpy(tokens, ids, n * sizeof(int32_t));
    free(ids);
    return st;
}

mi_status mi_model_token_to_piece(const mi_model *m, int32_t token, char *buf, size_t capacity,
                                  size_t *length) {
    if (!m || !length || (!buf && capacity)) return MI_STATUS_INVALID_ARGUMENT;
    if (token < 0 || token >= m->tok->n_vocab) return MI_STATUS_INVALID_ARGUMENT;
    *length = mim_token_bytes(m->tok, token, buf, capacity);
    return MI_STATUS_SUCCESS;
}

int mi_model_token_is_eog(const mi_model *m, int32_t token) {
    if (!m || token < 0) return 0;
    const mim_tokenizer *t = m->tok;
    if (token == t->eos || token == t->eot) return 1;
    for (int i = 0; i < m->n_extra_eog; i++)
        if (token == m->extra_eog[i]) return 1;
    static const char *names[] = {"<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (token == mim_tokenizer_find(t, names[i])) return 1;
    return 0;
}

int mi_model_token_is_control(const mi_model *m, int32_t token) {
    if (!m || token < 0 || token >= m->tok->n_vocab) return 0;
    return m->tok->type[token] == MIM_TT_CONTROL;
}

mi_status mi_model_chat_prompt(const mi_model *m, mi_chat_template tmpl, const char *system,
                               const char *user, char **out) {
    if (!m || !user || !out) return MI_STATUS_INVALID_ARGUMENT;
    *out = NULL;
    if (tmpl == MI_CHAT_AUTO) {
        if (mim_tokenizer_find(m->tok, "<|im_start|>") >= 0)
            tmpl = MI_CHAT_CHATML;
        else if (mim_tokenizer_find(m->tok, "<|start_header_id|>") >= 0)
            tmpl = MI_CHAT_LLAMA3;
        else
            return MI_STATUS_UNSUPPORTED;
    }
    if (tmpl != MI_CHAT_CHATML && tmpl != MI_CHAT_LLAMA3) return MI_STATUS_INVALID_ARGUMENT;
    if (!system && tmpl == MI_CHAT_CHATML && m->smollm)
        system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
    size_t need = strlen(user) + (system ? strlen(system) : 0) + 256;
    char *s = malloc(need);
    if (!s) return MI_STATUS_OUT_OF_MEMORY;
    if (tmpl == MI_CHAT_CHATML) {
        if (system)
            snprintf(s, need,
                     "<|im_start|>system\n%s<|im_end|>\n<|im_start|>user\n%s<|im_end|>\n"
                     "<|im_start|>assistant\n",
                     system, user);
        else
            snprintf(s, need, "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n", user);
    } else {
        /* The BOS token is written by the template, so callers tokenize with add_bos = 0. */
        if (system)
            snprintf(s, need,
                     "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n%s<|eot_id|>"
                     "<|start_header_id|>user<|end_header_id|>\n\n%s<|eot_id|>"
                     "<|start_header_id|>assistant<|end_header_id|>\n\n",
                     system, user);
        else
            snprintf(s, need,
                     "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n%s<|eot_id|>"
                     "<|start_header_id|>assistant<|end_header_id|>\n\n",
                     user);
    }
    *out = s;
    return MI_STATUS_SUCCESS;
}
