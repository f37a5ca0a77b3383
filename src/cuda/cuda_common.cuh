/*
 * cuda_common.cuh: what every CUDA kernel of the backend shares: dtype traits, the sm_80
 * tensor-core primitives (mma.sync m16n8k16, ldmatrix, cp.async) and error plumbing.
 */
#ifndef MI_CUDA_COMMON_CUH
#define MI_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_kernels.h"

#define MI_LOG2E 1.4426950408889634f
#define MI_LN2 0.6931471805599453f

/* Sentinel key position for "no key here": larger than any row, so the causal test drops it. */
#define MI_NO_KEY 0x7fffffff

namespace mi_cuda {

template <typename T> struct dtype_traits;
template <> struct dtype_traits<__nv_bfloat16> {
    static constexpr bool is_bf16 = true;
    __device__ static inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
    __device__ static inline __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
    /* Two floats packed into one 32-bit register in the mma operand layout (low = first). */
    __device__ static inline uint32_t pack2(float a, float b) {
        __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&v);
    }
};
template <> struct dtype_traits<__half> {
    static constexpr bool is_bf16 = false;
    __device__ static inline float to_float(__half x) { return __half2float(x); }
    __device__ static inline __half from_float(float x) { return __float2half_rn(x); }
    __device__ static inline uint32_t pack2(float a, float b) {
        __half2 v = __floats2half2_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&v);
    }
};

/* D[16x8] += A[16x16] * B[16x8], fp32 accumulate. */
template <typename T>
__device__ __forceinline__ void mma_16816(float *d, const uint32_t *a, const uint32_t *b) {
    if constexpr (dtype_traits<T>::is_bf16) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
}

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t *r, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t *r, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

/* 16-byte async copy; src_bytes = 0 zero-fills the destination (used for keys that do not exist,
 * so that masked probabilities never meet garbage V values). */
__device__ __forceinline__ void cp_async_16(void *dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(src_bytes));
}
/* The same with the shared-memory address already in the shared window (saves the conversion,
 * which the compiler may otherwise redo at every copy). */
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* Stores v (16 bytes; 4 bytes) at p where pred holds, as one predicated instruction: a store
 * under a C branch compiles to a branch and a convergence barrier around it. */
__device__ __forceinline__ void st_global_v4_if(bool pred, void *p, uint4 v) {
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %0, 0;\n\t"
                 "@q st.global.v4.b32 [%1], {%2, %3, %4, %5};\n\t}\n" ::"r"((int)pred),
                 "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}
__device__ __forceinline__ void st_global_if(bool pred, void *p, uint32_t v) {
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %0, 0;\n\t"
                 "@q st.global.b32 [%1], %2;\n\t}\n" ::"r"((int)pred),
                 "l"(p), "r"(v)
                 : "memory");
}

/* The sum of v over the four lanes that hold one accumulator row (lanes 4g .. 4g+3). */
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

__device__ __forceinline__ float warp_max_xor(float v, int lane_mask) {
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, lane_mask));
}

/* The mode of head h: its own in a launch of mixed heads, else the launch's. */
__host__ __device__ __forceinline__ mi_cuda_head_mode head_mode_of(const mi_cuda_attn_params &p,
                                                                   int h) {
    return p.use_head_modes ? p.head_modes[h] : p.mode;
}

} // namespace mi_cuda

/* Host-side helpers (cuda_backend.cu). */
extern "C" mi_status mi_cuda_check_launch(mi_context *ctx, const char *what);
extern "C" int mi_cuda_sm_count(void);
/* The most shared memory one CTA of the current device may have (its opt-in limit), 0 if unknown. */
extern "C" int mi_cuda_smem_per_block(void);
/* Hopper path (attn_fwd_sm90.cu): built for sm_90a and a compute capability 9.0 device. */
extern "C" int mi_cuda_sm90_usable(void);
/* Whether a context's launches take the Hopper kernels: usable, and not switched off by its
 * tuning (mi_tuning.sm90 = -1). */
static inline bool mi_cuda_sm90_on(const mi_tuning &t) {
    return t.sm90 >= 0 && mi_cuda_sm90_usable();
}
/* The sm_90a kernels for a launch: the dense or the sparse warp-specialised kernel where they
 * apply (and the tuning t lets them), the ring kernel (every mode in 64-row blocks) for the rest
 * (attn_fwd_sm90.cu). */
extern "C" cudaError_t mi_cuda_attn_sm90_launch(const mi_cuda_attn_params *p, const mi_tuning *t,
                                                cudaStream_t st);
/* The warp-specialised dense kernel (attn_dense_sm90.cu) where it applies, for every head of a
 * uniform dense launch or (n_listed > 0) for the heads listed; *used = 0 otherwise. */
extern "C" cudaError_t mi_cuda_attn_sm90_dense_launch(const mi_cuda_attn_params *p,
                                                      const int16_t *listed, int n_listed,
                                                      const mi_tuning *t, cudaStream_t st,
                                                      int *used);
/* The warp-specialised sparse kernel (attn_sparse_sm90.cu) where it applies, for the heads it
 * picks on the device; *used = 0 where it does not apply. With *used = 1, *taken is a
 * stream-ordered device buffer that flags the heads it ran (mi_cuda_attn_params.sm90_taken), for
 * the ring kernel that runs the others, to be freed with cudaFreeAsync after that launch. */
extern "C" cudaError_t mi_cuda_attn_sm90_sparse_launch(const mi_cuda_attn_params *p,
                                                       const mi_tuning *t, cudaStream_t st,
                                                       int *used, int32_t **taken);

static inline cudaStream_t mi_stream(const mi_context *ctx) {
    return reinterpret_cast<cudaStream_t>(ctx->stream);
}

#endif /* MI_CUDA_COMMON_CUH */
