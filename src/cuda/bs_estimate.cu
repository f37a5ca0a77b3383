/*
 * bs_estimate.cu: block-sparse estimation (spec §3.4 with the library's fixes): 64-row mean
 * pooling of q and k over the real rows only, rounded to the input dtype; pooled scores
 * qp[m].kp[n] for n <= m, ranked at bf16 precision (bs_score_key: the upper 16 bits of each
 * score's order key, equal ones by position, lower block first, as the CPU reference), the
 * diagonal block and block 0 forced, per-row-block top-k written as ascending offsets 64*n into
 * the common mi_sparse_index form (column_count = 0).
 *
 * Three ways to select, chosen per call and head:
 * - sequences of 128K and longer (up to 1 GiB of keys and summaries a pair, 1M): through scores in
 *   memory, 16 bits a key
 *   (bs_score_wg_kernel on Hopper, else bs_score_kernel; bs_row_select_kernel; bsr_scores_on);
 * - bs_stream_kernel (top k <= 192): 64 row blocks per CTA, tensor-core scores against pooled key
 *   tiles streamed from the diagonal down, a running top k per row block in shared memory; long
 *   rows start from a lower bound of their k-th score that bs_bound_kernel computes first. With
 *   few heads, long row groups split into chunks of key tiles (bs_bound_rank_kernel and
 *   bs_merge_kernel join them).
 * - bs_select_kernel (larger top k, or GPUs without the former's shared memory): a CTA per
 *   (b, h) and up to four adjacent row blocks holds their whole score rows in shared memory and
 *   runs the selects of block_select.cuh (a histogram pass to the keys near the top, then the
 *   radix select and in-order compaction on those), so the offsets come out sorted.
 *
 * Versions (H200, top 100, ms per head at 128K x 32 heads / 1M x 1 head, random inputs):
 *   1. a CTA per row block, each thread reading a whole pooled key row, five-pass select:
 *      0.30 / 23.6
 *   2. up to four row blocks per CTA sharing each pooled key read, two-pass select: 0.11 / 4.6
 *   3. pooled vectors in the input dtype (half the reads): 0.11 / 4.2
 *   4. the streaming kernel with a radix-select compaction: 0.11 / 2.8; with a quickselect one:
 *      0.16 / 3.8 (one warp per scheduler; the compactions were ~10K instructions a tile)
 *   5. compaction by sorted samples and ranks: 0.104 / 2.2; position-coded inputs 0.077 / 1.7.
 *      352 candidate slots instead of 256: 0.16 / 2.7.
 *   6. its quickselect fallback started from the samples' bracket: 0.085 / 1.87;
 *      position-coded 0.068 / 1.54 (one round).
 *   7. a bound pass first (group maxima give each row a starting threshold), plain
 *      tiles passed over with one float compare a score, the warp select's samples read from
 *      shared memory (no local memory): 0.063 / 1.69 against 0.092 / 2.16 without the bound
 *      pass; position-coded 0.076 / 1.89 against 0.075 / 1.70. On by default: over two runs it
 *      saved 22-33 % on scattered scores and cost 1-11 % on near-diagonal ones. Without the
 *      plain-tile paths (two runs) the bound pass cost 10-29 % on near-diagonal scores: the
 *      paths stay.
 *      Measured floors (diagnostic builds, not kept): the pooled-key stream and mma.sync alone
 *      take 0.019 / 0.40 (0.59 with two passes); the appends and compactions take the rest.
 *      Four rows compacted at once by one warp (interleaved selects, 252 registers): 0.136 /
 *      3.41 without the bound pass; not kept.
 *   8. the bound pass moved to its own kernel (bs_bound_kernel: fixed slots, no
 *      appends, two CTAs an SM, compile-time group counts, 512 slots), pooling with 16-byte
 *      loads, plain tiles' n-tiles passed over one at a time: 0.044 / 1.09, position-coded
 *      0.044 / 1.08 (the previous build in the same run: 0.063 / 1.70 and 0.077 / 1.92). At
 *      1M: pooling 0.13 ms, bounds 0.30, the streaming kernel 0.63. With group counts known
 *      only at run time the bound kernel had twice the instructions (0.85 ms at 1M). Tried on
 *      the way and not kept: tile masks from the bound kernel telling each warp which tiles
 *      could hold a candidate (no measurable gain: on random and near-diagonal inputs alike
 *      some row of a warp needs nearly every tile); two-key groups in the four tiles nearest
 *      the diagonal (none either).
 *   9. 128 candidate slots a row where top k <= 104 and the CTAs outnumber the SMs, two CTAs an
 *      SM: 0.036 / 1.09, position-coded 0.045 / 1.13; 1M x 32 heads 0.67 / 0.73
 *      against 0.95 / 0.77 with 256 slots. With 128 slots at 512K x 1 (128 CTAs) position-coded
 *      went from 0.45 to 0.66, hence the CTA count rule.
 *  10. few heads at long lengths split their long row groups into chunks of key tiles
 *      (BSS_SPLIT_MAX below), merged by two small kernels: 1M x 1 0.93,
 *      position-coded 0.97 (1.07 / 1.12 unsplit in the same run); 512K x 1 0.52 against 0.59,
 *      position-coded 0.45 against 0.46, with 256 slots (128 had made it 0.52). Not kept:
 *      the chunks sharing their thresholds through the rows' bounds in memory (no gain); in
 *      plain tiles, a vote passing over each half of the warp's rows without candidates in an
 *      n-tile (the streaming kernel at 1M x 1 0.58 against 0.50 ms: the votes cost more than
 *      the keys and offsets they skipped).
 *  11. a plain tile's candidates appended at once where every row has room (append_masked in
 *      bs_stream_kernel): each key's slot from a mask of the row's passing keys, where the
 *      appends an n-tile at a time chained a vote, three shuffles and the row's count from one
 *      n-tile to the next. Streaming kernel at 1M x 1 random 0.526 -> 0.452 ms, 512K
 *      x 1 random 0.289 -> 0.267; estimate at 1M x 32 heads random 0.68 -> 0.62 ms per head;
 *      position-coded inputs 1-2 % slower (1M x 1 streaming 0.533 -> 0.542, 1M x 32 0.740 ->
 *      0.755), where tiles full of candidates near the diagonal still take the n-tile appends.
 *      With the slot stores predicated instead of branched over: random 1M x 1 0.478 (not kept).
 *  12. the bound kernel's rows of slots 16 bytes apart past their 1 KB (BSB_ROW: every slot
 *      update had been an eight-way bank conflict): bound kernel at 1M x 1 0.220 -> 0.212 ms,
 *      512K x 1 0.101 -> 0.097-0.099, in two rounds on one GPU.
 *  13. the streaming kernel's rows of candidate slots 8 bytes apart past their CAP slots
 *      (bss_cand_row: at equal counts, as after a compaction, the eight rows of a warp's lanes
 *      had appended to one bank): streaming kernel at 1M x 1 0.449-0.450 -> 0.438-0.439 ms on
 *      random inputs and 0.537-0.541 -> 0.524-0.525 on position-coded ones, in two rounds
 *      (current for two or more (b, h) pairs).
 *  14. one pair of 128K and longer through scores in memory (bs_score_kernel writes every
 *      pooled score's order key and each 16-key group's maximum; bs_row_select_kernel, a warp a
 *      row block, bounds its k-th key by the k-th largest group maximum and selects from the
 *      keys that reach it): 1M x 1 0.82 / 0.87 against 0.85 / 0.97 ms (random / position-
 *      coded), 512K x 1 0.32 / 0.40 against 0.47 / 0.43, 128K x 1 0.12 / 0.13 against 0.19 /
 *      0.19. On the way: a CTA a row with the block-wide radix select, 0.52 ms for the select
 *      at 1M (barriers); score stores straight from the mma fragments, 0.46 ms for the scores
 *      against 0.24 staged (then 0.34 with the group maxima); a warp reading only the groups
 *      that reach the bound, 0.72 against 0.35.
 *  15. group summaries (the upper 16 bits of each 16-key group's two largest keys) instead of
 *      maxima, and a select that reads only the groups whose largest key reaches the bound,
 *      eight groups a warp's 16-byte read: the k-th largest of twice as many values is a far
 *      tighter bound (at 128K the maxima's let 812 keys of a row through on average, so most
 *      rows fell back to the whole row; the summaries' 116). Select at 1M x 1 0.345 / 0.400 ->
 *      0.189 / 0.207 ms, 512K 0.151 / 0.226 -> 0.108 / 0.117, 128K 0.071 / 0.082 -> 0.047 /
 *      0.054; the scores 0.339 -> 0.360 at 1M (the top two). Estimate at 1M x 1 0.82 / 0.87 ->
 *      0.685 / 0.703 ms; scores in memory now the default at every head count from 128K on
 *      (bsr_scores_on). On the way: the same gather bounded by the k-th largest group maximum,
 *      0.220 / 0.366 at 1M but 0.090 / 0.169 at 128K (rows past BSR_WCAND); two CTAs an SM
 *      (115 registers) 0.217 / 0.238 at 1M. Then rows past BSR_WCAND raise the bound to the
 *      k-th largest key listed and list again: select at 128K 0.047 / 0.054 -> 0.041 / 0.046,
 *      512K 0.109 / 0.117 -> 0.102 / 0.113, 1M 0.189 / 0.209 -> 0.187 / 0.200 (two rounds).
 *      Then the keys' 16-byte stores written as such (a plain uint4 assignment had compiled to
 *      four 4-byte stores): scores at 1M x 1 0.360 -> 0.328 / 0.330 ms, 1M x 32 heads 11.55 ->
 *      10.41 ms; estimate at 1M x 1 0.651 / 0.667 ms, 1M x 32 18.9 / 19.4 ms for all heads
 *      against 19.2 / 23.9 streaming.
 *  16. the scores by wgmma on Hopper (bs_score_wg_kernel: the row group's pooled queries and two
 *      key tiles swizzled in shared memory, one m64n64 chain a tile, the next tile's chain running
 *      while the warps write this one's keys; ptxas serialised the chains while the issue and the
 *      wait sat in two branches on one condition), tiles before every row's diagonal without the
 *      forced-block checks, the select's bound counting only the registers that hold summaries:
 *      scores at 1M x 1 0.329 -> 0.263 (wgmma) -> 0.239 ms, 1M x 32 heads 10.4 -> 7.75; select at
 *      1M 0.187 -> 0.170, 512K 0.103 -> 0.082, 128K x 32 heads 0.589 -> 0.463 ms. Four key tiles a
 *      CTA where eight would not fill the SMs twice: 128K x 1 scores 0.016 -> 0.011. Not kept: 16
 *      or 32 tiles a CTA (0.246, 0.250 at 1M), the bound's counts over a short list of the
 *      values near the k-th (128K 0.035 -> 0.038, 1M 0.170 -> 0.169).
 *  17. the select's k-th largest of its candidates (42 % of its instructions at 1M, Nsight
 *      Compute) finished on a list of at most 32 keys, one a lane, a ballot a step: select at 1M
 *      0.170 / 0.179 -> 0.148 / 0.150 ms, 512K 0.082 / 0.089 -> 0.064 / 0.067, 128K 0.035 /
 *      0.037 -> 0.024 / 0.025, 128K x 32 heads 0.465 / 0.537 -> 0.341 / 0.371. Estimate at 1M x 1
 *      0.522 / 0.525 ms of kernels (0.544 / 0.550 per call in bench/torch_ref.py, 5.3 / 6.2 % of
 *      the block-sparse total), 1M x 32 heads 14.95 / 14.95 for all heads.
 *  18. bsr_store_tile's key and summary stores addressed once a tile and predicated (Nsight
 *      Compute put a 64-bit product and sum, a branch and a convergence barrier around every
 *      store): scores at 1M x 1 0.240 -> 0.214 ms, 512K 0.069 -> 0.061; estimate per call at 1M
 *      x 1 0.50-0.52 / 0.50-0.52 ms (5.0 / 6.0 % of the block-sparse total in
 *      bench/torch_ref.py), 1M x 32 heads 0.442-0.445 / 0.444-0.447 a head. Not kept:
 *      programmatic dependent launch between pooling, scores and select (no change: the kernels'
 *      sum was already within 0.01 ms of a call); each lane's keys stored straight from the
 *      accumulators, 8 bytes a store, without the shared-memory stage (0.219 at 1M; at four CTAs
 *      an SM, which the freed shared memory allowed, 0.261 with 132 bytes spilled).
 *  19. q and k pooled in one launch (pool_params of two tensors, blockIdx.z): pooling at 1M x 1
 *      0.134 -> 0.128 ms, 512K 0.075 -> 0.073, 128K 0.029 -> 0.021; estimate per call at 1M x 1
 *      0.51 / 0.51 ms (4.6 / 5.8 % of the block-sparse total), 512K 4.6 / 5.1 %, 128K 2.7 /
 *      2.8 %. Not kept, 16-bit keys in memory (the upper half of each order key): the wgmma
 *      scores at 1M x 1 0.212 -> 0.139 ms (mma.sync 0.266 -> 0.184), half the bytes written.
 *      (a) Every path (CPU reference included) ranking scores at that precision, ties to the
 *      lower block: estimate 0.44 ms a call at 1M x 1 (4.1-4.3 / 4.9-5.2 %), 0.3-0.7 % of the
 *      chosen blocks other than the fp32 rank's; but a CPU and a GPU sum that straddle a 16-bit
 *      boundary choose different blocks far more often than fp32 near-ties, and two structured
 *      prefill GPU tests (L4099, varlen) kept failing even on whole-number q and k, whose
 *      full-block scores should be exact on both sides: not understood. (b) The fp32 rank kept,
 *      the select recomputing with mma.sync the scores of the keys that share the k-th key's
 *      16 bits: the index stayed the streaming kernel's bit for bit, but the select took 0.210 /
 *      0.225 ms at 1M against 0.147 / 0.149, and rows with more than 512 keys at the k-th
 *      16-bit key (top 2040) still needed another answer.
 *      (bench/results/2026-12-01-gpu-bs-estimate-pool-launch.json,
 *      2026-12-01-gpu-bs-estimate-16bit-keys.json)
 *      Also measured at this version and not kept (1M x 1, random / position-coded, ms): row
 *      floors, a kernel bounding each row's k-th key by the k-th largest of its 320 nearest keys
 *      (scores lowered by 2^-12 |q| |k| against other orders of the sum) so that the score kernels
 *      skip the groups below it: index unchanged, but on these inputs 72 % of the groups still
 *      reach it (the top 100 of a 1M row span some 8400 blocks), the score kernel went 0.205 ->
 *      0.202 and the floor kernel itself took 0.08. Summaries from the maxima of each half group
 *      (one shuffle a half instead of the two largest keys' six): the wgmma scores unchanged
 *      (0.199 / 0.200 -> 0.202 / 0.200), the select slower (0.147 / 0.150 -> 0.155 / 0.160, a
 *      looser bound on near-diagonal scores). Neither the score kernel's stores nor its summary
 *      arithmetic bound it. Two calls on two streams at once took 6 % less than in turn at 1M,
 *      so the scores and select of one call were not split over streams either.
 *      (2026-12-01-gpu-bs-estimate-floors.json, -half-maxima.json, -two-streams.json)
 *  20. (a) of version 19 kept: every path ranks a pooled score by the upper 16 bits of its order
 *      key, equal ones by position (lower block first), as the original ranks its bf16 or fp16
 *      product; the scores in memory keep those 16 bits (a quarter warp a row, eight keys a
 *      lane). The failures that had stopped it were the CPU reference's: its cut, guarded by
 *      `x != x`, was compiled by gcc 12 -O2 into a loop that left some scores whole, so the CPU
 *      ranked those at fp32 while every GPU path cut them. With the cut done on the bits, a GPU
 *      test of the estimate on exact whole-number inputs gives the CPU's index bit for bit, and
 *      the structured prefill tests pass. Kernels at 1M x 1: pooling 0.130, wgmma scores 0.212
 *      -> 0.140, select 0.150 / 0.155; estimate per call 0.441 / 0.445 ms, 4.2 / 4.9 % of the
 *      block-sparse total (512K 4.4 / 4.6 %, 128K x 32 heads 2.5 / 2.6 %); 1M x 32 heads 14.9 /
 *      14.9 -> 11.2 / 11.6 ms for all heads. Not kept: pooling with a CTA per 64-row block, the
 *      block read whole into shared memory (512 contiguous bytes a warp load), then summed down
 *      the rows by D / 8 threads: 0.147 against 0.130 ms at 1M x 1, 0.081 against 0.073 at 512K
 *      (2026-12-01-gpu-bs-estimate-pool-block.json). Nor pooling fed by the TMA engine: a
 *      persistent CTA an SM, one thread copying 32 KB stages of contiguous rows with
 *      cp.async.bulk into a ring of five, eight warps summing each block's rows in row order
 *      (the same index bit for bit): 0.133 against 0.129-0.130 ms at 1M x 1, equal at 512K and
 *      128K (2026-12-01-gpu-bs-estimate-pool-bulk.json). Pooling reads 537 MB of q and k at 1M
 *      x 1 at 4.1 TB/s by either kernel.
 *      (2026-12-01-gpu-bs-estimate-bf16-rank.json, 2026-12-01-gpu-attention-v35-patterns.json)
 *  21. bs_score_wg_kernel's key tiles by TMA (one thread issues a tile's two 64-row boxes; every
 *      thread had issued eight 16-byte copies with their addresses, 15 % of the instructions):
 *      scores at 1M x 1 0.142 -> 0.131-0.134 ms, 512K 0.043 -> 0.040, 128K x 32 heads 0.081 ->
 *      0.077. Its tile's keys packed before the next product reuses one set of accumulators (166 ->
 *      116 registers; with two sets ptxas copied the finished one out after every product): 0.133
 *      -> 0.131 (four CTAs an SM with 8 rows staged at a time: no faster, not kept). The select's
 *      bound counted down by borrows (bsr_summary_count_down: two instructions a value where the
 *      sum of comparisons made three on one chain) and searched only until at most k + 32 values
 *      reach it on rows of 1024 summaries, proportionally fewer on shorter rows
 *      (bsr_summary_bound): select at 1M x 1 0.147 / 0.152 -> 0.141 / 0.145 ms; 32 on every row had
 *      made 128K x 32 heads 8-15 % slower. Estimate at 1M x 1: kernels 0.425 -> 0.41 ms; a call
 *      0.438-0.446 timed alone, 0.415 back to back; 4.1 / 5.0 % of the block-sparse total (v37).
 *      Not kept: a warp taking two or four adjacent rows, each bound's search starting from the
 *      last one's (select at 1M x 1 0.151 / 0.186 against 0.140 ms).
 *      (2026-12-01-gpu-bs-estimate-tma-slack.json, -one-accumulator.json, -select-rows.json,
 *      2026-12-01-ncu-bs-estimate-1m-tma.txt, 2026-12-01-gpu-attention-v37.json)
 *   (bench/results/2026-11-30-gpu-patterns-ab.json, 2026-11-30-gpu-bs-estimate-stream-ab.json,
 *   2026-11-30-gpu-bs-estimate-bound-ab.json, 2026-11-30-gpu-bs-estimate-bound-kernel.json,
 *   2026-11-30-gpu-bs-estimate-split.json, 2026-11-30-gpu-bs-estimate-mask-append.json,
 *   2026-11-30-gpu-bs-estimate-bound-rows.json, 2026-11-30-gpu-bs-estimate-cand-rows.json,
 *   2026-11-30-gpu-bs-estimate-scores.json, 2026-12-01-gpu-bs-estimate-summaries.json,
 *   2026-12-01-gpu-bs-estimate-wgmma.json, 2026-12-01-ncu-bs-row-select-1m.txt,
 *   2026-12-01-gpu-bs-estimate-stores.json, 2026-12-01-gpu-bs-estimate-direct-stores.json)
 */
#include "block_select.cuh"
#include "bs_chunks.cuh"
#include "bs_scores.cuh"
#include "bs_slots.cuh"
#include "cuda_common.cuh"
#include "sm90_common.cuh"

#include <algorithm>
#include <stdlib.h>
#include <type_traits>
#include <string.h>

namespace mi_cuda {

/* One tensor the pooling reads (q or k): its heads, and its (b, h) pairs bh_count. */
struct pool_tensor {
    const void *x;
    int64_t stride[3];
    int32_t heads, bh_count;
    void *out; /* [B*heads, R, D] in the input dtype */
};
/* The pooling of up to two tensors in one launch, t[blockIdx.z] (q and k together: one launch's
 * ramp and drain instead of two). */
struct pool_params {
    pool_tensor t[2];
    int32_t len, row_blocks, head_dim;
    int32_t seq_lens[MI_CUDA_MAX_BATCH];
};

/* The mean of a block's real rows, summed in row order and rounded to the input dtype as the CPU
 * reference does (IEEE reciprocal and product, whatever the fast-math flags). */
template <typename T> __device__ __forceinline__ T bs_mean_of(float sum, int rows) {
    return dtype_traits<T>::from_float(rows > 0 ? __fmul_rn(sum, __frcp_rn((float)rows)) : 0.f);
}

/* Where row block m of pair bh of tensor pt lies: its first element (x, plus the caller's offset
 * within a row) and its real rows [r0, r1) (none past the sequence); false past pt's pairs. */
template <typename T> struct pool_block {
    const T *x;
    int r0, r1;
};
template <typename T>
__device__ __forceinline__ bool pool_block_of(const pool_params &p, const pool_tensor &pt, int bh,
                                              int m, pool_block<T> &blk) {
    if (bh >= pt.bh_count) return false;
    const int b = bh / pt.heads, h = bh % pt.heads;
    blk.x = reinterpret_cast<const T *>(pt.x) + b * pt.stride[0] + h * pt.stride[1];
    blk.r0 = m * 64;
    blk.r1 = min(blk.r0 + 64, p.seq_lens[b]);
    return true;
}

/* A thread per (block, d). */
template <typename T>
__global__ void bs_pool_kernel(const __grid_constant__ pool_params p) {
    const pool_tensor &pt = p.t[blockIdx.z];
    const int m = blockIdx.x, bh = blockIdx.y;
    const int d = threadIdx.x;
    pool_block<T> blk;
    if (d >= p.head_dim || !pool_block_of(p, pt, bh, m, blk)) return;
    float acc = 0.f;
    for (int r = blk.r0; r < blk.r1; ++r)
        acc += dtype_traits<T>::to_float(blk.x[(int64_t)r * pt.stride[2] + d]);
    reinterpret_cast<T *>(pt.out)[((int64_t)bh * p.row_blocks + m) * p.head_dim + d] =
        bs_mean_of<T>(acc, blk.r1 - blk.r0);
}

/* The same sums with a thread per (block, 8 values of d), for rows that 16-byte loads can read
 * (the common case): eight loads in flight a thread instead of one, where the one-value kernel
 * waited on memory latency (0.41 ms for the q and k of 128K x 32 heads). BS_POOL_NT / (D / 8)
 * blocks per CTA. */
constexpr int BS_POOL_NT = 128;
template <typename T, int D>
__global__ void __launch_bounds__(BS_POOL_NT)
    bs_pool_vec_kernel(const __grid_constant__ pool_params p) {
    constexpr int PIECES = D / 8, BLOCKS = BS_POOL_NT / PIECES;
    const pool_tensor &pt = p.t[blockIdx.z];
    const int m = blockIdx.x * BLOCKS + threadIdx.x / PIECES, piece = threadIdx.x % PIECES;
    const int bh = blockIdx.y;
    pool_block<T> blk;
    if (m >= p.row_blocks || !pool_block_of(p, pt, bh, m, blk)) return;
    const T *x = blk.x + 8 * piece;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll 8
    for (int r = blk.r0; r < blk.r1; ++r) {
        const uint4 u = __ldg(reinterpret_cast<const uint4 *>(x + (int64_t)r * pt.stride[2]));
        const T *e = reinterpret_cast<const T *>(&u);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] += dtype_traits<T>::to_float(e[i]);
    }
    uint4 out;
    T *o = reinterpret_cast<T *>(&out);
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] = bs_mean_of<T>(acc[i], blk.r1 - blk.r0);
    *reinterpret_cast<uint4 *>(reinterpret_cast<T *>(pt.out) +
                               ((int64_t)bh * p.row_blocks + m) * D + 8 * piece) = out;
}

/* Eight values of a 16-byte load in the input dtype, as floats. */
template <typename T> __device__ __forceinline__ void unpack8(const uint4 &u, float *f) {
    const T *e = reinterpret_cast<const T *>(&u);
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = dtype_traits<T>::to_float(e[i]);
}

struct bs_select_params {
    const void *qp, *kp; /* pooled, in the input dtype */
    int32_t heads, group, row_blocks, head_dim;
    int32_t *block_count, *block_offset, *column_count;
    int32_t idx_row_blocks, max_blocks;
    int32_t dense_below;
    int32_t bound_groups; /* bs_bound_kernel's groups per tile: -1 automatic, else G */
    uint32_t *bound;      /* [B*H, row_blocks] each row's bound (bs_bound_kernel); null: none */
    /* The streaming kernels' row groups in chunks of key tiles (BSS_SPLIT_MAX, below); chunk_tiles
     * 0: a CTA per row group. groups_r: the row groups with key tiles, split_items: their
     * chunks; split_heads: the streaming heads, split_slot[h]: h's rank among them. */
    int32_t chunk_tiles, groups_r, split_items, split_heads;
    int32_t groups, bh; /* the index's row groups; the (b, h) pairs (all heads) */
    int32_t mask_append; /* bs_stream_kernel's plain tiles appended at once where they can be */
    uint16_t *split_maxima; /* [split_heads, split rows, BSB_SLOTS] the chunks' group maxima */
    int32_t *split_count;   /* [split_heads, split rows, BSS_SPLIT_MAX] each chunk's candidates */
    uint64_t *split_cand;   /* [split_heads, split rows, BSS_SPLIT_MAX, BSS_MAX_K] */
    /* The estimate through scores in memory (bs_score_kernel, bs_row_select_kernel): the keys of
     * the pairs score_bh0 .. score_bh0 + gridDim.z - 1, score_pair_keys apart (bsr_row_base). */
    uint16_t *scores;
    int64_t score_pair_keys;
    int32_t score_bh0;
    int32_t score_chunk_tiles; /* the key tiles a CTA of bs_score_kernel scores */
    int32_t score_raise;       /* bs_row_select_kernel raises the bound of rows past BSR_WCAND */
    int32_t score_slack;       /* its bound search stops within this many values of k */
    /* and the summaries of each row's groups of BSR_GROUP_KEYS keys, score_sum_stride a row */
    uint32_t *score_sums;
    int32_t score_sum_stride;
    int32_t seq_lens[MI_CUDA_MAX_BATCH];
    int32_t top_k[MI_CUDA_MAX_HEADS];
    uint8_t active[MI_CUDA_MAX_HEADS];
    uint8_t split_slot[MI_CUDA_MAX_HEADS];
};

/* The sequence length of batch b as the estimate sees it: 0 below dense_below (no blocks). */
__device__ __forceinline__ int bs_seq_len(const bs_select_params &p, int b) {
    const int len = p.seq_lens[b];
    return p.dense_below > 0 && len < p.dense_below ? 0 : len;
}

/* The blocks row block m of head h keeps, as the CPU reference: at least the forced ones (the
 * diagonal, and block 0 when m > 0), none past the index or the sequence. */
__device__ __forceinline__ int bs_row_k(const bs_select_params &p, int h, int m, int len) {
    if (m >= p.idx_row_blocks || m * 64 >= len) return 0;
    const int k = max(min(max(p.top_k[h], 0), m + 1), m > 0 ? 2 : 1);
    return min(k, p.max_blocks);
}

/* The order key that ranks a pooled score: its order key cut to the upper 16 bits (bf16
 * precision), blocks with equal keys ranking by position, lower block first (the CPU reference's
 * bf16_score_rank). Every path ranks by it; the scores in memory keep just those 16 bits. */
__device__ __forceinline__ uint32_t bs_score_key(float score) {
    return float_order_key(score) & 0xffff0000u;
}

/* The order key that ranks block j for row block m: the diagonal first, then block 0, then the
 * score (higher first; the CPU reference's order). */
__device__ __forceinline__ uint32_t bs_rank_key(float score, int j, int m) {
    return j == m ? 0xffffffffu : j == 0 ? bs_score_key(3.402823466e38f) : bs_score_key(score);
}

/* The start of a row block's select (each of the NT threads that select the row calls it, tid
 * its index among them: a CTA's threads, or a warp's lanes): writes its counts, and its offsets
 * where it takes none or every block (then true: nothing is left to select). */
template <int NT>
__device__ __forceinline__ bool bs_row_trivial(const bs_select_params &p, int64_t row, int k, int n,
                                               int tid = (int)threadIdx.x) {
    int32_t *off = p.block_offset + row * p.max_blocks;
    if (tid == 0) {
        p.column_count[row] = 0;
        p.block_count[row] = k;
    }
    if (k <= 0) return true;
    if (k < n) return false;
    for (int j = tid; j < n; j += NT) off[j] = 64 * j;
    return true;
}

/* Writes the top k of a row block as ascending offsets, from the n_cand candidate blocks cand[]
 * (ascending, holding every block of the top k); key(j) ranks block j (bs_rank_key). Ties: lower
 * block first (the CPU reference's total order). Every thread of the CTA calls it. */
template <int NT, typename KeyFn>
__device__ void bs_emit_top_of(KeyFn key, const int *cand, int n_cand, int k, int32_t *off,
                               select_smem &sel,
                               typename cub::BlockScan<int, NT>::TempStorage &scan_tmp) {
    auto ckey = [&](int i) { return key(cand[i]); };
    uint32_t thr = 0;
    int take_eq = 0, eq_total = 0;
    const bool all = k >= n_cand;
    if (!all) block_radix_select<NT>(ckey, n_cand, k, sel, thr, take_eq, eq_total);
    block_compact<NT, 4>(
        ckey, n_cand, all, thr, take_eq, eq_total, false,
        [&](int i, int rank) { off[rank] = 64 * cand[i]; }, scan_tmp);
}

/* The same over all n blocks of the row (0 < k < n). */
template <int NT, typename KeyFn>
__device__ void bs_emit_top(KeyFn key, int n, int k, int32_t *off, select_smem &sel,
                            typename cub::BlockScan<int, NT>::TempStorage &scan_tmp) {
    uint32_t thr = 0;
    int take_eq = 0, eq_total = 0;
    block_radix_select<NT>(key, n, k, sel, thr, take_eq, eq_total);
    block_compact<NT, 4>(
        key, n, false, thr, take_eq, eq_total, false, [&](int j, int rank) { off[rank] = 64 * j; },
        scan_tmp);
}

constexpr int BS_NT = 256;
constexpr int BS_MAX_ROWS = 4;      /* row blocks per CTA, at most (their pooled q in registers) */
constexpr int BS_CANDIDATES = 2048; /* the two-pass select's room for keys near the top */
/* the scores of a CTA's row blocks: at most this much shared memory */
constexpr size_t BS_SCORE_SMEM = 200 * 1024;
/* floats per row block in the scores of a CTA whose last row block is m_end - 1 (its m_end
 * keys, rounded up for 16-byte alignment) */
__host__ __device__ constexpr int64_t bs_score_stride(int64_t m_end) { return (m_end + 3) & ~3; }

/* One CTA per `ROWS` adjacent row blocks of one (b, h), the longest first. The scores: the
 * pooled keys are read once for all ROWS row blocks (each was read once per row block, a CTA's
 * threads each reading a whole row: at 1M, 69 GB of L2 reads per head), eight lanes to a key
 * row, coalesced. Then, per row block, the top k: block_top_bin narrows the m + 1 keys to the
 * few near the top, the exact radix select and the in-order compaction run on those; where more
 * than BS_CANDIDATES lie there (k close to m), on all of them as before. */
template <typename T, int D, int ROWS, int UNROLL, int NT>
__global__ void __launch_bounds__(NT, NT == BS_NT ? 2 : 1)
    bs_select_kernel(const __grid_constant__ bs_select_params p) {
    extern __shared__ float scores[]; /* [ROWS][stride] */
    __shared__ union {
        select_smem sel;
        top_bin_smem top;
    } sm;
    __shared__ int cand[BS_CANDIDATES];
    __shared__ typename cub::BlockScan<int, NT>::TempStorage scan_tmp;
    const int bh = blockIdx.y;
    const int b = bh / p.heads, h = bh % p.heads;
    const int m0 = (gridDim.x - 1 - blockIdx.x) * ROWS;
    if (!p.active[h] || m0 >= p.idx_row_blocks) return;
    const int len = bs_seq_len(p, b);
    const int rows = min(ROWS, p.idx_row_blocks - m0);
    int kk[ROWS];
    int n_score = 0; /* key rows whose scores some row block needs */
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const int m = m0 + r, n = m + 1;
        kk[r] = bs_row_k(p, h, m, len);
        if (kk[r] > 0 && kk[r] < n) n_score = n;
    }
    const int stride = (int)bs_score_stride(m0 + ROWS);

    if (n_score > 0) {
        /* lane l of a warp: key row 4 w' + l / 8 of the warp's four, 8-value pieces l % 8,
         * l % 8 + 8, ... (eight lanes read 128 contiguous bytes at a time) */
        constexpr int PIECES = D / 64;
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, part = lane & 7;
        float q[ROWS][PIECES][8];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const int m = min(m0 + r, p.row_blocks - 1);
            const uint4 *qg = reinterpret_cast<const uint4 *>(static_cast<const T *>(p.qp) +
                                                              ((int64_t)bh * p.row_blocks + m) * D);
#pragma unroll
            for (int i = 0; i < PIECES; ++i) unpack8<T>(qg[i * 8 + part], q[r][i]);
        }
        const int bhk = b * (p.heads / p.group) + h / p.group;
        const uint4 *kbase = reinterpret_cast<const uint4 *>(static_cast<const T *>(p.kp) +
                                                             (int64_t)bhk * p.row_blocks * D);
        /* UNROLL groups of key rows in flight per warp (see launch_bs_select) */
        constexpr int STEP = 4 * (NT / 32);
        /* the loop bound is the warp's (the shuffles below need every lane) */
        for (int j0 = 4 * warp; j0 < n_score; j0 += STEP * UNROLL) {
            uint4 kv[UNROLL][PIECES];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int j = j0 + u * STEP + (lane >> 3);
#pragma unroll
                for (int i = 0; i < PIECES; ++i)
                    kv[u][i] = j < n_score ? __ldg(kbase + (int64_t)j * (D / 8) + i * 8 + part)
                                           : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int j = j0 + u * STEP + (lane >> 3);
                float kf[PIECES][8];
#pragma unroll
                for (int i = 0; i < PIECES; ++i) unpack8<T>(kv[u][i], kf[i]);
                float acc[ROWS];
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    acc[r] = 0.f;
#pragma unroll
                    for (int i = 0; i < PIECES; ++i)
#pragma unroll
                        for (int e = 0; e < 8; ++e) acc[r] += kf[i][e] * q[r][i][e];
#pragma unroll
                    for (int o = 4; o > 0; o >>= 1)
                        acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
                }
                if (part == 0 && j < n_score)
#pragma unroll
                    for (int r = 0; r < ROWS; ++r)
                        if (j <= m0 + r) scores[r * stride + j] = acc[r];
            }
        }
        __syncthreads();
    }

    for (int r = 0; r < rows; ++r) {
        const int m = m0 + r, n = m + 1, k = kk[r];
        const int64_t row = (int64_t)bh * p.idx_row_blocks + m;
        int32_t *off = p.block_offset + row * p.max_blocks;
        if (bs_row_trivial<NT>(p, row, k, n)) continue;
        const float *sc = scores + r * stride;
        auto key = [&](int j) { return bs_rank_key(sc[j], j, m); };
        int bin, n_cand;
        block_top_bin<NT>(key, n, k, sm.top, scan_tmp, bin, n_cand);
        if (n_cand <= BS_CANDIDATES) {
            /* the candidates, ascending: the keys in the bin or above */
            block_compact<NT, 4>(
                key, n, bin == 0, ((uint32_t)bin << 20) - 1u, 0, 0, false,
                [&](int j, int rank) { cand[rank] = j; }, scan_tmp);
            __syncthreads();
            bs_emit_top_of<NT>(key, cand, n_cand, k, off, sm.sel, scan_tmp);
        } else {
            bs_emit_top<NT>(key, n, k, off, sm.sel, scan_tmp);
        }
        __syncthreads(); /* cand and the select's shared memory are reused by the next row */
    }
}

/* The row blocks per CTA for R row blocks: as many as fit BS_SCORE_SMEM (0: none fits). */
static int bs_rows_per_cta(int64_t R) {
    const int64_t per = (R + BS_MAX_ROWS + 3) * (int64_t)sizeof(float);
    return (int)std::min<int64_t>(BS_MAX_ROWS, (int64_t)BS_SCORE_SMEM / per);
}

/* Where the scores leave room for two CTAs per SM, CTAs of 256 threads with one group of key rows
 * in flight per warp; where one CTA fills an SM's shared memory (about 512K and beyond), the
 * wide variant: 512 threads, two groups in flight per warp (at most 128 registers). H200,
 * per-head estimate time, builds in turn in one process (bench/results/2026-11-30-gpu-patterns-
 * ab.json): at 1M, 256 threads with one group 12.0 ms, with four groups 5.5-5.6 ms (Nsight
 * Compute: 12.5 % occupancy, L2 29 %, SM 34 %, latency bound), the wide variant 4.5-4.6 ms;
 * 128K 0.113 ms with one group and two CTAs per SM, 0.163 ms with four groups and one CTA. (One
 * CTA per row block, each thread reading a whole pooled key row, with a five-pass select: 0.30 ms
 * at 128K, 23.6 ms at 1M.) Keeping only the top 16 bits of each score (six row blocks per CTA,
 * five at 1M, the candidates' exact scores computed again) was tried: 1M 7 % faster, 128K 19 %
 * slower; not kept. */
constexpr size_t BS_TWO_CTA_SMEM = 80 * 1024;
constexpr int BS_WIDE_NT = 512;

template <typename T, int D, int ROWS>
static cudaError_t launch_bs_select(const bs_select_params &sp, int64_t BH, cudaStream_t st) {
    const int64_t stride = bs_score_stride((int64_t)sp.idx_row_blocks + ROWS);
    const size_t smem = (size_t)(ROWS * stride) * sizeof(float);
    bool wide = smem > BS_TWO_CTA_SMEM;
    /* MI_CUDA_BS_WIDE=0 or 1 forces the choice (for the tests) */
    if (const char *w = getenv("MI_CUDA_BS_WIDE"))
        if (w[0] == '0' || w[0] == '1') wide = w[0] == '1';
    auto kern =
        wide ? bs_select_kernel<T, D, ROWS, 2, BS_WIDE_NT> : bs_select_kernel<T, D, ROWS, 1, BS_NT>;
    cudaError_t e =
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    const unsigned ctas = (unsigned)((sp.idx_row_blocks + ROWS - 1) / ROWS);
    kern<<<dim3(ctas, (unsigned)BH), wide ? BS_WIDE_NT : BS_NT, smem, st>>>(sp);
    return cudaGetLastError();
}

template <typename T, int D>
static cudaError_t launch_bs_select(const bs_select_params &sp, int rows, int64_t BH,
                                    cudaStream_t st) {
    switch (rows) {
    case 1: return launch_bs_select<T, D, 1>(sp, BH, st);
    case 2: return launch_bs_select<T, D, 2>(sp, BH, st);
    case 3: return launch_bs_select<T, D, 3>(sp, BH, st);
    default: return launch_bs_select<T, D, 4>(sp, BH, st);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* The streaming estimate: tensor-core scores and a running top k per row block                */

/* A CTA of four warps takes 64 adjacent row blocks of one (b, h), a warp 16 of them (the rows of
 * its mma tiles). It streams the pooled keys in tiles of 64 from the diagonal down to block 0
 * through shared memory (cp.async, two stages) and scores them with mma.sync m16n8k16 against
 * the pooled queries held in registers. Each row block keeps candidates in shared memory: every
 * score above its threshold is appended; when the next tile might not fit, the warp keeps the
 * row's top k (warp_keep_top) and raises the threshold to the smallest of them. So the pooled keys
 * are read once per 64 row blocks, not once per three or four as in bs_select_kernel.
 *
 * A candidate is one 64-bit value, (order key of the score) << 32 | ~block: distinct, ordered as
 * the CPU reference ranks (higher score first, lower block first among equal scores; the diagonal
 * and block 0 forced on top). Walking the keys downwards, a row's candidates are appended in
 * descending block order, which compaction keeps, so the kept list read backwards gives the
 * ascending offsets. Downwards also meets the high scores of near-diagonal blocks first, which
 * real heads favour, so the threshold rises early and few candidates are appended.
 *
 * Rows longer than BSS_BOUND_TILES tiles start from a bound that bs_bound_kernel computed before
 * (below), so each row's threshold starts near its k-th score.
 *
 * The candidate slots per row block, CAP: a row compacts to k before an n-tile (up to 8 new
 * candidates a row) could overflow them. 256 slots take a CTA's 64 rows to 172 KB of shared
 * memory, one CTA an SM; 128 slots (108 KB) fit two, for top k up to BSS_NARROW_MAX_K. (352
 * slots, compacting less often, measured slower: 0.16 against 0.105 ms per head at 128K, 2.7
 * against 2.2 at 1M, before the bounds.) */
constexpr int BSS_ROWS = 64;
constexpr int BSS_NT = 128;
constexpr int BSS_KEYS = 64;
constexpr int BSS_CAP_WIDE = 256, BSS_CAP_NARROW = 128;
/* the largest top k each takes; larger ones would compact too often */
constexpr int BSS_MAX_K = 192, BSS_NARROW_MAX_K = 104;
static_assert(BSS_MAX_K + 8 < BSS_CAP_WIDE && BSS_NARROW_MAX_K + 8 < BSS_CAP_NARROW,
              "candidate slots");
/* CTAs whose rows span more key tiles than this take a bound first */
constexpr int BSS_BOUND_TILES = 4;

/* The row groups' division into chunks of key tiles (bss_plan, bss_work_of, bss_range_of):
 * bs_chunks.cuh. */
__device__ __forceinline__ bss_plan bss_plan_of(const bs_select_params &p) {
    return {p.chunk_tiles, p.groups, p.groups_r, p.split_items};
}

/* A split row's place in the chunk buffers: the streaming pair's rows of the groups from
 * chunk_tiles on (those with more than chunk_tiles tiles). */
__device__ __forceinline__ int64_t bss_split_row(const bs_select_params &p, int b, int h, int m) {
    const int64_t rows = (int64_t)(p.groups_r - p.chunk_tiles) * BSS_ROWS;
    return ((int64_t)b * p.split_heads + p.split_slot[h]) * rows +
           (m - (int64_t)p.chunk_tiles * BSS_ROWS);
}

/* pooled key rows in shared memory are D + 32 values apart: the 16-byte reads of eight lanes
 * (two rows) fall on distinct banks */
template <int D> constexpr int bss_key_stride() { return D + 32; }
template <int D> constexpr size_t bss_key_bytes() {
    return (size_t)2 * BSS_KEYS * bss_key_stride<D>() * 2;
}
/* A row's candidate slots lie cap + 1 apart (8 bytes past their cap), so that the rows of a
 * warp's eight lanes g, at equal counts (as after a compaction), append to different banks. */
__host__ __device__ constexpr int bss_cand_row(int cap) { return cap + 1; }
template <int D> constexpr size_t bss_smem_bytes(int cap) {
    return (size_t)BSS_ROWS * bss_cand_row(cap) * 8 + bss_key_bytes<D>() +
           (size_t)(BSS_NT / 32) * 32 * 8;
}

__device__ __forceinline__ uint64_t bs_candidate(float score, int j, int m) {
    if (j > m) return 0; /* never above a threshold */
    return (uint64_t)bs_rank_key(score, j, m) << 32 | (uint32_t)~j;
}

/* Where lane t of a quad writes its n values when lanes 3 .. 0 write in turn (the sum over the
 * lanes above t); `total` gets the quad's sum. */
__device__ __forceinline__ int quad_offset_down(int n, int t, int &total) {
    int incl = n; /* over lanes t .. 3 */
    int o = __shfl_down_sync(0xffffffffu, incl, 1, 4);
    if (t < 3) incl += o;
    o = __shfl_down_sync(0xffffffffu, incl, 2, 4);
    if (t < 2) incl += o;
    total = __shfl_sync(0xffffffffu, incl, 0, 4);
    return incl - n;
}

/* The key tiles of row group m0 / BSS_ROWS in a sequence of nb blocks. */
__device__ __forceinline__ int bss_group_tiles(int m0, int nb) {
    return (min(m0 + BSS_ROWS, nb) + BSS_KEYS - 1) / BSS_KEYS;
}

/* The part of a streaming CTA (bs_stream_kernel, bs_bound_kernel) that one thread sees: its two
 * row blocks (those of its accumulator rows g and g + 8), their top k, whether they select
 * (otherwise none or every block), and the pooled queries of its warp as mma A fragments. The
 * k index of the mma runs over a permutation of d that A and B share: k-steps 2 s and 2 s + 1
 * take d = 32 s .. 32 s + 31, lane t's four values of a step being d = 32 s + 8 t + 4 (step & 1)
 * + 0..3, so one 16-byte read gives a lane its operands for both steps. */
template <typename T, int D> struct bss_thread {
    int mr[2], kk[2];
    bool sel[2];
    bool warp_sel; /* any row of the warp selects */
    int n_tiles;   /* the key tiles the CTA walks: none where no row selects */
    uint4 qf[2][D / 32];

    /* every thread of the CTA calls it (a barrier) */
    __device__ void init(const bs_select_params &p, int bh, int h, int m0, int wm0, int g, int t,
                         int len) {
        const int nb = (len + 63) / 64;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int m = wm0 + g + 8 * r;
            mr[r] = m;
            kk[r] = bs_row_k(p, h, m, len);
            sel[r] = kk[r] > 0 && kk[r] < m + 1;
        }
        warp_sel = __any_sync(0xffffffffu, sel[0] || sel[1]);
        n_tiles = __syncthreads_or(warp_sel) ? bss_group_tiles(m0, nb) : 0;
        const T *qg = static_cast<const T *>(p.qp) + (int64_t)bh * p.row_blocks * D;
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int s = 0; s < D / 32; ++s)
                qf[r][s] = mr[r] < nb ? __ldg(reinterpret_cast<const uint4 *>(
                                            qg + (int64_t)mr[r] * D + 32 * s + 8 * t))
                                      : make_uint4(0u, 0u, 0u, 0u);
    }

    /* row rr (0 .. 15) of the warp's rows, as every lane sees it: its top k and whether it
     * selects, from the lane that holds it (kk and sel named, not indexed: an indexed member
     * would put the struct in local memory) */
    __device__ __forceinline__ int row_k(int rr) const {
        return __shfl_sync(0xffffffffu, rr < 8 ? kk[0] : kk[1], (rr & 7) * 4);
    }
    __device__ __forceinline__ bool row_sel(int rr) const {
        return __shfl_sync(0xffffffffu, (int)(rr < 8 ? sel[0] : sel[1]), (rr & 7) * 4) != 0;
    }

    /* the scores of the warp's 16 rows against the 64 keys of a tile in shared memory */
    __device__ __forceinline__ void score(const T *kt, int g, int t, float (&acc)[8][4]) const {
        constexpr int KS = bss_key_stride<D>();
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[nt][i] = 0.f;
#pragma unroll
        for (int s = 0; s < D / 32; ++s) {
            const uint32_t a0[4] = {qf[0][s].x, qf[1][s].x, qf[0][s].y, qf[1][s].y};
            const uint32_t a1[4] = {qf[0][s].z, qf[1][s].z, qf[0][s].w, qf[1][s].w};
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
                const uint4 kv =
                    *reinterpret_cast<const uint4 *>(kt + (8 * nt + g) * KS + 32 * s + 8 * t);
                const uint32_t b0[2] = {kv.x, kv.y}, b1[2] = {kv.z, kv.w};
                mma_16816<T>(acc[nt], a0, b0);
                mma_16816<T>(acc[nt], a1, b1);
            }
        }
    }
};

/* Starts the copy of pooled key tile `it` (keys 64 it .. 64 it + 63, zeros past nb) into dst. */
template <typename T, int D>
__device__ __forceinline__ void bss_load_tile(T *dst, const T *kg, int it, int nb) {
    constexpr int KS = bss_key_stride<D>();
    static_assert(BSS_KEYS * D / 8 % BSS_NT == 0, "16-byte pieces a thread");
#pragma unroll
    for (int i = 0; i < BSS_KEYS * D / 8 / BSS_NT; ++i) {
        const int c = threadIdx.x + i * BSS_NT;
        const int r = c / (D / 8), piece = c % (D / 8), j = it * BSS_KEYS + r;
        const bool ok = j < nb;
        cp_async_16(dst + r * KS + piece * 8, kg + (int64_t)(ok ? j : 0) * D + piece * 8,
                    ok ? 16 : 0);
    }
    cp_async_commit();
}

/* The pooled keys of (b, h)'s KV head. */
template <typename T, int D>
__device__ __forceinline__ const T *bss_keys_of(const bs_select_params &p, int b, int h) {
    const int bhk = b * (p.heads / p.group) + h / p.group;
    return static_cast<const T *>(p.kp) + (int64_t)bhk * p.row_blocks * D;
}

/* Walks key tiles hi - 1 down to lo through the two buffers of kbuf (every thread of the CTA
 * calls it, with the same range): body(it, tile) for each, the next tile loading meanwhile. */
template <typename T, int D, typename Body>
__device__ __forceinline__ void bss_walk_tiles(T *kbuf, const T *kg, bss_range r, int nb,
                                               Body body) {
    constexpr int KS = bss_key_stride<D>();
    if (r.hi <= r.lo) return;
    bss_load_tile<T, D>(kbuf, kg, r.hi - 1, nb);
    for (int it = r.hi - 1, buf = 0; it >= r.lo; --it, buf ^= 1) {
        if (it > r.lo) {
            bss_load_tile<T, D>(kbuf + (buf ^ 1) * BSS_KEYS * KS, kg, it - 1, nb);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        body(it, kbuf + buf * BSS_KEYS * KS);
        __syncthreads(); /* the buffer is loaded again two tiles on */
    }
}

/* The bound kernel. For the CTAs of bs_stream_kernel whose rows span more than BSS_BOUND_TILES
 * tiles, it scores the same tiles for the maxima of G groups of keys per row and tile only, each
 * kept in a fixed slot of shared memory as its top 16 bits (rounding down keeps it at or below a
 * key of its group), so there are no appends and no compactions. A row's bound is the k-th
 * largest of its maxima: k distinct blocks reach it, so the row's k-th largest score key is at
 * least that. G is the largest power of two up to 32 whose maxima fit the BSB_SLOTS slots (1M:
 * 2, 128K: 16); past that, tiles share slots, a slot keeping the largest of their groups' maxima:
 * still the maximum of a set of distinct blocks, so the bound holds. 512 slots against 256 gave
 * the streaming kernel 20 % less work on near-diagonal scores at 128K (finer groups), and 128 of
 * them given to two-key groups in the four tiles nearest the diagonal did not help (measured). */
constexpr int BSB_SLOTS = 512;
/* A row's slots in shared memory are BSB_ROW apart: 16 bytes past the 1 KB of its slots, so the
 * rows of a warp's eight lanes g fall on different banks (1 KB apart, every update of a slot was
 * an eight-way conflict). */
constexpr int BSB_ROW = BSB_SLOTS + 8;
/* A chunk's window of a row's slots: 1, 2 or 4 windows (BSS_SPLIT_MAX). */
__device__ __forceinline__ int bsb_window(int chunks) {
    return chunks == 1 ? BSB_SLOTS : chunks == 2 ? BSB_SLOTS / 2 : BSB_SLOTS / 4;
}
static_assert(BSS_SPLIT_MAX == 4, "bsb_window");
template <int D> constexpr size_t bsb_smem_bytes() {
    return (size_t)BSS_ROWS * BSB_ROW * 2 + bss_key_bytes<D>();
}

/* The maxima of the groups of a lane's 16 keys of one row (two per n-tile) when a tile has G
 * groups: runs of 32 / G n-tiles (G >= 4), or the lane's keys with those of the next one or
 * three lanes of its quad (G = 2, 1). Group i of the lane ends in key[i * span]. */
template <int G, typename V, typename Max>
__device__ __forceinline__ void bsb_group_max(V (&key)[8], Max mx) {
    constexpr int span = G >= 4 ? 32 / G : 8;
#pragma unroll
    for (int w = 1; w < span; w <<= 1)
#pragma unroll
        for (int nt = 0; nt < 8; nt += 2 * w) key[nt] = mx(key[nt], key[nt + w]);
    if (G < 4) key[0] = mx(key[0], __shfl_xor_sync(0xffffffffu, key[0], 1));
    if (G < 2) key[0] = mx(key[0], __shfl_xor_sync(0xffffffffu, key[0], 2));
}

/* One tile's group maxima of a thread's two rows (rows[0] and rows[8 * BSB_ROW]), G groups a
 * tile (a compile-time G: runtime spans had cost divisions and branches at every key, and twice
 * the bound kernel's time), written to slots first .. first + G - 1 (modulo the window, mask + 1
 * slots), each keeping the largest. */
template <int G>
__device__ __forceinline__ void bsb_tile_maxima(const float (&acc)[8][4], bool plain, int j0,
                                                const int (&m)[2], int t, uint16_t *rows,
                                                int first, int mask) {
    constexpr int lane_groups = G >= 4 ? G / 4 : 1, span = 8 / lane_groups;
    const bool lane_on = G >= 4 || (t & (4 / G - 1)) == 0;
    const int group0 = G >= 4 ? t * lane_groups : G == 2 ? t >> 1 : 0;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        uint32_t key[8];
        if (plain) {
            /* float maxima, one order key a group: fmaxf passes NaN over, which can only lower
             * a maximum to another key of its group */
            float f[8];
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) f[nt] = fmaxf(acc[nt][2 * r], acc[nt][2 * r + 1]);
            bsb_group_max<G>(f, [](float a, float c) { return fmaxf(a, c); });
#pragma unroll
            for (int nt = 0; nt < 8; nt += span) key[nt] = bs_score_key(f[nt]);
        } else {
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
                const int jl = j0 + 8 * nt + 2 * t;
                const uint32_t k0 = jl <= m[r] ? bs_rank_key(acc[nt][2 * r], jl, m[r]) : 0;
                const uint32_t k1 =
                    jl + 1 <= m[r] ? bs_rank_key(acc[nt][2 * r + 1], jl + 1, m[r]) : 0;
                key[nt] = max(k0, k1);
            }
            bsb_group_max<G>(key, [](uint32_t a, uint32_t c) { return max(a, c); });
        }
        uint16_t *row = rows + 8 * r * BSB_ROW;
        if (lane_on)
#pragma unroll
            for (int nt = 0; nt < 8; nt += span) {
                const int slot = (first + group0 + nt / span) & mask;
                const uint16_t v = (uint16_t)(key[nt] >> 16);
                if (v > row[slot]) row[slot] = v;
            }
    }
}

/* The largest x (a score key's top 16 bits, returned in place) that at least k of the 16-bit
 * maxima row[0 .. n) reach (n a multiple of 64, at most BSB_SLOTS), bit by bit; a lane counts its
 * slots two at a time (halfword compares). Every lane of the warp calls it. */
__device__ __forceinline__ uint32_t bsb_row_bound(const uint16_t *row16, int n, int k) {
    const int lane = threadIdx.x & 31;
    const uint32_t *row = reinterpret_cast<const uint32_t *>(row16);
    uint32_t v[BSB_SLOTS / 64];
#pragma unroll
    for (int i = 0; i < BSB_SLOTS / 64; ++i) v[i] = 64 * i < n ? row[32 * i + lane] : 0u;
    uint32_t x = 0;
#pragma unroll 1
    for (int bit = 15; bit >= 0; --bit) {
        const uint32_t c = x | 1u << bit;
        int cnt = 0;
#pragma unroll
        for (int i = 0; i < BSB_SLOTS / 64; ++i) cnt += __popc(__vcmpgeu2(v[i], c * 0x10001u));
        /* (a halfword compare sets 16 bits) */
        if ((int)__reduce_add_sync(0xffffffffu, (unsigned)cnt) >= 16 * k) x = c;
    }
    return x << 16;
}

template <typename T, int D>
__global__ void __launch_bounds__(BSS_NT, 2)
    bs_bound_kernel(const __grid_constant__ bs_select_params p) {
    extern __shared__ __align__(16) unsigned char smem[];
    T *kbuf = reinterpret_cast<T *>(smem);                                      /* [2][64][KS] */
    uint16_t *maxima = reinterpret_cast<uint16_t *>(smem + bss_key_bytes<D>()); /* [64][BSB_ROW] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    /* the work items of all (b, h) in turn, so that every head's longest come first */
    const int bh = (int)(blockIdx.x % (unsigned)p.bh);
    const int b = bh / p.heads, h = bh % p.heads;
    const bss_work w = bss_work_of(bss_plan_of(p), (int)(blockIdx.x / (unsigned)p.bh));
    const int m0 = w.group * BSS_ROWS;
    if (!p.active[h] || m0 >= p.idx_row_blocks) return;
    const int len = bs_seq_len(p, b);
    const int nb = (len + 63) / 64;
    const int wm0 = m0 + 16 * warp;
    bss_thread<T, D> th;
    th.init(p, bh, h, m0, wm0, g, t, len);
    if (th.n_tiles <= BSS_BOUND_TILES) return; /* the streaming kernel takes no bound here */
    const bss_range range = bss_range_of(w, th.n_tiles);
    /* a chunk's window of each row's slots, G groups a tile: as many as the chunk's tiles fit */
    const int window = bsb_window(w.chunks);
    int G = p.bound_groups > 0 ? p.bound_groups : 32;
    if (p.bound_groups <= 0)
        while (G > 1 && range.span * G > window) G >>= 1;
    for (int i = threadIdx.x; i < BSS_ROWS * BSB_ROW / 8; i += BSS_NT)
        reinterpret_cast<uint4 *>(maxima)[i] = make_uint4(0u, 0u, 0u, 0u);
    const int m[2] = {th.mr[0], th.mr[1]};
    bss_walk_tiles<T, D>(kbuf, bss_keys_of<T, D>(p, b, h), range, nb, [&](int it, const T *tile) {
        const int j0 = it * BSS_KEYS;
        /* a plain tile: every key below every row's diagonal, none of them block 0 */
        const bool plain = it > 0 && j0 + BSS_KEYS <= wm0;
        if (!th.warp_sel || j0 > wm0 + 15) return;
        float acc[8][4];
        th.score(tile, g, t, acc);
        /* the tile's first slot (a group's slot wraps at most once past it) */
        const int first = ((it - range.lo) * G) & (window - 1), mask = window - 1;
        uint16_t *rows = maxima + (16 * warp + g) * BSB_ROW;
        switch (G) {
        case 1: bsb_tile_maxima<1>(acc, plain, j0, m, t, rows, first, mask); break;
        case 2: bsb_tile_maxima<2>(acc, plain, j0, m, t, rows, first, mask); break;
        case 4: bsb_tile_maxima<4>(acc, plain, j0, m, t, rows, first, mask); break;
        case 8: bsb_tile_maxima<8>(acc, plain, j0, m, t, rows, first, mask); break;
        case 16: bsb_tile_maxima<16>(acc, plain, j0, m, t, rows, first, mask); break;
        default: bsb_tile_maxima<32>(acc, plain, j0, m, t, rows, first, mask); break;
        }
    });
    if (!th.warp_sel) return;

    if (w.chunks > 1) {
        /* the window goes to the row's slots in memory, for bs_bound_rank_kernel (every chunk
         * writes its window, an empty chunk zeros) */
        __syncwarp();
        for (int rr = 0; rr < 16; ++rr) {
            const uint4 *src =
                reinterpret_cast<const uint4 *>(maxima + (16 * warp + rr) * BSB_ROW);
            uint4 *dst = reinterpret_cast<uint4 *>(
                p.split_maxima + bss_split_row(p, b, h, wm0 + rr) * BSB_SLOTS + w.chunk * window);
            for (int i = lane; i < window / 8; i += 32) dst[i] = src[i];
        }
        return;
    }
    /* each row's bound: the k-th largest of its maxima */
#pragma unroll 1
    for (int rr = 0; rr < 16; ++rr) {
        const int k = th.row_k(rr);
        if (!th.row_sel(rr)) continue;
        const uint32_t x = bsb_row_bound(maxima + (16 * warp + rr) * BSB_ROW, BSB_SLOTS, k);
        if (lane == 0) p.bound[(int64_t)bh * p.row_blocks + wm0 + rr] = x;
    }
}

/* The row of a split group that a warp of bs_bound_rank_kernel or bs_merge_kernel takes (a warp
 * a row from the first split group on, BSS_NT / 32 rows a CTA, grid y the (b, h) pairs): its top
 * k, whether it selects, and its group's chunks; none (valid false) past the index or in a head
 * the launch does not take. */
struct bss_split_warp {
    bool valid, sel;
    int b, h, bh, m, len, k, chunks;
};
__device__ __forceinline__ bss_split_warp bss_split_warp_of(const bs_select_params &p) {
    bss_split_warp w;
    w.bh = blockIdx.y;
    w.b = w.bh / p.heads;
    w.h = w.bh % p.heads;
    w.m = p.chunk_tiles * BSS_ROWS + blockIdx.x * (BSS_NT / 32) + (threadIdx.x >> 5);
    w.valid = p.active[w.h] && w.m < p.idx_row_blocks;
    if (!w.valid) return w;
    w.len = bs_seq_len(p, w.b);
    w.k = bs_row_k(p, w.h, w.m, w.len);
    w.sel = w.k > 0 && w.k < w.m + 1;
    w.chunks = bss_group_chunks(w.m / BSS_ROWS, p.chunk_tiles);
    return w;
}

/* The rows of split groups (a warp each): the k-th largest of the group maxima that the bound
 * kernel's chunks wrote to their windows, as bs_bound_kernel does for the rows of one CTA. */
__global__ void __launch_bounds__(BSS_NT)
    bs_bound_rank_kernel(const __grid_constant__ bs_select_params p) {
    const bss_split_warp w = bss_split_warp_of(p);
    if (!w.valid || !w.sel) return;
    /* the streaming kernel's test: the tiles of the row's group */
    if (bss_group_tiles(w.m / BSS_ROWS * BSS_ROWS, (w.len + 63) / 64) <= BSS_BOUND_TILES) return;
    const uint32_t x = bsb_row_bound(p.split_maxima + bss_split_row(p, w.b, w.h, w.m) * BSB_SLOTS,
                                     bsb_window(w.chunks) * w.chunks, w.k);
    if ((threadIdx.x & 31) == 0) p.bound[(int64_t)w.bh * p.row_blocks + w.m] = x;
}

/* Writes row block `row` of the index (every lane of the warp calls it): its k blocks in
 * ascending order, the candidates c[k - 1] .. c[0] (kept in descending block order) where the
 * row selects, else blocks 0 .. k - 1 (none or every block). */
__device__ __forceinline__ void bss_write_row(const bs_select_params &p, int64_t row, int k,
                                              bool sel, const uint64_t *c) {
    const int lane = threadIdx.x & 31;
    int32_t *off = p.block_offset + row * p.max_blocks;
    if (lane == 0) {
        p.block_count[row] = k;
        p.column_count[row] = 0;
    }
    for (int i = lane; i < k; i += 32) off[i] = 64 * (sel ? (int)~(uint32_t)c[k - 1 - i] : i);
}

/* A row's candidate count and threshold. */
struct bss_row_state {
    int cnt;
    uint64_t thr;
};

/* Keeps the top k of each row of `rows` (the warp's 8 rows of one accumulator half, CAP slots
 * apart) that `need` marks at its quad's first lane, and returns this thread's row's count and
 * threshold after that. Not inlined: the streaming kernel calls it before every n-tile, and 16
 * inlined copies of warp_keep_top would crowd the instruction cache; the call is rare. */
template <int CAP>
__device__ __noinline__ bss_row_state bss_keep_top(uint64_t *rows, unsigned need, bss_row_state me,
                                                   int k, uint64_t *scratch) {
    const int g = (threadIdx.x & 31) >> 2;
    while (need) {
        const int src = __ffs(need) - 1;
        need &= need - 1;
        const int n_c = __shfl_sync(0xffffffffu, me.cnt, src);
        const int k_c = __shfl_sync(0xffffffffu, k, src);
        const uint64_t low =
            warp_keep_top<CAP / 32>(rows + (src >> 2) * bss_cand_row(CAP), n_c, k_c, scratch);
        if (g == (src >> 2)) me = {k_c, low};
    }
    return me;
}

template <typename T, int D, int CAP>
__global__ void __launch_bounds__(BSS_NT, CAP == BSS_CAP_NARROW ? 2 : 1)
    bs_stream_kernel(const __grid_constant__ bs_select_params p) {
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr int KS = bss_key_stride<D>();
    uint64_t *cand = reinterpret_cast<uint64_t *>(smem);               /* [BSS_ROWS][CROW] */
    constexpr int CROW = bss_cand_row(CAP);
    T *kbuf = reinterpret_cast<T *>(smem + (size_t)BSS_ROWS * CROW * 8); /* [2][64][KS] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    /* the warp's 32 values for warp_keep_top */
    uint64_t *scratch = reinterpret_cast<uint64_t *>(kbuf + 2 * BSS_KEYS * KS) + 32 * warp;
    /* the work items of all (b, h) in turn, so that every head's longest come first */
    const int bh = (int)(blockIdx.x % (unsigned)p.bh);
    const int b = bh / p.heads, h = bh % p.heads;
    const bss_work w = bss_work_of(bss_plan_of(p), (int)(blockIdx.x / (unsigned)p.bh));
    const int m0 = w.group * BSS_ROWS;
    if (!p.active[h] || m0 >= p.idx_row_blocks) return;
    const int len = bs_seq_len(p, b);
    const int nb = (len + 63) / 64; /* the sequence's blocks */
    const int wm0 = m0 + 16 * warp;
    bss_thread<T, D> th;
    th.init(p, bh, h, m0, wm0, g, t, len);
    const bool bounded = p.bound != nullptr && th.n_tiles > BSS_BOUND_TILES;
    int cnt[2] = {0, 0};
    uint64_t thr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        /* the bound x admits every block whose score key reaches it */
        const uint32_t x =
            bounded && th.sel[r] ? p.bound[(int64_t)bh * p.row_blocks + th.mr[r]] : 0u;
        thr[r] = th.sel[r] ? (x > 0 ? ((uint64_t)x << 32) - 1 : 0) : ~0ull;
    }
    const T *kg = bss_keys_of<T, D>(p, b, h);
    /* keeps the top k of this warp's selecting rows that hold more than `limit` candidates
     * (limit < 0: more than k) */
    auto shrink = [&](int limit) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const unsigned need = __ballot_sync(
                0xffffffffu, t == 0 && th.sel[r] && cnt[r] > (limit < 0 ? th.kk[r] : limit));
            if (need) {
                const bss_row_state now = bss_keep_top<CAP>(
                    cand + (16 * warp + 8 * r) * CROW, need, {cnt[r], thr[r]}, th.kk[r], scratch);
                cnt[r] = now.cnt;
                thr[r] = now.thr;
            }
        }
    };

    bss_walk_tiles<T, D>(kbuf, kg, bss_range_of(w, th.n_tiles), nb, [&](int it, const T *tile) {
        const int j0 = it * BSS_KEYS;
        /* a plain tile: every key below every row's diagonal, none of them block 0, so each
         * key is its score's order key */
        const bool plain = it > 0 && j0 + BSS_KEYS <= wm0;
        if (th.warp_sel && j0 <= wm0 + 15) {
            float acc[8][4];
            th.score(tile, g, t, acc);
            /* in a plain tile, the n-tiles where no score can reach its row's threshold key are
             * passed over (one float compare a score; NaN goes on to the exact test). may[r]
             * marks the keys that pass that compare: key j0 + 8 nt + 2 t + e at bit
             * bss_own_bit(nt, e) of word nt / 4 (bs_slots.cuh) */
            unsigned nt_on = 0xffu;
            uint32_t may[2][2] = {{0u, 0u}, {0u, 0u}};
            if (plain) {
                float lim[2];
#pragma unroll
                for (int r = 0; r < 2; ++r)
                    lim[r] = th.sel[r] ? float_of_order_key((uint32_t)(thr[r] >> 32)) : INFINITY;
#pragma unroll
                for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                    for (int i = 0; i < 4; ++i)
                        if (!(acc[nt][i] < lim[i >> 1]))
                            may[i >> 1][nt >> 2] |= 1u << bss_own_bit(nt, i & 1);
                /* bit nt: any of the lane's keys of n-tile nt passes (byte nt % 4 of word nt / 4
                 * not 0, its bits gathered by a multiply) */
                unsigned reach = 0;
#pragma unroll
                for (int w = 0; w < 2; ++w) {
                    uint32_t x = (may[0][w] | may[1][w]) & 0x03030303u;
                    x = (x | x >> 1) & 0x01010101u;
                    reach |= (x * 0x01020408u) >> 24 << (4 * w);
                }
                nt_on = __reduce_or_sync(0xffffffffu, reach);
            }
            /* A plain tile's appends at once, where every row has room for all the keys its
             * mask passes and each of them is above its threshold (the common case once the
             * threshold is near the k-th score): each key's slot is the row's count plus the
             * row's keys above it in the tile (the quad's masks joined), so the candidates land
             * where the appends below would put them, in the same order, with no dependence
             * from one n-tile to the next. Where a row lacks the room (a compaction is due) or a
             * passed key is not a candidate (a score equal to the threshold's, NaN), it returns
             * false having moved nothing (what it wrote lies past the counts) and the appends
             * below take the tile. */
            auto append_masked = [&]() -> bool {
                uint64_t above[2];
                int total[2];
                bool fits = true;
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    uint32_t lo, hi;
                    bss_lane_row_mask(may[r][0], may[r][1], t, lo, hi);
                    lo |= __shfl_xor_sync(0xffffffffu, lo, 1);
                    hi |= __shfl_xor_sync(0xffffffffu, hi, 1);
                    lo |= __shfl_xor_sync(0xffffffffu, lo, 2);
                    hi |= __shfl_xor_sync(0xffffffffu, hi, 2);
                    total[r] = __popc(lo) + __popc(hi);
                    fits &= cnt[r] + total[r] <= CAP;
                    /* bit 8 nt + e: this lane's key of n-tile nt, column e */
                    above[r] = ((uint64_t)hi << 32 | lo) >> (2 * t);
                }
                if (!__all_sync(0xffffffffu, fits)) return false;
                bool exact = true;
#pragma unroll
                for (int nt = 7; nt >= 0; --nt) {
                    if (!((nt_on >> nt) & 1u)) continue;
#pragma unroll
                    for (int r = 0; r < 2; ++r)
#pragma unroll
                        for (int e = 1; e >= 0; --e) {
                            if (!((may[r][nt >> 2] >> bss_own_bit(nt, e)) & 1u)) continue;
                            const int j = j0 + 8 * nt + 2 * t + e;
                            const uint64_t c =
                                (uint64_t)bs_score_key(acc[nt][2 * r + e]) << 32 | (uint32_t)~j;
                            exact &= c > thr[r];
                            const int pos = cnt[r] + bss_keys_above(above[r], nt, e);
                            cand[(16 * warp + g + 8 * r) * CROW + pos] = c;
                        }
                }
                if (__any_sync(0xffffffffu, !exact)) return false;
                cnt[0] += total[0];
                cnt[1] += total[1];
                return true;
            };
            /* (not tried where a lane's own keys, four times over, would not fit its row: a
             * tile full of candidates, as near the diagonal, that needs a compaction anyway) */
            if (plain && nt_on != 0 && p.mask_append) {
                bool likely = true;
#pragma unroll
                for (int r = 0; r < 2; ++r)
                    likely &= cnt[r] + 4 * (__popc(may[r][0]) + __popc(may[r][1])) <= CAP;
                if (__all_sync(0xffffffffu, likely) && append_masked()) return;
            }
            /* append, highest block first: n-tiles downwards, lanes 3 .. 0 of a quad, and the
             * second column of a lane before its first. A plain tile's candidates need no
             * diagonal or block-0 tests (a compile-time branch) */
            auto append = [&](auto plain_tile) {
                constexpr bool PLAIN = decltype(plain_tile)::value;
#pragma unroll
                for (int nt = 7; nt >= 0; --nt) {
                    if (!((nt_on >> nt) & 1u)) continue;
                    shrink(CAP - 8); /* room for the n-tile */
                    const int jl = j0 + 8 * nt + 2 * t;
                    uint64_t c[2][2];
                    bool f[2][2];
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const float sc = acc[nt][2 * r + 1 - e];
                            const int j = jl + 1 - e;
                            c[r][e] = PLAIN ? (uint64_t)bs_score_key(sc) << 32 | (uint32_t)~j
                                            : bs_candidate(sc, j, th.mr[r]);
                            f[r][e] = c[r][e] > thr[r];
                        }
                    }
                    if (!__any_sync(0xffffffffu, f[0][0] || f[0][1] || f[1][0] || f[1][1]))
                        continue;
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        const int n = f[r][0] + f[r][1];
                        int total;
                        int pos = cnt[r] + quad_offset_down(n, t, total);
                        uint64_t *row = cand + (16 * warp + g + 8 * r) * CROW;
                        if (f[r][0]) row[pos++] = c[r][0];
                        if (f[r][1]) row[pos] = c[r][1];
                        cnt[r] += total;
                    }
                }
            };
            if (plain)
                append(std::true_type{});
            else
                append(std::false_type{});
        }
    });

    /* exactly k per selecting row (at most k in a chunk), then the offsets, ascending */
    if (th.warp_sel) shrink(-1);
    __syncwarp();
    if (w.chunks > 1) {
        /* a chunk's candidates go to memory, for bs_merge_kernel */
        if (!th.warp_sel) return;
#pragma unroll 1
        for (int rr = 0; rr < 16; ++rr) {
            /* (named, not indexed: an indexed array would go to local memory) */
            const int n = __shfl_sync(0xffffffffu, rr < 8 ? cnt[0] : cnt[1], (rr & 7) * 4);
            if (!th.row_sel(rr)) continue;
            const int64_t sr = bss_split_row(p, b, h, wm0 + rr) * BSS_SPLIT_MAX + w.chunk;
            const uint64_t *c = cand + (16 * warp + rr) * CROW;
            uint64_t *dst = p.split_cand + sr * BSS_MAX_K;
            for (int i = lane; i < n; i += 32) dst[i] = c[i];
            if (lane == 0) p.split_count[sr] = n;
        }
        return;
    }
#pragma unroll
    for (int rr = 0; rr < 16; ++rr) {
        const int m = wm0 + rr, k = th.row_k(rr);
        const bool s = th.row_sel(rr);
        if (m >= p.idx_row_blocks) continue;
        bss_write_row(p, (int64_t)bh * p.idx_row_blocks + m, k, s, cand + (16 * warp + rr) * CROW);
    }
}

/* The rows of split groups (a warp each, BSS_NT / 32 a CTA): the top k of the union of the
 * chunks' candidates, which come in descending block order (chunk 0 holds the highest tiles,
 * each chunk's list is in that order), so the kept list read backwards gives the ascending
 * offsets as in bs_stream_kernel. Rows that do not select get none or every block. */
constexpr int BSM_SLOTS = BSS_SPLIT_MAX * BSS_MAX_K / 32; /* warp_keep_top's values a lane */
__global__ void __launch_bounds__(BSS_NT)
    bs_merge_kernel(const __grid_constant__ bs_select_params p) {
    __shared__ uint64_t lists[BSS_NT / 32][BSS_SPLIT_MAX * BSS_MAX_K];
    __shared__ uint64_t scratch[BSS_NT / 32][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const bss_split_warp w = bss_split_warp_of(p);
    if (!w.valid) return;
    const int64_t row = (int64_t)w.bh * p.idx_row_blocks + w.m;
    if (!w.sel) {
        bss_write_row(p, row, w.k, false, nullptr);
        return;
    }
    const int64_t sr = bss_split_row(p, w.b, w.h, w.m) * BSS_SPLIT_MAX;
    uint64_t *c = lists[warp];
    int n = 0;
    for (int s = 0; s < w.chunks; ++s) {
        const int n_s = p.split_count[sr + s];
        const uint64_t *src = p.split_cand + (sr + s) * BSS_MAX_K;
        for (int i = lane; i < n_s; i += 32) c[n + i] = src[i];
        n += n_s;
    }
    __syncwarp();
    /* at least k: k distinct blocks reach the bound (or, without one, every chunk admits all).
     * warp_keep_top sized to the list: its samples are spread over all its slots, and with
     * most of them past the list it brackets the k-th value badly and falls back to its
     * quickselect (24 slots for lists of about 400 took 0.14 ms at 1M x 1 head) */
    const int k = min(w.k, n);
    if (k > 0 && k < n) {
        uint64_t *sc = scratch[warp];
        if (n <= 128)
            warp_keep_top<4>(c, n, k, sc);
        else if (n <= 256)
            warp_keep_top<8>(c, n, k, sc);
        else if (n <= 384)
            warp_keep_top<12>(c, n, k, sc);
        else if (n <= 512)
            warp_keep_top<16>(c, n, k, sc);
        else
            warp_keep_top<BSM_SLOTS>(c, n, k, sc);
    }
    bss_write_row(p, row, k, true, c);
}

template <typename T, int D>
static cudaError_t launch_bs_stream(const bs_select_params &sp, int cap, int64_t BH,
                                    cudaStream_t st) {
    const bool split = sp.chunk_tiles > 0;
    const int64_t items = split ? sp.split_items + sp.groups - sp.groups_r : sp.groups;
    const dim3 grid((unsigned)(items * BH));
    /* the rows of the split groups, BSS_NT / 32 a CTA */
    const dim3 split_grid(
        (unsigned)(((sp.groups_r - sp.chunk_tiles) * BSS_ROWS + BSS_NT / 32 - 1) / (BSS_NT / 32)),
        (unsigned)BH);
    cudaError_t e;
    if (sp.bound != nullptr) {
        auto bound = bs_bound_kernel<T, D>;
        const size_t smem = bsb_smem_bytes<D>();
        e = cudaFuncSetAttribute(bound, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        bound<<<grid, BSS_NT, smem, st>>>(sp);
        if (split) bs_bound_rank_kernel<<<split_grid, BSS_NT, 0, st>>>(sp);
    }
    auto kern = cap == BSS_CAP_NARROW ? bs_stream_kernel<T, D, BSS_CAP_NARROW>
                                      : bs_stream_kernel<T, D, BSS_CAP_WIDE>;
    const size_t smem = bss_smem_bytes<D>(cap);
    e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    kern<<<grid, BSS_NT, smem, st>>>(sp);
    if (split) bs_merge_kernel<<<split_grid, BSS_NT, 0, st>>>(sp);
    return cudaGetLastError();
}

/* ------------------------------------------------------------------------------------------ */
/* The estimate through scores in memory: a tensor-core pass writes every pooled score of the    */
/* causal triangle to memory as its order key, then a CTA per row block selects from them.       */

/* The layout of the keys and group summaries in memory (bsr_row_base, bsr_pair_summaries, ...) and
 * the bit-by-bit k-th largest: bs_scores.cuh. */
static_assert(BSR_ROWS == BSS_ROWS && BSR_TILE_KEYS == BSS_KEYS, "the streaming kernel's tiles");

/* The k-th largest of the n keys key(0 .. n - 1) (0 < k <= n), every key of the top k in
 * [lo, hi], by one warp, with no barrier: bsr_kth_largest_listed with one ballot per 32 keys a
 * count until at most 32 keys at or above lo are left in the range still open; those then sit
 * one a lane (listed through the warp's 32 words at `list`) and each count is one ballot. In the
 * select at 1M the counts over every key had been 40 % of its instructions. n_ge_lo: the keys at
 * or above lo, or -1 (counted here). */
template <typename KeyFn>
__device__ uint32_t bsr_warp_kth_largest(KeyFn key, int n, int k, uint32_t lo, uint32_t hi,
                                         int n_ge_lo, uint32_t *list) {
    const int lane = threadIdx.x & 31;
    auto count_ge = [&](uint32_t c) {
        int cnt = 0;
        for (int i0 = 0; i0 < n; i0 += 32) {
            const int i = i0 + lane;
            cnt += __popc(__ballot_sync(0xffffffffu, i < n && key(i) >= c));
        }
        return cnt;
    };
    uint32_t mine = 0u; /* this lane's listed key; 0 (below every count's threshold): none */
    auto list_keys = [&](uint32_t x, int bit) {
        int at = 0;
        for (int i0 = 0; i0 < n; i0 += 32) {
            const int i = i0 + lane;
            const uint32_t v = i < n ? key(i) : 0u;
            const bool in = i < n && v >= lo && ((v - x) >> bit) <= 1u;
            const unsigned bal = __ballot_sync(0xffffffffu, in);
            if (in) list[at + lanes_below(bal)] = v;
            at += __popc(bal);
        }
        __syncwarp();
        mine = lane < at ? list[lane] : 0u;
        __syncwarp(); /* the list is written again by the warp's next call */
    };
    auto list_ge = [&](uint32_t c) { return __popc(__ballot_sync(0xffffffffu, mine >= c)); };
    return bsr_kth_largest_listed(count_ge, list_keys, list_ge, k, lo, hi, 32,
                                  n_ge_lo >= 0 ? n_ge_lo : count_ge(lo));
}

/* staged words a row, two 16-bit keys each: 16-byte aligned, no bank conflicts either way */
constexpr int BSR_STAGE_ROW = BSS_KEYS / 2 + 4;

/* The 16-bit order keys (bs_score_key's upper halves) of scores a and b, a in the low half: the
 * upper halves of their bits gathered, then each half with its sign set flipped whole, else its
 * sign bit set (one byte permutation replicates each half's sign over it). */
__device__ __forceinline__ uint32_t bsr_key16x2(float a, float b) {
    const uint32_t x = __byte_perm(__float_as_uint(a), __float_as_uint(b), 0x7632);
    uint32_t sign;
    asm("prmt.b32 %0, %1, 0, 0xbb99;" : "=r"(sign) : "r"(x));
    return x ^ (sign | 0x80008000u);
}

/* What both score kernels do with a warp's 16 x 64 scores of key tile `it`, s[4 nt + i] in the
 * mma / wgmma accumulator layout (lane g, t: rows mr[0] and mr[1] in i = 0, 1 and 2, 3, keys
 * 8 nt + 2 t + (i & 1)), in two steps. bsr_pack_tile: the 16-bit order keys (bs_rank_key's
 * upper halves, zeros past the diagonal), two a word, key[8 r + nt] for row mr[r]. Then
 * bsr_store_keys: the keys staged in shared memory and written a row's 128 bytes at a time for
 * the rows in sel_rows (the warp's rows start at out, row_len keys apart), and each 16-key
 * group's summary (bsr_summary_16x2: two lanes' halves, merged) handed to put_sum(on, i, rr,
 * group, summary), on for one lane a group of a selecting row; step i covers the warp's rows
 * 4 i .. 4 i + 3, one a quarter warp. The wgmma kernel packs a tile before the next tile's
 * product overwrites its accumulators, so that one set of 32 serves both (with two, ptxas had
 * copied the finished one out after every product: 6 % of the kernel's instructions). */
__device__ __forceinline__ void bsr_pack_tile(const float *s, int it, const int (&mr)[2], int t,
                                              uint32_t (&key)[16]) {
    /* a tile past block 0 and before every row's diagonal (most of them): each key is its
     * score's order key, no block is forced and none lies past its row (mr[0] of lane 0 is the
     * warp's first row) */
    const int first_row = __shfl_sync(0xffffffffu, mr[0], 0);
    if (it > 0 && (it + 1) * BSS_KEYS <= first_row) {
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
                key[8 * r + nt] = bsr_key16x2(s[4 * nt + 2 * r], s[4 * nt + 2 * r + 1]);
    } else {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int m = mr[r];
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
                const int j = it * BSS_KEYS + 8 * nt + 2 * t;
                const uint32_t k0 = j <= m ? bs_rank_key(s[4 * nt + 2 * r], j, m) : 0u;
                const uint32_t k1 = j + 1 <= m ? bs_rank_key(s[4 * nt + 2 * r + 1], j + 1, m) : 0u;
                key[8 * r + nt] = __byte_perm(k0, k1, 0x7632);
            }
        }
    }
}
template <typename PutSum>
__device__ __forceinline__ void bsr_store_keys(const uint32_t (&key)[16], int it, int g, int t,
                                               int lane, uint32_t *stage, unsigned sel_rows,
                                               uint16_t *out, int row_len, PutSum put_sum) {
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
            stage[(g + 8 * r) * BSR_STAGE_ROW + 4 * nt + t] = key[8 * r + nt];
    __syncwarp();
    /* four rows a store: a quarter warp a row, eight keys a lane; the lane's address and row
     * bits worked out once (per store they had been a 64-bit product and sum, and a branch) */
    const int quarter = lane >> 3, c = 4 * (lane & 7);
    const unsigned sel_quarter = sel_rows >> quarter; /* bit 4 i: row 4 i + quarter */
    const uint32_t *stage_q = stage + quarter * BSR_STAGE_ROW + c;
    uint16_t *out_q = out + (int64_t)quarter * row_len + it * BSS_KEYS + 2 * c;
    const int64_t out_step = 4 * (int64_t)row_len;
    const bool lead = (lane & 1) == 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint4 v = *reinterpret_cast<const uint4 *>(stage_q + 4 * i * BSR_STAGE_ROW);
        const bool sel = (sel_quarter >> (4 * i)) & 1u;
        st_global_v4_if(sel, out_q + i * out_step, v);
        uint32_t top, second;
        bsr_top2_16x2_of4({v.x, v.y, v.z, v.w}, top, second);
        bsr_top2_16x2_merge(top, second, __shfl_xor_sync(0xffffffffu, top, 1),
                            __shfl_xor_sync(0xffffffffu, second, 1));
        put_sum(lead && sel, i, 4 * i + quarter, (lane & 7) >> 1, bsr_summary_16x2(top, second));
    }
    __syncwarp(); /* the stage is written again by the next tile */
}
template <typename PutSum>
__device__ __forceinline__ void bsr_store_tile(const float *s, int it, const int (&mr)[2], int g,
                                               int t, int lane, uint32_t *stage, unsigned sel_rows,
                                               uint16_t *out, int row_len, PutSum put_sum) {
    uint32_t key[16];
    bsr_pack_tile(s, it, mr, t, key);
    bsr_store_keys(key, it, g, t, lane, stage, sel_rows, out, row_len, put_sum);
}

/* The key tiles one CTA of bs_score_kernel scores, by default. */
constexpr int BSR_CHUNK_TILES = 8;

/* Where a CTA of either score kernel works: the pair (z among the launch's, bh, b, h), the row
 * group from m0 and the warp's rows from wm0, key tiles from lo on; false where it has nothing
 * to score. */
struct bsr_score_place {
    int z, bh, b, h, group, m0, lo, len, nb, wm0;
    /* the keys a row of the group takes (its rows lie that far apart) */
    __device__ __forceinline__ int row_len() const { return BSS_KEYS * (group + 1); }
    /* where the keys and the group summaries of the warp's first row go */
    __device__ __forceinline__ uint16_t *keys_out(const bs_select_params &p, int warp) const {
        return p.scores + (int64_t)z * p.score_pair_keys + bsr_group_base(group) +
               (int64_t)(16 * warp) * row_len();
    }
    __device__ __forceinline__ uint32_t *sums_out(const bs_select_params &p) const {
        return p.score_sums + (int64_t)z * bsr_pair_summaries(p.row_blocks) +
               (int64_t)wm0 * p.score_sum_stride;
    }
};
__device__ __forceinline__ bool bsr_score_place_of(const bs_select_params &p, int warp,
                                                   bsr_score_place &w) {
    w.z = blockIdx.z;
    w.bh = p.score_bh0 + w.z;
    w.b = w.bh / p.heads;
    w.h = w.bh % p.heads;
    w.group = (int)(gridDim.y - 1 - blockIdx.y);
    w.m0 = w.group * BSS_ROWS;
    w.lo = (int)blockIdx.x * p.score_chunk_tiles;
    if (!p.active[w.h] || w.m0 >= p.idx_row_blocks || w.lo > w.group) return false;
    w.len = bs_seq_len(p, w.b);
    w.nb = (w.len + 63) / 64;
    w.wm0 = w.m0 + 16 * warp;
    return w.m0 < w.nb;
}

/* Grid (chunks of score_chunk_tiles key tiles, row groups longest first, pairs): the scores of a
 * row group's 64 row blocks against one chunk of key tiles, computed as bs_stream_kernel computes
 * them (bss_thread::score, the same sums in the same order), written as bs_rank_key with each
 * group of BSR_GROUP_KEYS keys' summary (bsr_store_tile; the chunk's summaries staged and written
 * 16 bytes at a time). Rows that take none or every block are not written (the select does not
 * read them). */
/* the group summaries of a chunk's tiles, a row's BSR_GROUPS x BSR_MAX_CHUNK_TILES */
constexpr int BSR_MAX_CHUNK_TILES = 8;
constexpr int BSR_SUM_ROW = BSR_GROUPS * BSR_MAX_CHUNK_TILES + 4;
template <int D> constexpr size_t bsr_score_smem() {
    return bss_key_bytes<D>() + (size_t)BSS_ROWS * (BSR_STAGE_ROW + BSR_SUM_ROW) * 4;
}
template <typename T, int D>
__global__ void __launch_bounds__(BSS_NT, 3)
    bs_score_kernel(const __grid_constant__ bs_select_params p) {
    extern __shared__ __align__(16) unsigned char smem[];
    T *kbuf = reinterpret_cast<T *>(smem); /* [2][64][KS] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    uint32_t *stage = reinterpret_cast<uint32_t *>(smem + bss_key_bytes<D>()) +
                      16 * warp * BSR_STAGE_ROW; /* [16][BSR_STAGE_ROW] */
    uint32_t *stage_sum = reinterpret_cast<uint32_t *>(smem + bss_key_bytes<D>()) +
                          BSS_ROWS * BSR_STAGE_ROW + 16 * warp * BSR_SUM_ROW; /* [16][..] */
    bsr_score_place w;
    if (!bsr_score_place_of(p, warp, w)) return;
    const int bh = w.bh, b = w.b, h = w.h, m0 = w.m0, lo = w.lo;
    const int len = w.len, nb = w.nb, wm0 = w.wm0;
    bss_thread<T, D> th;
    th.init(p, bh, h, m0, wm0, g, t, len);
    if (th.n_tiles == 0) return;
    const bss_range range = {lo, min(lo + p.score_chunk_tiles, th.n_tiles), 0};
    unsigned sel_rows = 0; /* bit rr: the warp's row rr selects (its keys are written) */
    for (int rr = 0; rr < 16; ++rr) sel_rows |= (unsigned)th.row_sel(rr) << rr;
    const int row_len = w.row_len();
    uint16_t *out = w.keys_out(p, warp);
    uint32_t *sums_out = w.sums_out(p);
    bss_walk_tiles<T, D>(kbuf, bss_keys_of<T, D>(p, b, h), range, nb, [&](int it, const T *tile) {
        if (!th.warp_sel) return;
        float acc[8][4];
        th.score(tile, g, t, acc);
        bsr_store_tile(&acc[0][0], it, th.mr, g, t, lane, stage, sel_rows, out, row_len,
                       [&](bool on, int, int rr, int grp, uint32_t sum) {
                           if (on)
                               stage_sum[rr * BSR_SUM_ROW + BSR_GROUPS * (it - range.lo) + grp] =
                                   sum;
                       });
    });
    if (!th.warp_sel) return;
    /* the chunk's summaries, BSR_GROUPS x its tiles a row (16-byte pieces: a quarter of the warp a
     * row) */
    const int pieces = BSR_GROUPS * (range.hi - range.lo) / 4;
    for (int i = lane; i < 16 * pieces; i += 32) {
        const int rr = i / pieces, c = 4 * (i % pieces);
        if (!((sel_rows >> rr) & 1u)) continue;
        *reinterpret_cast<uint4 *>(sums_out + rr * p.score_sum_stride + BSR_GROUPS * range.lo + c) =
            *reinterpret_cast<const uint4 *>(stage_sum + rr * BSR_SUM_ROW + c);
    }
}

/* The same scores by wgmma on Hopper (bs_score_wg_kernel): the row group's pooled queries and
 * two key tiles in shared memory, 128-byte swizzled (sw_off), the keys of tile it - 1 multiplied
 * asynchronously while the warps write those of tile it, the summaries written a word at a time
 * (no chunk staging). The sums are wgmma's, in the order of d: they may differ from
 * bs_stream_kernel's in the last bits, so near-ties can fall the other way (MI_CUDA_BS_WGMMA=0
 * takes bs_score_kernel, whose scores are the streaming kernel's bit for bit). */
template <int D> constexpr size_t bsr_wg_tile_bytes() { return (size_t)BSS_KEYS * D * 2; }
template <int D> constexpr size_t bsr_wg_smem() {
    /* Q, two key tiles, the stage, and the mbarriers of the tiles' TMA loads */
    return 1024 + 3 * bsr_wg_tile_bytes<D>() + (size_t)BSS_ROWS * BSR_STAGE_ROW * 4 +
           4 * sizeof(uint64_t);
}
/* Tensor maps of the pooled queries and keys (d, row block, head, batch) in 64-row boxes, where
 * the tiles come by TMA (D = 128; on: both encoded): one thread issues a tile's two boxes, where
 * every thread had computed and issued eight 16-byte copies (with their addresses, 15 % of the
 * kernel's instructions at 1M). */
struct bsr_score_maps {
    CUtensorMap q, k;
    int32_t on;
};
template <typename T, int D>
__global__ void __launch_bounds__(BSS_NT, 3)
    bs_score_wg_kernel(const __grid_constant__ bs_select_params p,
                       const __grid_constant__ bsr_score_maps mp) {
#ifdef MI_SM90_DEVICE
    constexpr int HALF = BSS_KEYS * 128; /* bytes of 64 rows of 64 two-byte values */
    constexpr int TILE = (int)bsr_wg_tile_bytes<D>();
    static_assert(BSS_ROWS == 64 && BSS_KEYS == 64 && BSS_NT == 128, "one m64n64 warpgroup");
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char *qs = smem_base_1024(smem_raw);
    unsigned char *ks = qs + TILE; /* [2][TILE] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    uint32_t *stage = reinterpret_cast<uint32_t *>(ks + 2 * TILE) + 16 * warp * BSR_STAGE_ROW;
    bsr_score_place w;
    if (!bsr_score_place_of(p, warp, w)) return;
    const int bh = w.bh, b = w.b, h = w.h, m0 = w.m0, lo = w.lo;
    const int len = w.len, nb = w.nb, wm0 = w.wm0;
    bss_thread<T, D> th; /* rows, top k and selects (its query fragments go unused) */
    th.init(p, bh, h, m0, wm0, g, t, len);
    if (th.n_tiles == 0) return;
    const int hi = min(lo + p.score_chunk_tiles, th.n_tiles);
    unsigned sel_rows = 0;
    for (int rr = 0; rr < 16; ++rr) sel_rows |= (unsigned)th.row_sel(rr) << rr;
    const int row_len = w.row_len();
    uint16_t *out = w.keys_out(p, warp);
    uint32_t *sums_out = w.sums_out(p);
    /* 64 rows of D values from src (rows from row0 on, zeros from nb on) into dst, swizzled */
    auto load_rows = [&](uint32_t dst, const T *src, int row0) {
#pragma unroll
        for (int i = 0; i < BSS_KEYS * D / 8 / BSS_NT; ++i) {
            const int c = (int)threadIdx.x + i * BSS_NT;
            const int r = c / (D / 8), piece = c % (D / 8), j = row0 + r;
            const bool ok = j < nb;
            cp_async_16(dst + sw_off(r, piece, HALF), src + (int64_t)(ok ? j : 0) * D + 8 * piece,
                        ok ? 16 : 0);
        }
    };
    const T *kg = bss_keys_of<T, D>(p, b, h);
    const uint32_t qs_a = smem_addr(qs), ks_a = smem_addr(ks);
    /* the TMA path: q_full, then k_full of the two key buffers; buffer (hi - 1 - t) & 1 takes
     * tile t, as its ((hi - 1 - t) >> 1)-th load */
    const bool tma = D == 128 && mp.on;
    uint64_t *bars = reinterpret_cast<uint64_t *>(ks + 2 * TILE + BSS_ROWS * BSR_STAGE_ROW * 4);
    const int hk = h / p.group;
    auto key_parity = [&](int t) { return ((hi - 1 - t) >> 1) & 1; };
    if (tma) {
        if (threadIdx.x == 0) {
            for (int i = 0; i < 3; ++i) mbar_init(bars + i, 1);
            fence_mbarrier_init();
            tma_load_tile<BSS_KEYS>(qs_a, &mp.q, m0, h, b, bars);
            tma_load_tile<BSS_KEYS>(ks_a, &mp.k, (hi - 1) * BSS_KEYS, hk, b, bars + 1);
            if (hi - 2 >= lo)
                tma_load_tile<BSS_KEYS>(ks_a + TILE, &mp.k, (hi - 2) * BSS_KEYS, hk, b, bars + 2);
        }
        __syncthreads(); /* the barriers initialised */
    } else {
        load_rows(qs_a, static_cast<const T *>(p.qp) + (int64_t)bh * p.row_blocks * D, m0);
        load_rows(ks_a, kg, (hi - 1) * BSS_KEYS);
        cp_async_commit();
        if (hi - 2 >= lo) load_rows(ks_a + TILE, kg, (hi - 2) * BSS_KEYS);
        cp_async_commit();
    }
    const sw128_desc qd(qs_a, 16, 1024);
    auto issue = [&](float *s, int buf) {
        wgmma_issue_qk<T, D>(s, qd, HALF, sw128_desc(ks_a + buf * TILE, 16, 1024), HALF);
    };
    float acc[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] = 0.f;
    if (tma) {
        mbar_wait(bars, 0);
        mbar_wait(bars + 1, 0);
    } else {
        cp_async_wait<1>();
        fence_proxy_async();
        __syncthreads();
    }
    issue(acc, 0);
    wgmma_wait<0>();
    fence_operands<32>(acc);
    /* where the lane's summaries go: row (lane >> 3) + 4 i, group (lane & 7) >> 1 of a tile */
    uint32_t *sums_lane = sums_out + (int64_t)(lane >> 3) * p.score_sum_stride + ((lane & 7) >> 1);
    const int64_t sums_step = 4 * (int64_t)p.score_sum_stride;
    auto write = [&](const uint32_t(&key)[16], int it) {
        if (th.warp_sel)
            bsr_store_keys(key, it, g, t, lane, stage, sel_rows, out, row_len,
                           [&](bool on, int i, int, int, uint32_t sum) {
                               st_global_if(on, sums_lane + BSR_GROUPS * it + i * sums_step, sum);
                           });
    };
    /* acc: tile it's scores, from buffer cb; tile it - 1's keys loading into the other. Packs
     * tile it's keys, starts tile it - 1's product into acc and tile it - 2's keys into cb, and
     * writes tile it meanwhile. Nothing is in flight from one tile to the next, and the issue,
     * the writes and the wait sit in one branch: ptxas serialises wgmma whose accumulators
     * other instructions might read before the wait, as it did with them split over two
     * branches on the same condition. */
    for (int it = hi - 1, cb = 0; it >= lo; --it, cb ^= 1) {
        uint32_t key[16];
        bsr_pack_tile(acc, it, th.mr, t, key);
        if (it - 1 >= lo) {
            if (tma) {
                mbar_wait(bars + 1 + (cb ^ 1), key_parity(it - 1)); /* tile it - 1's keys */
                __syncthreads(); /* every warp is done with buffer cb */
                if (threadIdx.x == 0 && it - 2 >= lo)
                    tma_load_tile<BSS_KEYS>(ks_a + cb * TILE, &mp.k, (it - 2) * BSS_KEYS, hk, b,
                                            bars + 1 + cb);
            } else {
                cp_async_wait<0>();
                fence_proxy_async();
                __syncthreads(); /* tile it - 1's keys in view; every warp is done with buffer cb */
                if (it - 2 >= lo) load_rows(ks_a + cb * TILE, kg, (it - 2) * BSS_KEYS);
                cp_async_commit();
            }
            issue(acc, cb ^ 1);
            write(key, it);
            wgmma_wait<0>();
            fence_operands<32>(acc);
        } else {
            write(key, it);
        }
    }
#endif
}

/* Writes the top k of n candidate blocks as ascending offsets, by one warp: key(i) ranks
 * candidate i, block(i) is its block, ascending in i; every key of the top k lies in [lo, hi].
 * The k-th largest key, then every key above it and the first of those equal to it (lower
 * block first, the CPU reference's order), with ballots only. n_ge_lo and list: as
 * bsr_warp_kth_largest's. */
template <typename KeyFn, typename BlockFn>
__device__ void bsr_warp_emit(KeyFn key, BlockFn block, int n, int k, uint32_t lo, uint32_t hi,
                              int n_ge_lo, uint32_t *list, int32_t *off) {
    const bool all = k >= n;
    const uint32_t thr = all ? 0u : bsr_warp_kth_largest(key, n, k, lo, hi, n_ge_lo, list);
    int above = 0;
    for (int i0 = 0; i0 < n && !all; i0 += 32) {
        const int i = i0 + (threadIdx.x & 31);
        above += __popc(__ballot_sync(0xffffffffu, i < n && key(i) > thr));
    }
    const int take_eq = k - above;
    int eq_run = 0, out = 0;
    for (int i0 = 0; i0 < n; i0 += 32) {
        const int i = i0 + (threadIdx.x & 31);
        const uint32_t u = i < n ? key(i) : 0u;
        const bool eq = i < n && !all && u == thr;
        const unsigned eq_bal = __ballot_sync(0xffffffffu, eq);
        const bool take =
            i < n && (all || u > thr || (eq && eq_run + lanes_below(eq_bal) < take_eq));
        const unsigned take_bal = __ballot_sync(0xffffffffu, take);
        if (take) off[out + lanes_below(take_bal)] = 64 * block(i);
        eq_run += __popc(eq_bal);
        out += __popc(take_bal);
    }
}

/* Appends this lane's entries e = 0 .. N - 1 whose keep[e] is set, in ascending order of
 * N * lane + e after the warp's `base` entries so far: put(at, e) for each, at its place.
 * Returns base + the warp's count. Ballots only (no scan). */
template <int N, typename PutFn>
__device__ __forceinline__ int bsr_warp_append(const bool (&keep)[N], int base, PutFn put) {
    unsigned bal[N];
    int at = base, total = base;
#pragma unroll
    for (int e = 0; e < N; ++e) {
        bal[e] = __ballot_sync(0xffffffffu, keep[e]);
        at += lanes_below(bal[e]);
        total += __popc(bal[e]);
    }
#pragma unroll
    for (int e = 0; e < N; ++e)
        if (keep[e]) put(at++, e);
    return total;
}

__device__ __forceinline__ uint32_t bsr_lane_of(const uint4 &u, int e) {
    return e == 0 ? u.x : e == 1 ? u.y : e == 2 ? u.z : u.w;
}
/* Key e of the eight 16-bit keys in u, as the 32-bit key it ranks as (its upper half). */
__device__ __forceinline__ uint32_t bsr_key_of(const uint4 &u, int e) {
    const uint32_t w = bsr_lane_of(u, e >> 1);
    return e & 1 ? w & 0xffff0000u : w << 16;
}

/* Grid (groups of BSR_WARPS row blocks longest first, pairs): a warp per row block, its top k
 * from its keys in memory, with no barrier. The k-th largest 16-bit value of the row's group
 * summaries (from bs_score_kernel) bounds the row's k-th key from below (bsr_summary_count,
 * counted down by bsr_summary_count_down).
 * Only the groups whose largest key reaches the bound can hold a key of the top k: the warp
 * lists them in order, reads them 16 groups (a 16-byte read a lane) at a time, BSR_BATCH
 * reads in flight, and lists their keys at or above the bound, in ascending order;
 * bsr_warp_emit selects from those. Where more than BSR_WCAND groups or keys reach the bound
 * (short rows, many near scores), the k-th largest key listed is a higher bound and the warp
 * lists again; where that fails too, it selects from the whole row in memory. The summaries sit
 * in registers for the bound's counts up to BSR_REG_GROUPS of them (1M). */
constexpr int BSR_WARPS = 8;
constexpr int BSR_WCAND = 512;
constexpr int BSR_BATCH = 4;
constexpr int BSR_REG_GROUPS = 1024;
/* the bound search's stop (bsr_summary_bound) on rows of BSR_REG_GROUPS summaries, and
 * proportionally less on shorter ones: at 1M x 1 the select took 0.145 / 0.152 ms with the
 * search run to its end, 0.140 / 0.148 stopping within 32 (random / position-coded); 32 on every
 * row had made it 8-15 % slower at 128K x 32 heads (rows of at most 128 summaries, k = 100),
 * where the extra keys listed cost more than the counts saved */
constexpr int BSR_BOUND_SLACK = 32;
/* three CTAs an SM (80 registers a thread, one 4-byte spill): 0.189 / 0.207 ms at 1M x 1
 * (random / position-coded) against 0.217 / 0.238 with two (115 registers) */
constexpr int BSR_CTAS_PER_SM = 3;
__global__ void __launch_bounds__(32 * BSR_WARPS, BSR_CTAS_PER_SM)
    bs_row_select_kernel(const __grid_constant__ bs_select_params p) {
    __shared__ int cand[BSR_WARPS][BSR_WCAND];
    __shared__ uint32_t cand_key[BSR_WARPS][BSR_WCAND];
    __shared__ int cand_group[BSR_WARPS][BSR_WCAND];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int z = blockIdx.y, bh = p.score_bh0 + z;
    const int b = bh / p.heads, h = bh % p.heads;
    const int m = p.idx_row_blocks - 1 - (int)(blockIdx.x * BSR_WARPS + warp);
    if (!p.active[h] || m < 0) return;
    const int len = bs_seq_len(p, b), n = m + 1, k = bs_row_k(p, h, m, len);
    const int64_t row = (int64_t)bh * p.idx_row_blocks + m;
    if (bs_row_trivial<32>(p, row, k, n, lane)) return;
    int32_t *off = p.block_offset + row * p.max_blocks;
    const uint16_t *keys = p.scores + (int64_t)z * p.score_pair_keys + bsr_row_base(m);
    const uint32_t *sums = p.score_sums + (int64_t)z * bsr_pair_summaries(p.row_blocks) +
                           (int64_t)m * p.score_sum_stride;
    const uint4 *sv = reinterpret_cast<const uint4 *>(sums);
    const int ng = BSR_GROUPS * (m / BSS_ROWS + 1), ng4 = ng / 4; /* BSR_GROUPS is 4 */
    /* the range of the nonzero 16-bit values, and the largest summary */
    uint32_t lo16 = 0xffffu, hi16 = 0u, top = 0u;
    auto range_of = [&](uint32_t w) {
        bsr_summary_range(w, lo16, hi16);
        top = max(top, w);
    };
    uint32_t x16 = 0u;
    if (ng <= BSR_REG_GROUPS) {
        uint4 sr[BSR_REG_GROUPS / 128];
#pragma unroll
        for (int r = 0; r < BSR_REG_GROUPS / 128; ++r) {
            const int i = 32 * r + lane;
            sr[r] = i < ng4 ? __ldg(sv + i) : make_uint4(0u, 0u, 0u, 0u);
            if (i < ng4) {
                range_of(sr[r].x);
                range_of(sr[r].y);
                range_of(sr[r].z);
                range_of(sr[r].w);
            }
        }
        /* the counts read only the registers that hold summaries (NR of them a lane, a
         * compile-time count: all eight were counted, zeros too, so at 128K eight times the
         * work) */
        const uint32_t lo_w = __reduce_min_sync(0xffffffffu, lo16),
                       hi_w = __reduce_max_sync(0xffffffffu, hi16);
        auto bound_of = [&](auto nr) {
            constexpr int NR = decltype(nr)::value;
            return bsr_summary_bound(
                [&](uint32_t c) {
                    /* counted down from the lane's NR x 8 values (zeros included) */
                    int n_top = 4 * NR, n_second = 4 * NR;
                    const uint32_t x = c << 16;
#pragma unroll
                    for (int r = 0; r < NR; ++r) {
                        bsr_summary_count_down(sr[r].x, x, n_top, n_second);
                        bsr_summary_count_down(sr[r].y, x, n_top, n_second);
                        bsr_summary_count_down(sr[r].z, x, n_top, n_second);
                        bsr_summary_count_down(sr[r].w, x, n_top, n_second);
                    }
                    return (int)__reduce_add_sync(0xffffffffu, (unsigned)(n_top + n_second));
                },
                k, p.score_slack < 0 ? -1 : p.score_slack * NR / 8, lo_w, hi_w);
        };
        static_assert(BSR_REG_GROUPS / 128 == 8, "the register counts below");
        const int nr = (ng4 + 31) / 32;
        x16 = nr <= 1   ? bound_of(std::integral_constant<int, 1>())
              : nr <= 2 ? bound_of(std::integral_constant<int, 2>())
              : nr <= 4 ? bound_of(std::integral_constant<int, 4>())
                        : bound_of(std::integral_constant<int, 8>());
    } else {
        for (int i = lane; i < ng; i += 32) range_of(__ldg(sums + i));
        x16 = bsr_summary_bound(
            [&](uint32_t c) {
                int n_top = 0, n_second = 0, words = 0;
                for (int i = lane; i < ng; i += 32, ++words)
                    bsr_summary_count_down(__ldg(sums + i), c << 16, n_top, n_second);
                return (int)__reduce_add_sync(0xffffffffu,
                                              (unsigned)(2 * words + n_top + n_second));
            },
            k, p.score_slack, __reduce_min_sync(0xffffffffu, lo16),
            __reduce_max_sync(0xffffffffu, hi16));
    }
    uint32_t bound = x16 << 16;
    const uint32_t hi = __reduce_max_sync(0xffffffffu, top) | 0xffffu;
    int *wc = cand[warp], *wg = cand_group[warp];
    uint32_t *wk = cand_key[warp];
    /* bsr_warp_kth_largest's list of 32 keys: the group list's first words, free once a collect
     * has read it (a separate array took the static shared memory past sm_80's 48 KB) */
    uint32_t *kth_list = reinterpret_cast<uint32_t *>(wg);
    const uint4 *kv = reinterpret_cast<const uint4 *>(keys);
    /* Lists the keys at or above bnd, in ascending order, from the groups whose largest key
     * can reach it: up to BSR_WCAND of them in wc / wk, the count listed returned; over: more
     * reach bnd than were listed. */
    auto collect = [&](uint32_t bnd, bool &over) {
        const uint32_t group_bnd = bnd & 0xffff0000u; /* what the summaries resolve */
        int n_groups = 0;
        for (int i0 = 0; i0 < ng4 && n_groups <= BSR_WCAND; i0 += 32) {
            const int i = i0 + lane;
            const uint4 u = i < ng4 ? __ldg(sv + i) : make_uint4(0u, 0u, 0u, 0u);
            bool keep[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) keep[e] = i < ng4 && bsr_lane_of(u, e) >= group_bnd;
            n_groups = bsr_warp_append(keep, n_groups, [&](int at, int e) {
                if (at < BSR_WCAND) wg[at] = 4 * i + e;
            });
        }
        __syncwarp();
        const int listed = min(n_groups, BSR_WCAND);
        int n_cand = 0;
        /* their keys, half a group (eight keys, 16 bytes) a lane */
        for (int c0 = 0; c0 < listed && n_cand <= BSR_WCAND; c0 += 16 * BSR_BATCH) {
            uint4 u[BSR_BATCH];
            int gi[BSR_BATCH];
#pragma unroll
            for (int r = 0; r < BSR_BATCH; ++r) {
                const int c = c0 + 16 * r + (lane >> 1);
                gi[r] = c < listed ? wg[c] : -1;
                u[r] =
                    gi[r] >= 0 ? __ldcs(kv + 2 * gi[r] + (lane & 1)) : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
            for (int r = 0; r < BSR_BATCH; ++r) {
                const int j = BSR_GROUP_KEYS * gi[r] + 8 * (lane & 1);
                bool keep[8];
#pragma unroll
                for (int e = 0; e < 8; ++e)
                    keep[e] = gi[r] >= 0 && j + e < n && bsr_key_of(u[r], e) >= bnd;
                n_cand = bsr_warp_append(keep, n_cand, [&](int at, int e) {
                    if (at < BSR_WCAND) {
                        wc[at] = j + e;
                        wk[at] = bsr_key_of(u[r], e);
                    }
                });
            }
        }
        __syncwarp();
        over = n_cand > BSR_WCAND || n_groups > BSR_WCAND;
        return min(n_cand, BSR_WCAND);
    };
    bool over;
    int n_cand = collect(bound, over);
    /* Too many keys reach the bound (short rows with fewer than k summary values, many near
     * ones): the k-th largest of those listed is reached by k distinct keys, a higher bound. */
    if (over && n_cand >= k && p.score_raise) {
        const uint32_t raised =
            bsr_warp_kth_largest([&](int i) { return wk[i]; }, n_cand, k, bound, hi, n_cand,
                                 kth_list);
        __syncwarp();
        if (raised > bound) {
            bound = raised;
            n_cand = collect(bound, over);
        }
    }
    if (!over)
        bsr_warp_emit([&](int i) { return wk[i]; }, [&](int i) { return wc[i]; }, n_cand, k, bound,
                      hi, n_cand, kth_list, off);
    else
        bsr_warp_emit([&](int j) { return (uint32_t)keys[j] << 16; }, [&](int j) { return j; }, n,
                      k, bound, hi, -1, kth_list, off);
}

template <typename T, int D>
static cudaError_t launch_bs_scores(bs_select_params sp, int64_t BH, int64_t chunk_pairs,
                                    cudaStream_t st) {
    /* wgmma where the Hopper kernels run, unless MI_CUDA_BS_WGMMA=0 */
    const char *wg_env = getenv("MI_CUDA_BS_WGMMA");
    const bool wg = mi_cuda_sm90_usable() && !(wg_env && wg_env[0] == '0');
    const size_t smem = wg ? bsr_wg_smem<D>() : bsr_score_smem<D>();
    if (!wg) sp.score_chunk_tiles = std::min(sp.score_chunk_tiles, BSR_MAX_CHUNK_TILES);
    cudaError_t e =
        wg ? cudaFuncSetAttribute(bs_score_wg_kernel<T, D>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)
           : cudaFuncSetAttribute(bs_score_kernel<T, D>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    /* the wgmma kernel's tiles by TMA where D is 128, unless MI_CUDA_BS_SCORE_TMA=0 (then, or
     * where a map cannot be made, by 16-byte copies) */
    bsr_score_maps maps;
    memset(&maps, 0, sizeof maps);
    const char *tma_env = getenv("MI_CUDA_BS_SCORE_TMA");
    if (wg && D == 128 && !(tma_env && tma_env[0] == '0')) {
        const int heads_kv = sp.heads / sp.group, batch = sp.bh / sp.heads;
        const int64_t rows = sp.row_blocks;
        const int64_t q_stride[3] = {sp.heads * rows * D, rows * D, D};
        const int64_t k_stride[3] = {heads_kv * rows * D, rows * D, D};
        const bool bf16 = std::is_same<T, __nv_bfloat16>::value;
        maps.on =
            encode_tma_map(&maps.q, sp.qp, q_stride, batch, sp.heads, sp.row_blocks, D, 64, bf16) &&
            encode_tma_map(&maps.k, sp.kp, k_stride, batch, heads_kv, sp.row_blocks, D, 64, bf16);
    }
    const unsigned groups = (unsigned)sp.groups_r;
    const unsigned chunks = (groups + sp.score_chunk_tiles - 1) / sp.score_chunk_tiles;
    for (int64_t z0 = 0; z0 < BH; z0 += chunk_pairs) {
        const unsigned nz = (unsigned)std::min<int64_t>(chunk_pairs, BH - z0);
        bool any = false; /* chunks of heads the call does not take launch nothing */
        for (int64_t bh = z0; bh < z0 + nz; ++bh) any |= sp.active[bh % sp.heads] != 0;
        if (!any) continue;
        sp.score_bh0 = (int32_t)z0;
        if (wg)
            bs_score_wg_kernel<T, D><<<dim3(chunks, groups, nz), BSS_NT, smem, st>>>(sp, maps);
        else
            bs_score_kernel<T, D><<<dim3(chunks, groups, nz), BSS_NT, smem, st>>>(sp);
        const unsigned rows = (unsigned)((sp.idx_row_blocks + BSR_WARPS - 1) / BSR_WARPS);
        bs_row_select_kernel<<<dim3(rows, nz), 32 * BSR_WARPS, 0, st>>>(sp);
    }
    return cudaGetLastError();
}

} // namespace mi_cuda

using namespace mi_cuda;

static size_t align256b(size_t x) { return (x + 255) & ~(size_t)255; }

/* MI_CUDA_BS_SPLIT: -1 unset (automatic), 0 never split, N chunks of at least N tiles (tests). */
static int bss_split_env() {
    const char *e = getenv("MI_CUDA_BS_SPLIT");
    if (!e || !*e) return -1;
    const int n = atoi(e);
    return n > 0 ? n : 0;
}

/* The CTA slots bss_chunk_tiles_for (bs_chunks.cuh) spreads the tiles over: two an SM. */
static int64_t bss_slots() { return 2 * (int64_t)mi_cuda_sm_count(); }

/* The scratch's parts: pooled q, pooled k (the input dtype, two bytes a value), the streaming
 * kernel's row bounds, and for split groups (split_pairs streaming pairs in chunks of
 * chunk_tiles, 0: none) the chunks' group maxima, candidate counts and candidates. */
struct bs_scratch_layout {
    size_t qp, kp, bound, split_maxima, split_count, split_cand, scores, score_sums, total;
};
static bs_scratch_layout bs_scratch_of(int64_t batch, int64_t heads, int64_t heads_kv, int64_t len,
                                       int64_t head_dim, int64_t split_pairs, int chunk_tiles,
                                       int64_t score_pairs) {
    const int64_t R = (len + 63) / 64, BH = batch * heads, groups = (R + BSS_ROWS - 1) / BSS_ROWS;
    const int64_t split_rows =
        chunk_tiles > 0 ? split_pairs * (groups - chunk_tiles) * BSS_ROWS : 0;
    bs_scratch_layout l;
    l.qp = 0;
    l.kp = l.qp + align256b((size_t)BH * R * head_dim * 2);
    l.bound = l.kp + align256b((size_t)batch * heads_kv * R * head_dim * 2);
    l.split_maxima = l.bound + align256b((size_t)BH * R * 4);
    l.split_count = l.split_maxima + align256b((size_t)split_rows * BSB_SLOTS * 2);
    l.split_cand = l.split_count + align256b((size_t)split_rows * BSS_SPLIT_MAX * 4);
    l.scores = l.split_cand + align256b((size_t)split_rows * BSS_SPLIT_MAX * BSS_MAX_K * 8);
    l.score_sums = l.scores + align256b((size_t)score_pairs * bsr_pair_keys(R) * 2);
    l.total = l.score_sums + align256b((size_t)score_pairs * bsr_pair_summaries(R) * 4);
    return l;
}

/* The estimate through scores in memory takes at most this much scratch for its keys, the
 * (b, h) pairs going through it in turn in chunks that fit (one pair at 1M: 336 MB, 269 of them
 * its keys). */
constexpr size_t BSR_SCORE_BYTES = (size_t)1 << 30;

/* A (b, h) pair's keys and group summaries. */
static size_t bsr_pair_bytes(int64_t R) {
    return (size_t)bsr_pair_keys(R) * 2 + (size_t)bsr_pair_summaries(R) * 4;
}

/* Whether the estimate goes through scores in memory at this length (every head, however
 * many): from BSR_AUTO_MIN_ROW_BLOCKS on, where a pair's keys fit BSR_SCORE_BYTES (up to about
 * 1.8M; longer sequences take the streaming kernel). H200, top 100, ms for all heads, pooling
 * included, scores in memory against streaming, random / position-coded inputs: one head
 * 0.101 / 0.108 against 0.190 / 0.192 at 128K, 0.285 / 0.294 against 0.470 / 0.434 at 512K,
 * 0.685 / 0.703 against 0.850 / 0.967 at 1M; four heads 0.187 / 0.205 against 0.248 / 0.265
 * at 128K, 0.863 / 0.898 against 0.912 / 1.139 at 512K, 2.53 / 2.59 against 2.52 / 3.11 at
 * 1M; 32 heads 1.13 / 1.22 against 1.06 / 1.31 at 128K, 20.2 / 20.7 against 19.2 / 23.7 at 1M;
 * with the score kernel's 16-byte stores, 18.9 / 19.4 against 19.2 / 23.9 at 1M x 32 and 0.651 /
 * 0.667 at 1M x 1 (bench/results/2026-12-01-gpu-bs-estimate-summaries.json). Random scores at
 * 128K x 32 heads were the one case where streaming was ahead (6 %, before the stores);
 * near-diagonal scores, the shape of real heads, favour scores in memory at every count.
 * MI_CUDA_BS_SCORES=1 or 0 forces it on or off (A/B runs, tests). */
/* 128K: the shortest length measured */
constexpr int64_t BSR_AUTO_MIN_ROW_BLOCKS = 2048;
static bool bsr_scores_on(int64_t len) {
    const int64_t R = (len + 63) / 64;
    if (const char *e = getenv("MI_CUDA_BS_SCORES"))
        if (e[0] == '0' || e[0] == '1') return e[0] == '1';
    return R >= BSR_AUTO_MIN_ROW_BLOCKS && bsr_pair_bytes(R) <= BSR_SCORE_BYTES;
}

/* The pairs a chunk of the scores path takes: as many as fit BSR_SCORE_BYTES, at least one. */
static int64_t bsr_chunk_pairs(int64_t BH, int64_t len) {
    const size_t pair = bsr_pair_bytes((len + 63) / 64);
    return std::max<int64_t>(1, std::min<int64_t>(BH, (int64_t)(BSR_SCORE_BYTES / pair)));
}

/* The key tiles a CTA of the score kernels takes for `groups` row groups of `pairs` (b, h) pairs
 * a launch: BSR_CHUNK_TILES, or half that where the CTAs would not fill the SMs' slots (three
 * CTAs an SM) twice over. At 128K x 1 (80 CTAs of 8 tiles) the wgmma scores took 0.016 ms
 * against 0.011 with 4; at 512K x 1 (1088 CTAs) 0.069 against 0.070, at 1M x 1 0.239 against
 * 0.251 (bench/results/2026-12-01-gpu-bs-estimate-wgmma.json). */
static int bsr_chunk_tiles(int64_t groups, int64_t pairs) {
    int64_t ctas = 0;
    for (int64_t g = 0; g < groups; ++g) ctas += (g + BSR_CHUNK_TILES) / BSR_CHUNK_TILES;
    return ctas * pairs >= 2 * 3 * (int64_t)mi_cuda_sm_count() ? BSR_CHUNK_TILES
                                                                : BSR_CHUNK_TILES / 2;
}

/* The scores path's scratch where it is on; else enough for any number of streaming heads (the
 * split buffers peak at a few heads). */
extern "C" size_t mi_cuda_bs_scratch_bytes(int64_t batch, int64_t heads, int64_t heads_kv,
                                           int64_t len, int64_t head_dim) {
    if (bsr_scores_on(len))
        return bs_scratch_of(batch, heads, heads_kv, len, head_dim, 0, 0,
                             bsr_chunk_pairs(batch * heads, len))
            .total;
    const int64_t groups = ((len + 63) / 64 + BSS_ROWS - 1) / BSS_ROWS, slots = bss_slots();
    const int forced = bss_split_env();
    size_t most = 0;
    for (int64_t hs = 1; hs <= heads; ++hs) {
        const int64_t pairs = batch * hs;
        const int chunk = bss_chunk_tiles_for(pairs, groups, slots, forced);
        most = std::max(
            most, bs_scratch_of(batch, heads, heads_kv, len, head_dim, pairs, chunk, 0).total);
    }
    return most;
}

extern "C" mi_status mi_cuda_bs_estimate_run(mi_context *ctx, const mi_attn_shape *s,
                                             const mi_tensor *q, const mi_tensor *k,
                                             const int32_t *seq_lens, const int32_t *top_k,
                                             const uint8_t *active, int32_t dense_below,
                                             void *scratch, mi_sparse_index *index) {
    mi_cuda_attn_params ap;
    mi_status st = mi_cuda_fill_attn_params(ctx, s, q, k, nullptr, nullptr, seq_lens, 1.0f,
                                            nullptr, &ap);
    if (st != MI_STATUS_SUCCESS) return st;
    const int64_t R = (s->len + 63) / 64;
    if (index->batch != s->batch || index->heads != s->heads_q || index->row_blocks < R)
        return mi_fail(ctx, MI_STATUS_SHAPE_MISMATCH,
                       "sparse index is [%d, %d, %d], the call needs [%lld, %lld, %lld]",
                       index->batch, index->heads, index->row_blocks, (long long)s->batch,
                       (long long)s->heads_q, (long long)R);
    if (s->head_dim != 64 && s->head_dim != 128)
        return mi_fail(ctx, MI_STATUS_UNSUPPORTED,
                       "CUDA block-sparse estimate: head_dim %lld (64 or 128)",
                       (long long)s->head_dim);
    /* Heads with top k up to BSS_MAX_K take the streaming kernel, the others the one that holds
     * whole score rows; so do heads whose streaming kernel's shared memory a CTA cannot have
     * (A100: 163 KB, room for 128 slots only). The streaming kernel takes 128 candidate slots a
     * row where every such head's top k is at most BSS_NARROW_MAX_K and its CTAs outnumber the
     * SMs (else the second CTA an SM would buy nothing: 128 slots compact more often) or 256 do
     * not fit, else 256.
     * H200, top 100: 128 slots took 128K x 32 heads from 0.044 to 0.036 ms per head on random
     * inputs and 1M x 32 from 0.95 / 0.77 to 0.67 / 0.73, but 512K x 1 position-coded from
     * 0.45 to 0.66. MI_CUDA_BS_STREAM=0 sends every head to the row-holding kernel,
     * MI_CUDA_BS_CAP=128|256 fixes the slots (A/B runs, tests). */
    const size_t smem_cta = (size_t)mi_cuda_smem_per_block();
    const auto stream_smem = [&](int cap) {
        return s->head_dim == 64 ? bss_smem_bytes<64>(cap) : bss_smem_bytes<128>(cap);
    };
    const bool wide_fits = smem_cta >= stream_smem(BSS_CAP_WIDE);
    int cap_env = 0;
    bool stream_on = true;
    if (const char *e = getenv("MI_CUDA_BS_STREAM"))
        if (e[0] == '0') stream_on = false;
    /* long sequences: every head through scores in memory (bsr_scores_on) */
    const bool scores_on = bsr_scores_on(s->len);
    if (const char *e = getenv("MI_CUDA_BS_CAP")) cap_env = atoi(e);
    const bool narrow_ok = cap_env != BSS_CAP_WIDE && smem_cta >= stream_smem(BSS_CAP_NARROW);
    bool any_stream = false, any_rows = false;
    int n_stream = 0;
    uint8_t to_stream[MI_CUDA_MAX_HEADS], to_rows[MI_CUDA_MAX_HEADS];
    uint8_t split_slot[MI_CUDA_MAX_HEADS] = {0};
    for (int64_t h = 0; h < s->heads_q; ++h) {
        const bool on = active ? active[h] != 0 : true;
        const bool st_head = stream_on && ((narrow_ok && top_k[h] <= BSS_NARROW_MAX_K) ||
                                           (wide_fits && top_k[h] <= BSS_MAX_K));
        to_stream[h] = on && st_head && !scores_on;
        to_rows[h] = on && !st_head && !scores_on;
        any_stream |= to_stream[h] != 0;
        any_rows |= to_rows[h] != 0;
        if (to_stream[h]) split_slot[h] = (uint8_t)n_stream++;
    }
    /* the streaming heads' row groups in chunks where few heads leave SMs idle (BSS_SPLIT_MAX) */
    const int groups_r = (int)((R + BSS_ROWS - 1) / BSS_ROWS);
    const int groups = (index->row_blocks + BSS_ROWS - 1) / BSS_ROWS;
    const int64_t pairs = s->batch * n_stream;
    const int chunk_tiles = bss_chunk_tiles_for(pairs, groups_r, bss_slots(), bss_split_env());
    const int split_items = chunk_tiles > 0 ? bss_split_items(groups_r, chunk_tiles) : 0;
    const int64_t stream_ctas =
        pairs * (chunk_tiles > 0 ? split_items + groups - groups_r : groups);
    /* 128 slots where the CTAs outnumber the SMs (else the second CTA an SM would buy nothing)
     * or 256 do not fit. Chunks need three CTAs an SM for it: at 512K x 1 head (320 chunks on
     * 132 SMs) 256 slots took the streaming kernel from 0.28 to 0.21 ms on position-coded inputs
     * (fewer compactions near the diagonal) and from 0.25 to 0.27 on random ones; at 1M x 1
     * (640 chunks) from 0.50 to 0.73 on random inputs and 0.50 to 0.51 on position-coded ones */
    const int64_t narrow_ctas = (int64_t)mi_cuda_sm_count() * (chunk_tiles > 0 ? 3 : 1);
    const bool narrow_on =
        cap_env == BSS_CAP_NARROW ||
        (cap_env != BSS_CAP_WIDE && (stream_ctas > narrow_ctas || !wide_fits));
    bool all_narrow = true;
    for (int64_t h = 0; h < s->heads_q; ++h)
        if (to_stream[h] && !(narrow_on && narrow_ok && top_k[h] <= BSS_NARROW_MAX_K))
            all_narrow = false;
    const int cap = all_narrow ? BSS_CAP_NARROW : BSS_CAP_WIDE;
    int rows = bs_rows_per_cta(index->row_blocks);
    /* MI_CUDA_BS_ROWS=N caps the row blocks per CTA, so that the tests reach each variant on
     * short sequences */
    if (const char *cap = getenv("MI_CUDA_BS_ROWS"))
        if (atoi(cap) > 0) rows = std::min(rows, atoi(cap));
    if (any_rows && rows < 1)
        return mi_fail(ctx, MI_STATUS_UNSUPPORTED,
                       "CUDA block-sparse estimate: %d row blocks do not fit shared memory "
                       "for a top k above %d (at most %d)",
                       index->row_blocks, BSS_MAX_K,
                       (int)(BS_SCORE_SMEM / sizeof(float)) - BS_MAX_ROWS - 3);
    const int64_t BH = s->batch * s->heads_q, BHK = s->batch * s->heads_kv;
    if (R <= 0 || BH <= 0) return MI_STATUS_SUCCESS;
    cudaStream_t stream = mi_stream(ctx);
    const int64_t score_pairs = scores_on ? bsr_chunk_pairs(BH, s->len) : 0;
    const bs_scratch_layout lay = bs_scratch_of(s->batch, s->heads_q, s->heads_kv, s->len,
                                                s->head_dim, pairs, chunk_tiles, score_pairs);
    void *qp = static_cast<char *>(scratch) + lay.qp;
    void *kp = static_cast<char *>(scratch) + lay.kp;

    pool_params pp;
    memset(&pp, 0, sizeof(pp));
    memcpy(pp.seq_lens, ap.seq_lens, sizeof(pp.seq_lens));
    pp.len = (int32_t)s->len;
    pp.row_blocks = (int32_t)R;
    pp.head_dim = (int32_t)s->head_dim;
    const bool bf = s->dtype == MI_DTYPE_BF16, d64 = s->head_dim == 64;
    bool pool_vec = true;
    if (const char *e = getenv("MI_CUDA_BS_POOL_VEC"))
        if (e[0] == '0') pool_vec = false;
    /* q and k in one launch of each kernel: the 16-byte one where every row starts 16-byte
     * aligned (MI_CUDA_BS_POOL_VEC=0: never, for tests), the one-value one for the others */
    enum { POOL_VEC, POOL_ONE, POOL_KINDS };
    pool_params by_kernel[POOL_KINDS];
    int n_of[POOL_KINDS] = {0, 0};
    for (int pass = 0; pass < 2; ++pass) {
        const mi_tensor *t = pass ? k : q;
        const bool vec = ((uintptr_t)t->data & 15) == 0 && t->stride[0] % 8 == 0 &&
                         t->stride[1] % 8 == 0 && t->stride[2] % 8 == 0 && pool_vec;
        const int kind = vec ? POOL_VEC : POOL_ONE;
        if (n_of[kind] == 0) by_kernel[kind] = pp;
        pool_tensor &pt = by_kernel[kind].t[n_of[kind]++];
        pt.x = t->data;
        for (int i = 0; i < 3; ++i) pt.stride[i] = t->stride[i];
        pt.heads = (int32_t)(pass ? s->heads_kv : s->heads_q);
        pt.bh_count = (int32_t)(pass ? BHK : BH);
        pt.out = pass ? kp : qp;
    }
    /* grids as wide as q's (b, h) pairs, the most (k's heads divide q's); k's CTAs past its own
     * pairs return at once */
    if (n_of[POOL_VEC] > 0) {
        const int blocks = BS_POOL_NT / ((int)s->head_dim / 8);
        const dim3 grid((unsigned)((R + blocks - 1) / blocks), (unsigned)BH,
                        (unsigned)n_of[POOL_VEC]);
        if (bf)
            (d64 ? bs_pool_vec_kernel<__nv_bfloat16, 64>
                 : bs_pool_vec_kernel<__nv_bfloat16, 128>)<<<grid, BS_POOL_NT, 0, stream>>>(
                by_kernel[POOL_VEC]);
        else
            (d64 ? bs_pool_vec_kernel<__half, 64>
                 : bs_pool_vec_kernel<__half, 128>)<<<grid, BS_POOL_NT, 0, stream>>>(
                by_kernel[POOL_VEC]);
    }
    if (n_of[POOL_ONE] > 0) {
        const dim3 grid((unsigned)R, (unsigned)BH, (unsigned)n_of[POOL_ONE]);
        if (bf)
            bs_pool_kernel<__nv_bfloat16>
                <<<grid, (unsigned)s->head_dim, 0, stream>>>(by_kernel[POOL_ONE]);
        else
            bs_pool_kernel<__half><<<grid, (unsigned)s->head_dim, 0, stream>>>(by_kernel[POOL_ONE]);
    }

    bs_select_params sp;
    memset(&sp, 0, sizeof(sp));
    /* Long rows of the streaming kernel start from bounds (bs_bound_kernel). MI_CUDA_BS_BOUND=0
     * takes no bounds, =G (1, 2, 4, 8, 16 or 32) fixes the bound kernel's groups per tile, past
     * its slots too (A/B runs, tests). */
    sp.bound_groups = -1;
    sp.bound = reinterpret_cast<uint32_t *>(static_cast<char *>(scratch) + lay.bound);
    if (const char *e = getenv("MI_CUDA_BS_BOUND")) {
        const int g = atoi(e);
        if (e[0] == '0') sp.bound = nullptr;
        if (g >= 1 && g <= 32 && (g & (g - 1)) == 0) sp.bound_groups = g;
    }
    /* MI_CUDA_BS_MASK_APPEND=0: plain tiles appended an n-tile at a time, always (A/B runs,
     * tests) */
    sp.mask_append = 1;
    if (const char *e = getenv("MI_CUDA_BS_MASK_APPEND"))
        if (e[0] == '0') sp.mask_append = 0;
    sp.qp = qp;
    sp.kp = kp;
    sp.heads = (int32_t)s->heads_q;
    sp.group = (int32_t)s->group;
    sp.row_blocks = (int32_t)R;
    sp.head_dim = (int32_t)s->head_dim;
    sp.block_count = index->block_count;
    sp.block_offset = index->block_offset;
    sp.column_count = index->column_count;
    sp.idx_row_blocks = index->row_blocks;
    sp.max_blocks = index->max_blocks;
    sp.dense_below = dense_below;
    memcpy(sp.seq_lens, ap.seq_lens, sizeof(sp.seq_lens));
    for (int64_t h = 0; h < s->heads_q; ++h) sp.top_k[h] = top_k[h];
    sp.groups = groups;
    sp.bh = (int32_t)BH;
    sp.chunk_tiles = chunk_tiles;
    sp.groups_r = groups_r;
    sp.split_items = split_items;
    sp.split_heads = n_stream;
    memcpy(sp.split_slot, split_slot, sizeof(split_slot));
    sp.split_maxima = reinterpret_cast<uint16_t *>(static_cast<char *>(scratch) + lay.split_maxima);
    sp.split_count = reinterpret_cast<int32_t *>(static_cast<char *>(scratch) + lay.split_count);
    sp.split_cand = reinterpret_cast<uint64_t *>(static_cast<char *>(scratch) + lay.split_cand);
    sp.scores = reinterpret_cast<uint16_t *>(static_cast<char *>(scratch) + lay.scores);
    sp.score_pair_keys = bsr_pair_keys(R);
    sp.score_sums = reinterpret_cast<uint32_t *>(static_cast<char *>(scratch) + lay.score_sums);
    sp.score_sum_stride = (int32_t)bsr_summary_stride(R);
    /* MI_CUDA_BS_SCORE_TILES=N: N key tiles a CTA of the score kernels (A/B runs; at most
     * BSR_MAX_CHUNK_TILES for bs_score_kernel) */
    sp.score_chunk_tiles = scores_on ? bsr_chunk_tiles(groups_r, score_pairs) : BSR_CHUNK_TILES;
    if (const char *e = getenv("MI_CUDA_BS_SCORE_TILES"))
        if (atoi(e) > 0) sp.score_chunk_tiles = std::min(atoi(e), 256);
    /* MI_CUDA_BS_RAISE=0: rows past BSR_WCAND select from the whole row at once (A/B runs) */
    sp.score_raise = 1;
    if (const char *e = getenv("MI_CUDA_BS_RAISE"))
        if (e[0] == '0') sp.score_raise = 0;
    /* MI_CUDA_BS_BOUND_SLACK=N: the select's bound search on rows of 1024 summaries stops within
     * N values of k (shorter rows' within as many eighths as they hold 128 summaries); -1: it
     * never stops early (A/B runs, tests) */
    sp.score_slack = BSR_BOUND_SLACK;
    if (const char *e = getenv("MI_CUDA_BS_BOUND_SLACK")) sp.score_slack = std::max(-1, atoi(e));
    cudaError_t e = cudaSuccess;
    if (scores_on) {
        for (int64_t h = 0; h < s->heads_q; ++h) sp.active[h] = active ? active[h] != 0 : 1;
        e = bf ? (d64 ? launch_bs_scores<__nv_bfloat16, 64>(sp, BH, score_pairs, stream)
                      : launch_bs_scores<__nv_bfloat16, 128>(sp, BH, score_pairs, stream))
               : (d64 ? launch_bs_scores<__half, 64>(sp, BH, score_pairs, stream)
                      : launch_bs_scores<__half, 128>(sp, BH, score_pairs, stream));
    }
    if (any_stream) {
        memcpy(sp.active, to_stream, (size_t)s->heads_q);
        e = bf ? (d64 ? launch_bs_stream<__nv_bfloat16, 64>(sp, cap, BH, stream)
                      : launch_bs_stream<__nv_bfloat16, 128>(sp, cap, BH, stream))
               : (d64 ? launch_bs_stream<__half, 64>(sp, cap, BH, stream)
                      : launch_bs_stream<__half, 128>(sp, cap, BH, stream));
    }
    if (e == cudaSuccess && any_rows) {
        memcpy(sp.active, to_rows, (size_t)s->heads_q);
        e = bf ? (d64 ? launch_bs_select<__nv_bfloat16, 64>(sp, rows, BH, stream)
                      : launch_bs_select<__nv_bfloat16, 128>(sp, rows, BH, stream))
               : (d64 ? launch_bs_select<__half, 64>(sp, rows, BH, stream)
                      : launch_bs_select<__half, 128>(sp, rows, BH, stream));
    }
    if (e != cudaSuccess)
        return mi_fail(ctx, MI_STATUS_DEVICE_ERROR, "CUDA block-sparse estimate: %s",
                       cudaGetErrorString(e));
    return MI_STATUS_SUCCESS;
}

extern "C" mi_status mi_cuda_block_sparse_estimate(mi_context *ctx, const mi_attn_shape *s,
                                                   const mi_tensor *q, const mi_tensor *k,
                                                   const int32_t *seq_lens, const int32_t *top_k,
                                                   mi_sparse_index *index) {
    if (s->heads_q > MI_CUDA_MAX_HEADS || s->batch > MI_CUDA_MAX_BATCH)
        return mi_fail(ctx, MI_STATUS_UNSUPPORTED, "CUDA estimate: too many heads or batches");
    const size_t bytes = mi_cuda_bs_scratch_bytes(s->batch, s->heads_q, s->heads_kv, s->len,
                                                  s->head_dim);
    cudaStream_t stream = mi_stream(ctx);
    void *scratch = nullptr;
    cudaError_t e = cudaMallocAsync(&scratch, bytes, stream);
    if (e != cudaSuccess)
        return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "CUDA estimate scratch: %s",
                       cudaGetErrorString(e));
    mi_status st =
        mi_cuda_bs_estimate_run(ctx, s, q, k, seq_lens, top_k, nullptr, 0, scratch, index);
    cudaFreeAsync(scratch, stream);
    return st;
}
