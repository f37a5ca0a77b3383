/*
 * cmd_scbench_matrix.c: the method matrix of `minference scbench`: the --attn and --kv lists,
 * with "all" standing for every prefill pattern or every KV method the library has (from its
 * tables, so a new pattern or method joins the matrix without an edit here). The harness runs
 * every attn x kv pair, attn-major, each pair with its own sessions.
 */
#define _POSIX_C_SOURCE 200809L
#include "minference.h"
#include "minference_session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_scbench.h"

static bool add(char **out, int *n, int max, const char *s, char *why, size_t cap) {
    for (int i = 0; i < *n; i++)
        if (!strcmp(out[i], s)) return true; /* a method named twice runs once */
    if (*n >= max) {
        snprintf(why, cap, "more than %d entries", max);
        return false;
    }
    out[*n] = strdup(s);
    if (!out[*n]) {
        snprintf(why, cap, "out of memory");
        return false;
    }
    (*n)++;
    return true;
}

static int fail(char **out, int n) {
    sc_free_list(out, n);
    return -1;
}

int sc_attn_list(const char *arg, char **out, int max, char *why, size_t cap) {
    int n = 0;
    char *copy = arg ? strdup(arg) : NULL;
    if (!copy) {
        snprintf(why, cap, "no --attn list");
        return -1;
    }
    for (char *save = NULL, *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!*t) continue;
        if (strcmp(t, "all")) {
            if (!add(out, &n, max, t, why, cap)) return free(copy), fail(out, n);
            continue;
        }
        /* every pattern by its short name; "minference" is the config (vertical-slash on every
         * head without one), which is what a vertical-slash name selects too */
        bool ok = add(out, &n, max, "dense", why, cap) && add(out, &n, max, "minference", why, cap);
        for (int32_t p = 0; ok && p < mi_pattern_count(); p++) {
            if (p == MI_PATTERN_DENSE || p == MI_PATTERN_VERTICAL_SLASH) continue;
            const char *alias = mi_pattern_alias((mi_pattern_type)p, 0);
            const char *name = alias ? alias : mi_pattern_name((mi_pattern_type)p);
            ok = name && add(out, &n, max, name, why, cap);
        }
        if (!ok) return free(copy), fail(out, n);
    }
    free(copy);
    if (!n) {
        snprintf(why, cap, "empty --attn list");
        return -1;
    }
    return n;
}

/* One --kv entry: separated by ';', or by ',' where the next part starts a method (a part with
 * '=' before any ':' continues the previous spec's key=value list: "dense,snapkv:a=1,b=2"). */
int sc_kv_list(const char *arg, char **out, int max, char *why, size_t cap) {
    int n = 0;
    char *copy = arg ? strdup(arg) : NULL;
    if (!copy) {
        snprintf(why, cap, "no --kv list");
        return -1;
    }
    for (char *save = NULL, *piece = strtok_r(copy, ";", &save); piece;
         piece = strtok_r(NULL, ";", &save)) {
        for (char *p = piece; p && *p;) {
            char *start = p, *cut = NULL;
            for (char *c = strchr(p, ','); c; c = strchr(c + 1, ',')) {
                const char *next = c + 1;
                const char *eq = strchr(next, '='), *colon = strchr(next, ':');
                const char *end = strchr(next, ',');
                const bool cont = eq && (!end || eq < end) && (!colon || colon > eq);
                if (!cont) {
                    cut = c;
                    break;
                }
            }
            if (cut) *cut = 0;
            p = cut ? cut + 1 : NULL;
            if (!*start) continue;
            bool ok = true;
            if (!strcmp(start, "all"))
                for (int32_t i = 0; ok && i < mi_session_kv_method_count(); i++)
                    ok = add(out, &n, max, mi_session_kv_method_name(i), why, cap);
            else
                ok = add(out, &n, max, start, why, cap);
            if (!ok) return free(copy), fail(out, n);
        }
    }
    free(copy);
    if (!n) {
        snprintf(why, cap, "empty --kv list");
        return -1;
    }
    return n;
}

void sc_free_list(char **v, int n) {
    for (int i = 0; v && i < n; i++) {
        free(v[i]);
        v[i] = NULL;
    }
}
