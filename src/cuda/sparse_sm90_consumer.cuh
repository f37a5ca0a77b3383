/*
 * sparse_sm90_consumer.cuh: the consumer warpgroups of the warp-specialised sparse kernel
 * (attn_sparse_sm90.cu). Consumer 0 computes row block A of a work item, consumer 1 row block
 * B, over the tiles (or the half of a tile) its block uses: S = Q K^T, the mask, an online
 * softmax step, P V. The two take turns at the tensor cores (named barriers 1 and 2), so that
 * one's softmax runs under the other's GEMMs; a tile's P V is issued with the next tile's S
 * (one pending P V per consumer). Every consumer warp frees every slot (warp_arrive) once it
 * has read it, whether or not it computed the tile. The item's rows then go out through
 * sparse_sm90_epilogue.cuh.
 */
#ifndef MI_SPARSE_SM90_CONSUMER_CUH
#define MI_SPARSE_SM90_CONSUMER_CUH

#include "sparse_sm90_epilogue.cuh"

#include <limits.h>
#include <type_traits>

namespace mi_cuda {

#ifdef MI_SM90_DEVICE
/* A consumer warpgroup (wgi 1 or 2) over its CTA's work items. t counts the tiles over all
 * items: the slot ring runs on. */
template <typename T>
__device__ __forceinline__ void sparse_consumer(const sparse_sm90_args &a, const sparse_smem &sm,
                                                int tid, int wgi, int items) {
    constexpr int D = 128;
    setmaxnreg_inc<200>();
    const int cw = wgi - 1; /* consumer 0 (row block A) or 1 (B) */
    const int me = 1 << cw;
    const int ct = tid - 128 * wgi;
    const int warp = ct / 32, lane = ct % 32, g = lane / 4, cq = lane % 4;
    const int my_bar = 1 + cw, other_bar = 2 - cw;
    if (cw == 1) named_barrier_arrive(1, 256); /* consumer 0 goes first */
    float o[64], s[64], sh[32];
    uint32_t pa[8][4];
    const float sc = a.scale_log2;
    int t = 0; /* tiles so far, over all items */
    for (int w = blockIdx.x, k = 0; w < items; w += gridDim.x, ++k) {
        const sparse_item it = sparse_item_of(a, w);
        /* whether this consumer hands the tensor cores on after the item's last tile (consumer
         * 1's very last turn is not awaited); one register, set once per item (a bool of the item
         * index let ptxas recompute it from a spilled value at every tile) */
        const int hands_on_last =
            __shfl_sync(0xffffffffu, cw == 0 || w + (int)gridDim.x < items, 0);
        const int first_row = it.rs + cw * 64;
        /* the keys a row sees reach back `window` keys (or to a sink): A-shape heads only */
        const int window = it.ashape ? a.a_win.n_local : INT_MAX;
        const a_shape_window item_win = {a.a_win.n_init, window, a.a_win.tri_start};
        const int qrow0 = first_row + warp * 16 + g, qrow1 = qrow0 + 8;
        const int qb = k & 1;
        const sw128_desc qd(smem_addr(sm.qs) + qb * SP_TILE + cw * 64 * 128, 16, 1024);
        /* the last item's rows were staged in its Q buffer: once their store has read them, the
         * buffer is free for the item after this one (its Q is loaded while this one runs) */
        if (a.o_tma && k > 0 && ct == 0) {
            bulk_wait_read<0>();
            mbar_arrive(sm.q_empty + (qb ^ 1));
        }
        row_softmax soft;
#pragma unroll
        for (int i = 0; i < 64; ++i) o[i] = 0.f;

        /* A tile is computed whole (S over 128 keys, 8 k-steps of P V) or, for a split or padded
         * tile, only its half `hf` (S over 64 keys, 4 k-steps) */
        auto issue_s = [&](float *s, int slot, bool whole, int hf) {
            const sw128_desc kd(smem_addr(sm.ks) + slot * SP_TILE + hf * 64 * 128, 16, 1024);
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                const uint64_t qa = qd.at((kk >> 2) * SP_HALF + (kk & 3) * 32);
                const uint64_t kb = kd.at((kk >> 2) * SP_HALF + (kk & 3) * 32);
                if (whole)
                    wg<T>::ss128(s, qa, kb, kk > 0);
                else
                    wg<T>::ss(s, qa, kb, kk > 0);
            }
        };
        auto issue_pv = [&](int slot, bool whole, int hf) {
            const sw128_desc vd(smem_addr(sm.vs) + slot * SP_TILE + hf * 64 * 128, SP_HALF, 1024);
#pragma unroll
            for (int kk = 0; kk < 8; ++kk)
                if (whole || kk < 4) wg<T>::rs(o, pa[kk], vd.at(kk * 16 * 128), 1);
        };

        /* keys this consumer does not see: after its rows, outside the sequence, in a half of a
         * shared tile that only the other row block uses, or missing from a gathered tile */
        auto mask = [&](float *s, const tile_header &hd, bool whole, int hf, int column) {
            if (column) {
                /* a tile of the copies whose keys all come before this block's rows: only the
                 * positions past this block's list go (most tiles: none), no per-key lookups */
                const int n = __shfl_sync(0xffffffffu, hd.nuse[cw], 0);
                if (n >= 0 && __shfl_sync(0xffffffffu, hd.kmax[cw], 0) <= first_row) {
                    if (n < (whole ? 128 : 64)) {
#pragma unroll
                        for (int j = 0; j < 16; ++j) {
                            if (j >= 8 && !whole) break; /* a half tile: positions 0-63 */
#pragma unroll
                            for (int e = 0; e < 4; ++e)
                                s[4 * j + e] =
                                    8 * j + 2 * cq + (e & 1) >= n ? -INFINITY : s[4 * j + e];
                        }
                    }
                    return;
                }
#pragma unroll
                for (int j = 0; j < 16; ++j) {
                    if (j >= 8 && !whole) break;
                    int2 kk = *reinterpret_cast<const int2 *>(hd.kpos + 8 * j + 2 * cq);
                    const uint32_t uu =
                        *reinterpret_cast<const uint16_t *>(hd.kusers + 8 * j + 2 * cq);
                    if (!(uu & me)) kk.x = MI_NO_KEY; /* a key of the other row block only */
                    if (!((uu >> 8) & me)) kk.y = MI_NO_KEY;
                    s[4 * j] = kk.x > qrow0 ? -INFINITY : s[4 * j];
                    s[4 * j + 1] = kk.y > qrow0 ? -INFINITY : s[4 * j + 1];
                    s[4 * j + 2] = kk.x > qrow1 ? -INFINITY : s[4 * j + 2];
                    s[4 * j + 3] = kk.y > qrow1 ? -INFINITY : s[4 * j + 3];
                }
                return;
            }
            /* range halves: whole tiles hold two of this block's ranges at s[0..31], s[32..63];
             * a half tile one at s[0..31] */
#pragma unroll
            for (int part = 0; part < 2; ++part) {
                if (part == 1 && !whole) break;
                const int off = __shfl_sync(0xffffffffu, hd.off[whole ? part : hf], 0);
                if (off < 0 || off + 63 > first_row) {
#pragma unroll
                    for (int j = 8 * part; j < 8 * part + 8; ++j)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const int key = off + 8 * (j - 8 * part) + 2 * cq + (e & 1);
                            const bool kill = key < 0 || key > (e < 2 ? qrow0 : qrow1);
                            s[4 * j + e] = kill ? -INFINITY : s[4 * j + e];
                        }
                }
                /* A-shape: a piece not all sinks nor all inside the window of this block's last
                 * row (the window's first piece or two; with Tri-shape's last rows, every piece of
                 * their block) loses the keys too far left of the rows before those */
                if (off + 63 >= a.a_win.n_init && first_row + 63 - off >= window) {
#pragma unroll
                    for (int j = 8 * part; j < 8 * part + 8; ++j)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const int key = off + 8 * (j - 8 * part) + 2 * cq + (e & 1);
                            const bool kill = !window_keeps(item_win, key, e < 2 ? qrow0 : qrow1);
                            s[4 * j + e] = kill ? -INFINITY : s[4 * j + e];
                        }
                }
            }
        };

        /* One turn: S of tile `slot` (SK: 0 none, 1 half, 2 whole) issued with the pending P V
         * (PK: 0 none, 1 half, 2 whole), then the softmax of S while P V runs. Each combination is
         * its own code, with its issues and waits: paths that join between an issue and its wait
         * make ptxas serialise every wgmma of the kernel (C7514). */
        auto turn = [&](auto sk_c, auto pk_c, int slot, int hf, int column, const tile_header &hd,
                        int pslot, int phf, bool hand_on) {
            constexpr int SK = decltype(sk_c)::value, PK = decltype(pk_c)::value;
            /* a half tile's scores in registers of their own: sharing the whole tile's array
             * left ptxas short of registers for the wgmma pipeline (C7511) */
            float *sx = SK == 2 ? s : sh;
            named_barrier_sync(my_bar, 256);
            wgmma_fence();
            if constexpr (SK > 0) {
                issue_s(sx, slot, SK == 2, hf);
                wgmma_commit();
            }
            if constexpr (PK > 0) {
                issue_pv(pslot, PK == 2, phf);
                wgmma_commit();
            }
            if (hand_on) named_barrier_arrive(other_bar, 256);
            if constexpr (SK > 0) {
                if constexpr (PK > 0)
                    wgmma_wait<1>(); /* S done; P V may still run */
                else
                    wgmma_wait<0>();
                fence_operands<SK == 2 ? 64 : 32>(sx);
                mask(sx, hd, SK == 2, hf, column);
                warp_arrive(sm.k_empty + slot); /* after the mask: it reads this slot's header */
                float2 al;
                if constexpr (SK == 2)
                    al = soft.update<16>(s, sc);
                else
                    al = soft.update<8>(sh, sc);
                if constexpr (PK > 0) {
                    wgmma_wait<0>();
                    fence_operands<64>(o);
                    warp_arrive(sm.v_empty + pslot);
                }
                /* O holds earlier tiles even without a pending P V when one was flushed */
                if (!__all_sync(0xffffffffu, al.x == 1.f && al.y == 1.f)) rescale_o(o, al);
                if constexpr (SK == 2)
                    pack_p<T, 8>(pa, s);
                else
                    pack_p<T, 4>(pa, sh);
            } else {
                wgmma_wait<0>();
                fence_operands<64>(o);
                warp_arrive(sm.v_empty + pslot);
            }
        };
        using C0 = std::integral_constant<int, 0>;
        using C1 = std::integral_constant<int, 1>;
        using C2 = std::integral_constant<int, 2>;

        mbar_wait(sm.q_full + qb, (k >> 1) & 1);
        int pending = -1;            /* the tile whose P V is still to be issued (P in pa) */
        int pending_pk = 0;          /* its kind: 1 half, 2 whole */
        int pending_hf = 0;          /* its half */
        bool pending_column = false; /* a gathered tile */
        for (;; ++t) {
            const int slot = t % SP_STAGES, par = (t / SP_STAGES) & 1;
            mbar_wait(sm.k_full + slot, par);
            const tile_header &hd = sm.hdr[slot];
            /* header values steer wgmma: broadcast, so that ptxas sees them warp-uniform */
            const int users0 = __shfl_sync(0xffffffffu, hd.users[0], 0);
            const int users1 = __shfl_sync(0xffffffffu, hd.users[1], 0);
            const int last = __shfl_sync(0xffffffffu, hd.last, 0);
            const int column = __shfl_sync(0xffffffffu, hd.column, 0);
            const bool m0 = (users0 & me) != 0, m1 = (users1 & me) != 0;
            const int sk = m0 && m1 ? 2 : m0 || m1 ? 1 : 0, hf = m0 ? 0 : 1;
            /* a gathered tile was written by cp.async (generic proxy), wgmma reads it through the
             * async proxy */
            if (column) fence_proxy_async();
            const bool hand_on = !last || hands_on_last;
            const int pslot = pending % SP_STAGES;
            /* loop-carried values that steer wgmma, broadcast again (ptxas does not follow their
             * uniformity through the loop) */
            const int pk = __shfl_sync(0xffffffffu, pending >= 0 ? pending_pk : 0, 0);
            const int phf = __shfl_sync(0xffffffffu, pending_hf, 0);
            if (pk) {
                mbar_wait(sm.v_full + pslot, (pending / SP_STAGES) & 1);
                if (pending_column) fence_proxy_async();
            }
            if (sk > 0) {
                if (sk == 2) {
                    if (pk == 2)
                        turn(C2(), C2(), slot, hf, column, hd, pslot, phf, hand_on);
                    else if (pk == 1)
                        turn(C2(), C1(), slot, hf, column, hd, pslot, phf, hand_on);
                    else
                        turn(C2(), C0(), slot, hf, column, hd, pslot, phf, hand_on);
                } else {
                    if (pk == 2)
                        turn(C1(), C2(), slot, hf, column, hd, pslot, phf, hand_on);
                    else if (pk == 1)
                        turn(C1(), C1(), slot, hf, column, hd, pslot, phf, hand_on);
                    else
                        turn(C1(), C0(), slot, hf, column, hd, pslot, phf, hand_on);
                }
                pending = t;
                pending_pk = sk;
                pending_hf = hf;
                pending_column = column;
            } else {
                /* not ours. When the pending P V reads the V slot this tile came in, issue it (the
                 * slot could not be freed otherwise); a P V of the tile just before stays pending,
                 * its slot is not this one's. Then free this tile's slots. */
                if (pk && t - pending >= SP_STAGES) {
                    if (pk == 2)
                        turn(C0(), C2(), slot, hf, column, hd, pslot, phf, hand_on);
                    else
                        turn(C0(), C1(), slot, hf, column, hd, pslot, phf, hand_on);
                    pending = -1;
                } else {
                    named_barrier_sync(my_bar, 256);
                    if (hand_on) named_barrier_arrive(other_bar, 256);
                }
                warp_arrive(sm.k_empty + slot);
                mbar_wait(sm.v_full + slot, par);
                warp_arrive(sm.v_empty + slot);
            }
            if (last) {
                ++t;
                break;
            }
        }
        if (pending >= 0) { /* the last P V */
            const int pslot = pending % SP_STAGES;
            mbar_wait(sm.v_full + pslot, (pending / SP_STAGES) & 1);
            if (pending_column) fence_proxy_async();
            /* the fence next to its wgmma: ptxas did not count one before the branch */
            const int phf = __shfl_sync(0xffffffffu, pending_hf, 0);
            if (__shfl_sync(0xffffffffu, pending_pk, 0) == 2) {
                wgmma_fence();
                issue_pv(pslot, true, 0);
                wgmma_commit();
                wgmma_wait<0>();
            } else {
                wgmma_fence();
                issue_pv(pslot, false, phf);
                wgmma_commit();
                wgmma_wait<0>();
            }
            fence_operands<64>(o);
            warp_arrive(sm.v_empty + pslot); /* the next item's tiles need the slot */
        }
        sparse_epilogue<T>(a, sm, it, cw, ct, cq, first_row, qrow0, qrow1, qb, soft, o);
    }
    if (a.o_tma && ct == 0) bulk_wait<0>(); /* the last rows are written before the CTA ends */
}
#endif

} // namespace mi_cuda

#endif
