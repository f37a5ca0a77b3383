/*
 * fuzz_tokenize: the tokenizer on arbitrary bytes, then back to text. The first input byte
 * chooses the options (bit 0: add BOS, bit 1: parse special-token text, bit 2: also wrap the
 * text in the chat template); the rest is the text.
 *
 * The model is $MI_FUZZ_MODEL when set, else the demo model (mi_model_default_path), else a
 * random-weights model with the built-in byte vocabulary. The demo and built-in vocabularies are
 * byte-level, so every text must come back byte for byte from its token pieces when neither BOS
 * nor special tokens are added, except that a byte missing from the vocabulary comes back as the
 * unknown token (a control token in SmolLM2: <|endoftext|>). The check is skipped for a model
 * named by $MI_FUZZ_MODEL (SentencePiece vocabularies add a space prefix).
 */
#include "fuzz_util.h"

static mi_model *model;
static mi_model_info info;
static int check_roundtrip;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    mi_model_params params = fz_model_params();
    mi_context *ectx = NULL; /* receives the loader's message */
    mi_context_create(NULL, &ectx);
    const char *env = getenv("MI_FUZZ_MODEL");
    char *path = env && *env ? strdup(env) : mi_model_default_path();
    check_roundtrip = !(env && *env);
    if (path && access(path, R_OK) == 0) {
        if (mi_model_load(ectx, path, &params, &model) != MI_STATUS_SUCCESS) {
            fprintf(stderr, "fuzz_tokenize: cannot load %s: %s\n", path,
                    mi_context_last_error(ectx));
            abort();
        }
        fprintf(stderr, "fuzz_tokenize: model %s\n", path);
    } else {
        mi_model_shape shape = {1, 32, 2, 1, 16, 32, 300, 0, 256, 0, 0};
        if (mi_model_create_random(ectx, &shape, 1, &params, &model) != MI_STATUS_SUCCESS) {
            fprintf(stderr, "fuzz_tokenize: %s\n", mi_context_last_error(ectx));
            abort();
        }
        fprintf(stderr, "fuzz_tokenize: no model file; the built-in byte vocabulary\n");
    }
    free(path);
    mi_context_destroy(ectx);
    if (mi_model_get_info(model, &info) != MI_STATUS_SUCCESS) abort();
    return 0;
}

static int valid_utf8(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!len || i + len > n) return 0;
        uint32_t cp = len == 1 ? c : (uint32_t)(c & (0x7F >> len));
        for (size_t j = 1; j < len; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += len;
    }
    return 1;
}

static void tokenize_and_back(const char *text, size_t len, int add_bos, int parse_special,
                              int roundtrip) {
    size_t n = 0;
    mi_status st = mi_model_tokenize(model, text, len, add_bos, parse_special, NULL, 0, &n);
    if (st != MI_STATUS_SUCCESS && st != MI_STATUS_WORKSPACE_TOO_SMALL) return;
    int32_t *tokens = malloc((n ? n : 1) * sizeof(int32_t));
    size_t n2 = 0;
    if (!tokens) abort();
    if (mi_model_tokenize(model, text, len, add_bos, parse_special, tokens, n, &n2) !=
            MI_STATUS_SUCCESS ||
        n2 != n) {
        fprintf(stderr, "the count and the tokenization disagree: %zu vs %zu\n", n, n2);
        abort();
    }
    size_t blen = 0;
    int same = 1;
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= info.vocab) abort();
        char piece[256];
        size_t plen = 0;
        if (mi_model_token_to_piece(model, tokens[i], piece, sizeof(piece), &plen) !=
            MI_STATUS_SUCCESS)
            abort();
        if (plen > sizeof(piece)) { /* truncated copy: check the length call is stable */
            char *big = malloc(plen);
            size_t plen2 = 0;
            if (!big ||
                mi_model_token_to_piece(model, tokens[i], big, plen, &plen2) != MI_STATUS_SUCCESS ||
                plen2 != plen)
                abort();
            if (same && blen + plen <= len && memcmp(text + blen, big, plen) == 0)
                blen += plen;
            else
                same = 0;
            free(big);
            continue;
        }
        if (!same) continue;
        if (mi_model_token_is_control(model, tokens[i]) && blen < len)
            blen += 1; /* the unknown token: a byte the vocabulary lacks */
        else if (blen + plen <= len && memcmp(text + blen, piece, plen) == 0)
            blen += plen;
        else
            same = 0;
    }
    if (roundtrip && !(same && blen == len)) {
        fprintf(stderr, "text does not come back from its %zu tokens\n", n);
        abort();
    }
    free(tokens);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t flags = data[0];
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;
    const int add_bos = flags & 1, parse_special = (flags >> 1) & 1;
    tokenize_and_back(text, len, add_bos, parse_special,
                      check_roundtrip && !add_bos && !parse_special && valid_utf8(data + 1, len));
    if (flags & 4) {
        char *user = malloc(len + 1), *chat = NULL;
        if (!user) abort();
        memcpy(user, text, len);
        user[len] = 0; /* the template takes C strings: the text up to its first NUL */
        if (mi_model_chat_prompt(model, MI_CHAT_AUTO, (flags & 8) ? user : NULL, user, &chat) ==
            MI_STATUS_SUCCESS) {
            tokenize_and_back(chat, strlen(chat), -1, 1, 0);
            mi_free(chat);
        }
        free(user);
    }
    return 0;
}
