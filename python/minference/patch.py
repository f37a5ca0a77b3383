"""The Hugging Face transformers patch: `model = MInference("minference", model_name)(model)`.

The patch registers an attention function named "minference" in transformers' AttentionInterface
(with the sdpa mask builder in AttentionMaskInterface) and switches the model to it. For each call:

* prefill (q_len == k_len > 1, no cache before this call): libminference's mi_prefill_attention,
  every query head with its pattern from the layer's config entry (layer index = module.layer_idx).
  k and v keep their H_kv heads (GQA is a broadcast in the library, never a repeat_kv copy). q, k,
  v and the output are described to the library with their strides: no copies.
* a later prefill chunk or a follow-up turn over transformers' cache (1 < q_len < k_len): the same
  call with queries at an offset (the last q_len positions of k/v), for a batch without padding;
  with padding or with "static" patterns it runs sdpa, with a warning.
* decode (q_len == 1): transformers' sdpa function.
* padding (batch > 1, fresh prompts): right padding becomes per-sequence lengths; left padding
  runs each sequence over its valid span (a strided view: still no copies). Rows of padding
  tokens get output 0 (their values never reach a real token). A mask that is neither (custom 4-D
  masks, sliding windows shorter than the prompt, attention biases) falls back to sdpa with a
  warning.
* training (gradients needed) or dropout: sdpa, with a warning (the kernels are inference only).

KV methods (kv_type streamingllm, snapkv, pyramidkv): the patched model's cache is a
KVMethodCache (a DynamicCache whose layers count the tokens seen apart from the rows kept); after
each attention call the layer keeps the rows libminference's mi_session_kv_keep_rows names, the
rule a C session applies. The other KV methods need the C runner's paged cache.
"""

import ctypes
import warnings
import weakref

from . import _lib as L
from .configuration import MInferenceConfig
from .core import Config, MInferenceError, PrefillParams, VSParams, get_context

__all__ = ["MInference", "minference_attention_forward", "register_attention", "ATTENTION_NAME",
           "kv_cache", "kv_keep_rows"]

ATTENTION_NAME = "minference"
_registered = False


def _warn_once(state, key, msg):
    if state is None or key not in state.warned:
        if state is not None:
            state.warned.add(key)
        warnings.warn(msg, stacklevel=3)


class _PatchState:
    """What one patched model needs at run time; attached to each attention module."""

    def __init__(self, config, patterns, params, n_heads, name):
        self.config = config  # MInferenceConfig
        self.patterns = patterns  # layer -> ctypes mi_head_pattern[n_heads]
        self.params = params  # ctypes mi_prefill_params (softmax_scale set per call)
        self.n_heads = n_heads
        self.name = name
        self.warned = set()
        self.mask_ref = None
        self.mask_info = None
        self.mask_window = None
        # "offset": the sparse calls whose queries sat at an offset (a later chunk or turn)
        self.calls = {"sparse": 0, "dense_fallback": 0, "offset": 0}
        self.search = None  # _Search when is_search
        self.cache = {}
        self.kv_spec = None  # the KV method's spec (mi_session_kv_keep_rows), None: dense
        self.kv_layers = {}  # layer -> weakref to the KVMethodCache layer last updated


class _Search:
    """is_search: every prefill runs dense (sdpa) and searches the layers not yet in the output
    file, appending each searched layer to it (as the original does)."""

    def __init__(self, path, n_layers, n_heads, params):
        import os

        self.path = path
        self.n_layers = n_layers
        self.n_heads = n_heads
        self.params = params
        self.entries = Config.load(path).to_list() if os.path.isfile(path) else []
        self.searched = []


def _sdpa():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward


def register_attention():
    """Registers the "minference" attention (and its mask builder) with transformers."""
    global _registered
    if _registered:
        return
    try:
        from transformers import AttentionInterface
    except ImportError as e:  # pragma: no cover
        raise ImportError("the MInference patch needs transformers >= 4.48 (AttentionInterface)") from e
    AttentionInterface.register(ATTENTION_NAME, minference_attention_forward)
    try:
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    except ImportError:
        # Older transformers build the eager (additive float) mask for unknown implementations;
        # the mask analysis below reads those too.
        pass
    _registered = True


# ---------------------------------------------------------------------------------------------
# Mask analysis: which (contiguous) span of each sequence holds its real tokens


def _allowed(torch, mask, Lq, Lk):
    """The mask as bool [B', Lq, Lk] (one head), or ("unsupported", why)."""
    if not isinstance(mask, torch.Tensor):
        return ("unsupported", f"attention mask of type {type(mask).__name__}")
    if mask.dim() != 4 or mask.shape[-1] != Lk or mask.shape[-2] != Lq:
        return ("unsupported", f"attention mask of shape {tuple(mask.shape)}")
    if mask.dtype == torch.bool:
        allowed = mask
    else:
        big_neg = torch.finfo(mask.dtype).min / 2 if mask.dtype.is_floating_point else -1
        allowed = mask > big_neg
        if bool(((mask != 0) & allowed).any()):
            return ("unsupported", "an attention mask with additive biases")
    if allowed.shape[1] != 1:
        if bool((allowed != allowed[:, :1]).any()):
            return ("unsupported", "a per-head attention mask")
    return allowed[:, 0]


def _analyze_offset_mask(torch, mask, Lq, Lk, window=None):
    """Queries at an offset (the last Lq of Lk positions): None when every sequence's mask is
    plain causal over all Lk keys (no padding), else ("unsupported", why)."""
    if mask is None:
        return None
    allowed = _allowed(torch, mask, Lq, Lk)
    if isinstance(allowed, tuple):
        return allowed
    idx = torch.arange(Lk, device=allowed.device)
    chunk = max(1, (1 << 24) // max(Lk, 1))
    for r0 in range(0, Lq, chunk):
        r1 = min(Lq, r0 + chunk)
        pos = torch.arange(r0, r1, device=allowed.device) + (Lk - Lq)
        expected = idx[None, :] <= pos[:, None]
        if window is not None:
            expected &= idx[None, :] > pos[:, None] - window
        if not bool((allowed[:, r0:r1] == expected).all()):
            return ("unsupported", "padding or a custom attention mask with queries at an offset")
    return None


def _analyze_mask(torch, mask, B, Lq, Lk, window=None):
    """None -> no padding. ("right", lens) / ("spans", [(start, end)] * B) / ("unsupported", why)."""
    if mask is None:
        return None
    if Lq < Lk:
        return _analyze_offset_mask(torch, mask, Lq, Lk, window)
    allowed = _allowed(torch, mask, Lq, Lk)
    if isinstance(allowed, tuple):
        return allowed
    if allowed.shape[0] != B:
        allowed = allowed.expand(B, Lq, Lk)
    idx = torch.arange(Lk, device=allowed.device)
    chunk = max(1, (1 << 24) // max(Lk, 1))  # rows compared at a time: bounded memory
    spans = []
    for b in range(B):
        a = allowed[b]
        key_valid = a.any(dim=0)
        n = int(key_valid.sum())
        if n == 0:
            spans.append((0, 0))
            continue
        s = int(torch.argmax(key_valid.to(torch.int8)))
        e = s + n
        if not bool(key_valid[s:e].all()):
            return ("unsupported", "padding inside a sequence")
        in_span = (idx >= s) & (idx < e)
        # Rows of real tokens must see exactly their causal keys of the span; rows of padding
        # tokens are not checked (their outputs are never read by a real token).
        for r0 in range(s, e, chunk):
            r1 = min(e, r0 + chunk)
            rows = torch.arange(r0, r1, device=a.device)
            expected = (idx[None, :] <= rows[:, None]) & in_span[None, :]
            if window is not None:
                expected &= idx[None, :] > rows[:, None] - window
            if not bool((a[r0:r1] == expected).all()):
                return ("unsupported", "a non-causal or custom attention mask")
        spans.append((s, e))
    if all(s == 0 and e == Lk for s, e in spans):
        return None
    if all(s == 0 for s, _ in spans):
        return ("right", [e for _, e in spans])
    return ("spans", spans)


def _mask_info(state, torch, mask, B, Lq, Lk, window=None):
    # Every layer of one forward gets the same mask object: analyse it once.
    if mask is None:
        return None
    key = (window, Lq, Lk)
    if state.mask_ref is not None and state.mask_ref() is mask and state.mask_window == key:
        return state.mask_info
    info = _analyze_mask(torch, mask, B, Lq, Lk, window)
    try:
        state.mask_ref = weakref.ref(mask)
        state.mask_window = key
        state.mask_info = info
    except TypeError:
        state.mask_ref = None
    return info


# ---------------------------------------------------------------------------------------------
# The attention function


def minference_attention_forward(module, query, key, value, attention_mask, dropout=0.0,
                                 scaling=None, is_causal=None, **kwargs):
    """transformers attention interface: query [B, H, q_len, D], key/value [B, H_kv, k_len, D]
    (after RoPE and the cache update). Returns ([B, q_len, H, D], None)."""
    import torch

    state = getattr(module, "_minference_state", None)
    layer = _method_layer(state, module, key)
    if layer is None:
        return _attend(torch, state, module, query, key, value, attention_mask, dropout, scaling,
                       is_causal, kwargs)
    if getattr(layer, "native", False):
        return _native_attention(torch, state, module, layer, query, key, value, attention_mask,
                                 dropout, scaling, is_causal, kwargs)
    # A KVMethodCache layer: its rows are the kept ones (fewer than the tokens once compressed),
    # so the mask transformers built for layer 0 may not fit this layer; without padding every
    # layer's mask is plain causal with the queries last, which the calls below assume.
    _require_unpadded(torch, state, attention_mask)
    out = _attend(torch, state, module, query, key, value, None, dropout, scaling, is_causal,
                  kwargs)
    layer.after_attention(state, module.layer_idx, query)
    return out


def _require_unpadded(torch, state, attention_mask):
    """The KV methods run on batches without padding: a plain causal mask, queries last."""
    if attention_mask is None:
        return
    info = _analyze_offset_mask(torch, attention_mask, attention_mask.shape[-2],
                                attention_mask.shape[-1])
    if info is not None:
        raise NotImplementedError(
            f"MInference kv_type {state.config.kv_type!r}: {info[1]}; the KV methods of the "
            "transformers patch run on batches without padding")


def _method_layer(state, module, key):
    """The KVMethodCache layer whose rows key is, or None."""
    if state is None or state.kv_spec is None:
        return None
    ref = state.kv_layers.get(getattr(module, "layer_idx", None))
    layer = ref() if ref is not None else None
    return layer if layer is not None and layer.keys is key else None


def _native_attention(torch, state, module, layer, query, key, value, attention_mask, dropout,
                      scaling, is_causal, kwargs):
    """A layer whose rows libminference keeps (quest, retr_attn, kivi, leank): key and value are
    the call's rows only. The first call attends over them here (the prefill pattern); every
    call then goes to the layer's mi_kv_cache, which appends the rows, attends later calls by
    the method's rule and runs the method's step after the call."""
    _require_unpadded(torch, state, attention_mask)
    cache = layer.cache_ref()
    idx = module.layer_idx
    first = cache.native_tokens(idx) == 0
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    out = None
    if first:
        out = _attend(torch, state, module, query, key, value, None, dropout, scaling, is_causal,
                      kwargs)[0]
    got = cache.native_call(idx, query, key, value, scale, want_out=not first)
    if not first:
        out = got.to(device=query.device, dtype=query.dtype).transpose(1, 2).contiguous()
    return out, None


def _causal_at_offset(torch, q_len, k_len, device):
    """Bool [q_len, k_len]: query i (position k_len - q_len + i) sees keys 0 .. its position."""
    pos = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
    return torch.arange(k_len, device=device)[None, :] <= pos


def _attend(torch, state, module, query, key, value, attention_mask, dropout, scaling, is_causal,
            kwargs):
    sdpa = _sdpa()
    q_len, k_len = query.shape[2], key.shape[2]

    def dense(reason=None):
        if state is not None:
            if reason:
                _warn_once(state, reason, f"MInference: {reason}; this call runs dense (sdpa)")
            state.calls["dense_fallback"] += 1
        mask = attention_mask
        if mask is None and 1 < q_len < k_len:
            # sdpa's is_causal aligns the queries with the first keys; these are the last ones
            mask = _causal_at_offset(torch, q_len, k_len, query.device)[None, None]
        return sdpa(module, query, key, value, mask, dropout=dropout, scaling=scaling,
                    is_causal=is_causal, **kwargs)

    if state is None or q_len <= 1 or q_len > k_len:
        return dense()  # decode, or an unpatched module
    offset = q_len < k_len  # a later prefill chunk or a follow-up turn over the cache
    if state.search is not None:
        if not offset:
            _search_step(state, module, torch, query, key, value, attention_mask)
        return dense()
    if state.patterns is None:  # attn_type "hf" with a KV method: transformers' attention
        return dense()
    if is_causal is False or not getattr(module, "is_causal", True):
        return dense("non-causal attention")
    if dropout and dropout > 0:
        return dense("attention dropout (training mode)")
    if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad):
        return dense("gradients are required (the MInference kernels are inference only: run "
                     "the model under torch.no_grad() or torch.inference_mode())")
    if kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None:
        return dense("attention biases / soft-capping are not supported")
    if query.device.type not in ("cpu", "cuda"):
        return dense(f"device {query.device.type} is not supported")
    if query.dtype != key.dtype or query.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return dense(f"dtype {query.dtype} is not supported")
    if offset and state.config.attn_type == "static":
        return dense("static patterns are estimated on whole prompts, not on queries at an offset")

    B, H, _, D = query.shape
    layer = getattr(module, "layer_idx", None)
    if layer is None or layer >= len(state.patterns):
        return dense("an attention module without a layer index")
    patterns = state.patterns[layer]
    if len(patterns) != H:
        raise ValueError(f"MInference: layer {layer} has {H} query heads but the patch was built "
                         f"for {len(patterns)}")
    sliding = kwargs.get("sliding_window")
    window = None
    if sliding is not None and 0 < sliding < k_len:
        if not all(p.type == L.MI_PATTERN_DENSE for p in patterns):
            return dense(f"a sliding window ({sliding}) shorter than the prompt ({k_len}) with "
                         "sparse patterns")
        # Dense attention within a window is exactly an A-shape without sinks.
        window = int(sliding)
        patterns = _window_patterns(state, window, H)

    info = _mask_info(state, torch, attention_mask, B, q_len, k_len, window)
    if info is not None and info[0] == "unsupported":
        return dense(info[1] + " cannot be expressed by sequence lengths")

    params = state.params
    params.softmax_scale = float(scaling) if scaling else 0.0
    # The output is written straight into the [B, L, H, D] layout that o_proj reads.
    out = torch.empty((B, q_len, H, D), dtype=query.dtype, device=query.device)
    out_bhld = out.transpose(1, 2)
    from .ops import prefill_attention

    static = None if offset else _static_for(state, layer, patterns)
    try:
        if static is not None and (info is None or info[0] == "right"):
            static(query, key, value, scale=params.softmax_scale or None,
                   seq_lens=None if info is None else info[1], out=out_bhld)
        elif info is None:  # also queries at an offset: the library places them last
            prefill_attention(query, key, value, patterns, params, out=out_bhld)
        elif info[0] == "right":
            prefill_attention(query, key, value, patterns, params, seq_lens=info[1], out=out_bhld)
        else:  # left (or mixed) padding: each sequence over its own span
            for b, (s, e) in enumerate(info[1]):
                if e > s:
                    prefill_attention(query[b:b + 1, :, s:e], key[b:b + 1, :, s:e],
                                      value[b:b + 1, :, s:e], patterns, params,
                                      out=out_bhld[b:b + 1, :, s:e])
                if s > 0:
                    out[b, :s].zero_()
                if e < q_len:
                    out[b, e:].zero_()
    except MInferenceError as err:
        if err.status == L.MI_STATUS_UNSUPPORTED:
            return dense(f"libminference does not support this call ({err.message})")
        raise
    state.calls["sparse"] += 1
    if offset:
        state.calls["offset"] += 1
    return out, None


def _static_for(state, layer, patterns):
    """attn_type "static": the layer's StaticVSAttention (sets estimated at its first prefill, with
    the config's sizes); None for the other types. Left padding runs the dynamic estimate."""
    if state.config.attn_type != "static":
        return None
    key = ("static", layer)
    if key not in state.cache:
        from .ops import StaticVSAttention

        state.cache[key] = StaticVSAttention([p.vertical_size for p in patterns],
                                             [p.slash_size for p in patterns])
    return state.cache[key]


def _window_patterns(state, window, n_heads):
    key = ("window", window, n_heads)
    arr = state.cache.get(key)
    if arr is None:
        p = L.load().mi_head_pattern_default(L.MI_PATTERN_A_SHAPE)
        p.n_init, p.n_local, p.n_last = 0, window, 0
        arr = state.cache[key] = _uniform(n_heads, p)
    return arr


def _search_step(state, module, torch, query, key, value, attention_mask):
    from .search import search_layer

    srch = state.search
    layer = getattr(module, "layer_idx", None)
    if layer is None or layer != len(srch.entries):
        if len(srch.entries) >= srch.n_layers:
            _warn_once(state, "search-complete",
                       f"MInference search already complete: {srch.path} has every layer")
        return
    B, H, Lq, _ = query.shape
    info = _mask_info(state, torch, attention_mask, B, Lq, Lq)
    s, e = 0, Lq
    if info is not None and info[0] == "unsupported":
        _warn_once(state, "search-mask", f"MInference search: {info[1]}; layer not searched")
        return
    if info is not None:
        s, e = (0, info[1][0]) if info[0] == "right" else info[1][0]
    if B > 1:
        _warn_once(state, "search-batch", "MInference search uses the first sequence of the batch")

    def cpu(x):
        return x[:1, :, s:e].detach().to("cpu", torch.float32)

    pats, scores, _ = search_layer(cpu(query), cpu(key), cpu(value), srch.params)
    one = Config.create(1, H)
    for h in range(H):
        one.set_head(0, h, pats[h], float(scores[h]))
    srch.entries.append(one.to_list()[0])
    srch.searched.append(layer)
    Config.from_list(srch.entries).save(srch.path)
    if len(srch.entries) == srch.n_layers:
        _warn_once(state, "search-done", f"MInference search complete: wrote {srch.path}; use "
                   f"MInference('minference', config_path={srch.path!r})")


# ---------------------------------------------------------------------------------------------
# KV methods on transformers' cache

# The KV methods a transformers cache can hold: they only drop rows, by a rule the library
# exposes (mi_session_kv_keep_rows). The others keep quantized pages (kivi), per-page metadata
# (quest), an index (retr_attn) or per-channel keys (leank) in the C runner's paged cache.
# Value: whether the rule reads the call's queries and keys (SnapKV's observation window).
HF_KV_METHODS = {"streamingllm": False, "snapkv": True, "pyramidkv": True}
# Methods whose rows libminference keeps for the patch (an mi_kv_cache per sequence): they read
# selected pages (Quest), an index (RetrievalAttention), quantized codes (KIVI) or pruned key
# channels (LeanK), which a transformers cache cannot hold.
HF_NATIVE_KV_METHODS = ("quest", "retr_attn", "kivi", "leank")


class NativeKVCache:
    """libminference's mi_kv_cache: one sequence's pages and KV method, without a model."""

    def __init__(self, spec, n_layers, n_heads, n_kv_heads, head_dim, n_threads=0):
        lib = L.load_model()
        p = lib.mi_kv_cache_default_params()
        self._spec = str(spec).encode()
        p.kv = self._spec
        p.n_layers, p.n_heads, p.n_kv_heads, p.head_dim = (int(n_layers), int(n_heads),
                                                           int(n_kv_heads), int(head_dim))
        p.n_threads = int(n_threads)
        h = ctypes.c_void_p()
        msg = ctypes.create_string_buffer(512)
        st = lib.mi_kv_cache_create(ctypes.byref(p), ctypes.byref(h), msg, len(msg))
        if st != L.MI_STATUS_SUCCESS:
            raise MInferenceError(st, msg.value.decode("utf-8", "replace"), "mi_kv_cache_create")
        self._lib, self._h, self.n_layers = lib, h, int(n_layers)

    def __del__(self):
        h = getattr(self, "_h", None)
        if h:
            self._lib.mi_kv_cache_destroy(h)
            self._h = None

    def rows(self, layer):
        return int(self._lib.mi_kv_cache_rows(self._h, int(layer)))

    def tokens(self, layer):
        return int(self._lib.mi_kv_cache_tokens(self._h, int(layer)))

    def nbytes(self):
        return int(self._lib.mi_kv_cache_bytes(self._h))

    def call(self, layer, query, key, value, scale, want_out=True):
        """One layer's call (mi_kv_cache_call): query [1, H, n, D], key/value [1, H_kv, n, D],
        torch tensors or NumPy arrays; returns the attention [1, H, n, D] as float32 NumPy, or
        None when want_out is False (the caller attended)."""
        import numpy as np

        from .core import _describe

        def f32(x):
            if hasattr(x, "detach"):
                import torch

                return np.ascontiguousarray(x.detach().to("cpu", torch.float32).numpy())
            return np.ascontiguousarray(x, dtype=np.float32)

        q, k, v = f32(query), f32(key), f32(value)
        out = np.empty_like(q) if want_out else None
        dq, dk, dv = _describe(q, "query"), _describe(k, "key"), _describe(v, "value")
        do = _describe(out, "out") if want_out else None
        st = self._lib.mi_kv_cache_call(self._h, int(layer), ctypes.byref(dq.desc),
                                        ctypes.byref(dk.desc), ctypes.byref(dv.desc),
                                        float(scale), ctypes.byref(do.desc) if want_out else None)
        if st != L.MI_STATUS_SUCCESS:
            raise MInferenceError(st, self._lib.mi_kv_cache_last_error(self._h).decode(
                "utf-8", "replace"), "mi_kv_cache_call")
        return out


def kv_keep_rows(spec, n_layers, layer, query, key):
    """The rows of one layer that a KV method keeps after a call (the library's rule, the one a
    C session applies): query [1, H, n, D] (the call's queries after RoPE; None for
    StreamingLLM), key [1, H_kv, len, D] (the layer's rows, the call's included), torch tensors
    or NumPy arrays. Returns an int64 NumPy array [H_kv, count], ascending rows per KV head, or
    None when the layer stays whole."""
    import numpy as np

    from .core import _describe

    lib = L.load_model()
    reads = HF_KV_METHODS.get(str(spec).split(":")[0], True)

    def f32(x, name):
        if hasattr(x, "detach"):
            x = x.detach().to("cpu", copy=False)
            import torch

            x = x.to(torch.float32)
        else:
            x = np.asarray(x, dtype=np.float32)
        return _describe(x, name)

    H, n_rows, D = int(key.shape[1]), int(key.shape[2]), int(key.shape[3])
    if reads:
        dk = f32(key, "key")
    else:  # the rule reads the lengths only: a descriptor of the right shape, no copy
        dk = _describe(np.broadcast_to(np.zeros(D, np.float32), (1, H, n_rows, D)), "key")
    dq = f32(query, "query") if query is not None else None
    keep = np.empty(max(H * n_rows, 1), dtype=np.int64)
    count = ctypes.c_int64(0)
    msg = ctypes.create_string_buffer(512)
    st = lib.mi_session_kv_keep_rows(str(spec).encode(), int(n_layers), int(layer),
                                     None if dq is None else ctypes.byref(dq.desc),
                                     ctypes.byref(dk.desc), keep.ctypes.data, ctypes.byref(count),
                                     msg, len(msg))
    if st != L.MI_STATUS_SUCCESS:
        raise MInferenceError(st, msg.value.decode("utf-8", "replace"), "mi_session_kv_keep_rows")
    if count.value >= n_rows:
        return None
    return keep[:H * count.value].reshape(H, count.value)


_CACHE_CLASSES = None


def _cache_classes():
    """KVMethodCache and its layer, built on first use (they subclass transformers' classes)."""
    global _CACHE_CLASSES
    if _CACHE_CLASSES is not None:
        return _CACHE_CLASSES
    try:
        from transformers.cache_utils import Cache, DynamicCache, DynamicLayer
    except ImportError as e:  # pragma: no cover
        raise ImportError("the KV methods of the MInference patch need transformers >= 5 (cache "
                          "layers)") from e
    import numpy as np
    import torch

    class KVMethodLayer(DynamicLayer):
        """A DynamicLayer whose rows may be fewer than its tokens: get_seq_length (the next
        position) counts the tokens, the mask sizes count the rows, placed last."""

        def __init__(self):
            super().__init__()
            self.seen = 0

        def update(self, key_states, value_states, *args, **kwargs):
            keys, values = super().update(key_states, value_states, *args, **kwargs)
            self.seen += key_states.shape[-2]
            return keys, values

        def rows(self):
            return 0 if self.keys is None or not self.is_initialized else self.keys.shape[-2]

        def get_seq_length(self, *args):
            return self.seen

        def get_mask_sizes(self, query_length, *args):
            if isinstance(query_length, torch.Tensor):  # older releases pass cache_position
                query_length = query_length.shape[0]
            rows = self.rows()
            return rows + int(query_length), self.seen - rows

        def crop(self, tokens_to_remove):
            if self.rows() != self.seen:
                raise NotImplementedError("a KV method's cache dropped rows: it cannot be cropped")
            super().crop(tokens_to_remove)
            self.seen = self.rows()

        def reset(self):
            super().reset()
            self.seen = 0

        def keep(self, spec, n_layers, layer, query):
            """Keeps the rows mi_session_kv_keep_rows names, sequence by sequence."""
            if self.rows() == 0:
                return
            picks = []
            for b in range(self.keys.shape[0]):
                kept = kv_keep_rows(spec, n_layers, layer,
                                    None if query is None else query[b:b + 1], self.keys[b:b + 1])
                if kept is None:  # the count depends on the lengths only: same for every b
                    return
                picks.append(kept)
            idx = torch.as_tensor(np.stack(picks), device=self.keys.device)
            idx = idx[..., None].expand(-1, -1, -1, self.keys.shape[-1])
            self.keys = self.keys.gather(2, idx)
            self.values = self.values.gather(2, idx)

        def after_attention(self, state, layer, query):
            cache = self.cache_ref() if getattr(self, "cache_ref", None) else None
            if cache is None:
                return
            n = query.shape[2]
            if HF_KV_METHODS[cache.method] and n < 2:
                return  # SnapKV / PyramidKV compress after prefill calls only (the C rule)
            self.keep(cache.spec, cache.n_layers, layer,
                      query if HF_KV_METHODS[cache.method] else None)

    class NativeKVLayer(DynamicLayer):
        """A layer whose rows libminference keeps (KVMethodCache.native): update hands the call's
        rows to the attention, which passes them to the sequence's mi_kv_cache."""

        native = True

        def __init__(self):
            super().__init__()
            self.seen = 0

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.dtype, self.device = key_states.dtype, key_states.device
                self.is_initialized = True
            # only the call's rows: the attention finds its layer by them (_method_layer)
            self.keys, self.values = key_states, value_states
            self.seen += key_states.shape[-2]
            return key_states, value_states

        def rows(self):
            cache = self.cache_ref()
            return cache.native_rows(self.index) if cache is not None else 0

        def get_seq_length(self, *args):
            return self.seen

        def get_mask_sizes(self, query_length, *args):
            if isinstance(query_length, torch.Tensor):
                query_length = query_length.shape[0]
            # the mask spans the tokens seen before the call and the call's own
            return self.seen + int(query_length), 0

        def crop(self, tokens_to_remove):
            raise NotImplementedError("a libminference-kept KV cache cannot be cropped")

        def reorder_cache(self, beam_idx):
            raise NotImplementedError("a libminference-kept KV cache cannot be reordered (beam "
                                      "search)")

        def reset(self):
            super().reset()
            self.seen = 0
            cache = self.cache_ref()
            if cache is not None:
                cache.native = None

    class KVMethodCache(DynamicCache):
        """transformers' DynamicCache with a KV method. streamingllm, snapkv, pyramidkv: after
        each attention call of a model patched with that kv_type, a layer keeps the rows that
        libminference's rule names. quest, retr_attn, kivi, leank: libminference keeps the rows
        (an mi_kv_cache per sequence, the sessions' pages and method) and attends later calls by
        the method's rule. Made by the patch for generate() and for forward calls without a
        cache; minference.kv_cache(model) makes one for a loop of your own."""

        def __init__(self, spec, n_layers, state=None):
            self.spec = spec
            self.method = spec.split(":")[0]
            self.is_native = self.method in HF_NATIVE_KV_METHODS
            if self.method not in HF_KV_METHODS and not self.is_native:
                raise NotImplementedError(f"kv method {self.method!r} cannot run on a "
                                          "transformers cache")
            cls = NativeKVLayer if self.is_native else KVMethodLayer
            Cache.__init__(self, layers=[cls() for _ in range(n_layers)])
            self.n_layers = n_layers
            self.state = weakref.ref(state) if state is not None else None
            self.native = None  # [NativeKVCache per sequence of the batch], made at first use
            for i, layer in enumerate(self.layers):
                layer.cache_ref = weakref.ref(self)
                layer.index = i

        def native_tokens(self, layer_idx):
            return 0 if self.native is None else self.native[0].tokens(layer_idx)

        def native_rows(self, layer_idx):
            return 0 if self.native is None else self.native[0].rows(layer_idx)

        def native_call(self, layer_idx, query, key, value, scale, want_out):
            """mi_kv_cache_call for each sequence of the batch: [B, H, n, D] in, the attention
            [B, H, n, D] (float32, CPU) out, or None when want_out is False."""
            B = query.shape[0]
            if self.native is None:
                self.native = [NativeKVCache(self.spec, self.n_layers, query.shape[1],
                                             key.shape[1], key.shape[3]) for _ in range(B)]
            if len(self.native) != B:
                raise ValueError(f"a KV cache of {len(self.native)} sequences got a batch of {B}")
            outs = [c.call(layer_idx, query[b:b + 1], key[b:b + 1], value[b:b + 1], scale,
                           want_out) for b, c in enumerate(self.native)]
            return torch.from_numpy(np.concatenate(outs, 0)) if want_out else None

        def kv_bytes(self):
            """Bytes of the KV pages (libminference-kept methods: their stored format, e.g.
            KIVI's codes); transformers' tensors otherwise."""
            if self.is_native:
                return sum(c.nbytes() for c in self.native or [])
            return sum(t.numel() * t.element_size() for layer in self.layers
                       for t in (layer.keys, layer.values) if t is not None)

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
            layer = self.layers[layer_idx]
            state = self.state() if self.state is not None else None
            if state is not None:
                state.kv_layers[layer_idx] = weakref.ref(layer)
            if self.is_native:
                return keys, values
            if key_states.shape[-2] == 1 and not HF_KV_METHODS[self.method]:
                # StreamingLLM's decode step reads the sinks and the last n_local rows, its own
                # included (a C session selects those): evict before the attention.
                layer.keep(self.spec, self.n_layers, layer_idx, None)
                keys, values = layer.keys, layer.values
            return keys, values

        def kept_rows(self, layer_idx=0):
            """Rows the layer holds now (get_seq_length() counts the tokens seen)."""
            return self.layers[layer_idx].rows()

    _CACHE_CLASSES = (KVMethodCache, KVMethodLayer)
    return _CACHE_CLASSES


def kv_cache(model):
    """A fresh KVMethodCache for a model patched with a KV method (kv_type streamingllm, snapkv
    or pyramidkv), for calls that pass their cache (model(ids, cache=kv_cache(model)))."""
    state = getattr(model, "_minference_state", None)
    if state is None or state.kv_spec is None:
        raise ValueError("kv_cache(model): the model is not patched with a KV method")
    cls, _ = _cache_classes()
    return cls(state.kv_spec, state.n_layers, state)


def _install_kv_hooks(model, state):
    """generate() and forward calls without a cache get a KVMethodCache."""
    import inspect

    cls, _ = _cache_classes()
    params = inspect.signature(model.forward).parameters
    name = "cache" if "cache" in params else "past_key_values"
    prepare = model._prepare_cache_for_generation

    def prepare_cache(generation_config, model_kwargs, *args, **kwargs):
        out = prepare(generation_config, model_kwargs, *args, **kwargs)
        for key in ("cache", "past_key_values"):
            c = model_kwargs.get(key)
            if c is not None and type(c).__name__ == "DynamicCache" and c.get_seq_length() == 0 \
                    and not getattr(c, "_is_user_defined", False):
                model_kwargs[key] = cls(state.kv_spec, state.n_layers, state)
        return out

    def pre_hook(module, args, kwargs):
        use = kwargs.get("use_cache")
        if use is None:
            use = getattr(model.config, "use_cache", True)
        given = kwargs.get("cache") is not None or kwargs.get("past_key_values") is not None
        if use and not given and len(args) <= 1:
            kwargs[name] = cls(state.kv_spec, state.n_layers, state)
            return args, kwargs
        return None

    model._prepare_cache_for_generation = prepare_cache
    state.kv_hook = model.register_forward_pre_hook(pre_hook, with_kwargs=True)


def _remove_kv_hooks(model, state):
    if getattr(state, "kv_hook", None) is not None:
        state.kv_hook.remove()
        state.kv_hook = None
        model.__dict__.pop("_prepare_cache_for_generation", None)


# ---------------------------------------------------------------------------------------------
# The model patch


def _text_config(model):
    cfg = model.config
    if hasattr(cfg, "get_text_config"):
        try:
            cfg = cfg.get_text_config()
        except TypeError:
            pass
    return cfg


def _attention_modules(model):
    mods = []
    for m in model.modules():
        if hasattr(m, "layer_idx") and (hasattr(m, "o_proj") or hasattr(m, "q_proj")) and not any(
                hasattr(c, "o_proj") and hasattr(c, "layer_idx") for c in m.children()):
            mods.append(m)
    return mods


def _prefill_params(kw):
    vs = VSParams(**{k: kw[k] for k in ("last_q", "forced_columns", "forced_diagonals",
                                        "min_vertical", "min_slash") if k in kw})
    return PrefillParams(None, vs, kw.get("dense_below")).to_c()


def _uniform(n_heads, pattern_c):
    arr = (L.mi_head_pattern * n_heads)()
    for h in range(n_heads):
        arr[h] = pattern_c
    return arr


def _build_patterns(cfg: MInferenceConfig, n_layers, n_heads, what):
    lib = L.load()
    kw = cfg.attn_kwargs
    dense = _uniform(n_heads, lib.mi_head_pattern_default(L.MI_PATTERN_DENSE))
    t = cfg.attn_type
    if t == "dense":
        return [dense] * n_layers
    if t in cfg.PATTERN_ATTENTION_TYPES:
        return [_uniform(n_heads, cfg.head_pattern().to_c())] * n_layers
    if t in ("a_shape", "tri_shape", "tri_mix", "tri_mix_minference"):
        p = lib.mi_head_pattern_default(
            L.MI_PATTERN_A_SHAPE if t == "a_shape" else L.MI_PATTERN_TRI_SHAPE)
        p.n_init, p.n_local = int(kw["n_init"]), int(kw["n_local"])
        if t != "a_shape":
            p.n_last = int(kw["n_last"])
        shaped = _uniform(n_heads, p)
        if t in ("a_shape", "tri_shape"):
            return [shaped] * n_layers
    # minference / tri_mix_minference / tri_mix
    start = int(kw.get("starting_layer", -1))
    if t == "tri_mix":
        return [dense if i < start else shaped for i in range(n_layers)]
    ctx = get_context()
    if cfg.config_path:
        config = Config.load(cfg.config_path, ctx)
    else:
        warnings.warn(cfg.missing_config_message(what), stacklevel=4)
        config = Config.create(n_layers, n_heads, None, ctx)
    config.check(n_layers, n_heads, ctx)
    ratio = kw.get("minference_ratio")
    layers = []
    for i in range(n_layers):
        if t == "tri_mix_minference" and i >= start:
            layers.append(shaped)
            continue
        if t == "minference" and i < start:
            layers.append(dense)
            continue
        arr = config.layer_array(i, n_heads, ctx)
        if ratio is not None:
            for h in range(n_heads):
                arr[h].vertical_size = int(arr[h].vertical_size * ratio)
                arr[h].slash_size = int(arr[h].slash_size * ratio)
        layers.append(arr)
    config.close()
    return layers


class MInference:
    """`model = MInference(attn_type, model_name, config_path=...)(model)` patches a transformers
    causal LM (Llama, Qwen2, Mistral and other models whose attention goes through
    AttentionInterface) so that its prefill attention runs on libminference.

    attn_type: "minference" (per-head patterns from a config; heads missing from it, or every head
    without a config, get vertical_and_slash 1000/6096), "dense", "a_shape", "tri_shape",
    "tri_mix", "tri_mix_minference", or "hf" (no patch). The original's other types raise
    NotImplementedError. kv_type (the original's names, with their attn_kwargs): applied to a
    minference.Model, MInference sets its attention and the KV method of its generate and
    sessions (every kv_type); on a transformers model "dense", "streamingllm", "snapkv" and
    "pyramidkv" run on a KVMethodCache (see kv_cache), "quest", "retr_attn", "kivi" and "leank"
    raise NotImplementedError (they need the C runner's paged cache). attn_kwargs: n_init,
    n_local, n_last, starting_layer, minference_ratio, dense_below (sequences shorter than this run dense; 0 = never, default: the
    library's crossover), last_q, forced_columns, forced_diagonals, min_vertical, min_slash.

    is_search=True (with config_path= the output file): every prefill runs dense and searches
    the layers not yet in the file (minference.search.search_layer on the CPU, parameters from
    attn_kwargs["search"], a SearchParams or dict), appending each to the file."""

    def __init__(self, attn_type="minference", model_name=None, config_path=None, kv_type="dense",
                 starting_layer=-1, attn_kwargs=None, is_search=False, **kwargs):
        self.config = MInferenceConfig(attn_type=attn_type, model_name=model_name,
                                       config_path=config_path, kv_type=kv_type,
                                       starting_layer=starting_layer, attn_kwargs=attn_kwargs,
                                       is_search=is_search, **kwargs)

    def __call__(self, model):
        return self.patch_model(model)

    def patch_model(self, model):
        cfg = self.config
        from .model import Model  # the C runner: its sessions run the KV methods
        if isinstance(model, Model):
            model.set_attention(cfg)
            return model
        spec = None
        if cfg.kv_type != "dense":
            if cfg.kv_type not in HF_KV_METHODS and cfg.kv_type not in HF_NATIVE_KV_METHODS:
                raise NotImplementedError(
                    f"kv_type {cfg.kv_type!r} runs in the C model runner only (minference.Model: "
                    f"MInference(...)(Model(path)) or Model.session(kv={cfg.kv_spec()!r})); the "
                    "transformers patch keeps transformers' own KV cache, which holds "
                    f"kv_type {sorted(['dense'] + list(HF_KV_METHODS))} (the others keep "
                    "quantized pages, page metadata, an index or per-channel keys)")
            spec = _checked_kv_spec(cfg)
            if cfg.is_search:
                raise ValueError("is_search runs dense: it takes kv_type 'dense'")
        if cfg.attn_type == "hf" and spec is None:
            return model
        try:
            import torch  # noqa: F401
        except ImportError as e:
            raise ImportError("the MInference model patch needs torch and transformers") from e
        register_attention()
        text_cfg = _text_config(model)
        n_layers = int(text_cfg.num_hidden_layers)
        n_heads = int(text_cfg.num_attention_heads)
        mods = _attention_modules(model)
        if not mods:
            raise ValueError(f"{type(model).__name__}: no attention modules with a layer_idx found; "
                             "the MInference patch supports transformers decoder models whose "
                             "attention goes through AttentionInterface")
        what = cfg.model_name or getattr(text_cfg, "_name_or_path", None) or type(model).__name__
        if spec is not None:
            _check_kv_model(cfg, text_cfg)
            if cfg.kv_type in HF_NATIVE_KV_METHODS:
                # the keys' relations and a LeanK mask's shape, on the model's geometry
                heads = int(text_cfg.num_attention_heads)
                kv_heads = int(getattr(text_cfg, "num_key_value_heads", None) or heads)
                head_dim = int(getattr(text_cfg, "head_dim", None) or
                               int(text_cfg.hidden_size) // heads)
                try:
                    NativeKVCache(spec, n_layers, heads, kv_heads, head_dim, 1)
                except MInferenceError as err:
                    raise ValueError(f"kv_type {cfg.kv_type!r}: {err.message}") from None
        if cfg.is_search:
            patterns = [None] * n_layers
        elif cfg.attn_type == "hf":
            patterns = None  # transformers' attention, with the KV method's cache
        else:
            patterns = _build_patterns(cfg, n_layers, n_heads, what)
        state = _PatchState(cfg, patterns, _prefill_params(cfg.attn_kwargs), n_heads, what)
        state.n_layers = n_layers
        state.kv_spec = spec
        if cfg.is_search:
            state.search = _Search(cfg.config_path, n_layers, n_heads, cfg.attn_kwargs.get("search"))
        for m in mods:
            m._minference_state = state
        previous = getattr(model.config, "_attn_implementation", None)
        earlier = getattr(model, "_minference_state", None)
        if earlier is not None:  # patched again: keep what the model had before the first patch
            previous = earlier.previous_attn_implementation
            for m in model.modules():
                if m.__dict__.get("_minference_state") is earlier:
                    del m.__dict__["_minference_state"]
            _remove_kv_hooks(model, earlier)
        try:
            model.set_attn_implementation(ATTENTION_NAME)
        except (AttributeError, ValueError, TypeError, KeyError):
            model.config._attn_implementation = ATTENTION_NAME
        if getattr(text_cfg, "_attn_implementation", ATTENTION_NAME) != ATTENTION_NAME:
            text_cfg._attn_implementation = ATTENTION_NAME
        state.previous_attn_implementation = previous
        model._minference_state = state
        if spec is not None:
            _install_kv_hooks(model, state)
        return model


def _checked_kv_spec(cfg):
    """The spec with the library's check of its keys and values (and the defaults filled in)."""
    spec = cfg.kv_spec()
    lib = L.load_model()
    msg = ctypes.create_string_buffer(512)
    st = lib.mi_session_kv_check(spec.encode(), msg, len(msg))
    if st != L.MI_STATUS_SUCCESS:
        raise ValueError(f"kv_type {cfg.kv_type!r}: {msg.value.decode('utf-8', 'replace')}")
    spec = msg.value.decode()
    if cfg.kv_type in HF_NATIVE_KV_METHODS:
        return spec  # checked on the model's geometry (patch_model)
    # The keys' relations (capacity > window, ...) are checked when the method is built: once
    # now, on a one-row layer, rather than at the first prefill.
    import numpy as np

    one = np.zeros((1, 1, 1, 1), np.float32)
    try:
        kv_keep_rows(spec, 1, 0, one, one)
    except MInferenceError as err:
        raise ValueError(f"kv_type {cfg.kv_type!r}: {err.message}") from None
    return spec


def _check_kv_model(cfg, text_cfg):
    types = getattr(text_cfg, "layer_types", None) or []
    window = getattr(text_cfg, "sliding_window", None)
    if any("sliding" in str(t) for t in types) or (
            window and getattr(text_cfg, "use_sliding_window", True) and not types):
        raise NotImplementedError(
            f"kv_type {cfg.kv_type!r} on a model with sliding-window layers: the window's cache "
            "and the KV method's cannot be combined in the transformers patch")


def unpatch(model):
    """Restores the attention implementation the model had before the patch."""
    state = getattr(model, "_minference_state", None)
    if state is None:
        return model
    prev = state.previous_attn_implementation or "sdpa"
    try:
        model.set_attn_implementation(prev)
    except (AttributeError, ValueError, TypeError, KeyError):
        model.config._attn_implementation = prev
    for m in model.modules():
        if m.__dict__.get("_minference_state") is state:
            del m.__dict__["_minference_state"]
    _remove_kv_hooks(model, state)
    model.__dict__.pop("_minference_state", None)
    return model

