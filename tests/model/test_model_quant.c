/*
 * test_model_quant.c: each weight encoding expands to the values of its reference formula
 * (written independently in tiny_model.h's quantizers: x = d q, d (q - 8), d q + m, fp16, bf16),
 * the Q5_0 / Q5_1 / Q4_K / Q5_K / Q6_K expansions equal those of the `gguf` Python package on
 * seeded random blocks (quant_fixture.json), and the fused row dot equals the dot of the
 * expanded row.
 */
#include "model_internal.h"
#include "tiny_model.h"

#include <jansson.h>

static void check_fixture(const char *path) {
    json_error_t jerr;
    json_t *fx = json_load_file(path, 0, &jerr);
    CHECK(fx != NULL, "%s: %s", path, jerr.text);
    size_t i;
    json_t *c;
    int n_cases = 0;
    json_array_foreach(json_object_get(fx, "cases"), i, c) {
        const uint32_t type = (uint32_t)json_integer_value(json_object_get(c, "type"));
        const char *name = json_string_value(json_object_get(c, "name"));
        const int64_t n = (int64_t)json_integer_value(json_object_get(c, "n"));
        const char *hex = json_string_value(json_object_get(c, "hex"));
        json_t *vals = json_object_get(c, "values");
        const size_t nb = strlen(hex) / 2;
        unsigned char *raw = malloc(nb);
        for (size_t k = 0; k < nb; k++) {
            unsigned int byte;
            sscanf(hex + 2 * k, "%2x", &byte);
            raw[k] = (unsigned char)byte;
        }
        uint64_t rb = 0;
        CHECK(mim_type_supported(type) && mim_type_row_bytes(type, (uint64_t)n, &rb) && rb == nb,
              "%s: %llu row bytes for %zu", name, (unsigned long long)rb, nb);
        CHECK(strcmp(mim_type_name(type), name) == 0, "name of type %u", type);
        float *out = malloc((size_t)n * sizeof(float)), *act = malloc((size_t)n * sizeof(float));
        mim_dequant_row(type, raw, out, n);
        double dot_ref = 0;
        int bad = 0;
        for (int64_t k = 0; k < n; k++) {
            const double want = json_number_value(json_array_get(vals, (size_t)k));
            /* same products, possibly associated differently: a few fp32 ulps */
            if (fabs(out[k] - want) > 1e-6 * fabs(want) + 1e-9 && bad++ < 3)
                CHECK(false, "%s element %lld: %.9g, gguf %.9g", name, (long long)k, out[k], want);
            act[k] = tm_rand();
            dot_ref += want * act[k];
        }
        CHECK(bad == 0, "%s: %d elements differ from gguf", name, bad);
        const float dot = mim_dot_row(type, raw, act, n);
        CHECK(fabs(dot - dot_ref) <= 1e-4 * (1.0 + fabs(dot_ref)), "%s dot %g vs %g", name, dot,
              dot_ref);
        free(raw);
        free(out);
        free(act);
        n_cases++;
    }
    CHECK(n_cases == 5, "fixture has %d cases", n_cases);
    json_decref(fx);
}

static void check_type(uint32_t type, int64_t n) {
    float *x = malloc((size_t)n * sizeof(float)), *ref = malloc((size_t)n * sizeof(float));
    float *out = malloc((size_t)n * sizeof(float)), *act = malloc((size_t)n * sizeof(float));
    unsigned char *q = malloc((size_t)n * 4 + 64);
    for (int64_t i = 0; i < n; i++) {
        x[i] = 2.0f * tm_rand() + (i % 7 == 0 ? 0.5f : 0.0f);
        act[i] = tm_rand();
    }
    size_t bytes = 0;
    if (type == MIM_TYPE_F32) {
        memcpy(q, x, (size_t)n * 4);
        memcpy(ref, x, (size_t)n * 4);
        bytes = (size_t)n * 4;
    } else if (type == MIM_TYPE_F16) {
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = mi_f32_to_f16(x[i]);
            memcpy(q + 2 * i, &h, 2);
            ref[i] = mi_f16_to_f32(h);
        }
        bytes = (size_t)n * 2;
    } else if (type == MIM_TYPE_BF16) {
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = mi_f32_to_bf16(x[i]);
            memcpy(q + 2 * i, &h, 2);
            ref[i] = mi_bf16_to_f32(h);
        }
        bytes = (size_t)n * 2;
    } else {
        memcpy(ref, x, (size_t)n * 4);
        bytes = tm_quantize(type, ref, (size_t)n, q); /* ref now holds the formula's values */
    }
    uint64_t rb = 0;
    CHECK(mim_type_row_bytes(type, (uint64_t)n, &rb) && rb == bytes, "%s row bytes %llu vs %zu",
          mim_type_name(type), (unsigned long long)rb, bytes);
    mim_dequant_row(type, q, out, n);
    double dot_ref = 0;
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        if (out[i] != ref[i] && bad++ < 3)
            CHECK(false, "%s element %lld: %g, formula %g", mim_type_name(type), (long long)i,
                  out[i], ref[i]);
        dot_ref += (double)ref[i] * act[i];
    }
    float dot = mim_dot_row(type, q, act, n);
    CHECK(fabs(dot - dot_ref) <= 1e-4 * (1.0 + fabs(dot_ref)), "%s dot %g vs %g",
          mim_type_name(type), dot, dot_ref);
    /* Quantization error stays within half a step of each block's scale. */
    if (type == MIM_TYPE_Q8_0) {
        float amax = 0;
        for (int64_t i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
        for (int64_t i = 0; i < 32; i++)
            CHECK(fabsf(out[i] - x[i]) <= amax / 127.0f * 0.51f + 1e-3f, "Q8_0 error");
    }
    free(x);
    free(ref);
    free(out);
    free(act);
    free(q);
}

int main(int argc, char **argv) {
    tm_rng = 2024;
    if (argc > 1)
        check_fixture(argv[1]);
    else
        CHECK(false, "usage: test_model_quant quant_fixture.json");
    const uint32_t types[] = {MIM_TYPE_F32,  MIM_TYPE_F16,  MIM_TYPE_BF16,
                              MIM_TYPE_Q8_0, MIM_TYPE_Q4_0, MIM_TYPE_Q4_1};
    const int64_t sizes[] = {32, 64, 576, 1536};
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++)
        for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++)
            check_type(types[t], sizes[s]);
    /* Odd lengths for the unblocked types exercise the vector loops' tails. */
    check_type(MIM_TYPE_F32, 37);
    uint64_t rb;
    CHECK(!mim_type_row_bytes(MIM_TYPE_Q8_0, 33, &rb), "partial block accepted");
    CHECK(!mim_type_row_bytes(11, 256, &rb), "Q3_K reported as supported");
    CHECK(strcmp(mim_type_name(14), "Q6_K") == 0 && strcmp(mim_type_name(30), "BF16") == 0,
          "type names");
    CHECK(strcmp(mim_type_name(1000), "unknown") == 0, "unknown type name");
    return check_finish("test_model_quant");
}
