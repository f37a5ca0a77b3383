/* args.c: the shared flag parser of the minference CLI. */
#include "args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static args_result fail(const char *command, const char *usage, const char *fmt, const char *a,
                        const char *b) {
    fprintf(stderr, "minference %s: ", command);
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n\n%s", usage);
    return ARGS_ERROR;
}

static bool parse_int(const char *text, long long min, long long max, int *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || !end || end == text || *end != '\0' || v < min || v > max) return false;
    *out = (int)v;
    return true;
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
                return fail(command, usage, "unknown option '%s'%s", a, "");
            if (np >= max_positional)
                return fail(command, usage, "unexpected argument '%s'%s", a, "");
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
        if (!spec) return fail(command, usage, "unknown option '%s'%s", a, "");
        if (spec->seen) *spec->seen = true;
        if (spec->kind == ARG_BOOL) {
            if (eq) return fail(command, usage, "option '--%s' takes no value%s", spec->name, "");
            *(bool *)spec->value = true;
            continue;
        }
        const char *value = eq ? eq + 1 : NULL;
        if (!value) {
            if (i + 1 >= argc)
                return fail(command, usage, "option '--%s' needs a value%s", spec->name, "");
            value = argv[++i];
        }
        if (spec->kind == ARG_STR) {
            *(const char **)spec->value = value;
        } else if (!parse_int(value, spec->min, spec->max, (int *)spec->value)) {
            char range[96];
            snprintf(range, sizeof range, " (an integer in [%lld, %lld])", spec->min, spec->max);
            fprintf(stderr, "minference %s: bad value '%s' for '--%s'%s\n\n%s", command, value,
                    spec->name, range, usage);
            return ARGS_ERROR;
        }
    }
    if (n_positional) *n_positional = np;
    return ARGS_OK;
}
