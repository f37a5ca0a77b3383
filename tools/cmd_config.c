/*
 * cmd_config.c: `minference config validate FILE [--layers N --heads H]` and
 * `minference config show FILE`.
 */
#include "args.h"
#include "cli.h"
#include "minference.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: minference config validate FILE [--layers N] [--heads H]\n"
    "       minference config show FILE\n"
    "\n"
    "validate  parse FILE (the original's per-head pattern JSON); with --layers / --heads also\n"
    "          check that it fits a model of that shape. Exit 0 when valid, 1 otherwise.\n"
    "show      a per-layer summary: pattern counts and the budget mix.\n";

static mi_config *load(const char *path, mi_context *ctx) {
    mi_config *cfg = NULL;
    mi_status st = mi_config_load(ctx, path, &cfg);
    if (st != MI_STATUS_SUCCESS) {
        const char *msg = mi_context_last_error(ctx);
        fprintf(stderr, "minference config: %s: %s\n", mi_status_name(st),
                msg && msg[0] ? msg : mi_status_string(st));
        return NULL;
    }
    return cfg;
}

static int cmd_validate(int argc, char **argv, mi_context *ctx) {
    int layers = -1, heads = -1;
    bool have_layers = false, have_heads = false;
    const arg_spec specs[] = {
        {"layers", ARG_INT, &layers, 0, INT32_MAX, &have_layers},
        {"heads", ARG_INT, &heads, 0, INT32_MAX, &have_heads},
    };
    const char *pos[1];
    int np = 0;
    args_result r = args_parse("config validate", usage, specs, 2, argc, argv, pos, 1, &np);
    if (r != ARGS_OK) return r == ARGS_HELP ? 0 : 2;
    if (np != 1) {
        fprintf(stderr, "minference config validate: FILE is required\n\n%s", usage);
        return 2;
    }
    mi_config *cfg = load(pos[0], ctx);
    if (!cfg) return 1;
    int rc = 0;
    if (have_layers || have_heads) {
        /* An unspecified dimension is not checked. */
        int32_t L = have_layers ? layers : INT32_MAX, H = have_heads ? heads : INT32_MAX;
        mi_status st = mi_config_check(ctx, cfg, L, H);
        if (st != MI_STATUS_SUCCESS) {
            fprintf(stderr, "minference config: %s: %s: %s\n", pos[0], mi_status_name(st),
                    mi_context_last_error(ctx));
            rc = 1;
        }
    }
    if (rc == 0)
        printf("%s: valid (%d layers, %d heads)\n", pos[0], (int)mi_config_n_layers(cfg),
               (int)mi_config_n_heads(cfg));
    mi_config_destroy(cfg);
    return rc;
}

#define MAX_PATTERNS 32

/* A pattern's short name: its first alias ("a_shape" for "stream_llm"), else its name. */
static const char *short_name(int32_t t) {
    const char *alias = mi_pattern_alias((mi_pattern_type)t, 0);
    return alias ? alias : mi_pattern_name((mi_pattern_type)t);
}

typedef struct budget {
    mi_pattern_type type;
    int32_t a, b; /* the two size fields as the file holds them */
    int count;
} budget;

static void budget_add(budget **list, int *n, int *cap, const mi_head_pattern *p) {
    int32_t a = p->vertical_size, b = p->slash_size;
    mi_head_pattern_sizes(p, &a, &b);
    for (int i = 0; i < *n; i++) {
        if ((*list)[i].type == p->type && (*list)[i].a == a && (*list)[i].b == b) {
            (*list)[i].count++;
            return;
        }
    }
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 16;
        budget *nl = realloc(*list, (size_t)nc * sizeof *nl);
        if (!nl) return; /* a summary line short of one budget beats failing the command */
        *list = nl;
        *cap = nc;
    }
    (*list)[(*n)++] = (budget){p->type, a, b, 1};
}

static int cmp_budget(const void *x, const void *y) {
    const budget *a = x, *b = y;
    return (a->count < b->count) - (a->count > b->count);
}

static void print_budgets(budget *list, int n) {
    if (n > 1) qsort(list, (size_t)n, sizeof *list, cmp_budget); /* list is NULL when n == 0 */
    for (int i = 0; i < n; i++) {
        const char *name = mi_pattern_name(list[i].type);
        if (list[i].type == MI_PATTERN_VERTICAL_SLASH)
            printf("%s(%d,%d)x%d", i ? ", " : "", (int)list[i].a, (int)list[i].b, list[i].count);
        else
            printf("%s%s(%d,%d)x%d", i ? ", " : "", name, (int)list[i].a, (int)list[i].b,
                   list[i].count);
    }
    printf("\n");
}

static int cmd_show(int argc, char **argv, mi_context *ctx) {
    const char *pos[1];
    int np = 0;
    args_result r = args_parse("config show", usage, NULL, 0, argc, argv, pos, 1, &np);
    if (r != ARGS_OK) return r == ARGS_HELP ? 0 : 2;
    if (np != 1) {
        fprintf(stderr, "minference config show: FILE is required\n\n%s", usage);
        return 2;
    }
    mi_config *cfg = load(pos[0], ctx);
    if (!cfg) return 1;
    const int32_t n_layers = mi_config_n_layers(cfg), n_heads = mi_config_n_heads(cfg);
    mi_head_pattern *pats = calloc(n_heads > 0 ? (size_t)n_heads : 1, sizeof *pats);
    double *scores = calloc(n_heads > 0 ? (size_t)n_heads : 1, sizeof *scores);
    budget *all = NULL;
    int n_all = 0, cap_all = 0, rc = 0;
    if (!pats || !scores) {
        fprintf(stderr, "minference config show: out of memory\n");
        rc = 1;
        goto done;
    }
    printf("%s: %d layers x %d heads (heads missing from a layer get vertical_and_slash "
           "1000/6096)\n",
           pos[0], (int)n_layers, (int)n_heads);
    /* a column of head counts per pattern, in the library's order, under its short name */
    const int32_t n_types = mi_pattern_count() < MAX_PATTERNS ? mi_pattern_count() : MAX_PATTERNS;
    printf("%-6s", "layer");
    int width[MAX_PATTERNS];
    for (int32_t t = 0; t < n_types; t++) {
        width[t] = strlen(short_name(t)) > 6 ? (int)strlen(short_name(t)) : 6;
        printf(" %*s", width[t], short_name(t));
    }
    printf("  %s\n", "budget mix (vertical, slash) x heads");
    for (int32_t l = 0; l < n_layers; l++) {
        int counts[MAX_PATTERNS] = {0};
        budget *mix = NULL;
        int n_mix = 0, cap_mix = 0;
        if (mi_config_layer(ctx, cfg, l, n_heads, pats, scores) != MI_STATUS_SUCCESS) {
            fprintf(stderr, "minference config show: %s\n", mi_context_last_error(ctx));
            rc = 1;
            goto done;
        }
        for (int32_t h = 0; h < n_heads; h++) {
            if ((int)pats[h].type >= 0 && (int)pats[h].type < n_types) counts[pats[h].type]++;
            budget_add(&mix, &n_mix, &cap_mix, &pats[h]);
            budget_add(&all, &n_all, &cap_all, &pats[h]);
        }
        printf("%-6d", (int)l);
        for (int32_t t = 0; t < n_types; t++) printf(" %*d", width[t], counts[t]);
        printf("  ");
        print_budgets(mix, n_mix);
        free(mix);
    }
    printf("total: ");
    print_budgets(all, n_all);
done:
    free(all);
    free(pats);
    free(scores);
    mi_config_destroy(cfg);
    return rc;
}

int mi_cmd_config(int argc, char **argv) {
    if (argc < 1) {
        fprintf(stderr, "minference config: a subcommand (validate or show) is required\n\n%s",
                usage);
        return 2;
    }
    if (strcmp(argv[0], "-h") == 0 || strcmp(argv[0], "--help") == 0) {
        fputs(usage, stdout);
        return 0;
    }
    mi_context *ctx = NULL;
    mi_context_params cp = mi_context_default_params();
    if (mi_context_create(&cp, &ctx) != MI_STATUS_SUCCESS) {
        fprintf(stderr, "minference config: cannot create a context\n");
        return 1;
    }
    int rc;
    if (strcmp(argv[0], "validate") == 0)
        rc = cmd_validate(argc - 1, argv + 1, ctx);
    else if (strcmp(argv[0], "show") == 0)
        rc = cmd_show(argc - 1, argv + 1, ctx);
    else {
        fprintf(stderr, "minference config: unknown subcommand '%s'\n\n%s", argv[0], usage);
        rc = 2;
    }
    mi_context_destroy(ctx);
    return rc;
}
