/*
 * tiny_model.h: a seeded two-layer llama / qwen2 model written both as GGUF and as a Hugging
 * Face directory (sharded safetensors, config.json, tokenizer.json) with identical weight values,
 * so that the two loaders can be checked against each other.
 *
 * The GGUF copy stores some matrices quantized (Q8_0 embedding, Q4_0 v, Q4_1 down, F16 output
 * projection); the HF copy stores the dequantized values of those, so both describe one model.
 * GGUF llama q/k rows are permuted the way the GGUF converter does, which the loader must undo
 * by using adjacent-pair RoPE.
 */
#ifndef MI_TINY_MODEL_H
#define MI_TINY_MODEL_H

#include "model_test_util.h"

#include <sys/stat.h>

#define TM_HIDDEN 64
#define TM_HEADS 4
#define TM_KV 2
#define TM_HD 16
#define TM_FFN 96
#define TM_LAYERS 2

static uint64_t tm_rng = 1;
static inline float tm_rand(void) {
    tm_rng = tm_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((tm_rng >> 40) & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f;
}

/* ---- reference quantizers (the block formats of model_quant.c) ---- */

static inline void put_f16(unsigned char *p, float v) {
    uint16_t h = mi_f32_to_f16(v);
    memcpy(p, &h, 2);
}
static inline float get_f16(const unsigned char *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return mi_f16_to_f32(h);
}

/* Quantizes n values (multiple of 32) into dst, and writes the dequantized values back into x
 * so that the caller holds exactly what the file means. Returns bytes written. */
static inline size_t tm_quantize(uint32_t type, float *x, size_t n, unsigned char *dst) {
    size_t w = 0;
    for (size_t b = 0; b < n / 32; b++) {
        float *v = x + b * 32;
        float amax = 0, mn = v[0], mx = v[0];
        for (int j = 0; j < 32; j++) {
            if (fabsf(v[j]) > amax) amax = fabsf(v[j]);
            if (v[j] < mn) mn = v[j];
            if (v[j] > mx) mx = v[j];
        }
        unsigned char *p = dst + w;
        if (type == 8) { /* Q8_0 */
            put_f16(p, amax / 127.0f);
            float d = get_f16(p);
            for (int j = 0; j < 32; j++) {
                int q = d > 0 ? (int)lrintf(v[j] / d) : 0;
                q = q < -127 ? -127 : (q > 127 ? 127 : q);
                p[2 + j] = (unsigned char)(int8_t)q;
                v[j] = d * (float)q;
            }
            w += 34;
        } else if (type == 2) { /* Q4_0 */
            put_f16(p, amax / 7.0f);
            float d = get_f16(p);
            int q[32];
            for (int j = 0; j < 32; j++) {
                q[j] = d > 0 ? (int)lrintf(v[j] / d) + 8 : 8;
                q[j] = q[j] < 0 ? 0 : (q[j] > 15 ? 15 : q[j]);
                v[j] = d * (float)(q[j] - 8);
            }
            for (int j = 0; j < 16; j++) p[2 + j] = (unsigned char)(q[j] | (q[j + 16] << 4));
            w += 18;
        } else { /* Q4_1 */
            put_f16(p, (mx - mn) / 15.0f);
            put_f16(p + 2, mn);
            float d = get_f16(p), m = get_f16(p + 2);
            int q[32];
            for (int j = 0; j < 32; j++) {
                q[j] = d > 0 ? (int)lrintf((v[j] - m) / d) : 0;
                q[j] = q[j] < 0 ? 0 : (q[j] > 15 ? 15 : q[j]);
                v[j] = d * (float)q[j] + m;
            }
            for (int j = 0; j < 16; j++) p[4 + j] = (unsigned char)(q[j] | (q[j + 16] << 4));
            w += 20;
        }
    }
    return w;
}

/* ---- vocabulary: 256 byte tokens, a few merges, two control tokens ---- */

static inline uint32_t tm_byte_cp(int b) {
    int next = 256;
    for (int i = 0; i < 256; i++) {
        bool printable = (i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174);
        if (i == b) return printable ? (uint32_t)i : (uint32_t)next;
        if (!printable) next++;
    }
    return 0;
}

static inline void tm_utf8(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

#define TM_N_MERGES 5
static const char *tm_merges[TM_N_MERGES] = {"h e", "l l", "he ll", "Ġ w", "o r"};
static const char *tm_merged[TM_N_MERGES] = {"he", "ll", "hell", "Ġw", "or"};
#define TM_VOCAB (256 + TM_N_MERGES + 2)

typedef struct tm_vocab {
    char tok[TM_VOCAB][8];
    const char *ptr[TM_VOCAB];
    int32_t type[TM_VOCAB];
} tm_vocab;

static inline void tm_make_vocab(tm_vocab *v) {
    for (int b = 0; b < 256; b++) {
        tm_utf8(tm_byte_cp(b), v->tok[b]);
        v->type[b] = 1;
    }
    for (int i = 0; i < TM_N_MERGES; i++) {
        snprintf(v->tok[256 + i], 8, "%s", tm_merged[i]);
        v->type[256 + i] = 1;
    }
    snprintf(v->tok[TM_VOCAB - 2], 8, "<|s|>");
    snprintf(v->tok[TM_VOCAB - 1], 8, "<|e|>");
    v->type[TM_VOCAB - 2] = v->type[TM_VOCAB - 1] = 3;
    for (int i = 0; i < TM_VOCAB; i++) v->ptr[i] = v->tok[i];
}

/* ---- weights ---- */

typedef struct tm_mat {
    char gguf[64], hf[96];
    int64_t rows, cols;
    uint32_t gtype;   /* GGUF type */
    float *f;         /* values as the HF copy stores them (dequantized) */
    unsigned char *q; /* GGUF bytes */
    size_t qbytes;
    bool permute; /* llama q/k: rows permuted in the GGUF copy */
    int perm_heads;
} tm_mat;

typedef struct tiny_model {
    tm_mat m[64];
    int n;
} tiny_model;

static inline void tm_add(tiny_model *t, const char *gguf, const char *hf, int64_t rows,
                          int64_t cols, uint32_t gtype, float scale, float offset, int perm_heads) {
    tm_mat *m = &t->m[t->n++];
    snprintf(m->gguf, sizeof(m->gguf), "%s", gguf);
    snprintf(m->hf, sizeof(m->hf), "%s", hf);
    m->rows = rows;
    m->cols = cols;
    m->gtype = gtype;
    size_t n = (size_t)(rows * cols);
    m->f = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) m->f[i] = offset + scale * tm_rand();
    m->q = malloc(n * 4 + 64);
    if (gtype == 0) {
        memcpy(m->q, m->f, n * 4);
        m->qbytes = n * 4;
    } else if (gtype == 1) {
        for (size_t i = 0; i < n; i++) {
            put_f16(m->q + 2 * i, m->f[i]);
            m->f[i] = get_f16(m->q + 2 * i);
        }
        m->qbytes = n * 2;
    } else {
        m->qbytes = tm_quantize(gtype, m->f, n, m->q);
    }
    m->permute = perm_heads > 0;
    m->perm_heads = perm_heads;
    if (m->permute) { /* GGUF row (h, j, t) holds HF row (h, t, j): F32 only */
        int64_t hd = rows / perm_heads;
        float *src = (float *)m->q;
        float *tmp = malloc(n * 4);
        for (int64_t h = 0; h < perm_heads; h++)
            for (int64_t j = 0; j < hd / 2; j++)
                for (int64_t s = 0; s < 2; s++)
                    memcpy(tmp + (h * hd + 2 * j + s) * cols,
                           src + (h * hd + s * hd / 2 + j) * cols, (size_t)cols * 4);
        memcpy(m->q, tmp, n * 4);
        free(tmp);
    }
}

static inline void tm_free(tiny_model *t) {
    for (int i = 0; i < t->n; i++) {
        free(t->m[i].f);
        free(t->m[i].q);
    }
}

/* LLaMA-3.1 RoPE scaling of the tiny model: config.json names it; the GGUF copy carries it as
 * per-frequency divisors (rope_freqs.weight), the way the GGUF converter stores it. */
static const mi_rope_scaling tm_llama3 = {MI_ROPE_LLAMA3, 8.0, 1024, 1.0, 4.0, 0, 0, 0};

/* Builds the model and writes gguf_path and hf_dir. qwen2: biases and neox RoPE in both. */
/* rope: 0 plain, 1 llama3, 2 YaRN (factor 4 over 512), 3 linear (factor 2) */
static inline bool tm_write_ex(const char *gguf_path, const char *hf_dir, bool qwen2, int rope,
                               uint64_t seed) {
    const bool llama3_rope = rope == 1;
    tm_rng = seed;
    tiny_model t = {0};
    char g[64], h[96];
    const int qd = TM_HEADS * TM_HD, kvd = TM_KV * TM_HD;
    tm_add(&t, "token_embd.weight", "model.embed_tokens.weight", TM_VOCAB, TM_HIDDEN, 8, 0.5f, 0,
           0);
    tm_add(&t, "output_norm.weight", "model.norm.weight", 1, TM_HIDDEN, 0, 0.1f, 1.0f, 0);
    for (int l = 0; l < TM_LAYERS; l++) {
#define ADD(gn, hn, r, c, ty, sc, off, ph)                                                         \
    do {                                                                                           \
        snprintf(g, sizeof(g), "blk.%d." gn, l);                                                   \
        snprintf(h, sizeof(h), "model.layers.%d." hn, l);                                          \
        tm_add(&t, g, h, r, c, ty, sc, off, ph);                                                   \
    } while (0)
        ADD("attn_norm.weight", "input_layernorm.weight", 1, TM_HIDDEN, 0, 0.1f, 1.0f, 0);
        ADD("ffn_norm.weight", "post_attention_layernorm.weight", 1, TM_HIDDEN, 0, 0.1f, 1.0f, 0);
        ADD("attn_q.weight", "self_attn.q_proj.weight", qd, TM_HIDDEN, 0, 0.3f, 0,
            qwen2 ? 0 : TM_HEADS);
        ADD("attn_k.weight", "self_attn.k_proj.weight", kvd, TM_HIDDEN, 0, 0.3f, 0,
            qwen2 ? 0 : TM_KV);
        ADD("attn_v.weight", "self_attn.v_proj.weight", kvd, TM_HIDDEN, 2, 0.3f, 0, 0);
        ADD("attn_output.weight", "self_attn.o_proj.weight", TM_HIDDEN, qd, 1, 0.2f, 0, 0);
        ADD("ffn_gate.weight", "mlp.gate_proj.weight", TM_FFN, TM_HIDDEN, 0, 0.2f, 0, 0);
        ADD("ffn_up.weight", "mlp.up_proj.weight", TM_FFN, TM_HIDDEN, 0, 0.2f, 0, 0);
        ADD("ffn_down.weight", "mlp.down_proj.weight", TM_HIDDEN, TM_FFN, 3, 0.2f, 0, 0);
        if (qwen2) {
            ADD("attn_q.bias", "self_attn.q_proj.bias", 1, qd, 0, 0.2f, 0, 0);
            ADD("attn_k.bias", "self_attn.k_proj.bias", 1, kvd, 0, 0.2f, 0, 0);
            ADD("attn_v.bias", "self_attn.v_proj.bias", 1, kvd, 0, 0.2f, 0, 0);
        }
#undef ADD
    }
    tm_vocab v;
    tm_make_vocab(&v);

    /* GGUF */
    gguf_writer w;
    memset(&w, 0, sizeof(w));
    const char *arch = qwen2 ? "qwen2" : "llama";
    char key[96];
    gw_str(&w, "general.architecture", arch);
    gw_str(&w, "general.name", "tiny");
#define AK(s) (snprintf(key, sizeof(key), "%s.%s", arch, s), key)
    gw_u32(&w, AK("block_count"), TM_LAYERS);
    gw_u32(&w, AK("embedding_length"), TM_HIDDEN);
    gw_u32(&w, AK("feed_forward_length"), TM_FFN);
    gw_u32(&w, AK("attention.head_count"), TM_HEADS);
    gw_u32(&w, AK("attention.head_count_kv"), TM_KV);
    gw_u32(&w, AK("context_length"), 2048);
    gw_f32(&w, AK("attention.layer_norm_rms_epsilon"), 1e-5f);
    gw_f32(&w, AK("rope.freq_base"), 10000.0f);
    static float freq_factors[TM_HD / 2];
    if (llama3_rope) {
        float plain[TM_HD / 2], scaled[TM_HD / 2], ms;
        mi_rope_frequencies(TM_HD, 10000.0, NULL, 0, plain, &ms);
        mi_rope_frequencies(TM_HD, 10000.0, &tm_llama3, 0, scaled, &ms);
        for (int i = 0; i < TM_HD / 2; i++) freq_factors[i] = plain[i] / scaled[i];
        gw_tensor_add(&w, "rope_freqs.weight", 0, TM_HD / 2, 0, freq_factors, sizeof(freq_factors));
    }
    char key2[96];
    snprintf(key2, sizeof(key2), "%s.rope.scaling.type", arch);
    if (rope == 2 || rope == 3) gw_str(&w, key2, rope == 2 ? "yarn" : "linear");
    snprintf(key2, sizeof(key2), "%s.rope.scaling.factor", arch);
    if (rope == 2 || rope == 3) gw_f32(&w, key2, rope == 2 ? 4.0f : 2.0f);
    snprintf(key2, sizeof(key2), "%s.rope.scaling.original_context_length", arch);
    if (rope == 2) gw_u32(&w, key2, 512);
#undef AK
    gw_str(&w, "tokenizer.ggml.model", "gpt2");
    gw_str(&w, "tokenizer.ggml.pre", "gpt-2");
    gw_strs(&w, "tokenizer.ggml.tokens", v.ptr, TM_VOCAB);
    gw_i32s(&w, "tokenizer.ggml.token_type", v.type, TM_VOCAB);
    gw_strs(&w, "tokenizer.ggml.merges", tm_merges, TM_N_MERGES);
    gw_u32(&w, "tokenizer.ggml.bos_token_id", TM_VOCAB - 2);
    gw_u32(&w, "tokenizer.ggml.eos_token_id", TM_VOCAB - 1);
    gw_bool(&w, "tokenizer.ggml.add_bos_token", false);
    for (int i = 0; i < t.n; i++) {
        tm_mat *m = &t.m[i];
        gw_tensor_add(&w, m->gguf, m->gtype, (uint64_t)m->cols,
                      m->rows == 1 ? 0 : (uint64_t)m->rows, m->q, m->qbytes);
    }
    tbuf gb = gw_finish(&w, NULL);
    bool ok = tb_write(&gb, gguf_path);
    free(gb.p);
    free(w.kv.p);

    /* HF directory: two shards and an index */
    mkdir(hf_dir, 0755);
    char path[512];
    st_entry e[64];
    int half = t.n / 2;
    for (int s = 0; s < 2 && ok; s++) {
        int n = 0;
        for (int i = s ? half : 0; i < (s ? t.n : half); i++) {
            snprintf(e[n].name, sizeof(e[n].name), "%s", t.m[i].hf);
            e[n].n_dims = t.m[i].rows == 1 ? 1 : 2;
            e[n].shape[0] = t.m[i].rows == 1 ? t.m[i].cols : t.m[i].rows;
            e[n].shape[1] = t.m[i].cols;
            e[n].data = t.m[i].f;
            n++;
        }
        tbuf sb = st_build(e, n);
        snprintf(path, sizeof(path), "%s/model-0000%d-of-00002.safetensors", hf_dir, s + 1);
        ok = tb_write(&sb, path);
        free(sb.p);
    }
    tbuf idx = {0};
    tb_put(&idx, "{\"metadata\":{},\"weight_map\":{", 29);
    for (int i = 0; i < t.n; i++) {
        char line[200];
        snprintf(line, sizeof(line), "%s\"%s\":\"model-0000%d-of-00002.safetensors\"", i ? "," : "",
                 t.m[i].hf, i < half ? 1 : 2);
        tb_put(&idx, line, strlen(line));
    }
    tb_put(&idx, "}}", 2);
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", hf_dir);
    ok = ok && tb_write(&idx, path);
    free(idx.p);

    char cfg[1024];
    snprintf(cfg, sizeof(cfg),
             "{\"model_type\":\"%s\",\"hidden_size\":%d,\"intermediate_size\":%d,"
             "\"num_hidden_layers\":%d,\"num_attention_heads\":%d,\"num_key_value_heads\":%d,"
             "\"rms_norm_eps\":1e-5,\"rope_theta\":10000.0,\"max_position_embeddings\":2048,"
             "\"vocab_size\":%d,\"tie_word_embeddings\":true,\"bos_token_id\":%d,"
             "\"eos_token_id\":%d%s}",
             qwen2 ? "qwen2" : "llama", TM_HIDDEN, TM_FFN, TM_LAYERS, TM_HEADS, TM_KV, TM_VOCAB,
             TM_VOCAB - 2, TM_VOCAB - 1,
             rope == 1   ? ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,"
                           "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                           "\"original_max_position_embeddings\":1024}"
             : rope == 2 ? ",\"rope_scaling\":{\"type\":\"yarn\",\"factor\":4.0,"
                           "\"original_max_position_embeddings\":512}"
             : rope == 3 ? ",\"rope_scaling\":{\"type\":\"linear\",\"factor\":2.0}"
                         : "");
    tbuf cb = {0};
    tb_put(&cb, cfg, strlen(cfg));
    snprintf(path, sizeof(path), "%s/config.json", hf_dir);
    ok = ok && tb_write(&cb, path);
    free(cb.p);

    /* tokenizer.json: byte-level BPE with the same vocabulary and merges */
    tbuf tj = {0};
    const char *head = "{\"version\":\"1.0\",\"added_tokens\":["
                       "{\"id\":261,\"content\":\"<|s|>\",\"special\":true},"
                       "{\"id\":262,\"content\":\"<|e|>\",\"special\":true}],"
                       "\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"ByteLevel\","
                       "\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true},"
                       "\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\"},"
                       "\"model\":{\"type\":\"BPE\",\"vocab\":{";
    tb_put(&tj, head, strlen(head));
    for (int i = 0; i < TM_VOCAB - 2; i++) {
        char line[64];
        const char *s = v.tok[i];
        /* JSON-escape the few ASCII tokens that need it */
        if (strcmp(s, "\"") == 0)
            s = "\\\"";
        else if (strcmp(s, "\\") == 0)
            s = "\\\\";
        snprintf(line, sizeof(line), "%s\"%s\":%d", i ? "," : "", s, i);
        tb_put(&tj, line, strlen(line));
    }
    tb_put(&tj, "},\"merges\":[", 12);
    for (int i = 0; i < TM_N_MERGES; i++) {
        char line[64];
        snprintf(line, sizeof(line), "%s\"%s\"", i ? "," : "", tm_merges[i]);
        tb_put(&tj, line, strlen(line));
    }
    tb_put(&tj, "]}}", 3);
    snprintf(path, sizeof(path), "%s/tokenizer.json", hf_dir);
    ok = ok && tb_write(&tj, path);
    free(tj.p);
    tm_free(&t);
    return ok;
}

static inline bool tm_write(const char *gguf_path, const char *hf_dir, bool qwen2, uint64_t seed) {
    return tm_write_ex(gguf_path, hf_dir, qwen2, 0, seed);
}

#endif /* MI_TINY_MODEL_H */
