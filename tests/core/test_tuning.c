/*
 * The tuning struct (include/minference.h): defaults, the text form, and validation. A bad name
 * or value is INVALID_ARGUMENT with a message naming the field, and changes nothing.
 */
#include "../check.h"
#include "minference.h"

#include <string.h>

static int same(const mi_tuning *a, const mi_tuning *b) { return memcmp(a, b, sizeof *a) == 0; }

/* The message of ctx names `field`. */
static int message_names(const mi_context *ctx, const char *field) {
    return strstr(mi_context_last_error(ctx), field) != NULL;
}

/* Each spec must be refused, naming `field`, with the tuning and the context's unchanged. */
static void expect_bad(mi_context *ctx, const char *spec, const char *field) {
    mi_tuning t = mi_tuning_default(), before;
    t.bs_cap = 128; /* something to keep */
    before = t;
    mi_tuning ctx_before, ctx_after;
    CHECK_STATUS(mi_context_get_tuning(ctx, &ctx_before), MI_STATUS_SUCCESS);
    CHECK_STATUS(mi_tuning_parse(ctx, spec, &t), MI_STATUS_INVALID_ARGUMENT);
    CHECK(same(&t, &before));
    if (!message_names(ctx, field))
        fprintf(stderr, "spec \"%s\": message \"%s\" does not name %s\n", spec,
                mi_context_last_error(ctx), field);
    CHECK(message_names(ctx, field));
    CHECK_STATUS(mi_context_parse_tuning(ctx, spec), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_context_get_tuning(ctx, &ctx_after), MI_STATUS_SUCCESS);
    CHECK(same(&ctx_before, &ctx_after));
}

int main(void) {
    mi_context *ctx = NULL;
    mi_context_params p = mi_context_default_params();
    CHECK_STATUS(mi_context_create(&p, &ctx), MI_STATUS_SUCCESS);
    if (!ctx) return 1;

    /* the default: every field 0, and what a new context has */
    const mi_tuning def = mi_tuning_default();
    mi_tuning zero, t;
    memset(&zero, 0, sizeof zero);
    CHECK(same(&def, &zero));
    CHECK_STATUS(mi_context_get_tuning(ctx, &t), MI_STATUS_SUCCESS);
    CHECK(same(&t, &def));
    char buf[512];
    CHECK(mi_tuning_format(&def, buf, sizeof buf) == 0 && buf[0] == '\0');

    /* the text form: integers and words, later items win, empty items skipped */
    t = def;
    CHECK_STATUS(mi_tuning_parse(ctx, "", &t), MI_STATUS_SUCCESS);
    CHECK(same(&t, &def));
    CHECK_STATUS(mi_tuning_parse(ctx,
                                 "cpu_engine=base,sm90=off,sm90_sparse=on,sm90_plan_tiles=3,"
                                 "tri_split=1,bs_bound=32,bs_cap=256,bs_split=-1,,"
                                 "bs_bound_slack=400,bs_rows=2,bs_wide=auto,bs_wide=1,",
                                 &t),
                 MI_STATUS_SUCCESS);
    CHECK(t.cpu_engine == 1 && t.sm90 == -1 && t.sm90_sparse == 1 && t.sm90_plan_tiles == 3);
    CHECK(t.tri_split == 1 && t.bs_bound == 32 && t.bs_cap == 256 && t.bs_split == -1);
    CHECK(t.bs_bound_slack == 400 && t.bs_rows == 2 && t.bs_wide == 1);
    CHECK(t.vs_wgmma == 0 && t.bs_scores == 0);

    /* format and parse again: the same tuning; the length as snprintf gives it */
    const int n = mi_tuning_format(&t, buf, sizeof buf);
    CHECK(n > 0 && (size_t)n == strlen(buf));
    CHECK(strstr(buf, "sm90=-1") != NULL && strstr(buf, "bs_split=-1") != NULL);
    CHECK(strstr(buf, "vs_wgmma") == NULL);
    mi_tuning u = def;
    CHECK_STATUS(mi_tuning_parse(ctx, buf, &u), MI_STATUS_SUCCESS);
    CHECK(same(&t, &u));
    char small[8];
    CHECK(mi_tuning_format(&t, small, sizeof small) == n && strlen(small) == sizeof small - 1);
    CHECK(mi_tuning_format(&t, NULL, 0) == n);

    /* every field by name, each to a value it takes */
    static const char *const fields[] = {"cpu_engine",
                                         "sm90",
                                         "sm90_dense",
                                         "sm90_sparse",
                                         "sm90_a_shape",
                                         "sm90_column_copies",
                                         "sm90_plan_tiles",
                                         "sm90_tma_store",
                                         "tri_split",
                                         "vs_wgmma",
                                         "vs_score_tma",
                                         "vs_index_mask",
                                         "vs_index_shortcuts",
                                         "bs_scores",
                                         "bs_wgmma",
                                         "bs_score_tma",
                                         "bs_bound_slack",
                                         "bs_stream",
                                         "bs_rows",
                                         "bs_wide",
                                         "bs_bound",
                                         "bs_cap",
                                         "bs_split",
                                         "bs_mask_append",
                                         "bs_pool_vec",
                                         "rowmask_two_pass"};
    CHECK(sizeof fields / sizeof fields[0] * sizeof(int32_t) == sizeof(mi_tuning));
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        char spec[64];
        const int value = strcmp(fields[i], "bs_cap") == 0 ? 128 : 1;
        snprintf(spec, sizeof spec, "%s=%d", fields[i], value);
        u = def;
        CHECK_STATUS(mi_tuning_parse(ctx, spec, &u), MI_STATUS_SUCCESS);
        CHECK(!same(&u, &def));
        CHECK(mi_tuning_format(&u, buf, sizeof buf) > 0 && strcmp(buf, spec) == 0);
    }

    /* the context's tuning: set, get, parse on top */
    CHECK_STATUS(mi_context_set_tuning(ctx, &t), MI_STATUS_SUCCESS);
    CHECK_STATUS(mi_context_get_tuning(ctx, &u), MI_STATUS_SUCCESS);
    CHECK(same(&t, &u));
    CHECK_STATUS(mi_context_parse_tuning(ctx, "bs_cap=128"), MI_STATUS_SUCCESS);
    CHECK_STATUS(mi_context_get_tuning(ctx, &u), MI_STATUS_SUCCESS);
    CHECK(u.bs_cap == 128 && u.sm90 == -1);
    /* the same text as mi_tuning_format of the struct, for bindings */
    char a[512], b[512];
    CHECK(mi_context_format_tuning(ctx, a, sizeof a) == mi_tuning_format(&u, b, sizeof b));
    CHECK(strcmp(a, b) == 0 && strstr(a, "bs_cap=128") != NULL, "%s / %s", a, b);
    CHECK(mi_context_format_tuning(NULL, a, sizeof a) == -1 && a[0] == 0);

    /* bad names and values */
    expect_bad(ctx, "no_such_field=1", "no_such_field");
    expect_bad(ctx, "sm90", "sm90");
    expect_bad(ctx, "sm90=", "sm90");
    expect_bad(ctx, "sm90=2", "sm90");
    expect_bad(ctx, "sm90=-2", "sm90");
    expect_bad(ctx, "sm90=1x", "sm90");
    expect_bad(ctx, "cpu_engine=2", "cpu_engine");
    expect_bad(ctx, "cpu_engine=-1", "cpu_engine");
    expect_bad(ctx, "sm90_sparse=base", "sm90_sparse");
    expect_bad(ctx, "sm90_plan_tiles=-1", "sm90_plan_tiles");
    expect_bad(ctx, "tri_split=-2", "tri_split");
    expect_bad(ctx, "bs_bound=3", "bs_bound");
    expect_bad(ctx, "bs_bound=64", "bs_bound");
    expect_bad(ctx, "bs_cap=100", "bs_cap");
    expect_bad(ctx, "bs_cap=-1", "bs_cap");
    expect_bad(ctx, "bs_split=-2", "bs_split");
    expect_bad(ctx, "bs_rows=-1", "bs_rows");
    expect_bad(ctx, "bs_bound_slack=-2", "bs_bound_slack");
    expect_bad(ctx, "bs_wide=99999999999", "bs_wide");
    expect_bad(ctx, "bs_cap=128,bs_split=-3", "bs_split"); /* nothing of it applied */

    /* a struct with a bad field: refused, the context keeps its tuning */
    mi_tuning before;
    CHECK_STATUS(mi_context_get_tuning(ctx, &before), MI_STATUS_SUCCESS);
    mi_tuning bad = def;
    bad.bs_bound = 5;
    CHECK_STATUS(mi_context_set_tuning(ctx, &bad), MI_STATUS_INVALID_ARGUMENT);
    CHECK(message_names(ctx, "bs_bound"));
    bad = def;
    bad.sm90_dense = 7;
    CHECK_STATUS(mi_context_set_tuning(ctx, &bad), MI_STATUS_INVALID_ARGUMENT);
    CHECK(message_names(ctx, "sm90_dense"));
    CHECK_STATUS(mi_context_get_tuning(ctx, &u), MI_STATUS_SUCCESS);
    CHECK(same(&u, &before));

    /* NULL arguments */
    CHECK_STATUS(mi_context_set_tuning(NULL, &def), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_context_set_tuning(ctx, NULL), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_context_get_tuning(NULL, &u), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_context_get_tuning(ctx, NULL), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_tuning_parse(ctx, NULL, &u), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_tuning_parse(ctx, "sm90=1", NULL), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_tuning_parse(NULL, "sm90=5", &u), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_context_parse_tuning(NULL, "sm90=1"), MI_STATUS_INVALID_ARGUMENT);
    CHECK(mi_tuning_format(NULL, buf, sizeof buf) == 0 && buf[0] == '\0');

    mi_context_destroy(ctx);
    return check_finish("core.tuning");
}
