/*
 * cta_reduce.cuh: whole-CTA reductions and scans of NT threads (a multiple of 32) for the
 * selection kernels. Every thread of the CTA must call them (they synchronise it); each returns
 * the result to every thread.
 */
#ifndef MI_CTA_REDUCE_CUH
#define MI_CTA_REDUCE_CUH

#include <stdint.h>

namespace mi_cuda {

/* The CTA's sum of v; red: NT / 32 doubles of shared memory. */
template <int NT> __device__ __forceinline__ double cta_sum(double v, double *red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    double t = 0.0;
    for (int w = 0; w < NT / 32; w++) t += red[w];
    return t;
}

/* The CTA's maximum of v; red: NT / 32 words of shared memory. */
template <int NT> __device__ __forceinline__ uint32_t cta_max(uint32_t v, uint32_t *red) {
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    uint32_t t = 0;
    for (int w = 0; w < NT / 32; w++) t = max(t, red[w]);
    return t;
}

/* The CTA's sum of integer counts; red: NT / 32 words of shared memory. */
template <int NT> __device__ __forceinline__ int64_t cta_count(int64_t v, int64_t *red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    int64_t t = 0;
    for (int w = 0; w < NT / 32; w++) t += red[w];
    return t;
}

/* Exclusive prefix of each thread's count in thread order into *out; returns the total.
 * scan: NT + 1 ints of shared memory. */
template <int NT> __device__ __forceinline__ int cta_scan(int v, int *scan, int *out) {
    __syncthreads();
    scan[threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        int run = 0;
        for (int t = 0; t < NT; t++) {
            const int c = scan[t];
            scan[t] = run;
            run += c;
        }
        scan[NT] = run;
    }
    __syncthreads();
    *out = scan[threadIdx.x];
    return scan[NT];
}

} // namespace mi_cuda

#endif /* MI_CTA_REDUCE_CUH */
