/*
 * cmd_scbench_score.c: the scores of SCBench's tasks, as the benchmark's scorer defines them
 * (docs/scbench.md lists each task's rule). Text is UTF-8; case folding and the character
 * classes of the rules are ASCII (the original's are Unicode: they differ only on non-ASCII
 * letters, which the English tasks' answers do not contain). Where the original iterates a
 * label that is a string, it iterates its characters: so does this file.
 */
#define _POSIX_C_SOURCE 200809L
#include "cmd_scbench.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* UTF-8 and character classes                                                                 */

/* The code point at s (advancing *len bytes); invalid bytes are taken one by one. */
static uint32_t utf8_next(const char *s, int *len) {
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80) return *len = 1, u[0];
    int n = (u[0] & 0xE0) == 0xC0 ? 2 : (u[0] & 0xF0) == 0xE0 ? 3 : (u[0] & 0xF8) == 0xF0 ? 4 : 1;
    uint32_t cp = n == 2 ? u[0] & 0x1Fu : n == 3 ? u[0] & 0x0Fu : u[0] & 0x07u;
    for (int i = 1; i < n; i++) {
        if ((u[i] & 0xC0) != 0x80) return *len = 1, u[0];
        cp = (cp << 6) | (u[i] & 0x3Fu);
    }
    if (n == 1) return *len = 1, u[0];
    return *len = n, cp;
}

/* Python's str.isspace() over the code points a string of text meets. */
static bool is_space_cp(uint32_t c) {
    return (c >= 9 && c <= 13) || c == ' ' || (c >= 0x1C && c <= 0x1F) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

/* str.strip(): [*b, *e) without leading and trailing whitespace. */
static void strip_span(const char *s, const char **b, const char **e) {
    const char *p = s, *end = s + strlen(s), *last = s;
    while (*p) {
        int l;
        const uint32_t c = utf8_next(p, &l);
        if (!is_space_cp(c)) break;
        p += l;
    }
    *b = p;
    last = p;
    while (p < end) {
        int l;
        const uint32_t c = utf8_next(p, &l);
        p += l;
        if (!is_space_cp(c)) last = p;
    }
    *e = last;
}

static char *dup_span(const char *b, const char *e) {
    char *r = malloc((size_t)(e - b) + 1);
    if (!r) return NULL;
    memcpy(r, b, (size_t)(e - b));
    r[e - b] = 0;
    return r;
}

static char *dup_lower(const char *s) {
    char *r = strdup(s);
    if (r)
        for (char *p = r; *p; p++) *p = (char)tolower((unsigned char)*p);
    return r;
}

static char *dup_upper_stripped(const char *s) {
    const char *b, *e;
    strip_span(s, &b, &e);
    char *r = dup_span(b, e);
    if (r)
        for (char *p = r; *p; p++) *p = (char)toupper((unsigned char)*p);
    return r;
}

/* Whitespace-separated words of s (Python's split()): pointers into a copy the caller frees
 * (*buf), *n words. */
static char **split_words(const char *s, char **buf, int *n) {
    *buf = strdup(s);
    *n = 0;
    if (!*buf) return NULL;
    size_t cap = 16;
    char **w = malloc(cap * sizeof *w);
    if (!w) return NULL;
    char *p = *buf;
    while (*p) {
        int l;
        while (*p && is_space_cp(utf8_next(p, &l))) {
            for (int i = 0; i < l; i++) p[i] = 0;
            p += l;
        }
        if (!*p) break;
        if ((size_t)*n == cap) {
            char **t = realloc(w, (cap *= 2) * sizeof *w);
            if (!t) return free(w), NULL;
            w = t;
        }
        w[(*n)++] = p;
        while (*p && !is_space_cp(utf8_next(p, &l))) p += l;
    }
    return w;
}

/* ------------------------------------------------------------------------------------------ */
/* QA F1                                                                                       */

char *sc_normalize_answer(const char *s) {
    if (!s) return NULL;
    char *low = dup_lower(s);
    if (!low) return NULL;
    /* punctuation out (string.punctuation is ASCII ispunct) */
    char *q = low;
    for (const char *p = low; *p; p++)
        if (!ispunct((unsigned char)*p)) *q++ = *p;
    *q = 0;
    /* what is left is word characters and whitespace: the articles are whole words */
    char *buf;
    int n;
    char **w = split_words(low, &buf, &n);
    free(low);
    char *out = malloc(strlen(s) + 1);
    if (!w || !out) {
        free(w), free(buf), free(out);
        return NULL;
    }
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        if (!strcmp(w[i], "a") || !strcmp(w[i], "an") || !strcmp(w[i], "the")) continue;
        if (o) out[o++] = ' ';
        const size_t l = strlen(w[i]);
        memcpy(out + o, w[i], l);
        o += l;
    }
    out[o] = 0;
    free(w), free(buf);
    return out;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmp_u32(const void *a, const void *b) {
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static double f1_of(int common, int np, int ng) {
    if (common == 0) return 0;
    const double prec = (double)common / np, rec = (double)common / ng;
    return 2 * prec * rec / (prec + rec);
}

/* Size of the multiset intersection of two sorted arrays. */
static int common_sorted_str(char **a, int na, char **b, int nb) {
    int i = 0, j = 0, c = 0;
    while (i < na && j < nb) {
        const int d = strcmp(a[i], b[j]);
        if (d == 0)
            c++, i++, j++;
        else if (d < 0)
            i++;
        else
            j++;
    }
    return c;
}

double sc_qa_f1(const char *pred, const char *const *truths, int n) {
    if (!pred || !truths) return 0;
    char *np = sc_normalize_answer(pred);
    char *pbuf = NULL;
    int npw = 0;
    char **pw = np ? split_words(np, &pbuf, &npw) : NULL;
    double best = 0;
    if (pw) qsort(pw, (size_t)npw, sizeof *pw, cmp_str);
    for (int t = 0; pw && t < n; t++) {
        char *ng = sc_normalize_answer(truths[t]);
        char *gbuf = NULL;
        int ngw = 0;
        char **gw = ng ? split_words(ng, &gbuf, &ngw) : NULL;
        if (gw) {
            qsort(gw, (size_t)ngw, sizeof *gw, cmp_str);
            const double f = f1_of(common_sorted_str(pw, npw, gw, ngw), npw, ngw);
            if (f > best) best = f;
        }
        free(gw), free(gbuf), free(ng);
    }
    free(pw), free(pbuf), free(np);
    return best;
}

/* The punctuation the Chinese normalisation drops besides ASCII's. */
static const char zh_punct[] =
    "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣､、〃》"
    "「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿–—‘’‛“”„‟…‧﹏.";

static bool is_zh_punct(uint32_t c) {
    if (c < 0x80) return ispunct((int)c) != 0;
    for (const char *p = zh_punct; *p;) {
        int l;
        if (utf8_next(p, &l) == c) return true;
        p += l;
    }
    return false;
}

/* The code points of s, lower-cased, without whitespace or punctuation; sorted. */
static uint32_t *zh_chars(const char *s, int *n) {
    const size_t len = strlen(s);
    uint32_t *cp = malloc((len + 1) * sizeof *cp);
    *n = 0;
    if (!cp) return NULL;
    for (const char *p = s; *p;) {
        int l;
        uint32_t c = utf8_next(p, &l);
        p += l;
        if (c < 0x80) c = (uint32_t)tolower((int)c);
        if (is_space_cp(c) || is_zh_punct(c)) continue;
        cp[(*n)++] = c;
    }
    qsort(cp, (size_t)*n, sizeof *cp, cmp_u32);
    return cp;
}

double sc_qa_f1_zh(const char *pred, const char *const *truths, int n) {
    if (!pred || !truths) return 0;
    int np;
    uint32_t *p = zh_chars(pred, &np);
    double best = 0;
    for (int t = 0; p && t < n; t++) {
        int ng;
        uint32_t *g = zh_chars(truths[t], &ng);
        if (!g) continue;
        int i = 0, j = 0, c = 0;
        while (i < np && j < ng) {
            if (p[i] == g[j])
                c++, i++, j++;
            else if (p[i] < g[j])
                i++;
            else
                j++;
        }
        const double f = f1_of(c, np, ng);
        if (f > best) best = f;
        free(g);
    }
    free(p);
    return best;
}

/* ------------------------------------------------------------------------------------------ */
/* Matches                                                                                     */

double sc_string_match_all(const char *pred, const char *const *refs, int n) {
    if (!pred || !refs || n <= 0) return 0;
    char *lp = dup_lower(pred);
    if (!lp) return 0;
    int hit = 0;
    for (int i = 0; i < n; i++) {
        char *lr = dup_lower(refs[i]);
        if (lr && strstr(lp, lr)) hit++;
        free(lr);
    }
    free(lp);
    /* round(x, 2): to nearest, ties to even, as Python's round on these exact fractions */
    return nearbyint((double)hit / n * 100.0) / 100.0;
}

void sc_first_int(const char *s, char *out, size_t cap) {
    if (!out || cap == 0) return;
    out[0] = 0;
    if (!s) return;
    while (*s && !(*s >= '0' && *s <= '9')) s++;
    size_t i = 0;
    while (*s >= '0' && *s <= '9') {
        if (i + 1 < cap) out[i++] = *s;
        s++;
    }
    out[i] = 0;
}

bool sc_math_find(const char *pred, double label, bool label_is_int) {
    if (!pred) return false;
    const char *p = pred;
    while (*p && !(*p >= '0' && *p <= '9')) p++;
    if (!*p) return false;
    const char *e = p;
    while (*e >= '0' && *e <= '9') e++;
    if (e[0] == '.' && e[1] >= '0' && e[1] <= '9') {
        e++;
        while (*e >= '0' && *e <= '9') e++;
    }
    char buf[64];
    const size_t l = (size_t)(e - p) < sizeof buf - 1 ? (size_t)(e - p) : sizeof buf - 1;
    memcpy(buf, p, l);
    buf[l] = 0;
    const double v = strtod(buf, NULL);
    return label_is_int ? trunc(v) == label : v == label;
}

bool sc_any_item_in(const char *pred, const char *const *items, int n) {
    if (!pred || !items) return false;
    char *up = dup_upper_stripped(pred);
    bool hit = false;
    for (int i = 0; up && i < n && !hit; i++) {
        char *it = strdup(items[i]);
        if (!it) break;
        for (char *q = it; *q; q++) *q = (char)toupper((unsigned char)*q);
        hit = strstr(up, it) != NULL;
        free(it);
    }
    free(up);
    return hit;
}

static bool in_labels(const char *s, const char *const *labels, int n) {
    for (int i = 0; i < n; i++)
        if (!strcmp(s, labels[i])) return true;
    return false;
}

/* s with every occurrence of each byte of chars replaced by a space, then runs of two spaces
 * folded (Python's replace loop), in place. */
static void blank_and_fold(char *s, const char *chars) {
    for (char *p = s; *p; p++)
        if (strchr(chars, *p)) *p = ' ';
    char *q = s;
    for (const char *p = s; *p; p++) {
        if (*p == ' ' && q > s && q[-1] == ' ') continue;
        *q++ = *p;
    }
    *q = 0;
}

bool sc_choice(const char *pred, const char *const *labels, int n) {
    if (!pred || !labels) return false;
    const char *b, *e;
    strip_span(pred, &b, &e);
    if (b == e) return false;
    if (strchr("ABCD", *b)) {
        const char first[2] = {*b, 0};
        return in_labels(first, labels, n);
    }
    char *p = dup_span(b, e);
    if (!p) return false;
    bool r = false;
    if (in_labels(p, labels, n)) {
        r = true;
        goto done;
    }
    blank_and_fold(p, "\n\"'.,?!{}");
    static const char *const prefixes[] = {"answer is:", "answer:", "answer is", "option is"};
    for (int k = 0; k < 4; k++) {
        const char *at = strstr(p, prefixes[k]);
        if (!at) continue;
        const char *after = at + strlen(prefixes[k]);
        if (!*after) goto done; /* ends with the prefix */
        int l;
        utf8_next(after, &l);
        after += l;
        for (int i = 0; i < n; i++)
            if (!strncmp(after, labels[i], strlen(labels[i]))) {
                r = true;
                break;
            }
        goto done;
    }
    {
        char *buf;
        int nw;
        char **w = split_words(p, &buf, &nw);
        for (int i = 0; w && i < nw; i++)
            if (strstr("ABCD", w[i])) {
                r = in_labels(w[i], labels, n);
                break;
            }
        free(w), free(buf);
    }
done:
    free(p);
    return r;
}

/* ------------------------------------------------------------------------------------------ */
/* Token interning (ROUGE and BLEU compare tokens by id)                                       */

typedef struct interner {
    const char **keys; /* [cap]; NULL: empty slot */
    int *ids;
    size_t cap;
    int n;
} interner;

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int intern(interner *in, const char *s) {
    if ((size_t)in->n * 2 + 2 > in->cap) {
        const size_t nc = in->cap ? in->cap * 2 : 256;
        const char **nk = calloc(nc, sizeof *nk);
        int *ni = calloc(nc, sizeof *ni);
        if (!nk || !ni) return free(nk), free(ni), -1;
        for (size_t i = 0; i < in->cap; i++)
            if (in->keys[i]) {
                size_t j = hash_str(in->keys[i]) & (nc - 1);
                while (nk[j]) j = (j + 1) & (nc - 1);
                nk[j] = in->keys[i], ni[j] = in->ids[i];
            }
        free(in->keys), free(in->ids);
        in->keys = nk, in->ids = ni, in->cap = nc;
    }
    size_t j = hash_str(s) & (in->cap - 1);
    while (in->keys[j]) {
        if (!strcmp(in->keys[j], s)) return in->ids[j];
        j = (j + 1) & (in->cap - 1);
    }
    in->keys[j] = s;
    return in->ids[j] = in->n++;
}

static void interner_free(interner *in) { free(in->keys), free(in->ids); }

/* ------------------------------------------------------------------------------------------ */
/* ROUGE-Lsum                                                                                  */

/* One sentence's tokens: lower-cased, every run of characters other than [a-z0-9] a break.
 * The token strings live in *buf (the caller frees it). */
static int *rouge_tokens(const char *b, const char *e, interner *in, char **buf, int *n) {
    *n = 0;
    *buf = malloc((size_t)(e - b) + 1);
    int *ids = malloc(((size_t)(e - b) / 2 + 1) * sizeof *ids);
    if (!*buf || !ids) return free(ids), NULL;
    char *o = *buf;
    const char *p = b;
    while (p < e) {
        while (p < e && !isalnum((unsigned char)*p)) p++;
        if (p >= e) break;
        char *start = o;
        while (p < e && isalnum((unsigned char)*p)) *o++ = (char)tolower((unsigned char)*p++);
        *o++ = 0;
        const int id = intern(in, start);
        if (id < 0) return free(ids), NULL;
        ids[(*n)++] = id;
    }
    return ids;
}

typedef struct sents {
    int **tok; /* [n][len[i]] */
    int *len;
    char **bufs;
    int n;
} sents;

static void sents_free(sents *s) {
    for (int i = 0; i < s->n; i++) free(s->tok[i]), free(s->bufs[i]);
    free(s->tok), free(s->len), free(s->bufs);
}

/* The newline-separated, non-empty sentences of text, tokenized. */
static bool rouge_sents(const char *text, interner *in, sents *out) {
    memset(out, 0, sizeof *out);
    int cap = 1;
    for (const char *p = text; *p; p++) cap += *p == '\n';
    out->tok = calloc((size_t)cap, sizeof *out->tok);
    out->len = calloc((size_t)cap, sizeof *out->len);
    out->bufs = calloc((size_t)cap, sizeof *out->bufs);
    if (!out->tok || !out->len || !out->bufs) return false;
    const char *p = text;
    for (;;) {
        const char *e = strchr(p, '\n');
        if (!e) e = p + strlen(p);
        if (e > p) {
            const int i = out->n++;
            out->tok[i] = rouge_tokens(p, e, in, &out->bufs[i], &out->len[i]);
            if (!out->tok[i]) return false;
        }
        if (!*e) break;
        p = e + 1;
    }
    return true;
}

/* Indices into r of one longest common subsequence of r and c, backtracked as the reference
 * scorer does (ties move along c first only when strictly better). */
static int lcs_indices(const int *r, int nr, const int *c, int nc, int *out) {
    int *t = calloc((size_t)(nr + 1) * (size_t)(nc + 1), sizeof *t);
    if (!t) return -1;
#define T(i, j) t[(size_t)(i) * (size_t)(nc + 1) + (size_t)(j)]
    for (int i = 1; i <= nr; i++)
        for (int j = 1; j <= nc; j++)
            T(i, j) = r[i - 1] == c[j - 1]        ? T(i - 1, j - 1) + 1
                      : T(i - 1, j) > T(i, j - 1) ? T(i - 1, j)
                                                  : T(i, j - 1);
    int i = nr, j = nc, k = T(nr, nc);
    const int len = k;
    while (i > 0 && j > 0) {
        if (r[i - 1] == c[j - 1])
            out[--k] = i - 1, i--, j--;
        else if (T(i, j - 1) > T(i - 1, j))
            j--;
        else
            i--;
    }
#undef T
    free(t);
    return len;
}

double sc_rouge_lsum(const char *pred, const char *ref) {
    if (!pred || !ref) return 0;
    interner in = {0};
    sents R, C;
    double f = 0;
    const bool ok = rouge_sents(ref, &in, &R) & rouge_sents(pred, &in, &C);
    int m = 0, n = 0;
    for (int i = 0; ok && i < R.n; i++) m += R.len[i];
    for (int i = 0; ok && i < C.n; i++) n += C.len[i];
    if (ok && R.n && C.n && m && n) {
        int *cnt_r = calloc((size_t)in.n, sizeof *cnt_r),
            *cnt_c = calloc((size_t)in.n, sizeof *cnt_c);
        int maxr = 0;
        for (int i = 0; i < R.n; i++) maxr = R.len[i] > maxr ? R.len[i] : maxr;
        char *mark = calloc((size_t)maxr + 1, 1);
        int *idx = malloc(((size_t)maxr + 1) * sizeof *idx);
        if (cnt_r && cnt_c && mark && idx) {
            for (int i = 0; i < R.n; i++)
                for (int k = 0; k < R.len[i]; k++) cnt_r[R.tok[i][k]]++;
            for (int i = 0; i < C.n; i++)
                for (int k = 0; k < C.len[i]; k++) cnt_c[C.tok[i][k]]++;
            int hits = 0;
            for (int i = 0; i < R.n; i++) {
                /* the union over candidate sentences of the LCS positions in this reference */
                memset(mark, 0, (size_t)R.len[i]);
                for (int j = 0; j < C.n; j++) {
                    const int l = lcs_indices(R.tok[i], R.len[i], C.tok[j], C.len[j], idx);
                    for (int k = 0; k < l; k++) mark[idx[k]] = 1;
                }
                for (int k = 0; k < R.len[i]; k++) {
                    if (!mark[k]) continue;
                    const int t = R.tok[i][k];
                    if (cnt_c[t] > 0 && cnt_r[t] > 0) hits++, cnt_c[t]--, cnt_r[t]--;
                }
            }
            const double rec = (double)hits / m, prec = (double)hits / n;
            f = prec + rec > 0 ? 2 * prec * rec / (prec + rec) : 0;
        }
        free(cnt_r), free(cnt_c), free(mark), free(idx);
    }
    sents_free(&R), sents_free(&C);
    interner_free(&in);
    return f;
}

/* ------------------------------------------------------------------------------------------ */
/* BLEU                                                                                        */

/* re.split(r"\s+", s.strip()) as token ids: an empty text is one empty token. */
static int *ws_tokens(const char *s, interner *in, char **buf, int *n) {
    const char *b, *e;
    strip_span(s, &b, &e);
    char *span = dup_span(b, e);
    *buf = NULL;
    *n = 0;
    if (!span) return NULL;
    int nw;
    char **w = split_words(span, buf, &nw);
    free(span);
    int *ids = malloc(((size_t)nw + 1) * sizeof *ids);
    if (!w || !ids) return free(w), free(ids), NULL;
    if (nw == 0) {
        const int id = intern(in, "");
        ids[0] = id, *n = 1;
    }
    for (int i = 0; i < nw; i++) ids[(*n)++] = intern(in, w[i]);
    free(w);
    return ids;
}

static int ngram_len_; /* the n of the n-gram comparison below */

static int cmp_ngram(const void *a, const void *b) {
    const int *x = *(int *const *)a, *y = *(int *const *)b;
    for (int k = 0; k < ngram_len_; k++)
        if (x[k] != y[k]) return (x[k] > y[k]) - (x[k] < y[k]);
    return 0;
}

/* Clipped n-gram matches of hyp against ref (numerator of the modified precision). */
static long clipped_matches(const int *hyp, int nh, const int *ref, int nr, int n) {
    if (nh < n) return 0;
    const int ch = nh - n + 1, cr = nr >= n ? nr - n + 1 : 0;
    const int **h = malloc((size_t)ch * sizeof *h), **r = malloc(((size_t)cr + 1) * sizeof *r);
    if (!h || !r) return free(h), free(r), 0;
    for (int i = 0; i < ch; i++) h[i] = hyp + i;
    for (int i = 0; i < cr; i++) r[i] = ref + i;
    ngram_len_ = n;
    qsort(h, (size_t)ch, sizeof *h, cmp_ngram);
    qsort(r, (size_t)cr, sizeof *r, cmp_ngram);
    long m = 0;
    int i = 0, j = 0;
    while (i < ch && j < cr) {
        const int d = cmp_ngram(&h[i], &r[j]);
        if (d == 0)
            m++, i++, j++;
        else if (d < 0)
            i++;
        else
            j++;
    }
    free(h), free(r);
    return m;
}

double sc_bleu(const char *candidate, const char *reference) {
    if (!candidate || !reference) return 0;
    interner in = {0};
    char *bh, *br;
    int nh, nr;
    int *h = ws_tokens(candidate, &in, &bh, &nh);
    int *r = ws_tokens(reference, &in, &br, &nr);
    double score = 0;
    if (h && r) {
        long num[5] = {0}, den[5] = {0};
        for (int n = 1; n <= 4; n++) {
            num[n] = clipped_matches(h, nh, r, nr, n);
            const long total = nh >= n ? nh - n + 1 : 0;
            den[n] = total > 1 ? total : 1;
        }
        if (num[1] > 0) {
            const double bp = nh > nr ? 1.0 : nh == 0 ? 0.0 : exp(1.0 - (double)nr / nh);
            double p[5], s = 0;
            int incvnt = 1;
            for (int n = 1; n <= 4; n++) {
                p[n] = (double)num[n] / (double)den[n];
                /* method 4: a smaller count for a shorter hypothesis, halved per miss */
                if (num[n] == 0 && nh > 1) {
                    p[n] = 1.0 / (pow(2.0, incvnt) * 5.0 / log((double)nh)) / (double)den[n];
                    incvnt++;
                }
                if (p[n] > 0) s += 0.25 * log(p[n]); /* a zero precision drops out */
            }
            score = bp * exp(s);
        }
    }
    free(h), free(r), free(bh), free(br);
    interner_free(&in);
    return score;
}

/* ------------------------------------------------------------------------------------------ */
/* RepoQA                                                                                      */

static bool at_line_start(const char *s, const char *p) { return p == s || p[-1] == '\n'; }

/* The first Python function of block [b, e) (from its def to its last body line), or NULL. */
static char *first_function(const char *b, const char *e) {
    for (const char *line = b; line < e;) {
        const char *nl = memchr(line, '\n', (size_t)(e - line));
        const char *le = nl ? nl : e;
        const char *k = line;
        while (k < le && (*k == ' ' || *k == '\t')) k++;
        const int indent = (int)(k - line);
        const bool is_def = (le - k > 4 && !strncmp(k, "def ", 4)) ||
                            (le - k > 10 && !strncmp(k, "async def ", 10));
        if (!is_def) {
            line = nl ? nl + 1 : e;
            continue;
        }
        /* the header ends at the ':' outside brackets */
        int depth = 0;
        const char *p = k;
        for (; p < e; p++) {
            if (*p == '(' || *p == '[' || *p == '{')
                depth++;
            else if (*p == ')' || *p == ']' || *p == '}')
                depth--;
            else if (*p == ':' && depth <= 0)
                break;
        }
        if (p >= e) return dup_span(k, e);
        const char *hl_end = memchr(p, '\n', (size_t)(e - p));
        if (!hl_end) hl_end = e;
        const char *q = p + 1;
        while (q < hl_end && (*q == ' ' || *q == '\t')) q++;
        const char *end = hl_end;
        if (q < hl_end && *q != '#') {
            /* a one-line body */
        } else {
            /* body: the lines indented deeper than the def (blank lines inside it) */
            const char *l2 = hl_end < e ? hl_end + 1 : e;
            while (l2 < e) {
                const char *n2 = memchr(l2, '\n', (size_t)(e - l2));
                const char *e2 = n2 ? n2 : e;
                const char *k2 = l2;
                while (k2 < e2 && (*k2 == ' ' || *k2 == '\t')) k2++;
                if (k2 < e2) {
                    if ((int)(k2 - l2) <= indent) break;
                    end = e2;
                }
                l2 = n2 ? n2 + 1 : e;
            }
        }
        while (end > k && isspace((unsigned char)end[-1])) end--;
        return dup_span(k, end);
    }
    return NULL;
}

char *sc_repoqa_extract(const char *output) {
    if (!output) return NULL;
    const char *b, *e;
    strip_span(output, &b, &e);
    char *s = dup_span(b, e);
    if (!s) return NULL;
    const char *first_b = NULL, *first_e = NULL;
    for (const char *p = s; *p;) {
        if (at_line_start(s, p) && !strncmp(p, "```", 3)) {
            const char *q = p + 3;
            while (isalnum((unsigned char)*q) || *q == '_') q++;
            const char *ws = q, *last_nl = NULL;
            while (*ws && isspace((unsigned char)*ws)) {
                if (*ws == '\n') last_nl = ws;
                ws++;
            }
            if (last_nl) {
                const char *c = last_nl + 1, *f = c;
                while (*f && !(at_line_start(s, f) && !strncmp(f, "```", 3))) f++;
                if (*f) {
                    char *fn = first_function(c, f);
                    if (fn) return free(s), fn;
                    if (!first_b) first_b = c, first_e = f;
                    p = f + 3;
                    continue;
                }
            }
        }
        p++;
    }
    if (!first_b) return s;
    char *r = dup_span(first_b, first_e);
    free(s);
    return r;
}

bool sc_repoqa_pass(const char *output, const char *name, const sc_needle *needles, int n,
                    double *best_sim) {
    if (best_sim) *best_sim = 0;
    if (!output || !name || (!needles && n > 0)) return false;
    char *code = sc_repoqa_extract(output);
    if (!code) return false;
    double best = 0;
    const char *target = NULL;
    for (int i = 0; i < n; i++) {
        const double sim = sc_bleu(code, needles[i].code);
        if (sim > best) best = sim, target = needles[i].name;
    }
    free(code);
    if (best_sim) *best_sim = best;
    return target && !strcmp(target, name) && best >= 0.8;
}

/* ------------------------------------------------------------------------------------------ */
/* Dispatch                                                                                    */

/* A JSON scalar as Python's str() writes it (ints as digits, floats shortest round-trip). */
static char *json_str(const json_t *v) {
    char buf[64];
    if (json_is_string(v)) return strdup(json_string_value(v));
    if (json_is_integer(v)) {
        snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v));
        return strdup(buf);
    }
    if (json_is_real(v)) {
        const double d = json_real_value(v);
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(buf, sizeof buf, "%.*g", prec, d);
            if (strtod(buf, NULL) == d) break;
        }
        if (!strchr(buf, '.') && !strchr(buf, 'e') && !strchr(buf, 'n'))
            strncat(buf, ".0", sizeof buf - strlen(buf) - 1);
        return strdup(buf);
    }
    if (json_is_true(v)) return strdup("True");
    if (json_is_false(v)) return strdup("False");
    return strdup("");
}

typedef struct items {
    char **s;
    int n;
} items;

static void items_free(items *it) {
    for (int i = 0; i < it->n; i++) free(it->s[i]);
    free(it->s);
}

/* What Python's `for x in label` visits: a list's elements, a string's characters. */
static items label_items(const json_t *label) {
    items it = {0};
    if (json_is_array(label)) {
        const size_t n = json_array_size(label);
        it.s = calloc(n + 1, sizeof *it.s);
        for (size_t i = 0; it.s && i < n; i++) {
            it.s[i] = json_str(json_array_get(label, i));
            if (it.s[i]) it.n++;
        }
    } else if (json_is_string(label)) {
        const char *s = json_string_value(label);
        it.s = calloc(strlen(s) + 1, sizeof *it.s);
        for (const char *p = s; it.s && *p;) {
            int l;
            utf8_next(p, &l);
            it.s[it.n++] = dup_span(p, p + l);
            p += l;
        }
    } else if (label) {
        it.s = calloc(1, sizeof *it.s);
        if (it.s && (it.s[0] = json_str(label))) it.n = 1;
    }
    return it;
}

/* A list's first element, else the label itself, as a string. */
static char *label_first(const json_t *label) {
    if (json_is_array(label)) label = json_array_get(label, 0);
    return label ? json_str(label) : strdup("");
}

static bool is_task(const char *t, const char *const *names) {
    for (; *names; names++)
        if (!strcmp(t, *names)) return true;
    return false;
}

double sc_score_turn(const char *task, const char *pred, const json_t *answer,
                     const json_t *options, const char *repoqa_name, const sc_needle *needles,
                     int n_needles) {
    if (!task || !pred) return -1;
    static const char *const kv_tasks[] = {"scbench_kv",
                                           "scbench_kv_hard",
                                           "scbench_hashhop",
                                           "scbench_prefix_suffix",
                                           "scbench_kv_compressible",
                                           NULL};
    static const char *const dialogue_tasks[] = {"scbench_qa_eng", "scbench_many_shot", NULL};
    double score = -1;
    if (is_task(task, kv_tasks)) {
        char *l = label_first(answer);
        score = l && strstr(pred, l) ? 1 : 0;
        free(l);
    } else if (!strcmp(task, "scbench_passkey")) {
        char *l = label_first(answer);
        char got[64];
        sc_first_int(pred, got, sizeof got);
        score = l && !strcmp(l, got) ? 1 : 0;
        free(l);
    } else if (!strcmp(task, "scbench_mf")) {
        const json_t *l = json_is_array(answer) ? json_array_get(answer, 0) : answer;
        bool is_int = json_is_integer(l);
        double v = json_number_value(l);
        if (json_is_string(l)) {
            const char *s = json_string_value(l);
            is_int = !strchr(s, '.');
            v = strtod(s, NULL);
        }
        score = sc_math_find(pred, v, is_int) ? 1 : 0;
    } else if (!strcmp(task, "scbench_vt")) {
        items it = label_items(answer);
        score = sc_string_match_all(pred, (const char *const *)it.s, it.n);
        items_free(&it);
    } else if (is_task(task, dialogue_tasks)) {
        /* the question-answer task's label is [answer] (a one-element list) */
        json_t *wrapped = NULL;
        if (!strcmp(task, "scbench_qa_eng") && !json_is_array(answer))
            wrapped = json_pack("[O]", (json_t *)answer);
        items it = label_items(wrapped ? wrapped : answer);
        score = sc_any_item_in(pred, (const char *const *)it.s, it.n) ? 1 : 0;
        items_free(&it);
        json_decref(wrapped);
    } else if (!strcmp(task, "scbench_choice_eng")) {
        char *ans = label_first(answer);
        const char *labels[2] = {ans ? ans : "", NULL};
        char letter[2] = {0, 0};
        int n = 1;
        for (size_t i = 0; ans && i < json_array_size(options) && i < 4; i++) {
            char *o = json_str(json_array_get(options, i));
            const bool eq = o && !strcmp(o, ans);
            free(o);
            if (eq) {
                letter[0] = (char)('A' + i);
                labels[1] = letter, n = 2;
                break;
            }
        }
        score = sc_choice(pred, labels, n) ? 1 : 0;
        free(ans);
    } else if (!strcmp(task, "scbench_qa_chn")) {
        items it = label_items(answer);
        score = sc_qa_f1_zh(pred, (const char *const *)it.s, it.n);
        items_free(&it);
    } else if (!strcmp(task, "scbench_summary")) {
        char *l = label_first(answer);
        score = l ? sc_rouge_lsum(pred, l) : 0;
        free(l);
    } else if (!strcmp(task, "scbench_repoqa")) {
        score = repoqa_name && sc_repoqa_pass(pred, repoqa_name, needles, n_needles, NULL) ? 1 : 0;
    }
    return score;
}
