/*
 * l2_bandwidth.cu: how fast the SMs of this GPU can fill shared memory from L2 (and from DRAM),
 * with the load patterns of the attention kernels and no arithmetic: the ceiling on a kernel
 * whose every K/V tile is loaded for the query rows of one CTA.
 *
 * A 64-row block that computes 64 keys loads K and V (2 x 64 x 128 x 2 B = 32 KB) for 2.1 MFLOP
 * (64 x 64 x 128 x 4): 64 FLOP per byte. So a kernel whose CTAs each load their own tiles (the
 * ring kernel; any kernel on a sparse index whose 64-row blocks share no ranges, such as
 * scattered diagonals) cannot exceed 64 FLOP/B x this bandwidth, and one whose tiles serve 128
 * rows (the warp-specialised kernels' shared tiles) 128 FLOP/B x it. The program prints both.
 *
 *   bench_l2_bandwidth [--json OUT] [--gpu NAME] [--commit SHA]
 *
 * Patterns (each thread block streams tiles of a buffer at spread-out positions):
 *   ring   128 threads, 3 CTAs per SM, three 16 KB slots, cp.async 16 B per thread, one
 *          __syncthreads per tile, two tiles in flight (the ring kernel's loads);
 *   deep   256 threads, 1 CTA per SM, four 32 KB stages, cp.async, three stages in flight;
 *   bulk   1 CTA per SM, four 32 KB stages, one thread issuing cp.async.bulk (the TMA engine)
 *          on mbarriers, three stages in flight (the warp-specialised kernels' producer).
 * Buffers: 16 MB (resident in L2, 60 MB on an H200, once warm) and 2 GB (DRAM). Time: CUDA events,
 * median of 7 launches after a warm-up.
 */
#include "sm90_common.cuh"

#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

namespace {

/* Tile i of block b: spread over the buffer so that concurrent blocks read different lines. */
__device__ __forceinline__ size_t tile_at(int b, int i, int grid, size_t ntiles) {
    return ((size_t)b * 7919u + (size_t)i * grid) % ntiles;
}

/* cp.async: THREADS threads copy a TILE-byte tile 16 B each per pass into slot i % SLOTS, with
 * IN_FLIGHT tiles outstanding and a __syncthreads per tile. ring = <128, 16384, 3, 2> (three per
 * SM), deep = <256, 32768, 4, 4>. */
template <int THREADS, int TILE, int SLOTS, int IN_FLIGHT>
__global__ void __launch_bounds__(THREADS)
    copy_kernel(const unsigned char *buf, size_t ntiles, int iters, int *sink) {
#ifdef MI_SM90_DEVICE
    extern __shared__ __align__(128) unsigned char sm[];
    constexpr int PASSES = TILE / (16 * THREADS);
    const int tid = threadIdx.x;
    for (int i = 0; i < iters; ++i) {
        const unsigned char *src = buf + tile_at(blockIdx.x, i, gridDim.x, ntiles) * TILE;
        unsigned char *dst = sm + (i % SLOTS) * TILE;
#pragma unroll
        for (int c = 0; c < PASSES; ++c)
            mi_cuda::cp_async_16(dst + (c * THREADS + tid) * 16, src + (c * THREADS + tid) * 16,
                                 16);
        mi_cuda::cp_async_commit();
        mi_cuda::cp_async_wait<IN_FLIGHT - 1>();
        __syncthreads();
    }
    mi_cuda::cp_async_wait<0>();
    __syncthreads();
    if (tid == 0 && sm[1] == 255 && sm[TILE + 7] == 255) atomicAdd(sink, 1); /* keep the loads */
#endif
}

/* bulk: one thread, cp.async.bulk of 32 KB per stage completing on the stage's mbarrier. */
__global__ void __launch_bounds__(32, 1)
    bulk_kernel(const unsigned char *buf, size_t ntiles, int iters, int *sink) {
#ifdef MI_SM90_DEVICE
    extern __shared__ __align__(128) unsigned char sm[];
    constexpr int TILE = 32768, STAGES = 4;
    __shared__ __align__(8) uint64_t full[STAGES];
    if (threadIdx.x != 0) return;
    for (int s = 0; s < STAGES; ++s) mi_cuda::mbar_init(full + s, 1);
    mi_cuda::fence_mbarrier_init();
    auto issue = [&](int i) {
        const unsigned char *src = buf + tile_at(blockIdx.x, i, gridDim.x, ntiles) * TILE;
        uint64_t *bar = full + i % STAGES;
        mi_cuda::mbar_expect_tx(bar, TILE);
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                     " [%0], [%1], %2, [%3];\n" ::"r"(mi_cuda::smem_addr(sm + (i % STAGES) * TILE)),
                     "l"(src), "r"(TILE), "r"(mi_cuda::smem_addr(bar))
                     : "memory");
    };
    for (int i = 0; i < STAGES - 1 && i < iters; ++i) issue(i);
    for (int i = 0; i < iters; ++i) {
        while (!mi_cuda::mbar_try_wait(full + i % STAGES, (i / STAGES) & 1)) {
        }
        if (i + STAGES - 1 < iters) issue(i + STAGES - 1);
    }
    if (sm[1] == 255 && sm[TILE + 7] == 255) atomicAdd(sink, 1);
#endif
}

struct pattern {
    const char *name;
    void (*kern)(const unsigned char *, size_t, int, int *);
    int threads, ctas_per_sm, tile, smem;
};

} // namespace

int main(int argc, char **argv) {
    const char *json = nullptr, *gpu = nullptr, *commit = nullptr;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json = argv[++i];
        else if (!strcmp(argv[i], "--gpu") && i + 1 < argc)
            gpu = argv[++i];
        else if (!strcmp(argv[i], "--commit") && i + 1 < argc)
            commit = argv[++i];
        else {
            const bool help = !strcmp(argv[i], "--help");
            fprintf(help ? stdout : stderr,
                    "usage: bench_l2_bandwidth [--json OUT] [--gpu NAME] [--commit SHA]\n");
            return help ? 0 : 2;
        }
    }
    cudaDeviceProp prop;
    const cudaError_t dev = cudaGetDeviceProperties(&prop, 0);
    if (dev != cudaSuccess) {
        fprintf(stderr, "bench_l2_bandwidth: no usable CUDA device (%s)\n",
                cudaGetErrorString(dev));
        return 1;
    }
    if (prop.major != 9 || prop.minor != 0) {
        fprintf(stderr, "bench_l2_bandwidth: needs an sm_90 GPU (this is %s, %d.%d)\n", prop.name,
                prop.major, prop.minor);
        return 1;
    }
    const int sms = prop.multiProcessorCount;
    const pattern pats[] = {{"ring", copy_kernel<128, 16384, 3, 2>, 128, 3, 16384, 3 * 16384},
                            {"deep", copy_kernel<256, 32768, 4, 4>, 256, 1, 32768, 4 * 32768},
                            {"bulk", bulk_kernel, 32, 1, 32768, 4 * 32768}};
    const size_t sizes[] = {(size_t)16 << 20, (size_t)2 << 30};
    unsigned char *buf = nullptr;
    int *sink = nullptr;
    CHECK(cudaMalloc(&buf, sizes[1]));
    CHECK(cudaMemset(buf, 1, sizes[1]));
    CHECK(cudaMalloc(&sink, sizeof(int)));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    FILE *js = json ? fopen(json, "w") : nullptr;
    if (json && !js) {
        fprintf(stderr, "bench_l2_bandwidth: cannot write %s\n", json);
        return 1;
    }
    if (js)
        fprintf(js,
                "{\n \"what\": \"shared-memory fill bandwidth from L2 and DRAM "
                "(bench/l2_bandwidth.cu)\",\n \"gpu\": \"%s\",\n \"commit\": \"%s\",\n"
                " \"sms\": %d,\n \"l2_bytes\": %d,\n \"rows\": [",
                gpu ? gpu : prop.name, commit ? commit : "unknown", sms, prop.l2CacheSize);
    printf("%-5s %8s %10s %12s %16s %17s\n", "load", "buffer", "ms", "TB/s", "roof 64 FLOP/B",
           "roof 128 FLOP/B");
    int row = 0;
    for (const size_t bytes : sizes) {
        for (const pattern &pt : pats) {
            CHECK(cudaFuncSetAttribute(pt.kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       pt.smem));
            const int grid = sms * pt.ctas_per_sm;
            const size_t ntiles = bytes / pt.tile;
            /* about 8 GB per launch: long enough to time, short enough to repeat */
            const int iters = (int)(((size_t)8 << 30) / ((size_t)grid * pt.tile));
            pt.kern<<<grid, pt.threads, pt.smem>>>(buf, ntiles, iters, sink); /* warm-up */
            CHECK(cudaGetLastError());
            std::vector<float> ms;
            for (int r = 0; r < 7; ++r) {
                CHECK(cudaEventRecord(e0));
                pt.kern<<<grid, pt.threads, pt.smem>>>(buf, ntiles, iters, sink);
                CHECK(cudaEventRecord(e1));
                CHECK(cudaEventSynchronize(e1));
                float t = 0;
                CHECK(cudaEventElapsedTime(&t, e0, e1));
                ms.push_back(t);
            }
            std::sort(ms.begin(), ms.end());
            const double t = ms[ms.size() / 2];
            const double tbs = (double)grid * iters * pt.tile / (t * 1e-3) / 1e12;
            printf("%-5s %6zu MB %10.3f %12.2f %11.0f TF/s %12.0f TF/s\n", pt.name, bytes >> 20, t,
                   tbs, 64 * tbs, 128 * tbs);
            if (js)
                fprintf(js,
                        "%s\n  {\"load\": \"%s\", \"buffer_bytes\": %zu, \"ms\": %.4f, "
                        "\"tb_per_s\": %.3f, \"threads\": %d, \"ctas_per_sm\": %d, "
                        "\"tile_bytes\": %d, \"roof_tflops_64_flop_per_byte\": %.1f, "
                        "\"roof_tflops_128_flop_per_byte\": %.1f}",
                        row++ ? "," : "", pt.name, bytes, t, tbs, pt.threads, pt.ctas_per_sm,
                        pt.tile, 64 * tbs, 128 * tbs);
        }
    }
    if (js) {
        fprintf(js, "\n ]\n}\n");
        fclose(js);
    }
    CHECK(cudaFree(buf));
    CHECK(cudaFree(sink));
    return 0;
}
