/*
 * model_load.c: builds a mi_model from a GGUF file or a Hugging Face directory.
 *
 * Both sources end in the same layout: matrices as mim_weight views into the memory-mapped
 * file (rows = output features, in the file's encoding), small vectors (norms, biases, rope
 * factors) copied to fp32. Every tensor is checked for presence, type and shape before use.
 *
 * RoPE layout: GGUF llama files store q/k rows permuted so that adjacent dimensions form the
 * rotation pairs (the converter does this); qwen2 GGUF files and every Hugging Face checkpoint
 * pair dimension i with i + head_dim/2 ("neox"). The loader records which one applies.
 */
#define _POSIX_C_SOURCE 200809L
#include "minference_kv.h"
#include "model_gpu.h"

#include <cblas.h>
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

mi_status mim_model_fail(mi_model *m, mi_status status, const char *fmt, ...) {
    if (m) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(m->last_error, sizeof(m->last_error), fmt, ap);
        va_end(ap);
    }
    return status;
}

mi_model_params mi_model_default_params(void) {
    mi_model_params p;
    memset(&p, 0, sizeof(p));
    p.device = MI_DEVICE_CPU;
    p.n_threads = 0;
    p.max_context = 0;
    p.mlp_chunk = 4096;
    return p;
}

/* ------------------------------------------------------------------------------------------ */
/* Tensor lookup over either source                                                            */

typedef struct tref {
    bool found;
    const void *data;
    uint32_t type;
    const char *type_name;
    int n_dims;
    int64_t rows, cols; /* cols is the contiguous dimension */
    uint64_t nbytes;
} tref;

static tref lookup(const mi_model *m, const char *name) {
    tref r;
    memset(&r, 0, sizeof(r));
    if (m->gguf) {
        const mim_gguf_tensor *t = mim_gguf_find_tensor(m->gguf, name);
        if (!t) return r;
        r.found = true;
        r.data = t->data;
        r.type = t->type;
        r.type_name = mim_type_name(t->type);
        r.n_dims = (int)t->n_dims;
        r.cols = (int64_t)t->ne[0];
        r.rows = (int64_t)(t->ne[1] * t->ne[2] * t->ne[3]);
        r.nbytes = t->nbytes;
        return r;
    }
    for (int s = 0; s < m->n_shards; s++)
        for (int i = 0; i < m->shards[s].n_tensors; i++) {
            const mim_st_tensor *t = &m->shards[s].tensors[i];
            if (strcmp(t->name, name) != 0) continue;
            r.found = true;
            r.data = t->data;
            r.type = t->type;
            r.type_name = t->dtype_name;
            r.n_dims = t->n_dims;
            r.cols = t->n_dims > 0 ? t->shape[t->n_dims - 1] : 1;
            r.rows = 1;
            for (int d = 0; d + 1 < t->n_dims; d++) r.rows *= t->shape[d];
            r.nbytes = t->nbytes;
            return r;
        }
    return r;
}

static mi_status get_tensor(mi_model *m, const char *name, int64_t rows, int64_t cols,
                            bool required, tref *out, char *err, size_t cap) {
    *out = lookup(m, name);
    if (!out->found) {
        if (!required) return MI_STATUS_SUCCESS;
        return mim_fail(err, cap, MI_STATUS_PARSE_ERROR, "tensor '%s' is missing", name);
    }
    if (!mim_type_supported(out->type))
        return mim_fail(err, cap, MI_STATUS_UNSUPPORTED,
                        "tensor '%s' has type %s, which this runner does not support (F32, F16, "
                        "BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K are)",
                        name, out->type_name);
    if (out->rows != rows || out->cols != cols)
        return mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                        "tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]", name,
                        (long long)out->rows, (long long)out->cols, (long long)rows,
                        (long long)cols);
    uint64_t rb;
    if (!mim_type_row_bytes(out->type, (uint64_t)cols, &rb) || rb * (uint64_t)rows > out->nbytes)
        return mim_fail(err, cap, MI_STATUS_PARSE_ERROR, "tensor '%s' is smaller than its shape",
                        name);
    return MI_STATUS_SUCCESS;
}

static bool all_finite(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return false;
    return true;
}

typedef struct finite_job {
    const unsigned char *data;
    uint32_t type;
    int64_t cols;
    size_t row_bytes;
    atomic_int bad; /* 1: a row with NaN/inf was seen; 2: no memory for a scratch row */
} finite_job;

static void finite_rows(void *arg, int64_t b, int64_t e, int thread) {
    (void)thread;
    finite_job *j = arg;
    float *row = malloc((size_t)j->cols * sizeof *row);
    if (!row) {
        atomic_store(&j->bad, 2);
        return;
    }
    for (int64_t r = b; r < e && !atomic_load_explicit(&j->bad, memory_order_relaxed); r++) {
        mim_dequant_row(j->type, j->data + (size_t)r * j->row_bytes, row, j->cols);
        if (!all_finite(row, j->cols)) atomic_store(&j->bad, 1);
    }
    free(row);
}

static mi_status get_weight(mi_model *m, const char *name, int64_t rows, int64_t cols,
                            mim_weight *w, char *err, size_t cap) {
    tref t;
    mi_status st = get_tensor(m, name, rows, cols, true, &t, err, cap);
    if (st != MI_STATUS_SUCCESS) return st;
    uint64_t rb = 0;
    mim_type_row_bytes(t.type, (uint64_t)cols, &rb);
    bool finite = true;
    if (m->params.check_weights) {
        finite_job j = {t.data, t.type, cols, (size_t)rb, 0};
        mim_pool_run(m->pool, rows, finite_rows, &j);
        if (atomic_load(&j.bad) == 2)
            return mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory checking '%s'", name);
        finite = !atomic_load(&j.bad);
    } else {
        /* A cheap look for broken files: the first and last rows (the whole matrix is mapped,
         * not read, at load; vectors are checked whole in get_vector). */
        float *row = malloc((size_t)cols * sizeof *row);
        if (!row) return mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory");
        for (int64_t r = 0; r < rows && finite; r += rows - 1 > 0 ? rows - 1 : 1) {
            mim_dequant_row(t.type, (const unsigned char *)t.data + (size_t)r * (size_t)rb, row,
                            cols);
            finite = all_finite(row, cols);
        }
        free(row);
    }
    if (!finite)
        return mim_fail(err, cap, MI_STATUS_PARSE_ERROR, "tensor '%s' holds NaN or inf", name);
    w->data = t.data;
    w->type = t.type;
    w->rows = rows;
    w->cols = cols;
    w->row_bytes = (size_t)rb;
    m->info.weight_bytes += rb * (uint64_t)rows;
    return MI_STATUS_SUCCESS;
}

void *mim_model_own(mi_model *m, size_t bytes) {
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? m->cap_owned * 2 : 64;
        void **p = realloc(m->owned, (size_t)cap * sizeof(void *));
        if (!p) return NULL;
        m->owned = p;
        m->cap_owned = cap;
    }
    void *f = malloc(bytes ? bytes : 1);
    if (f) m->owned[m->n_owned++] = f;
    return f;
}

static float *own_floats(mi_model *m, size_t n) { return mim_model_own(m, n * sizeof(float)); }

/* A vector (1-D, or [1, n]) copied to fp32; NULL in *out when absent and not required. */
static mi_status get_vector(mi_model *m, const char *name, int64_t n, bool required, float **out,
                            char *err, size_t cap) {
    tref t;
    *out = NULL;
    mi_status st = get_tensor(m, name, 1, n, required, &t, err, cap);
    if (st != MI_STATUS_SUCCESS || !t.found) return st;
    float *f = own_floats(m, (size_t)n);
    if (!f) return mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory");
    mim_dequant_row(t.type, t.data, f, n);
    if (!all_finite(f, n))
        return mim_fail(err, cap, MI_STATUS_PARSE_ERROR, "tensor '%s' holds NaN or inf", name);
    *out = f;
    return MI_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Shapes and weights                                                                          */

static mi_status check_dims(mi_model *m, char *err, size_t cap) {
    if (m->n_layers <= 0 || m->hidden <= 0 || m->n_heads <= 0 || m->n_kv <= 0 || m->ffn <= 0 ||
        m->hd <= 0 || m->n_heads % m->n_kv != 0 || m->n_layers > 4096 || m->hidden > (1 << 20) ||
        m->ffn > (1 << 22) || m->hd > 1024 || m->n_heads > 4096)
        return mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                        "implausible model dimensions: layers %d hidden %d heads %d/%d head_dim "
                        "%d ffn %d",
                        m->n_layers, m->hidden, m->n_heads, m->n_kv, m->hd, m->ffn);
    if (m->rope.dim <= 0 || m->rope.dim > m->hd || m->rope.dim % 2)
        return mim_fail(err, cap, MI_STATUS_PARSE_ERROR, "bad rope dimension %d for head_dim %d",
                        m->rope.dim, m->hd);
    /* Values with which every output would be NaN or nonsense: refused here, naming the field,
     * rather than generating garbage with success. */
    if (!(m->eps > 0.0f && m->eps < 1.0f))
        return mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                        "rms_norm_eps %g is not a small positive number", (double)m->eps);
    if (!(m->rope.theta > 0.0 && isfinite(m->rope.theta)))
        return mim_fail(err, cap, MI_STATUS_PARSE_ERROR, "rope_theta %g is not a positive number",
                        m->rope.theta);
    const mi_rope_scaling *sc = &m->rope.scaling;
    if (sc->type != MI_ROPE_NONE && !(sc->factor >= 1e-3 && sc->factor <= 1e4))
        return mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                        "rope scaling factor %g is outside [0.001, 10000]", sc->factor);
    return MI_STATUS_SUCCESS;
}

typedef struct names {
    const char *embd, *out, *out_norm;
    const char *q, *k, *v, *o, *g, *u, *d, *attn_norm, *ffn_norm, *bq, *bk, *bv;
} names;

static const names gguf_names = {
    "token_embd.weight",         "output.weight",           "output_norm.weight",
    "blk.%d.attn_q.weight",      "blk.%d.attn_k.weight",    "blk.%d.attn_v.weight",
    "blk.%d.attn_output.weight", "blk.%d.ffn_gate.weight",  "blk.%d.ffn_up.weight",
    "blk.%d.ffn_down.weight",    "blk.%d.attn_norm.weight", "blk.%d.ffn_norm.weight",
    "blk.%d.attn_q.bias",        "blk.%d.attn_k.bias",      "blk.%d.attn_v.bias",
};

static const names hf_names = {
    "model.embed_tokens.weight",
    "lm_head.weight",
    "model.norm.weight",
    "model.layers.%d.self_attn.q_proj.weight",
    "model.layers.%d.self_attn.k_proj.weight",
    "model.layers.%d.self_attn.v_proj.weight",
    "model.layers.%d.self_attn.o_proj.weight",
    "model.layers.%d.mlp.gate_proj.weight",
    "model.layers.%d.mlp.up_proj.weight",
    "model.layers.%d.mlp.down_proj.weight",
    "model.layers.%d.input_layernorm.weight",
    "model.layers.%d.post_attention_layernorm.weight",
    "model.layers.%d.self_attn.q_proj.bias",
    "model.layers.%d.self_attn.k_proj.bias",
    "model.layers.%d.self_attn.v_proj.bias",
};

/* A tensor of a layer the header does not count means the layer count is wrong (the model
 * would run without those layers and print nonsense), so it is refused. */
static mi_status check_layer_count(const mi_model *m, const names *nm, char *err, size_t cap) {
    const char *pct = strstr(nm->q, "%d");
    const size_t plen = (size_t)(pct - nm->q);
    const char *field = m->gguf ? "block_count" : "num_hidden_layers";
    const int n_files = m->gguf ? 1 : m->n_shards;
    for (int s = 0; s < n_files; s++) {
        const int64_t n = m->gguf ? (int64_t)m->gguf->n_tensors : m->shards[s].n_tensors;
        for (int64_t i = 0; i < n; i++) {
            const char *name = m->gguf ? m->gguf->tensors[i].name : m->shards[s].tensors[i].name;
            const size_t len = m->gguf ? m->gguf->tensors[i].name_len : strlen(name);
            if (len <= plen || memcmp(name, nm->q, plen) != 0) continue;
            int64_t layer = 0;
            size_t j = plen;
            for (; j < len && j < plen + 10 && name[j] >= '0' && name[j] <= '9'; j++)
                layer = layer * 10 + (name[j] - '0');
            if (j == plen || j >= len || name[j] != '.') continue;
            if (layer >= m->n_layers)
                return mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                                "%s is %d but tensor '%.*s' belongs to layer %lld", field,
                                (int)m->n_layers, (int)(len < 120 ? len : 120), name,
                                (long long)layer);
        }
    }
    return MI_STATUS_SUCCESS;
}

static mi_status load_weights(mi_model *m, const names *nm, char *err, size_t cap) {
    mi_status st = check_layer_count(m, nm, err, cap);
    if (st != MI_STATUS_SUCCESS) return st;
    const int64_t qd = (int64_t)m->n_heads * m->hd, kvd = (int64_t)m->n_kv * m->hd;
    tref emb = lookup(m, nm->embd);
    if (!emb.found)
        return mim_fail(err, cap, MI_STATUS_PARSE_ERROR, "tensor '%s' is missing", nm->embd);
    if (m->vocab <= 0) m->vocab = (int32_t)emb.rows;
    if ((st = get_weight(m, nm->embd, m->vocab, m->hidden, &m->tok_embd, err, cap))) return st;
    if (lookup(m, nm->out).found) {
        if ((st = get_weight(m, nm->out, m->vocab, m->hidden, &m->output, err, cap))) return st;
        m->info.tied_embeddings = 0;
    } else {
        m->output = m->tok_embd;
        m->info.tied_embeddings = 1;
    }
    if ((st = get_vector(m, nm->out_norm, m->hidden, true, &m->out_norm, err, cap))) return st;
    m->layers = calloc((size_t)m->n_layers, sizeof(mim_layer));
    if (!m->layers) return mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory");
    char name[160];
#define NAME(fmt) (snprintf(name, sizeof(name), fmt, l), name)
    for (int l = 0; l < m->n_layers; l++) {
        mim_layer *L = &m->layers[l];
        if ((st = get_weight(m, NAME(nm->q), qd, m->hidden, &L->wq, err, cap)) ||
            (st = get_weight(m, NAME(nm->k), kvd, m->hidden, &L->wk, err, cap)) ||
            (st = get_weight(m, NAME(nm->v), kvd, m->hidden, &L->wv, err, cap)) ||
            (st = get_weight(m, NAME(nm->o), m->hidden, qd, &L->wo, err, cap)) ||
            (st = get_weight(m, NAME(nm->g), m->ffn, m->hidden, &L->wg, err, cap)) ||
            (st = get_weight(m, NAME(nm->u), m->ffn, m->hidden, &L->wu, err, cap)) ||
            (st = get_weight(m, NAME(nm->d), m->hidden, m->ffn, &L->wd, err, cap)) ||
            (st = get_vector(m, NAME(nm->attn_norm), m->hidden, true, &L->attn_norm, err, cap)) ||
            (st = get_vector(m, NAME(nm->ffn_norm), m->hidden, true, &L->ffn_norm, err, cap)) ||
            (st = get_vector(m, NAME(nm->bq), qd, false, &L->bq, err, cap)) ||
            (st = get_vector(m, NAME(nm->bk), kvd, false, &L->bk, err, cap)) ||
            (st = get_vector(m, NAME(nm->bv), kvd, false, &L->bv, err, cap)))
            return st;
    }
#undef NAME
    if (m->tok && m->tok->n_vocab > m->vocab)
        return mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                        "tokenizer has %d tokens but the embedding only %d rows", m->tok->n_vocab,
                        m->vocab);
    return MI_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* GGUF                                                                                        */

static mi_status load_gguf(mi_model *m, const char *path, char *err, size_t cap) {
    mi_status st = mim_gguf_open(path, &m->gguf, err, cap);
    if (st != MI_STATUS_SUCCESS) return st;
    const mim_gguf *g = m->gguf;
    const char *arch;
    size_t arch_len;
    if (!mim_gguf_get_str(g, "general.architecture", &arch, &arch_len))
        return mim_fail(err, cap, MI_STATUS_PARSE_ERROR, "GGUF has no general.architecture");
    if (arch_len >= sizeof(m->info.arch)) arch_len = sizeof(m->info.arch) - 1;
    memcpy(m->info.arch, arch, arch_len);
    m->info.arch[arch_len] = 0;
    bool qwen2 = strcmp(m->info.arch, "qwen2") == 0;
    if (strcmp(m->info.arch, "llama") != 0 && !qwen2 && strcmp(m->info.arch, "mistral") != 0)
        return mim_fail(err, cap, MI_STATUS_UNSUPPORTED,
                        "architecture '%s' is not supported (llama, mistral, qwen2 are)",
                        m->info.arch);
    char key[128];
    int64_t v;
    double d;
#define KEY(suffix) (snprintf(key, sizeof(key), "%s.%s", m->info.arch, suffix), key)
#define REQ_INT(suffix, dst)                                                                       \
    do {                                                                                           \
        if (!mim_gguf_get_i64(g, KEY(suffix), &v) || v <= 0 || v > INT32_MAX)                      \
            return mim_fail(err, cap, MI_STATUS_PARSE_ERROR, "GGUF key %s missing or invalid",     \
                            key);                                                                  \
        dst = (int32_t)v;                                                                          \
    } while (0)
    REQ_INT("block_count", m->n_layers);
    REQ_INT("embedding_length", m->hidden);
    REQ_INT("feed_forward_length", m->ffn);
    REQ_INT("attention.head_count", m->n_heads);
    m->n_kv = m->n_heads;
    if (mim_gguf_get_i64(g, KEY("attention.head_count_kv"), &v) && v > 0 && v <= INT32_MAX)
        m->n_kv = (int32_t)v;
    m->hd = m->hidden / m->n_heads;
    if (mim_gguf_get_i64(g, KEY("attention.key_length"), &v) && v > 0 && v <= 4096)
        m->hd = (int32_t)v;
    m->eps = 1e-5f;
    if (mim_gguf_get_f64(g, KEY("attention.layer_norm_rms_epsilon"), &d)) m->eps = (float)d;
    m->rope.theta = 10000.0;
    if (mim_gguf_get_f64(g, KEY("rope.freq_base"), &d) && d > 0) m->rope.theta = d;
    m->rope.dim = m->hd;
    if (mim_gguf_get_i64(g, KEY("rope.dimension_count"), &v) && v > 0 && v <= 4096)
        m->rope.dim = (int32_t)v;
    m->info.context_length = 0;
    if (mim_gguf_get_i64(g, KEY("context_length"), &v)) m->info.context_length = v;
    /* Mistral v0.1's window; Qwen2 files may carry one that its models never enable */
    if (!qwen2 && mim_gguf_get_i64(g, KEY("attention.sliding_window"), &v) && v > 0)
        m->sliding_window = v;
    m->rope.neox = qwen2;
    const char *stype;
    size_t stype_len;
    mi_rope_scaling *sc = &m->rope.scaling;
    if (mim_gguf_get_str(g, KEY("rope.scaling.type"), &stype, &stype_len)) {
        if (stype_len == 6 && memcmp(stype, "linear", 6) == 0)
            sc->type = MI_ROPE_LINEAR;
        else if (stype_len == 4 && memcmp(stype, "yarn", 4) == 0)
            sc->type = MI_ROPE_YARN;
        else if (!(stype_len == 4 && memcmp(stype, "none", 4) == 0))
            return mim_fail(err, cap, MI_STATUS_UNSUPPORTED,
                            "rope scaling '%.*s' is not "
                            "supported",
                            (int)stype_len, stype);
    }
    if (mim_gguf_get_f64(g, KEY("rope.scaling.factor"), &d))
        sc->factor = d;
    else if (mim_gguf_get_f64(g, KEY("rope.scale_linear"), &d)) {
        sc->type = MI_ROPE_LINEAR;
        sc->factor = d;
    }
    if (mim_gguf_get_i64(g, KEY("rope.scaling.original_context_length"), &v))
        sc->original_context = v;
    if (mim_gguf_get_f64(g, KEY("rope.scaling.yarn_beta_fast"), &d)) sc->beta_fast = d;
    if (mim_gguf_get_f64(g, KEY("rope.scaling.yarn_beta_slow"), &d)) sc->beta_slow = d;
    if (mim_gguf_get_f64(g, KEY("rope.scaling.attn_factor"), &d)) sc->attention_factor = d;
    if (sc->type == MI_ROPE_LINEAR && !(sc->factor > 0)) sc->type = MI_ROPE_NONE;
#undef REQ_INT
#undef KEY
    if ((st = check_dims(m, err, cap))) return st;
    /* LLaMA-3.1's llama3 scaling is baked into per-frequency divisors. */
    float *ff = NULL;
    if ((st = get_vector(m, "rope_freqs.weight", m->rope.dim / 2, false, &ff, err, cap))) return st;
    if (ff) sc->type = MI_ROPE_LLAMA3; /* reported as such; applied through freq_factors */
    m->rope.freq_factors = ff;
    if ((st = mim_tokenizer_from_gguf(g, &m->tok, err, cap))) return st;
    const char *name;
    size_t name_len;
    m->smollm = mim_gguf_get_str(g, "general.basename", &name, &name_len) && name_len >= 6 &&
                strncmp(name, "smollm", 6) == 0;
    if (!m->smollm && mim_gguf_get_str(g, "general.name", &name, &name_len))
        m->smollm = name_len >= 6 && strncmp(name, "Smollm", 6) == 0;
    snprintf(m->info.source, sizeof(m->info.source), "gguf");
    return load_weights(m, &gguf_names, err, cap);
}

/* ------------------------------------------------------------------------------------------ */
/* Hugging Face directory                                                                      */

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1))) {
            if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
                free(buf);
                buf = NULL;
            } else {
                buf[n] = 0;
                *len = (size_t)n;
            }
        }
    }
    fclose(f);
    return buf;
}

static double jnum(json_t *o, const char *key, double dflt) {
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : dflt;
}

/* An integer field of config.json (a count or a length): a number in [0, max]. Outside it (or
 * not finite) *bad names the first such field, and dflt stands in; casting such a double to an
 * integer would be undefined. */
static int64_t jcount(json_t *o, const char *key, int64_t dflt, int64_t max, const char **bad) {
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v)) return dflt;
    const double x = json_number_value(v);
    if (!(x >= 0.0 && x <= (double)max)) {
        if (!*bad) *bad = key;
        return dflt;
    }
    return (int64_t)x;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static mi_status open_shards(mi_model *m, const char *dir, char *err, size_t cap) {
    char path[4096];
    char **files = NULL;
    int n = 0;
    mi_status st = MI_STATUS_SUCCESS;
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    size_t len;
    char *idx = read_file(path, &len);
    if (idx) {
        json_error_t jerr;
        json_t *root = json_loadb(idx, len, 0, &jerr);
        free(idx);
        json_t *map = json_object_get(root, "weight_map");
        if (!json_is_object(map)) {
            json_decref(root);
            return mim_fail(err, cap, MI_STATUS_PARSE_ERROR, "%s: no weight_map", path);
        }
        files = calloc(json_object_size(map) + 1, sizeof(char *));
        if (!files) {
            json_decref(root);
            return mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory");
        }
        const char *key;
        json_t *val;
        /* the shard names seen so far, as a hash set (a pairwise check was quadratic in the
         * tensors: a 3 MB index took a minute) */
        json_t *seen = json_object();
        if (!seen) st = mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory");
        json_object_foreach(map, key, val) {
            if (st != MI_STATUS_SUCCESS) break;
            const char *f = json_string_value(val);
            if (!f || strchr(f, '/')) {
                st = mim_fail(err, cap, MI_STATUS_PARSE_ERROR, "%s: bad shard name for '%s'", path,
                              key);
                break;
            }
            if (json_object_get(seen, f)) continue;
            if (json_object_set_new(seen, f, json_true()) != 0 || !(files[n++] = strdup(f))) {
                st = mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory");
                break;
            }
        }
        json_decref(seen);
        json_decref(root);
    } else {
        DIR *dp = opendir(dir);
        if (!dp) return mim_fail(err, cap, MI_STATUS_IO_ERROR, "cannot open directory %s", dir);
        struct dirent *de;
        int capf = 0;
        while ((de = readdir(dp))) {
            size_t l = strlen(de->d_name);
            if (l > 12 && strcmp(de->d_name + l - 12, ".safetensors") == 0) {
                if (n == capf) {
                    capf = capf ? capf * 2 : 8;
                    char **p = realloc(files, (size_t)capf * sizeof(char *));
                    if (!p) break;
                    files = p;
                }
                if (!(files[n] = strdup(de->d_name))) break;
                n++;
            }
        }
        closedir(dp);
    }
    if (st == MI_STATUS_SUCCESS && n == 0)
        st = mim_fail(err, cap, MI_STATUS_IO_ERROR, "no .safetensors files in %s", dir);
    if (st == MI_STATUS_SUCCESS) {
        qsort(files, (size_t)n, sizeof(char *), cmp_str);
        m->shards = calloc((size_t)n, sizeof(mim_st_file));
        if (!m->shards) st = mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    for (int i = 0; i < n && st == MI_STATUS_SUCCESS; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
        st = mim_st_open(path, &m->shards[i], err, cap);
        if (st == MI_STATUS_SUCCESS) m->n_shards = i + 1;
    }
    for (int i = 0; i < n; i++) free(files[i]);
    free(files);
    return st;
}

/* One special-token id of config.json, checked against the tokenizer's n_tok tokens. */
static mi_status config_token_id(const json_t *v, const char *field, int32_t n_tok, int32_t *out,
                                 char *err, size_t cap) {
    const json_int_t id = json_integer_value(v);
    if (id < 0 || id >= n_tok)
        return mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                        "config.json: %s %lld is outside the tokenizer's %d tokens", field,
                        (long long)id, (int)n_tok);
    *out = (int32_t)id;
    return MI_STATUS_SUCCESS;
}

static mi_status load_hf(mi_model *m, const char *dir, char *err, size_t cap) {
    char path[4096];
    size_t len;
    snprintf(path, sizeof(path), "%s/config.json", dir);
    char *text = read_file(path, &len);
    if (!text) return mim_fail(err, cap, MI_STATUS_IO_ERROR, "cannot read %s", path);
    json_error_t jerr;
    json_t *cfg = json_loadb(text, len, 0, &jerr);
    free(text);
    if (!json_is_object(cfg)) {
        json_decref(cfg);
        return mim_fail(err, cap, MI_STATUS_PARSE_ERROR, "%s: %s (line %d)", path, jerr.text,
                        jerr.line);
    }
    mi_status st = MI_STATUS_SUCCESS;
    const char *mt = json_string_value(json_object_get(cfg, "model_type"));
    if (!mt || (strcmp(mt, "llama") && strcmp(mt, "mistral") && strcmp(mt, "qwen2"))) {
        st =
            mim_fail(err, cap, MI_STATUS_UNSUPPORTED,
                     "model_type '%s' is not supported (llama, mistral, qwen2 are)", mt ? mt : "?");
        goto done;
    }
    snprintf(m->info.arch, sizeof(m->info.arch), "%s", mt);
    const char *bad = NULL; /* the first integer field out of range */
    m->n_layers = (int32_t)jcount(cfg, "num_hidden_layers", 0, INT32_MAX, &bad);
    m->hidden = (int32_t)jcount(cfg, "hidden_size", 0, INT32_MAX, &bad);
    m->ffn = (int32_t)jcount(cfg, "intermediate_size", 0, INT32_MAX, &bad);
    m->n_heads = (int32_t)jcount(cfg, "num_attention_heads", 0, INT32_MAX, &bad);
    m->n_kv = (int32_t)jcount(cfg, "num_key_value_heads", m->n_heads, INT32_MAX, &bad);
    m->hd = m->n_heads > 0 ? m->hidden / m->n_heads : 0;
    if (json_is_integer(json_object_get(cfg, "head_dim")))
        m->hd = (int32_t)jcount(cfg, "head_dim", m->hd, INT32_MAX, &bad);
    m->vocab = (int32_t)jcount(cfg, "vocab_size", 0, INT32_MAX, &bad);
    m->eps = (float)jnum(cfg, "rms_norm_eps", 1e-6);
    m->rope.theta = jnum(cfg, "rope_theta", 10000.0);
    m->rope.dim = m->hd;
    m->rope.neox = true;
    m->info.context_length = jcount(cfg, "max_position_embeddings", 0, INT64_MAX / 4, &bad);
    /* Mistral v0.1: "sliding_window": 4096 (null in later versions). Qwen2 configs carry a
     * window too, active only with "use_sliding_window": true. */
    if (json_is_integer(json_object_get(cfg, "sliding_window")) &&
        (strcmp(mt, "qwen2") != 0 || json_is_true(json_object_get(cfg, "use_sliding_window"))))
        m->sliding_window = jcount(cfg, "sliding_window", 0, INT64_MAX / 4, &bad);
    /* transformers >= 5 writes "rope_parameters" (theta inside it) instead of "rope_scaling" */
    json_t *rs = json_object_get(cfg, "rope_scaling");
    json_t *rp = json_object_get(cfg, "rope_parameters");
    if (json_is_object(rp)) {
        m->rope.theta = jnum(rp, "rope_theta", m->rope.theta);
        if (!json_is_object(rs)) rs = rp;
    }
    mi_rope_scaling *sc = &m->rope.scaling;
    if (json_is_object(rs)) {
        const char *t = json_string_value(json_object_get(rs, "rope_type"));
        if (!t) t = json_string_value(json_object_get(rs, "type"));
        if (!t || strcmp(t, "default") == 0)
            sc->type = MI_ROPE_NONE;
        else if (strcmp(t, "linear") == 0)
            sc->type = MI_ROPE_LINEAR;
        else if (strcmp(t, "dynamic") == 0)
            sc->type = MI_ROPE_DYNAMIC;
        else if (strcmp(t, "llama3") == 0)
            sc->type = MI_ROPE_LLAMA3;
        else if (strcmp(t, "yarn") == 0)
            sc->type = MI_ROPE_YARN;
        else {
            st = mim_fail(err, cap, MI_STATUS_UNSUPPORTED,
                          "rope_scaling type '%s' is not "
                          "supported",
                          t);
            goto done;
        }
        sc->factor = jnum(rs, "factor", 1.0);
        sc->original_context = jcount(rs, "original_max_position_embeddings",
                                      m->info.context_length, INT64_MAX / 4, &bad);
        sc->low_freq_factor = jnum(rs, "low_freq_factor", 1.0);
        sc->high_freq_factor = jnum(rs, "high_freq_factor", 4.0);
        sc->beta_fast = jnum(rs, "beta_fast", 32.0);
        sc->beta_slow = jnum(rs, "beta_slow", 1.0);
        sc->attention_factor = jnum(rs, "attention_factor", 0.0);
    }
    if (bad) {
        st = mim_fail(err, cap, MI_STATUS_PARSE_ERROR, "%s: %s is not a count this model can have",
                      path, bad);
        goto done;
    }
    if ((st = check_dims(m, err, cap))) goto done;
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    text = read_file(path, &len);
    if (!text) {
        st = mim_fail(err, cap, MI_STATUS_IO_ERROR, "cannot read %s", path);
        goto done;
    }
    st = mim_tokenizer_from_json(text, len, &m->tok, err, cap);
    free(text);
    if (st != MI_STATUS_SUCCESS) goto done;
    /* config.json's special ids must name tokens of the tokenizer: an id outside it would be
     * emitted by tokenize (BOS) or never match (EOS), so the load is refused instead. */
    const int32_t n_tok = m->tok->n_vocab;
    json_t *bos = json_object_get(cfg, "bos_token_id"), *eos = json_object_get(cfg, "eos_token_id");
    int32_t id = -1;
    if (json_is_integer(bos) && m->tok->bos < 0) {
        if ((st = config_token_id(bos, "bos_token_id", n_tok, &id, err, cap))) goto done;
        m->tok->bos = id;
    }
    if (json_is_integer(eos)) {
        if ((st = config_token_id(eos, "eos_token_id", n_tok, &id, err, cap))) goto done;
        m->tok->eos = id;
    }
    if (json_is_array(eos)) {
        size_t i;
        json_t *e;
        json_array_foreach(eos, i, e) {
            if (!json_is_integer(e)) continue;
            if ((st = config_token_id(e, "eos_token_id", n_tok, &id, err, cap))) goto done;
            if (i == 0)
                m->tok->eos = id;
            else if (m->n_extra_eog < 8)
                m->extra_eog[m->n_extra_eog++] = id;
        }
    }
    m->smollm = mim_tokenizer_find(m->tok, "<|im_start|>") >= 0 &&
                mim_tokenizer_find(m->tok, "<jupyter_script>") >= 0;
    if ((st = open_shards(m, dir, err, cap))) goto done;
    snprintf(m->info.source, sizeof(m->info.source), "safetensors");
    st = load_weights(m, &hf_names, err, cap);
done:
    json_decref(cfg);
    return st;
}

/* ------------------------------------------------------------------------------------------ */

/* Fills a fresh model from its source (file, directory or random weights). */
typedef mi_status (*model_source_fn)(mi_model *m, const void *arg, char *err, size_t err_size);

typedef struct path_source {
    const char *path;
    bool is_dir;
} path_source;

static mi_status load_path(mi_model *m, const void *arg, char *err, size_t err_size) {
    const path_source *ps = arg;
    return ps->is_dir ? load_hf(m, ps->path, err, err_size) : load_gguf(m, ps->path, err, err_size);
}

typedef struct random_source {
    const mi_model_shape *shape;
    uint64_t seed;
} random_source;

static mi_status load_random(mi_model *m, const void *arg, char *err, size_t err_size) {
    const random_source *rs = arg;
    return mim_random_weights(m, rs->shape, rs->seed, err, err_size);
}

static mi_status create_model(const mi_model_params *params, model_source_fn source,
                              const void *arg, mi_model **out, char *err, size_t err_size);

static mi_status load_model(const char *path, const mi_model_params *params, mi_model **out,
                            char *err, size_t err_size) {
    if (!out) return mim_fail(err, err_size, MI_STATUS_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    if (!path) return mim_fail(err, err_size, MI_STATUS_INVALID_ARGUMENT, "path is NULL");
    struct stat sb;
    if (stat(path, &sb) != 0)
        return mim_fail(err, err_size, MI_STATUS_IO_ERROR, "cannot open %s: %s", path,
                        strerror(errno));
    path_source ps = {path, S_ISDIR(sb.st_mode)};
    return create_model(params, load_path, &ps, out, err, err_size);
}

/* The loaders write their messages into a buffer (no model exists yet); the caller's context
 * gets it on failure. */
mi_status mi_model_load(mi_context *ctx, const char *path, const mi_model_params *params,
                        mi_model **out) {
    char err[MIM_ERROR_CAPACITY] = "";
    mi_status st = load_model(path, params, out, err, sizeof err);
    return st == MI_STATUS_SUCCESS ? st : mi_context_set_error(ctx, st, err[0] ? err : NULL);
}

mi_status mi_model_create_random(mi_context *ctx, const mi_model_shape *shape, uint64_t seed,
                                 const mi_model_params *params, mi_model **out) {
    char err[MIM_ERROR_CAPACITY] = "";
    mi_status st;
    if (out) *out = NULL;
    if (!out) {
        st = mim_fail(err, sizeof err, MI_STATUS_INVALID_ARGUMENT, "out is NULL");
    } else if (!shape) {
        st = mim_fail(err, sizeof err, MI_STATUS_INVALID_ARGUMENT, "shape is NULL");
    } else {
        const random_source rs = {shape, seed};
        st = create_model(params, load_random, &rs, out, err, sizeof err);
    }
    return st == MI_STATUS_SUCCESS ? st : mi_context_set_error(ctx, st, err[0] ? err : NULL);
}

static mi_status create_model(const mi_model_params *params, model_source_fn source,
                              const void *arg, mi_model **out, char *err, size_t err_size) {
    mi_model_params p = params ? *params : mi_model_default_params();
    if (p.device != MI_DEVICE_CPU && p.device != MI_DEVICE_CUDA)
        return mim_fail(err, err_size, MI_STATUS_INVALID_ARGUMENT, "unknown device %d",
                        (int)p.device);
    if (p.device_id < 0)
        return mim_fail(err, err_size, MI_STATUS_INVALID_ARGUMENT, "device_id %d is negative",
                        p.device_id);
    if (p.n_threads > MI_MAX_THREADS)
        return mim_fail(err, err_size, MI_STATUS_INVALID_ARGUMENT,
                        "n_threads %d is more than MI_MAX_THREADS (%d)", p.n_threads,
                        MI_MAX_THREADS);
    if (p.mlp_chunk <= 0) p.mlp_chunk = 4096;
    mi_model *m = calloc(1, sizeof(*m));
    if (!m) return mim_fail(err, err_size, MI_STATUS_OUT_OF_MEMORY, "out of memory");
    m->params = p;
    m->pattern = -1; /* the config */
    m->dense_below = -1;
    /* The context decides the thread count; the pool gets it before the source runs, since the
     * random source fills its weights with the pool. */
    mi_context_params cp = mi_context_default_params();
    cp.device = MI_DEVICE_CPU;
    cp.n_threads = p.n_threads;
    mi_status st = mi_context_create(&cp, &m->ctx);
    if (st != MI_STATUS_SUCCESS) {
        mim_fail(err, err_size, st, "cannot create the attention context: %s",
                 mi_status_string(st));
    } else {
        int nt = mi_context_n_threads(m->ctx);
        if (nt <= 0) {
            long c = sysconf(_SC_NPROCESSORS_ONLN);
            nt = c > 0 ? (int)c : 1;
        }
        m->params.n_threads = nt;
        openblas_set_num_threads(1); /* see mim_pool_run: threads come from OpenMP */
        m->pool = mim_pool_create(nt);
        st = m->pool ? source(m, arg, err, err_size)
                     : mim_fail(err, err_size, MI_STATUS_OUT_OF_MEMORY, "cannot start threads");
    }
    if (st == MI_STATUS_SUCCESS && p.device == MI_DEVICE_CUDA)
        st = mim_gpu_attach(m, err, err_size);
    if (st != MI_STATUS_SUCCESS) {
        mi_model_destroy(m);
        return st;
    }
    mi_model_info *info = &m->info;
    info->n_layers = m->n_layers;
    info->n_heads = m->n_heads;
    info->n_kv_heads = m->n_kv;
    info->head_dim = m->hd;
    info->hidden = m->hidden;
    info->ffn = m->ffn;
    info->vocab = m->vocab;
    info->rope_theta = m->rope.theta;
    info->rms_eps = m->eps;
    info->rope_scaling = m->rope.scaling;
    info->bos = m->tok->bos;
    info->eos = m->tok->eos;
    info->eot = m->tok->eot;
    info->sliding_window = m->sliding_window;
    *out = m;
    return MI_STATUS_SUCCESS;
}

void mi_model_destroy(mi_model *m) {
    if (!m) return;
    mi_session_destroy(m->own_session);
    mim_gpu_detach(m);
    mim_static_free(m);
    mi_kv_pool_destroy(m->kv_pool); /* its memory goes with the last session */
    mim_pool_destroy(m->pool);
    mi_context_destroy(m->ctx);
    if (m->k_cache)
        for (int l = 0; l < m->n_layers; l++) {
            free(m->k_cache[l]);
            free(m->v_cache[l]);
        }
    free(m->k_cache);
    free(m->v_cache);
    free(m->wscratch);
    free(m->layers);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    mim_tokenizer_free(m->tok);
    mim_gguf_close(m->gguf);
    for (int i = 0; i < m->n_shards; i++) mim_st_close(&m->shards[i], true);
    free(m->shards);
    free(m);
}

const char *mi_model_last_error(const mi_model *m) { return m ? m->last_error : ""; }

mi_status mi_model_get_info(const mi_model *m, mi_model_info *info) {
    if (!m || !info) return MI_STATUS_INVALID_ARGUMENT;
    *info = m->info;
    return MI_STATUS_SUCCESS;
}
