/*
 * crossover_series.h: the dense-fallback tests' view of a crossover measurement (a JSON file of
 * tests/data/crossover, as bench/crossover_patterns.py writes them: rows {heads, L, pattern,
 * speedup}, speedup = dense time / sparse time), and
 * the check a rule must pass against it: at every measured length from the rule's crossover on,
 * sparse was at least as fast as dense; at the last measured length below it, sparse was less
 * than 20 % faster (the rule leaves little on the table; a rule that runs sparse from the first
 * measured length on has nothing below it to check). Shared by the CUDA rule's test
 * (tests/cuda/test_dense_fallback.c) and the CPU rule's (tests/cpu/test_cpu_dense_fallback.c),
 * with the CHECK counters both use. Header-only; needs jansson.
 */
#ifndef MI_TEST_CROSSOVER_SERIES_H
#define MI_TEST_CROSSOVER_SERIES_H

#include "minference.h"

#include "check.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

enum { CROSSOVER_MAX_LENGTHS = 32, CROSSOVER_MAX_SERIES = 32 };

/* The measured rows of one pattern and head count, ascending in length. */
typedef struct crossover_series {
    mi_head_pattern pat;
    int64_t heads, head_dim;
    int n;
    int64_t len[CROSSOVER_MAX_LENGTHS];
    double speedup[CROSSOVER_MAX_LENGTHS];
} crossover_series;

/* The check above for a rule that runs s sparse from `from` on; returns the failures (each
 * printed), so 0 when it holds. */
static inline int crossover_check_series(const crossover_series *s, int32_t from,
                                         const char *what) {
    int failed = 0, below = -1;
    for (int i = 0; i < s->n; i++) {
        if (s->len[i] < from) {
            below = i;
        } else if (s->speedup[i] < 1.0) {
            fprintf(stderr, "%s, %lld heads, D %lld: sparse from %d, but %.2fx at %lld\n", what,
                    (long long)s->heads, (long long)s->head_dim, from, s->speedup[i],
                    (long long)s->len[i]);
            failed++;
        }
    }
    if (s->n == 0) {
        fprintf(stderr, "%s, %lld heads: no measurements\n", what, (long long)s->heads);
        failed++;
    } else if (below >= 0 && s->speedup[below] >= 1.2) {
        fprintf(stderr, "%s, %lld heads, D %lld: dense below %d, yet %.2fx at %lld\n", what,
                (long long)s->heads, (long long)s->head_dim, from, s->speedup[below],
                (long long)s->len[below]);
        failed++;
    }
    printf("%-28s %2lld heads, D %3lld: sparse from %6d (%d lengths measured)\n", what,
           (long long)s->heads, (long long)s->head_dim, from, s->n);
    return failed;
}

static inline json_t *crossover_load(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    if (!j) fprintf(stderr, "%s: %s (line %d)\n", path, err.text, err.line);
    return j;
}

/* "a_shape 128+3968", "tri_shape 128+3968+100", "block_sparse 100",
 * "vertical_slash 1000+6096" -> the pattern; 0 for anything else */
static inline int crossover_parse_pattern(const char *name, mi_head_pattern *p) {
    int a = 0, b = 0, c = 0;
    if (!name) return 0;
    if (sscanf(name, "a_shape %d+%d", &a, &b) == 2) {
        *p = mi_head_pattern_default(MI_PATTERN_A_SHAPE);
        p->n_init = a, p->n_local = b;
    } else if (sscanf(name, "tri_shape %d+%d+%d", &a, &b, &c) == 3) {
        *p = mi_head_pattern_default(MI_PATTERN_TRI_SHAPE);
        p->n_init = a, p->n_local = b, p->n_last = c;
    } else if (sscanf(name, "block_sparse %d", &a) == 1) {
        *p = mi_head_pattern_default(MI_PATTERN_BLOCK_SPARSE);
        p->top_k = a;
    } else if (sscanf(name, "vertical_slash %d+%d", &a, &b) == 2) {
        *p = mi_head_pattern_default(MI_PATTERN_VERTICAL_SLASH);
        p->vertical_size = a, p->slash_size = b;
    } else {
        return 0;
    }
    return 1;
}

/* The rows of one measurement file as series of one pattern and head count each, in all (at most
 * CROSSOVER_MAX_SERIES); returns how many, or -1 if a row names no known pattern. */
static inline int crossover_series_of_rows(const json_t *j, int64_t head_dim,
                                           crossover_series *all) {
    int n_series = 0;
    size_t i;
    const json_t *r;
    json_array_foreach(json_object_get(j, "rows"), i, r) {
        mi_head_pattern p;
        if (!crossover_parse_pattern(json_string_value(json_object_get(r, "pattern")), &p))
            return -1;
        const int64_t heads = json_integer_value(json_object_get(r, "heads"));
        int k = 0;
        while (k < n_series && !(all[k].heads == heads && !memcmp(&all[k].pat, &p, sizeof p))) k++;
        if (k == n_series) {
            if (n_series == CROSSOVER_MAX_SERIES) continue;
            memset(&all[k], 0, sizeof all[k]);
            all[k].pat = p;
            all[k].heads = heads;
            all[k].head_dim = head_dim;
            n_series++;
        }
        if (all[k].n == CROSSOVER_MAX_LENGTHS) continue;
        all[k].len[all[k].n] = json_integer_value(json_object_get(r, "L"));
        all[k].speedup[all[k].n++] = json_number_value(json_object_get(r, "speedup"));
    }
    return n_series;
}

/* A test's main: argv[1] is the folder of the measurements (tests/data/crossover); returns the
 * exit status. */
static inline int crossover_test_main(int argc, char **argv, const char *name,
                                      void (*measured)(const char *dir), void (*properties)(void)) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s DATA_DIR\n", argv[0]);
        return 2;
    }
    measured(argv[1]);
    properties();
    return check_finish(name);
}

#endif /* MI_TEST_CROSSOVER_SERIES_H */
