/*
 * test_model_load.c: the GGUF reader on truncated and corrupt files (every header prefix, field
 * corruptions, seeded byte flips: a status and a message, never a crash or an out-of-bounds
 * read; run under ASan in CI), unsupported tensor types named in the error, and the GGUF and
 * Hugging Face loaders giving the same logits for the same tiny llama and qwen2 models.
 */
#include "model_internal.h"
#include "tiny_model.h"

#include <unistd.h>

static char g_dir[256];

/* Opens a private copy of exactly n bytes, so ASan sees any read past the end. */
static mi_status open_prefix(const unsigned char *data, size_t n, char *err, size_t cap) {
    unsigned char *copy = malloc(n ? n : 1);
    memcpy(copy, data, n);
    mim_gguf *g = NULL;
    mi_status st = mim_gguf_open_memory(copy, n, &g, err, cap);
    mim_gguf_close(g);
    free(copy);
    return st;
}

static uint64_t rd64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static void test_truncation(void) {
    char gpath[512], hdir[512];
    snprintf(gpath, sizeof(gpath), "%s/tiny.gguf", g_dir);
    snprintf(hdir, sizeof(hdir), "%s/tiny_hf", g_dir);
    CHECK(tm_write(gpath, hdir, false, 7), "cannot write the tiny model");
    FILE *f = fopen(gpath, "rb");
    fseek(f, 0, SEEK_END);
    size_t size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *data = malloc(size);
    CHECK(fread(data, 1, size, f) == size, "short read");
    fclose(f);

    char err[512];
    mim_gguf *g = NULL;
    CHECK(mim_gguf_open_memory(data, size, &g, err, sizeof(err)) == MI_STATUS_SUCCESS, "%s", err);
    /* The last tensor's end: any shorter file must be refused. */
    size_t need = 0;
    for (uint64_t i = 0; g && i < g->n_tensors; i++) {
        size_t end = (size_t)((const unsigned char *)g->tensors[i].data - g->base) +
                     (size_t)g->tensors[i].nbytes;
        if (end > need) need = end;
    }
    mim_gguf_close(g);
    int bad = 0;
    for (size_t n = 0; n < need; n++) {
        err[0] = 0;
        mi_status st = open_prefix(data, n, err, sizeof(err));
        if (st != MI_STATUS_PARSE_ERROR || !err[0]) {
            if (bad++ < 5)
                CHECK(false, "prefix of %zu bytes: status %s, message '%s'", n, mi_status_name(st),
                      err);
        }
    }
    CHECK(bad == 0, "%d truncated prefixes were not refused", bad);
    CHECK(open_prefix(data, need, err, sizeof(err)) == MI_STATUS_SUCCESS, "%s", err);

    /* The public entry point on a truncated file. */
    char tpath[512];
    snprintf(tpath, sizeof(tpath), "%s/trunc.gguf", g_dir);
    tbuf tb = {data, need - 100, 0};
    CHECK(tb_write(&tb, tpath), "write");
    mi_model *m = NULL;
    err[0] = 0;
    mi_status st = mi_model_load(test_ctx(), tpath, NULL, &m);
    CHECK(st == MI_STATUS_PARSE_ERROR && m == NULL, "truncated model: %s", mi_status_name(st));
    CHECK(strstr(TEST_ERR, "truncated") != NULL, "message: %s", TEST_ERR);
    printf("truncated file: %s\n", TEST_ERR);
    free(data);
}

/* Field corruptions of a small hand-built file. */
static void test_corrupt_fields(void) {
    char err[512];
    gguf_writer w;
    memset(&w, 0, sizeof(w));
    gw_str(&w, "general.architecture", "llama");
    float vec[32] = {0};
    gw_tensor_add(&w, "a", 0, 32, 0, vec, sizeof(vec));
    size_t data_start;
    tbuf b = gw_finish(&w, &data_start);
    CHECK(open_prefix(b.p, b.n, err, sizeof(err)) == MI_STATUS_SUCCESS, "valid: %s", err);

    unsigned char *c = malloc(b.n);
#define RESET() memcpy(c, b.p, b.n)
    RESET();
    c[0] = 'X';
    CHECK(open_prefix(c, b.n, err, sizeof(err)) == MI_STATUS_PARSE_ERROR, "bad magic");
    CHECK(strstr(err, "magic") != NULL, "%s", err);
    RESET();
    c[4] = 1;
    CHECK(open_prefix(c, b.n, err, sizeof(err)) == MI_STATUS_PARSE_ERROR, "version 1");
    CHECK(strstr(err, "version") != NULL, "%s", err);
    RESET();
    memset(c + 8, 0xFF, 8); /* tensor count */
    CHECK(open_prefix(c, b.n, err, sizeof(err)) == MI_STATUS_PARSE_ERROR, "tensor count");
    RESET();
    memset(c + 16, 0xFF, 8); /* key/value count */
    CHECK(open_prefix(c, b.n, err, sizeof(err)) == MI_STATUS_PARSE_ERROR, "kv count");
    RESET();
    memset(c + 24, 0xFF, 8); /* first key's length */
    CHECK(open_prefix(c, b.n, err, sizeof(err)) == MI_STATUS_PARSE_ERROR, "key length");
    RESET();
    /* value type of the first key: after its 8-byte length and 20 characters */
    size_t vt = 24 + 8 + 20;
    c[vt] = 99;
    CHECK(open_prefix(c, b.n, err, sizeof(err)) == MI_STATUS_PARSE_ERROR, "value type");
    CHECK(strstr(err, "type") != NULL, "%s", err);
    RESET();
    memset(c + vt + 4, 0x7F, 8); /* the string value's length */
    CHECK(open_prefix(c, b.n, err, sizeof(err)) == MI_STATUS_PARSE_ERROR, "value length");
    /* tensor info: name (8 + 1), n_dims, ne0, type, offset */
    size_t ti = vt + 4 + 8 + 5;
    CHECK(rd64(b.p + ti) == 1, "layout of the test file changed");
    RESET();
    c[ti + 9] = 5;
    CHECK(open_prefix(c, b.n, err, sizeof(err)) == MI_STATUS_PARSE_ERROR, "5 dims");
    CHECK(strstr(err, "dimensions") != NULL, "%s", err);
    RESET();
    c[ti + 13] = 33; /* 33 elements: not a whole number of Q8_0 blocks after the type change */
    c[ti + 21] = 8;
    CHECK(open_prefix(c, b.n, err, sizeof(err)) == MI_STATUS_PARSE_ERROR, "partial block");
    RESET();
    memset(c + ti + 25, 0x7F, 8); /* data offset */
    CHECK(open_prefix(c, b.n, err, sizeof(err)) == MI_STATUS_PARSE_ERROR, "offset");
    RESET();
    c[ti + 25] = 4; /* data offset 4: inside the file but not aligned */
    CHECK(open_prefix(c, b.n, err, sizeof(err)) == MI_STATUS_PARSE_ERROR, "unaligned offset");
    CHECK(strstr(err, "alignment") != NULL, "%s", err);
    RESET();
    memset(c + ti + 13, 0xFF, 8); /* ne0 */
    CHECK(open_prefix(c, b.n, err, sizeof(err)) == MI_STATUS_PARSE_ERROR, "huge shape");
#undef RESET

    /* Seeded byte flips over the header: any status, no crash. */
    uint64_t s = 12345;
    int refused = 0;
    for (int it = 0; it < 3000; it++) {
        memcpy(c, b.p, b.n);
        for (int k = 0; k < 3; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            c[(s >> 33) % data_start] ^= (unsigned char)(1u << ((s >> 20) & 7));
        }
        refused += open_prefix(c, b.n, err, sizeof(err)) != MI_STATUS_SUCCESS;
    }
    printf("byte flips: %d of 3000 refused, none crashed\n", refused);
    free(c);
    free(b.p);
    free(w.kv.p);
}

/* Two tensors whose data overlap: refused, naming both (the formats forbid it, and a file built
 * that way can alias one weight into another). */
static void test_overlapping_tensors(void) {
    char err[512];
    gguf_writer w;
    memset(&w, 0, sizeof(w));
    gw_str(&w, "general.architecture", "llama");
    float va[32] = {0}, vb[32] = {0};
    gw_tensor_add(&w, "a", 0, 32, 0, va, sizeof(va));
    gw_tensor_add(&w, "b", 0, 32, 0, vb, sizeof(vb));
    size_t data_start;
    tbuf b = gw_finish(&w, &data_start);
    CHECK(open_prefix(b.p, b.n, err, sizeof(err)) == MI_STATUS_SUCCESS, "valid: %s", err);
    mim_gguf *g = NULL;
    CHECK(mim_gguf_open_memory(b.p, b.n, &g, err, sizeof(err)) == MI_STATUS_SUCCESS, "%s", err);
    const mim_gguf_tensor *t = g ? mim_gguf_find_tensor(g, "b") : NULL;
    CHECK(t != NULL, "tensor b");
    if (t) {
        /* b's data offset field: after its name, n_dims, one ne and the type */
        size_t at = (size_t)((const unsigned char *)t->name - b.p) + t->name_len + 4 + 8 + 4;
        CHECK(rd64(b.p + at) == 128, "layout of the test file changed");
        mim_gguf_close(g);
        for (uint64_t off = 0; off < 128; off += 32) { /* inside a, from its start to its end */
            memcpy(b.p + at, &off, 8);
            err[0] = 0;
            CHECK(open_prefix(b.p, b.n, err, sizeof(err)) == MI_STATUS_PARSE_ERROR &&
                      strstr(err, "overlap") && strstr(err, "'a'") && strstr(err, "'b'"),
                  "offset %llu: %s", (unsigned long long)off, err);
        }
        printf("overlapping tensors: %s\n", err);
    }
    free(b.p);
    free(w.kv.p);
}

/* Rewrites the u32 value of one GGUF key of the tiny model into a copy and loads the copy. */
static mi_status load_with_u32(const char *src, const char *key, uint32_t value) {
    FILE *f = fopen(src, "rb");
    CHECK(f != NULL, "open %s", src);
    if (!f) return MI_STATUS_IO_ERROR;
    fseek(f, 0, SEEK_END);
    size_t size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *d = malloc(size);
    CHECK(fread(d, 1, size, f) == size, "read");
    fclose(f);
    const size_t kl = strlen(key);
    unsigned char *at = NULL;
    for (size_t i = 8; i + kl + 8 < size && !at; i++)
        if (rd64(d + i - 8) == kl && memcmp(d + i, key, kl) == 0) at = d + i + kl;
    CHECK(at != NULL, "key %s not in the tiny model", key);
    uint32_t type = 0;
    if (at) memcpy(&type, at, 4);
    CHECK(type == 4, "%s is not a u32", key); /* GGUF type 4: uint32 */
    if (at) memcpy(at + 4, &value, 4);
    char path[512];
    snprintf(path, sizeof(path), "%s/patched.gguf", g_dir);
    tbuf tb = {d, size, 0};
    CHECK(tb_write(&tb, path), "write");
    free(d);
    mi_model *m = NULL;
    mi_status st = mi_model_load(test_ctx(), path, NULL, &m);
    CHECK((st == MI_STATUS_SUCCESS) == (m != NULL), "status and model disagree");
    mi_model_destroy(m);
    return st;
}

/* Header values that disagree with the file: a block count lower than the layers present, and
 * special token ids outside the vocabulary. Each refused, naming the key. */
static void test_gguf_header_refusals(void) {
    char gpath[512], hdir[512];
    snprintf(gpath, sizeof(gpath), "%s/tiny_hdr.gguf", g_dir);
    snprintf(hdir, sizeof(hdir), "%s/tiny_hf_hdr", g_dir);
    CHECK(tm_write(gpath, hdir, false, 5), "write");
    CHECK(load_with_u32(gpath, "llama.block_count", TM_LAYERS) == MI_STATUS_SUCCESS,
          "as written: %s", TEST_ERR);
    CHECK(load_with_u32(gpath, "llama.block_count", TM_LAYERS - 1) == MI_STATUS_PARSE_ERROR &&
              strstr(TEST_ERR, "block_count"),
          "fewer blocks: %s", TEST_ERR);
    printf("block count: %s\n", TEST_ERR);
    CHECK(load_with_u32(gpath, "tokenizer.ggml.bos_token_id", TM_VOCAB) == MI_STATUS_PARSE_ERROR &&
              strstr(TEST_ERR, "bos_token_id"),
          "bos: %s", TEST_ERR);
    CHECK(load_with_u32(gpath, "tokenizer.ggml.eos_token_id", 0x7FFFFFFEu) ==
                  MI_STATUS_PARSE_ERROR &&
              strstr(TEST_ERR, "eos_token_id"),
          "eos: %s", TEST_ERR);
    printf("special id: %s\n", TEST_ERR);
}

/* NaN inside a matrix, away from its first and last rows: the default check samples those rows
 * and loads; check_weights = 1 reads every row and refuses, naming the tensor. */
static void test_check_weights(void) {
    char gpath[512], hdir[512], err[512];
    snprintf(gpath, sizeof(gpath), "%s/tiny_nan_mid.gguf", g_dir);
    snprintf(hdir, sizeof(hdir), "%s/tiny_hf_nan_mid", g_dir);
    CHECK(tm_write(gpath, hdir, false, 9), "write");
    FILE *f = fopen(gpath, "r+b");
    CHECK(f != NULL, "open");
    if (!f) return;
    fseek(f, 0, SEEK_END);
    size_t size = (size_t)ftell(f);
    unsigned char *d = malloc(size);
    fseek(f, 0, SEEK_SET);
    CHECK(fread(d, 1, size, f) == size, "read");
    mim_gguf *g = NULL;
    CHECK(mim_gguf_open_memory(d, size, &g, err, sizeof(err)) == MI_STATUS_SUCCESS, "%s", err);
    const mim_gguf_tensor *t = g ? mim_gguf_find_tensor(g, "blk.1.ffn_down.weight") : NULL;
    CHECK(t != NULL && t->ne[1] >= 3, "tensor");
    if (t && t->ne[1] >= 3) {
        /* the first bytes of a middle row: an f32/f16/bf16 value or a block's f16 scale, all
         * ones is NaN in each */
        const size_t row_bytes = (size_t)(t->nbytes / t->ne[1]);
        const size_t at = (size_t)((const unsigned char *)t->data - d) + row_bytes * (t->ne[1] / 2);
        const unsigned char ones[4] = {0xff, 0xff, 0xff, 0xff};
        fseek(f, (long)at, SEEK_SET);
        CHECK(fwrite(ones, 1, 4, f) == 4, "poison");
    }
    fclose(f);
    mim_gguf_close(g);
    free(d);
    mi_model *m = NULL;
    CHECK_OK(mi_model_load(test_ctx(), gpath, NULL, &m));
    mi_model_destroy(m);
    mi_model_params p = mi_model_default_params();
    CHECK(p.check_weights == 0, "the default samples rows");
    p.check_weights = 1;
    m = NULL;
    mi_status st = mi_model_load(test_ctx(), gpath, &p, &m);
    CHECK(st == MI_STATUS_PARSE_ERROR && !m && strstr(TEST_ERR, "blk.1.ffn_down.weight") &&
              strstr(TEST_ERR, "NaN"),
          "full check: %s (%s)", mi_status_name(st), TEST_ERR);
    mi_model_destroy(m);
    printf("full weight check: %s\n", TEST_ERR);
}

/* A needed tensor of a type this runner does not read is named in the error. */
static void test_unsupported_type(void) {
    char gpath[512], hdir[512], err[512];
    snprintf(gpath, sizeof(gpath), "%s/tiny_q3k.gguf", g_dir);
    snprintf(hdir, sizeof(hdir), "%s/tiny_hf_q3k", g_dir);
    CHECK(tm_write(gpath, hdir, false, 3), "write");
    FILE *f = fopen(gpath, "r+b");
    fseek(f, 0, SEEK_END);
    size_t size = (size_t)ftell(f);
    unsigned char *d = malloc(size);
    fseek(f, 0, SEEK_SET);
    CHECK(fread(d, 1, size, f) == size, "read");
    mim_gguf *g = NULL;
    CHECK(mim_gguf_open_memory(d, size, &g, err, sizeof(err)) == MI_STATUS_SUCCESS, "%s", err);
    /* the type field sits 12 bytes before the tensor's data offset field; patch blk.0.ffn_up */
    const mim_gguf_tensor *t = g ? mim_gguf_find_tensor(g, "blk.0.ffn_up.weight") : NULL;
    CHECK(t != NULL, "tensor");
    if (t) {
        size_t at = (size_t)((const unsigned char *)t->name - d) + t->name_len + 4 + 8 * 2;
        uint32_t q3k = 11; /* a K-quant this runner does not read */
        fseek(f, (long)at, SEEK_SET);
        fwrite(&q3k, 4, 1, f);
    }
    fclose(f);
    mim_gguf_close(g);
    free(d);
    mi_model *m = NULL;
    mi_status st = mi_model_load(test_ctx(), gpath, NULL, &m);
    CHECK(st == MI_STATUS_UNSUPPORTED && !m, "status %s", mi_status_name(st));
    CHECK(strstr(TEST_ERR, "Q3_K") && strstr(TEST_ERR, "blk.0.ffn_up.weight"), "message: %s",
          TEST_ERR);
    printf("unsupported type: %s\n", TEST_ERR);
    CHECK(mi_model_load(test_ctx(), "/nonexistent/x.gguf", NULL, &m) == MI_STATUS_IO_ERROR,
          "missing file");
    CHECK(mi_model_load(test_ctx(), NULL, NULL, &m) == MI_STATUS_INVALID_ARGUMENT, "NULL");
}

static float max_diff(const float *a, const float *b, int n) {
    float d = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(a[i] - b[i]) > d || isnan(a[i]) || isnan(b[i]))
            d = isnan(a[i]) || isnan(b[i]) ? INFINITY : fabsf(a[i] - b[i]);
    return d;
}

/* Same model through both loaders: same tokens, same logits for prefill and decode. */
static void test_formats_agree(bool qwen2, int rope) {
    static const mi_rope_type types[] = {MI_ROPE_NONE, MI_ROPE_LLAMA3, MI_ROPE_YARN,
                                         MI_ROPE_LINEAR};
    char gpath[512], hdir[512];
    snprintf(gpath, sizeof(gpath), "%s/agree_%d%d.gguf", g_dir, qwen2, rope);
    snprintf(hdir, sizeof(hdir), "%s/agree_%d%d_hf", g_dir, qwen2, rope);
    CHECK(tm_write_ex(gpath, hdir, qwen2, rope, 99 + qwen2), "write");
    mi_model *a = NULL, *b = NULL;
    mi_model_params p = mi_model_default_params();
    p.n_threads = 2;
    CHECK(mi_model_load(test_ctx(), gpath, &p, &a) == MI_STATUS_SUCCESS, "gguf: %s", TEST_ERR);
    CHECK(mi_model_load(test_ctx(), hdir, &p, &b) == MI_STATUS_SUCCESS, "hf: %s", TEST_ERR);
    if (!a || !b) {
        mi_model_destroy(a);
        mi_model_destroy(b);
        return;
    }
    mi_model_info ia, ib;
    mi_model_get_info(a, &ia);
    mi_model_get_info(b, &ib);
    CHECK(ia.tied_embeddings == 1 && ib.tied_embeddings == 1, "tied");
    CHECK(strcmp(ib.source, "safetensors") == 0 && strcmp(ia.source, "gguf") == 0, "sources");
    CHECK(ia.rope_scaling.type == types[rope] && ib.rope_scaling.type == ia.rope_scaling.type,
          "rope scaling %d / %d", (int)ia.rope_scaling.type, (int)ib.rope_scaling.type);
    const char *text = "<|s|>hello world, hello  world!\n123";
    int32_t ta[64], tb2[64];
    size_t na = 0, nb = 0;
    CHECK(mi_model_tokenize(a, text, strlen(text), 0, 1, ta, 64, &na) == MI_STATUS_SUCCESS, "tok");
    CHECK(mi_model_tokenize(b, text, strlen(text), 0, 1, tb2, 64, &nb) == MI_STATUS_SUCCESS, "tok");
    CHECK(na == nb && memcmp(ta, tb2, na * 4) == 0, "token ids differ (%zu vs %zu)", na, nb);
    CHECK(ta[0] == TM_VOCAB - 2, "special token not parsed: %d", ta[0]);
    CHECK(ta[1] == 256 + 2, "'hell' merge not applied: %d", ta[1]); /* hell */
    float la[TM_VOCAB], lb[TM_VOCAB];
    for (int mode = 0; mode < 2; mode++) {
        mi_attn_mode am = mode ? MI_ATTN_A_SHAPE : MI_ATTN_DENSE;
        mi_model_set_attention(a, am, NULL, 0);
        mi_model_set_attention(b, am, NULL, 0);
        CHECK(mi_model_prefill(a, ta, na, la) == MI_STATUS_SUCCESS, "%s", mi_model_last_error(a));
        CHECK(mi_model_prefill(b, ta, na, lb) == MI_STATUS_SUCCESS, "%s", mi_model_last_error(b));
        float d = max_diff(la, lb, TM_VOCAB);
        CHECK(d < 1e-3f, "%s prefill logits differ by %g", qwen2 ? "qwen2" : "llama", d);
        int32_t next = mi_argmax(la, TM_VOCAB);
        CHECK(mi_model_decode(a, &next, 1, la) == MI_STATUS_SUCCESS, "decode");
        CHECK(mi_model_decode(b, &next, 1, lb) == MI_STATUS_SUCCESS, "decode");
        d = max_diff(la, lb, TM_VOCAB);
        CHECK(d < 1e-3f, "%s decode logits differ by %g", qwen2 ? "qwen2" : "llama", d);
        CHECK(mi_model_n_past(a) == (int64_t)na + 1, "n_past");
    }
    /* Every attention mode through the library: on a prompt this short each pattern's default
     * budget covers every causal pair, so all must agree with dense. */
    {
        float ld[TM_VOCAB];
        mi_model_set_attention(a, MI_ATTN_DENSE, NULL, 0);
        CHECK(mi_model_prefill(a, ta, na, ld) == MI_STATUS_SUCCESS, "dense");
        const mi_attn_mode modes[] = {MI_ATTN_MINFERENCE, MI_ATTN_A_SHAPE, MI_ATTN_TRI_SHAPE,
                                      MI_ATTN_BLOCK_SPARSE};
        for (size_t k = 0; k < sizeof(modes) / sizeof(modes[0]); k++) {
            CHECK(mi_model_set_attention(a, modes[k], NULL, 0) == MI_STATUS_SUCCESS, "mode");
            CHECK(mi_model_prefill(a, ta, na, la) == MI_STATUS_SUCCESS, "%s: %s",
                  mi_attn_mode_name(modes[k]), mi_model_last_error(a));
            float dd = max_diff(la, ld, TM_VOCAB);
            CHECK(dd < 1e-3f, "%s differs from dense by %g", mi_attn_mode_name(modes[k]), dd);
        }
    }
    /* Decoding token by token equals one prefill of the whole sequence. */
    mi_model_set_attention(a, MI_ATTN_DENSE, NULL, 0);
    CHECK(mi_model_prefill(a, ta, na, la) == MI_STATUS_SUCCESS, "prefill");
    CHECK(mi_model_prefill(b, ta, 3, NULL) == MI_STATUS_SUCCESS, "prefill 3");
    for (size_t i = 3; i < na; i++)
        CHECK(mi_model_decode(b, &ta[i], 1, lb) == MI_STATUS_SUCCESS, "decode");
    float d = max_diff(la, lb, TM_VOCAB);
    CHECK(d < 1e-3f, "incremental decode differs from prefill by %g", d);
    /* A pattern config for another model is refused; one that fits runs. */
    mi_config *cfg = NULL;
    CHECK(mi_config_create(NULL, TM_LAYERS + 3, TM_HEADS, NULL, &cfg) == MI_STATUS_SUCCESS, "cfg");
    CHECK(mi_model_set_attention(a, MI_ATTN_MINFERENCE, cfg, 0) == MI_STATUS_SHAPE_MISMATCH,
          "config with too many layers accepted");
    mi_config_destroy(cfg);
    mi_head_pattern ash = mi_head_pattern_default(MI_PATTERN_A_SHAPE);
    ash.n_init = 2;
    ash.n_local = 4;
    CHECK(mi_config_create(NULL, TM_LAYERS, TM_HEADS, &ash, &cfg) == MI_STATUS_SUCCESS, "cfg");
    CHECK(mi_model_set_attention(a, MI_ATTN_MINFERENCE, cfg, 0) == MI_STATUS_SUCCESS, "%s",
          mi_model_last_error(a));
    CHECK(mi_model_prefill(a, ta, na, la) == MI_STATUS_SUCCESS, "%s", mi_model_last_error(a));
    mi_model_set_attention(a, MI_ATTN_DENSE, NULL, 0);
    mi_config_destroy(cfg);
    CHECK(mi_model_set_attention(a, (mi_attn_mode)99, NULL, 0) == MI_STATUS_INVALID_ARGUMENT,
          "bad mode");
    /* Invalid input */
    int32_t badtok = TM_VOCAB + 5;
    CHECK(mi_model_decode(a, &badtok, 1, la) == MI_STATUS_INVALID_ARGUMENT, "bad token");
    CHECK(mi_model_prefill(a, NULL, 0, la) == MI_STATUS_INVALID_ARGUMENT, "no tokens");
    CHECK(mi_model_tokenize(a, text, strlen(text), 0, 1, ta, 2, &na) ==
              MI_STATUS_WORKSPACE_TOO_SMALL,
          "capacity");
    mi_model_destroy(a);
    mi_model_destroy(b);
}

static void write_text(const char *path, const char *text) {
    tbuf b = {(unsigned char *)text, strlen(text), 0};
    CHECK(tb_write(&b, path), "write %s", path);
}

/* Hugging Face directories that cannot load: a clear status and a message naming the cause. */
static void test_hf_errors(void) {
    char dir[512], path[600];
    mi_model *m = NULL;
    snprintf(dir, sizeof(dir), "%s/hf_bad", g_dir);
    mkdir(dir, 0755);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    write_text(path, "{\"model_type\": \"gpt_neox\", \"hidden_size\": 64}");
    mi_status st = mi_model_load(test_ctx(), dir, NULL, &m);
    CHECK(st == MI_STATUS_UNSUPPORTED && strstr(TEST_ERR, "gpt_neox"), "%s: %s", mi_status_name(st),
          TEST_ERR);
    write_text(path, "{\"model_type\": \"llama\", ");
    st = mi_model_load(test_ctx(), dir, NULL, &m);
    CHECK(st == MI_STATUS_PARSE_ERROR, "broken config.json: %s", mi_status_name(st));
    write_text(path, "{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 1, "
                     "\"num_attention_heads\": 5, \"num_key_value_heads\": 2, "
                     "\"intermediate_size\": 96}");
    st = mi_model_load(test_ctx(), dir, NULL, &m);
    CHECK(st == MI_STATUS_PARSE_ERROR && strstr(TEST_ERR, "dimensions"), "5/2 heads: %s", TEST_ERR);
    /* counts an int32 cannot hold, or negative: refused naming the field, never cast (a fuzz
     * finding: 22147483646 intermediate units) */
    static const char *const counts[3] = {"\"intermediate_size\": 22147483646",
                                          "\"num_hidden_layers\": -1",
                                          "\"max_position_embeddings\": 1e300"};
    for (int i = 0; i < 3; i++) {
        char cfg[512];
        snprintf(cfg, sizeof cfg,
                 "{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 1, "
                 "\"num_attention_heads\": 4, \"intermediate_size\": 96, %s}",
                 counts[i]);
        write_text(path, cfg);
        st = mi_model_load(test_ctx(), dir, NULL, &m);
        char field[64];
        sscanf(counts[i] + 1, "%63[^\"]", field);
        CHECK(st == MI_STATUS_PARSE_ERROR && m == NULL && strstr(TEST_ERR, field), "%s: %s",
              counts[i], TEST_ERR);
    }

    /* A shard cut short: the tiny model's first shard loses its last bytes. */
    char good[512];
    snprintf(good, sizeof(good), "%s/trunc_hf", g_dir);
    snprintf(path, sizeof(path), "%s/trunc_hf.gguf", g_dir);
    CHECK(tm_write(path, good, false, 5), "write");
    snprintf(path, sizeof(path), "%s/model-00001-of-00002.safetensors", good);
    FILE *f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    CHECK(truncate(path, size - 64) == 0, "truncate");
    st = mi_model_load(test_ctx(), good, NULL, &m);
    CHECK(st == MI_STATUS_PARSE_ERROR && m == NULL, "truncated shard: %s", mi_status_name(st));
    printf("truncated shard: %s\n", TEST_ERR);

    /* Special ids outside the tokenizer (bos, eos, an id of an eos list): refused, naming the
     * field; an id inside it loads. */
    snprintf(good, sizeof(good), "%s/ids_hf", g_dir);
    snprintf(path, sizeof(path), "%s/ids_hf.gguf", g_dir);
    CHECK(tm_write(path, good, false, 5), "write");
    /* A NaN in a weight (the final norm: its first bytes set to all ones, a NaN in f32, f16
     * and bf16 alike) is refused at load, naming the tensor. */
    {
        char shard[600];
        snprintf(path, sizeof(path), "%s/nan_hf.gguf", g_dir);
        char nan_dir[512];
        snprintf(nan_dir, sizeof(nan_dir), "%s/nan_hf", g_dir);
        CHECK(tm_write(path, nan_dir, false, 5), "write");
        bool poisoned = false;
        for (int k = 1; k <= 2 && !poisoned; k++) {
            snprintf(shard, sizeof(shard), "%s/model-0000%d-of-00002.safetensors", nan_dir, k);
            FILE *sf = fopen(shard, "r+b");
            unsigned char hl[8];
            if (!sf || fread(hl, 1, 8, sf) != 8) {
                if (sf) fclose(sf);
                continue;
            }
            uint64_t hlen = 0;
            for (int b = 7; b >= 0; b--) hlen = hlen << 8 | hl[b];
            char *hdr = calloc(1, (size_t)hlen + 1);
            const char *hit = NULL;
            if (hdr && fread(hdr, 1, (size_t)hlen, sf) == (size_t)hlen)
                hit = strstr(hdr, "\"model.norm.weight\"");
            const char *offs = hit ? strstr(hit, "\"data_offsets\"") : NULL;
            if (offs) {
                const long begin = strtol(strchr(offs, '[') + 1, NULL, 10);
                const unsigned char ones[4] = {0xff, 0xff, 0xff, 0xff};
                poisoned = fseek(sf, (long)(8 + hlen) + begin, SEEK_SET) == 0 &&
                           fwrite(ones, 1, 4, sf) == 4;
            }
            free(hdr);
            fclose(sf);
        }
        CHECK(poisoned, "model.norm.weight not found in the shards");
        m = NULL;
        st = mi_model_load(test_ctx(), nan_dir, NULL, &m);
        CHECK(st == MI_STATUS_PARSE_ERROR && m == NULL && strstr(TEST_ERR, "model.norm.weight") &&
                  strstr(TEST_ERR, "NaN"),
              "NaN weight: %s", TEST_ERR);
    }

    /* Numbers that would make every output NaN, and special ids outside the tokenizer: refused
     * at load, naming the field. Each case: config.json's extra fields, and the field the
     * refusal names (NULL: it loads). */
    const char *cases[][2] = {{"\"rms_norm_eps\":0", "rms_norm_eps"},
                              {"\"rms_norm_eps\":-1e-5", "rms_norm_eps"},
                              {"\"rope_theta\":0", "rope_theta"},
                              {"\"rope_theta\":-10000", "rope_theta"},
                              {"\"rope_scaling\":{\"type\":\"linear\",\"factor\":0}", "factor"},
                              {"\"rope_scaling\":{\"type\":\"linear\",\"factor\":1e9}", "factor"},
                              /* special ids outside the tokenizer */
                              {"\"bos_token_id\":99999", "bos_token_id"},
                              {"\"bos_token_id\":-1", "bos_token_id"},
                              {"\"eos_token_id\":[1,70000]", "eos_token_id"},
                              {"\"eos_token_id\":[2,3]", NULL},
                              /* fewer layers than the shards hold (the later key wins) */
                              {"\"num_hidden_layers\":1", "num_hidden_layers"}};
    snprintf(path, sizeof(path), "%s/config.json", good);
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        char cfg[1024];
        snprintf(cfg, sizeof(cfg),
                 "{\"model_type\":\"llama\",\"hidden_size\":%d,\"intermediate_size\":%d,"
                 "\"num_hidden_layers\":%d,\"num_attention_heads\":%d,\"num_key_value_heads\":%d,"
                 "\"vocab_size\":%d,\"tie_word_embeddings\":true,%s}",
                 TM_HIDDEN, TM_FFN, TM_LAYERS, TM_HEADS, TM_KV, TM_VOCAB, cases[c][0]);
        write_text(path, cfg);
        m = NULL;
        st = mi_model_load(test_ctx(), good, NULL, &m);
        if (cases[c][1])
            CHECK(st == MI_STATUS_PARSE_ERROR && m == NULL && strstr(TEST_ERR, cases[c][1]),
                  "%s: %s", cases[c][0], TEST_ERR);
        else
            CHECK(st == MI_STATUS_SUCCESS && m != NULL, "%s: %s", cases[c][0], TEST_ERR);
        mi_model_destroy(m);
    }
}

/* config.json's sliding_window: Mistral's is used; Qwen2's only with use_sliding_window. */
static void test_sliding_window_config(void) {
    const struct {
        bool qwen2;
        const char *keys;
        int64_t want;
    } cases[] = {
        {false, "\"sliding_window\":300,", 300},
        {false, "\"sliding_window\":null,", 0},
        {true, "\"sliding_window\":300,", 0},
        {true, "\"sliding_window\":300,\"use_sliding_window\":true,", 300},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        char gpath[512], hdir[512], path[600];
        snprintf(gpath, sizeof(gpath), "%s/window_%zu.gguf", g_dir, c);
        snprintf(hdir, sizeof(hdir), "%s/window_%zu_hf", g_dir, c);
        CHECK(tm_write(gpath, hdir, cases[c].qwen2, 11), "write");
        snprintf(path, sizeof(path), "%s/config.json", hdir);
        FILE *f = fopen(path, "rb");
        char cfg[2048] = {0};
        size_t n = f ? fread(cfg, 1, sizeof(cfg) - 1, f) : 0;
        if (f) fclose(f);
        CHECK(n > 2 && cfg[0] == '{', "config.json");
        char edited[2300];
        snprintf(edited, sizeof(edited), "{%s%s", cases[c].keys, cfg + 1);
        f = fopen(path, "wb");
        CHECK(f && fwrite(edited, 1, strlen(edited), f) == strlen(edited), "rewrite config");
        if (f) fclose(f);
        mi_model *m = NULL;
        CHECK(mi_model_load(test_ctx(), hdir, NULL, &m) == MI_STATUS_SUCCESS, "load: %s", TEST_ERR);
        mi_model_info info;
        if (m && mi_model_get_info(m, &info) == MI_STATUS_SUCCESS)
            CHECK(info.sliding_window == cases[c].want, "case %zu: window %lld, want %lld", c,
                  (long long)info.sliding_window, (long long)cases[c].want);
        mi_model_destroy(m);
    }
}

int main(void) {
    snprintf(g_dir, sizeof(g_dir), "/tmp/mi_model_test_%d", (int)getpid());
    mkdir(g_dir, 0755);
    test_truncation();
    test_corrupt_fields();
    test_overlapping_tensors();
    test_gguf_header_refusals();
    test_check_weights();
    test_unsupported_type();
    test_formats_agree(false, 0);
    test_formats_agree(true, 0);
    /* GGUF rope_freqs divisors and config.json's llama3 rope_scaling describe one model; so do
     * the GGUF rope.scaling keys and config.json's YaRN and linear scaling */
    test_formats_agree(false, 1);
    test_formats_agree(false, 2);
    test_formats_agree(true, 3);
    test_hf_errors();
    test_sliding_window_config();
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return check_finish("test_model_load");
}
