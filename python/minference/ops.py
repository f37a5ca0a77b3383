"""Attention kernels on [B, H, L, D] NumPy arrays or torch tensors (CPU or CUDA).

q is [B, H_q, L, D]; k and v are [B, H_kv, L, D] with H_q % H_kv == 0 (GQA is a broadcast, k/v
are never repeated). Every call is causal. The result has the type, dtype and device of q.
seq_lens (optional, [B] ints) gives each sequence's valid length; rows past it are written as 0.
scale defaults to 1/sqrt(D). return_lse=True also returns the fp32 log-sum-exp [B, H_q, L].
"""

import ctypes

import numpy as np

from . import _lib as L
from .core import (
    SparseIndex,
    VSIndex,
    _check,
    _ctx_for,
    _describe,
    _empty_like,
    _int32_host,
    _int32_zeros,
    _is_torch,
    _lib,
    _lse_buffer,
    _prefill_params,
    _ptr,
    _scale,
    _to_device_int32,
    _vs_params,
    get_context,
    patterns_array,
)

__all__ = [
    "dense_attention",
    "a_shape_attention",
    "streaming_forward",
    "tri_shape_attention",
    "vs_estimate",
    "vs_build_index",
    "block_sparse_estimate",
    "sparse_attention",
    "vertical_slash_sparse_attention",
    "block_sparse_attention",
    "prefill_attention",
    "prefill_workspace_size",
]


def _operands(q, k, v, ctx, names=("q", "k", "v")):
    arrs = [_describe(x, n) for x, n in zip((q, k, v), names) if x is not None]
    first = arrs[0]
    for a, n in zip(arrs[1:], names[1:]):
        if a.is_torch != first.is_torch:
            raise TypeError(f"{names[0]} and {n} must both be NumPy arrays or both torch tensors")
        if a.device != first.device or a.device_id != first.device_id:
            raise ValueError(f"{names[0]} and {n} are on different devices")
    c = _ctx_for(first, ctx)
    return arrs, c


def _out_for(dq, out):
    if out is None:
        o = _empty_like(dq)
        return o, _describe(o, "out")
    do = _describe(out, "out")
    if do.obj is not out and not (do.is_torch and do.obj.data_ptr() == out.data_ptr()):
        raise ValueError("out must have a contiguous last dimension")
    if not do.is_torch and not out.flags.writeable:
        raise ValueError("out is read-only")
    if do.is_torch != dq.is_torch or do.device != dq.device:
        raise ValueError("out must be of q's kind and on q's device")
    return out, do


def _ret(out, lse, return_lse):
    return (out, lse) if return_lse else out


def _seq_lens(seq_lens, B):
    return _int32_host(seq_lens, "seq_lens", (B,))


def dense_attention(q, k, v, scale=None, seq_lens=None, return_lse=False, out=None, ctx=None):
    """Dense causal attention (flash-style)."""
    (dq, dk, dv), c = _operands(q, k, v, ctx)
    out, do = _out_for(dq, out)
    sl = _seq_lens(seq_lens, int(dq.desc.shape[0]))
    lse = _lse_buffer(dq, return_lse)
    _check(_lib().mi_attention_dense(c.handle, ctypes.byref(dq.desc), ctypes.byref(dk.desc),
                                     ctypes.byref(dv.desc), _ptr(sl), _scale(scale),
                                     ctypes.byref(do.desc), _ptr(lse)), c.handle,
           "mi_attention_dense")
    return _ret(out, lse, return_lse)


def a_shape_attention(q, k, v, n_init, n_local, n_last=0, scale=None, seq_lens=None,
                      return_lse=False, out=None, ctx=None):
    """A-shape: key j is visited by row i iff j <= i and (i - j < n_local or j < n_init); with
    n_last > 0 (Tri-shape) the last min(n_last, len-1) rows of each sequence are dense."""
    (dq, dk, dv), c = _operands(q, k, v, ctx)
    out, do = _out_for(dq, out)
    sl = _seq_lens(seq_lens, int(dq.desc.shape[0]))
    lse = _lse_buffer(dq, return_lse)
    _check(_lib().mi_attention_a_shape(c.handle, ctypes.byref(dq.desc), ctypes.byref(dk.desc),
                                       ctypes.byref(dv.desc), _ptr(sl), int(n_init), int(n_local),
                                       int(n_last), _scale(scale), ctypes.byref(do.desc),
                                       _ptr(lse)), c.handle, "mi_attention_a_shape")
    return _ret(out, lse, return_lse)


def streaming_forward(q, k, v, n_init, n_local, **kw):
    """The original's A-shape ("stream_llm") kernel: n_init sink keys + an n_local window."""
    return a_shape_attention(q, k, v, n_init, n_local, 0, **kw)


def tri_shape_attention(q, k, v, n_init=128, n_local=3968, n_last=100, **kw):
    """Tri-shape: A-shape plus the last n_last query rows dense."""
    return a_shape_attention(q, k, v, n_init, n_local, n_last, **kw)


def _per_head(x, H, name):
    if _is_torch(x):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must hold integers, got {arr.dtype}")
    try:
        arr = np.broadcast_to(arr.astype(np.int64), (H,))
    except ValueError:
        raise ValueError(f"{name} must be one value or one per query head ({H})") from None
    if arr.min() < 0:
        raise ValueError(f"{name} must be >= 0")
    return np.ascontiguousarray(np.minimum(arr, np.iinfo(np.int32).max), dtype=np.int32)


def vs_estimate(q, k, vertical_size, slash_size, params=None, scale=None, seq_lens=None, ctx=None):
    """Vertical-slash estimation (docs/algorithms.md §1) for every (b, h): returns a VSIndex whose
    arrays live on q's device. vertical_size / slash_size: one budget or one per query head."""
    (dq, dk), c = _operands(q, k, None, ctx, ("q", "k"))
    B, H, Lq = (int(dq.desc.shape[i]) for i in range(3))
    vsz = _per_head(vertical_size, H, "vertical_size")
    ssz = _per_head(slash_size, H, "slash_size")
    p = _vs_params(params)
    max_v = min(Lq, max(int(vsz.max()), int(p.min_vertical)))
    max_s = min(Lq, max(int(ssz.max()), int(p.min_slash)))
    index = VSIndex.empty(dq, B, H, max_v, max_s)
    cidx = index.to_c()
    sl = _seq_lens(seq_lens, B)
    _check(_lib().mi_vs_estimate(c.handle, ctypes.byref(dq.desc), ctypes.byref(dk.desc), _ptr(sl),
                                 vsz.ctypes.data, ssz.ctypes.data, ctypes.byref(p), _scale(scale),
                                 ctypes.byref(cidx)), c.handle, "mi_vs_estimate")
    return index


class _Like:
    """Device information of an index's arrays, to allocate more of the same kind."""

    def __init__(self, x):
        if _is_torch(x) and x.is_cuda:
            self.device, self.device_id, self.obj, self.is_torch = "cuda", x.device.index or 0, x, True
        else:
            self.device, self.device_id, self.obj, self.is_torch = "cpu", 0, x, _is_torch(x)


def vs_build_index(length, index, seq_lens=None, ctx=None):
    """Index conversion (docs/algorithms.md §2): a VSIndex to the SparseIndex the sparse kernel
    consumes, for sequences of padded length `length`."""
    like = _Like(index.vertical_idx)
    c = ctx or get_context(like.device, like.device_id)
    if like.device == "cuda":
        import torch

        with torch.cuda.device(like.device_id):
            c.set_stream(torch.cuda.current_stream().cuda_stream)
    B, H, max_v = (int(s) for s in index.vertical_idx.shape)
    max_s = int(index.slash_idx.shape[2])
    R = (int(length) + L.MI_BLOCK_SIZE - 1) // L.MI_BLOCK_SIZE
    out = SparseIndex.empty(like, B, H, max(R, 1), max_s + 1, max_v)
    cvs = index.to_c()
    cout = out.to_c()
    sl = _seq_lens(seq_lens, B)
    _check(_lib().mi_vs_build_index(c.handle, int(length), _ptr(sl), ctypes.byref(cvs),
                                    ctypes.byref(cout)), c.handle, "mi_vs_build_index")
    return out


def block_sparse_estimate(q, k, top_k, seq_lens=None, ctx=None):
    """Block-sparse estimation (docs/algorithms.md §4): 64-row mean pooling, block-causal top-k per
    row block (the diagonal block and block 0 always kept). bf16 / fp16 inputs rank the pooled
    scores at bf16 precision, equal ones lower block first. top_k: one value or one per query
    head."""
    (dq, dk), c = _operands(q, k, None, ctx, ("q", "k"))
    B, H, Lq = (int(dq.desc.shape[i]) for i in range(3))
    R = (Lq + L.MI_BLOCK_SIZE - 1) // L.MI_BLOCK_SIZE
    tk = _per_head(top_k, H, "top_k")
    # Blocks beyond the causal ones are never selected; clamping keeps the index small.
    tk = np.ascontiguousarray(np.minimum(tk, R), dtype=np.int32)
    max_blocks = min(R, max(int(tk.max()), 2))
    index = SparseIndex.empty(dq, B, H, R, max_blocks, 1)
    cidx = index.to_c(max_columns=0)
    sl = _seq_lens(seq_lens, B)
    _check(_lib().mi_block_sparse_estimate(c.handle, ctypes.byref(dq.desc), ctypes.byref(dk.desc),
                                           _ptr(sl), tk.ctypes.data, ctypes.byref(cidx)),
           c.handle, "mi_block_sparse_estimate")
    return index


def sparse_attention(q, k, v, index, scale=None, seq_lens=None, return_lse=False, out=None,
                     ctx=None):
    """Attention over a SparseIndex: the 64-key ranges, then the gathered columns, one online
    softmax, causal mask everywhere."""
    (dq, dk, dv), c = _operands(q, k, v, ctx)
    out, do = _out_for(dq, out)
    sl = _seq_lens(seq_lens, int(dq.desc.shape[0]))
    lse = _lse_buffer(dq, return_lse)
    cidx = index.to_c()
    _check(_lib().mi_attention_sparse(c.handle, ctypes.byref(dq.desc), ctypes.byref(dk.desc),
                                      ctypes.byref(dv.desc), _ptr(sl), ctypes.byref(cidx),
                                      _scale(scale), ctypes.byref(do.desc), _ptr(lse)), c.handle,
           "mi_attention_sparse")
    return _ret(out, lse, return_lse)


def _check_block_sizes(block_size_M, block_size_N):
    if block_size_M != 64 or block_size_N != 64:
        raise NotImplementedError(
            f"block sizes other than 64 are not supported (got {block_size_M}x{block_size_N}): "
            "every sparse kernel of libminference uses 64x64 blocks")


def _index_arg(x, B, H, name, like):
    """[B, H, N], [H, N] or [N] -> contiguous int32 [B, H, N] on the data's device."""
    if _is_torch(x):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.ndim == 0 or arr.ndim > 3:
        raise ValueError(f"{name} must be [B, H, N], [H, N] or [N], got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must hold integers, got {arr.dtype}")
    n = arr.shape[-1]
    try:
        arr = np.broadcast_to(arr, (B, H, n))
    except ValueError:
        raise ValueError(f"{name} of shape {arr.shape} does not match B={B}, H={H}") from None
    return _to_device_int32(like, arr, (B, H, n)), n


def vertical_slash_sparse_attention(q, k, v, v_idx, s_idx, block_size_M=64, block_size_N=64,
                                    scale=None, seq_lens=None, return_lse=False, ctx=None):
    """The original's VS kernel: v_idx [B, H, NNZ_V] key columns and s_idx [B, H, NNZ_S] diagonal
    distances (0 = main diagonal), any order ([H, N] or [N] broadcast). Include small distances
    (d = 0..63): the index covers each row block from its diagonals."""
    _check_block_sizes(block_size_M, block_size_N)
    (dq, dk, dv), c = _operands(q, k, v, ctx)
    B, H, Lq = (int(dq.desc.shape[i]) for i in range(3))
    vi, nv = _index_arg(v_idx, B, H, "v_idx", dq)
    si, ns = _index_arg(s_idx, B, H, "s_idx", dq)
    if nv == 0 and ns == 0:
        raise ValueError("v_idx and s_idx are both empty: no key would be visited")
    vcount = _to_device_int32(dq, np.full((B, H), nv), (B, H))
    scount = _to_device_int32(dq, np.full((B, H), ns), (B, H))
    if nv == 0:
        vi = _int32_zeros(dq, (B, H, 1))
    if ns == 0:
        si = _int32_zeros(dq, (B, H, 1))
    vsi = VSIndex(vcount, vi, scount, si)
    index = vs_build_index(Lq, vsi, seq_lens=seq_lens, ctx=c)
    return sparse_attention(q, k, v, index, scale=scale, seq_lens=seq_lens,
                            return_lse=return_lse, ctx=c)


def block_sparse_attention(q, k, v, top_k, block_size_M=64, block_size_N=64, scale=None,
                           seq_lens=None, return_lse=False, ctx=None):
    """The original's block-sparse kernel: each 64-row query block attends to its top_k key
    blocks by mean-pooled q.k (plus, in this library, always its diagonal block and block 0)."""
    _check_block_sizes(block_size_M, block_size_N)
    (dq, dk, dv), c = _operands(q, k, v, ctx)
    index = block_sparse_estimate(q, k, top_k, seq_lens=seq_lens, ctx=c)
    return sparse_attention(q, k, v, index, scale=scale, seq_lens=seq_lens,
                            return_lse=return_lse, ctx=c)


def prefill_workspace_size(q, k, patterns, params=None, ctx=None):
    (dq, dk), c = _operands(q, k, None, ctx, ("q", "k"))
    pats = patterns_array(patterns, int(dq.desc.shape[1]))
    pp = _prefill_params(params)
    n = ctypes.c_size_t()
    _check(_lib().mi_prefill_workspace_size(c.handle, ctypes.byref(dq.desc), ctypes.byref(dk.desc),
                                            pats, ctypes.byref(pp), ctypes.byref(n)), c.handle,
           "mi_prefill_workspace_size")
    return n.value


def prefill_attention(q, k, v, patterns, params=None, seq_lens=None, return_lse=False, out=None,
                      workspace="auto", ctx=None):
    """A whole layer: every query head with its own pattern (patterns: H_q HeadPatterns, config
    entries or names, or one pattern for all heads), estimation, index and kernel.

    workspace: "auto" (allocated here on CUDA through torch, by the library on the CPU), None
    (always the library), or a buffer of at least prefill_workspace_size() bytes on q's device."""
    (dq, dk, dv), c = _operands(q, k, v, ctx)
    B, H = int(dq.desc.shape[0]), int(dq.desc.shape[1])
    pats = patterns_array(patterns, H)
    pp = _prefill_params(params)
    out, do = _out_for(dq, out)
    sl = _seq_lens(seq_lens, B)
    lse = _lse_buffer(dq, return_lse)
    ws_ptr, ws_size, ws = None, 0, None
    if isinstance(workspace, str):
        if workspace != "auto":
            raise ValueError("workspace must be 'auto', None or a buffer")
        if dq.device == "cuda":
            n = ctypes.c_size_t()
            _check(_lib().mi_prefill_workspace_size(c.handle, ctypes.byref(dq.desc),
                                                    ctypes.byref(dk.desc), pats, ctypes.byref(pp),
                                                    ctypes.byref(n)), c.handle,
                   "mi_prefill_workspace_size")
            if n.value:
                import torch

                ws = torch.empty(n.value, dtype=torch.uint8, device=dq.obj.device)
                ws_ptr, ws_size = ws.data_ptr(), n.value
    elif workspace is not None:
        ws = workspace
        if _is_torch(ws):
            ws_ptr, ws_size = ws.data_ptr(), ws.numel() * ws.element_size()
        else:
            ws = np.asarray(ws)
            if not ws.flags.c_contiguous:
                raise ValueError("workspace must be contiguous")
            ws_ptr, ws_size = ws.ctypes.data, ws.nbytes
    _check(_lib().mi_prefill_attention(c.handle, ctypes.byref(dq.desc), ctypes.byref(dk.desc),
                                       ctypes.byref(dv.desc), _ptr(sl), pats, ctypes.byref(pp),
                                       ctypes.byref(do.desc), _ptr(lse), ws_ptr, ws_size),
           c.handle, "mi_prefill_attention")
    return _ret(out, lse, return_lse)


class StaticVSAttention:
    """MInference w/ static (the original's attn_type "static"): each head's vertical-slash sets
    are estimated once, on the first input this object sees, and reused for every later input
    (index conversion and the sparse kernel only, no estimate). One object per layer.

    vertical_size / slash_size: one budget or one per query head (the layer's config sizes, read
    as the original's static mode reads them whatever the head's pattern). params: VSParams; by
    default the original's static estimate, which forces the last 30 diagonals (not 100). Slash
    entries are distances and carry over to any length; vertical columns past a later input's
    length are skipped by the index conversion. An input of another batch size reuses the sets
    of the first input's sequence 0."""

    def __init__(self, vertical_size=1000, slash_size=6096, params=None):
        from .core import VSParams

        self.vertical_size = vertical_size
        self.slash_size = slash_size
        self.params = params if params is not None else VSParams(forced_diagonals=30)
        self.index = None
        self.estimates = 0  # how many times the sets were estimated (1 after the first call)

    def reset(self):
        """Forgets the sets: the next call estimates them again."""
        self.index = None

    def _sets_for(self, B):
        idx = self.index
        if int(idx.vertical_idx.shape[0]) == B:
            return idx
        pick = [0] * B
        return VSIndex(idx.vertical_count[pick], idx.vertical_idx[pick], idx.slash_count[pick],
                       idx.slash_idx[pick])

    def __call__(self, q, k, v, scale=None, seq_lens=None, return_lse=False, out=None, ctx=None):
        if self.index is None:
            self.index = vs_estimate(q, k, self.vertical_size, self.slash_size, self.params,
                                     scale=scale, seq_lens=seq_lens, ctx=ctx)
            self.estimates += 1
        Lq = int(q.shape[2])
        index = vs_build_index(Lq, self._sets_for(int(q.shape[0])), seq_lens=seq_lens, ctx=ctx)
        return sparse_attention(q, k, v, index, scale=scale, seq_lens=seq_lens,
                                return_lse=return_lse, out=out, ctx=ctx)
