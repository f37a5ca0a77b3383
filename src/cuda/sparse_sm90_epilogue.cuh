/*
 * sparse_sm90_epilogue.cuh: the end of a consumer's work item in the warp-specialised sparse
 * kernel (attn_sparse_sm90.cu): its 64 output rows normalised (and their LSE), either staged in
 * the item's Q buffer by stmatrix and stored with TMA by one thread (o_tma: the consumer goes
 * on to its next item meanwhile, and frees the buffer once the store has read it), or stored by
 * every thread after the buffer is handed back.
 */
#ifndef MI_SPARSE_SM90_EPILOGUE_CUH
#define MI_SPARSE_SM90_EPILOGUE_CUH

#include "sparse_sm90_layout.cuh"

namespace mi_cuda {

#ifdef MI_SM90_DEVICE
/* The rows of consumer cw (thread ct of its warpgroup, rows qrow0 and qrow1 of the
 * accumulators o) of item it, whose every S is done, so that its Q buffer qb may take them. */
template <typename T>
__device__ __forceinline__ void sparse_epilogue(const sparse_sm90_args &a, const sparse_smem &sm,
                                                const sparse_item &it, int cw, int ct, int cq,
                                                int first_row, int qrow0, int qrow1, int qb,
                                                const row_softmax &soft, float *o) {
    float *lseg = a.lse ? a.lse + ((int64_t)it.b * a.heads + it.h) * a.len : nullptr;
    if (a.o_tma) {
        const uint32_t qbuf = smem_addr(sm.qs) + qb * SP_TILE;
        stage_rows<T>(qbuf, SP_HALF, 64 * cw, lseg, soft, o, qrow0, qrow1, a.len, cq);
        fence_proxy_async(); /* the rows, written by stmatrix, are read by the async proxy */
        named_barrier_sync(5 + cw, 128);
        if (ct == 0) {
            tma_store_4d(&a.tm_o, qbuf + cw * 64 * 128, 0, first_row, it.h, it.b);
            tma_store_4d(&a.tm_o, qbuf + SP_HALF + cw * 64 * 128, 64, first_row, it.h, it.b);
            bulk_commit();
        }
    } else {
        warp_arrive(sm.q_empty + qb); /* every S of this item is done */
        T *og = reinterpret_cast<T *>(a.o) + it.b * a.o_stride[0] + it.h * a.o_stride[1];
        store_rows<T>(og, a.o_stride[2], lseg, soft, o, qrow0, qrow1, a.len, a.len, cq);
    }
}
#endif

} // namespace mi_cuda

#endif
