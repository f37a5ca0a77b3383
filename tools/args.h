/*
 * args.h: the small command-line parser shared by the minference subcommands.
 *
 * Flags are "--name value" or "--name=value"; boolean flags take no value, and a flag with an
 * optional value (ARG_OPT_STR) takes one only as "--name=value". Anything not starting with "--"
 * is a positional argument. An unknown flag or a bad value prints the problem and the usage on
 * stderr; the caller then exits with status 2.
 */
#ifndef MI_TOOLS_ARGS_H
#define MI_TOOLS_ARGS_H

#include <stdbool.h>

typedef enum arg_kind {
    ARG_INT,     /* int value, range-checked against min/max */
    ARG_STR,     /* const char * value (points into argv) */
    ARG_BOOL,    /* bool, set to true when present */
    ARG_INT64,   /* long long value, range-checked against min/max */
    ARG_DOUBLE,  /* double value, any finite number (the caller checks its range) */
    ARG_OPT_STR, /* const char * value, set by "--name=value" only; a bare "--name" leaves it
                  * as it is (give seen to tell that the flag appeared) */
} arg_kind;

typedef struct arg_spec {
    const char *name; /* without the leading "--" */
    arg_kind kind;
    void *value;        /* int *, const char **, bool *, long long * or double * */
    long long min, max; /* ARG_INT and ARG_INT64 only */
    bool *seen;         /* optional: set when the flag appears */
} arg_spec;

typedef enum args_result {
    ARGS_OK = 0,
    ARGS_HELP = 1,  /* --help or -h: usage printed on stdout */
    ARGS_ERROR = 2, /* message and usage printed on stderr */
} args_result;

/* Parses argv[0..argc-1] (no program or subcommand name). Positionals go to positional[], at most
 * max_positional of them (more is an error). usage is printed on error or help. */
args_result args_parse(const char *command, const char *usage, const arg_spec *specs, int n_specs,
                       int argc, char **argv, const char **positional, int max_positional,
                       int *n_positional);

/* Prints "minference COMMAND: message" and the usage on stderr, as args_parse does for its own
 * errors, and returns ARGS_ERROR: for checks a command makes on the values after parsing. */
args_result args_error(const char *command, const char *usage, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* MI_TOOLS_ARGS_H */
