/*
 * vs_static.c: MInference w/ static (the original's attn_type "static",
 * docs/prefill-methods.md). Each query head's vertical-slash sets are estimated on the first
 * input and kept; every input then runs index conversion and the sparse kernel only. Built on
 * the public calls (mi_vs_estimate, mi_vs_build_index, mi_attention_sparse), so its result on a
 * later input is, by construction, the explicit-index kernel's result under the kept sets.
 */
#include "atomic_file.h"
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mi_vs_static {
    int32_t heads;
    int32_t *vertical_size, *slash_size; /* [heads] */
    mi_vs_params params;
    int32_t estimates;
    void *buf;        /* the kept sets (batch 1), NULL before the first estimate */
    mi_vs_index sets; /* over buf */
};

static const char magic[8] = {'M', 'I', 'V', 'S', 'S', 'T', 'A', '1'};

mi_status mi_vs_static_create(mi_context *ctx, int32_t heads, const int32_t *vertical_size,
                              const int32_t *slash_size, const mi_vs_params *params,
                              mi_vs_static **out) {
    if (!out) return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "static: out is NULL");
    *out = NULL;
    if (heads <= 0) return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "static: %d heads", heads);
    if (!vertical_size || !slash_size)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "static: budgets are NULL");
    for (int32_t h = 0; h < heads; h++)
        if (vertical_size[h] < 0 || slash_size[h] < 0)
            return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "static: head %d has a negative budget",
                           h);
    mi_vs_static *st = calloc(1, sizeof *st);
    if (st) {
        st->vertical_size = malloc((size_t)heads * sizeof(int32_t));
        st->slash_size = malloc((size_t)heads * sizeof(int32_t));
    }
    if (!st || !st->vertical_size || !st->slash_size) {
        mi_vs_static_destroy(st);
        return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "static: out of memory");
    }
    st->heads = heads;
    memcpy(st->vertical_size, vertical_size, (size_t)heads * sizeof(int32_t));
    memcpy(st->slash_size, slash_size, (size_t)heads * sizeof(int32_t));
    if (params) {
        st->params = *params;
    } else {
        /* the original's static estimate forces 30 diagonals, not the dynamic one's 100 */
        st->params = mi_vs_default_params();
        st->params.forced_diagonals = 30;
    }
    *out = st;
    return MI_STATUS_SUCCESS;
}

void mi_vs_static_destroy(mi_vs_static *st) {
    if (!st) return;
    free(st->vertical_size);
    free(st->slash_size);
    free(st->buf);
    free(st);
}

void mi_vs_static_reset(mi_vs_static *st) {
    if (!st) return;
    free(st->buf);
    st->buf = NULL;
    st->estimates = 0;
}

int32_t mi_vs_static_estimates(const mi_vs_static *st) { return st ? st->estimates : 0; }

mi_status mi_vs_static_sets(const mi_vs_static *st, mi_vs_index *view) {
    if (!st || !view || !st->buf) return MI_STATUS_INVALID_ARGUMENT;
    *view = st->sets;
    return MI_STATUS_SUCCESS;
}

static int32_t clamp_budget(int32_t size, int32_t minimum, int64_t len) {
    int64_t n = size > minimum ? size : minimum;
    if (n > len) n = len;
    return n < 0 ? 0 : (int32_t)n;
}

/* Takes buf (batch 1 sets of capacities mv / ms) as the kept sets. */
static void keep_sets(mi_vs_static *st, void *buf, int32_t mv, int32_t ms) {
    free(st->buf);
    st->buf = buf;
    mi_vs_index_init(&st->sets, 1, st->heads, mv, ms, buf, mi_vs_index_bytes(1, st->heads, mv, ms));
}

/* A batch-B copy of the kept sets (every sequence gets them) in a new buffer. */
static void *replicate(const mi_vs_static *st, int32_t B, mi_vs_index *x) {
    const int32_t H = st->heads, mv = st->sets.max_vertical, ms = st->sets.max_slash;
    const size_t bytes = mi_vs_index_bytes(B, H, mv, ms);
    void *buf = malloc(bytes);
    if (!buf) return NULL;
    mi_vs_index_init(x, B, H, mv, ms, buf, bytes);
    for (int32_t b = 0; b < B; b++) {
        memcpy(x->vertical_count + b * H, st->sets.vertical_count, (size_t)H * 4);
        memcpy(x->slash_count + b * H, st->sets.slash_count, (size_t)H * 4);
        memcpy(x->vertical_idx + (size_t)b * H * mv, st->sets.vertical_idx, (size_t)H * mv * 4);
        memcpy(x->slash_idx + (size_t)b * H * ms, st->sets.slash_idx, (size_t)H * ms * 4);
    }
    return buf;
}

static mi_status estimate(mi_context *ctx, mi_vs_static *st, const mi_tensor *q, const mi_tensor *k,
                          float scale) {
    const int64_t B = q->shape[0], L = q->shape[2];
    int32_t mv = 0, ms = 0;
    for (int32_t h = 0; h < st->heads; h++) {
        const int32_t v = clamp_budget(st->vertical_size[h], st->params.min_vertical, L);
        const int32_t s = clamp_budget(st->slash_size[h], st->params.min_slash, L);
        mv = v > mv ? v : mv;
        ms = s > ms ? s : ms;
    }
    const size_t bytes = mi_vs_index_bytes((int32_t)B, st->heads, mv, ms);
    void *all = malloc(bytes);
    void *one = malloc(mi_vs_index_bytes(1, st->heads, mv, ms));
    if (!all || !one) {
        free(all), free(one);
        return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "static: out of memory");
    }
    mi_vs_index x;
    mi_vs_index_init(&x, (int32_t)B, st->heads, mv, ms, all, bytes);
    const mi_status s =
        mi_vs_estimate(ctx, q, k, NULL, st->vertical_size, st->slash_size, &st->params, scale, &x);
    if (s != MI_STATUS_SUCCESS) {
        free(all), free(one);
        return s;
    }
    /* sequence 0's sets are the head's */
    keep_sets(st, one, mv, ms);
    const int32_t H = st->heads;
    memcpy(st->sets.vertical_count, x.vertical_count, (size_t)H * 4);
    memcpy(st->sets.slash_count, x.slash_count, (size_t)H * 4);
    memcpy(st->sets.vertical_idx, x.vertical_idx, (size_t)H * mv * 4);
    memcpy(st->sets.slash_idx, x.slash_idx, (size_t)H * ms * 4);
    free(all);
    st->estimates++;
    return MI_STATUS_SUCCESS;
}

mi_status mi_vs_static_attention(mi_context *ctx, mi_vs_static *st, const mi_tensor *q,
                                 const mi_tensor *k, const mi_tensor *v, float scale,
                                 mi_tensor *out, float *lse) {
    if (!ctx) return MI_STATUS_INVALID_ARGUMENT;
    if (!st || !q || !k || !v || !out)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "static: NULL argument");
    if (mi_context_device(ctx) != MI_DEVICE_CPU)
        return mi_fail(ctx, MI_STATUS_UNSUPPORTED,
                       "static: the kept sets live in host memory; run it with the CPU backend");
    if (q->shape[1] != st->heads)
        return mi_fail(ctx, MI_STATUS_SHAPE_MISMATCH, "static: q has %lld heads, the object %d",
                       (long long)q->shape[1], st->heads);
    if (q->shape[0] <= 0 || q->shape[0] > INT32_MAX || q->shape[2] <= 0 || q->shape[2] > INT32_MAX)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "static: bad q shape");
    if (!st->buf) {
        const mi_status s = estimate(ctx, st, q, k, scale);
        if (s != MI_STATUS_SUCCESS) return s;
    }
    const int64_t B = q->shape[0], L = q->shape[2], R = (L + MI_BLOCK_SIZE - 1) / MI_BLOCK_SIZE;
    mi_vs_index x;
    void *vbuf = replicate(st, (int32_t)B, &x);
    const int32_t maxb = st->sets.max_slash + 1, maxc = st->sets.max_vertical;
    const size_t ibytes =
        mi_sparse_index_bytes((int32_t)B, st->heads, (int32_t)R, maxb, maxc > 0 ? maxc : 1);
    void *ibuf = ibytes ? malloc(ibytes) : NULL;
    mi_status s = MI_STATUS_SUCCESS;
    if (!vbuf || !ibuf) s = mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "static: out of memory");
    mi_sparse_index idx;
    if (s == MI_STATUS_SUCCESS)
        s = mi_sparse_index_init(&idx, (int32_t)B, st->heads, (int32_t)R, maxb, maxc > 0 ? maxc : 1,
                                 ibuf, ibytes);
    if (s == MI_STATUS_SUCCESS) s = mi_vs_build_index(ctx, L, NULL, &x, &idx);
    if (s == MI_STATUS_SUCCESS) s = mi_attention_sparse(ctx, q, k, v, NULL, &idx, scale, out, lse);
    free(vbuf);
    free(ibuf);
    return s;
}

mi_status mi_vs_static_save(mi_context *ctx, const mi_vs_static *st, const char *path) {
    if (!st || !path) return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "static: NULL argument");
    if (!st->buf)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "static: no sets yet (run an input first)");
    const int32_t head[3] = {st->heads, st->sets.max_vertical, st->sets.max_slash};
    const size_t body = mi_vs_index_bytes(1, st->heads, head[1], head[2]);
    const size_t n = sizeof magic + sizeof head + body;
    char *data = malloc(n);
    if (!data) return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "static: out of memory");
    memcpy(data, magic, sizeof magic);
    memcpy(data + sizeof magic, head, sizeof head);
    memcpy(data + sizeof magic + sizeof head, st->buf, body);
    const int err = mi_atomic_write(path, data, n, 0644);
    free(data);
    if (err) return mi_fail(ctx, MI_STATUS_IO_ERROR, "static: cannot write %s", path);
    return MI_STATUS_SUCCESS;
}

mi_status mi_vs_static_load(mi_context *ctx, mi_vs_static *st, const char *path) {
    if (!st || !path) return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "static: NULL argument");
    FILE *f = fopen(path, "rb");
    if (!f) return mi_fail(ctx, MI_STATUS_IO_ERROR, "static: cannot open %s", path);
    char m[sizeof magic];
    int32_t head[3];
    mi_status s = MI_STATUS_SUCCESS;
    if (fread(m, 1, sizeof m, f) != sizeof m || memcmp(m, magic, sizeof m) != 0 ||
        fread(head, sizeof head, 1, f) != 1)
        s = mi_fail(ctx, MI_STATUS_PARSE_ERROR, "static: %s is not a static sets file", path);
    else if (head[0] != st->heads)
        s = mi_fail(ctx, MI_STATUS_SHAPE_MISMATCH, "static: %s has %d heads, the object %d", path,
                    head[0], st->heads);
    else if (head[1] < 0 || head[2] < 0 || head[1] > (1 << 28) || head[2] > (1 << 28))
        s = mi_fail(ctx, MI_STATUS_PARSE_ERROR, "static: %s has bad capacities", path);
    void *buf = NULL;
    if (s == MI_STATUS_SUCCESS) {
        const size_t body = mi_vs_index_bytes(1, st->heads, head[1], head[2]);
        buf = body ? malloc(body) : NULL;
        if (!buf) {
            s = mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "static: out of memory");
        } else if (fread(buf, 1, body, f) != body || fgetc(f) != EOF) {
            s = mi_fail(ctx, MI_STATUS_PARSE_ERROR, "static: %s is truncated or too long", path);
        } else {
            /* counts within the capacities, entries non-negative */
            mi_vs_index x;
            mi_vs_index_init(&x, 1, st->heads, head[1], head[2], buf, body);
            for (int32_t h = 0; h < st->heads && s == MI_STATUS_SUCCESS; h++) {
                bool ok = x.vertical_count[h] >= 0 && x.vertical_count[h] <= head[1] &&
                          x.slash_count[h] >= 0 && x.slash_count[h] <= head[2];
                for (int32_t i = 0; ok && i < x.vertical_count[h]; i++)
                    ok = x.vertical_idx[(size_t)h * head[1] + i] >= 0;
                for (int32_t i = 0; ok && i < x.slash_count[h]; i++)
                    ok = x.slash_idx[(size_t)h * head[2] + i] >= 0;
                if (!ok)
                    s = mi_fail(ctx, MI_STATUS_PARSE_ERROR, "static: %s: head %d is malformed",
                                path, h);
            }
        }
    }
    fclose(f);
    if (s != MI_STATUS_SUCCESS) {
        free(buf);
        return s;
    }
    keep_sets(st, buf, head[1], head[2]);
    return MI_STATUS_SUCCESS;
}
