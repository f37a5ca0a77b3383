/*
 * cuda_backend.cu: context hooks and the whole-layer prefill on CUDA.
 *
 * A layer runs in at most five launches whatever the head mix: VS estimation (two score passes +
 * selection) over the VS heads, index conversion, block-sparse estimation over the block-sparse
 * heads, then ONE attention launch in which every CTA reads its head's mode (dense, A-/Tri-shape,
 * sparse) from the kernel parameters. What each head runs comes from the plan built in core
 * (src/core/prefill_plan.c) with this device's crossovers: sequences shorter than a head's
 * dense_below run dense and skip the estimation.
 */
#include "cuda_common.cuh"
#include "dense_fallback.h"
#include "pattern_table.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" mi_status mi_cuda_check_launch(mi_context *ctx, const char *what) {
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return mi_fail(ctx, MI_STATUS_DEVICE_ERROR, "%s: %s", what, cudaGetErrorString(e));
    return MI_STATUS_SUCCESS;
}

/* An attribute of the current device, 0 when it cannot be read. */
static int current_device_attribute(cudaDeviceAttr attr) {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    if (cudaDeviceGetAttribute(&n, attr, dev) != cudaSuccess) return 0;
    return n;
}

extern "C" int mi_cuda_sm_count(void) {
    return current_device_attribute(cudaDevAttrMultiProcessorCount);
}

extern "C" int mi_cuda_smem_per_block(void) {
    return current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
}

extern "C" mi_status mi_cuda_context_init(mi_context *ctx) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return mi_fail(ctx, MI_STATUS_DEVICE_ERROR, "no CUDA device: %s",
                       e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    if (ctx->params.device_id < 0 || ctx->params.device_id >= n)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "CUDA device %d out of range (0..%d)",
                       ctx->params.device_id, n - 1);
    e = cudaSetDevice(ctx->params.device_id);
    if (e != cudaSuccess)
        return mi_fail(ctx, MI_STATUS_DEVICE_ERROR, "cudaSetDevice(%d): %s", ctx->params.device_id,
                       cudaGetErrorString(e));
    /* Calls without a workspace take scratch from the device's default stream-ordered pool.
     * With its default release threshold (0) the pool hands memory back at every synchronize
     * and the next call maps it again (milliseconds); keep it instead. */
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, ctx->params.device_id) == cudaSuccess) {
        uint64_t keep = UINT64_MAX;
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    }
    cudaGetLastError();
    return MI_STATUS_SUCCESS;
}

extern "C" void mi_cuda_context_release(mi_context *ctx) {
    /* the stream belongs to the caller */
    (void)ctx;
}

extern "C" mi_status mi_cuda_synchronize(mi_context *ctx) {
    cudaError_t e = cudaStreamSynchronize(mi_stream(ctx));
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e != cudaSuccess)
        return mi_fail(ctx, MI_STATUS_DEVICE_ERROR, "CUDA: %s", cudaGetErrorString(e));
    return MI_STATUS_SUCCESS;
}

extern "C" int mi_cuda_devices(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" const char *mi_cuda_features(void) {
#ifdef MI_CUDA_FEATURES
    return "cuda(" MI_CUDA_FEATURES ")";
#else
    return "cuda";
#endif
}

/* ------------------------------------------------------------------------------------------ */
/* Prefill                                                                                     */

namespace {

struct prefill_layout {
    int64_t R;
    int32_t max_v, max_s, max_blocks, max_cols;
    bool any_vs, any_bs, any_xa, any_fx;
    size_t off_vs, off_sp, off_scratch, total;
    size_t scratch_bytes;
};

size_t al(size_t x) { return (x + 255) & ~(size_t)255; }

/* The call's plan (src/core/prefill_plan.c) under this device's crossovers (dense_fallback.h). */
void plan_heads(const mi_context *ctx, const mi_attn_shape *s, const int32_t *seq_lens,
                const mi_head_pattern *patterns, const mi_prefill_params *pp, mi_head_plan *heads,
                mi_prefill_plan *plan) {
    const int sm90 = mi_cuda_sm90_on(ctx->tuning);
    mi_prefill_plan_build(s, seq_lens, patterns, pp, mi_cuda_dense_below_rule, &sm90, heads, plan);
}

/* Index and scratch memory for the plan's estimates: one index of the largest budgets. */
void layout_prefill(const mi_context *ctx, const mi_attn_shape *s, const mi_prefill_plan *plan,
                    prefill_layout *lo) {
    memset(lo, 0, sizeof(*lo));
    const int64_t L = s->len, B = s->batch, H = s->heads_q;
    lo->R = (L + 63) / 64;
    lo->any_vs = plan->pairs[MI_PLAN_ESTIMATE_VS] > 0;
    lo->any_bs = plan->pairs[MI_PLAN_ESTIMATE_BLOCK] > 0;
    lo->any_xa = plan->pairs[MI_PLAN_ESTIMATE_XATTN] > 0;
    lo->any_fx = plan->pairs[MI_PLAN_ESTIMATE_FLEX] > 0;
    lo->max_v = plan->max_vertical;
    lo->max_s = plan->max_slash;
    int32_t max_topk = 0;
    for (int64_t h = 0; h < H; ++h) {
        if (plan->head[h].estimate != MI_PLAN_ESTIMATE_BLOCK) continue;
        const int32_t t = (int32_t)(plan->head[h].top_k < lo->R ? plan->head[h].top_k : lo->R);
        if (t > max_topk) max_topk = t;
    }
    lo->max_blocks = lo->any_vs ? lo->max_s + 1 : 0;
    if (max_topk > lo->max_blocks) lo->max_blocks = max_topk;
    /* a threshold may keep any number of blocks */
    if (lo->any_xa || lo->any_fx) lo->max_blocks = (int32_t)lo->R;
    if (lo->max_blocks < 1) lo->max_blocks = 1;
    lo->max_cols = lo->max_v > 0 ? lo->max_v : 1;
    size_t off = 0;
    lo->off_vs = off;
    if (lo->any_vs) off += al(mi_vs_index_bytes((int32_t)B, (int32_t)H, lo->max_v, lo->max_s));
    lo->off_sp = off;
    if (lo->any_vs || lo->any_bs || lo->any_xa || lo->any_fx)
        off += al(mi_sparse_index_bytes((int32_t)B, (int32_t)H, (int32_t)lo->R, lo->max_blocks,
                                        lo->max_cols));
    lo->off_scratch = off;
    size_t sc = 0;
    if (lo->any_vs) sc = mi_cuda_vs_scratch_bytes(B, H, L);
    if (lo->any_bs) {
        const size_t b2 = mi_cuda_bs_scratch_bytes(ctx, B, H, s->heads_kv, L, s->head_dim);
        if (b2 > sc) sc = b2;
    }
    if (lo->any_xa) {
        const size_t x = mi_cuda_xattn_scratch_bytes(plan->pairs[MI_PLAN_ESTIMATE_XATTN], L);
        if (x > sc) sc = x;
    }
    if (lo->any_fx) {
        const size_t x = mi_cuda_flex_scratch_bytes(B, H, s->heads_kv, L, s->head_dim);
        if (x > sc) sc = x;
    }
    lo->scratch_bytes = sc;
    lo->total = off + al(sc) + 256;
}

/* The attention kernel's mode of a head from its plan. */
mi_cuda_head_mode head_mode_of_plan(const mi_head_plan &hp) {
    mi_cuda_head_mode m;
    memset(&m, 0, sizeof(m));
    switch (hp.kernel) {
    case MI_PLAN_KERNEL_WINDOW:
        m.mode = MI_CUDA_MODE_A_SHAPE;
        m.n_init = hp.n_init;
        m.n_local = hp.n_local;
        m.n_last = hp.n_last;
        break;
    case MI_PLAN_KERNEL_INDEX: m.mode = MI_CUDA_MODE_SPARSE; break;
    case MI_PLAN_KERNEL_ROWMASK: m.mode = MI_CUDA_MODE_NONE; break; /* rowmask.cu's rows */
    case MI_PLAN_KERNEL_INFLLM: /* refused before (cuda_refused) */
    case MI_PLAN_KERNEL_DENSE: m.mode = MI_CUDA_MODE_DENSE; break;
    }
    m.dense_below = hp.dense_below;
    return m;
}

/* The plan steps this backend has no kernel for (InfLLM's chunked retrieval):
 * MI_STATUS_UNSUPPORTED naming the first such head's pattern, when it would run sparse
 * (only_if_sparse: as the plan's any_sparse_run says), never a wrong result. */
mi_status cuda_refused(mi_context *ctx, const mi_prefill_plan &plan, bool only_if_sparse) {
    for (int64_t h = 0; h < plan.heads; ++h) {
        const mi_head_plan &hp = plan.head[h];
        const bool missing = hp.kernel == MI_PLAN_KERNEL_INFLLM;
        if (missing && (!only_if_sparse || plan.any_sparse_run))
            return mi_fail(ctx, MI_STATUS_UNSUPPORTED,
                           "pattern \"%s\" (head %lld) has no CUDA kernel yet: run it with the "
                           "CPU backend",
                           mi_pattern_name(hp.type), (long long)h);
    }
    return MI_STATUS_SUCCESS;
}

} // namespace

extern "C" mi_status mi_cuda_prefill_workspace_size(mi_context *ctx, const mi_attn_shape *s,
                                                    const mi_head_pattern *patterns,
                                                    const mi_prefill_params *params,
                                                    size_t *bytes) {
    /* The layout needs the budgets only, not the crossovers: no rule. */
    mi_head_plan *heads = (mi_head_plan *)malloc((size_t)s->heads_q * sizeof(mi_head_plan));
    if (heads == nullptr) return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "prefill: out of memory");
    mi_prefill_plan plan;
    mi_prefill_plan_build(s, nullptr, patterns, params, nullptr, nullptr, heads, &plan);
    const mi_status refused = cuda_refused(ctx, plan, false);
    prefill_layout lo;
    layout_prefill(ctx, s, &plan, &lo);
    free(heads);
    *bytes = lo.total;
    return refused;
}

extern "C" mi_status mi_cuda_prefill_attention(mi_context *ctx, const mi_attn_shape *s,
                                               const mi_tensor *q, const mi_tensor *k,
                                               const mi_tensor *v, const int32_t *seq_lens,
                                               const mi_head_pattern *patterns,
                                               const mi_prefill_params *params, mi_tensor *out,
                                               float *lse, void *workspace, size_t workspace_size) {
    const float scale = mi_resolve_scale(params->softmax_scale, s->head_dim);
    mi_cuda_attn_params p;
    mi_status st = mi_cuda_fill_attn_params(ctx, s, q, k, v, out, seq_lens, scale, lse, &p);
    if (st != MI_STATUS_SUCCESS) return st;
    /* Each head's kernel, estimate and the length from which it runs sparse, and each
     * estimate's (dense_fallback.h); p.seq_lens holds every sequence's length. */
    const int32_t B = (int32_t)s->batch, H = (int32_t)s->heads_q;
    mi_head_plan heads[MI_CUDA_MAX_HEADS];
    mi_prefill_plan plan;
    plan_heads(ctx, s, p.seq_lens, patterns, params, heads, &plan);
    if ((st = cuda_refused(ctx, plan, true)) != MI_STATUS_SUCCESS) return st;
    prefill_layout lo;
    layout_prefill(ctx, s, &plan, &lo);
    cudaStream_t stream = mi_stream(ctx);
    if (!plan.any_sparse_run) { /* one dense launch, no workspace */
        p.mode.mode = MI_CUDA_MODE_DENSE;
        return mi_cuda_attn_run(ctx, &p, 128);
    }

    void *ws = workspace;
    bool owned = false;
    if (ws == nullptr) {
        cudaError_t e = cudaMallocAsync(&ws, lo.total, stream);
        if (e != cudaSuccess)
            return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "CUDA prefill workspace (%zu bytes): %s",
                           lo.total, cudaGetErrorString(e));
        owned = true;
    } else if (workspace_size < lo.total) {
        return mi_fail(ctx, MI_STATUS_WORKSPACE_TOO_SMALL,
                       "prefill workspace is %zu bytes, needs %zu", workspace_size, lo.total);
    }
    char *base =
        reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(ws) + 255) & ~(uintptr_t)255);

    mi_vs_index vsi;
    mi_sparse_index spi;
    memset(&vsi, 0, sizeof(vsi));
    memset(&spi, 0, sizeof(spi));
    if (lo.any_vs)
        st = mi_vs_index_init(&vsi, B, H, lo.max_v, lo.max_s, base + lo.off_vs,
                              mi_vs_index_bytes(B, H, lo.max_v, lo.max_s));
    if (st == MI_STATUS_SUCCESS && (lo.any_vs || lo.any_bs || lo.any_xa || lo.any_fx))
        st = mi_sparse_index_init(
            &spi, B, H, (int32_t)lo.R, lo.max_blocks, lo.max_cols, base + lo.off_sp,
            mi_sparse_index_bytes(B, H, (int32_t)lo.R, lo.max_blocks, lo.max_cols));
    void *scratch = base + lo.off_scratch;

    uint8_t act_vs[MI_CUDA_MAX_HEADS], act_bs[MI_CUDA_MAX_HEADS], act_xa[MI_CUDA_MAX_HEADS],
        act_fx[MI_CUDA_MAX_HEADS];
    int32_t vsz[MI_CUDA_MAX_HEADS], ssz[MI_CUDA_MAX_HEADS], topk[MI_CUDA_MAX_HEADS];
    int32_t xstride[MI_CUDA_MAX_HEADS], xthr[MI_CUDA_MAX_HEADS], ftau[MI_CUDA_MAX_HEADS];
    for (int32_t h = 0; h < H; ++h) {
        const mi_head_pattern *hp = &patterns[h];
        act_vs[h] = heads[h].estimate == MI_PLAN_ESTIMATE_VS;
        act_bs[h] = heads[h].estimate == MI_PLAN_ESTIMATE_BLOCK;
        act_xa[h] = heads[h].estimate == MI_PLAN_ESTIMATE_XATTN;
        act_fx[h] = heads[h].estimate == MI_PLAN_ESTIMATE_FLEX;
        xstride[h] = heads[h].stride;
        xthr[h] = heads[h].threshold; /* XAttention's tau, FlexPrefill's gamma */
        ftau[h] = heads[h].tau;
        vsz[h] = hp->vertical_size; /* the estimates apply the minimums themselves */
        ssz[h] = hp->slash_size;
        topk[h] = heads[h].top_k;
        p.head_modes[h] = head_mode_of_plan(heads[h]);
    }
    p.use_head_modes = 1;

    const int32_t vs_from = plan.estimate_from[MI_PLAN_ESTIMATE_VS];
    const int32_t bs_from = plan.estimate_from[MI_PLAN_ESTIMATE_BLOCK];
    if (st == MI_STATUS_SUCCESS && lo.any_vs)
        st = mi_cuda_vs_estimate_run(ctx, s, q, k, seq_lens, vsz, ssz, &params->vs, scale, act_vs,
                                     vs_from, scratch, &vsi);
    if (st == MI_STATUS_SUCCESS && lo.any_vs)
        st = mi_cuda_vs_index_run(ctx, s->len, s->q_off, seq_lens, &vsi, 1, act_vs, vs_from, &spi);
    if (st == MI_STATUS_SUCCESS && lo.any_bs)
        st = mi_cuda_bs_estimate_run(ctx, s, q, k, seq_lens, topk, act_bs, bs_from, scratch, &spi);
    if (st == MI_STATUS_SUCCESS && lo.any_xa)
        st = mi_cuda_xattn_estimate_run(ctx, s, q, k, seq_lens, xstride, xthr, scale, act_xa,
                                        plan.estimate_from[MI_PLAN_ESTIMATE_XATTN], scratch,
                                        lo.scratch_bytes, &spi);
    if (st == MI_STATUS_SUCCESS && lo.any_fx)
        st = mi_cuda_flex_estimate_run(ctx, s, q, k, seq_lens, xthr, ftau, scale, act_fx,
                                       plan.estimate_from[MI_PLAN_ESTIMATE_FLEX], scratch,
                                       lo.scratch_bytes, &spi);
    if (st == MI_STATUS_SUCCESS) {
        mi_cuda_attn_use_index(&p, &spi);
        st = mi_cuda_attn_run(ctx, &p, 64);
    }
    bool any_rowmask = false;
    for (int32_t h = 0; h < H; ++h) any_rowmask |= heads[h].kernel == MI_PLAN_KERNEL_ROWMASK;
    if (st == MI_STATUS_SUCCESS && any_rowmask)
        st = mi_cuda_rowmask_run(ctx, s, q, k, v, seq_lens, heads, scale, out, lse);
    if (owned) cudaFreeAsync(ws, stream);
    return st;
}
