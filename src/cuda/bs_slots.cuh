/*
 * bs_slots.cuh: where the masked appends of bs_stream_kernel (bs_stream.cuh) put a plain tile's
 * candidates, on the host and the device alike, so that the host test
 * (tests/cuda/test_bs_slots.cu) checks the arithmetic the kernel runs.
 *
 * In a tile of 64 keys, lane t of a quad holds, for each of its two rows, the scores of keys
 * 8 nt + 2 t + e (n-tile nt = 0..7, column e = 0, 1). Its mask of the keys that pass the row's
 * threshold keeps key (nt, e) at bit bss_own_bit(nt, e) of word nt / 4. Shifted left by 2 t, the
 * four lanes' masks are disjoint and their union is the row's mask in key order (bit
 * 8 nt + 2 t + e of 64). A passing key's slot, counted from the row's count, is the number of
 * the row's passing keys above it, so the tile's candidates land in descending key order, where
 * the appends an n-tile at a time put them.
 */
#ifndef MI_BS_SLOTS_CUH
#define MI_BS_SLOTS_CUH

#include <stdint.h>

namespace mi_cuda {

/* The bit of a lane's key (nt, e) in word nt / 4 of its own mask. */
__host__ __device__ constexpr int bss_own_bit(int nt, int e) { return 8 * (nt & 3) + e; }

/* Lane t's own mask (w0: n-tiles 0-3, w1: 4-7) in the row's key order: the low and high words of
 * the 64-bit mask w1:w0 shifted left by 2 t. */
__host__ __device__ __forceinline__ void bss_lane_row_mask(uint32_t w0, uint32_t w1, int t,
                                                           uint32_t &lo, uint32_t &hi) {
    lo = w0 << (2 * t);
#ifdef __CUDA_ARCH__
    hi = __funnelshift_l(w0, w1, 2 * t);
#else
    hi = t > 0 ? w1 << (2 * t) | w0 >> (32 - 2 * t) : w1;
#endif
}

/* The row's passing keys above lane t's key (nt, e), given the row's mask shifted right by 2 t
 * (`above`): that key's slot past the row's count. */
__host__ __device__ __forceinline__ int bss_keys_above(uint64_t above, int nt, int e) {
#ifdef __CUDA_ARCH__
    return __popcll(above >> (8 * nt + e + 1));
#else
    return __builtin_popcountll(above >> (8 * nt + e + 1));
#endif
}

} // namespace mi_cuda

#endif /* MI_BS_SLOTS_CUH */
