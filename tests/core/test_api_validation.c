/*
 * Bad input for every public entry point: each call must return the documented status, leave a
 * message on the context, and write nothing (outputs are poisoned first and compared after).
 */
#include "../check.h"
#include "minference.h"
#include "minference_cuda.h"
#include "minference_tools.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { B = 1, H = 4, HKV = 2, L = 70, D = 16 };

static float qbuf[B * H * L * D], kbuf[B * HKV * L * D], vbuf[B * HKV * L * D];
static float obuf[B * H * L * D], lsebuf[B * H * L];
static const float POISON = 12345.0f;

static void poison(void) {
    for (size_t i = 0; i < sizeof obuf / sizeof obuf[0]; i++) obuf[i] = POISON;
    for (size_t i = 0; i < sizeof lsebuf / sizeof lsebuf[0]; i++) lsebuf[i] = POISON;
}

static int untouched(void) {
    for (size_t i = 0; i < sizeof obuf / sizeof obuf[0]; i++)
        if (obuf[i] != POISON) return 0;
    for (size_t i = 0; i < sizeof lsebuf / sizeof lsebuf[0]; i++)
        if (lsebuf[i] != POISON) return 0;
    return 1;
}

/* Runs a call that must fail with `want`, checks the message and that nothing was written. */
#define EXPECT_REJECT(ctx, want, call)                                                             \
    do {                                                                                           \
        poison();                                                                                  \
        CHECK_STATUS(call, want);                                                                  \
        CHECK(mi_context_last_error(ctx)[0] != '\0');                                              \
        CHECK(untouched());                                                                        \
    } while (0)

static void test_status_and_version(void) {
    CHECK(strcmp(mi_version(), MI_VERSION_STRING) == 0);
    CHECK(mi_version_number() ==
          ((MI_VERSION_MAJOR << 16) | (MI_VERSION_MINOR << 8) | MI_VERSION_PATCH));
    CHECK(strcmp(mi_status_string(MI_STATUS_SUCCESS), "success") == 0);
    CHECK(strcmp(mi_status_name(MI_STATUS_UNSUPPORTED), "MI_STATUS_UNSUPPORTED") == 0);
    CHECK(strcmp(mi_status_string((mi_status)9999), "unknown status") == 0);
    CHECK(mi_build_features()[0] != '\0');
    CHECK(mi_build_commit() != NULL && mi_build_commit()[0] != '\0');
    CHECK(mi_dtype_size(MI_DTYPE_BF16) == 2 && mi_dtype_size((mi_dtype)77) == 0);
}

static void test_context(void) {
    mi_context *ctx = NULL;
    CHECK_STATUS(mi_context_create(NULL, NULL), MI_STATUS_INVALID_ARGUMENT);
    mi_context_params p = mi_context_default_params();
    p.device = (mi_device_type)42;
    CHECK_STATUS(mi_context_create(&p, &ctx), MI_STATUS_INVALID_ARGUMENT);
    CHECK(ctx == NULL);
    p = mi_context_default_params();
    p.device_id = -1;
    CHECK_STATUS(mi_context_create(&p, &ctx), MI_STATUS_INVALID_ARGUMENT);
    /* A CUDA context either works (GPU build on a GPU machine) or fails cleanly. */
    p = mi_context_default_params();
    p.device = MI_DEVICE_CUDA;
    mi_status st = mi_context_create(&p, &ctx);
    CHECK(st == MI_STATUS_SUCCESS || st == MI_STATUS_NOT_BUILT || st == MI_STATUS_DEVICE_ERROR);
    CHECK((st == MI_STATUS_SUCCESS) == (ctx != NULL));
    mi_context_destroy(ctx);
    mi_context_destroy(NULL);
    CHECK(strcmp(mi_context_last_error(NULL), "no context") == 0);

    /* one thread cap everywhere */
    p = mi_context_default_params();
    p.n_threads = MI_MAX_THREADS + 1;
    CHECK_STATUS(mi_context_create(&p, &ctx), MI_STATUS_INVALID_ARGUMENT);
    CHECK(ctx == NULL);
    p.n_threads = MI_MAX_THREADS;
    CHECK_STATUS(mi_context_create(&p, &ctx), MI_STATUS_SUCCESS);
    CHECK(mi_context_n_threads(ctx) == MI_MAX_THREADS);
    mi_context_destroy(ctx);

    p = mi_context_default_params();
    p.n_threads = 3;
    CHECK_STATUS(mi_context_create(&p, &ctx), MI_STATUS_SUCCESS);
    CHECK(mi_context_n_threads(ctx) == 3);
    CHECK(mi_context_device(ctx) == MI_DEVICE_CPU);
    CHECK_STATUS(mi_context_set_stream(ctx, NULL), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_context_synchronize(ctx), MI_STATUS_SUCCESS);
    /* A library built on this one records its message on the context. */
    CHECK_STATUS(mi_context_set_error(ctx, MI_STATUS_PARSE_ERROR, "bad file"),
                 MI_STATUS_PARSE_ERROR);
    CHECK(strcmp(mi_context_last_error(ctx), "bad file") == 0);
    CHECK_STATUS(mi_context_set_error(ctx, MI_STATUS_IO_ERROR, NULL), MI_STATUS_IO_ERROR);
    CHECK(strcmp(mi_context_last_error(ctx), mi_status_string(MI_STATUS_IO_ERROR)) == 0);
    CHECK_STATUS(mi_context_set_error(NULL, MI_STATUS_IO_ERROR, "x"), MI_STATUS_IO_ERROR);
    mi_context_destroy(ctx);
}

static void test_tensor_descriptors(void) {
    mi_tensor a = mi_tensor_bhld(qbuf, MI_DTYPE_F32, MI_DEVICE_CPU, 2, 3, 5, 7);
    CHECK(a.stride[0] == 105 && a.stride[1] == 35 && a.stride[2] == 7 && a.stride[3] == 1);
    mi_tensor b = mi_tensor_blhd(qbuf, MI_DTYPE_F32, MI_DEVICE_CPU, 2, 3, 5, 7);
    CHECK(b.shape[1] == 3 && b.shape[2] == 5);
    CHECK(b.stride[0] == 105 && b.stride[1] == 7 && b.stride[2] == 21 && b.stride[3] == 1);
}

static void test_half_conversions(void) {
    /* Every half and bfloat16 value survives the trip through float. */
    int bad_f16 = 0, bad_bf16 = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = mi_f16_to_f32((uint16_t)h);
        if (f == f && mi_f32_to_f16(f) != h) bad_f16++;
        float g = mi_bf16_to_f32((uint16_t)h);
        if (g == g && mi_f32_to_bf16(g) != h) bad_bf16++;
    }
    CHECK(bad_f16 == 0);
    CHECK(bad_bf16 == 0);
    /* Rounding against known values: halfway cases go to even. */
    CHECK(mi_f32_to_f16(1.0f) == 0x3c00);
    CHECK(mi_f32_to_f16(65504.0f) == 0x7bff);
    CHECK(mi_f32_to_f16(65520.0f) == 0x7c00);
    CHECK(mi_f32_to_f16(1.0f + 1.0f / 2048.0f) == 0x3c00); /* tie -> even */
    CHECK(mi_f32_to_f16(1.0f + 3.0f / 2048.0f) == 0x3c02); /* tie -> even */
    CHECK(mi_f32_to_f16(5.9604645e-08f) == 0x0001);        /* smallest subnormal */
    CHECK(mi_f32_to_f16(2.9802322e-08f) == 0x0000);        /* half of it: tie to 0 */
    CHECK(mi_f32_to_bf16(1.0f + 1.0f / 256.0f) == 0x3f80); /* tie -> even */
    CHECK(mi_f32_to_bf16(1.0f + 3.0f / 256.0f) == 0x3f82);
    CHECK(isnan(mi_f16_to_f32(mi_f32_to_f16(NAN))));
    CHECK(isnan(mi_bf16_to_f32(mi_f32_to_bf16(NAN))));
#if defined(__FLT16_MAX__)
    /* The compiler's own conversion is the reference for a sweep of random floats. */
    uint32_t x = 12345u;
    int mismatch = 0;
    for (int i = 0; i < 200000; i++) {
        x = x * 1664525u + 1013904223u;
        float f;
        uint32_t bits = (x & 0x8fffffffu) | 0x30000000u; /* magnitudes around the half range */
        memcpy(&f, &bits, 4);
        _Float16 r = (_Float16)f;
        uint16_t rb;
        memcpy(&rb, &r, 2);
        if (mi_f32_to_f16(f) != rb) mismatch++;
    }
    CHECK(mismatch == 0);
#endif
}

static void test_patterns(void) {
    mi_pattern_type t;
    CHECK_STATUS(mi_pattern_from_name("stream_llm", &t), MI_STATUS_SUCCESS);
    CHECK(t == MI_PATTERN_A_SHAPE);
    CHECK_STATUS(mi_pattern_from_name("a_shape", &t), MI_STATUS_SUCCESS);
    CHECK_STATUS(mi_pattern_from_name("nonsense", &t), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_pattern_from_name(NULL, &t), MI_STATUS_INVALID_ARGUMENT);
    CHECK(mi_pattern_name((mi_pattern_type)99) == NULL);
    CHECK(strcmp(mi_pattern_name(MI_PATTERN_VERTICAL_SLASH), "vertical_and_slash") == 0);
    mi_head_pattern d = mi_head_pattern_default(MI_PATTERN_VERTICAL_SLASH);
    CHECK(d.vertical_size == 1000 && d.slash_size == 6096 && d.top_k == 100);
    mi_vs_params vp = mi_vs_default_params();
    CHECK(vp.last_q == 64 && vp.forced_columns == 30 && vp.forced_diagonals == 100);
    CHECK(vp.min_vertical == 30 && vp.min_slash == 50);
}

static void test_index_layout(void) {
    static int32_t buf[4096];
    mi_vs_index vs;
    CHECK(mi_vs_index_bytes(0, 1, 1, 1) == 0);
    CHECK(mi_vs_index_bytes(2, 3, 5, 7) == (size_t)(2 * 6 + 30 + 42) * 4);
    CHECK_STATUS(mi_vs_index_init(&vs, 2, 3, 5, 7, buf, 10), MI_STATUS_WORKSPACE_TOO_SMALL);
    CHECK_STATUS(mi_vs_index_init(NULL, 2, 3, 5, 7, buf, sizeof buf), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_vs_index_init(&vs, 2, 3, -1, 7, buf, sizeof buf), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_vs_index_init(&vs, 2, 3, 5, 7, (char *)buf + 1, sizeof buf - 4),
                 MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_vs_index_init(&vs, 2, 3, 5, 7, buf, sizeof buf), MI_STATUS_SUCCESS);
    CHECK(vs.slash_idx + 6 * 7 <= buf + 2 * 6 + 30 + 42);
    mi_sparse_index sp;
    CHECK(mi_sparse_index_bytes(1, 1, 0, 1, 1) == 0);
    CHECK(mi_sparse_index_bytes(INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX, 1) == 0);
    CHECK_STATUS(mi_sparse_index_init(&sp, 1, 2, 3, 4, 5, buf, sizeof buf), MI_STATUS_SUCCESS);
    CHECK(sp.column_index + 6 * 5 == buf + 12 + 24 + 30);
}

static void test_kernel_rejections(mi_context *ctx) {
    mi_tensor q = mi_tensor_bhld(qbuf, MI_DTYPE_F32, MI_DEVICE_CPU, B, H, L, D);
    mi_tensor k = mi_tensor_bhld(kbuf, MI_DTYPE_F32, MI_DEVICE_CPU, B, HKV, L, D);
    mi_tensor v = mi_tensor_bhld(vbuf, MI_DTYPE_F32, MI_DEVICE_CPU, B, HKV, L, D);
    mi_tensor o = mi_tensor_bhld(obuf, MI_DTYPE_F32, MI_DEVICE_CPU, B, H, L, D);
    for (size_t i = 0; i < sizeof qbuf / sizeof qbuf[0]; i++) qbuf[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < sizeof kbuf / sizeof kbuf[0]; i++)
        kbuf[i] = vbuf[i] = (float)(i % 5) * 0.1f;

    /* NULL context and NULL tensors */
    poison();
    CHECK_STATUS(mi_attention_dense(NULL, &q, &k, &v, NULL, 0, &o, lsebuf),
                 MI_STATUS_INVALID_ARGUMENT);
    CHECK(untouched());
    EXPECT_REJECT(ctx, MI_STATUS_INVALID_ARGUMENT,
                  mi_attention_dense(ctx, NULL, &k, &v, NULL, 0, &o, lsebuf));
    EXPECT_REJECT(ctx, MI_STATUS_INVALID_ARGUMENT,
                  mi_attention_dense(ctx, &q, NULL, &v, NULL, 0, &o, lsebuf));
    EXPECT_REJECT(ctx, MI_STATUS_INVALID_ARGUMENT,
                  mi_attention_dense(ctx, &q, &k, &v, NULL, 0, NULL, lsebuf));
    mi_tensor nodata = q;
    nodata.data = NULL;
    EXPECT_REJECT(ctx, MI_STATUS_INVALID_ARGUMENT,
                  mi_attention_dense(ctx, &nodata, &k, &v, NULL, 0, &o, lsebuf));

    /* shapes */
    mi_tensor k_badL = mi_tensor_bhld(kbuf, MI_DTYPE_F32, MI_DEVICE_CPU, B, HKV, L - 1, D);
    EXPECT_REJECT(ctx, MI_STATUS_SHAPE_MISMATCH,
                  mi_attention_dense(ctx, &q, &k_badL, &v, NULL, 0, &o, lsebuf));
    mi_tensor k_badH = mi_tensor_bhld(kbuf, MI_DTYPE_F32, MI_DEVICE_CPU, B, 3, L, D);
    mi_tensor v_badH = mi_tensor_bhld(vbuf, MI_DTYPE_F32, MI_DEVICE_CPU, B, 3, L, D);
    EXPECT_REJECT(ctx, MI_STATUS_SHAPE_MISMATCH,
                  mi_attention_dense(ctx, &q, &k_badH, &v_badH, NULL, 0, &o, lsebuf));
    EXPECT_REJECT(ctx, MI_STATUS_SHAPE_MISMATCH,
                  mi_attention_dense(ctx, &q, &k, &v_badH, NULL, 0, &o, lsebuf));
    mi_tensor o_badH = mi_tensor_bhld(obuf, MI_DTYPE_F32, MI_DEVICE_CPU, B, HKV, L, D);
    EXPECT_REJECT(ctx, MI_STATUS_SHAPE_MISMATCH,
                  mi_attention_dense(ctx, &q, &k, &v, NULL, 0, &o_badH, lsebuf));
    mi_tensor zero = q;
    zero.shape[2] = 0;
    EXPECT_REJECT(ctx, MI_STATUS_INVALID_ARGUMENT,
                  mi_attention_dense(ctx, &zero, &k, &v, NULL, 0, &o, lsebuf));
    mi_tensor strided = q;
    strided.stride[3] = 2;
    EXPECT_REJECT(ctx, MI_STATUS_UNSUPPORTED,
                  mi_attention_dense(ctx, &strided, &k, &v, NULL, 0, &o, lsebuf));
    mi_tensor wide = mi_tensor_bhld(qbuf, MI_DTYPE_F32, MI_DEVICE_CPU, 1, 1, 1, 512);
    mi_tensor wide_o = mi_tensor_bhld(obuf, MI_DTYPE_F32, MI_DEVICE_CPU, 1, 1, 1, 512);
    EXPECT_REJECT(ctx, MI_STATUS_UNSUPPORTED,
                  mi_attention_dense(ctx, &wide, &wide, &wide, NULL, 0, &wide_o, lsebuf));

    /* dtypes and devices */
    mi_tensor q_bad_dtype = q;
    q_bad_dtype.dtype = (mi_dtype)9;
    EXPECT_REJECT(ctx, MI_STATUS_UNSUPPORTED,
                  mi_attention_dense(ctx, &q_bad_dtype, &k, &v, NULL, 0, &o, lsebuf));
    mi_tensor k_half = k;
    k_half.dtype = MI_DTYPE_F16;
    EXPECT_REJECT(ctx, MI_STATUS_SHAPE_MISMATCH,
                  mi_attention_dense(ctx, &q, &k_half, &v, NULL, 0, &o, lsebuf));
    mi_tensor q_gpu = q;
    q_gpu.device = MI_DEVICE_CUDA;
    EXPECT_REJECT(ctx, MI_STATUS_INVALID_ARGUMENT,
                  mi_attention_dense(ctx, &q_gpu, &k, &v, NULL, 0, &o, lsebuf));

    /* aliasing, seq_lens, scale, lse alignment */
    mi_tensor o_alias = mi_tensor_bhld(qbuf, MI_DTYPE_F32, MI_DEVICE_CPU, B, H, L, D);
    poison();
    CHECK_STATUS(mi_attention_dense(ctx, &q, &k, &v, NULL, 0, &o_alias, NULL),
                 MI_STATUS_INVALID_ARGUMENT);
    int32_t bad_len[1] = {L + 1};
    EXPECT_REJECT(ctx, MI_STATUS_INVALID_ARGUMENT,
                  mi_attention_dense(ctx, &q, &k, &v, bad_len, 0, &o, lsebuf));
    int32_t neg_len[1] = {-1};
    EXPECT_REJECT(ctx, MI_STATUS_INVALID_ARGUMENT,
                  mi_attention_dense(ctx, &q, &k, &v, neg_len, 0, &o, lsebuf));
    EXPECT_REJECT(ctx, MI_STATUS_INVALID_ARGUMENT,
                  mi_attention_dense(ctx, &q, &k, &v, NULL, NAN, &o, lsebuf));
    EXPECT_REJECT(ctx, MI_STATUS_INVALID_ARGUMENT,
                  mi_attention_dense(ctx, &q, &k, &v, NULL, 0, &o, (float *)((char *)lsebuf + 2)));

    /* A-shape budgets */
    EXPECT_REJECT(ctx, MI_STATUS_INVALID_ARGUMENT,
                  mi_attention_a_shape(ctx, &q, &k, &v, NULL, -1, 16, 0, 0, &o, lsebuf));
    EXPECT_REJECT(ctx, MI_STATUS_INVALID_ARGUMENT,
                  mi_attention_a_shape(ctx, &q, &k, &v, NULL, 4, 16, -3, 0, &o, lsebuf));
    EXPECT_REJECT(ctx, MI_STATUS_SHAPE_MISMATCH,
                  mi_attention_a_shape(ctx, &q, &k_badL, &v, NULL, 4, 16, 0, 0, &o, lsebuf));

    /* vertical-slash estimation */
    static int32_t vsbuf[4096];
    mi_vs_index vs;
    CHECK_STATUS(mi_vs_index_init(&vs, B, H, 40, 60, vsbuf, sizeof vsbuf), MI_STATUS_SUCCESS);
    memset(vsbuf, 0x7f, sizeof vsbuf);
    int32_t vsz[H] = {30, 30, 30, 30}, ssz[H] = {50, 50, 50, 50};
    int32_t big[H] = {30, 30, 30, 1000};
    int32_t negb[H] = {30, -1, 30, 30};
    mi_vs_params bad_vp = mi_vs_default_params();
    bad_vp.last_q = 0;
#define VS_UNTOUCHED() CHECK(vsbuf[0] == 0x7f7f7f7f && vsbuf[100] == 0x7f7f7f7f)
    CHECK_STATUS(mi_vs_estimate(ctx, &q, NULL, NULL, vsz, ssz, NULL, 0, &vs),
                 MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_vs_estimate(ctx, &q, &k, NULL, NULL, ssz, NULL, 0, &vs),
                 MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_vs_estimate(ctx, &q, &k, NULL, negb, ssz, NULL, 0, &vs),
                 MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_vs_estimate(ctx, &q, &k, NULL, big, ssz, NULL, 0, &vs),
                 MI_STATUS_WORKSPACE_TOO_SMALL);
    CHECK_STATUS(mi_vs_estimate(ctx, &q, &k, NULL, vsz, ssz, &bad_vp, 0, &vs),
                 MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_vs_estimate(ctx, &q, &k, NULL, vsz, ssz, NULL, 0, NULL),
                 MI_STATUS_INVALID_ARGUMENT);
    mi_vs_index vs_wrong = vs;
    vs_wrong.heads = 2;
    CHECK_STATUS(mi_vs_estimate(ctx, &q, &k, NULL, vsz, ssz, NULL, 0, &vs_wrong),
                 MI_STATUS_SHAPE_MISMATCH);
    VS_UNTOUCHED();

    /* index building */
    static int32_t spbuf[1 << 16];
    mi_sparse_index sp;
    const int32_t R = (L + 63) / 64;
    CHECK_STATUS(mi_sparse_index_init(&sp, B, H, R, 61, 40, spbuf, sizeof spbuf),
                 MI_STATUS_SUCCESS);
    memset(spbuf, 0x7f, sizeof spbuf);
#define SP_UNTOUCHED() CHECK(spbuf[0] == 0x7f7f7f7f && spbuf[20] == 0x7f7f7f7f)
    for (int i = 0; i < B * H; i++) vs.vertical_count[i] = vs.slash_count[i] = 0;
    CHECK_STATUS(mi_vs_build_index(ctx, 0, NULL, &vs, &sp), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_vs_build_index(ctx, L, NULL, NULL, &sp), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_vs_build_index(ctx, L, NULL, &vs, NULL), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_vs_build_index(ctx, 1000, NULL, &vs, &sp), MI_STATUS_SHAPE_MISMATCH);
    vs.vertical_count[2] = 41;
    CHECK_STATUS(mi_vs_build_index(ctx, L, NULL, &vs, &sp), MI_STATUS_INVALID_ARGUMENT);
    vs.vertical_count[2] = 0;
    mi_sparse_index sp_small = sp;
    sp_small.max_columns = 3;
    CHECK_STATUS(mi_vs_build_index(ctx, L, NULL, &vs, &sp_small), MI_STATUS_WORKSPACE_TOO_SMALL);
    CHECK_STATUS(mi_vs_build_index(ctx, L, bad_len, &vs, &sp), MI_STATUS_INVALID_ARGUMENT);
    SP_UNTOUCHED();

    /* block-sparse estimation */
    int32_t topk[H] = {4, 4, 4, 4}, negk[H] = {4, -4, 4, 4};
    CHECK_STATUS(mi_block_sparse_estimate(ctx, &q, &k, NULL, NULL, &sp),
                 MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_block_sparse_estimate(ctx, &q, &k, NULL, negk, &sp),
                 MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_block_sparse_estimate(ctx, &q, &k_badL, NULL, topk, &sp),
                 MI_STATUS_SHAPE_MISMATCH);
    mi_sparse_index sp_one = sp;
    sp_one.max_blocks = 1;
    CHECK_STATUS(mi_block_sparse_estimate(ctx, &q, &k, NULL, topk, &sp_one),
                 MI_STATUS_WORKSPACE_TOO_SMALL);
    SP_UNTOUCHED();

    /* sparse attention: corrupt counts are caught on the CPU */
    for (int i = 0; i < B * H * R; i++) sp.block_count[i] = sp.column_count[i] = 0;
    sp.block_count[1] = 62;
    EXPECT_REJECT(ctx, MI_STATUS_INVALID_ARGUMENT,
                  mi_attention_sparse(ctx, &q, &k, &v, NULL, &sp, 0, &o, lsebuf));
    sp.block_count[1] = 0;
    EXPECT_REJECT(ctx, MI_STATUS_INVALID_ARGUMENT,
                  mi_attention_sparse(ctx, &q, &k, &v, NULL, NULL, 0, &o, lsebuf));
    mi_sparse_index sp_rows = sp;
    sp_rows.row_blocks = R + 1;
    EXPECT_REJECT(ctx, MI_STATUS_SHAPE_MISMATCH,
                  mi_attention_sparse(ctx, &q, &k, &v, NULL, &sp_rows, 0, &o, lsebuf));

    /* whole-layer prefill */
    mi_head_pattern pats[H];
    for (int h = 0; h < H; h++) pats[h] = mi_head_pattern_default(MI_PATTERN_VERTICAL_SLASH);
    EXPECT_REJECT(ctx, MI_STATUS_INVALID_ARGUMENT,
                  mi_prefill_attention(ctx, &q, &k, &v, NULL, NULL, NULL, &o, lsebuf, NULL, 0));
    pats[2].type = (mi_pattern_type)17;
    EXPECT_REJECT(ctx, MI_STATUS_INVALID_ARGUMENT,
                  mi_prefill_attention(ctx, &q, &k, &v, NULL, pats, NULL, &o, lsebuf, NULL, 0));
    pats[2] = mi_head_pattern_default(MI_PATTERN_A_SHAPE);
    pats[2].n_local = -5;
    EXPECT_REJECT(ctx, MI_STATUS_INVALID_ARGUMENT,
                  mi_prefill_attention(ctx, &q, &k, &v, NULL, pats, NULL, &o, lsebuf, NULL, 0));
    pats[2] = mi_head_pattern_default(MI_PATTERN_BLOCK_SPARSE);
    mi_prefill_params pp = mi_prefill_default_params();
    pp.vs.min_slash = -1;
    EXPECT_REJECT(ctx, MI_STATUS_INVALID_ARGUMENT,
                  mi_prefill_attention(ctx, &q, &k, &v, NULL, pats, &pp, &o, lsebuf, NULL, 0));
    EXPECT_REJECT(
        ctx, MI_STATUS_SHAPE_MISMATCH,
        mi_prefill_attention(ctx, &q, &k_badH, &v_badH, NULL, pats, NULL, &o, lsebuf, NULL, 0));
    size_t need = 0;
    CHECK_STATUS(mi_prefill_workspace_size(ctx, &q, &k, pats, NULL, NULL),
                 MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_prefill_workspace_size(ctx, &q, &k, pats, NULL, &need), MI_STATUS_SUCCESS);
    if (need > 0) {
        char tiny[8];
        EXPECT_REJECT(
            ctx, MI_STATUS_WORKSPACE_TOO_SMALL,
            mi_prefill_attention(ctx, &q, &k, &v, NULL, pats, NULL, &o, lsebuf, tiny, sizeof tiny));
    }

    /* metrics */
    mi_head_metrics hm[H];
    double rel = -1;
    CHECK_STATUS(mi_metrics_evaluate(ctx, &q, &k, NULL, NULL, NULL, hm),
                 MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_metrics_evaluate(ctx, &q, &k_badL, NULL, pats, NULL, hm),
                 MI_STATUS_SHAPE_MISMATCH);
    CHECK_STATUS(mi_metrics_rel_l2(ctx, &o, &q, NULL, NULL), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_metrics_rel_l2(ctx, &o, &k, NULL, &rel), MI_STATUS_SHAPE_MISMATCH);
    CHECK(rel == -1);
}

/* The good path once, so the rejections above are known to be about the input. */
static void test_accepts_valid_input(mi_context *ctx) {
    mi_tensor q = mi_tensor_bhld(qbuf, MI_DTYPE_F32, MI_DEVICE_CPU, B, H, L, D);
    mi_tensor k = mi_tensor_bhld(kbuf, MI_DTYPE_F32, MI_DEVICE_CPU, B, HKV, L, D);
    mi_tensor v = mi_tensor_bhld(vbuf, MI_DTYPE_F32, MI_DEVICE_CPU, B, HKV, L, D);
    mi_tensor o = mi_tensor_bhld(obuf, MI_DTYPE_F32, MI_DEVICE_CPU, B, H, L, D);
    poison();
    CHECK_STATUS(mi_attention_dense(ctx, &q, &k, &v, NULL, 0, &o, lsebuf), MI_STATUS_SUCCESS);
    CHECK(!untouched());
    int finite = 1;
    for (size_t i = 0; i < sizeof obuf / sizeof obuf[0]; i++)
        if (!isfinite(obuf[i]) || obuf[i] == POISON) finite = 0;
    CHECK(finite);
    mi_head_pattern pats[H];
    for (int h = 0; h < H; h++) pats[h] = mi_head_pattern_default((mi_pattern_type)h);
    poison();
    CHECK_STATUS(mi_prefill_attention(ctx, &q, &k, &v, NULL, pats, NULL, &o, lsebuf, NULL, 0),
                 MI_STATUS_SUCCESS);
    CHECK(!untouched());
}

int main(void) {
    test_status_and_version();
    test_context();
    test_tensor_descriptors();
    test_half_conversions();
    test_patterns();
    test_index_layout();
    mi_context *ctx = NULL;
    CHECK_STATUS(mi_context_create(NULL, &ctx), MI_STATUS_SUCCESS);
    if (ctx) {
        test_kernel_rejections(ctx);
        test_accepts_valid_input(ctx);
    }
    mi_context_destroy(ctx);
    return check_finish("test_api_validation");
}
