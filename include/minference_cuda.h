/*
 * minference_cuda.h: the GPU-only entry points of libminference.
 *
 * A context created with MI_DEVICE_CUDA runs every kernel of minference.h on its stream, in
 * stream order; tensors and index buffers must then live in device memory (seq_lens stays on the
 * host). No CUDA header is needed: the stream is passed as the driver's opaque handle, which is
 * what cudaStream_t is.
 */
#ifndef MINFERENCE_CUDA_H
#define MINFERENCE_CUDA_H

#include "minference.h"

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st; /* cudaStream_t == struct CUstream_st * */

/* Sets the stream later calls on ctx are ordered on (NULL: the legacy default stream). */
MI_API mi_status mi_context_set_stream(mi_context *ctx, struct CUstream_st *stream);
MI_API struct CUstream_st *mi_context_stream(const mi_context *ctx);

/* Waits for all work the context queued on its stream; reports asynchronous kernel errors. */
MI_API mi_status mi_context_synchronize(mi_context *ctx);

#ifdef __cplusplus
}
#endif

#endif /* MINFERENCE_CUDA_H */
