/*
 * test_model_rope.c: RoPE frequencies for plain, linear, dynamic NTK, llama3 and YaRN scaling
 * against the numbers transformers' rope initialisation functions give (rope_fixture.json,
 * written by gen_rope_fixture.py), the cos/sin table, and the two rotation layouts.
 */
#include "model_internal.h"
#include "model_test_util.h"

#include <jansson.h>

static double num(json_t *o, const char *k, double d) {
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : d;
}

static void check_case(json_t *c) {
    const char *name = json_string_value(json_object_get(c, "name"));
    const char *type = json_string_value(json_object_get(c, "type"));
    json_t *p = json_object_get(c, "params");
    int dim = (int)num(c, "dim", 0);
    mi_rope_scaling sc;
    memset(&sc, 0, sizeof(sc));
    sc.type = strcmp(type, "linear") == 0    ? MI_ROPE_LINEAR
              : strcmp(type, "dynamic") == 0 ? MI_ROPE_DYNAMIC
              : strcmp(type, "llama3") == 0  ? MI_ROPE_LLAMA3
              : strcmp(type, "yarn") == 0    ? MI_ROPE_YARN
                                             : MI_ROPE_NONE;
    sc.factor = num(p, "factor", 1.0);
    sc.original_context =
        (int64_t)num(p, "original_max_position_embeddings", num(c, "max_position_embeddings", 0));
    sc.low_freq_factor = num(p, "low_freq_factor", 1.0);
    sc.high_freq_factor = num(p, "high_freq_factor", 4.0);
    sc.beta_fast = num(p, "beta_fast", 32.0);
    sc.beta_slow = num(p, "beta_slow", 1.0);
    sc.attention_factor = num(p, "attention_factor", 0.0);
    int64_t seq = (int64_t)num(c, "seq_len", 0);
    float inv[256], mscale = 0;
    CHECK(mi_rope_frequencies(dim, num(c, "theta", 0), &sc, seq, inv, &mscale) == MI_STATUS_SUCCESS,
          "%s", name);
    json_t *ref = json_object_get(c, "inv_freq");
    CHECK((int)json_array_size(ref) == dim / 2, "%s: fixture size", name);
    for (int i = 0; i < dim / 2; i++) {
        double r = json_number_value(json_array_get(ref, (size_t)i));
        /* fp32 results of the same formula: a few ulps apart at most */
        CHECK(fabs(inv[i] - r) <= 4e-7 * fabs(r) + 1e-12, "%s inv_freq[%d] = %.9g, want %.9g", name,
              i, inv[i], r);
    }
    CHECK(fabs(mscale - num(c, "mscale", 1)) < 1e-6, "%s mscale %g", name, mscale);
    /* cos/sin at a few positions from the fixture's own frequencies: at position 1e5 one ulp of
     * inv_freq moves the angle by ~1e-3, so the table is checked apart from the frequencies. */
    float ref_inv[256];
    for (int i = 0; i < dim / 2; i++)
        ref_inv[i] = (float)json_number_value(json_array_get(ref, (size_t)i));
    size_t k;
    json_t *row;
    json_array_foreach(json_object_get(c, "table"), k, row) {
        int64_t pos = (int64_t)num(row, "pos", 0);
        float ct[128], st[128];
        mim_rope_table(ref_inv, mscale, dim, pos, 1, ct, st);
        for (int i = 0; i < 4; i++) {
            double rc = json_number_value(json_array_get(json_object_get(row, "cos"), (size_t)i));
            double rs = json_number_value(json_array_get(json_object_get(row, "sin"), (size_t)i));
            CHECK(fabs(ct[i] - rc) < 2e-6 && fabs(st[i] - rs) < 2e-6,
                  "%s pos %lld dim %d: cos %g/%g sin %g/%g", name, (long long)pos, i, ct[i], rc,
                  st[i], rs);
        }
    }
}

/* Adjacent-pair rotation on permuted rows equals half-split rotation on the original rows. */
static void test_layouts(void) {
    enum { HD = 16, HALF = 8, POS = 5 };
    float x[HD], xp[HD], inv[HALF], ms, ct[HALF], st[HALF];
    for (int i = 0; i < HD; i++) x[i] = (float)(i + 1) * 0.25f - 1.0f;
    for (int j = 0; j < HALF; j++) {
        xp[2 * j] = x[j];
        xp[2 * j + 1] = x[j + HALF];
    }
    mim_rope r;
    memset(&r, 0, sizeof(r));
    r.dim = HD;
    r.theta = 10000.0;
    mim_rope_freqs(&r, 0, inv, &ms);
    mim_rope_table(inv, ms, HD, POS, 1, ct, st);
    r.neox = true;
    mim_rope_apply(&r, x, 1, 1, HD, HD, ct, st);
    r.neox = false;
    mim_rope_apply(&r, xp, 1, 1, HD, HD, ct, st);
    for (int j = 0; j < HALF; j++)
        CHECK(fabsf(xp[2 * j] - x[j]) < 1e-6f && fabsf(xp[2 * j + 1] - x[j + HALF]) < 1e-6f,
              "layouts disagree at %d", j);
    /* rotation keeps the norm of each pair */
    float a = 0.3f, b = -0.7f, v[2] = {a, b};
    r.dim = 2; /* one pair, rotated by the table's first angle */
    mim_rope_apply(&r, v, 1, 1, 2, 2, ct, st);
    CHECK(fabsf(v[0] * v[0] + v[1] * v[1] - (a * a + b * b)) < 1e-6f, "norm");
    CHECK(mi_rope_frequencies(3, 10000, NULL, 0, inv, &ms) == MI_STATUS_INVALID_ARGUMENT, "odd");
    CHECK(mi_rope_frequencies(16, 0, NULL, 0, inv, &ms) == MI_STATUS_INVALID_ARGUMENT, "theta");
    CHECK(mi_rope_frequencies(16, 10000, NULL, 0, NULL, &ms) == MI_STATUS_INVALID_ARGUMENT, "NULL");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s rope_fixture.json\n", argv[0]);
        return 2;
    }
    json_error_t jerr;
    json_t *fx = json_load_file(argv[1], 0, &jerr);
    CHECK(fx != NULL, "%s: %s", argv[1], jerr.text);
    size_t i;
    json_t *c;
    int n = 0;
    json_array_foreach(json_object_get(fx, "cases"), i, c) {
        check_case(c);
        n++;
    }
    CHECK(n >= 7, "fixture has %d cases", n);
    json_decref(fx);
    test_layouts();
    return check_finish("test_model_rope");
}
