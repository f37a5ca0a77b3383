/*
 * model_rope.c: rotary position embedding frequencies (plain, linear, dynamic NTK, llama3,
 * YaRN) following Hugging Face transformers' rope initialisation, and their application.
 *
 * Numerics: transformers forms position * inv_freq in fp32 and takes cos/sin of that fp32 value;
 * we do the same so that long positions round the same way (at position 1e5 the fp32 argument is
 * off by ~6e-3 rad from the exact one, identically in both).
 */
#include "model_internal.h"

#include <math.h>
#include <string.h>

#define MIM_PI 3.14159265358979323846

static double yarn_mscale(double scale) { return scale <= 1.0 ? 1.0 : 0.1 * log(scale) + 1.0; }

static double yarn_correction_dim(double rotations, int32_t dim, double base, double max_pos) {
    return (dim * log(max_pos / (rotations * 2.0 * MIM_PI))) / (2.0 * log(base));
}

void mim_rope_freqs(const mim_rope *r, int64_t seq_len, float *inv_freq, float *mscale) {
    const int32_t half = r->dim / 2;
    const mi_rope_scaling *sc = &r->scaling;
    double base = r->theta;
    *mscale = 1.0f;
    if (sc->type == MI_ROPE_DYNAMIC && sc->factor > 0 && sc->original_context > 0) {
        double len = (double)(seq_len > sc->original_context ? seq_len : sc->original_context);
        base = base * pow(sc->factor * len / (double)sc->original_context - (sc->factor - 1.0),
                          (double)r->dim / (double)(r->dim - 2));
    }
    for (int32_t i = 0; i < half; i++) {
        /* fp32 exponent as transformers computes it: arange(0, dim, 2).float() / dim */
        float e = (float)(2 * i) / (float)r->dim;
        inv_freq[i] = (float)(1.0 / pow(base, (double)e));
    }
    switch (sc->type) {
    case MI_ROPE_LINEAR:
        if (sc->factor > 0)
            for (int32_t i = 0; i < half; i++) inv_freq[i] = (float)(inv_freq[i] / sc->factor);
        break;
    case MI_ROPE_LLAMA3: {
        double old = (double)sc->original_context, f = sc->factor;
        double lo = sc->low_freq_factor, hi = sc->high_freq_factor;
        if (old <= 0 || f <= 0 || hi == lo) break;
        double low_wavelen = old / lo, high_wavelen = old / hi;
        for (int32_t i = 0; i < half; i++) {
            double inv = inv_freq[i], wavelen = 2.0 * MIM_PI / inv;
            if (wavelen < high_wavelen) continue;
            if (wavelen > low_wavelen) {
                inv_freq[i] = (float)(inv / f);
            } else {
                double smooth = (old / wavelen - lo) / (hi - lo);
                inv_freq[i] = (float)((1.0 - smooth) * inv / f + smooth * inv);
            }
        }
        break;
    }
    case MI_ROPE_YARN: {
        double f = sc->factor > 0 ? sc->factor : 1.0;
        double orig = sc->original_context > 0 ? (double)sc->original_context : 4096.0;
        double bf = sc->beta_fast > 0 ? sc->beta_fast : 32.0;
        double bs = sc->beta_slow > 0 ? sc->beta_slow : 1.0;
        double low = floor(yarn_correction_dim(bf, r->dim, base, orig));
        double high = ceil(yarn_correction_dim(bs, r->dim, base, orig));
        if (low < 0) low = 0;
        if (high > r->dim - 1) high = r->dim - 1;
        if (low == high) high += 0.001;
        for (int32_t i = 0; i < half; i++) {
            double ramp = ((double)i - low) / (high - low);
            ramp = ramp < 0 ? 0 : (ramp > 1 ? 1 : ramp);
            double extrap = 1.0 - ramp; /* weight of the unscaled frequency */
            double inv = inv_freq[i];
            inv_freq[i] = (float)(inv / f * (1.0 - extrap) + inv * extrap);
        }
        *mscale = (float)(sc->attention_factor > 0 ? sc->attention_factor : yarn_mscale(f));
        break;
    }
    default: break;
    }
    if (r->freq_factors)
        for (int32_t i = 0; i < half; i++) inv_freq[i] /= r->freq_factors[i];
}

void mim_rope_table(const float *inv_freq, float mscale, int32_t dim, int64_t pos0, int64_t n,
                    float *cos_t, float *sin_t) {
    const int32_t half = dim / 2;
    for (int64_t p = 0; p < n; p++) {
        float pos = (float)(pos0 + p);
        for (int32_t i = 0; i < half; i++) {
            float arg = pos * inv_freq[i];
            cos_t[p * half + i] = (float)cos((double)arg) * mscale;
            sin_t[p * half + i] = (float)sin((double)arg) * mscale;
        }
    }
}

void mim_rope_apply(const mim_rope *r, float *x, int64_t n, int64_t n_heads, int64_t hd,
                    int64_t row_stride, const float *cos_t, const float *sin_t) {
    const int32_t half = r->dim / 2;
    for (int64_t p = 0; p < n; p++) {
        const float *c = cos_t + p * half, *s = sin_t + p * half;
        for (int64_t h = 0; h < n_heads; h++) {
            float *v = x + p * row_stride + h * hd;
            if (r->neox) {
                for (int32_t i = 0; i < half; i++) {
                    float a = v[i], b = v[i + half];
                    v[i] = a * c[i] - b * s[i];
                    v[i + half] = b * c[i] + a * s[i];
                }
            } else {
                for (int32_t i = 0; i < half; i++) {
                    float a = v[2 * i], b = v[2 * i + 1];
                    v[2 * i] = a * c[i] - b * s[i];
                    v[2 * i + 1] = b * c[i] + a * s[i];
                }
            }
        }
    }
}

mi_status mi_rope_frequencies(int32_t dim, double theta, const mi_rope_scaling *scaling,
                              int64_t seq_len, float *inv_freq, float *mscale) {
    if (dim <= 0 || dim % 2 != 0 || !(theta > 0) || !inv_freq || !mscale || seq_len < 0)
        return MI_STATUS_INVALID_ARGUMENT;
    mim_rope r;
    memset(&r, 0, sizeof(r));
    r.dim = dim;
    r.theta = theta;
    if (scaling) {
        if ((int)scaling->type < MI_ROPE_NONE || scaling->type > MI_ROPE_YARN)
            return MI_STATUS_INVALID_ARGUMENT;
        r.scaling = *scaling;
    }
    mim_rope_freqs(&r, seq_len, inv_freq, mscale);
    return MI_STATUS_SUCCESS;
}
