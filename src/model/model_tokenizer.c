/*
 * model_tokenizer.c: byte-level BPE (GPT-2 style) and SentencePiece BPE tokenizers, built from
 * GGUF metadata or a Hugging Face tokenizer.json.
 *
 * Encoding: the text is first cut at special-token strings (control and user-defined tokens,
 * or tokenizer.json's added_tokens), then each ordinary segment is
 *   byte BPE: split by the pre-tokenizer expression (hand-coded matchers below, equivalent to
 *             the regexes of GPT-2, LLaMA-3, Qwen2 and SmolLM), bytes mapped to printable code
 *             points, and merged by merge rank;
 *   SPM:      spaces replaced by U+2581 (a prefix one added at the start), merged by token score
 *             (GGUF) or merge rank (tokenizer.json), unknown characters as <0xXX> byte tokens.
 */
#define _POSIX_C_SOURCE 200809L
#include "model_internal.h"

#include <float.h>
#include <stddef.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPM_SPACE "\xE2\x96\x81" /* U+2581 */

/* ------------------------------------------------------------------------------------------ */
/* Pre-tokenizer matchers. Each returns the length (in code points) of the match at i within
 * [i, n); they mirror the alternation order of the original expressions. */

static bool is_crlf(uint32_t c) { return c == '\r' || c == '\n'; }

static size_t run_of(const uint32_t *c, size_t i, size_t n, bool (*pred)(uint32_t)) {
    size_t j = i;
    while (j < n && pred(c[j])) j++;
    return j - i;
}

static uint32_t lower_ascii(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

/* 's|'t|'re|'ve|'m|'ll|'d, optionally case-insensitive. */
static size_t match_contraction(const uint32_t *c, size_t i, size_t n, bool ci) {
    if (c[i] != '\'' || i + 1 >= n) return 0;
    uint32_t a = ci ? lower_ascii(c[i + 1]) : c[i + 1];
    uint32_t b = i + 2 < n ? (ci ? lower_ascii(c[i + 2]) : c[i + 2]) : 0;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    return 0;
}

static bool is_other(uint32_t c) /* [^\s\p{L}\p{N}] */
{
    return !mim_uc_is_space(c) && !mim_uc_is_letter(c) && !mim_uc_is_number(c);
}

/* \s+(?!\S) then \s+: a whitespace run leaves its last character to the next piece when a
 * non-space follows (so " word" keeps its space), unless the run is that one character. */
static size_t match_space_tail(const uint32_t *c, size_t i, size_t n) {
    size_t r = run_of(c, i, n, mim_uc_is_space);
    if (r == 0) return 0;
    if (i + r == n || r == 1) return r;
    return r - 1;
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t match_gpt2(const uint32_t *c, size_t i, size_t n) {
    size_t m = match_contraction(c, i, n, false);
    if (m) return m;
    size_t j = i + (c[i] == ' ' && i + 1 < n ? 1 : 0);
    if ((m = run_of(c, j, n, mim_uc_is_letter))) return j - i + m;
    if ((m = run_of(c, j, n, mim_uc_is_number))) return j - i + m;
    if ((m = run_of(c, j, n, is_other))) return j - i + m;
    if ((m = match_space_tail(c, i, n))) return m;
    return 1;
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 * \s*[\r\n]+|\s+(?!\S)|\s+   with D = 3 (LLaMA-3) or 1 (Qwen2) */
static size_t match_llama3(const uint32_t *c, size_t i, size_t n, size_t max_digits) {
    size_t m = match_contraction(c, i, n, true);
    if (m) return m;
    if (!is_crlf(c[i]) && !mim_uc_is_letter(c[i]) && !mim_uc_is_number(c[i]) && i + 1 < n &&
        mim_uc_is_letter(c[i + 1]))
        return 1 + run_of(c, i + 1, n, mim_uc_is_letter);
    if ((m = run_of(c, i, n, mim_uc_is_letter))) return m;
    if ((m = run_of(c, i, n, mim_uc_is_number))) return m < max_digits ? m : max_digits;
    size_t j = i + (c[i] == ' ' && i + 1 < n ? 1 : 0);
    if ((m = run_of(c, j, n, is_other))) {
        size_t k = j + m;
        while (k < n && is_crlf(c[k])) k++;
        return k - i;
    }
    size_t r = run_of(c, i, n, mim_uc_is_space);
    if (r) {
        size_t last = SIZE_MAX;
        for (size_t k = i; k < i + r; k++)
            if (is_crlf(c[k])) last = k;
        if (last != SIZE_MAX) return last + 1 - i;
        return match_space_tail(c, i, n);
    }
    return 1;
}

bool mim_pretokenize(mim_pretok pre, const char *text, size_t len, size_t **bounds,
                     size_t *n_pieces) {
    *bounds = NULL;
    *n_pieces = 0;
    uint32_t *cps = malloc((len + 1) * sizeof(uint32_t));
    size_t *offs = malloc((len + 1) * sizeof(size_t));
    size_t *out = malloc((2 * len + 2) * sizeof(size_t));
    if (!cps || !offs || !out) {
        free(cps);
        free(offs);
        free(out);
        return false;
    }
    size_t n = 0;
    for (size_t p = 0; p < len;) {
        offs[n] = p;
        p += mim_utf8_decode((const unsigned char *)text + p, len - p, &cps[n]);
        n++;
    }
    offs[n] = len;
    size_t np = 0;
    size_t seg = 0;
    while (seg < n) {
        /* SmolLM isolates every digit before the GPT-2 expression runs on what is between. */
        size_t seg_end = n;
        if (pre == MIM_PRE_SMOLLM) {
            if (mim_uc_is_number(cps[seg])) {
                out[2 * np] = offs[seg];
                out[2 * np + 1] = offs[seg + 1];
                np++;
                seg++;
                continue;
            }
            seg_end = seg;
            while (seg_end < n && !mim_uc_is_number(cps[seg_end])) seg_end++;
        }
        for (size_t i = seg; i < seg_end;) {
            size_t m;
            switch (pre) {
            case MIM_PRE_LLAMA3: m = match_llama3(cps, i, seg_end, 3); break;
            case MIM_PRE_QWEN2: m = match_llama3(cps, i, seg_end, 1); break;
            default: m = match_gpt2(cps, i, seg_end); break;
            }
            out[2 * np] = offs[i];
            out[2 * np + 1] = offs[i + m];
            np++;
            i += m;
        }
        seg = seg_end;
    }
    free(cps);
    free(offs);
    *bounds = out;
    *n_pieces = np;
    return true;
}

/* ------------------------------------------------------------------------------------------ */
/* Merging                                                                                     */

typedef struct sym {
    int32_t id;          /* -1: not in the vocabulary (SPM byte fallback at the end) */
    uint32_t start, len; /* bytes in the working buffer */
} sym;

typedef struct out_buf {
    int32_t *ids;
    size_t n, cap;
} out_buf;

static bool push(out_buf *o, int32_t id) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 256;
        int32_t *p = realloc(o->ids, cap * sizeof(int32_t));
        if (!p) return false;
        o->ids = p;
        o->cap = cap;
    }
    o->ids[o->n++] = id;
    return true;
}

/* Merge priority of two adjacent symbols (lower is better); false when they do not merge.
 * Score mode (SPM from GGUF): the concatenation must be a token; its score decides.
 * Rank mode: the (left, right) pair must be in the merge list; its rank decides. */
static bool pair_priority(const mim_tokenizer *t, bool by_score, const char *buf, const sym *a,
                          const sym *b, float *prio, int32_t *merged) {
    if (a->id < 0 || b->id < 0) return false;
    if (by_score) {
        int32_t id = mim_strmap_get(&t->vocab, buf + a->start, a->len + b->len);
        if (id < 0) return false;
        *prio = -t->score[id];
        *merged = id;
        return true;
    }
    int32_t rank;
    if (!mim_pairmap_get(&t->merges, ((uint64_t)(uint32_t)a->id << 32) | (uint32_t)b->id, &rank,
                         merged))
        return false;
    *prio = (float)rank;
    return true;
}

/* A candidate merge of symbols left and right; stale once either side changed (the lengths are
 * the version stamps: a symbol only ever grows). */
typedef struct cand {
    float prio;
    uint32_t left, right, left_len, right_len;
} cand;

static bool cand_less(const cand *a, const cand *b) {
    return a->prio < b->prio || (a->prio == b->prio && a->left < b->left);
}

static void heap_push(cand *h, size_t *n, cand c) {
    size_t i = (*n)++;
    while (i > 0 && cand_less(&c, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = c;
}

static cand heap_pop(cand *h, size_t *n) {
    cand top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_less(&h[c + 1], &h[c])) c++;
        if (!cand_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

/* Merges best pair first (leftmost on ties) until no pair merges, with a heap of candidate
 * pairs and a linked list of symbols: O(n log n), so a single piece of 100k characters (a long
 * run of spaces or punctuation) stays fast. Compacts s[] to the surviving symbols in order. */
static bool merge_symbols(const mim_tokenizer *t, bool by_score, const char *buf, sym *s,
                          size_t *n) {
    if (*n < 2) return true;
    const size_t count = *n;
    uint32_t *next = malloc(count * sizeof(uint32_t)), *prev = malloc(count * sizeof(uint32_t));
    /* every merge adds at most two candidates */
    cand *heap = malloc((3 * count + 1) * sizeof(cand));
    if (!next || !prev || !heap) {
        free(next);
        free(prev);
        free(heap);
        return false;
    }
    const uint32_t none = UINT32_MAX;
    for (size_t i = 0; i < count; i++) {
        next[i] = i + 1 < count ? (uint32_t)(i + 1) : none;
        prev[i] = i > 0 ? (uint32_t)(i - 1) : none;
    }
    size_t hn = 0;
    float p;
    int32_t id;
    for (size_t i = 0; i + 1 < count; i++)
        if (pair_priority(t, by_score, buf, &s[i], &s[i + 1], &p, &id))
            heap_push(heap, &hn, (cand){p, (uint32_t)i, (uint32_t)(i + 1), s[i].len, s[i + 1].len});
    while (hn > 0) {
        cand c = heap_pop(heap, &hn);
        sym *l = &s[c.left], *r = &s[c.right];
        if (r->len == 0 || next[c.left] != c.right || l->len != c.left_len || r->len != c.right_len)
            continue; /* stale */
        if (!pair_priority(t, by_score, buf, l, r, &p, &id)) continue;
        l->id = id;
        l->len += r->len;
        r->len = 0; /* dead */
        next[c.left] = next[c.right];
        if (next[c.right] != none) prev[next[c.right]] = c.left;
        if (prev[c.left] != none) {
            uint32_t pl = prev[c.left];
            if (pair_priority(t, by_score, buf, &s[pl], l, &p, &id))
                heap_push(heap, &hn, (cand){p, pl, c.left, s[pl].len, l->len});
        }
        if (next[c.left] != none) {
            uint32_t nr = next[c.left];
            if (pair_priority(t, by_score, buf, l, &s[nr], &p, &id))
                heap_push(heap, &hn, (cand){p, c.left, nr, l->len, s[nr].len});
        }
    }
    size_t w = 0;
    for (uint32_t i = 0; i != none; i = next[i]) s[w++] = s[i];
    *n = w;
    free(next);
    free(prev);
    free(heap);
    return true;
}

static bool encode_byte_bpe(const mim_tokenizer *t, const char *text, size_t len, out_buf *o) {
    size_t *bounds, np;
    if (!mim_pretokenize(t->pre, text, len, &bounds, &np)) return false;
    bool ok = true;
    char *buf = NULL;
    sym *s = NULL;
    size_t buf_cap = 0;
    for (size_t p = 0; p < np && ok; p++) {
        const unsigned char *piece = (const unsigned char *)text + bounds[2 * p];
        size_t plen = bounds[2 * p + 1] - bounds[2 * p];
        if (plen * 2 > buf_cap) {
            buf_cap = plen * 2 + 64;
            free(buf);
            free(s);
            buf = malloc(buf_cap);
            s = malloc(buf_cap * sizeof(sym));
            if (!buf || !s) {
                ok = false;
                break;
            }
        }
        size_t bl = 0;
        for (size_t i = 0; i < plen; i++) {
            size_t k = mim_utf8_encode(t->byte_to_cp[piece[i]], buf + bl);
            s[i].start = (uint32_t)bl;
            s[i].len = (uint32_t)k;
            s[i].id = mim_strmap_get(&t->vocab, buf + bl, k);
            bl += k;
        }
        if (t->pre == MIM_PRE_LLAMA3) {
            /* LLaMA-3 (ignore_merges): a piece that is itself a token is emitted whole. */
            int32_t whole = mim_strmap_get(&t->vocab, buf, bl);
            if (whole >= 0) {
                ok = push(o, whole);
                continue;
            }
        }
        size_t n = plen;
        ok = merge_symbols(t, false, buf, s, &n);
        for (size_t i = 0; i < n && ok; i++)
            if (s[i].id >= 0 || t->unk >= 0) ok = push(o, s[i].id >= 0 ? s[i].id : t->unk);
    }
    free(buf);
    free(s);
    free(bounds);
    return ok;
}

static bool encode_spm(const mim_tokenizer *t, const char *text, size_t len, bool prefix,
                       out_buf *o) {
    /* Each space becomes 3 bytes. */
    char *buf = malloc(len * 3 + 4);
    sym *s = malloc((len * 3 + 4) * sizeof(sym));
    if (!buf || !s) {
        free(buf);
        free(s);
        return false;
    }
    size_t bl = 0;
    if (prefix) {
        memcpy(buf, SPM_SPACE, 3);
        bl = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(buf + bl, SPM_SPACE, 3);
            bl += 3;
        } else {
            buf[bl++] = text[i];
        }
    }
    size_t n = 0;
    for (size_t p = 0; p < bl;) {
        uint32_t cp;
        size_t k = mim_utf8_decode((const unsigned char *)buf + p, bl - p, &cp);
        s[n].start = (uint32_t)p;
        s[n].len = (uint32_t)k;
        s[n].id = mim_strmap_get(&t->vocab, buf + p, k);
        n++;
        p += k;
    }
    bool ok = merge_symbols(t, t->merges.count == 0, buf, s, &n);
    for (size_t i = 0; i < n && ok; i++) {
        if (s[i].id >= 0) {
            ok = push(o, s[i].id);
            continue;
        }
        for (uint32_t b = 0; b < s[i].len && ok; b++) {
            int32_t id = t->byte_token[(unsigned char)buf[s[i].start + b]];
            if (id < 0) id = t->unk;
            if (id >= 0) ok = push(o, id);
        }
    }
    free(buf);
    free(s);
    return ok;
}

static bool encode_segment(const mim_tokenizer *t, const char *text, size_t len, bool at_start,
                           out_buf *o) {
    if (len == 0) return true;
    if (t->kind == MIM_TOK_SPM) return encode_spm(t, text, len, at_start && t->add_space_prefix, o);
    return encode_byte_bpe(t, text, len, o);
}

bool mim_tokenize(const mim_tokenizer *t, const char *text, size_t len, bool add_bos,
                  bool parse_special, int32_t **tokens, size_t *n_out) {
    out_buf o = {0};
    bool ok = true;
    if (add_bos && t->bos >= 0) ok = push(&o, t->bos);
    size_t seg = 0;
    bool first = true;
    for (size_t i = 0; i < len && ok && parse_special;) {
        int32_t hit = -1;
        for (int32_t k = 0; k < t->n_specials; k++) {
            int32_t id = t->specials[k];
            if (t->len[id] && t->len[id] <= len - i &&
                memcmp(text + i, t->text[id], t->len[id]) == 0) {
                hit = id;
                break;
            }
        }
        if (hit < 0) {
            i++;
            continue;
        }
        ok = encode_segment(t, text + seg, i - seg, first, &o) && push(&o, hit);
        first = false;
        i += t->len[hit];
        seg = i;
    }
    if (ok) ok = encode_segment(t, text + seg, len - seg, first, &o);
    if (!ok) {
        free(o.ids);
        return false;
    }
    *tokens = o.ids ? o.ids : malloc(sizeof(int32_t));
    *n_out = o.n;
    return *tokens != NULL;
}

size_t mim_token_bytes(const mim_tokenizer *t, int32_t id, char *out, size_t cap) {
    if (id < 0 || id >= t->n_vocab) return 0;
    const char *s = t->text[id];
    size_t n = t->len[id], w = 0;
    if (t->type[id] == MIM_TT_CONTROL || t->type[id] == MIM_TT_USER_DEFINED ||
        t->type[id] == MIM_TT_UNKNOWN) {
        if (out) memcpy(out, s, n < cap ? n : cap);
        return n;
    }
    if (t->kind == MIM_TOK_SPM) {
        unsigned int byte;
        if (n == 6 && sscanf(s, "<0x%02X>", &byte) == 1) {
            if (out && cap > 0) out[0] = (char)byte;
            return 1;
        }
        for (size_t i = 0; i < n;) {
            if (i + 3 <= n && memcmp(s + i, SPM_SPACE, 3) == 0) {
                if (w < cap && out) out[w] = ' ';
                w++;
                i += 3;
            } else {
                if (w < cap && out) out[w] = s[i];
                w++;
                i++;
            }
        }
        return w;
    }
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += mim_utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (cp < 512 && t->cp_to_byte[cp] >= 0) {
            if (w < cap && out) out[w] = (char)t->cp_to_byte[cp];
            w++;
        } else {
            char tmp[4];
            size_t k = mim_utf8_encode(cp, tmp);
            for (size_t j = 0; j < k; j++, w++)
                if (w < cap && out) out[w] = tmp[j];
        }
    }
    return w;
}

/* ------------------------------------------------------------------------------------------ */
/* Construction                                                                                */

void mim_gpt2_byte_map(uint32_t byte_to_cp[256]) {
    /* GPT-2: printable Latin-1 bytes stand for themselves, the rest move to 256 + k. */
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        byte_to_cp[b] = printable ? (uint32_t)b : next++;
    }
}

static void init_byte_map(mim_tokenizer *t) {
    mim_gpt2_byte_map(t->byte_to_cp);
    for (int i = 0; i < 512; i++) t->cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) t->cp_to_byte[t->byte_to_cp[b]] = (int16_t)b;
}

static mim_tokenizer *alloc_tokenizer(int32_t n_vocab, size_t text_bytes) {
    mim_tokenizer *t = calloc(1, sizeof(*t));
    if (!t) return NULL;
    t->n_vocab = n_vocab;
    t->arena = malloc(text_bytes + (size_t)n_vocab + 1);
    t->text = calloc((size_t)n_vocab, sizeof(*t->text));
    t->len = calloc((size_t)n_vocab, sizeof(*t->len));
    t->score = calloc((size_t)n_vocab, sizeof(*t->score));
    t->type = calloc((size_t)n_vocab, sizeof(*t->type));
    if (!t->arena || !t->text || !t->len || !t->score || !t->type ||
        !mim_strmap_init(&t->vocab, (size_t)n_vocab)) {
        mim_tokenizer_free(t);
        return NULL;
    }
    for (int32_t i = 0; i < n_vocab; i++) t->type[i] = MIM_TT_NORMAL;
    t->bos = t->eos = t->eot = t->unk = -1;
    for (int i = 0; i < 256; i++) t->byte_token[i] = -1;
    init_byte_map(t);
    return t;
}

void mim_tokenizer_free(mim_tokenizer *t) {
    if (!t) return;
    free(t->arena);
    free(t->text);
    free(t->len);
    free(t->score);
    free(t->type);
    free(t->specials);
    mim_strmap_free(&t->vocab);
    mim_pairmap_free(&t->merges);
    free(t);
}

int32_t mim_tokenizer_find(const mim_tokenizer *t, const char *s) {
    return mim_strmap_get(&t->vocab, s, strlen(s));
}

static bool finish(mim_tokenizer *t, char *err, size_t cap, mi_status *st) {
    int32_t n = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if ((t->type[i] == MIM_TT_CONTROL || t->type[i] == MIM_TT_USER_DEFINED) && t->len[i]) n++;
    t->specials = malloc(((size_t)n + 1) * sizeof(int32_t));
    if (!t->specials) {
        *st = mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory");
        return false;
    }
    for (int32_t i = 0; i < t->n_vocab; i++)
        if ((t->type[i] == MIM_TT_CONTROL || t->type[i] == MIM_TT_USER_DEFINED) && t->len[i])
            t->specials[t->n_specials++] = i;
    /* Longest first, so that the longest special string wins at a position; insertion sort
     * keeps ids of equal length in id order (the lists are short). */
    for (int32_t i = 1; i < t->n_specials; i++) {
        int32_t id = t->specials[i], j = i;
        while (j > 0 && t->len[t->specials[j - 1]] < t->len[id]) {
            t->specials[j] = t->specials[j - 1];
            j--;
        }
        t->specials[j] = id;
    }
    if (t->kind == MIM_TOK_SPM) {
        char name[8];
        for (int b = 0; b < 256; b++) {
            snprintf(name, sizeof(name), "<0x%02X>", b);
            t->byte_token[b] = mim_tokenizer_find(t, name);
        }
    }
    if (t->eot < 0) {
        static const char *eots[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>"};
        for (size_t i = 0; i < sizeof(eots) / sizeof(eots[0]) && t->eot < 0; i++)
            t->eot = mim_tokenizer_find(t, eots[i]);
    }
    return true;
}

static mim_pretok pretok_from_gguf_name(const char *s, size_t n) {
#define IS(lit) (n == sizeof(lit) - 1 && memcmp(s, lit, n) == 0)
    if (IS("llama3") || IS("llama-bpe") || IS("llama-v3") || IS("smaug-bpe")) return MIM_PRE_LLAMA3;
    if (IS("qwen2") || IS("deepseek-r1-qwen")) return MIM_PRE_QWEN2;
    if (IS("smollm") || IS("starcoder") || IS("refact") || IS("codeshell")) return MIM_PRE_SMOLLM;
#undef IS
    return MIM_PRE_GPT2;
}

mi_status mim_tokenizer_from_gguf(const mim_gguf *g, mim_tokenizer **out, char *err, size_t cap) {
    *out = NULL;
    const char *model;
    size_t model_len;
    if (!mim_gguf_get_str(g, "tokenizer.ggml.model", &model, &model_len))
        return mim_fail(err, cap, MI_STATUS_PARSE_ERROR, "GGUF has no tokenizer.ggml.model");
    mim_tok_kind kind;
    if (model_len == 4 && memcmp(model, "gpt2", 4) == 0)
        kind = MIM_TOK_BYTE_BPE;
    else if (model_len == 5 && memcmp(model, "llama", 5) == 0)
        kind = MIM_TOK_SPM;
    else
        return mim_fail(err, cap, MI_STATUS_UNSUPPORTED,
                        "tokenizer model '%.*s' is not supported (gpt2 and llama are)",
                        (int)model_len, model);
    const mim_gguf_kv *toks = mim_gguf_find(g, "tokenizer.ggml.tokens");
    if (!toks || toks->type != MIM_GGUF_ARRAY || toks->array_type != MIM_GGUF_STRING ||
        toks->array_count == 0 || toks->array_count > INT32_MAX)
        return mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                        "GGUF tokenizer.ggml.tokens is missing or not a string array");
    int32_t nv = (int32_t)toks->array_count;
    size_t total = 0;
    const unsigned char *cur = toks->value;
    for (int32_t i = 0; i < nv; i++) {
        const char *s;
        size_t n;
        mim_gguf_next_str(&cur, &s, &n);
        total += n;
    }
    mim_tokenizer *t = alloc_tokenizer(nv, total);
    if (!t) return mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory for the vocabulary");
    t->kind = kind;
    char *a = t->arena;
    cur = toks->value;
    for (int32_t i = 0; i < nv; i++) {
        const char *s;
        size_t n;
        mim_gguf_next_str(&cur, &s, &n);
        memcpy(a, s, n);
        a[n] = 0;
        t->text[i] = a;
        t->len[i] = (uint32_t)n;
        a += n + 1;
    }
    mi_status st = MI_STATUS_SUCCESS;
    for (int32_t i = 0; i < nv; i++)
        if (!mim_strmap_put(&t->vocab, t->text[i], t->len[i], i)) {
            st = mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory");
            goto fail;
        }
    const mim_gguf_kv *types = mim_gguf_find(g, "tokenizer.ggml.token_type");
    if (types && types->type == MIM_GGUF_ARRAY && types->array_count == (uint64_t)nv)
        for (int32_t i = 0; i < nv; i++) {
            const double x = mim_gguf_array_num(types, (uint64_t)i);
            if (!(x >= INT32_MIN && x <= INT32_MAX)) { /* NaN too */
                st = mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                              "GGUF token %d has type %g, not an integer type", i, x);
                goto fail;
            }
            t->type[i] = (int32_t)x;
        }
    const mim_gguf_kv *scores = mim_gguf_find(g, "tokenizer.ggml.scores");
    if (scores && scores->type == MIM_GGUF_ARRAY && scores->array_count == (uint64_t)nv)
        for (int32_t i = 0; i < nv; i++) {
            const double x = mim_gguf_array_num(scores, (uint64_t)i);
            if (isnan(x) || fabs(x) > FLT_MAX) { /* a float cannot hold it */
                st = mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                              "GGUF token %d has score %g, outside a float's range", i, x);
                goto fail;
            }
            t->score[i] = (float)x;
        }
    if (kind == MIM_TOK_BYTE_BPE) {
        const char *pre = "default";
        size_t pre_len = 7;
        mim_gguf_get_str(g, "tokenizer.ggml.pre", &pre, &pre_len);
        t->pre = pretok_from_gguf_name(pre, pre_len);
        const mim_gguf_kv *merges = mim_gguf_find(g, "tokenizer.ggml.merges");
        if (!merges || merges->type != MIM_GGUF_ARRAY || merges->array_type != MIM_GGUF_STRING) {
            st = mim_fail(err, cap, MI_STATUS_PARSE_ERROR, "GGUF BPE tokenizer has no merges");
            goto fail;
        }
        if (!mim_pairmap_init(&t->merges, merges->array_count)) {
            st = mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory");
            goto fail;
        }
        cur = merges->value;
        for (uint64_t r = 0; r < merges->array_count; r++) {
            const char *s;
            size_t n;
            mim_gguf_next_str(&cur, &s, &n);
            const char *sp = memchr(s, ' ', n);
            if (!sp) continue;
            int32_t l = mim_strmap_get(&t->vocab, s, (size_t)(sp - s));
            int32_t rr = mim_strmap_get(&t->vocab, sp + 1, n - (size_t)(sp - s) - 1);
            /* The merged token is the two halves without the space. */
            char tmp[512];
            if (l < 0 || rr < 0 || n > sizeof(tmp)) continue;
            memcpy(tmp, s, (size_t)(sp - s));
            memcpy(tmp + (sp - s), sp + 1, n - (size_t)(sp - s) - 1);
            int32_t m = mim_strmap_get(&t->vocab, tmp, n - 1);
            if (m < 0) continue;
            if (!mim_pairmap_put(&t->merges, ((uint64_t)(uint32_t)l << 32) | (uint32_t)rr,
                                 (int32_t)r, m)) {
                st = mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory");
                goto fail;
            }
        }
    }
    /* A special id outside the vocabulary would be emitted as a token the model has no row
     * for, so it is refused; -1 is the "none" other writers use. */
    static const struct {
        const char *key;
        size_t field;
    } special[] = {{"tokenizer.ggml.bos_token_id", offsetof(mim_tokenizer, bos)},
                   {"tokenizer.ggml.eos_token_id", offsetof(mim_tokenizer, eos)},
                   {"tokenizer.ggml.eot_token_id", offsetof(mim_tokenizer, eot)},
                   {"tokenizer.ggml.unknown_token_id", offsetof(mim_tokenizer, unk)}};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) {
        int64_t v;
        if (!mim_gguf_get_i64(g, special[i].key, &v) || v == -1) continue;
        if (v < 0 || v >= nv) {
            st = mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                          "GGUF corrupt: %s is %lld, outside the vocabulary of %d tokens",
                          special[i].key, (long long)v, (int)nv);
            goto fail;
        }
        *(int32_t *)((char *)t + special[i].field) = (int32_t)v;
    }
    bool b;
    t->add_bos = kind == MIM_TOK_SPM || t->pre == MIM_PRE_LLAMA3;
    if (mim_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b)) t->add_bos = b;
    t->add_space_prefix = kind == MIM_TOK_SPM;
    if (mim_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &b)) t->add_space_prefix = b;
    if (!finish(t, err, cap, &st)) goto fail;
    *out = t;
    return MI_STATUS_SUCCESS;
fail:
    mim_tokenizer_free(t);
    return st;
}

/* ------------------------------------------------------------------------------------------ */
/* tokenizer.json                                                                              */

static bool json_has_text(json_t *node, const char *needle) {
    if (!node) return false;
    char *s = json_dumps(node, JSON_COMPACT);
    bool hit = s && strstr(s, needle);
    free(s);
    return hit;
}

mi_status mim_tokenizer_from_json(const char *text, size_t tlen, mim_tokenizer **out, char *err,
                                  size_t cap) {
    *out = NULL;
    json_error_t jerr;
    json_t *root = json_loadb(text, tlen, 0, &jerr);
    if (!root)
        return mim_fail(err, cap, MI_STATUS_PARSE_ERROR, "tokenizer.json: %s (line %d)", jerr.text,
                        jerr.line);
    mim_tokenizer *t = NULL;
    mi_status st = MI_STATUS_SUCCESS;
    json_t *model = json_object_get(root, "model");
    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    json_t *added = json_object_get(root, "added_tokens");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (!mtype || strcmp(mtype, "BPE") != 0 || !json_is_object(vocab) || !json_is_array(merges)) {
        st = mim_fail(err, cap, MI_STATUS_UNSUPPORTED,
                      "tokenizer.json: model type '%s' is not supported (BPE with vocab and "
                      "merges is)",
                      mtype ? mtype : "?");
        goto done;
    }
    /* Vocabulary size: the largest id over vocab and added tokens, plus one. */
    int64_t nv = 0;
    size_t total = 0;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 ||
            json_integer_value(val) >= INT32_MAX) {
            st = mim_fail(err, cap, MI_STATUS_PARSE_ERROR, "tokenizer.json: bad id for '%s'", key);
            goto done;
        }
        if (json_integer_value(val) + 1 > nv) nv = json_integer_value(val) + 1;
        total += strlen(key);
    }
    size_t i;
    json_array_foreach(added, i, val) {
        json_t *id = json_object_get(val, "id");
        const char *content = json_string_value(json_object_get(val, "content"));
        if (!json_is_integer(id) || !content || json_integer_value(id) < 0 ||
            json_integer_value(id) >= INT32_MAX) {
            st = mim_fail(err, cap, MI_STATUS_PARSE_ERROR, "tokenizer.json: bad added token");
            goto done;
        }
        if (json_integer_value(id) + 1 > nv) nv = json_integer_value(id) + 1;
        total += strlen(content);
    }
    /* Ids index per-token arrays, so the largest id sizes them: a few holes are normal (reserved
     * ids), but a lone huge id would ask for gigabytes from a tiny file. */
    const int64_t n_entries = (int64_t)json_object_size(vocab) + (int64_t)json_array_size(added);
    if (nv > 2 * n_entries + 1024) {
        st = mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                      "tokenizer.json: id %lld leaves more unused ids than the file has tokens "
                      "(%lld)",
                      (long long)(nv - 1), (long long)n_entries);
        goto done;
    }
    t = alloc_tokenizer((int32_t)nv, total * 2);
    if (!t) {
        st = mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    char *a = t->arena;
    json_object_foreach(vocab, key, val) {
        int32_t id = (int32_t)json_integer_value(val);
        size_t n = strlen(key);
        memcpy(a, key, n + 1);
        t->text[id] = a;
        t->len[id] = (uint32_t)n;
        a += n + 1;
    }
    json_array_foreach(added, i, val) {
        int32_t id = (int32_t)json_integer_value(json_object_get(val, "id"));
        const char *content = json_string_value(json_object_get(val, "content"));
        size_t n = strlen(content);
        memcpy(a, content, n + 1);
        t->text[id] = a;
        t->len[id] = (uint32_t)n;
        t->type[id] =
            json_is_true(json_object_get(val, "special")) ? MIM_TT_CONTROL : MIM_TT_USER_DEFINED;
        a += n + 1;
    }
    for (int32_t k = 0; k < t->n_vocab; k++) {
        if (!t->text[k]) { /* a hole in the id space */
            t->text[k] = "";
            t->type[k] = MIM_TT_UNUSED;
            continue;
        }
        if (!mim_strmap_put(&t->vocab, t->text[k], t->len[k], k)) {
            st = mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory");
            goto done;
        }
    }
    json_t *pre = json_object_get(root, "pre_tokenizer");
    json_t *norm = json_object_get(root, "normalizer");
    bool byte_level = json_has_text(pre, "\"ByteLevel\"");
    t->kind = byte_level ? MIM_TOK_BYTE_BPE : MIM_TOK_SPM;
    if (!byte_level && !json_is_true(json_object_get(model, "byte_fallback")) &&
        !json_has_text(norm, "\\u2581") && !json_has_text(norm, SPM_SPACE)) {
        st = mim_fail(err, cap, MI_STATUS_UNSUPPORTED,
                      "tokenizer.json: neither byte-level nor SentencePiece-style BPE");
        goto done;
    }
    if (byte_level) {
        if (json_has_text(pre, "\"Digits\""))
            t->pre = MIM_PRE_SMOLLM;
        else if (json_has_text(pre, "\\\\p{N}{1,3}"))
            t->pre = MIM_PRE_LLAMA3;
        else if (json_has_text(pre, "\\\\p{N}|"))
            t->pre = MIM_PRE_QWEN2;
        else
            t->pre = MIM_PRE_GPT2;
    } else {
        t->add_space_prefix = json_has_text(norm, "Prepend");
    }
    if (!mim_pairmap_init(&t->merges, json_array_size(merges))) {
        st = mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    json_array_foreach(merges, i, val) {
        const char *l = NULL, *r = NULL;
        size_t ll = 0, rl = 0;
        char tmp[1024];
        if (json_is_string(val)) {
            const char *s = json_string_value(val);
            const char *sp = strchr(s, ' ');
            if (!sp) continue;
            l = s;
            ll = (size_t)(sp - s);
            r = sp + 1;
            rl = strlen(r);
        } else if (json_is_array(val) && json_array_size(val) == 2) {
            l = json_string_value(json_array_get(val, 0));
            r = json_string_value(json_array_get(val, 1));
            if (!l || !r) continue;
            ll = strlen(l);
            rl = strlen(r);
        } else {
            continue;
        }
        if (ll + rl > sizeof(tmp)) continue;
        int32_t li = mim_strmap_get(&t->vocab, l, ll), ri = mim_strmap_get(&t->vocab, r, rl);
        memcpy(tmp, l, ll);
        memcpy(tmp + ll, r, rl);
        int32_t m = mim_strmap_get(&t->vocab, tmp, ll + rl);
        if (li < 0 || ri < 0 || m < 0) continue;
        if (!mim_pairmap_put(&t->merges, ((uint64_t)(uint32_t)li << 32) | (uint32_t)ri, (int32_t)i,
                             m)) {
            st = mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory");
            goto done;
        }
    }
    json_t *unk = json_object_get(model, "unk_token");
    if (json_is_string(unk)) {
        t->unk = mim_tokenizer_find(t, json_string_value(unk));
        if (t->unk < 0) {
            st = mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                          "tokenizer.json: model.unk_token '%.64s' is not in the vocabulary",
                          json_string_value(unk));
            goto done;
        }
    }
    /* BOS: a TemplateProcessing post-processor that starts "single" with a special token. */
    json_t *post = json_object_get(root, "post_processor");
    json_t *single = json_object_get(post, "single");
    if (!single) {
        json_t *procs = json_object_get(post, "processors");
        json_array_foreach(procs, i, val) {
            if (json_object_get(val, "single")) single = json_object_get(val, "single");
        }
    }
    json_t *first = json_array_get(single, 0);
    json_t *sp = json_object_get(first, "SpecialToken");
    if (sp) {
        const char *bos = json_string_value(json_object_get(sp, "id"));
        if (bos) {
            t->bos = mim_tokenizer_find(t, bos);
            t->add_bos = t->bos >= 0;
        }
    }
    if (!finish(t, err, cap, &st)) goto done;
    *out = t;
    t = NULL;
done:
    mim_tokenizer_free(t);
    json_decref(root);
    return st;
}
