/*
 * model_sample.c: next-token sampling (mi_sampler): temperature with optional top-k and top-p.
 *
 * Deterministic for a seed: candidates are ordered by logit (ties by token id) before the draw,
 * and the draw comes from a splitmix64 stream, so the CLI, Python and any embedder get the same
 * text from the same seed.
 */
#include "model_internal.h"

#include <math.h>
#include <stdlib.h>

typedef struct mim_cand {
    float logit;
    int32_t id;
} mim_cand;

struct mi_sampler {
    double temperature, top_p;
    int32_t top_k, vocab;
    uint64_t state;
    mim_cand *cands; /* [vocab] */
    double *weights; /* [vocab] */
};

mi_status mi_sampler_create(double temperature, int32_t top_k, double top_p, uint64_t seed,
                            int32_t vocab, mi_sampler **out) {
    if (!out) return MI_STATUS_INVALID_ARGUMENT;
    *out = NULL;
    if (!(temperature >= 0.0 && isfinite(temperature)) || top_k < 0 ||
        !(top_p > 0.0 && top_p <= 1.0) || vocab <= 0)
        return MI_STATUS_INVALID_ARGUMENT;
    mi_sampler *s = calloc(1, sizeof(*s));
    if (!s) return MI_STATUS_OUT_OF_MEMORY;
    s->temperature = temperature;
    s->top_p = top_p;
    s->top_k = top_k;
    s->vocab = vocab;
    s->state = seed;
    if (temperature > 0.0) {
        s->cands = malloc((size_t)vocab * sizeof(*s->cands));
        s->weights = malloc((size_t)vocab * sizeof(*s->weights));
        if (!s->cands || !s->weights) {
            mi_sampler_destroy(s);
            return MI_STATUS_OUT_OF_MEMORY;
        }
    }
    *out = s;
    return MI_STATUS_SUCCESS;
}

void mi_sampler_destroy(mi_sampler *s) {
    if (!s) return;
    free(s->cands);
    free(s->weights);
    free(s);
}

static int cand_cmp(const void *a, const void *b) {
    const mim_cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* splitmix64 to a double in [0, 1) */
static double uniform(mi_sampler *s) {
    uint64_t z = (s->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

int32_t mi_sampler_sample(mi_sampler *s, const float *logits, int32_t n) {
    if (!s || !logits || n <= 0 || n > s->vocab) return -1;
    /* NaN or +inf logits mean the forward pass broke down: no token is a right answer. */
    for (int32_t i = 0; i < n; i++)
        if (isnan(logits[i]) || logits[i] == INFINITY) return -1;
    if (s->temperature <= 0.0) return mi_argmax(logits, n);
    for (int32_t i = 0; i < n; i++) s->cands[i] = (mim_cand){logits[i], i};
    qsort(s->cands, (size_t)n, sizeof(*s->cands), cand_cmp);
    int32_t keep = n;
    if (s->top_k > 0 && s->top_k < keep) keep = s->top_k;
    /* weights relative to the best logit, so exp never overflows; summed in order */
    const double best = s->cands[0].logit;
    double total = 0.0;
    for (int32_t i = 0; i < keep; i++) {
        s->weights[i] = exp((s->cands[i].logit - best) / s->temperature);
        total += s->weights[i];
    }
    if (s->top_p < 1.0) {
        double acc = 0.0;
        for (int32_t i = 0; i < keep; i++) {
            acc += s->weights[i];
            if (acc >= s->top_p * total) {
                keep = i + 1;
                total = acc;
                break;
            }
        }
    }
    double u = uniform(s) * total;
    for (int32_t i = 0; i < keep; i++) {
        u -= s->weights[i];
        if (u <= 0.0) return s->cands[i].id;
    }
    return s->cands[keep - 1].id;
}
