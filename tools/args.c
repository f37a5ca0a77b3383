/* args.c: the shared flag parser of the minference CLI. */
#include "args.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

args_result args_error(const char *command, const char *usage, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "minference %s: ", command);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n\n%s", usage);
    va_end(ap);
    return ARGS_ERROR;
}

static bool parse_int(const char *text, long long min, long long max, long long *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || !end || end == text || *end != '\0' || v < min || v > max) return false;
    *out = v;
    return true;
}

static bool parse_double(const char *text, double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || !end || end == text || *end != '\0' || !isfinite(v)) return false;
    *out = v;
    return true;
}

/* Stores value into a flag of kind ARG_INT, ARG_INT64 or ARG_DOUBLE; false when it is bad. */
static bool store_number(const arg_spec *spec, const char *value) {
    long long v = 0;
    switch (spec->kind) {
    case ARG_DOUBLE: return parse_double(value, (double *)spec->value);
    case ARG_INT64: return parse_int(value, spec->min, spec->max, (long long *)spec->value);
    default:
        if (!parse_int(value, spec->min, spec->max, &v)) return false;
        *(int *)spec->value = (int)v;
        return true;
    }
}

args_result args_parse(const char *command, const char *usage, const arg_spec *specs, int n_specs,
                       int argc, char **argv, const char **positional, int max_positional,
                       int *n_positional) {
    int np = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(usage, stdout);
            return ARGS_HELP;
        }
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
            if (a[0] == '-' && a[1] != '\0' && strcmp(a, "--") != 0)
                return args_error(command, usage, "unknown option '%s'", a);
            if (np >= max_positional)
                return args_error(command, usage, "unexpected argument '%s'", a);
            positional[np++] = a;
            continue;
        }
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t name_len = eq ? (size_t)(eq - name) : strlen(name);
        const arg_spec *spec = NULL;
        for (int s = 0; s < n_specs; s++) {
            if (strlen(specs[s].name) == name_len && strncmp(specs[s].name, name, name_len) == 0) {
                spec = &specs[s];
                break;
            }
        }
        if (!spec) return args_error(command, usage, "unknown option '%s'", a);
        if (spec->seen) *spec->seen = true;
        if (spec->kind == ARG_BOOL) {
            if (eq) return args_error(command, usage, "option '--%s' takes no value", spec->name);
            *(bool *)spec->value = true;
            continue;
        }
        if (spec->kind == ARG_OPT_STR) {
            if (eq) *(const char **)spec->value = eq + 1;
            continue;
        }
        const char *value = eq ? eq + 1 : NULL;
        if (!value) {
            if (i + 1 >= argc)
                return args_error(command, usage, "option '--%s' needs a value", spec->name);
            value = argv[++i];
        }
        if (spec->kind == ARG_STR) {
            *(const char **)spec->value = value;
        } else if (!store_number(spec, value)) {
            if (spec->kind == ARG_DOUBLE)
                return args_error(command, usage, "bad value '%s' for '--%s' (a number)", value,
                                  spec->name);
            return args_error(command, usage,
                              "bad value '%s' for '--%s' (an integer in [%lld, %lld])", value,
                              spec->name, spec->min, spec->max);
        }
    }
    if (n_positional) *n_positional = np;
    return ARGS_OK;
}
