/*
 * rowmask.cu: the dilated and strided patterns on the GPU (CPU reference: src/cpu/rowmask.c, whose
 * mi_cpu_rowmask_keys defines each row's keys). Both are one rule here: the sinks [0, n_init),
 * every key at a distance d < dense from the row, and the distances dense, dense + s, ... below
 * span (strided: no sinks, dense = s = the period, span the whole sequence).
 *
 * rm_mma_kernel (mma.sync): a CTA takes 64 rows rs apart, whose keys are three arithmetic
 * progressions (the sinks, the hull of their dense windows, the hull of their dilated keys, which
 * rows s apart share), walked in 64-key tiles under a per-row distance mask. With the tuning's
 * rowmask_two_pass, where the windows are wide against s (strided), a head runs in two passes:
 * sinks and windows over consecutive rows, then the dilated keys over rows s apart, folded into
 * the first pass's out and lse rows (a scratch lse where the caller has none). Only rowmask heads that do not run dense at their
 * sequence's length are written: rows in [len, L) zeros and lse -inf, the others softmax in fp32
 * with the max shift (base 2 inside, natural-log lse out). Entry point: mi_cuda_rowmask_run.
 */
#include "cuda_common.cuh"
#include "rowmask_plan.cuh"

#include <math.h>
#include <string.h>

namespace mi_cuda {

struct rm_params {
    const void *q, *k, *v;
    void *o;
    float *lse; /* [B, H, len - q_off] or NULL (no head folds) */
    int64_t q_stride[3], k_stride[3], v_stride[3], o_stride[3];
    int32_t heads, group, len, q_off;
    float scale_log2;
    int32_t seq_lens[MI_CUDA_MAX_BATCH];
    rm_head head[MI_CUDA_MAX_HEADS]; /* this launch's heads, blockIdx.y */
};

/* Folds an earlier pass's result for a row (prev: its normalised output, lse_prev natural log)
 * into this pass's state: this lane's columns acc[i][e0], acc[i][e0 + 1] of the row and the
 * row's max m and sum l (base 2, l summed over the quad). */
template <typename T, int D>
__device__ __forceinline__ void rm_fold(const T *prev, float lse_prev, int cq, float (*acc)[4],
                                        int e0, float &m, float &l) {
    const float la = lse_prev * MI_LOG2E, mx = fmaxf(la, m);
    if (mx == -INFINITY) return; /* neither pass kept a key */
    const float wa = exp2f(la - mx), eb = exp2f(m - mx);
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
        const uint32_t w = *reinterpret_cast<const uint32_t *>(prev + 8 * i + 2 * cq);
        float2 x;
        if constexpr (dtype_traits<T>::is_bf16)
            x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&w));
        else
            x = __half22float2(*reinterpret_cast<const __half2 *>(&w));
        acc[i][e0] = acc[i][e0] * eb + wa * x.x;
        acc[i][e0 + 1] = acc[i][e0 + 1] * eb + wa * x.y;
    }
    l = l * eb + wa;
    m = mx;
}

/* 64 rows rs apart against the tiles of their segments (the parts hd.parts names); the sm_80
 * attention kernel's tile step (attn_fwd.cu), with the mask from the distance rule. */
template <typename T, int D>
__global__ void __launch_bounds__(RM_NT) rm_mma_kernel(const __grid_constant__ rm_params p) {
    constexpr int PITCH = D + 8; /* +16 bytes a row: ldmatrix rows land on distinct banks */
    constexpr int CPR = D / 8;   /* 16-byte chunks per row */
    using tr = dtype_traits<T>;
    const rm_head &hd = p.head[blockIdx.y];
    const int b = blockIdx.z, len = p.seq_lens[b];
    if ((hd.dense_below > 0 && len < hd.dense_below) || (int)blockIdx.x >= hd.groups) return;
    const int rs = hd.rs, p0 = rm_first_row(p.q_off, hd, blockIdx.x, RM_BM);
    if (p0 >= p.len) return;
    /* rows i < n_rows exist (p0 + i rs < L), rows i < n_live are in the sequence */
    const int n_rows = min(RM_BM, (p.len - 1 - p0) / rs + 1);
    const int n_live = p0 < len ? min(n_rows, (len - 1 - p0) / rs + 1) : 0;
    rm_seg sg[3] = {};
    if (n_live > 0) rm_segments(hd, p0, p0 + (n_live - 1) * rs, sg);
    if (!(hd.parts & 1)) sg[0].count = sg[1].count = 0;
    if (!(hd.parts & 2)) sg[2].count = 0;
    const int n_tiles = n_live > 0 ? rm_tiles(sg) : 0;
    if (hd.fold && n_tiles == 0) return; /* the first pass's rows are final */
    /* a second pass writes the live rows only: the first wrote the others */
    const int n_out = hd.fold ? n_live : n_rows;

    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *qs = reinterpret_cast<T *>(smem_raw);
    T *ks = qs + RM_BM * PITCH;     /* [2][RM_BN][PITCH] */
    T *vs = ks + 2 * RM_BN * PITCH; /* [2][RM_BN][PITCH] */

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int h = hd.h, hk = h / p.group;
    const T *qg = static_cast<const T *>(p.q) + b * p.q_stride[0] + h * p.q_stride[1];
    const T *kg = static_cast<const T *>(p.k) + b * p.k_stride[0] + hk * p.k_stride[1];
    const T *vg = static_cast<const T *>(p.v) + b * p.v_stride[0] + hk * p.v_stride[1];
    T *og = static_cast<T *>(p.o) + b * p.o_stride[0] + h * p.o_stride[1];
    float *lseg = p.lse ? p.lse + ((int64_t)b * p.heads + h) * (p.len - p.q_off) : nullptr;

    for (int i = tid; i < RM_BM * CPR; i += RM_NT) {
        const int r = i / CPR, c = i % CPR;
        const bool ok = r < n_live;
        const T *src = qg + (int64_t)(ok ? p0 + r * rs - p.q_off : 0) * p.q_stride[2] + c * 8;
        cp_async_16(qs + r * PITCH + c * 8, src, ok ? 16 : 0);
    }
    auto load_kv = [&](int t, int buf) {
        const rm_seg ts = rm_tile(sg, t);
        T *kd = ks + buf * RM_BN * PITCH;
        T *vd = vs + buf * RM_BN * PITCH;
#pragma unroll
        for (int i = tid; i < RM_BN * CPR; i += RM_NT) {
            const int r = i / CPR, c = i % CPR;
            const bool ok = r < ts.count; /* zeros past the segment: no garbage meets P = 0 */
            const int64_t row = ok ? ts.key0 + r * ts.step : 0;
            cp_async_16(kd + r * PITCH + c * 8, kg + row * p.k_stride[2] + c * 8, ok ? 16 : 0);
            cp_async_16(vd + r * PITCH + c * 8, vg + row * p.v_stride[2] + c * 8, ok ? 16 : 0);
        }
    };
    if (n_tiles > 0) load_kv(0, 0);
    cp_async_commit();

    /* this warp's rows w0 .. w0 + 15; per thread rows w0 + g and w0 + g + 8 (clamped to the last
     * live row: the others' results are never written, and their positions may not fit an int) */
    const int w0 = warp * 16, g = lane / 4, cq = lane % 4, last = max(n_live - 1, 0);
    const bool wlive = w0 < n_live;
    const int wlo = p0 + min(w0, last) * rs, whi = p0 + min(w0 + 15, last) * rs;
    const int prow0 = p0 + min(w0 + g, last) * rs, prow1 = p0 + min(w0 + g + 8, last) * rs;
    float acc_o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) acc_o[i][0] = acc_o[i][1] = acc_o[i][2] = acc_o[i][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    uint32_t qf[D / 16][4];

    for (int t = 0; t < n_tiles; ++t) {
        const int buf = t & 1;
        if (t + 1 < n_tiles) {
            load_kv(t + 1, buf ^ 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (t == 0) {
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                const int r = w0 + (lane % 8) + 8 * ((lane / 8) % 2);
                const int c = kk * 16 + 8 * (lane / 16);
                ldmatrix_x4(qf[kk], qs + r * PITCH + c);
            }
        }
        const rm_seg ts = rm_tile(sg, t);
        const bool any = wlive && rm_tile_any(ts, wlo, whi);
        const bool full = rm_tile_full(ts, wlo, whi);
        if (any) {
            const T *kb = ks + buf * RM_BN * PITCH;
            const T *vb = vs + buf * RM_BN * PITCH;

            /* S = Q K^T, 16 x 64 per warp */
            float s[8][4];
#pragma unroll
            for (int i = 0; i < 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    uint32_t bfr[4];
                    const int key = 16 * j + (lane % 8) + 8 * (lane / 16);
                    const int d = kk * 16 + 8 * ((lane / 8) % 2);
                    ldmatrix_x4(bfr, kb + key * PITCH + d);
                    mma_16816<T>(s[2 * j], qf[kk], bfr);
                    mma_16816<T>(s[2 * j + 1], qf[kk], bfr + 2);
                }
            }
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[j][e] *= p.scale_log2;
            if (!full) {
                const int d0 = prow0 - ts.key0, d1 = prow1 - ts.key0;
#pragma unroll
                for (int j = 0; j < 8; ++j) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int col = 8 * j + 2 * cq + (e & 1);
                        if (!rm_keeps(ts, col, e < 2 ? d0 : d1)) s[j][e] = -INFINITY;
                    }
                }
            }

            /* online softmax (base 2) */
            float mx0 = m0, mx1 = m1;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
                mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
            }
            mx0 = warp_max_xor(warp_max_xor(mx0, 1), 2);
            mx1 = warp_max_xor(warp_max_xor(mx1, 1), 2);
            const float mu0 = mx0 == -INFINITY ? 0.f : mx0;
            const float mu1 = mx1 == -INFINITY ? 0.f : mx1;
            const float al0 = exp2f(m0 - mu0), al1 = exp2f(m1 - mu1);
            m0 = mx0;
            m1 = mx1;
            float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                s[j][0] = exp2f(s[j][0] - mu0);
                s[j][1] = exp2f(s[j][1] - mu0);
                s[j][2] = exp2f(s[j][2] - mu1);
                s[j][3] = exp2f(s[j][3] - mu1);
                rs0 += s[j][0] + s[j][1];
                rs1 += s[j][2] + s[j][3];
            }
            l0 = l0 * al0 + rs0;
            l1 = l1 * al1 + rs1;
#pragma unroll
            for (int i = 0; i < D / 8; ++i) {
                acc_o[i][0] *= al0;
                acc_o[i][1] *= al0;
                acc_o[i][2] *= al1;
                acc_o[i][3] *= al1;
            }

            /* O += P V */
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                uint32_t a[4];
                a[0] = tr::pack2(s[2 * kk][0], s[2 * kk][1]);
                a[1] = tr::pack2(s[2 * kk][2], s[2 * kk][3]);
                a[2] = tr::pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                a[3] = tr::pack2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
                for (int dn = 0; dn < D / 16; ++dn) {
                    uint32_t bfr[4];
                    const int key = 16 * kk + (lane % 8) + 8 * ((lane / 8) % 2);
                    const int d = 16 * dn + 8 * (lane / 16);
                    ldmatrix_x4_trans(bfr, vb + key * PITCH + d);
                    mma_16816<T>(acc_o[2 * dn], a, bfr);
                    mma_16816<T>(acc_o[2 * dn + 1], a, bfr + 2);
                }
            }
        }
        __syncthreads();
    }
    if (n_tiles == 0) { /* no tile loop: the Q copies must land before the staging below */
        cp_async_wait<0>();
        __syncthreads();
    }

    /* ---- epilogue: fold, normalise, stage through this warp's Q rows, 16-byte stores ---- */
    l0 = quad_sum(l0);
    l1 = quad_sum(l1);
    const int r0 = w0 + g, r1 = r0 + 8;
    const int64_t o0 = (int64_t)(prow0 - p.q_off) * p.o_stride[2];
    const int64_t o1 = (int64_t)(prow1 - p.q_off) * p.o_stride[2];
    if (hd.fold) { /* live rows: their first pass's output and lse are there */
        if (r0 < n_live) rm_fold<T, D>(og + o0, lseg[prow0 - p.q_off], cq, acc_o, 0, m0, l0);
        if (r1 < n_live) rm_fold<T, D>(og + o1, lseg[prow1 - p.q_off], cq, acc_o, 2, m1, l1);
    }
    const bool live0 = r0 < n_live && l0 > 0.f, live1 = r1 < n_live && l1 > 0.f;
    const float inv0 = live0 ? 1.f / l0 : 0.f, inv1 = live1 ? 1.f / l1 : 0.f;
    T *stage = qs + w0 * PITCH;
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
        const int c = 8 * i + 2 * cq;
        *reinterpret_cast<uint32_t *>(stage + g * PITCH + c) =
            tr::pack2(acc_o[i][0] * inv0, acc_o[i][1] * inv0);
        *reinterpret_cast<uint32_t *>(stage + (g + 8) * PITCH + c) =
            tr::pack2(acc_o[i][2] * inv1, acc_o[i][3] * inv1);
    }
    if (lseg && cq == 0) {
        if (r0 < n_out) lseg[p0 + r0 * rs - p.q_off] = live0 ? m0 * MI_LN2 + logf(l0) : -INFINITY;
        if (r1 < n_out) lseg[p0 + r1 * rs - p.q_off] = live1 ? m1 * MI_LN2 + logf(l1) : -INFINITY;
    }
    __syncwarp();
    for (int i = lane; i < 16 * CPR; i += 32) {
        const int r = i / CPR, c = i % CPR;
        if (w0 + r < n_out)
            *reinterpret_cast<uint4 *>(
                og + (int64_t)(p0 + (w0 + r) * rs - p.q_off) * p.o_stride[2] + c * 8) =
                *reinterpret_cast<const uint4 *>(stage + r * PITCH + c * 8);
    }
}

template <typename T, int D>
static cudaError_t rm_launch(const rm_params &p, int n_heads, int grid_x, int64_t batch,
                             cudaStream_t st) {
    const size_t smem = (size_t)(RM_BM + 4 * RM_BN) * (D + 8) * sizeof(T);
    auto kern = rm_mma_kernel<T, D>;
    const cudaError_t e =
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    kern<<<dim3((unsigned)grid_x, (unsigned)n_heads, (unsigned)batch), RM_NT, smem, st>>>(p);
    return cudaGetLastError();
}

} // namespace mi_cuda

using namespace mi_cuda;

extern "C" mi_status mi_cuda_rowmask_run(mi_context *ctx, const mi_attn_shape *s,
                                         const mi_tensor *q, const mi_tensor *k, const mi_tensor *v,
                                         const int32_t *seq_lens, const struct mi_head_plan *heads,
                                         float scale, mi_tensor *out, float *lse) {
    const int64_t L = s->len, Lq = s->len - s->q_off, B = s->batch, H = s->heads_q;
    /* the heads with a (b, h) to compute */
    auto needed = [&](int64_t h) {
        if (heads[h].kernel != MI_PLAN_KERNEL_ROWMASK) return false;
        for (int64_t b = 0; b < B; ++b)
            if (!mi_head_plan_dense_at(&heads[h], mi_seq_len(seq_lens, b, L))) return true;
        return false;
    };
    bool any = false;
    for (int64_t h = 0; h < H && !any; ++h) any = needed(h);
    if (!any || Lq <= 0 || B <= 0) return MI_STATUS_SUCCESS;
    mi_cuda_attn_params ap;
    mi_status st = mi_cuda_fill_attn_params(ctx, s, q, k, v, out, seq_lens, scale, lse, &ap);
    if (st != MI_STATUS_SUCCESS) return st;

    static thread_local rm_params p[2]; /* the two passes' launches, 10 KB each: off the stack */
    memset(&p[0], 0, sizeof(p[0]));
    p[0].q = ap.q, p[0].k = ap.k, p[0].v = ap.v, p[0].o = ap.o, p[0].lse = lse;
    memcpy(p[0].q_stride, ap.q_stride, sizeof(p[0].q_stride));
    memcpy(p[0].k_stride, ap.k_stride, sizeof(p[0].k_stride));
    memcpy(p[0].v_stride, ap.v_stride, sizeof(p[0].v_stride));
    memcpy(p[0].o_stride, ap.o_stride, sizeof(p[0].o_stride));
    p[0].heads = ap.heads, p[0].group = ap.group, p[0].len = ap.len, p[0].q_off = ap.q_off;
    p[0].scale_log2 = ap.scale_log2;
    memcpy(p[0].seq_lens, ap.seq_lens, sizeof(p[0].seq_lens));
    p[1] = p[0];
    int n[2] = {0, 0};
    int64_t grid_x[2] = {0, 0};
    auto add = [&](int pass, rm_head hd, int32_t rs, int32_t parts) {
        hd.rs = rs;
        hd.parts = parts;
        hd.fold = pass;
        hd.groups = (int32_t)rm_ctas(Lq, rs);
        if (hd.groups > grid_x[pass]) grid_x[pass] = hd.groups;
        p[pass].head[n[pass]++] = hd;
    };
    for (int64_t h = 0; h < H; ++h) {
        if (!needed(h)) continue;
        const rm_head hd = rm_head_of(heads[h], h, L);
        if (ctx->tuning.rowmask_two_pass > 0 && rm_two_passes(hd, L, Lq)) {
            add(0, hd, 1, 1);
            add(1, hd, hd.step, 2);
        } else {
            /* rows s apart share their dilated keys; without any, consecutive rows share more */
            add(0, hd, hd.span > hd.dense ? hd.step : 1, 3);
        }
    }
    cudaStream_t stream = mi_stream(ctx);
    cudaError_t e = cudaSuccess;
    void *scratch = nullptr; /* the first pass's lse where the caller takes none */
    if (n[1] > 0 && lse == nullptr) {
        e = cudaMallocAsync(&scratch, (size_t)(B * H * Lq) * sizeof(float), stream);
        p[0].lse = p[1].lse = static_cast<float *>(scratch);
    }
    const bool bf = s->dtype == MI_DTYPE_BF16, d64 = s->head_dim == 64;
    for (int pass = 0; pass < 2 && e == cudaSuccess; ++pass) {
        if (n[pass] == 0) continue;
        const int gx = (int)grid_x[pass];
        if (bf)
            e = d64 ? rm_launch<__nv_bfloat16, 64>(p[pass], n[pass], gx, B, stream)
                    : rm_launch<__nv_bfloat16, 128>(p[pass], n[pass], gx, B, stream);
        else
            e = d64 ? rm_launch<__half, 64>(p[pass], n[pass], gx, B, stream)
                    : rm_launch<__half, 128>(p[pass], n[pass], gx, B, stream);
    }
    if (scratch) {
        const cudaError_t f = cudaFreeAsync(scratch, stream);
        if (e == cudaSuccess) e = f;
    }
    if (e != cudaSuccess)
        return mi_fail(ctx, MI_STATUS_DEVICE_ERROR, "CUDA dilated/strided attention: %s",
                       cudaGetErrorString(e));
    return MI_STATUS_SUCCESS;
}
