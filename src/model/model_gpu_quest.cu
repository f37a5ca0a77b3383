/*
 * model_gpu_quest.cu: Quest's decode step on the device (see model_gpu_quest.h).
 *
 * Per layer and call: a list of the pages whose mirror entry is stale goes to the device and
 * one kernel copies their bounds and addresses (mirror_kernel); bounds_kernel scores every page
 * for the query heads of a KV head (a thread per page); select_kernel (a CTA per query head)
 * finds the k-th largest bound by a radix select on order-preserving integer keys and writes
 * the chosen pages in ascending order, the lower page first among equal bounds (the host's
 * by_bound order). The chosen pages are then read in chunks of CHUNK_PAGES: gather_kernel
 * decodes a chunk's rows to f32 (a CTA per page, query head, K or V), attend_kernel (a CTA per
 * query head) folds them into a running max, sum and weighted value sum, and the last chunk
 * writes the output.
 */
#include "model_gpu_quest.h"

#include "model_gpu_pages.cuh"

#include <cub/block/block_scan.cuh>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "../kv/kv_method.h"
}

typedef __nv_bfloat16 bf16;

namespace {

const int MAX_HD = 256;
const int MAX_GROUP = 16;      /* query heads per KV head the bounds kernel scores at once */
const int CHUNK_PAGES = 64;    /* pages gathered per attention pass */
const int BOUND_THREADS = 128; /* pages per CTA of bounds_kernel */
const int SELECT_THREADS = 1024;
const int ATTEND_THREADS = 256;

struct page_key {
    int32_t id, meta_rows;
    uint64_t version;
};

struct mirror_job {
    const float *meta;
    const unsigned char *page;
    int64_t index; /* layer * page_cap + page */
};

/* ---- kernels -------------------------------------------------------------------------------- */

__global__ void mirror_kernel(const mirror_job *jobs, int floats, float *meta,
                              const unsigned char **pages) {
    const mirror_job j = jobs[blockIdx.x];
    float *dst = meta + j.index * floats;
    for (int i = threadIdx.x; i < floats; i += blockDim.x) dst[i] = j.meta[i];
    if (threadIdx.x == 0) pages[j.index] = j.page;
}

/* bounds[h][p] for the query heads h of KV head blockIdx.y: kv_quest_bound's arithmetic, in its
 * order (eight running sums over d = u, u + 8, ...; the tail; then the sums in order). G query
 * heads at a time keep their sums in registers while the page's bounds are read once. */
template <int G>
__global__ void __launch_bounds__(BOUND_THREADS)
    bounds_kernel(const bf16 *q, const float *meta, int64_t pages, int n_kv, int hd, int group,
                  float *bounds, int64_t page_cap) {
    __shared__ float qs[MAX_GROUP * MAX_HD];
    const int kh = blockIdx.y;
    for (int i = threadIdx.x; i < group * hd; i += blockDim.x)
        qs[i] = __bfloat162float(q[(int64_t)kh * group * hd + i]);
    __syncthreads();
    const int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= pages) return;
    const float *mn = meta + (p * n_kv + kh) * 2 * (int64_t)hd, *mx = mn + hd;
    for (int g0 = 0; g0 < group; g0 += G) {
        float acc[G][8];
#pragma unroll
        for (int g = 0; g < G; g++)
#pragma unroll
            for (int u = 0; u < 8; u++) acc[g][u] = 0.0f;
        int d = 0;
        for (; d + 8 <= hd; d += 8) {
            float lo[8], hi[8];
#pragma unroll
            for (int u = 0; u < 8; u++) lo[u] = mn[d + u], hi[u] = mx[d + u];
#pragma unroll
            for (int g = 0; g < G; g++) {
                const float *qg = qs + (g0 + g < group ? g0 + g : 0) * hd + d;
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const float a = __fmul_rn(qg[u], lo[u]), b = __fmul_rn(qg[u], hi[u]);
                    acc[g][u] = __fadd_rn(acc[g][u], a > b ? a : b);
                }
            }
        }
#pragma unroll
        for (int g = 0; g < G; g++) {
            if (g0 + g >= group) break;
            const float *qg = qs + (g0 + g) * hd;
            float s = 0.0f;
            for (int e = d; e < hd; e++) {
                const float a = __fmul_rn(qg[e], mn[e]), b = __fmul_rn(qg[e], mx[e]);
                s = __fadd_rn(s, a > b ? a : b);
            }
#pragma unroll
            for (int u = 0; u < 8; u++) s = __fadd_rn(s, acc[g][u]);
            bounds[((int64_t)kh * group + g0 + g) * page_cap + p] = s;
        }
    }
}

/* Larger float, larger key; -0 and +0 alike (the host compares them equal). */
__device__ inline uint32_t order_key(float f) {
    const uint32_t b = __float_as_uint(f + 0.0f);
    return (b & 0x80000000u) ? ~b : b | 0x80000000u;
}

/* sel[h][0..k): the k pages of largest bound of query head blockIdx.x, ascending; equal bounds
 * taken lower page first. */
__global__ void __launch_bounds__(SELECT_THREADS)
    select_kernel(const float *bounds, int64_t pages, int64_t k, int64_t page_cap, int32_t *sel) {
    typedef cub::BlockScan<int, SELECT_THREADS> scan_t;
    __shared__ typename scan_t::TempStorage scan_tmp;
    __shared__ int hist[256];
    __shared__ uint32_t prefix_s;
    __shared__ int64_t need_s;
    __shared__ int64_t base_eq, base_out;
    const int h = blockIdx.x;
    const float *b = bounds + (int64_t)h * page_cap;
    int32_t *out = sel + (int64_t)h * page_cap;
    if (threadIdx.x == 0) prefix_s = 0, need_s = k, base_eq = 0, base_out = 0;
    uint32_t mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        const uint32_t prefix = prefix_s;
        for (int64_t p = threadIdx.x; p < pages; p += blockDim.x) {
            const uint32_t key = order_key(b[p]);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1);
        }
        __syncthreads();
        if (threadIdx.x == 0) { /* the digit holding the need-th largest key */
            int64_t above = 0, need = need_s;
            for (int dg = 255; dg >= 0; dg--) {
                if (above + hist[dg] >= need) {
                    prefix_s = prefix | ((uint32_t)dg << shift);
                    need_s = need - above;
                    break;
                }
                above += hist[dg];
            }
        }
        mask |= 255u << shift;
        __syncthreads();
    }
    /* T: the k-th largest key; every key above it and the first need_s equal to it, in order */
    const uint32_t T = prefix_s;
    const int64_t need = need_s;
    for (int64_t p0 = 0; p0 < pages; p0 += blockDim.x) {
        const int64_t p = p0 + threadIdx.x;
        const uint32_t key = p < pages ? order_key(b[p]) : 0;
        const int eq = p < pages && key == T, gt = p < pages && key > T;
        int eq_rank, eq_total;
        scan_t(scan_tmp).ExclusiveSum(eq, eq_rank, eq_total);
        __syncthreads();
        const int take = gt || (eq && base_eq + eq_rank < need);
        int pos, taken;
        scan_t(scan_tmp).ExclusiveSum(take, pos, taken);
        if (take) out[base_out + pos] = (int32_t)p;
        __syncthreads();
        if (threadIdx.x == 0) base_eq += eq_total, base_out += taken;
        __syncthreads();
    }
}

__global__ void iota_kernel(int32_t *sel, int64_t pages, int64_t page_cap) {
    const int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (p < pages) sel[(int64_t)blockIdx.y * page_cap + p] = (int32_t)p;
}

/* rows[h][kv][t * P + r][hd] (f32) for the chunk's pages t of query head h (blockIdx.y). */
template <int KIND>
__global__ void __launch_bounds__(128)
    gather_kernel(const int32_t *sel, int64_t t0, int64_t page_cap,
                  const unsigned char *const *pages, page_geom g, int group, int P, int64_t rows,
                  float *out) {
    typedef page_vec<KIND> V;
    __shared__ float centre[MAX_HD];
    const int t = blockIdx.x, h = blockIdx.y, kv = blockIdx.z;
    const int64_t p = sel[(int64_t)h * page_cap + t0 + t];
    const int64_t left = rows - p * P;
    const int n = left < P ? (int)left : P;
    float s;
    const unsigned char *src = page_head_rows<KIND>(pages[p], g, h / group, kv, centre, &s);
    __syncthreads();
    float *dst = out + (((int64_t)h * 2 + kv) * CHUNK_PAGES * P + (int64_t)t * P) * g.hd;
    const int per_row = g.hd / V::ELEMS, total = n * per_row;
    for (int i = threadIdx.x; i < total; i += blockDim.x) {
        const int r = i / per_row, c0 = (i - r * per_row) * V::ELEMS;
        const uint4 w = *(const uint4 *)(src + r * g.row_stride + (int64_t)c0 * 16 / V::ELEMS);
        float f[V::ELEMS];
        V::to_f32(w, centre + c0, s, f);
        float4 *o = (float4 *)(dst + (int64_t)r * g.hd + c0);
#pragma unroll
        for (int e = 0; e < V::ELEMS / 4; e++)
            o[e] = make_float4(f[4 * e], f[4 * e + 1], f[4 * e + 2], f[4 * e + 3]);
    }
}

__device__ inline float block_reduce(float v, float *red, bool is_max) {
    for (int o = 16; o > 0; o >>= 1) {
        const float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, w) : v + w;
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float r = red[0];
    for (int i = 1; i < nw; i++) r = is_max ? fmaxf(r, red[i]) : r + red[i];
    return r;
}

/* One chunk of query head blockIdx.x's pages into its running state [max, sum, acc[hd]]; the
 * first chunk starts the state, the last writes out. Scores are q.k * scale, as on the host. */
__global__ void __launch_bounds__(ATTEND_THREADS)
    attend_kernel(const bf16 *q, const int32_t *sel, int64_t t0, int cnt, int64_t page_cap, int P,
                  int64_t rows, int hd, float scale, const float *kvrows, float *state, bool first,
                  bool last, bf16 *out) {
    extern __shared__ float sh[];
    float *qs = sh, *sc = qs + MAX_HD, *part = sc + CHUNK_PAGES * P, *red = part + ATTEND_THREADS;
    const int h = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int nw = blockDim.x / 32;
    for (int d = threadIdx.x; d < hd; d += blockDim.x)
        qs[d] = __bfloat162float(q[(int64_t)h * hd + d]);
    __syncthreads();
    const float *K = kvrows + (int64_t)h * 2 * CHUNK_PAGES * P * hd,
                *Vr = K + (int64_t)CHUNK_PAGES * P * hd;
    const int n_rows = cnt * P;
    for (int r = warp; r < n_rows; r += nw) {
        const int t = r / P, i = r - t * P;
        const int64_t left = rows - (int64_t)sel[(int64_t)h * page_cap + t0 + t] * P;
        float dot = 0.0f;
        if (i < left) {
            const float *k = K + (int64_t)r * hd;
            for (int d = lane; d < hd; d += 32) dot += qs[d] * k[d];
            for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        }
        if (lane == 0) sc[r] = i < left ? dot * scale : -INFINITY;
    }
    __syncthreads();
    float m = -INFINITY;
    for (int r = threadIdx.x; r < n_rows; r += blockDim.x) m = fmaxf(m, sc[r]);
    m = block_reduce(m, red, true);
    float *st = state + (int64_t)h * (2 + hd);
    const float m_old = first ? -INFINITY : st[0], l_old = first ? 0.0f : st[1];
    const float m_new = fmaxf(m_old, m);
    float l = 0.0f;
    for (int r = threadIdx.x; r < n_rows; r += blockDim.x) {
        const float e = sc[r] == -INFINITY ? 0.0f : expf(sc[r] - m_new);
        sc[r] = e;
        l += e;
    }
    l = block_reduce(l, red, false);
    __syncthreads();
    const float alpha = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
    const int parts = blockDim.x / hd; /* hd <= MAX_HD == ATTEND_THREADS */
    const int d = threadIdx.x % hd, pt = threadIdx.x / hd;
    float a = 0.0f;
    if (pt < parts)
        for (int r = pt; r < n_rows; r += parts) {
            const float w = sc[r]; /* 0 for rows past a page's end, whose buffer holds garbage */
            if (w != 0.0f) a += w * Vr[(int64_t)r * hd + d];
        }
    part[threadIdx.x] = a;
    __syncthreads();
    if (threadIdx.x < hd) {
        float sum = 0.0f;
        for (int i = 0; i < parts; i++) sum += part[i * hd + threadIdx.x];
        const float acc = (first ? 0.0f : st[2 + threadIdx.x]) * alpha + sum;
        const float l_new = l_old * alpha + l;
        if (last)
            out[(int64_t)h * hd + threadIdx.x] =
                __float2bfloat16_rn(l_new > 0.0f ? acc / l_new : 0.0f);
        else
            st[2 + threadIdx.x] = acc;
        if (threadIdx.x == 0 && !last) st[0] = m_new, st[1] = l_new;
    }
}

} // namespace

/* ---- state ---------------------------------------------------------------------------------- */

struct mim_quest_dev {
    int n_layers, n_heads, n_kv, hd;
    int32_t page_tokens;
    const mi_kv_pool *pool;      /* whose page ids the mirror names */
    int64_t page_cap;            /* pages per layer the arrays hold */
    float *meta;                 /* device [n_layers][page_cap][n_kv][2][hd] */
    const unsigned char **pages; /* device [n_layers][page_cap]: page bases (mapped) */
    page_key *keys;              /* host [n_layers][page_cap]: what the mirror holds */
    mirror_job *jobs_host, *jobs_dev;
    int64_t jobs_cap;
    cudaEvent_t jobs_read; /* the last job list's copy done */
    float *bounds;         /* device [n_heads][page_cap] */
    int32_t *sel;          /* device [n_heads][page_cap] */
    float *rows;           /* device [n_heads][2][CHUNK_PAGES * P][hd] */
    int32_t rows_tokens;   /* P the gather buffer was sized for */
    float *state;          /* device [n_heads][2 + hd] */
    size_t bytes;
};

static cudaError_t fail(char *err, size_t size, cudaError_t e, const char *fmt, ...) {
    if (err && size) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(err, size, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < size)
            snprintf(err + n, size - (size_t)n, " (%s)", cudaGetErrorString(e));
    }
    return e;
}

template <typename T> static cudaError_t alloc(mim_quest_dev *d, T **p, size_t n) {
    *p = NULL;
    cudaError_t e = cudaMalloc((void **)p, n * sizeof(T));
    if (e != cudaSuccess) {
        *p = NULL;
        (void)cudaGetLastError(); /* out of memory is not sticky */
        return e;
    }
    d->bytes += n * sizeof(T);
    return cudaSuccess;
}

template <typename T> static void release(mim_quest_dev *d, T **p, size_t n) {
    if (*p) {
        cudaFree(*p);
        d->bytes -= n * sizeof(T);
    }
    *p = NULL;
}

/* The arrays sized by page_cap, gone (page_cap 0). */
static void free_page_arrays(mim_quest_dev *d) {
    const size_t L = (size_t)d->n_layers, H = (size_t)d->n_heads, cap = (size_t)d->page_cap;
    release(d, &d->meta, L * cap * (size_t)d->n_kv * 2 * (size_t)d->hd);
    release(d, &d->pages, L * cap);
    release(d, &d->bounds, H * cap);
    release(d, &d->sel, H * cap);
    free(d->keys);
    d->keys = NULL;
    d->page_cap = 0;
}

mim_quest_dev *mim_quest_dev_create(int n_layers, int n_heads, int n_kv, int head_dim) {
    mim_quest_dev *d = (mim_quest_dev *)calloc(1, sizeof(*d));
    if (!d) return NULL;
    d->n_layers = n_layers, d->n_heads = n_heads, d->n_kv = n_kv, d->hd = head_dim;
    if (cudaEventCreateWithFlags(&d->jobs_read, cudaEventDisableTiming) != cudaSuccess) {
        free(d);
        return NULL;
    }
    return d;
}

void mim_quest_dev_destroy(mim_quest_dev *d) {
    if (!d) return;
    cudaEventSynchronize(d->jobs_read);
    cudaEventDestroy(d->jobs_read);
    free_page_arrays(d);
    cudaFree(d->jobs_dev);
    cudaFree(d->rows);
    cudaFree(d->state);
    if (d->jobs_host) cudaFreeHost(d->jobs_host);
    free(d);
}

size_t mim_quest_dev_bytes(const mim_quest_dev *d) { return d ? d->bytes : 0; }

bool mim_quest_dev_readable(const mi_kv_page_layout *lay, int n_kv, int head_dim) {
    const int elems = lay->dtype == MI_KV_FP8_E4M3 ? 16 : lay->dtype == MI_KV_F32 ? 4 : 8;
    return (lay->dtype == MI_KV_F32 || lay->dtype == MI_KV_BF16 || lay->dtype == MI_KV_F16 ||
            lay->dtype == MI_KV_FP8_E4M3) &&
           (lay->meta_kinds & MI_KV_META_KEY_MINMAX) && lay->n_kv_heads == n_kv &&
           lay->head_dim == head_dim && head_dim <= MAX_HD && head_dim % elems == 0 &&
           lay->row_stride % 16 == 0 && lay->head_stride % 16 == 0 && lay->k_offset % 16 == 0 &&
           lay->v_offset % 16 == 0 && lay->page_tokens > 0;
}

/* Room for `pages` pages a layer (the mirror forgotten when it moves) and the buffers for P. */
static cudaError_t ensure(mim_quest_dev *d, const mi_kv_pool *pool, int32_t P, int64_t pages) {
    cudaError_t e = cudaSuccess;
    if (pool != d->pool || P != d->page_tokens) {
        for (int64_t i = 0; d->keys && i < d->page_cap * d->n_layers; i++) d->keys[i].id = -1;
        d->pool = pool, d->page_tokens = P;
    }
    if (pages > d->page_cap) {
        /* the mirror restarts (every page is copied again on its next use), with room to grow:
         * a decode adds a page every P tokens */
        int64_t cap = d->page_cap + d->page_cap / 2;
        if (cap < pages + pages / 8 + 16) cap = pages + pages / 8 + 16;
        const size_t L = (size_t)d->n_layers, H = (size_t)d->n_heads;
        const size_t mf = (size_t)d->n_kv * 2 * (size_t)d->hd;
        free_page_arrays(d);
        d->keys = (page_key *)malloc(L * (size_t)cap * sizeof(page_key));
        if (!d->keys) return cudaErrorMemoryAllocation;
        for (size_t i = 0; i < L * (size_t)cap; i++) d->keys[i].id = -1;
        if ((e = alloc(d, &d->meta, L * (size_t)cap * mf)) != cudaSuccess ||
            (e = alloc(d, &d->pages, L * (size_t)cap)) != cudaSuccess ||
            (e = alloc(d, &d->bounds, H * (size_t)cap)) != cudaSuccess ||
            (e = alloc(d, &d->sel, H * (size_t)cap)) != cudaSuccess) {
            d->page_cap = cap; /* the sizes free_page_arrays subtracts */
            free_page_arrays(d);
            return e;
        }
        d->page_cap = cap;
    }
    const size_t row_floats = (size_t)d->n_heads * 2 * CHUNK_PAGES * (size_t)d->hd;
    if (d->rows_tokens != P) {
        release(d, &d->rows, row_floats * (size_t)d->rows_tokens);
        d->rows_tokens = 0;
        if ((e = alloc(d, &d->rows, row_floats * (size_t)P)) != cudaSuccess) return e;
        d->rows_tokens = P;
    }
    if (!d->state) e = alloc(d, &d->state, (size_t)d->n_heads * (2 + d->hd));
    return e;
}

/* The mirror of layer l made to hold pages 0..pages-1 of seq. */
static cudaError_t refresh(mim_quest_dev *d, const mi_kv_seq *seq, int l, int64_t pages,
                           cudaStream_t stream, char *err, size_t err_size) {
    page_key *keys = d->keys + (int64_t)l * d->page_cap;
    /* the previous list may still be on its way to the device */
    cudaError_t e = cudaEventSynchronize(d->jobs_read);
    if (e != cudaSuccess) return fail(err, err_size, e, "quest: page list");
    int64_t n = 0;
    for (int64_t p = 0; p < pages; p++) {
        mi_kv_page_view v;
        if (mi_kv_seq_page(seq, l, p, &v) != MI_STATUS_SUCCESS || !v.key_minmax)
            return fail(err, err_size, cudaErrorInvalidValue,
                        "quest: layer %d page %lld unreadable", l, (long long)p);
        page_key *k = &keys[p];
        if (k->id == v.page_id && k->version == v.version && k->meta_rows == v.meta_rows) continue;
        if (n == d->jobs_cap) {
            const int64_t cap = d->jobs_cap ? 2 * d->jobs_cap : 1024;
            mirror_job *h = NULL, *dv = NULL;
            if ((e = cudaMallocHost((void **)&h, (size_t)cap * sizeof(*h))) != cudaSuccess ||
                (e = cudaMalloc((void **)&dv, (size_t)cap * sizeof(*dv))) != cudaSuccess) {
                if (h) cudaFreeHost(h);
                for (int64_t i = 0; i < n; i++)
                    keys[d->jobs_host[i].index - (int64_t)l * d->page_cap].id = -1;
                return fail(err, err_size, e, "quest: page list of %lld", (long long)cap);
            }
            if (n) memcpy(h, d->jobs_host, (size_t)n * sizeof(*h));
            if (d->jobs_host) cudaFreeHost(d->jobs_host);
            cudaFree(d->jobs_dev);
            d->bytes += (size_t)(cap - d->jobs_cap) * sizeof(*h);
            d->jobs_host = h, d->jobs_dev = dv, d->jobs_cap = cap;
        }
        d->jobs_host[n].meta = v.key_minmax;
        d->jobs_host[n].page = (const unsigned char *)v.data;
        d->jobs_host[n].index = (int64_t)l * d->page_cap + p;
        n++;
        k->id = v.page_id, k->version = v.version, k->meta_rows = v.meta_rows;
    }
    if (n == 0) return cudaSuccess;
    e = cudaMemcpyAsync(d->jobs_dev, d->jobs_host, (size_t)n * sizeof(mirror_job),
                        cudaMemcpyHostToDevice, stream);
    if (e == cudaSuccess) e = cudaEventRecord(d->jobs_read, stream);
    if (e == cudaSuccess)
        mirror_kernel<<<(unsigned)n, 256, 0, stream>>>(d->jobs_dev, d->n_kv * 2 * d->hd, d->meta,
                                                       d->pages);
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e != cudaSuccess) {
        for (int64_t i = 0; i < n; i++)
            keys[d->jobs_host[i].index - (int64_t)l * d->page_cap].id = -1;
        return fail(err, err_size, e, "quest: refreshing layer %d's bounds", l);
    }
    return cudaSuccess;
}

template <int KIND>
static void gather(const mim_quest_dev *d, int l, int64_t t0, int cnt, const page_geom &g, int P,
                   int64_t rows, cudaStream_t stream) {
    const dim3 grid((unsigned)cnt, (unsigned)d->n_heads, 2);
    gather_kernel<KIND><<<grid, 128, 0, stream>>>(d->sel, t0, d->page_cap,
                                                  d->pages + (int64_t)l * d->page_cap, g,
                                                  d->n_heads / d->n_kv, P, rows, d->rows);
}

cudaError_t mim_quest_dev_attend(mim_quest_dev *d, const mi_kv_seq *seq, int layer, int64_t rows,
                                 int64_t budget, bool all, const bf16 *q, float scale, bf16 *out,
                                 cudaStream_t stream, char *err, size_t err_size) {
    mi_kv_page_layout lay;
    const mi_kv_pool *pool = mi_kv_seq_pool(seq);
    if (mi_kv_pool_layout(pool, &lay) != MI_STATUS_SUCCESS ||
        !mim_quest_dev_readable(&lay, d->n_kv, d->hd) || d->n_heads % d->n_kv != 0 ||
        d->n_heads / d->n_kv > MAX_GROUP || rows <= 0)
        return fail(err, err_size, cudaErrorInvalidValue, "quest: pages the device cannot read");
    const int P = lay.page_tokens, group = d->n_heads / d->n_kv;
    const int64_t pages = (rows + P - 1) / P;
    cudaError_t e = ensure(d, pool, P, pages);
    if (e != cudaSuccess)
        return fail(err, err_size, e, "quest: device memory for %lld pages", (long long)pages);
    if ((e = refresh(d, seq, layer, pages, stream, err, err_size)) != cudaSuccess) return e;
    const int64_t k = all ? pages : kv_quest_pages(budget, P, pages);
    const float *meta = d->meta + (int64_t)layer * d->page_cap * d->n_kv * 2 * d->hd;
    if (k >= pages) {
        iota_kernel<<<dim3((unsigned)((pages + 255) / 256), (unsigned)d->n_heads), 256, 0,
                      stream>>>(d->sel, pages, d->page_cap);
    } else {
        const dim3 grid((unsigned)((pages + BOUND_THREADS - 1) / BOUND_THREADS), (unsigned)d->n_kv);
        if (group == 1)
            bounds_kernel<1><<<grid, BOUND_THREADS, 0, stream>>>(q, meta, pages, d->n_kv, d->hd,
                                                                 group, d->bounds, d->page_cap);
        else if (group == 2)
            bounds_kernel<2><<<grid, BOUND_THREADS, 0, stream>>>(q, meta, pages, d->n_kv, d->hd,
                                                                 group, d->bounds, d->page_cap);
        else
            bounds_kernel<4><<<grid, BOUND_THREADS, 0, stream>>>(q, meta, pages, d->n_kv, d->hd,
                                                                 group, d->bounds, d->page_cap);
        select_kernel<<<(unsigned)d->n_heads, SELECT_THREADS, 0, stream>>>(d->bounds, pages, k,
                                                                           d->page_cap, d->sel);
    }
    if ((e = cudaGetLastError()) != cudaSuccess)
        return fail(err, err_size, e, "quest: page selection");
    const page_geom g = page_geom_of(&lay);
    const size_t smem = (size_t)(MAX_HD + CHUNK_PAGES * P + ATTEND_THREADS + 32) * sizeof(float);
    static bool smem_set = false; /* the attribute is per function, for every device alike */
    if (!smem_set) {
        e = cudaFuncSetAttribute(attend_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 200 * 1024);
        if (e != cudaSuccess) return fail(err, err_size, e, "quest: attention's shared memory");
        smem_set = true;
    }
    if (smem > 200 * 1024)
        return fail(err, err_size, cudaErrorInvalidValue, "quest: %d-token pages", P);
    for (int64_t t0 = 0; t0 < k; t0 += CHUNK_PAGES) {
        const int cnt = (int)(k - t0 < CHUNK_PAGES ? k - t0 : CHUNK_PAGES);
        switch (lay.dtype) {
        case MI_KV_F32: gather<MI_KV_F32>(d, layer, t0, cnt, g, P, rows, stream); break;
        case MI_KV_BF16: gather<MI_KV_BF16>(d, layer, t0, cnt, g, P, rows, stream); break;
        case MI_KV_F16: gather<MI_KV_F16>(d, layer, t0, cnt, g, P, rows, stream); break;
        default: gather<MI_KV_FP8_E4M3>(d, layer, t0, cnt, g, P, rows, stream); break;
        }
        attend_kernel<<<(unsigned)d->n_heads, ATTEND_THREADS, smem, stream>>>(
            q, d->sel, t0, cnt, d->page_cap, P, rows, d->hd, scale, d->rows, d->state, t0 == 0,
            t0 + CHUNK_PAGES >= k, out);
        if ((e = cudaGetLastError()) != cudaSuccess)
            return fail(err, err_size, e, "quest: attention");
    }
    return cudaSuccess;
}
