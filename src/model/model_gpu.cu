/*
 * model_gpu.cu: the llama-family forward pass on one CUDA GPU.
 *
 * Same layer as model_forward.c, with the data on the device:
 *   weights bf16 (q/k/v concatenated into one matrix, gate/up into another, so each is one
 *   cuBLAS GEMM), norms and biases fp32; the residual stream x is fp32; GEMM inputs are bf16
 *   and accumulate in fp32 (cublasGemmEx, CUBLAS_COMPUTE_32F); the output and down projections
 *   add into x with beta = 1, so no separate residual add runs.
 *   The KV cache is bf16 [position][n_kv * hd] per layer, the [B, L, H, D] layout that
 *   mi_tensor_blhd describes, so prefill attention reads it in place.
 *   Sessions keep their rows in host pages; the device cache mirrors the pages of whichever
 *   session ran last (see "Sessions" below).
 *   A fresh prompt goes through mi_prefill_attention (our CUDA kernels) with the layer's
 *   per-head patterns; rows that continue a sequence use a split-K decode kernel over the cache.
 *   Norms, projections and the MLP run in chunks of mlp_chunk rows, so the [n, ffn]
 *   intermediates never exist for the whole prompt; the LM head runs for the last position.
 *
 * Host weights are expanded to fp32 one slice at a time (every format the CPU path reads), then
 * converted to bf16 on the device: load needs no full fp32 copy of any matrix.
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "../kv/kv_method.h"
#include "minference_cuda.h"
#include "model_gpu.h"
}
#include "model_gpu_pages.h"
#include "model_gpu_quest.h"

typedef __nv_bfloat16 bf16;

namespace {

/* ------------------------------------------------------------------------------------------ */
/* State                                                                                       */

struct gpu_layer {
    bf16 *wqkv;  /* [qd + 2 kvd, hidden] */
    bf16 *wo;    /* [hidden, qd] */
    bf16 *wgu;   /* [2 ffn, hidden] */
    bf16 *wd;    /* [hidden, ffn] */
    float *bqkv; /* [qd + 2 kvd] or NULL */
    float *attn_norm, *ffn_norm;
};

/* What rows i*P.. of the device cache hold, per layer: rows of page `id` at `version`
 * (mi_kv_page_view), or nothing (id -1). */
struct page_slot {
    int32_t id, rows;
    uint64_t version;
};

/* Start/stop event pairs of one category, recorded during a prefill and summed after it. */
struct event_log {
    cudaEvent_t *ev;
    int used, cap;
};

struct gpu_state {
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    gpu_layer *layers;
    bf16 *embd;   /* [vocab, hidden] */
    bf16 *output; /* LM head [vocab, hidden]; == embd when tied */
    float *out_norm;
    /* [n_layers][cache_cap * kvd]; with kv_offload every layer's entry is one shared buffer */
    bf16 **k_cache, **v_cache;
    int64_t cache_cap;
    /* per-prompt buffers, grown on demand */
    int64_t rows_cap;  /* x, q, att, rope */
    float *x;          /* [rows, hidden] */
    bf16 *q, *att;     /* [rows, qd] */
    float2 *rope;      /* [rows, rope_dim / 2] (cos, sin) * mscale */
    int32_t *tokens;   /* [rows] */
    int64_t chunk_cap; /* h, qkv, gu, act */
    bf16 *h;           /* [chunk, max(hidden, qd)] */
    float *qkv;        /* [chunk, qd + 2 kvd] */
    float *gu;         /* [chunk, 2 ffn] */
    bf16 *act;         /* [chunk, ffn] */
    float *logits;     /* [head_rows, vocab] */
    int64_t head_rows_cap;
    double *log_probs; /* [head_rows] */
    float *inv_freq;   /* [rope_dim / 2] */
    float *dec_part;   /* decode partials */
    size_t dec_part_bytes;
    void *workspace; /* mi_prefill_attention */
    size_t workspace_bytes;
    size_t bytes, peak; /* device memory held by this model */
    /* sessions: the pages the device cache mirrors, and a pinned host buffer for the copies */
    page_slot *slots; /* [n_layers][slot_cap] */
    int64_t slot_cap;
    int32_t slot_tokens;         /* rows per page (the session pool's) */
    const mi_kv_pool *slot_pool; /* the pool whose page ids the slots name */
    void *stage;                 /* pinned: two halves, each K then V of stage_rows rows */
    size_t stage_bytes;
    /* uploads decoded on the device (model_gpu_pages.h): one job per page, pinned on the host
     * and mirrored on the device; pages_read marks the last upload done reading the pages */
    mim_page_job *jobs_host, *jobs_dev;
    int64_t jobs_cap;
    cudaEvent_t pages_read;
    int pageable_slabs; /* slabs the pinned allocator had to take from pageable memory */
    /* Quest's one-token calls over pinned pages, on the device (model_gpu_quest.h) */
    mim_quest_dev *quest;
    size_t quest_bytes; /* of g->bytes, held by quest */
    /* a session's new rows go to the host on their own stream, overlapped with the layer's
     * attention and MLP: kv_ready marks the layer's K/V written, chunk_done each stage half */
    cudaStream_t copy;
    cudaEvent_t kv_ready, chunk_done[2];
    event_log attn_ev, gemm_ev;
    bool timing;
};

#define GPU(m) ((gpu_state *)(m)->gpu)

void slots_drop_from(mi_model *m, int64_t row); /* Sessions, below */

/* Elements per host slice when expanding weights: 64 MiB of fp32. */
const int64_t STAGE_FLOATS = 16 << 20;
/* Rows per LM-head GEMM for token log-probabilities. */
const int64_t HEAD_ROWS = 512;
/* Keys per block of the decode kernel. */
const int DEC_SPLIT = 1024;
/* Bound on the decode partials; more rows than fit run in several launches. */
const size_t DEC_PART_MAX = (size_t)256 << 20;

mi_status cuda_fail(mi_model *m, cudaError_t e, const char *what) {
    return mim_model_fail(
        m, e == cudaErrorMemoryAllocation ? MI_STATUS_OUT_OF_MEMORY : MI_STATUS_DEVICE_ERROR,
        "%s: %s", what, cudaGetErrorString(e));
}

template <typename T> cudaError_t dev_alloc(gpu_state *g, T **p, size_t count) {
    *p = NULL;
    if (count == 0) return cudaSuccess;
    cudaError_t e = cudaMalloc((void **)p, count * sizeof(T));
    if (e == cudaSuccess) {
        g->bytes += count * sizeof(T);
        if (g->bytes > g->peak) g->peak = g->bytes;
    } else {
        *p = NULL;
        (void)cudaGetLastError(); /* an allocation failure is not sticky: clear it */
    }
    return e;
}

template <typename T> void dev_free(gpu_state *g, T **p, size_t count) {
    if (*p) {
        cudaFree(*p);
        g->bytes -= count * sizeof(T);
    }
    *p = NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Kernels                                                                                     */

__global__ void f32_to_bf16_kernel(const float *src, bf16 *dst, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16(src[i]);
}

__global__ void embed_kernel(const int32_t *tokens, const bf16 *embd, float *x, int64_t dim) {
    const int64_t row = blockIdx.x;
    const bf16 *e = embd + (int64_t)tokens[row] * dim;
    for (int64_t k = threadIdx.x; k < dim; k += blockDim.x)
        x[row * dim + k] = __bfloat162float(e[k]);
}

/* out [n, dim] = RMSNorm(x) * w as bf16; one block of 256 threads per row. */
__global__ void rmsnorm_kernel(const float *x, const float *w, bf16 *out, int64_t dim, float eps) {
    __shared__ float part[32];
    const float *xr = x + blockIdx.x * dim;
    float ss = 0.0f;
    for (int64_t k = threadIdx.x; k < dim; k += blockDim.x) ss += xr[k] * xr[k];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        ss = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (threadIdx.x == 0) part[0] = ss;
    }
    __syncthreads();
    const float r = (float)(1.0 / sqrt((double)part[0] / (double)dim + (double)eps));
    for (int64_t k = threadIdx.x; k < dim; k += blockDim.x)
        out[blockIdx.x * dim + k] = __float2bfloat16(xr[k] * r * w[k]);
}

/* (cos, sin) * mscale for positions pos0.. as the CPU table computes them: the angle is the
 * float product (as transformers does), its cosine is taken in double. */
__global__ void rope_table_kernel(const float *inv_freq, float mscale, int half, int64_t pos0,
                                  int64_t n, float2 *cs) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n * half;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t p = i / half;
        const int f = (int)(i % half);
        const float arg = __fmul_rn((float)(pos0 + p), inv_freq[f]);
        cs[i] = make_float2((float)cos((double)arg) * mscale, (float)sin((double)arg) * mscale);
    }
}

/* From the fused q/k/v GEMM output of a chunk of rows: adds the biases, rotates q and k, and
 * writes q (bf16, rows of the prompt) and k/v (bf16, cache rows). One block per row. */
__global__ void qkv_finish_kernel(const float *qkv, const float *bias, const float2 *rope, bf16 *q,
                                  bf16 *kc, bf16 *vc, int n_heads, int n_kv, int hd, int rope_dim,
                                  int neox) {
    const int64_t row = blockIdx.x;
    const int qd = n_heads * hd, kvd = n_kv * hd, width = qd + 2 * kvd, half = rope_dim / 2;
    const float *src = qkv + row * width;
    const float2 *cs = rope + row * half;
    /* q and k: one thread per rotated pair, or per unrotated element past rope_dim */
    const int per_head = half + (hd - rope_dim);
    for (int t = threadIdx.x; t < (n_heads + n_kv) * per_head; t += blockDim.x) {
        const int head = t / per_head, i = t % per_head;
        const bool is_q = head < n_heads;
        const int col0 = is_q ? head * hd : qd + (head - n_heads) * hd;
        bf16 *dst = is_q ? q + row * qd + head * hd : kc + row * kvd + (head - n_heads) * hd;
        auto val = [&](int d) { return src[col0 + d] + (bias ? bias[col0 + d] : 0.0f); };
        if (i < half) {
            const int ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
            const float a = val(ia), b = val(ib), c = cs[i].x, s = cs[i].y;
            dst[ia] = __float2bfloat16(a * c - b * s);
            dst[ib] = __float2bfloat16(b * c + a * s);
        } else {
            const int d = rope_dim + (i - half);
            dst[d] = __float2bfloat16(val(d));
        }
    }
    for (int d = threadIdx.x; d < kvd; d += blockDim.x) {
        const int col = qd + kvd + d;
        vc[row * kvd + d] = __float2bfloat16(src[col] + (bias ? bias[col] : 0.0f));
    }
}

/* act [n, ffn] = silu(gate) * up from gu [n, 2 ffn] = [gate | up]. */
__global__ void silu_mul_kernel(const float *gu, bf16 *act, int64_t n, int64_t ffn) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n * ffn;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / ffn, c = i % ffn;
        const float g = gu[r * 2 * ffn + c], u = gu[r * 2 * ffn + ffn + c];
        act[i] = __float2bfloat16(g / (1.0f + expf(-g)) * u);
    }
}

/* Split-K attention of rows that continue a sequence (decode, follow-up turns): row r sits at
 * position pos0 + r and attends to cache keys [lo, pos0 + r] (lo > 0 under a sliding window).
 * Block (split, head, row) covers DEC_SPLIT keys with 4 warps, one key per warp at a time and
 * hd / 32 dims per lane, and writes its partial (max, sum, acc[hd]); dec_combine merges them. */
template <int HD>
__global__ void __launch_bounds__(128)
    dec_partial_kernel(const bf16 *q, const bf16 *kc, const bf16 *vc, float *part, int64_t pos0,
                       int n_heads, int n_kv, int64_t window, float scale, int n_splits) {
    constexpr int E = HD / 32;
    const int split = blockIdx.x, head = blockIdx.y, row = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t qd = (int64_t)n_heads * HD, kvd = (int64_t)n_kv * HD;
    const int64_t hi = pos0 + row + 1;
    const int64_t lo = window > 0 && hi > window ? hi - window : 0;
    const int64_t k0 = lo + (int64_t)split * DEC_SPLIT;
    const int64_t k1 = k0 + DEC_SPLIT < hi ? k0 + DEC_SPLIT : hi;
    const int kvh = head / (n_heads / n_kv);
    float qv[E], acc[E];
    const bf16 *qr = q + row * qd + (int64_t)head * HD + lane * E;
#pragma unroll
    for (int e = 0; e < E; e++) {
        qv[e] = __bfloat162float(qr[e]) * scale;
        acc[e] = 0.0f;
    }
    float mx = -INFINITY, sum = 0.0f;
    for (int64_t key = k0 + warp; key < k1; key += 4) {
        const bf16 *kr = kc + key * kvd + (int64_t)kvh * HD + lane * E;
        float s = 0.0f;
#pragma unroll
        for (int e = 0; e < E; e++) s += qv[e] * __bfloat162float(kr[e]);
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        const float m2 = fmaxf(mx, s), corr = expf(mx - m2), p = expf(s - m2);
        const bf16 *vr = vc + key * kvd + (int64_t)kvh * HD + lane * E;
#pragma unroll
        for (int e = 0; e < E; e++) acc[e] = acc[e] * corr + p * __bfloat162float(vr[e]);
        sum = sum * corr + p;
        mx = m2;
    }
    __shared__ float s_m[4], s_l[4], s_acc[4][HD];
    if (lane == 0) {
        s_m[warp] = mx;
        s_l[warp] = sum;
    }
#pragma unroll
    for (int e = 0; e < E; e++) s_acc[warp][lane * E + e] = acc[e];
    __syncthreads();
    const int64_t slot = ((int64_t)row * n_heads + head) * n_splits + split;
    float *out = part + slot * (HD + 2);
    float M = -INFINITY;
    for (int w = 0; w < 4; w++) M = fmaxf(M, s_m[w]);
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        float a = 0.0f;
        for (int w = 0; w < 4; w++)
            if (s_m[w] > -INFINITY) a += s_acc[w][d] * expf(s_m[w] - M);
        out[2 + d] = a;
    }
    if (threadIdx.x == 0) {
        float l = 0.0f;
        for (int w = 0; w < 4; w++)
            if (s_m[w] > -INFINITY) l += s_l[w] * expf(s_m[w] - M);
        out[0] = M;
        out[1] = l;
    }
}

__global__ void dec_combine_kernel(const float *part, bf16 *att, int n_heads, int hd,
                                   int n_splits) {
    const int head = blockIdx.x, row = blockIdx.y;
    const float *p = part + ((int64_t)row * n_heads + head) * n_splits * (hd + 2);
    float M = -INFINITY;
    for (int s = 0; s < n_splits; s++) M = fmaxf(M, p[s * (hd + 2)]);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.0f, l = 0.0f;
        for (int s = 0; s < n_splits; s++) {
            const float *ps = p + s * (hd + 2);
            if (ps[0] == -INFINITY) continue;
            const float w = expf(ps[0] - M);
            a += ps[2 + d] * w;
            l += ps[1] * w;
        }
        att[((int64_t)row * n_heads + head) * hd + d] = __float2bfloat16(l > 0.0f ? a / l : 0.0f);
    }
}

/* out[r] = log softmax(logits[r])[next[r]], in double like the CPU harness. */
__global__ void log_prob_kernel(const float *logits, const int32_t *next, double *out,
                                int64_t vocab) {
    __shared__ float s_max[32];
    __shared__ double s_sum[32];
    const float *z = logits + blockIdx.x * vocab;
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) mx = fmaxf(mx, z[i]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((threadIdx.x & 31) == 0) s_max[threadIdx.x >> 5] = mx;
    __syncthreads();
    mx = -INFINITY;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) mx = fmaxf(mx, s_max[w]);
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) s += exp((double)(z[i] - mx));
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) s_sum[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) t += s_sum[w];
        out[blockIdx.x] = (double)(z[next[blockIdx.x]] - mx) - log(t);
    }
}

int grid_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (int)(b < 65535 * 8 ? (b > 0 ? b : 1) : 65535 * 8);
}

/* ------------------------------------------------------------------------------------------ */
/* GEMM and timing                                                                             */

void ev_mark(gpu_state *g, event_log *log) {
    if (!g->timing) return;
    if (log->used == log->cap) {
        int cap = log->cap ? log->cap * 2 : 256;
        cudaEvent_t *ev = (cudaEvent_t *)realloc(log->ev, (size_t)cap * sizeof(cudaEvent_t));
        if (!ev) return;
        for (int i = log->cap; i < cap; i++) cudaEventCreate(&ev[i]);
        log->ev = ev;
        log->cap = cap;
    }
    cudaEventRecord(log->ev[log->used++], g->stream);
}

/* Sum of the (start, stop) pairs recorded since the last reset, in seconds; needs the stream
 * to have reached the last event. */
double ev_total(event_log *log) {
    double ms = 0.0;
    for (int i = 0; i + 1 < log->used; i += 2) {
        float t = 0.0f;
        if (cudaEventElapsedTime(&t, log->ev[i], log->ev[i + 1]) == cudaSuccess) ms += t;
    }
    return ms / 1e3;
}

void ev_free(event_log *log) {
    for (int i = 0; i < log->cap; i++) cudaEventDestroy(log->ev[i]);
    free(log->ev);
    memset(log, 0, sizeof(*log));
}

/* out [n, ldo] (columns 0..rows) = x [n, k] . W^T (+ out when accumulate); W [rows, k] bf16. */
cublasStatus_t gemm(gpu_state *g, const bf16 *x, int64_t n, int64_t k, const bf16 *w, int64_t rows,
                    float *out, int64_t ldo, bool accumulate) {
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    ev_mark(g, &g->gemm_ev);
    cublasStatus_t s =
        cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)n, (int)k, &alpha, w,
                     CUDA_R_16BF, (int)k, x, CUDA_R_16BF, (int)k, &beta, out, CUDA_R_32F, (int)ldo,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    ev_mark(g, &g->gemm_ev);
    return s;
}

/* ------------------------------------------------------------------------------------------ */
/* Load                                                                                        */

/* dst rows [row0, row0 + w->rows) of a bf16 matrix = the host weight, through fp32 slices. */
mi_status upload_weight(mi_model *m, const mim_weight *w, bf16 *dst, float *host, float *stage,
                        int64_t stage_floats) {
    gpu_state *g = GPU(m);
    const int64_t step = stage_floats / w->cols > 0 ? stage_floats / w->cols : 1;
    for (int64_t r0 = 0; r0 < w->rows; r0 += step) {
        const int64_t nr = w->rows - r0 < step ? w->rows - r0 : step;
        mim_dequant_rows(m, w, r0, nr, host);
        cudaError_t e = cudaMemcpyAsync(stage, host, (size_t)(nr * w->cols) * sizeof(float),
                                        cudaMemcpyHostToDevice, g->stream);
        if (e != cudaSuccess) return cuda_fail(m, e, "weight upload");
        f32_to_bf16_kernel<<<grid_for(nr * w->cols, 256), 256, 0, g->stream>>>(
            stage, dst + r0 * w->cols, nr * w->cols);
        /* the host slice is reused next round */
        if ((e = cudaStreamSynchronize(g->stream)) != cudaSuccess)
            return cuda_fail(m, e, "weight conversion");
    }
    return MI_STATUS_SUCCESS;
}

mi_status upload_floats(mi_model *m, float **dst, const float *src, int64_t n) {
    gpu_state *g = GPU(m);
    cudaError_t e = dev_alloc(g, dst, (size_t)n);
    if (e == cudaSuccess)
        e = cudaMemcpy(*dst, src, (size_t)n * sizeof(float), cudaMemcpyHostToDevice);
    return e == cudaSuccess ? MI_STATUS_SUCCESS : cuda_fail(m, e, "upload");
}

mi_status attach(mi_model *m) {
    gpu_state *g = GPU(m);
    const int64_t D = m->hidden, qd = (int64_t)m->n_heads * m->hd, kvd = (int64_t)m->n_kv * m->hd;
    /* the device is current: mim_gpu_attach selected it */
    cudaError_t e = cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&g->copy, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&g->kv_ready, cudaEventDisableTiming);
    for (int i = 0; i < 2 && e == cudaSuccess; i++)
        e = cudaEventCreateWithFlags(&g->chunk_done[i], cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&g->pages_read, cudaEventDisableTiming);
    if (e != cudaSuccess) return cuda_fail(m, e, "stream");
    if (cublasCreate(&g->blas) != CUBLAS_STATUS_SUCCESS)
        return mim_model_fail(m, MI_STATUS_DEVICE_ERROR, "cannot create a cuBLAS handle");
    cublasSetStream(g->blas, g->stream);
    g->layers = (gpu_layer *)calloc((size_t)m->n_layers, sizeof(gpu_layer));
    if (!g->layers) return mim_model_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory");

    /* the staging slices: as large as the largest weight, up to STAGE_FLOATS (a small model's
     * load does not peak on a 64 MiB buffer it never fills) */
    int64_t stage_floats = (int64_t)m->vocab * D;
    for (int l = 0; l < m->n_layers; l++) {
        const mim_layer *L = &m->layers[l];
        const mim_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wg, &L->wu, &L->wd};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
            if (ws[i]->rows * ws[i]->cols > stage_floats) stage_floats = ws[i]->rows * ws[i]->cols;
    }
    if (stage_floats > STAGE_FLOATS) stage_floats = STAGE_FLOATS;
    float *host = (float *)malloc((size_t)stage_floats * sizeof(float)), *stage = NULL;
    mi_status st = MI_STATUS_SUCCESS;
    if (!host) return mim_model_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory");
    if ((e = dev_alloc(g, &stage, (size_t)stage_floats)) != cudaSuccess) {
        free(host);
        return cuda_fail(m, e, "staging buffer");
    }
#define TRY(expr)                                                                                  \
    do {                                                                                           \
        if ((st = (expr)) != MI_STATUS_SUCCESS) goto done;                                         \
    } while (0)
#define ALLOC(ptr, count)                                                                          \
    do {                                                                                           \
        if ((e = dev_alloc(g, &(ptr), (size_t)(count))) != cudaSuccess) {                          \
            st = cuda_fail(m, e, "out of device memory for the weights");                          \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)
    ALLOC(g->embd, (int64_t)m->vocab * D);
    TRY(upload_weight(m, &m->tok_embd, g->embd, host, stage, stage_floats));
    if (m->output.data == m->tok_embd.data && m->output.type == m->tok_embd.type) {
        g->output = g->embd;
    } else {
        ALLOC(g->output, (int64_t)m->vocab * D);
        TRY(upload_weight(m, &m->output, g->output, host, stage, stage_floats));
    }
    TRY(upload_floats(m, &g->out_norm, m->out_norm, D));
    for (int l = 0; l < m->n_layers; l++) {
        const mim_layer *L = &m->layers[l];
        gpu_layer *G = &g->layers[l];
        ALLOC(G->wqkv, (qd + 2 * kvd) * D);
        TRY(upload_weight(m, &L->wq, G->wqkv, host, stage, stage_floats));
        TRY(upload_weight(m, &L->wk, G->wqkv + qd * D, host, stage, stage_floats));
        TRY(upload_weight(m, &L->wv, G->wqkv + (qd + kvd) * D, host, stage, stage_floats));
        ALLOC(G->wo, D * qd);
        TRY(upload_weight(m, &L->wo, G->wo, host, stage, stage_floats));
        ALLOC(G->wgu, 2 * (int64_t)m->ffn * D);
        TRY(upload_weight(m, &L->wg, G->wgu, host, stage, stage_floats));
        TRY(upload_weight(m, &L->wu, G->wgu + (int64_t)m->ffn * D, host, stage, stage_floats));
        ALLOC(G->wd, D * (int64_t)m->ffn);
        TRY(upload_weight(m, &L->wd, G->wd, host, stage, stage_floats));
        if (L->bq || L->bk || L->bv) {
            float *b = (float *)calloc((size_t)(qd + 2 * kvd), sizeof(float));
            if (!b) {
                st = mim_model_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory");
                goto done;
            }
            if (L->bq) memcpy(b, L->bq, (size_t)qd * sizeof(float));
            if (L->bk) memcpy(b + qd, L->bk, (size_t)kvd * sizeof(float));
            if (L->bv) memcpy(b + qd + kvd, L->bv, (size_t)kvd * sizeof(float));
            st = upload_floats(m, &G->bqkv, b, qd + 2 * kvd);
            free(b);
            if (st != MI_STATUS_SUCCESS) goto done;
        }
        TRY(upload_floats(m, &G->attn_norm, L->attn_norm, D));
        TRY(upload_floats(m, &G->ffn_norm, L->ffn_norm, D));
    }
    ALLOC(g->inv_freq, m->rope.dim / 2 > 0 ? m->rope.dim / 2 : 1);
done:
#undef TRY
#undef ALLOC
    free(host);
    dev_free(g, &stage, (size_t)stage_floats);
    return st;
}

/* ------------------------------------------------------------------------------------------ */
/* Buffers                                                                                     */

/* Device KV buffers: one per layer, or with kv_offload one that every layer reuses (the rows
 * live in a session's host pages, each layer's uploaded when its attention needs them). */
int cache_buffers(const mi_model *m) { return m->params.kv_offload ? 1 : m->n_layers; }

mi_status ensure_cache(mi_model *m, int64_t need) {
    gpu_state *g = GPU(m);
    if (need <= g->cache_cap) return MI_STATUS_SUCCESS;
    int64_t cap;
    mi_status st = mim_cache_capacity(m, need, g->cache_cap, &cap);
    if (st != MI_STATUS_SUCCESS) return st;
    const int64_t kvd = (int64_t)m->n_kv * m->hd;
    if (!g->k_cache) {
        g->k_cache = (bf16 **)calloc((size_t)m->n_layers, sizeof(bf16 *));
        g->v_cache = (bf16 **)calloc((size_t)m->n_layers, sizeof(bf16 *));
        if (!g->k_cache || !g->v_cache)
            return mim_model_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    for (int l = 0; l < cache_buffers(m); l++) {
        bf16 *k = NULL, *v = NULL;
        cudaError_t e = dev_alloc(g, &k, (size_t)(cap * kvd));
        if (e == cudaSuccess) e = dev_alloc(g, &v, (size_t)(cap * kvd));
        /* every row, not only the model's own n_past: the rows may mirror a session's pages */
        if (e == cudaSuccess && g->cache_cap > 0) {
            const size_t used = (size_t)(g->cache_cap * kvd) * sizeof(bf16);
            e = cudaMemcpyAsync(k, g->k_cache[l], used, cudaMemcpyDeviceToDevice, g->stream);
            if (e == cudaSuccess)
                e = cudaMemcpyAsync(v, g->v_cache[l], used, cudaMemcpyDeviceToDevice, g->stream);
        }
        if (e != cudaSuccess) {
            dev_free(g, &k, (size_t)(cap * kvd));
            dev_free(g, &v, (size_t)(cap * kvd));
            return mim_model_fail(m, MI_STATUS_OUT_OF_MEMORY,
                                  "out of device memory for a KV cache of %lld tokens (%s)",
                                  (long long)cap, cudaGetErrorString(e));
        }
        cudaStreamSynchronize(g->stream);
        dev_free(g, &g->k_cache[l], (size_t)(g->cache_cap * kvd));
        dev_free(g, &g->v_cache[l], (size_t)(g->cache_cap * kvd));
        g->k_cache[l] = k;
        g->v_cache[l] = v;
    }
    for (int l = cache_buffers(m); l < m->n_layers; l++) { /* kv_offload: one for all */
        g->k_cache[l] = g->k_cache[0];
        g->v_cache[l] = g->v_cache[0];
    }
    g->cache_cap = cap;
    return MI_STATUS_SUCCESS;
}

void free_rows(mi_model *m) {
    gpu_state *g = GPU(m);
    const int64_t r = g->rows_cap, qd = (int64_t)m->n_heads * m->hd;
    dev_free(g, &g->x, (size_t)(r * m->hidden));
    dev_free(g, &g->q, (size_t)(r * qd));
    dev_free(g, &g->att, (size_t)(r * qd));
    dev_free(g, &g->rope, (size_t)(r * (m->rope.dim / 2)));
    dev_free(g, &g->tokens, (size_t)r);
    g->rows_cap = 0;
}

void free_chunk(mi_model *m) {
    gpu_state *g = GPU(m);
    const int64_t c = g->chunk_cap, qd = (int64_t)m->n_heads * m->hd;
    const int64_t kvd = (int64_t)m->n_kv * m->hd;
    dev_free(g, &g->h, (size_t)(c * (m->hidden > qd ? m->hidden : qd)));
    dev_free(g, &g->qkv, (size_t)(c * (qd + 2 * kvd)));
    dev_free(g, &g->gu, (size_t)(c * 2 * m->ffn));
    dev_free(g, &g->act, (size_t)(c * m->ffn));
    g->chunk_cap = 0;
}

mi_status ensure_buffers(mi_model *m, int64_t rows, int64_t chunk, int64_t head_rows) {
    gpu_state *g = GPU(m);
    const int64_t qd = (int64_t)m->n_heads * m->hd, kvd = (int64_t)m->n_kv * m->hd;
    cudaError_t e = cudaSuccess;
    if (rows > g->rows_cap) {
        free_rows(m);
        if ((e = dev_alloc(g, &g->x, (size_t)(rows * m->hidden))) == cudaSuccess &&
            (e = dev_alloc(g, &g->q, (size_t)(rows * qd))) == cudaSuccess &&
            (e = dev_alloc(g, &g->att, (size_t)(rows * qd))) == cudaSuccess &&
            (e = dev_alloc(g, &g->rope, (size_t)(rows * (m->rope.dim / 2)))) == cudaSuccess &&
            (e = dev_alloc(g, &g->tokens, (size_t)rows)) == cudaSuccess)
            g->rows_cap = rows;
        else
            free_rows(m);
    }
    if (e == cudaSuccess && chunk > g->chunk_cap) {
        free_chunk(m);
        if ((e = dev_alloc(g, &g->h, (size_t)(chunk * (m->hidden > qd ? m->hidden : qd)))) ==
                cudaSuccess &&
            (e = dev_alloc(g, &g->qkv, (size_t)(chunk * (qd + 2 * kvd)))) == cudaSuccess &&
            (e = dev_alloc(g, &g->gu, (size_t)(chunk * 2 * m->ffn))) == cudaSuccess &&
            (e = dev_alloc(g, &g->act, (size_t)(chunk * m->ffn))) == cudaSuccess)
            g->chunk_cap = chunk;
        else
            free_chunk(m);
    }
    if (e == cudaSuccess && head_rows > g->head_rows_cap) {
        dev_free(g, &g->logits, (size_t)(g->head_rows_cap * m->vocab));
        dev_free(g, &g->log_probs, (size_t)g->head_rows_cap);
        g->head_rows_cap = 0;
        if ((e = dev_alloc(g, &g->logits, (size_t)(head_rows * m->vocab))) == cudaSuccess &&
            (e = dev_alloc(g, &g->log_probs, (size_t)head_rows)) == cudaSuccess)
            g->head_rows_cap = head_rows;
    }
    if (e != cudaSuccess)
        return mim_model_fail(m, MI_STATUS_OUT_OF_MEMORY,
                              "out of device memory for the activations of %lld tokens (%s)",
                              (long long)rows, cudaGetErrorString(e));
    return MI_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Pieces of the layer                                                                         */

mi_status launch_check(mi_model *m, const char *what) {
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? MI_STATUS_SUCCESS : cuda_fail(m, e, what);
}

mi_status blas_check(mi_model *m, cublasStatus_t s, const char *what) {
    return s == CUBLAS_STATUS_SUCCESS
               ? MI_STATUS_SUCCESS
               : mim_model_fail(m, MI_STATUS_DEVICE_ERROR, "%s: cuBLAS status %d", what, (int)s);
}

/* Dense attention of rows pos0..pos0+n-1 over the cache, in launches whose partials fit. */
mi_status continue_attention(mi_model *m, int layer, int64_t pos0, int64_t n, float scale) {
    gpu_state *g = GPU(m);
    const int hd = m->hd;
    const int64_t span =
        m->sliding_window > 0 && pos0 + n > m->sliding_window ? m->sliding_window : pos0 + n;
    const int n_splits = (int)((span + DEC_SPLIT - 1) / DEC_SPLIT);
    const size_t per_row = (size_t)m->n_heads * n_splits * (hd + 2) * sizeof(float);
    int64_t rows_per = (int64_t)(DEC_PART_MAX / per_row);
    if (rows_per < 1) rows_per = 1;
    if (rows_per > 65535) rows_per = 65535; /* grid.z of dec_partial, grid.y of dec_combine */
    if (rows_per > n) rows_per = n;
    const size_t need = per_row * (size_t)rows_per;
    if (need > g->dec_part_bytes) {
        dev_free(g, &g->dec_part, g->dec_part_bytes / sizeof(float));
        g->dec_part_bytes = 0;
        cudaError_t e = dev_alloc(g, &g->dec_part, need / sizeof(float));
        if (e != cudaSuccess) return cuda_fail(m, e, "decode attention buffer");
        g->dec_part_bytes = need;
    }
    const int64_t qd = (int64_t)m->n_heads * hd;
    for (int64_t r0 = 0; r0 < n; r0 += rows_per) {
        const int64_t rows = n - r0 < rows_per ? n - r0 : rows_per;
        dim3 grid((unsigned)n_splits, (unsigned)m->n_heads, (unsigned)rows);
        const bf16 *q = g->q + r0 * qd;
        if (hd == 64)
            dec_partial_kernel<64><<<grid, 128, 0, g->stream>>>(
                q, g->k_cache[layer], g->v_cache[layer], g->dec_part, pos0 + r0, m->n_heads,
                m->n_kv, m->sliding_window, scale, n_splits);
        else
            dec_partial_kernel<128><<<grid, 128, 0, g->stream>>>(
                q, g->k_cache[layer], g->v_cache[layer], g->dec_part, pos0 + r0, m->n_heads,
                m->n_kv, m->sliding_window, scale, n_splits);
        dec_combine_kernel<<<dim3((unsigned)m->n_heads, (unsigned)rows), hd, 0, g->stream>>>(
            g->dec_part, g->att + r0 * qd, m->n_heads, hd, n_splits);
    }
    return launch_check(m, "decode attention");
}

/* The layer's attention for its n new rows over the n_past + n cached ones (n_past > 0: queries
 * at an offset, a follow-up turn or a later chunk); patterns and the dense fallback look at the
 * whole length. */
mi_status prefill_attention(mi_model *m, int layer, int64_t n_past, int64_t n,
                            mi_head_pattern *pat) {
    gpu_state *g = GPU(m);
    const int64_t L = n_past + n;
    const mi_prefill_params params = mim_prefill_params_for(m, L), *pp = &params;
    mi_status st = mim_layer_patterns(m, layer, L, pat);
    if (st != MI_STATUS_SUCCESS) return st;
    mi_tensor tq = mi_tensor_blhd(g->q, MI_DTYPE_BF16, MI_DEVICE_CUDA, 1, m->n_heads, n, m->hd);
    mi_tensor tk =
        mi_tensor_blhd(g->k_cache[layer], MI_DTYPE_BF16, MI_DEVICE_CUDA, 1, m->n_kv, L, m->hd);
    mi_tensor tv =
        mi_tensor_blhd(g->v_cache[layer], MI_DTYPE_BF16, MI_DEVICE_CUDA, 1, m->n_kv, L, m->hd);
    mi_tensor to = mi_tensor_blhd(g->att, MI_DTYPE_BF16, MI_DEVICE_CUDA, 1, m->n_heads, n, m->hd);
    size_t ws = 0;
    st = mi_prefill_workspace_size(m->ctx, &tq, &tk, pat, pp, &ws);
    if (st == MI_STATUS_SUCCESS && ws > g->workspace_bytes) {
        /* the workspace may still be in use by the previous layer's kernels */
        cudaStreamSynchronize(g->stream);
        dev_free(g, (char **)&g->workspace, g->workspace_bytes);
        g->workspace_bytes = 0;
        cudaError_t e = dev_alloc(g, (char **)&g->workspace, ws);
        if (e != cudaSuccess) return cuda_fail(m, e, "attention workspace");
        g->workspace_bytes = ws;
    }
    if (st == MI_STATUS_SUCCESS) {
        ev_mark(g, &g->attn_ev);
        st = mi_prefill_attention(m->ctx, &tq, &tk, &tv, NULL, pat, pp, &to, NULL, g->workspace,
                                  g->workspace_bytes);
        ev_mark(g, &g->attn_ev);
    }
    if (st != MI_STATUS_SUCCESS)
        return mim_model_fail(m, st, "layer %d attention: %s", layer,
                              mi_context_last_error(m->ctx));
    return MI_STATUS_SUCCESS;
}

/* Host fp32 [n, width] copy of a bf16 device matrix with row stride width. */
mi_status download_f32(mi_model *m, const bf16 *src, int64_t n, int64_t width, float *dst) {
    gpu_state *g = GPU(m);
    uint16_t *tmp = (uint16_t *)malloc((size_t)(n * width) * sizeof(uint16_t));
    if (!tmp) return mim_model_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory for the capture");
    cudaError_t e = cudaMemcpyAsync(tmp, src, (size_t)(n * width) * sizeof(uint16_t),
                                    cudaMemcpyDeviceToHost, g->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(g->stream);
    if (e == cudaSuccess)
        for (int64_t i = 0; i < n * width; i++) dst[i] = mi_bf16_to_f32(tmp[i]);
    free(tmp);
    return e == cudaSuccess ? MI_STATUS_SUCCESS : cuda_fail(m, e, "capture download");
}

mi_status capture_layer(mi_model *m, int layer, int64_t n, const mi_model_capture *cap) {
    gpu_state *g = GPU(m);
    const int64_t qd = (int64_t)m->n_heads * m->hd, kvd = (int64_t)m->n_kv * m->hd;
    float *q = (float *)malloc((size_t)(n * qd) * sizeof(float));
    float *k = (float *)malloc((size_t)(n * kvd) * sizeof(float));
    float *v = (float *)malloc((size_t)(n * kvd) * sizeof(float));
    mi_status st = MI_STATUS_SUCCESS;
    if (!q || !k || !v)
        st = mim_model_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory for the capture");
    if (st == MI_STATUS_SUCCESS) st = download_f32(m, g->q, n, qd, q);
    if (st == MI_STATUS_SUCCESS) st = download_f32(m, g->k_cache[layer], n, kvd, k);
    if (st == MI_STATUS_SUCCESS) st = download_f32(m, g->v_cache[layer], n, kvd, v);
    if (st == MI_STATUS_SUCCESS) {
        mi_tensor tq = mi_tensor_blhd(q, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_heads, n, m->hd);
        mi_tensor tk = mi_tensor_blhd(k, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_kv, n, m->hd);
        mi_tensor tv = mi_tensor_blhd(v, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_kv, n, m->hd);
        st = cap->on_layer(cap->user, layer, &tq, &tk, &tv);
        if (st != MI_STATUS_SUCCESS) mim_model_fail(m, st, "capture stopped at layer %d", layer);
    }
    free(q);
    free(k);
    free(v);
    return st;
}

/* log p(tokens[i + 1]) for every i < n - 1 from the final residuals. */
mi_status capture_log_probs(mi_model *m, int64_t n, double *out) {
    gpu_state *g = GPU(m);
    const int64_t D = m->hidden;
    /* rows per step: bounded by the logits buffer and by h, which holds one chunk of rows */
    int64_t step = g->head_rows_cap < g->chunk_cap ? g->head_rows_cap : g->chunk_cap;
    if (step < 1) step = 1;
    for (int64_t r0 = 0; r0 + 1 < n; r0 += step) {
        const int64_t c = n - 1 - r0 < step ? n - 1 - r0 : step;
        rmsnorm_kernel<<<(unsigned)c, 256, 0, g->stream>>>(g->x + r0 * D, g->out_norm, g->h, D,
                                                           m->eps);
        mi_status st = blas_check(
            m, gemm(g, g->h, c, D, g->output, m->vocab, g->logits, m->vocab, false), "LM head");
        if (st != MI_STATUS_SUCCESS) return st;
        log_prob_kernel<<<(unsigned)c, 256, 0, g->stream>>>(g->logits, g->tokens + r0 + 1,
                                                            g->log_probs, m->vocab);
        cudaError_t e = cudaMemcpyAsync(out + r0, g->log_probs, (size_t)c * sizeof(double),
                                        cudaMemcpyDeviceToHost, g->stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(g->stream);
        if (e != cudaSuccess) return cuda_fail(m, e, "log-probabilities");
    }
    return launch_check(m, "log-probabilities");
}

} // namespace

/* ------------------------------------------------------------------------------------------ */
/* Entry points                                                                                */

extern "C" mi_status mim_gpu_attach(mi_model *m, char *err, size_t err_size) {
    /* the device first: without one, that is the message a user needs */
    cudaError_t de = cudaSetDevice(m->params.device_id);
    if (de != cudaSuccess) {
        (void)cudaGetLastError();
        return mim_fail(err, err_size, MI_STATUS_DEVICE_ERROR, "no usable CUDA device %d: %s",
                        m->params.device_id, cudaGetErrorString(de));
    }
    if (m->hd != 64 && m->hd != 128)
        return mim_fail(err, err_size, MI_STATUS_UNSUPPORTED,
                        "head_dim %d: the CUDA attention kernels support 64 and 128; use the CPU",
                        m->hd);
    if (m->rope.dim > m->hd || m->rope.dim % 2 != 0)
        return mim_fail(err, err_size, MI_STATUS_UNSUPPORTED, "rotary dimension %d of head %d",
                        m->rope.dim, m->hd);
    gpu_state *g = (gpu_state *)calloc(1, sizeof(gpu_state));
    if (!g) return mim_fail(err, err_size, MI_STATUS_OUT_OF_MEMORY, "out of memory");
    g->device = m->params.device_id;
    m->gpu = g;
    mi_status st = attach(m);
    if (st == MI_STATUS_SUCCESS) {
        mi_context_params cp = mi_context_default_params();
        cp.device = MI_DEVICE_CUDA;
        cp.device_id = g->device;
        mi_context *ctx = NULL;
        st = mi_context_create(&cp, &ctx);
        if (st == MI_STATUS_SUCCESS) st = mi_context_set_stream(ctx, g->stream);
        if (st == MI_STATUS_SUCCESS) {
            mi_context_destroy(m->ctx);
            m->ctx = ctx;
        } else {
            mi_context_destroy(ctx);
            mim_model_fail(m, st, "cannot create the CUDA attention context");
        }
    }
    if (st != MI_STATUS_SUCCESS) {
        mim_fail(err, err_size, st, "%s", m->last_error);
        mim_gpu_detach(m);
    }
    return st;
}

extern "C" void mim_gpu_pool_memory(mi_model *m, mi_kv_pool_params *pp) {
    gpu_state *g = m ? GPU(m) : NULL;
    if (!g || !m->params.kv_pinned) return;
    pp->alloc = mim_pinned_alloc;
    pp->free = mim_pinned_free;
    pp->alloc_user = &g->pageable_slabs;
    /* pinning costs per call: slabs of about 16 MiB (an fp8 page of the 8B shape is 132 KiB) */
    const int64_t page_guess =
        2 * (int64_t)m->n_kv * m->hd * (pp->page_tokens > 0 ? pp->page_tokens : 64);
    pp->slab_pages = (int32_t)((16 << 20) / (page_guess > 0 ? page_guess : 1));
    if (pp->slab_pages < 1) pp->slab_pages = 1;
}

extern "C" void mim_gpu_detach(mi_model *m) {
    gpu_state *g = m ? GPU(m) : NULL;
    if (!g) return;
    cudaSetDevice(g->device);
    if (g->stream) cudaStreamSynchronize(g->stream);
    const int64_t D = m->hidden, qd = (int64_t)m->n_heads * m->hd, kvd = (int64_t)m->n_kv * m->hd;
    if (g->layers)
        for (int l = 0; l < m->n_layers; l++) {
            gpu_layer *G = &g->layers[l];
            dev_free(g, &G->wqkv, (size_t)((qd + 2 * kvd) * D));
            dev_free(g, &G->wo, (size_t)(D * qd));
            dev_free(g, &G->wgu, (size_t)(2 * m->ffn * D));
            dev_free(g, &G->wd, (size_t)(D * m->ffn));
            dev_free(g, &G->bqkv, (size_t)(qd + 2 * kvd));
            dev_free(g, &G->attn_norm, (size_t)D);
            dev_free(g, &G->ffn_norm, (size_t)D);
        }
    free(g->layers);
    if (g->output != g->embd) dev_free(g, &g->output, (size_t)((int64_t)m->vocab * D));
    dev_free(g, &g->embd, (size_t)((int64_t)m->vocab * D));
    dev_free(g, &g->out_norm, (size_t)D);
    if (g->k_cache)
        for (int l = 0; l < cache_buffers(m); l++) {
            dev_free(g, &g->k_cache[l], (size_t)(g->cache_cap * kvd));
            dev_free(g, &g->v_cache[l], (size_t)(g->cache_cap * kvd));
        }
    free(g->k_cache);
    free(g->v_cache);
    free_rows(m);
    free_chunk(m);
    dev_free(g, &g->logits, (size_t)(g->head_rows_cap * m->vocab));
    dev_free(g, &g->log_probs, (size_t)g->head_rows_cap);
    dev_free(g, &g->inv_freq, (size_t)(m->rope.dim / 2));
    dev_free(g, &g->dec_part, g->dec_part_bytes / sizeof(float));
    dev_free(g, (char **)&g->workspace, g->workspace_bytes);
    free(g->slots);
    if (g->stage) cudaFreeHost(g->stage);
    if (g->jobs_host) cudaFreeHost(g->jobs_host);
    dev_free(g, &g->jobs_dev, (size_t)g->jobs_cap);
    mim_quest_dev_destroy(g->quest);
    ev_free(&g->attn_ev);
    ev_free(&g->gemm_ev);
    if (g->blas) cublasDestroy(g->blas);
    /* the attention context holds the stream: release it first */
    mi_context_destroy(m->ctx);
    m->ctx = NULL;
    if (g->stream) cudaStreamDestroy(g->stream);
    if (g->copy) cudaStreamDestroy(g->copy);
    if (g->kv_ready) cudaEventDestroy(g->kv_ready);
    for (int i = 0; i < 2; i++)
        if (g->chunk_done[i]) cudaEventDestroy(g->chunk_done[i]);
    if (g->pages_read) cudaEventDestroy(g->pages_read);
    free(g);
    m->gpu = NULL;
}

namespace {

/* Sessions, below: one layer's rows between the device cache and the session's pages. */
mi_status layer_upload(mi_model *m, const mi_kv_seq *seq, int l, int64_t rows, int64_t stage_rows,
                       bool use_slots);
mi_status layer_download(mi_model *m, mi_kv_seq *seq, int l, int64_t row0, int64_t n,
                         int64_t stage_rows);
mi_status host_attention(mi_model *m, const mim_gpu_seq_call *call, int l, int64_t n,
                         int64_t layer_rows, float scale);
bool quest_on_device(mi_model *m, const mim_gpu_seq_call *call, int64_t n);
mi_status quest_attention(mi_model *m, const mim_gpu_seq_call *call, int l, int64_t rows,
                          float scale);

/* mim_gpu_forward, and a session's call when `call` is set: each layer's new rows are appended
 * to the session after its attention, and with kv_offload the layer's earlier rows are uploaded
 * before it (stage_rows: rows per copy through the pinned buffer). With a KV method, calls after
 * the first attend on the host over the session's pages (the method's selection), the
 * projections and the MLP staying on the device. */
mi_status gpu_forward(mi_model *m, const int32_t *tokens, int64_t n, bool fresh, float *logits,
                      const mi_model_capture *capture, const mim_gpu_seq_call *call,
                      int64_t stage_rows) {
    gpu_state *g = GPU(m);
    const double t_start = mim_now_s();
    cudaSetDevice(g->device);
    if (fresh) m->n_past = 0;
    const int64_t n_past = m->n_past;
    mi_kv_seq *seq = call ? call->seq : NULL;
    /* the RoPE position of the first token: the rows before it, except where a KV method
     * dropped rows */
    const int64_t pos0 = call ? call->pos : n_past;
    const bool host_attn = call && call->method && n_past > 0;
    /* Quest's one-token calls over pinned pages select and attend on the device instead */
    const bool device_select = host_attn && quest_on_device(m, call, n);
    /* this call writes the cache rows from n_past on (with kv_offload, every layer's buffer) */
    slots_drop_from(m, m->params.kv_offload ? 0 : n_past);
    const int64_t D = m->hidden, qd = (int64_t)m->n_heads * m->hd, kvd = (int64_t)m->n_kv * m->hd;
    const int64_t chunk = n < m->params.mlp_chunk ? n : m->params.mlp_chunk;
    const int half = m->rope.dim / 2;
    const bool log_probs = capture && capture->token_log_probs && n > 1;
    mi_status st = ensure_cache(m, n_past + n);
    if (st == MI_STATUS_SUCCESS)
        st = ensure_buffers(m, n, chunk, log_probs ? (n - 1 < HEAD_ROWS ? n - 1 : HEAD_ROWS) : 1);
    if (st != MI_STATUS_SUCCESS) return st;
    g->timing = fresh;
    g->attn_ev.used = g->gemm_ev.used = 0;

    /* RoPE table for the n positions, then the embeddings */
    float *inv_freq = (float *)malloc((size_t)(half > 0 ? half : 1) * sizeof(float));
    if (!inv_freq) return mim_model_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory");
    float mscale = 1.0f;
    mim_rope_freqs(&m->rope, pos0 + n, inv_freq, &mscale);
    cudaError_t e = cudaMemcpyAsync(g->inv_freq, inv_freq, (size_t)half * sizeof(float),
                                    cudaMemcpyHostToDevice, g->stream);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(g->tokens, tokens, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice,
                            g->stream);
    /* the host copies are pageable: they complete before the calls return, so inv_freq can go */
    if (e == cudaSuccess) e = cudaStreamSynchronize(g->stream);
    free(inv_freq);
    if (e != cudaSuccess) return cuda_fail(m, e, "upload of the prompt");
    if (half > 0)
        rope_table_kernel<<<grid_for(n * half, 256), 256, 0, g->stream>>>(g->inv_freq, mscale, half,
                                                                          pos0, n, g->rope);
    embed_kernel<<<(unsigned)n, 128, 0, g->stream>>>(g->tokens, g->embd, g->x, D);
    if ((st = launch_check(m, "embedding")) != MI_STATUS_SUCCESS) return st;

    const mi_prefill_params pp = mim_prefill_params_for(m, n);
    const float scale = pp.softmax_scale;
    mi_head_pattern *pat = (mi_head_pattern *)malloc((size_t)m->n_heads * sizeof(*pat));
    if (!pat) return mim_model_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory");
    /* a prompt, or a later call of seq_prefill_from rows or more, runs the prefill kernels (at an
     * offset over the cache); fewer rows the decode kernel */
    const bool prefill_kernels = n_past == 0 ? n > 1 : n >= mim_seq_prefill_from(m);

    for (int32_t l = 0; l < m->n_layers && st == MI_STATUS_SUCCESS; l++) {
        const gpu_layer *G = &g->layers[l];
        bf16 *kc = g->k_cache[l] + n_past * kvd, *vc = g->v_cache[l] + n_past * kvd;
        /* q, k, v for every row, chunk by chunk */
        for (int64_t c0 = 0; c0 < n && st == MI_STATUS_SUCCESS; c0 += chunk) {
            const int64_t c = n - c0 < chunk ? n - c0 : chunk;
            rmsnorm_kernel<<<(unsigned)c, 256, 0, g->stream>>>(g->x + c0 * D, G->attn_norm, g->h, D,
                                                               m->eps);
            st = blas_check(m,
                            gemm(g, g->h, c, D, G->wqkv, qd + 2 * kvd, g->qkv, qd + 2 * kvd, false),
                            "q/k/v projection");
            if (st != MI_STATUS_SUCCESS) break;
            qkv_finish_kernel<<<(unsigned)c, 256, 0, g->stream>>>(
                g->qkv, G->bqkv, g->rope + c0 * half, g->q + c0 * qd, kc + c0 * kvd, vc + c0 * kvd,
                m->n_heads, m->n_kv, m->hd, m->rope.dim, m->rope.neox ? 1 : 0);
        }
        if (st == MI_STATUS_SUCCESS) st = launch_check(m, "q/k/v");
        if (st == MI_STATUS_SUCCESS && seq) {
            e = cudaEventRecord(g->kv_ready, g->stream);
            if (e != cudaSuccess) st = cuda_fail(m, e, "event");
        }
        if (st == MI_STATUS_SUCCESS && capture && capture->on_layer)
            st = capture_layer(m, l, n, capture);
        if (st != MI_STATUS_SUCCESS) break;
        if (host_attn) {
            /* the rows first (the host attention reads them from the pages), then attention */
            const int64_t layer_rows = mi_kv_seq_length(seq, l);
            st = layer_download(m, seq, l, n_past, n, stage_rows);
            if (st == MI_STATUS_SUCCESS && device_select)
                st = quest_attention(m, call, l, layer_rows + n, scale);
            else if (st == MI_STATUS_SUCCESS)
                st = host_attention(m, call, l, n, layer_rows, scale);
        } else {
            if (seq && m->params.kv_offload && n_past > 0)
                st = layer_upload(m, seq, l, n_past, stage_rows, false);
            if (st != MI_STATUS_SUCCESS) break;
            if (prefill_kernels)
                st = prefill_attention(m, l, n_past, n, pat);
            else
                st = continue_attention(m, l, n_past, n, scale);
            if (st == MI_STATUS_SUCCESS && call && call->qkeep && call->q_rows > 0)
                st = download_f32(m, g->q + (n - call->q_rows) * qd, call->q_rows, qd,
                                  call->qkeep + (int64_t)l * call->q_rows * qd);
        }
        /* output projection into the residual, then the MLP, chunk by chunk */
        for (int64_t c0 = 0; c0 < n && st == MI_STATUS_SUCCESS; c0 += chunk) {
            const int64_t c = n - c0 < chunk ? n - c0 : chunk;
            float *xc = g->x + c0 * D;
            st = blas_check(m, gemm(g, g->att + c0 * qd, c, qd, G->wo, D, xc, D, true),
                            "output projection");
            if (st != MI_STATUS_SUCCESS) break;
            rmsnorm_kernel<<<(unsigned)c, 256, 0, g->stream>>>(xc, G->ffn_norm, g->h, D, m->eps);
            st = blas_check(m, gemm(g, g->h, c, D, G->wgu, 2 * m->ffn, g->gu, 2 * m->ffn, false),
                            "gate/up projection");
            if (st != MI_STATUS_SUCCESS) break;
            silu_mul_kernel<<<grid_for(c * m->ffn, 256), 256, 0, g->stream>>>(g->gu, g->act, c,
                                                                              m->ffn);
            st =
                blas_check(m, gemm(g, g->act, c, m->ffn, G->wd, D, xc, D, true), "down projection");
        }
        if (st == MI_STATUS_SUCCESS) st = launch_check(m, "MLP");
        /* the layer's new rows into the session's pages while its attention and MLP run (with
         * kv_offload, before the next layer's rows take the buffer) */
        if (st == MI_STATUS_SUCCESS && seq && !host_attn)
            st = layer_download(m, seq, l, n_past, n, stage_rows);
        if (st == MI_STATUS_SUCCESS && m->progress && fresh) {
            /* the callback reports finished layers: wait for this one */
            if ((e = cudaStreamSynchronize(g->stream)) != cudaSuccess)
                st = cuda_fail(m, e, "layer");
            else
                m->progress(m->progress_user, l + 1, m->n_layers, n);
        }
    }
    free(pat);
    if (st == MI_STATUS_SUCCESS && logits) {
        rmsnorm_kernel<<<1, 256, 0, g->stream>>>(g->x + (n - 1) * D, g->out_norm, g->h, D, m->eps);
        st = blas_check(m, gemm(g, g->h, 1, D, g->output, m->vocab, g->logits, m->vocab, false),
                        "LM head");
        if (st == MI_STATUS_SUCCESS) {
            e = cudaMemcpyAsync(logits, g->logits, (size_t)m->vocab * sizeof(float),
                                cudaMemcpyDeviceToHost, g->stream);
            if (e != cudaSuccess) st = cuda_fail(m, e, "logits download");
        }
    }
    if (st == MI_STATUS_SUCCESS && log_probs)
        st = capture_log_probs(m, n, capture->token_log_probs);
    if (st == MI_STATUS_SUCCESS) {
        e = cudaStreamSynchronize(g->stream);
        if (e != cudaSuccess) st = cuda_fail(m, e, "forward pass");
    } else {
        cudaStreamSynchronize(g->stream);
    }
    if (st == MI_STATUS_SUCCESS && device_select) call->method->device_calls++;
    if (st == MI_STATUS_SUCCESS && !capture) {
        m->n_past = n_past + n;
    } else {
        m->n_past = 0; /* a failed or measuring pass leaves no usable cache */
    }
    if (fresh && st == MI_STATUS_SUCCESS) {
        m->timing.n_tokens = n;
        m->timing.total_s = mim_now_s() - t_start;
        m->timing.attention_s = ev_total(&g->attn_ev);
        m->timing.gemm_s = ev_total(&g->gemm_ev);
    }
    m->timing.device_bytes = g->bytes;
    m->timing.device_peak_bytes = g->peak;
    g->timing = false;
    return st;
}

} // namespace

extern "C" mi_status mim_gpu_forward(mi_model *m, const int32_t *tokens, int64_t n, bool fresh,
                                     float *logits, const mi_model_capture *capture) {
    return gpu_forward(m, tokens, n, fresh, logits, capture, NULL, 0);
}

/* ------------------------------------------------------------------------------------------ */
/* Sessions                                                                                    */
/*
 * A session on the CUDA model keeps its rows in host pages of bf16 (the device cache's own
 * precision, so the copies are exact). The device cache mirrors pages: slot i of a layer says
 * which page's rows i*P.. it holds (page_slot). Before a session's call, the slots that differ
 * from the session's pages are uploaded: a session that runs again uploads nothing, a fork of the
 * session that ran last uploads only the pages it does not share (its copy-on-write tail), an
 * unrelated session uploads its rows. After the call, its new rows are downloaded into its pages.
 * The model's own sequence (mi_model_prefill) writes the same rows and drops the slots it
 * overwrites; a session's call in turn leaves the model's own sequence empty.
 */

namespace {

/* Slots from the one holding `row` on: that one keeps its rows before `row`, later ones go. */
void slots_drop_from(mi_model *m, int64_t row) {
    gpu_state *g = GPU(m);
    if (!g->slots || g->slot_tokens <= 0) return;
    const int64_t first = row / g->slot_tokens;
    const int32_t keep = (int32_t)(row % g->slot_tokens);
    for (int l = 0; l < m->n_layers; l++)
        for (int64_t i = first; i < g->slot_cap; i++) {
            page_slot *s = &g->slots[(int64_t)l * g->slot_cap + i];
            if (i == first && s->rows > keep)
                s->rows = keep;
            else if (i > first)
                s->id = -1, s->rows = 0;
        }
}

/* Room for `pages` slots per layer, for the page ids of `pool` (another pool: every slot goes). */
mi_status slots_ensure(mi_model *m, const mi_kv_pool *pool, int32_t page_tokens, int64_t pages) {
    gpu_state *g = GPU(m);
    if (pool != g->slot_pool || page_tokens != g->slot_tokens) {
        for (int64_t i = 0; i < g->slot_cap * m->n_layers; i++) g->slots[i].id = -1;
        g->slot_pool = pool;
        g->slot_tokens = page_tokens;
    }
    if (pages <= g->slot_cap) return MI_STATUS_SUCCESS;
    const int64_t cap = pages > 2 * g->slot_cap ? pages : 2 * g->slot_cap;
    page_slot *s = (page_slot *)malloc((size_t)(cap * m->n_layers) * sizeof(page_slot));
    if (!s) return mim_model_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory for page slots");
    for (int l = 0; l < m->n_layers; l++)
        for (int64_t i = 0; i < cap; i++) {
            page_slot *d = &s[(int64_t)l * cap + i];
            if (i < g->slot_cap) {
                *d = g->slots[(int64_t)l * g->slot_cap + i];
            } else {
                d->id = -1, d->rows = 0, d->version = 0;
            }
        }
    free(g->slots);
    g->slots = s;
    g->slot_cap = cap;
    return MI_STATUS_SUCCESS;
}

/* The pinned buffer, at least `bytes`. */
mi_status stage_ensure(mi_model *m, size_t bytes) {
    gpu_state *g = GPU(m);
    if (bytes <= g->stage_bytes) return MI_STATUS_SUCCESS;
    if (g->stage) cudaFreeHost(g->stage);
    g->stage = NULL;
    g->stage_bytes = 0;
    cudaError_t e = cudaMallocHost(&g->stage, bytes);
    if (e != cudaSuccess) {
        g->stage = NULL;
        return mim_model_fail(m, MI_STATUS_OUT_OF_MEMORY,
                              "out of pinned host memory for a %zu-byte staging buffer (%s)", bytes,
                              cudaGetErrorString(e));
    }
    g->stage_bytes = bytes;
    return MI_STATUS_SUCCESS;
}

bool slot_holds(const page_slot *s, const mi_kv_page_view *v) {
    return s->id == v->page_id && s->version == v->version && s->rows >= v->rows;
}

void slot_set(page_slot *s, const mi_kv_page_view *v) {
    s->id = v->page_id, s->version = v->version, s->rows = v->rows;
}

/* layer_upload on the device: the pages to upload go as one job list, decoded by one launch
 * straight from pinned host memory. *done false: the pages are not device-readable (pageable
 * memory, another dtype), and nothing was done. */
mi_status upload_pages(mi_model *m, const mi_kv_seq *seq, int l, int64_t rows, page_slot *slots,
                       bool *done) {
    gpu_state *g = GPU(m);
    *done = false;
    mi_kv_page_layout lay;
    if (g->pageable_slabs > 0 ||
        mi_kv_pool_layout(mi_kv_seq_pool(seq), &lay) != MI_STATUS_SUCCESS ||
        !mim_pages_decodable(&lay) || lay.n_kv_heads != m->n_kv || lay.head_dim != m->hd)
        return MI_STATUS_SUCCESS;
    const int64_t kvd = (int64_t)m->n_kv * m->hd, P = lay.page_tokens;
    const int64_t pages = (rows + P - 1) / P;
    /* the previous upload's list may still be on its way to the device */
    cudaError_t e = cudaEventSynchronize(g->pages_read);
    if (e != cudaSuccess) return cuda_fail(m, e, "upload of a session's pages");
    if (pages > g->jobs_cap) {
        const int64_t cap = pages > 2 * g->jobs_cap ? pages : 2 * g->jobs_cap;
        if (g->jobs_host) cudaFreeHost(g->jobs_host);
        dev_free(g, &g->jobs_dev, (size_t)g->jobs_cap);
        g->jobs_host = NULL, g->jobs_cap = 0;
        e = cudaMallocHost((void **)&g->jobs_host, (size_t)cap * sizeof(mim_page_job));
        if (e == cudaSuccess) e = dev_alloc(g, &g->jobs_dev, (size_t)cap);
        if (e != cudaSuccess) {
            if (g->jobs_host) cudaFreeHost(g->jobs_host);
            g->jobs_host = NULL;
            return cuda_fail(m, e, "page list for an upload");
        }
        g->jobs_cap = cap;
    }
    int64_t n = 0;
    for (int64_t i = 0; i < pages; i++) {
        mi_kv_page_view v;
        if (mi_kv_seq_page(seq, l, i, &v) != MI_STATUS_SUCCESS)
            return mim_model_fail(m, MI_STATUS_INTERNAL, "layer %d: page %lld of %lld", l,
                                  (long long)i, (long long)pages);
        if (slots && slot_holds(&slots[i], &v)) continue;
        if (n == 0 && !mim_host_is_pinned(v.data)) return MI_STATUS_SUCCESS;
        const int64_t left = rows - i * P;
        g->jobs_host[n].page = (const unsigned char *)v.data;
        g->jobs_host[n].row0 = i * P;
        g->jobs_host[n].rows = (int32_t)(v.rows < left ? v.rows : left);
        g->jobs_host[n].pad = 0;
        n++;
        if (slots) slot_set(&slots[i], &v); /* undone below if the launch fails */
    }
    *done = true;
    if (n == 0) return MI_STATUS_SUCCESS;
    e = cudaMemcpyAsync(g->jobs_dev, g->jobs_host, (size_t)n * sizeof(mim_page_job),
                        cudaMemcpyHostToDevice, g->stream);
    /* a grid's x extent is 2^31 - 1 CTAs: far more pages than a layer holds */
    if (e == cudaSuccess)
        e = mim_pages_to_rows(g->jobs_dev, (int)n, &lay, g->k_cache[l], g->v_cache[l], kvd,
                              g->stream);
    if (e == cudaSuccess) e = cudaEventRecord(g->pages_read, g->stream);
    if (e != cudaSuccess) {
        for (int64_t i = 0; slots && i < n; i++) slots[g->jobs_host[i].row0 / P].id = -1;
        return cuda_fail(m, e, "upload of a session's pages");
    }
    return MI_STATUS_SUCCESS;
}

/* Makes the device cache hold rows 0..rows-1 of layer l of seq: the pages whose slot differs
 * (use_slots), or all of them (kv_offload, where the buffer held another layer). Pages in pinned
 * memory are decoded on the device; others go through the host and the pinned stage. */
mi_status layer_upload(mi_model *m, const mi_kv_seq *seq, int l, int64_t rows, int64_t stage_rows,
                       bool use_slots) {
    gpu_state *g = GPU(m);
    const int64_t kvd = (int64_t)m->n_kv * m->hd, P = g->slot_tokens;
    const int64_t pages = (rows + P - 1) / P;
    bf16 *sk = (bf16 *)g->stage, *sv = sk + stage_rows * kvd;
    page_slot *slots = use_slots ? g->slots + (int64_t)l * g->slot_cap : NULL;
    bool done = false;
    mi_status st = upload_pages(m, seq, l, rows, slots, &done);
    if (st != MI_STATUS_SUCCESS || done) return st;
    for (int64_t i = 0; i < pages;) {
        mi_kv_page_view v;
        if (mi_kv_seq_page(seq, l, i, &v) != MI_STATUS_SUCCESS)
            return mim_model_fail(m, MI_STATUS_INTERNAL, "layer %d: page %lld of %lld", l,
                                  (long long)i, (long long)pages);
        if (slots && slot_holds(&slots[i], &v)) {
            i++;
            continue;
        }
        /* a run of pages to upload: consecutive rows, as many as the stage holds */
        const int64_t first = i, row0 = i * P;
        int64_t count = 0;
        while (i < pages && count + P <= stage_rows) {
            if (mi_kv_seq_page(seq, l, i, &v) != MI_STATUS_SUCCESS) break;
            if (slots && i > first && slot_holds(&slots[i], &v)) break;
            count += v.rows;
            i++;
        }
        mi_tensor tk = mi_tensor_blhd(sk, MI_DTYPE_BF16, MI_DEVICE_CPU, 1, m->n_kv, count, m->hd);
        mi_tensor tv = mi_tensor_blhd(sv, MI_DTYPE_BF16, MI_DEVICE_CPU, 1, m->n_kv, count, m->hd);
        if (mi_kv_seq_read(seq, l, row0, count, &tk, &tv) != MI_STATUS_SUCCESS)
            return mim_model_fail(m, MI_STATUS_INTERNAL, "layer %d: reading the session: %s", l,
                                  mi_kv_pool_last_error(mi_kv_seq_pool(seq)));
        const size_t bytes = (size_t)(count * kvd) * sizeof(bf16);
        cudaError_t e = cudaMemcpyAsync(g->k_cache[l] + row0 * kvd, sk, bytes,
                                        cudaMemcpyHostToDevice, g->stream);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(g->v_cache[l] + row0 * kvd, sv, bytes, cudaMemcpyHostToDevice,
                                g->stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(g->stream); /* the stage is reused */
        if (e != cudaSuccess) {
            for (int64_t j = first; slots && j < i; j++) slots[j].id = -1;
            return cuda_fail(m, e, "upload of a session's rows");
        }
        for (int64_t j = first; slots && j < i; j++)
            if (mi_kv_seq_page(seq, l, j, &v) == MI_STATUS_SUCCESS) slot_set(&slots[j], &v);
    }
    return MI_STATUS_SUCCESS;
}

/* Appends device rows row0..row0+n-1 of layer l to seq. */
mi_status layer_download(mi_model *m, mi_kv_seq *seq, int l, int64_t row0, int64_t n,
                         int64_t stage_rows) {
    gpu_state *g = GPU(m);
    const int64_t kvd = (int64_t)m->n_kv * m->hd;
    bf16 *half[2] = {(bf16 *)g->stage, (bf16 *)g->stage + 2 * stage_rows * kvd};
    /* chunk i+1 copies into one half while chunk i goes from the other into the pages */
    auto issue = [&](int64_t c0, int h) {
        const int64_t c = n - c0 < stage_rows ? n - c0 : stage_rows;
        const size_t bytes = (size_t)(c * kvd) * sizeof(bf16);
        cudaError_t e = cudaMemcpyAsync(half[h], g->k_cache[l] + (row0 + c0) * kvd, bytes,
                                        cudaMemcpyDeviceToHost, g->copy);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(half[h] + stage_rows * kvd, g->v_cache[l] + (row0 + c0) * kvd,
                                bytes, cudaMemcpyDeviceToHost, g->copy);
        if (e == cudaSuccess) e = cudaEventRecord(g->chunk_done[h], g->copy);
        return e;
    };
    /* the pages are written below: no upload may still be reading them */
    cudaError_t e = cudaEventSynchronize(g->pages_read);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(g->copy, g->kv_ready, 0);
    if (e == cudaSuccess && n > 0) e = issue(0, 0);
    mi_status st = MI_STATUS_SUCCESS;
    for (int64_t c0 = 0, i = 0; c0 < n && e == cudaSuccess && st == MI_STATUS_SUCCESS;
         c0 += stage_rows, i++) {
        const int h = (int)(i & 1);
        const int64_t c = n - c0 < stage_rows ? n - c0 : stage_rows;
        if (c0 + stage_rows < n) e = issue(c0 + stage_rows, h ^ 1);
        if (e == cudaSuccess) e = cudaEventSynchronize(g->chunk_done[h]);
        if (e != cudaSuccess) break;
        mi_tensor tk = mi_tensor_blhd(half[h], MI_DTYPE_BF16, MI_DEVICE_CPU, 1, m->n_kv, c, m->hd);
        mi_tensor tv = mi_tensor_blhd(half[h] + stage_rows * kvd, MI_DTYPE_BF16, MI_DEVICE_CPU, 1,
                                      m->n_kv, c, m->hd);
        st = mi_kv_seq_append(seq, l, &tk, &tv);
        if (st != MI_STATUS_SUCCESS)
            mim_model_fail(m, st, "layer %d: storing the new rows: %s", l,
                           mi_kv_pool_last_error(mi_kv_seq_pool(seq)));
    }
    /* nothing may still be copying into the pinned halves when this returns */
    const cudaError_t f = cudaStreamSynchronize(g->copy);
    if (e == cudaSuccess) e = f;
    if (st == MI_STATUS_SUCCESS && e != cudaSuccess)
        st = cuda_fail(m, e, "download of the new rows");
    return st;
}

/* The attention of layer l on the host (model_session.c's, with the method's selection) over the
 * session's pages, which already hold the call's rows: q down, the result up into att. */
mi_status host_attention(mi_model *m, const mim_gpu_seq_call *call, int l, int64_t n,
                         int64_t layer_rows, float scale) {
    gpu_state *g = GPU(m);
    const int64_t qd = (int64_t)m->n_heads * m->hd;
    float *q = (float *)malloc((size_t)(2 * n * qd) * sizeof(float));
    uint16_t *b = (uint16_t *)malloc((size_t)(n * qd) * sizeof(uint16_t));
    if (!q || !b) {
        free(q);
        free(b);
        return mim_model_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory for the host attention");
    }
    float *out = q + n * qd;
    mi_status st = download_f32(m, g->q, n, qd, q);
    if (st == MI_STATUS_SUCCESS && call->qkeep && call->q_rows > 0)
        memcpy(call->qkeep + (int64_t)l * call->q_rows * qd, q + (n - call->q_rows) * qd,
               (size_t)(call->q_rows * qd) * sizeof(float));
    if (st == MI_STATUS_SUCCESS)
        st = mim_seq_attention(m, call->seq, call->method, l, q, n, layer_rows, scale, out);
    if (st == MI_STATUS_SUCCESS) {
        for (int64_t i = 0; i < n * qd; i++) b[i] = mi_f32_to_bf16(out[i]);
        cudaError_t e = cudaMemcpyAsync(g->att, b, (size_t)(n * qd) * sizeof(uint16_t),
                                        cudaMemcpyHostToDevice, g->stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(g->stream); /* b is pageable and goes */
        if (e != cudaSuccess) st = cuda_fail(m, e, "upload of the host attention");
    }
    free(q);
    free(b);
    return st;
}

/* Whether a call of n tokens with call's method selects and attends on the device: Quest, one
 * token, every page and its bounds in pinned memory the device reads (kv_pinned), pages the
 * device decodes, no sliding window and no queries kept for the method. */
bool quest_on_device(mi_model *m, const mim_gpu_seq_call *call, int64_t n) {
    gpu_state *g = GPU(m);
    mi_kv_page_layout lay;
    const mi_kv_pool *pool = mi_kv_seq_pool(call->seq);
    if (n != 1 || !m->params.kv_pinned || g->pageable_slabs > 0 || m->sliding_window > 0 ||
        call->method->entry != &kv_method_quest_entry || (call->qkeep && call->q_rows > 0) ||
        mi_kv_pool_layout(pool, &lay) != MI_STATUS_SUCCESS ||
        !mim_quest_dev_readable(&lay, m->n_kv, m->hd))
        return false;
    mi_kv_page_view v;
    if (mi_kv_seq_page(call->seq, 0, 0, &v) != MI_STATUS_SUCCESS || !v.key_minmax ||
        !mim_host_is_pinned(v.data) || !mim_host_is_pinned(v.key_minmax))
        return false;
    if (!g->quest && !(g->quest = mim_quest_dev_create(m->n_layers, m->n_heads, m->n_kv, m->hd)))
        return false;
    return true;
}

/* Quest's selection and attention of layer l (rows rows, the call's one included) on the device,
 * into att; the first dense_layers layers, and a context within the budget, read every page. */
mi_status quest_attention(mi_model *m, const mim_gpu_seq_call *call, int l, int64_t rows,
                          float scale) {
    gpu_state *g = GPU(m);
    const kv_spec *spec = &call->method->spec;
    const int64_t budget = (int64_t)kv_spec_get(spec, "token_budget");
    const bool all = l < (int64_t)kv_spec_get(spec, "dense_layers") || rows <= budget;
    char err[256];
    cudaError_t e = mim_quest_dev_attend(g->quest, call->seq, l, rows, budget, all, g->q, scale,
                                         g->att, g->stream, err, sizeof err);
    /* its device memory joins the model's */
    const size_t now = mim_quest_dev_bytes(g->quest);
    g->bytes += now - g->quest_bytes;
    g->quest_bytes = now;
    if (g->bytes > g->peak) g->peak = g->bytes;
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return mim_model_fail(
            m, e == cudaErrorMemoryAllocation ? MI_STATUS_OUT_OF_MEMORY : MI_STATUS_DEVICE_ERROR,
            "layer %d: %s", l, err);
    }
    /* the pages are read until the attention is done: a later append must wait */
    e = cudaEventRecord(g->pages_read, g->stream);
    return e == cudaSuccess ? MI_STATUS_SUCCESS : cuda_fail(m, e, "event");
}

} // namespace

extern "C" mi_status mim_gpu_forward_seq(mi_model *m, const mim_gpu_seq_call *call,
                                         const int32_t *tokens, int64_t n, float *logits) {
    gpu_state *g = GPU(m);
    cudaSetDevice(g->device);
    mi_kv_seq *seq = call->seq;
    const int64_t n_past = mi_kv_seq_tokens(seq);
    mi_kv_page_layout lay;
    mi_status st = mi_kv_pool_layout(mi_kv_seq_pool(seq), &lay);
    if (st != MI_STATUS_SUCCESS) return mim_model_fail(m, st, "the session's pool");
    /* with a method the device never reads the pages back (the host attends), so any storage */
    if (!call->method && lay.dtype != MI_KV_BF16 && lay.dtype != MI_KV_F16 &&
        lay.dtype != MI_KV_FP8_E4M3)
        return mim_model_fail(m, MI_STATUS_UNSUPPORTED,
                              "a session on the CUDA model keeps bf16, f16 or fp8 pages, not %s",
                              mi_kv_dtype_name(lay.dtype));
    /* bf16 pages hold the device's values exactly; f16 and fp8 pages round them, so the rows a
     * call wrote are uploaded again (rounded) before the next call reads them */
    const bool exact = !call->method && lay.dtype == MI_KV_BF16;
    const bool offload = m->params.kv_offload != 0;
    const int64_t kvd = (int64_t)m->n_kv * m->hd, P = lay.page_tokens;
    /* rows per copy: the runner's chunk (its unit of bounded buffers), whole pages */
    int64_t stage_rows = m->params.mlp_chunk / P * P;
    if (stage_rows < P) stage_rows = P;
    m->n_past = 0; /* the model's own sequence goes: the rows become the session's */
    if ((st = ensure_cache(m, n_past + n)) != MI_STATUS_SUCCESS) return st;
    if ((st = slots_ensure(m, mi_kv_seq_pool(seq), (int32_t)P, (n_past + n + P - 1) / P)) !=
        MI_STATUS_SUCCESS)
        return st;
    if ((st = stage_ensure(m, (size_t)(4 * stage_rows * kvd) * sizeof(bf16))) != MI_STATUS_SUCCESS)
        return st;
    for (int l = 0; l < m->n_layers && !offload && !call->method && st == MI_STATUS_SUCCESS; l++)
        st = layer_upload(m, seq, l, n_past, stage_rows, true);
    if (st != MI_STATUS_SUCCESS) return st;
    int64_t *rows0 = (int64_t *)malloc((size_t)m->n_layers * sizeof(int64_t));
    if (!rows0) return mim_model_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int l = 0; l < m->n_layers; l++) rows0[l] = mi_kv_seq_length(seq, l);
    m->n_past = n_past;
    st = gpu_forward(m, tokens, n, n_past == 0, logits, NULL, call, stage_rows);
    if (st != MI_STATUS_SUCCESS) { /* all or nothing: the session keeps its rows */
        for (int l = 0; l < m->n_layers; l++) mi_kv_seq_truncate(seq, l, rows0[l]);
        slots_drop_from(m, offload ? 0 : n_past);
    } else if (!offload && exact) { /* the device rows now mirror the session's new pages */
        for (int l = 0; l < m->n_layers; l++)
            for (int64_t i = n_past / P; i * P < n_past + n; i++) {
                mi_kv_page_view v;
                page_slot *s = &g->slots[(int64_t)l * g->slot_cap + i];
                if (mi_kv_seq_page(seq, l, i, &v) == MI_STATUS_SUCCESS)
                    slot_set(s, &v);
                else
                    s->id = -1, s->rows = 0;
            }
    } else {
        slots_drop_from(m, offload ? 0 : n_past);
    }
    free(rows0);
    m->n_past = 0;
    return st;
}
