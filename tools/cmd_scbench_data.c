/*
 * cmd_scbench_data.c: SCBench data. The JSONL reader of the public files, and seeded offline
 * generators for the tasks whose data is synthetic in nature, each sized to a target length in
 * the model's tokens (docs/scbench.md: the sources and formats):
 *   scbench_kv                    a JSON object of UUID keys and values; a turn asks one key
 *   scbench_prefix_suffix         random strings; a turn asks the one with a prefix and suffix
 *   scbench_vt                    variable-assignment chains in filler text (RULER's task)
 *   scbench_mf                    a list of integers; turns ask its largest, smallest, median
 *   scbench_summary_with_needles  Debian package descriptions (the dpkg status file: real
 *                                 text with a one-line summary written by its maintainers) with
 *                                 pass keys hidden between them; turns alternate summary / key
 *   scbench_repoqa                Python standard library files; a turn gives a function's
 *                                 docstring and asks for the function
 *   scbench_repoqa_and_kv         the two above in one context, turns alternating
 *   scbench_many_shot             a labelled table in scikit-learn's CSV layout (its iris.csv
 *                                 by default) as many-shot classification examples
 * A generator builds a context from a size knob (items, bytes) that the sizer adjusts until the
 * context's token count is within 3% below the target.
 */
#define _POSIX_C_SOURCE 200809L
#include "cmd_scbench.h"

#include <ctype.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tool_util.h"

const sc_task_info sc_tasks[] = {
    {"scbench_kv", 150, 0, true},         {"scbench_prefix_suffix", 150, 0, true},
    {"scbench_vt", 30, 0, true},          {"scbench_mf", 5, 0, true},
    {"scbench_many_shot", 10, 0, true},   {"scbench_summary_with_needles", 800, 15, true},
    {"scbench_repoqa", 1024, 0, true},    {"scbench_repoqa_and_kv", 1024, 80, true},
    {"scbench_qa_eng", 40, 0, false},     {"scbench_qa_chn", 40, 0, false},
    {"scbench_choice_eng", 40, 0, false}, {"scbench_summary", 200, 0, false},
};
const int sc_n_tasks = (int)(sizeof sc_tasks / sizeof sc_tasks[0]);

const sc_task_info *sc_task_find(const char *name) {
    for (int i = 0; name && i < sc_n_tasks; i++)
        if (!strcmp(sc_tasks[i].name, name)) return &sc_tasks[i];
    return NULL;
}

int sc_task_max_new(const sc_task_info *t, const char *sub) {
    if (!t) return 0;
    if (t->max_new_tokens_alt && sub &&
        (!strcmp(sub, "scbench_passkey") || !strcmp(sub, "scbench_kv")))
        return t->max_new_tokens_alt;
    return t->max_new_tokens;
}

/* ------------------------------------------------------------------------------------------ */
/* Reading and writing                                                                         */

json_t *sc_read_jsonl(const char *path, int max_examples, char *why, size_t why_cap) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(why, why_cap, "cannot open %s", path);
        return NULL;
    }
    json_t *arr = json_array();
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long lineno = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        size_t i = 0;
        while (i < (size_t)len && isspace((unsigned char)line[i])) i++;
        if (i == (size_t)len) continue;
        if (max_examples > 0 && (int)json_array_size(arr) >= max_examples) break;
        json_error_t err;
        json_t *o = json_loadb(line, (size_t)len, 0, &err);
        if (!o || !json_is_object(o) || !json_is_array(json_object_get(o, "multi_turns")) ||
            (!json_is_string(json_object_get(o, "context")) &&
             !json_is_string(json_object_get(o, "input")))) {
            snprintf(why, why_cap, "%s:%ld: %s", path, lineno,
                     o ? "not an SCBench example (needs \"context\" and \"multi_turns\")"
                       : err.text);
            json_decref(o);
            json_decref(arr);
            free(line);
            fclose(f);
            return NULL;
        }
        json_array_append_new(arr, o);
    }
    free(line);
    const bool io_error = ferror(f) != 0;
    fclose(f);
    if (io_error) {
        snprintf(why, why_cap, "error reading %s", path);
        json_decref(arr);
        return NULL;
    }
    return arr;
}

bool sc_write_jsonl(const json_t *examples, const char *path) {
    size_t cap = 1 << 16, n = 0;
    char *all = malloc(cap);
    bool ok = all != NULL;
    for (size_t i = 0; ok && i < json_array_size(examples); i++) {
        char *s = json_dumps(json_array_get(examples, i), JSON_COMPACT | JSON_ENSURE_ASCII);
        const size_t l = s ? strlen(s) : 0;
        if (s && n + l + 2 > cap) {
            while (n + l + 2 > cap) cap *= 2;
            char *t = realloc(all, cap);
            if (t)
                all = t;
            else
                ok = false;
        }
        if (s && ok) {
            memcpy(all + n, s, l);
            n += l;
            all[n++] = '\n';
        }
        ok = ok && s;
        free(s);
    }
    ok = ok && tool_write_file("scbench", path, all, n);
    free(all);
    return ok;
}

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                     */

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t rng_next(rng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rng_below(rng *r, uint64_t n) { return n ? rng_next(r) % n : 0; }

/* A growable string. */
typedef tool_buf sbuf;

static void sb_addn(sbuf *b, const char *s, size_t n) { tool_buf_addn(b, s, n); }

static void sb_add(sbuf *b, const char *s) { sb_addn(b, s, strlen(s)); }

__attribute__((format(printf, 2, 3))) static void sb_printf(sbuf *b, const char *fmt, ...) {
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        sb_addn(b, tmp, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb_addn(b, big, (size_t)n);
    free(big);
}

static void uuid4(rng *r, char out[37]) {
    static const char hex[] = "0123456789abcdef";
    const uint64_t a = rng_next(r), c = rng_next(r);
    unsigned char by[16];
    for (int i = 0; i < 8; i++) by[i] = (unsigned char)(a >> (8 * i));
    for (int i = 0; i < 8; i++) by[8 + i] = (unsigned char)(c >> (8 * i));
    by[6] = (unsigned char)((by[6] & 0x0F) | 0x40);
    by[8] = (unsigned char)((by[8] & 0x3F) | 0x80);
    int o = 0;
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10) out[o++] = '-';
        out[o++] = hex[by[i] >> 4];
        out[o++] = hex[by[i] & 15];
    }
    out[o] = 0;
}

static json_t *turn_new(const char *input, json_t *answer) {
    json_t *t = json_object();
    json_object_set_new(t, "input", json_string(input));
    json_object_set_new(t, "answer", answer);
    return t;
}

static json_t *example_new(const char *id, const char *context, json_t *turns) {
    json_t *e = json_object();
    json_object_set_new(e, "id", json_string(id));
    json_object_set_new(e, "context", json_string(context));
    json_object_set_new(e, "multi_turns", turns);
    return e;
}

/* One example built from a size knob: the context (sb) and the turns. false on failure. */
typedef bool (*build_fn)(void *state, uint64_t seed, int64_t knob, int n_turns, sbuf *ctx,
                         json_t *turns);

/* Adjusts knob until the context has between 97% and 100% of target tokens (at most 8 tries;
 * the best fit below the target wins, else the smallest). */
static json_t *sized_example(build_fn build, void *state, const sc_gen_params *p, uint64_t seed,
                             int64_t knob, const char *id) {
    json_t *best_turns = NULL;
    char *best_ctx = NULL;
    size_t best_tokens = 0;
    bool best_under = false;
    for (int iter = 0; iter < 8; iter++) {
        if (knob < 1) knob = 1;
        sbuf ctx = {0};
        json_t *turns = json_array();
        if (!build(state, seed, knob, p->n_turns, &ctx, turns) || ctx.oom) {
            /* too small to hold what the turns ask (RepoQA: a whole function): grow */
            free(ctx.s);
            json_decref(turns);
            knob = knob * 3 / 2 + 1;
            continue;
        }
        const size_t n = p->count(p->user, ctx.s, ctx.n);
        const bool under = n <= (size_t)p->target_tokens;
        const bool better = !best_ctx || (under && (!best_under || n > best_tokens)) ||
                            (!under && !best_under && n < best_tokens);
        if (better) {
            free(best_ctx), json_decref(best_turns);
            best_ctx = ctx.s, best_turns = turns, best_tokens = n, best_under = under;
        } else {
            free(ctx.s), json_decref(turns);
        }
        if (under && (double)n >= 0.97 * (double)p->target_tokens) break;
        const double scale = (double)p->target_tokens / (double)(n ? n : 1);
        int64_t next = (int64_t)floor((double)knob * (under ? fmin(scale, 4.0) * 0.995 : scale));
        if (next == knob) next = under ? knob + 1 : knob - 1;
        knob = next;
    }
    if (!best_ctx) return NULL;
    json_t *e = example_new(id, best_ctx, best_turns);
    free(best_ctx);
    return e;
}

/* ------------------------------------------------------------------------------------------ */
/* scbench_kv                                                                                  */

static bool build_kv(void *state, uint64_t seed, int64_t knob, int n_turns, sbuf *ctx,
                     json_t *turns) {
    (void)state;
    rng r = {seed};
    if (knob < n_turns) knob = n_turns;
    char(*keys)[37] = malloc((size_t)knob * sizeof *keys);
    char(*vals)[37] = malloc((size_t)knob * sizeof *vals);
    if (!keys || !vals) return free(keys), free(vals), false;
    sb_add(ctx, "{");
    for (int64_t i = 0; i < knob; i++) {
        uuid4(&r, keys[i]);
        uuid4(&r, vals[i]);
        sb_printf(ctx, "%s\"%s\": \"%s\"", i ? ", " : "", keys[i], vals[i]);
    }
    sb_add(ctx, "}");
    /* the asked keys spread over the object: one from each of n_turns equal slices */
    for (int t = 0; t < n_turns; t++) {
        const int64_t lo = knob * t / n_turns, hi = knob * (t + 1) / n_turns;
        const int64_t k = lo + (int64_t)rng_below(&r, (uint64_t)(hi - lo));
        char in[160];
        snprintf(in, sizeof in,
                 "Key: \"%s\"\nThe value associated with the specified key is: ", keys[k]);
        json_array_append_new(turns, turn_new(in, json_string(vals[k])));
    }
    /* shuffle the turn order so that position and turn index are independent */
    for (size_t i = json_array_size(turns); i > 1; i--) {
        const size_t j = (size_t)rng_below(&r, i);
        json_t *a = json_incref(json_array_get(turns, i - 1)),
               *b = json_incref(json_array_get(turns, j));
        json_array_set_new(turns, i - 1, b);
        json_array_set_new(turns, j, a);
    }
    free(keys), free(vals);
    return true;
}

/* ------------------------------------------------------------------------------------------ */
/* scbench_prefix_suffix                                                                       */

static void rand_word(rng *r, char *out, int len) {
    static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    for (int i = 0; i < len; i++) out[i] = al[rng_below(r, sizeof al - 1)];
    out[len] = 0;
}

#define PS_LEN 24
#define PS_FIX 4

static bool build_prefix_suffix(void *state, uint64_t seed, int64_t knob, int n_turns, sbuf *ctx,
                                json_t *turns) {
    (void)state;
    rng r = {seed};
    if (knob < n_turns) knob = n_turns;
    char(*w)[PS_LEN + 1] = malloc((size_t)knob * sizeof *w);
    if (!w) return false;
    for (int64_t i = 0; i < knob; i++) rand_word(&r, w[i], PS_LEN);
    sb_add(ctx, "Here is a list of random strings, one per line:\n");
    for (int64_t i = 0; i < knob; i++) sb_printf(ctx, "%s\n", w[i]);
    for (int t = 0; t < n_turns; t++) {
        const int64_t lo = knob * t / n_turns, hi = knob * (t + 1) / n_turns;
        const int64_t k = lo + (int64_t)rng_below(&r, (uint64_t)(hi - lo));
        /* the (prefix, suffix) pair must name one string */
        int same = 0;
        for (int64_t i = 0; i < knob; i++)
            same += !strncmp(w[i], w[k], PS_FIX) &&
                    !strcmp(w[i] + PS_LEN - PS_FIX, w[k] + PS_LEN - PS_FIX);
        if (same != 1) continue;
        char in[256];
        snprintf(in, sizeof in,
                 "What is the string in the list that starts with \"%.*s\" and ends with "
                 "\"%s\"? Answer with the whole string.\nThe string is: ",
                 PS_FIX, w[k], w[k] + PS_LEN - PS_FIX);
        json_array_append_new(turns, turn_new(in, json_string(w[k])));
    }
    free(w);
    return true;
}

/* ------------------------------------------------------------------------------------------ */
/* scbench_vt                                                                                  */

#define VT_HOPS 4
static const char vt_filler[] = "The grass is green. The sky is blue. The sun is yellow. Here we "
                                "go. There and back again. ";

static void var_name(rng *r, char out[6]) {
    for (int i = 0; i < 5; i++) out[i] = (char)('A' + rng_below(r, 26));
    out[5] = 0;
}

static bool build_vt(void *state, uint64_t seed, int64_t knob, int n_turns, sbuf *ctx,
                     json_t *turns) {
    (void)state;
    rng r = {seed};
    const int n_chains = n_turns;
    const int n_stmt = n_chains * (VT_HOPS + 1);
    char(*names)[6] = malloc((size_t)n_stmt * sizeof *names);
    long *values = malloc((size_t)n_chains * sizeof *values);
    int64_t *pos = malloc((size_t)n_stmt * sizeof *pos);
    int *order = malloc((size_t)n_stmt * sizeof *order);
    if (!names || !values || !pos || !order) {
        free(names), free(values), free(pos), free(order);
        return false;
    }
    for (int i = 0; i < n_stmt; i++) {
        bool dup;
        do {
            var_name(&r, names[i]);
            dup = false;
            for (int j = 0; j < i; j++) dup |= !strcmp(names[i], names[j]);
        } while (dup);
    }
    for (int c = 0; c < n_chains; c++) {
        bool dup;
        do {
            values[c] = 10000 + (long)rng_below(&r, 90000);
            dup = false;
            for (int j = 0; j < c; j++) dup |= values[j] == values[c];
        } while (dup);
    }
    /* statement s of chain c at a random filler block, in chain order */
    for (int c = 0; c < n_chains; c++) {
        int64_t p[VT_HOPS + 1];
        for (int h = 0; h <= VT_HOPS; h++) p[h] = (int64_t)rng_below(&r, (uint64_t)knob + 1);
        for (int a = 0; a <= VT_HOPS; a++)
            for (int b = a + 1; b <= VT_HOPS; b++)
                if (p[b] < p[a]) {
                    const int64_t t = p[a];
                    p[a] = p[b], p[b] = t;
                }
        for (int h = 0; h <= VT_HOPS; h++) pos[c * (VT_HOPS + 1) + h] = p[h];
    }
    for (int i = 0; i < n_stmt; i++) order[i] = i;
    /* stable order by position (insertion sort: few statements) */
    for (int i = 1; i < n_stmt; i++)
        for (int j = i; j > 0 && pos[order[j]] < pos[order[j - 1]]; j--) {
            const int t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    sb_add(ctx, "Memorize and track the chain(s) of variable assignment hidden in the following "
                "text.\n\n");
    int next = 0;
    for (int64_t blk = 0; blk <= knob; blk++) {
        while (next < n_stmt && pos[order[next]] == blk) {
            const int s = order[next++], c = s / (VT_HOPS + 1), h = s % (VT_HOPS + 1);
            if (h == 0)
                sb_printf(ctx, "VAR %s = %ld. ", names[s], values[c]);
            else
                sb_printf(ctx, "VAR %s = VAR %s. ", names[s], names[s - 1]);
        }
        if (blk < knob) sb_add(ctx, vt_filler);
    }
    for (int c = 0; c < n_turns; c++) {
        char in[512];
        snprintf(in, sizeof in,
                 "Question: Find all variables that are assigned the value %ld in the text "
                 "above. Answer: According to the chain(s) of variable assignment in the text "
                 "above, %d variables are assigned the value %ld, they are: ",
                 values[c], VT_HOPS + 1, values[c]);
        json_t *ans = json_array();
        for (int h = 0; h <= VT_HOPS; h++)
            json_array_append_new(ans, json_string(names[c * (VT_HOPS + 1) + h]));
        json_array_append_new(turns, turn_new(in, ans));
    }
    free(names), free(values), free(pos), free(order);
    return true;
}

/* ------------------------------------------------------------------------------------------ */
/* scbench_mf                                                                                  */

static int cmp_long(const void *a, const void *b) {
    const long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

static bool build_mf(void *state, uint64_t seed, int64_t knob, int n_turns, sbuf *ctx,
                     json_t *turns) {
    (void)state;
    rng r = {seed};
    const int64_t n = knob | 1; /* odd: the median is one of the numbers */
    long *v = malloc((size_t)n * sizeof *v), *sorted = malloc((size_t)n * sizeof *sorted);
    if (!v || !sorted) return free(v), free(sorted), false;
    sb_add(ctx, "[");
    for (int64_t i = 0; i < n; i++) {
        v[i] = (long)rng_below(&r, 100000);
        sb_printf(ctx, "%s%ld", i ? ", " : "", v[i]);
    }
    sb_add(ctx, "]");
    memcpy(sorted, v, (size_t)n * sizeof *v);
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_long);
    static const char *const what[] = {"largest", "smallest", "median"};
    const long val[] = {sorted[n - 1], sorted[0], sorted[n / 2]};
    const int start = (int)rng_below(&r, 3);
    for (int t = 0; t < n_turns; t++) {
        const int k = (start + t) % 3;
        char in[256];
        snprintf(in, sizeof in,
                 "You should answer with only one number, no other words. The %s number of the "
                 "list is: ",
                 what[k]);
        json_array_append_new(turns, turn_new(in, json_integer(val[k])));
    }
    free(v), free(sorted);
    return true;
}

/* ------------------------------------------------------------------------------------------ */
/* scbench_many_shot                                                                           */

typedef struct icl_data {
    int n_rows, n_feat, n_class;
    char **class_names;
    char **rows; /* the feature text of each row: "5.1, 3.5, 1.4, 0.2" */
    int *label;
} icl_data;

static void icl_free(icl_data *d) {
    for (int i = 0; i < d->n_class; i++) free(d->class_names[i]);
    for (int i = 0; i < d->n_rows; i++) free(d->rows[i]);
    free(d->class_names), free(d->rows), free(d->label);
    memset(d, 0, sizeof *d);
}

/* scikit-learn's layout: "n_samples,n_features,class names..." then rows of features and a
 * class index. */
static bool icl_load(const char *path, icl_data *d, const char **why) {
    memset(d, 0, sizeof *d);
    size_t len;
    char *text = tool_read_file(path, &len, NULL);
    if (!text) return *why = "cannot read the labelled CSV", false;
    char *save = NULL, *line = strtok_r(text, "\r\n", &save);
    int ns = 0, nf = 0, off = 0;
    if (!line || sscanf(line, "%d,%d,%n", &ns, &nf, &off) != 2 || ns <= 0 || nf <= 0 ||
        ns > 1000000 || nf > 1000 || off <= 0) {
        free(text);
        return *why = "the CSV's first line is not \"n_samples,n_features,class,...\"", false;
    }
    d->class_names = calloc(64, sizeof *d->class_names);
    d->rows = calloc((size_t)ns, sizeof *d->rows);
    d->label = calloc((size_t)ns, sizeof *d->label);
    if (!d->class_names || !d->rows || !d->label) {
        free(text), icl_free(d);
        return *why = "out of memory", false;
    }
    char *save2 = NULL;
    for (char *c = strtok_r(line + off, ",", &save2); c && d->n_class < 64;
         c = strtok_r(NULL, ",", &save2))
        d->class_names[d->n_class++] = strdup(c);
    d->n_feat = nf;
    while ((line = strtok_r(NULL, "\r\n", &save)) && d->n_rows < ns) {
        /* the features are the first nf fields; the class index the last */
        const char *last = strrchr(line, ',');
        if (!last) continue;
        const int lab = atoi(last + 1);
        if (lab < 0 || lab >= d->n_class) continue;
        sbuf b = {0};
        int f = 0;
        for (const char *p = line; p < last; f++) {
            const char *q = strchr(p, ',');
            if (!q || q > last) q = last;
            if (f) sb_add(&b, ", ");
            sb_addn(&b, p, (size_t)(q - p));
            p = q + 1;
        }
        if (f != nf || b.oom) {
            free(b.s);
            continue;
        }
        d->rows[d->n_rows] = b.s;
        d->label[d->n_rows++] = lab;
    }
    free(text);
    if (d->n_rows < 8 || d->n_class < 2) {
        icl_free(d);
        return *why = "the CSV has too few rows or classes", false;
    }
    return true;
}

typedef struct icl_state {
    icl_data *d;
    int *query; /* [n_turns] the held-out rows of this example */
} icl_state;

static bool build_icl(void *state, uint64_t seed, int64_t knob, int n_turns, sbuf *ctx,
                      json_t *turns) {
    icl_state *s = state;
    const icl_data *d = s->d;
    rng r = {seed};
    sb_add(ctx, "Classify each input into one of these labels: ");
    for (int c = 0; c < d->n_class; c++) sb_printf(ctx, "%s%s", c ? ", " : "", d->class_names[c]);
    sb_add(ctx, ". Here are labelled examples.\n\n");
    /* shots: rows other than the queries, drawn with replacement */
    for (int64_t i = 0; i < knob; i++) {
        int row;
        bool held;
        do {
            row = (int)rng_below(&r, (uint64_t)d->n_rows);
            held = false;
            for (int t = 0; t < n_turns; t++) held |= s->query[t] == row;
        } while (held);
        sb_printf(ctx, "Input: %s\nLabel: %s\n\n", d->rows[row], d->class_names[d->label[row]]);
    }
    for (int t = 0; t < n_turns; t++) {
        const int row = s->query[t];
        char in[1024];
        snprintf(in, sizeof in, "Input: %s\nLabel:", d->rows[row]);
        json_t *ans = json_array();
        json_array_append_new(ans, json_string(d->class_names[d->label[row]]));
        json_array_append_new(turns, turn_new(in, ans));
    }
    return true;
}

char *sc_default_icl_csv(void) {
    FILE *p = popen("python3 -c \"import importlib.util as u, os; s = u.find_spec('sklearn'); "
                    "print(os.path.join(os.path.dirname(s.origin), 'datasets', 'data', "
                    "'iris.csv') if s else '')\" 2>/dev/null",
                    "r");
    if (!p) return NULL;
    char buf[4096] = {0};
    const bool got = fgets(buf, sizeof buf, p) != NULL;
    pclose(p);
    buf[strcspn(buf, "\r\n")] = 0;
    if (!got || !buf[0] || access(buf, R_OK) != 0) return NULL;
    return strdup(buf);
}

/* ------------------------------------------------------------------------------------------ */
/* scbench_summary_with_needles                                                                */

typedef struct pkg_doc {
    char *name, *synopsis, *body;
} pkg_doc;

typedef struct docs {
    pkg_doc *d;
    int n;
} docs;

static void docs_free(docs *ds) {
    for (int i = 0; i < ds->n; i++)
        free(ds->d[i].name), free(ds->d[i].synopsis), free(ds->d[i].body);
    free(ds->d);
    memset(ds, 0, sizeof *ds);
}

/* The dpkg status file's package descriptions with a body of at least 300 bytes, sorted by
 * name (the file's order is the installation's). */
static int cmp_doc(const void *a, const void *b) {
    return strcmp(((const pkg_doc *)a)->name, ((const pkg_doc *)b)->name);
}

static bool docs_load(const char *path, docs *ds, const char **why) {
    memset(ds, 0, sizeof *ds);
    size_t len;
    char *text = tool_read_file(path, &len, NULL);
    if (!text) return *why = "cannot read the dpkg status file", false;
    int cap = 0;
    char *name = NULL;
    for (char *line = text; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        if (!strncmp(line, "Package: ", 9)) {
            free(name);
            name = strdup(line + 9);
        } else if (!strncmp(line, "Description: ", 13) && name) {
            sbuf body = {0};
            char *syn = strdup(line + 13);
            char *l2 = nl ? nl + 1 : NULL;
            while (l2 && *l2 == ' ') {
                char *n2 = strchr(l2, '\n');
                if (n2) *n2 = 0;
                const char *t = l2 + 1;
                if (!strcmp(t, "."))
                    sb_add(&body, "\n");
                else {
                    if (body.n && body.s[body.n - 1] != '\n') sb_add(&body, " ");
                    sb_add(&body, t);
                }
                nl = n2;
                l2 = n2 ? n2 + 1 : NULL;
            }
            bool dup = false;
            for (int i = 0; i < ds->n && !dup; i++) dup = !strcmp(ds->d[i].name, name);
            if (!dup && body.s && body.n >= 300 && syn && !body.oom) {
                if (ds->n == cap) {
                    cap = cap ? cap * 2 : 256;
                    pkg_doc *t = realloc(ds->d, (size_t)cap * sizeof *t);
                    if (!t) break;
                    ds->d = t;
                }
                ds->d[ds->n++] = (pkg_doc){strdup(name), syn, body.s};
                syn = NULL, body.s = NULL;
            }
            free(syn), free(body.s);
        }
        line = nl ? nl + 1 : NULL;
    }
    free(name);
    free(text);
    if (ds->n < 8) {
        docs_free(ds);
        return *why = "the dpkg status file has too few long package descriptions", false;
    }
    qsort(ds->d, (size_t)ds->n, sizeof *ds->d, cmp_doc);
    return true;
}

static const char *const door_colors[] = {"red",   "blue",   "green",  "yellow", "white",
                                          "black", "orange", "purple", "silver", "golden"};

static bool build_summary_needles(void *state, uint64_t seed, int64_t knob, int n_turns, sbuf *ctx,
                                  json_t *turns) {
    const docs *ds = state;
    rng r = {seed};
    const int n_docs = (int)(knob < ds->n ? knob : ds->n);
    int *pick = malloc((size_t)ds->n * sizeof *pick);
    if (!pick) return false;
    for (int i = 0; i < ds->n; i++) pick[i] = i;
    for (int i = 0; i < n_docs; i++) {
        const int j = i + (int)rng_below(&r, (uint64_t)(ds->n - i));
        const int t = pick[i];
        pick[i] = pick[j], pick[j] = t;
    }
    const int n_keys = n_turns / 2 > 10 ? 10 : n_turns / 2;
    long keys[10];
    int at[10];
    for (int k = 0; k < n_keys; k++) {
        keys[k] = 10000 + (long)rng_below(&r, 90000);
        at[k] = (int)rng_below(&r, (uint64_t)n_docs + 1);
    }
    for (int i = 0; i <= n_docs; i++) {
        for (int k = 0; k < n_keys; k++)
            if (at[k] == i)
                sb_printf(ctx,
                          "The pass key of the %s door is %ld. Remember it. %ld is the pass key "
                          "of the %s door.\n\n",
                          door_colors[k], keys[k], keys[k], door_colors[k]);
        if (i < n_docs) {
            const pkg_doc *d = &ds->d[pick[i]];
            sb_printf(ctx, "Package %s:\n%s\n\n", d->name, d->body);
        }
    }
    /* turns alternate: summary of a package in the context, then a pass key */
    int ks = 0;
    for (int t = 0; t < n_turns; t++) {
        json_t *turn;
        if (t % 2 == 1 && ks < n_keys) {
            char in[256];
            snprintf(in, sizeof in,
                     "What is the pass key of the %s door? The pass key of the %s door is",
                     door_colors[ks], door_colors[ks]);
            char ans[32];
            snprintf(ans, sizeof ans, "%ld", keys[ks++]);
            turn = turn_new(in, json_string(ans));
            json_object_set_new(turn, "task", json_string("scbench_passkey"));
        } else {
            const pkg_doc *d = &ds->d[pick[rng_below(&r, (uint64_t)n_docs)]];
            char in[512];
            snprintf(in, sizeof in,
                     "Write a one-line summary of the description of the package %s above.",
                     d->name);
            turn = turn_new(in, json_string(d->synopsis));
            json_object_set_new(turn, "task", json_string("scbench_summary"));
        }
        json_array_append_new(turns, turn);
    }
    free(pick);
    return true;
}

/* ------------------------------------------------------------------------------------------ */
/* scbench_repoqa (and _and_kv)                                                                */

typedef struct src_file {
    char *name, *text;
    size_t len;
} src_file;

typedef struct repo {
    src_file *f;
    int n;
} repo;

static void repo_free(repo *rp) {
    for (int i = 0; i < rp->n; i++) free(rp->f[i].name), free(rp->f[i].text);
    free(rp->f);
    memset(rp, 0, sizeof *rp);
}

static int cmp_src(const void *a, const void *b) {
    return strcmp(((const src_file *)a)->name, ((const src_file *)b)->name);
}

/* The .py files of dir between 2 and 60 KB, ASCII only, sorted by name. */
static bool repo_load(const char *dir, repo *rp, const char **why) {
    memset(rp, 0, sizeof *rp);
    DIR *d = opendir(dir);
    if (!d) return *why = "cannot open the Python source directory", false;
    int cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        const size_t nl = strlen(de->d_name);
        if (nl < 4 || strcmp(de->d_name + nl - 3, ".py") || de->d_name[0] == '_') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        struct stat st;
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 2000 || st.st_size > 60000)
            continue;
        size_t len;
        char *text = tool_read_file(path, &len, NULL);
        if (!text) continue;
        bool ascii = true;
        for (size_t i = 0; i < len && ascii; i++) ascii = (unsigned char)text[i] < 0x80;
        if (!ascii) {
            free(text);
            continue;
        }
        if (rp->n == cap) {
            cap = cap ? cap * 2 : 64;
            src_file *t = realloc(rp->f, (size_t)cap * sizeof *t);
            if (!t) {
                free(text);
                break;
            }
            rp->f = t;
        }
        rp->f[rp->n++] = (src_file){strdup(de->d_name), text, len};
    }
    closedir(d);
    if (rp->n < 4) {
        repo_free(rp);
        return *why = "too few Python source files", false;
    }
    qsort(rp->f, (size_t)rp->n, sizeof *rp->f, cmp_src);
    return true;
}

/* The Python standard library directory of python3 (asks it). malloc'ed or NULL. */
static char *default_py_src(void) {
    FILE *p = popen("python3 -c \"import sysconfig; print(sysconfig.get_paths()['stdlib'])\" "
                    "2>/dev/null",
                    "r");
    if (!p) return NULL;
    char buf[4096] = {0};
    const bool got = fgets(buf, sizeof buf, p) != NULL;
    pclose(p);
    buf[strcspn(buf, "\r\n")] = 0;
    return got && buf[0] ? strdup(buf) : NULL;
}

typedef struct func {
    size_t start, end; /* bytes of the context: from "def" to the body's last character */
    char name[128];
    char *doc;
} func;

/* Functions in code with a docstring of 40..600 bytes and 6..80 lines. */
static int find_functions(const char *code, size_t len, func *out, int cap) {
    int n = 0;
    for (size_t i = 0; i < len && n < cap;) {
        const size_t ls = i;
        const char *nl = memchr(code + i, '\n', len - i);
        const size_t le = nl ? (size_t)(nl - code) : len;
        size_t k = ls;
        while (k < le && code[k] == ' ') k++;
        i = nl ? le + 1 : len;
        if (le - k < 5 || strncmp(code + k, "def ", 4)) continue;
        const size_t indent = k - ls;
        /* header: up to the ':' outside brackets */
        int depth = 0;
        size_t p = k;
        for (; p < len; p++) {
            if (code[p] == '(' || code[p] == '[' || code[p] == '{')
                depth++;
            else if (code[p] == ')' || code[p] == ']' || code[p] == '}')
                depth--;
            else if (code[p] == ':' && depth <= 0)
                break;
        }
        const char *hnl = p < len ? memchr(code + p, '\n', len - p) : NULL;
        if (!hnl) continue;
        size_t body = (size_t)(hnl - code) + 1;
        /* docstring: the first body line starts with triple quotes */
        size_t q = body;
        while (q < len && code[q] == ' ') q++;
        if (q + 3 > len || (strncmp(code + q, "\"\"\"", 3) && strncmp(code + q, "'''", 3)))
            continue;
        const char *close = strstr(code + q + 3, code[q] == '"' ? "\"\"\"" : "'''");
        if (!close || (size_t)(close - code) > len) continue;
        /* the body's end: the last line indented deeper than the def */
        size_t end = (size_t)(hnl - code), l2 = body;
        int lines = 1;
        while (l2 < len) {
            const char *n2 = memchr(code + l2, '\n', len - l2);
            const size_t e2 = n2 ? (size_t)(n2 - code) : len;
            size_t k2 = l2;
            while (k2 < e2 && code[k2] == ' ') k2++;
            if (k2 < e2) {
                if (k2 - l2 <= indent) break;
                end = e2;
                lines++;
            }
            l2 = n2 ? e2 + 1 : len;
        }
        if ((size_t)(close - code) > end) continue;
        const size_t dl = (size_t)(close - (code + q + 3));
        if (lines < 4 || lines > 80 || dl < 40 || dl > 600) continue;
        func *f = &out[n];
        size_t nm = 0;
        for (size_t c = k + 4; c < len && (isalnum((unsigned char)code[c]) || code[c] == '_') &&
                               nm + 1 < sizeof f->name;
             c++)
            f->name[nm++] = code[c];
        f->name[nm] = 0;
        if (!nm) continue;
        /* the docstring's text with its lines' indentation dropped */
        sbuf d = {0};
        const char *s = code + q + 3;
        while (s < close) {
            const char *e = memchr(s, '\n', (size_t)(close - s));
            if (!e) e = close;
            const char *b = s;
            while (b < e && (*b == ' ' || *b == '\t')) b++;
            if (b < e) {
                if (d.n) sb_add(&d, "\n");
                sb_addn(&d, b, (size_t)(e - b));
            }
            s = e < close ? e + 1 : close;
        }
        if (d.oom || !d.s) {
            free(d.s);
            continue;
        }
        f->doc = d.s;
        f->start = k;
        f->end = end;
        n++;
    }
    return n;
}

typedef struct repoqa_state {
    repo *rp;
    docs *unused;
    bool with_kv;
} repoqa_state;

/* The code context of about knob bytes: whole files in a seeded order, the last one cut at a
 * top-level statement. */
static void repo_context(const repo *rp, rng *r, int64_t knob, sbuf *ctx) {
    int *order = malloc((size_t)rp->n * sizeof *order);
    if (!order) {
        ctx->oom = true;
        return;
    }
    for (int i = 0; i < rp->n; i++) order[i] = i;
    for (int i = rp->n - 1; i > 0; i--) {
        const int j = (int)rng_below(r, (uint64_t)i + 1);
        const int t = order[i];
        order[i] = order[j], order[j] = t;
    }
    for (int i = 0; i < rp->n && (int64_t)ctx->n < knob; i++) {
        const src_file *f = &rp->f[order[i]];
        size_t take = f->len;
        const int64_t room = knob - (int64_t)ctx->n;
        if ((int64_t)take > room) {
            /* cut before the last top-level def/class that starts within the room */
            size_t cut = 0;
            for (size_t p = 1; p < (size_t)room && p < f->len; p++)
                if (f->text[p - 1] == '\n' &&
                    (!strncmp(f->text + p, "def ", 4) || !strncmp(f->text + p, "class ", 6)))
                    cut = p;
            if (cut == 0) continue; /* nothing fits whole: another file may */
            take = cut;
        }
        sb_printf(ctx, "# File: Lib/%s\n", f->name);
        sb_addn(ctx, f->text, take);
        sb_add(ctx, "\n\n");
    }
    free(order);
}

static const char repoqa_instruction[] =
    "Based on the function description and code context, please retrieve and repeat the exact "
    "described function from the code context in a code block wrapped by ```:";

static bool build_repoqa(void *state, uint64_t seed, int64_t knob, int n_turns, sbuf *ctx,
                         json_t *turns) {
    repoqa_state *s = state;
    rng r = {seed};
    const int64_t code_bytes = s->with_kv ? knob * 6 / 10 : knob;
    repo_context(s->rp, &r, code_bytes, ctx);
    if (ctx->oom) return false;
    int cap = 4096;
    func *fs = calloc((size_t)cap, sizeof *fs);
    if (!fs) return false;
    const int nf = find_functions(ctx->s ? ctx->s : "", ctx->n, fs, cap);
    /* usable needles: names unique among the context's functions */
    int *ok = malloc(((size_t)nf + 1) * sizeof *ok), n_ok = 0;
    for (int i = 0; ok && i < nf; i++) {
        int same = 0;
        for (int j = 0; j < nf; j++) same += !strcmp(fs[i].name, fs[j].name);
        if (same == 1) ok[n_ok++] = i;
    }
    const int n_repoqa = s->with_kv ? (n_turns + 1) / 2 : n_turns;
    /* a short context may hold fewer functions than turns: the turns then share them */
    bool good = ok && n_ok >= 1;
    /* kv part: a JSON object after the code, with a second share of the budget */
    int64_t n_kv = 0;
    char(*keys)[37] = NULL, (*vals)[37] = NULL;
    if (good && s->with_kv) {
        n_kv = (knob - (int64_t)ctx->n) / 84; /* about 84 bytes per "key": "value" pair */
        if (n_kv < n_turns) n_kv = n_turns;
        keys = malloc((size_t)n_kv * sizeof *keys);
        vals = malloc((size_t)n_kv * sizeof *vals);
        good = keys && vals;
        if (good) {
            sb_add(ctx, "JSON data:\n{");
            for (int64_t i = 0; i < n_kv; i++) {
                uuid4(&r, keys[i]);
                uuid4(&r, vals[i]);
                sb_printf(ctx, "%s\"%s\": \"%s\"", i ? ", " : "", keys[i], vals[i]);
            }
            sb_add(ctx, "}");
        }
    }
    /* needles spread over the code: one from each slice of the usable functions */
    int rq = 0;
    for (int t = 0; good && t < n_turns; t++) {
        json_t *turn;
        if (!s->with_kv || t % 2 == 0) {
            const int lo = n_ok * rq / n_repoqa, hi = n_ok * (rq + 1) / n_repoqa;
            const int pick = hi > lo ? lo + (int)rng_below(&r, (uint64_t)(hi - lo)) : lo % n_ok;
            const func *f = &fs[ok[pick]];
            rq++;
            sbuf in = {0};
            if (s->with_kv) {
                sb_add(&in, repoqa_instruction);
                sb_add(&in, "\n\n");
            }
            sb_add(&in, "Function description:\n");
            sb_add(&in, f->doc);
            char *code = malloc(f->end - f->start + 1);
            if (code) {
                memcpy(code, ctx->s + f->start, f->end - f->start);
                code[f->end - f->start] = 0;
            }
            turn = turn_new(in.s ? in.s : "", json_string(code ? code : ""));
            json_object_set_new(turn, "name", json_string(f->name));
            if (s->with_kv) json_object_set_new(turn, "task", json_string("scbench_repoqa"));
            free(code), free(in.s);
        } else {
            const int64_t k = (int64_t)rng_below(&r, (uint64_t)n_kv);
            char in[320];
            snprintf(in, sizeof in,
                     "Extract the value corresponding to the specified key in the JSON object "
                     "above.\n\nKey: \"%s\"\nThe value associated with the specified key is: ",
                     keys[k]);
            turn = turn_new(in, json_string(vals[k]));
            json_object_set_new(turn, "task", json_string("scbench_kv"));
        }
        json_array_append_new(turns, turn);
    }
    for (int i = 0; i < nf; i++) free(fs[i].doc);
    free(fs), free(ok), free(keys), free(vals);
    return good;
}

/* ------------------------------------------------------------------------------------------ */

bool sc_generate(const char *task, const sc_gen_params *p, json_t *out, const char **why) {
    *why = NULL;
    if (!task || !p || !p->count || !json_is_array(out) || p->target_tokens < 64 ||
        p->n_turns < 1 || p->n_turns > 64 || p->n_examples < 1)
        return *why = "bad generator parameters (target >= 64 tokens, 1..64 turns)", false;
    const sc_task_info *ti = sc_task_find(task);
    if (!ti) return *why = "unknown task", false;
    if (!ti->generated) return *why = "this task needs the public data (--data DIR)", false;
    build_fn build = NULL;
    void *state = NULL;
    int64_t knob0 = 0; /* a first guess of the knob from the target */
    icl_data icl = {0};
    icl_state ist = {0};
    docs ds = {0};
    repo rp = {0};
    repoqa_state rs = {0};
    char *path = NULL;
    bool ok = true;
    const int64_t T = p->target_tokens;
    if (!strcmp(task, "scbench_kv"))
        build = build_kv, knob0 = T / 50;
    else if (!strcmp(task, "scbench_prefix_suffix"))
        build = build_prefix_suffix, knob0 = T / 16;
    else if (!strcmp(task, "scbench_vt"))
        build = build_vt, knob0 = T / 25;
    else if (!strcmp(task, "scbench_mf"))
        build = build_mf, knob0 = T / 4;
    else if (!strcmp(task, "scbench_many_shot")) {
        path = p->icl_csv ? strdup(p->icl_csv) : sc_default_icl_csv();
        if (!path) return *why = "no labelled CSV (install scikit-learn, or --icl-csv)", false;
        ok = icl_load(path, &icl, why);
        build = build_icl, state = &ist, knob0 = T / 30;
        ist.d = &icl;
        ist.query = malloc((size_t)p->n_turns * sizeof *ist.query);
        ok = ok && ist.query && icl.n_rows > p->n_turns * 2;
        if (ok == false && !*why) *why = "the labelled set is too small for the turns";
    } else if (!strcmp(task, "scbench_summary_with_needles")) {
        ok = docs_load(p->text_src ? p->text_src : "/var/lib/dpkg/status", &ds, why);
        build = build_summary_needles, state = &ds, knob0 = T / 150;
    } else {
        path = p->py_src ? strdup(p->py_src) : default_py_src();
        ok = path && repo_load(path, &rp, why);
        if (!path) *why = "no Python standard library found (python3, or --py-src)";
        rs.rp = &rp;
        rs.with_kv = !strcmp(task, "scbench_repoqa_and_kv");
        build = build_repoqa, state = &rs, knob0 = T * 3;
    }
    for (int e = 0; ok && e < p->n_examples; e++) {
        const uint64_t seed = p->seed * 0x100000001B3ull + (uint64_t)e * 7919u + 1;
        if (state == &ist) {
            /* the held-out query rows of this example, distinct */
            rng r = {seed ^ 0xABCDEFull};
            for (int t = 0; t < p->n_turns; t++) {
                bool dup;
                do {
                    ist.query[t] = (int)rng_below(&r, (uint64_t)icl.n_rows);
                    dup = false;
                    for (int u = 0; u < t; u++) dup |= ist.query[u] == ist.query[t];
                } while (dup);
            }
        }
        char id[32];
        snprintf(id, sizeof id, "%d", e);
        json_t *ex = sized_example(build, state, p, seed, knob0, id);
        if (!ex || json_array_size(json_object_get(ex, "multi_turns")) == 0) {
            json_decref(ex);
            *why = "could not build an example of this size";
            ok = false;
            break;
        }
        if (state == &rs) {
            json_object_set_new(ex, "lang", json_string("python"));
            json_object_set_new(ex, "repo", json_string("cpython-stdlib"));
        }
        json_array_append_new(out, ex);
    }
    icl_free(&icl);
    free(ist.query);
    docs_free(&ds);
    repo_free(&rp);
    free(path);
    return ok;
}
