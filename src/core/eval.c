/*
 * eval.c: the scoring rules and haystack builders of the accuracy harnesses (docs/algorithms.md
 * §7). Kept in the library, apart from the CLI, so that tests pin each rule down on plain strings.
 */
#include "internal.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

/* The digits of s, in order, as a fresh NUL-terminated string. */
static char *digits_of(const char *s) {
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (!d) return NULL;
    size_t j = 0;
    for (size_t i = 0; i < n; i++)
        if (isdigit((unsigned char)s[i])) d[j++] = s[i];
    d[j] = '\0';
    return d;
}

mi_status mi_eval_needle_match(const char *output, const char *answer, int *match) {
    if (!output || !answer || !match)
        return mi_fail(NULL, MI_STATUS_INVALID_ARGUMENT, "output, answer and match are required");
    /* The original tests `answer_digits in output`. Joining the output's digits first also
     * accepts an answer the model spelled with separators, which a reader would count right. */
    char *a = digits_of(answer), *o = digits_of(output);
    if (!a || !o) {
        free(a);
        free(o);
        return MI_STATUS_OUT_OF_MEMORY;
    }
    *match = a[0] != '\0' && strstr(o, a) != NULL;
    free(a);
    free(o);
    return MI_STATUS_SUCCESS;
}

/* The first run of digits in s: [*begin, *begin + *len), len 0 when there is none. Leading zeros
 * are kept apart so "007" and "7" differ, as string labels do in the original. */
static void first_int(const char *s, const char **begin, size_t *len) {
    while (*s && !isdigit((unsigned char)*s)) s++;
    *begin = s;
    size_t n = 0;
    while (isdigit((unsigned char)s[n])) n++;
    *len = n;
}

mi_status mi_eval_passkey_match(const char *output, const char *answer, int *match) {
    if (!output || !answer || !match)
        return mi_fail(NULL, MI_STATUS_INVALID_ARGUMENT, "output, answer and match are required");
    const char *ob, *ab;
    size_t on, an;
    first_int(output, &ob, &on);
    first_int(answer, &ab, &an);
    *match = an > 0 && on == an && memcmp(ob, ab, an) == 0;
    return MI_STATUS_SUCCESS;
}

/* strstr, ASCII case-insensitive. An empty needle is contained everywhere. */
static int contains_nocase(const char *hay, const char *needle) {
    size_t n = strlen(needle);
    if (n == 0) return 1;
    for (const char *h = hay; *h; h++) {
        size_t i = 0;
        while (i < n && h[i] && tolower((unsigned char)h[i]) == tolower((unsigned char)needle[i]))
            i++;
        if (i == n) return 1;
    }
    return 0;
}

static mi_status check_refs(const char *output, const char *const *refs, int32_t n_refs,
                            const double *score) {
    if (!output || !score || n_refs < 0 || (n_refs > 0 && !refs))
        return mi_fail(NULL, MI_STATUS_INVALID_ARGUMENT, "output, refs and score are required");
    for (int32_t i = 0; i < n_refs; i++)
        if (!refs[i]) return mi_fail(NULL, MI_STATUS_INVALID_ARGUMENT, "refs[%d] is NULL", i);
    return MI_STATUS_SUCCESS;
}

mi_status mi_eval_string_match_all(const char *output, const char *const *refs, int32_t n_refs,
                                   double *score) {
    mi_status st = check_refs(output, refs, n_refs, score);
    if (st != MI_STATUS_SUCCESS) return st;
    if (n_refs == 0) {
        *score = 0.0; /* nothing to find scores nothing, rather than a free 100% */
        return MI_STATUS_SUCCESS;
    }
    int32_t hits = 0;
    for (int32_t i = 0; i < n_refs; i++) hits += contains_nocase(output, refs[i]);
    *score = (double)hits / (double)n_refs;
    return MI_STATUS_SUCCESS;
}

mi_status mi_eval_string_match_part(const char *output, const char *const *refs, int32_t n_refs,
                                    double *score) {
    mi_status st = check_refs(output, refs, n_refs, score);
    if (st != MI_STATUS_SUCCESS) return st;
    double s = 0.0;
    for (int32_t i = 0; i < n_refs && s == 0.0; i++)
        if (contains_nocase(output, refs[i])) s = 1.0;
    *score = s;
    return MI_STATUS_SUCCESS;
}

mi_status mi_eval_kv_match(const char *output, const char *value, const char *const *distractors,
                           int32_t n_distractors, int *match) {
    if (!output || !value || !match || n_distractors < 0 || (n_distractors > 0 && !distractors))
        return mi_fail(NULL, MI_STATUS_INVALID_ARGUMENT, "output, value and match are required");
    if (value[0] == '\0') return mi_fail(NULL, MI_STATUS_INVALID_ARGUMENT, "value is empty");
    int m = strstr(output, value) != NULL;
    /* Listing every value would pass a plain substring test; a retrieval names only the one. */
    for (int32_t i = 0; i < n_distractors && m; i++)
        if (distractors[i] && distractors[i][0] && strcmp(distractors[i], value) != 0 &&
            strstr(output, distractors[i]))
            m = 0;
    *match = m;
    return MI_STATUS_SUCCESS;
}

mi_status mi_eval_log_prob(const float *logits, int32_t n_vocab, int32_t token, double *log_prob) {
    if (!logits || !log_prob || n_vocab <= 0)
        return mi_fail(NULL, MI_STATUS_INVALID_ARGUMENT, "logits and log_prob are required");
    if (token < 0 || token >= n_vocab)
        return mi_fail(NULL, MI_STATUS_INVALID_ARGUMENT, "token %d outside the vocabulary", token);
    double mx = -INFINITY;
    for (int32_t i = 0; i < n_vocab; i++) {
        if (logits[i] != logits[i])
            return mi_fail(NULL, MI_STATUS_INVALID_ARGUMENT, "logit %d is NaN", i);
        if (logits[i] > mx) mx = logits[i];
    }
    if (!isfinite(mx)) return mi_fail(NULL, MI_STATUS_INVALID_ARGUMENT, "logits are not finite");
    double sum = 0.0;
    for (int32_t i = 0; i < n_vocab; i++) sum += exp((double)logits[i] - mx);
    *log_prob = (double)logits[token] - mx - log(sum);
    return MI_STATUS_SUCCESS;
}

mi_status mi_eval_perplexity(const double *log_probs, int64_t n, double *ppl) {
    if (!log_probs || !ppl || n <= 0)
        return mi_fail(NULL, MI_STATUS_INVALID_ARGUMENT, "log_probs (n > 0) and ppl are required");
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (!(log_probs[i] <= 0.0))
            return mi_fail(NULL, MI_STATUS_INVALID_ARGUMENT, "log_probs[%lld] is not <= 0",
                           (long long)i);
        s += log_probs[i];
    }
    *ppl = exp(-s / (double)n);
    return MI_STATUS_SUCCESS;
}

/* Copies src with every whitespace run folded into one space (leading runs dropped). A book
 * file's line breaks would otherwise cost tokens without adding text. */
static size_t fold_space(char *dst, const char *src, size_t n) {
    size_t j = 0;
    int pending = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)src[i];
        if (c == '\0') break;
        if (isspace(c)) {
            pending = j > 0;
            continue;
        }
        if (pending) dst[j++] = ' ';
        pending = 0;
        dst[j++] = (char)c;
    }
    return j;
}

mi_status mi_eval_haystack(const char *text, size_t text_len, size_t min_bytes, char **out,
                           size_t *length) {
    if (!out) return mi_fail(NULL, MI_STATUS_INVALID_ARGUMENT, "out is NULL");
    if (min_bytes > ((size_t)1 << 34))
        return mi_fail(NULL, MI_STATUS_INVALID_ARGUMENT, "min_bytes is too large");
    char *unit;
    size_t unit_len;
    if (!text) {
        unit_len = strlen(MI_EVAL_FILLER);
        unit = malloc(unit_len + 1);
        if (!unit) return MI_STATUS_OUT_OF_MEMORY;
        memcpy(unit, MI_EVAL_FILLER, unit_len + 1);
    } else {
        unit = malloc(text_len + 3);
        if (!unit) return MI_STATUS_OUT_OF_MEMORY;
        unit_len = fold_space(unit, text, text_len);
        if (unit_len == 0) {
            free(unit);
            return mi_fail(NULL, MI_STATUS_INVALID_ARGUMENT, "text has no visible characters");
        }
        /* A paragraph break between repeats keeps the seam from gluing two words together. */
        unit[unit_len++] = '\n';
        unit[unit_len++] = '\n';
    }
    size_t reps = min_bytes == 0 ? 1 : (min_bytes + unit_len - 1) / unit_len;
    size_t total = reps * unit_len;
    char *s = malloc(total + 1);
    if (!s) {
        free(unit);
        return MI_STATUS_OUT_OF_MEMORY;
    }
    for (size_t r = 0; r < reps; r++) memcpy(s + r * unit_len, unit, unit_len);
    s[total] = '\0';
    free(unit);
    *out = s;
    if (length) *length = total;
    return MI_STATUS_SUCCESS;
}

mi_status mi_eval_needle_offset(const char *hay, size_t hay_len, double depth, size_t *offset) {
    if (!hay || !offset)
        return mi_fail(NULL, MI_STATUS_INVALID_ARGUMENT, "hay and offset are required");
    if (!(depth >= 0.0 && depth <= 100.0))
        return mi_fail(NULL, MI_STATUS_INVALID_ARGUMENT, "depth %g is outside [0, 100]", depth);
    if (depth >= 100.0) {
        *offset = hay_len;
        return MI_STATUS_SUCCESS;
    }
    size_t pos = (size_t)((double)hay_len * depth / 100.0);
    if (pos > hay_len) pos = hay_len;
    /* Back to the start of the sentence that holds pos, so the needle never splits one. */
    while (pos > 0) {
        const char c = hay[pos - 1];
        if (pos >= 2 && isspace((unsigned char)c) &&
            (hay[pos - 2] == '.' || hay[pos - 2] == '!' || hay[pos - 2] == '?'))
            break;
        pos--;
    }
    *offset = pos;
    return MI_STATUS_SUCCESS;
}

mi_status mi_eval_insert_needle(const char *hay, size_t hay_len, const char *needle, double depth,
                                char **out, size_t *offset) {
    if (!hay || !needle || !out)
        return mi_fail(NULL, MI_STATUS_INVALID_ARGUMENT, "hay, needle and out are required");
    size_t pos;
    mi_status st = mi_eval_needle_offset(hay, hay_len, depth, &pos);
    if (st != MI_STATUS_SUCCESS) return st;
    const size_t nl = strlen(needle);
    const int sep_before = pos > 0 && !isspace((unsigned char)hay[pos - 1]) && nl > 0 &&
                           !isspace((unsigned char)needle[0]);
    const int sep_after = pos < hay_len && nl > 0 && !isspace((unsigned char)needle[nl - 1]) &&
                          !isspace((unsigned char)hay[pos]);
    char *s = malloc(hay_len + nl + 3);
    if (!s) return MI_STATUS_OUT_OF_MEMORY;
    size_t j = 0;
    memcpy(s, hay, pos);
    j = pos;
    if (sep_before) s[j++] = ' ';
    memcpy(s + j, needle, nl);
    j += nl;
    if (sep_after) s[j++] = ' ';
    memcpy(s + j, hay + pos, hay_len - pos);
    j += hay_len - pos;
    s[j] = '\0';
    *out = s;
    if (offset) *offset = pos + (size_t)sep_before;
    return MI_STATUS_SUCCESS;
}
