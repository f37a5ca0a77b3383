/*
 * model_random.c: a llama-shaped model with seeded random weights (mi_model_create_random).
 *
 * Benchmarks need an 8B-shaped model and the GPU tests need small models of head size 64 and
 * 128; neither should depend on a multi-gigabyte download. Weights are bf16 on the host (the
 * GPU path keeps bf16 too, so both paths see the same values), uniform in +-sqrt(3 / cols) so a
 * product with a unit-RMS input has unit RMS, with RMSNorm gains near 1. Every row comes from
 * its own counter-based stream, so filling is parallel and the values do not depend on the
 * thread count.
 */
#include "model_runner.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

mi_model_shape mi_model_shape_llama3_8b(void) {
    mi_model_shape s;
    memset(&s, 0, sizeof(s));
    s.n_layers = 32;
    s.hidden = 4096;
    s.n_heads = 32;
    s.n_kv_heads = 8;
    s.head_dim = 128;
    s.ffn = 14336;
    s.vocab = 128256;
    s.rope_theta = 500000.0;
    s.context_length = 131072;
    return s;
}

/* splitmix64: a counter-based generator, so row r of tensor t is the same on any thread. */
static inline uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

typedef struct fill_job {
    uint16_t *dst; /* [rows, cols] bf16 */
    int64_t cols;
    uint64_t key;
    float scale;
} fill_job;

static void fill_task(void *arg, int64_t b, int64_t e, int thread) {
    (void)thread;
    const fill_job *j = arg;
    for (int64_t r = b; r < e; r++) {
        uint64_t state = mix64(j->key ^ mix64((uint64_t)r));
        uint16_t *row = j->dst + r * j->cols;
        for (int64_t c = 0; c < j->cols; c++) {
            state = mix64(state);
            const float u = (float)(state >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
            row[c] = mi_f32_to_bf16(u * j->scale);
        }
    }
}

static mi_status random_matrix(mi_model *m, mim_weight *w, int64_t rows, int64_t cols, uint64_t key,
                               char *err, size_t cap) {
    uint16_t *d = mim_model_own(m, (size_t)(rows * cols) * sizeof(uint16_t));
    if (!d)
        return mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory for a %lld x %lld weight",
                        (long long)rows, (long long)cols);
    fill_job j = {d, cols, key, sqrtf(3.0f / (float)cols)};
    mim_pool_run(m->pool, rows, fill_task, &j);
    w->data = d;
    w->type = MIM_TYPE_BF16;
    w->rows = rows;
    w->cols = cols;
    w->row_bytes = (size_t)cols * sizeof(uint16_t);
    m->info.weight_bytes += (uint64_t)(rows * cols) * sizeof(uint16_t);
    return MI_STATUS_SUCCESS;
}

/* n floats of center + spread * uniform(-1, 1). */
static float *random_vector(mi_model *m, int64_t n, uint64_t key, float center, float spread) {
    float *v = mim_model_own(m, (size_t)n * sizeof(float));
    if (!v) return NULL;
    uint64_t state = mix64(key);
    for (int64_t i = 0; i < n; i++) {
        state = mix64(state);
        v[i] = center + spread * ((float)(state >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f);
    }
    return v;
}

/* A byte-level BPE tokenizer.json without merges: text encodes to one token per byte. */
static mi_status random_tokenizer(mi_model *m, int32_t vocab, char *err, size_t cap) {
    json_t *root = json_object(), *model = json_object(), *v = json_object();
    json_t *added = json_array(), *pre = json_object();
    char name[32];
    uint32_t byte_cp[256];
    mim_gpt2_byte_map(byte_cp);
    for (int b = 0; b < 256; b++) {
        char u[5];
        size_t n = mim_utf8_encode(byte_cp[b], u);
        u[n] = 0;
        json_object_set_new(v, u, json_integer(b));
    }
    for (int32_t i = 256; i < vocab - 2; i++) {
        snprintf(name, sizeof(name), "<r%d>", (int)i);
        json_object_set_new(v, name, json_integer(i));
    }
    const char *special[2] = {"<|begin_of_text|>", "<|end_of_text|>"};
    for (int i = 0; i < 2; i++) {
        json_t *t = json_object();
        json_object_set_new(t, "id", json_integer(vocab - 2 + i));
        json_object_set_new(t, "content", json_string(special[i]));
        json_object_set_new(t, "special", json_true());
        json_array_append_new(added, t);
    }
    json_object_set_new(model, "type", json_string("BPE"));
    json_object_set_new(model, "vocab", v);
    json_object_set_new(model, "merges", json_array());
    json_object_set_new(pre, "type", json_string("ByteLevel"));
    json_object_set_new(pre, "add_prefix_space", json_false());
    json_object_set_new(pre, "use_regex", json_true());
    json_object_set_new(root, "added_tokens", added);
    json_object_set_new(root, "pre_tokenizer", pre);
    json_object_set_new(root, "model", model);
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!text) return mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory");
    mi_status st = mim_tokenizer_from_json(text, strlen(text), &m->tok, err, cap);
    free(text);
    if (st == MI_STATUS_SUCCESS) {
        m->tok->bos = vocab - 2;
        m->tok->eos = vocab - 1;
        m->tok->add_bos = true;
    }
    return st;
}

mi_status mim_random_weights(mi_model *m, const mi_model_shape *s, uint64_t seed, char *err,
                             size_t cap) {
    if (s->n_layers <= 0 || s->hidden <= 0 || s->n_heads <= 0 || s->n_kv_heads <= 0 ||
        s->head_dim <= 0 || s->head_dim % 2 != 0 || s->ffn <= 0 || s->vocab < 258 ||
        s->n_heads % s->n_kv_heads != 0 || s->sliding_window < 0 || s->n_layers > 4096 ||
        s->hidden > (1 << 20) || s->ffn > (1 << 22) || s->head_dim > 1024 || s->n_heads > 4096 ||
        s->vocab > (1 << 24))
        return mim_fail(err, cap, MI_STATUS_INVALID_ARGUMENT,
                        "bad model shape: %d layers, hidden %d, %d/%d heads of %d, ffn %d, vocab "
                        "%d, window %lld (all positive, heads a multiple of kv heads, even "
                        "head size, vocab >= 258)",
                        s->n_layers, s->hidden, s->n_heads, s->n_kv_heads, s->head_dim, s->ffn,
                        s->vocab, (long long)s->sliding_window);
    snprintf(m->info.arch, sizeof(m->info.arch), "llama");
    snprintf(m->info.source, sizeof(m->info.source), "random");
    m->n_layers = s->n_layers;
    m->hidden = s->hidden;
    m->n_heads = s->n_heads;
    m->n_kv = s->n_kv_heads;
    m->hd = s->head_dim;
    m->ffn = s->ffn;
    m->vocab = s->vocab;
    m->eps = 1e-5f;
    m->rope.dim = s->head_dim;
    m->rope.theta = s->rope_theta > 0 ? s->rope_theta : 500000.0;
    m->rope.neox = true;
    m->info.context_length = s->context_length > 0 ? s->context_length : 131072;
    m->sliding_window = s->sliding_window;
    mi_status st = random_tokenizer(m, s->vocab, err, cap);
    if (st != MI_STATUS_SUCCESS) return st;
    m->layers = calloc((size_t)m->n_layers, sizeof(mim_layer));
    if (!m->layers) return mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory");
    const int64_t D = m->hidden, qd = (int64_t)m->n_heads * m->hd, kvd = (int64_t)m->n_kv * m->hd;
    uint64_t key = mix64(seed);
#define NEXT_KEY (key = mix64(key + 1))
    if ((st = random_matrix(m, &m->tok_embd, m->vocab, D, NEXT_KEY, err, cap))) return st;
    m->output = m->tok_embd; /* tied, as small llama models are */
    m->info.tied_embeddings = 1;
    if (!(m->out_norm = random_vector(m, D, NEXT_KEY, 1.0f, 0.1f)))
        return mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int32_t l = 0; l < m->n_layers; l++) {
        mim_layer *L = &m->layers[l];
        if ((st = random_matrix(m, &L->wq, qd, D, NEXT_KEY, err, cap)) ||
            (st = random_matrix(m, &L->wk, kvd, D, NEXT_KEY, err, cap)) ||
            (st = random_matrix(m, &L->wv, kvd, D, NEXT_KEY, err, cap)) ||
            (st = random_matrix(m, &L->wo, D, qd, NEXT_KEY, err, cap)) ||
            (st = random_matrix(m, &L->wg, m->ffn, D, NEXT_KEY, err, cap)) ||
            (st = random_matrix(m, &L->wu, m->ffn, D, NEXT_KEY, err, cap)) ||
            (st = random_matrix(m, &L->wd, D, m->ffn, NEXT_KEY, err, cap)))
            return st;
        L->attn_norm = random_vector(m, D, NEXT_KEY, 1.0f, 0.1f);
        L->ffn_norm = random_vector(m, D, NEXT_KEY, 1.0f, 0.1f);
        if (!L->attn_norm || !L->ffn_norm)
            return mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory");
        if (s->qkv_bias) {
            L->bq = random_vector(m, qd, NEXT_KEY, 0.0f, 0.2f);
            L->bk = random_vector(m, kvd, NEXT_KEY, 0.0f, 0.2f);
            L->bv = random_vector(m, kvd, NEXT_KEY, 0.0f, 0.2f);
            if (!L->bq || !L->bk || !L->bv)
                return mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory");
        }
    }
#undef NEXT_KEY
    return MI_STATUS_SUCCESS;
}
