"""ctypes declarations of include/minference.h, include/minference_cuda.h and
include/minference_model.h, and the loaders.

Structs mirror the C layout field for field; enums are C ints. The library is found, in order:
  1. the MINFERENCE_LIBRARY environment variable (a path to libminference.so);
  2. the library shipped in this package (minference/lib/libminference.so), or the prebuilt one
     named at build time (minference/lib/external_library.txt);
  3. a CMake build of the repository this package sits in (../build*/libminference.so);
  4. the system's library search path (libminference.so.0 / libminference.so).

The model runner, libminference_model.so, is loaded only when a Model is made (load_model), after
libminference, in the same order: MINFERENCE_MODEL_LIBRARY; the folder of the libminference that
was loaded; the package's lib/; the repository's build folders; the system's library path.
"""

import ctypes
import ctypes.util
import os
import sys
from pathlib import Path

c_int32 = ctypes.c_int32
c_int64 = ctypes.c_int64
c_size_t = ctypes.c_size_t
c_void_p = ctypes.c_void_p
c_char_p = ctypes.c_char_p
c_float = ctypes.c_float
c_double = ctypes.c_double
c_uint16 = ctypes.c_uint16
c_uint32 = ctypes.c_uint32
c_uint64 = ctypes.c_uint64
c_int = ctypes.c_int
P = ctypes.POINTER

# ---- enums ----------------------------------------------------------------------------------

STATUS_NAMES = {
    0: "MI_STATUS_SUCCESS",
    1: "MI_STATUS_INVALID_ARGUMENT",
    2: "MI_STATUS_SHAPE_MISMATCH",
    3: "MI_STATUS_UNSUPPORTED",
    4: "MI_STATUS_OUT_OF_MEMORY",
    5: "MI_STATUS_IO_ERROR",
    6: "MI_STATUS_PARSE_ERROR",
    7: "MI_STATUS_NOT_BUILT",
    8: "MI_STATUS_DEVICE_ERROR",
    9: "MI_STATUS_WORKSPACE_TOO_SMALL",
    10: "MI_STATUS_INTERNAL",
}
for _value, _name in STATUS_NAMES.items():
    globals()[_name] = _value

MI_DEVICE_CPU = 0
MI_DEVICE_CUDA = 1

MI_DTYPE_F32 = 0
MI_DTYPE_F16 = 1
MI_DTYPE_BF16 = 2

MI_PATTERN_DENSE = 0
MI_PATTERN_A_SHAPE = 1
MI_PATTERN_TRI_SHAPE = 2
MI_PATTERN_VERTICAL_SLASH = 3
MI_PATTERN_BLOCK_SPARSE = 4
MI_PATTERN_DILATED = 5
MI_PATTERN_STRIDED = 6
MI_PATTERN_XATTENTION = 7
MI_PATTERN_FLEXPREFILL = 8

MI_BLOCK_SIZE = 64

# ---- structs --------------------------------------------------------------------------------


class mi_context_params(ctypes.Structure):
    _fields_ = [("device", c_int), ("device_id", c_int), ("n_threads", c_int)]


class mi_tensor(ctypes.Structure):
    _fields_ = [
        ("data", c_void_p),
        ("dtype", c_int),
        ("device", c_int),
        ("shape", c_int64 * 4),
        ("stride", c_int64 * 4),
    ]


class mi_head_pattern(ctypes.Structure):
    _fields_ = [
        ("type", c_int),
        ("vertical_size", c_int32),
        ("slash_size", c_int32),
        ("n_init", c_int32),
        ("n_local", c_int32),
        ("n_last", c_int32),
        ("top_k", c_int32),
        ("stride", c_int32),
        ("threshold", c_int32),
        ("tau", c_int32),
        ("dense_local", c_int32),
        ("block_size", c_int32),
        ("repr_topk", c_int32),
        ("chunk_size", c_int32),
        ("per_head", c_int32),
    ]


class mi_vs_params(ctypes.Structure):
    _fields_ = [
        ("last_q", c_int32),
        ("forced_columns", c_int32),
        ("forced_diagonals", c_int32),
        ("min_vertical", c_int32),
        ("min_slash", c_int32),
    ]


class mi_prefill_params(ctypes.Structure):
    _fields_ = [("softmax_scale", c_float), ("vs", mi_vs_params), ("dense_below", c_int32)]


class mi_vs_index(ctypes.Structure):
    _fields_ = [
        ("batch", c_int32),
        ("heads", c_int32),
        ("max_vertical", c_int32),
        ("max_slash", c_int32),
        ("vertical_count", c_void_p),
        ("vertical_idx", c_void_p),
        ("slash_count", c_void_p),
        ("slash_idx", c_void_p),
    ]


class mi_sparse_index(ctypes.Structure):
    _fields_ = [
        ("batch", c_int32),
        ("heads", c_int32),
        ("row_blocks", c_int32),
        ("max_blocks", c_int32),
        ("max_columns", c_int32),
        ("block_count", c_void_p),
        ("block_offset", c_void_p),
        ("column_count", c_void_p),
        ("column_index", c_void_p),
    ]


class mi_synth_params(ctypes.Structure):
    _fields_ = [
        ("seed", c_uint64),
        ("n_sinks", c_int32),
        ("n_verticals", c_int32),
        ("n_slashes", c_int32),
        ("slash_distances", c_void_p),
        ("local_window", c_int32),
        ("n_needles", c_int32),
        ("strength", c_float),
        ("noise", c_float),
    ]


class mi_synth_truth(ctypes.Structure):
    _fields_ = [
        ("vertical_cols", c_void_p),
        ("slash_dists", c_void_p),
        ("needle_rows", c_void_p),
        ("needle_cols", c_void_p),
    ]


class mi_head_metrics(ctypes.Structure):
    _fields_ = [
        ("recall", c_double),
        ("density", c_double),
        ("flops", c_double),
        ("dense_flops", c_double),
    ]


class mi_search_params(ctypes.Structure):
    _fields_ = [
        ("candidates", c_void_p),
        ("n_candidates", c_int32),
        ("mode", c_int),
        ("target_density", c_double),
        ("target_recall", c_double),
        ("error_weight", c_double),
        ("max_scale", c_double),
        ("min_scale", c_double),
        ("iterations", c_int32),
        ("prefill", mi_prefill_params),
    ]


MI_SEARCH_FIXED = 0
MI_SEARCH_FLOPS = 1
MI_SEARCH_ADAPTIVE = 2


# ---- prototypes -----------------------------------------------------------------------------

CTX = c_void_p  # mi_context *
CFG = c_void_p  # mi_config *
ST = c_int  # mi_status
T = P(mi_tensor)
I32P = c_void_p  # int32_t * (passed as an address)

PROTOTYPES = {
    "mi_version": (c_char_p, []),
    "mi_version_number": (c_uint32, []),
    "mi_status_string": (c_char_p, [c_int]),
    "mi_status_name": (c_char_p, [c_int]),
    "mi_context_default_params": (mi_context_params, []),
    "mi_context_create": (ST, [P(mi_context_params), P(c_void_p)]),
    "mi_context_destroy": (None, [CTX]),
    "mi_context_last_error": (c_char_p, [CTX]),
    "mi_context_set_error": (ST, [CTX, ST, c_char_p]),
    "mi_context_n_threads": (c_int, [CTX]),
    "mi_context_parse_tuning": (ST, [CTX, c_char_p]),
    "mi_context_format_tuning": (c_int, [CTX, c_char_p, c_size_t]),
    "mi_context_device": (c_int, [CTX]),
    "mi_build_features": (c_char_p, []),
    "mi_build_commit": (c_char_p, []),
    "mi_cuda_device_count": (c_int, []),
    "mi_dtype_size": (c_size_t, [c_int]),
    "mi_dtype_name": (c_char_p, [c_int]),
    "mi_tensor_bhld": (mi_tensor, [c_void_p, c_int, c_int, c_int64, c_int64, c_int64, c_int64]),
    "mi_tensor_blhd": (mi_tensor, [c_void_p, c_int, c_int, c_int64, c_int64, c_int64, c_int64]),
    "mi_f32_to_f16": (c_uint16, [c_float]),
    "mi_f16_to_f32": (c_float, [c_uint16]),
    "mi_f32_to_bf16": (c_uint16, [c_float]),
    "mi_bf16_to_f32": (c_float, [c_uint16]),
    "mi_pattern_count": (c_int32, []),
    "mi_pattern_name": (c_char_p, [c_int]),
    "mi_pattern_alias": (c_char_p, [c_int, c_int32]),
    "mi_pattern_from_name": (ST, [c_char_p, P(c_int)]),
    "mi_pattern_field": (c_char_p, [c_int, c_int32]),
    "mi_head_pattern_from_sizes": (ST, [c_int, c_int32, c_int32, P(mi_head_pattern)]),
    "mi_head_pattern_sizes": (ST, [P(mi_head_pattern), P(c_int32), P(c_int32)]),
    "mi_head_pattern_parse": (ST, [c_char_p, P(mi_head_pattern)]),
    "mi_head_pattern_default": (mi_head_pattern, [c_int]),
    "mi_vs_default_params": (mi_vs_params, []),
    "mi_prefill_default_params": (mi_prefill_params, []),
    "mi_vs_index_bytes": (c_size_t, [c_int32, c_int32, c_int32, c_int32]),
    "mi_sparse_index_bytes": (c_size_t, [c_int32, c_int32, c_int32, c_int32, c_int32]),
    "mi_vs_index_init": (
        ST,
        [P(mi_vs_index), c_int32, c_int32, c_int32, c_int32, c_void_p, c_size_t],
    ),
    "mi_sparse_index_init": (
        ST,
        [P(mi_sparse_index), c_int32, c_int32, c_int32, c_int32, c_int32, c_void_p, c_size_t],
    ),
    "mi_attention_dense": (ST, [CTX, T, T, T, I32P, c_float, T, c_void_p]),
    "mi_attention_a_shape": (
        ST,
        [CTX, T, T, T, I32P, c_int32, c_int32, c_int32, c_float, T, c_void_p],
    ),
    "mi_vs_estimate": (
        ST,
        [CTX, T, T, I32P, I32P, I32P, P(mi_vs_params), c_float, P(mi_vs_index)],
    ),
    "mi_vs_build_index": (ST, [CTX, c_int64, I32P, P(mi_vs_index), P(mi_sparse_index)]),
    "mi_block_sparse_estimate": (ST, [CTX, T, T, I32P, I32P, P(mi_sparse_index)]),
    "mi_attention_sparse": (
        ST,
        [CTX, T, T, T, I32P, P(mi_sparse_index), c_float, T, c_void_p],
    ),
    "mi_prefill_workspace_size": (
        ST,
        [CTX, T, T, P(mi_head_pattern), P(mi_prefill_params), P(c_size_t)],
    ),
    "mi_prefill_attention": (
        ST,
        [CTX, T, T, T, I32P, P(mi_head_pattern), P(mi_prefill_params), T, c_void_p, c_void_p,
         c_size_t],
    ),
    "mi_config_load": (ST, [CTX, c_char_p, P(c_void_p)]),
    "mi_config_parse": (ST, [CTX, c_char_p, c_size_t, P(c_void_p)]),
    "mi_config_create": (ST, [CTX, c_int32, c_int32, P(mi_head_pattern), P(c_void_p)]),
    "mi_config_destroy": (None, [CFG]),
    "mi_config_n_layers": (c_int32, [CFG]),
    "mi_config_n_heads": (c_int32, [CFG]),
    "mi_config_check": (ST, [CTX, CFG, c_int32, c_int32]),
    "mi_config_layer": (ST, [CTX, CFG, c_int32, c_int32, P(mi_head_pattern), c_void_p]),
    "mi_config_set_head": (ST, [CTX, CFG, c_int32, c_int32, P(mi_head_pattern), c_double]),
    "mi_config_to_json": (ST, [CTX, CFG, P(c_void_p)]),
    "mi_config_save": (ST, [CTX, CFG, c_char_p]),
    "mi_free": (None, [c_void_p]),
    "mi_config_model_count": (c_int32, []),
    "mi_config_model_name": (c_char_p, [c_int32]),
    "mi_config_model_file": (c_char_p, [c_char_p]),
    "mi_config_model_path": (c_void_p, [c_char_p]),
    "mi_synth_default_params": (mi_synth_params, []),
    "mi_synth_generate": (ST, [CTX, P(mi_synth_params), T, T, T, P(mi_synth_truth)]),
    "mi_metrics_evaluate": (
        ST,
        [CTX, T, T, I32P, P(mi_head_pattern), P(mi_prefill_params), P(mi_head_metrics)],
    ),
    "mi_metrics_rel_l2": (ST, [CTX, T, T, I32P, P(c_double)]),
    "mi_search_default_params": (mi_search_params, []),
    "mi_search_default_candidates": (ST, [c_int64, P(mi_head_pattern), c_int32, P(c_int32)]),
    "mi_search_scale_pattern": (ST, [P(mi_head_pattern), c_double, P(mi_head_pattern)]),
    "mi_search_layer": (
        ST,
        [CTX, T, T, T, I32P, P(mi_search_params), P(mi_head_pattern), c_void_p,
         P(mi_head_metrics)],
    ),
    "mi_eval_needle_match": (ST, [c_char_p, c_char_p, P(c_int)]),
    "mi_eval_passkey_match": (ST, [c_char_p, c_char_p, P(c_int)]),
    "mi_eval_string_match_all": (ST, [c_char_p, P(c_char_p), c_int32, P(c_double)]),
    "mi_eval_string_match_part": (ST, [c_char_p, P(c_char_p), c_int32, P(c_double)]),
    "mi_eval_kv_match": (ST, [c_char_p, c_char_p, P(c_char_p), c_int32, P(c_int)]),
    "mi_eval_log_prob": (ST, [c_void_p, c_int32, c_int32, P(c_double)]),
    "mi_eval_perplexity": (ST, [c_void_p, c_int64, P(c_double)]),
    "mi_eval_haystack": (ST, [c_char_p, c_size_t, c_size_t, P(c_void_p), P(c_size_t)]),
    "mi_eval_needle_offset": (ST, [c_char_p, c_size_t, c_double, P(c_size_t)]),
    "mi_eval_insert_needle": (
        ST,
        [c_char_p, c_size_t, c_char_p, c_double, P(c_void_p), P(c_size_t)],
    ),
    # minference_cuda.h
    "mi_context_set_stream": (ST, [CTX, c_void_p]),
    "mi_context_stream": (c_void_p, [CTX]),
    "mi_context_synchronize": (ST, [CTX]),
}


# ---- include/minference_model.h (libminference_model) --------------------------------------

MI_ATTN_DENSE = 0
MI_ATTN_MINFERENCE = 1
MI_ATTN_A_SHAPE = 2
MI_ATTN_TRI_SHAPE = 3
MI_ATTN_BLOCK_SPARSE = 4

MI_CHAT_AUTO = 0
MI_CHAT_CHATML = 1
MI_CHAT_LLAMA3 = 2


class mi_rope_scaling(ctypes.Structure):
    _fields_ = [
        ("type", c_int),
        ("factor", c_double),
        ("original_context", c_int64),
        ("low_freq_factor", c_double),
        ("high_freq_factor", c_double),
        ("beta_fast", c_double),
        ("beta_slow", c_double),
        ("attention_factor", c_double),
    ]


class mi_model_params(ctypes.Structure):
    _fields_ = [
        ("device", c_int),
        ("n_threads", c_int),
        ("max_context", c_int64),
        ("mlp_chunk", c_int64),
        ("device_id", c_int),
        ("check_weights", c_int),
        ("kv_offload", c_int),
        ("kv_pinned", c_int),
    ]


class mi_model_shape(ctypes.Structure):
    _fields_ = [
        ("n_layers", c_int32),
        ("hidden", c_int32),
        ("n_heads", c_int32),
        ("n_kv_heads", c_int32),
        ("head_dim", c_int32),
        ("ffn", c_int32),
        ("vocab", c_int32),
        ("rope_theta", c_double),
        ("context_length", c_int64),
        ("sliding_window", c_int64),
        ("qkv_bias", c_int32),
    ]


class mi_model_info(ctypes.Structure):
    _fields_ = [
        ("arch", ctypes.c_char * 32),
        ("source", ctypes.c_char * 16),
        ("n_layers", c_int32),
        ("n_heads", c_int32),
        ("n_kv_heads", c_int32),
        ("head_dim", c_int32),
        ("hidden", c_int32),
        ("ffn", c_int32),
        ("vocab", c_int32),
        ("context_length", c_int64),
        ("rope_theta", c_double),
        ("rms_eps", c_double),
        ("rope_scaling", mi_rope_scaling),
        ("tied_embeddings", c_int32),
        ("bos", c_int32),
        ("eos", c_int32),
        ("eot", c_int32),
        ("weight_bytes", c_uint64),
        ("sliding_window", c_int64),
    ]


class mi_model_timing(ctypes.Structure):
    _fields_ = [
        ("n_tokens", c_int64),
        ("total_s", c_double),
        ("attention_s", c_double),
        ("gemm_s", c_double),
        ("device_bytes", c_uint64),
        ("device_peak_bytes", c_uint64),
    ]


# void (*)(void *user, int32_t layer, int32_t n_layers, int64_t n_tokens)
MODEL_PROGRESS_FN = ctypes.CFUNCTYPE(None, c_void_p, c_int32, c_int32, c_int64)
# mi_status (*)(void *user, int32_t layer, const mi_tensor *q, const mi_tensor *k,
#              const mi_tensor *v)
MODEL_LAYER_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_int32, P(mi_tensor), P(mi_tensor),
                                  P(mi_tensor))


class mi_model_capture(ctypes.Structure):
    _fields_ = [("on_layer", MODEL_LAYER_FN), ("user", c_void_p), ("token_log_probs", c_void_p)]


MODEL = c_void_p  # mi_model *

MODEL_PROTOTYPES = {
    "mi_model_default_path": (c_void_p, []),
    "mi_sampler_create": (ST, [c_double, c_int32, c_double, c_uint64, c_int32, P(c_void_p)]),
    "mi_sampler_destroy": (None, [c_void_p]),
    "mi_sampler_sample": (c_int32, [c_void_p, P(c_float), c_int32]),
    "mi_attn_mode_name": (c_char_p, [c_int]),
    "mi_attn_mode_from_name": (ST, [c_char_p, P(c_int)]),
    "mi_model_default_params": (mi_model_params, []),
    "mi_model_load": (ST, [CTX, c_char_p, P(mi_model_params), P(c_void_p)]),
    "mi_model_shape_llama3_8b": (mi_model_shape, []),
    "mi_model_create_random": (
        ST,
        [CTX, P(mi_model_shape), c_uint64, P(mi_model_params), P(c_void_p)],
    ),
    "mi_model_destroy": (None, [MODEL]),
    "mi_model_last_error": (c_char_p, [MODEL]),
    "mi_model_get_info": (ST, [MODEL, P(mi_model_info)]),
    "mi_model_set_attention": (ST, [MODEL, c_int, CFG, c_int32]),
    "mi_model_set_attention_name": (ST, [MODEL, c_char_p, CFG, c_int32]),
    "mi_model_set_progress": (ST, [MODEL, MODEL_PROGRESS_FN, c_void_p]),
    "mi_model_tokenize": (
        ST,
        [MODEL, c_char_p, c_size_t, c_int, c_int, c_void_p, c_size_t, P(c_size_t)],
    ),
    "mi_model_token_to_piece": (ST, [MODEL, c_int32, c_char_p, c_size_t, P(c_size_t)]),
    "mi_model_token_is_eog": (c_int, [MODEL, c_int32]),
    "mi_model_token_is_control": (c_int, [MODEL, c_int32]),
    "mi_model_chat_prompt": (ST, [MODEL, c_int, c_char_p, c_char_p, P(c_void_p)]),
    "mi_model_prefill": (ST, [MODEL, c_void_p, c_size_t, c_void_p]),
    "mi_model_decode": (ST, [MODEL, c_void_p, c_size_t, c_void_p]),
    "mi_model_n_past": (c_int64, [MODEL]),
    "mi_model_last_timing": (ST, [MODEL, P(mi_model_timing)]),
    "mi_model_prefill_capture": (ST, [MODEL, c_void_p, c_size_t, P(mi_model_capture)]),
}


# ---- include/minference_session.h (libminference_model) ------------------------------------


class mi_session_params(ctypes.Structure):
    _fields_ = [("max_tokens", c_int64), ("pool_bytes", c_uint64), ("kv", c_char_p),
                ("kv_dtype", c_int32)]


class mi_session_stats(ctypes.Structure):
    _fields_ = [
        ("n_tokens", c_int64),
        ("max_tokens", c_int64),
        ("bytes", c_uint64),
        ("shared_bytes", c_uint64),
        ("pool_used_bytes", c_uint64),
        ("pool_allocated_bytes", c_uint64),
        ("pool_capacity_bytes", c_uint64),
        ("pool_sessions", c_int32),
        ("page_tokens", c_int32),
        ("kv_rows", c_int64),
        ("kv_device_calls", c_int64),
    ]


SESSION = c_void_p  # mi_session *

MODEL_PROTOTYPES.update({
    "mi_session_default_params": (mi_session_params, []),
    "mi_session_kv_check": (ST, [c_char_p, c_char_p, c_size_t]),
    "mi_session_kv_method_count": (c_int32, []),
    "mi_session_kv_method_name": (c_char_p, [c_int32]),
    "mi_session_create": (ST, [MODEL, P(mi_session_params), P(c_void_p)]),
    "mi_session_destroy": (None, [SESSION]),
    "mi_session_last_error": (c_char_p, [SESSION]),
    "mi_session_prefill": (ST, [SESSION, c_void_p, c_size_t, c_void_p]),
    "mi_session_decode": (ST, [SESSION, c_void_p, c_size_t, c_void_p]),
    "mi_session_n_past": (c_int64, [SESSION]),
    "mi_session_rewind": (ST, [SESSION, c_int64]),
    "mi_session_fork": (ST, [SESSION, P(c_void_p)]),
    "mi_session_save": (ST, [SESSION, c_char_p]),
    "mi_session_load": (ST, [SESSION, c_char_p]),
    "mi_session_stats_get": (ST, [SESSION, P(mi_session_stats)]),
})


class mi_blend_chunk(ctypes.Structure):
    _fields_ = [("tokens", c_void_p), ("n_tokens", c_size_t), ("cache", c_void_p),
                ("cache_row", c_int64)]


class mi_blend_params(ctypes.Structure):
    _fields_ = [("recompute_ratio", c_float), ("check_layer", c_int32)]


class mi_blend_stats(ctypes.Structure):
    _fields_ = [("n_tokens", c_int64), ("n_chunk_tokens", c_int64), ("n_recomputed", c_int64),
                ("seconds", c_double)]


MODEL_PROTOTYPES.update({
    "mi_blend_default_params": (mi_blend_params, []),
    "mi_session_prefill_blend": (ST, [SESSION, P(mi_blend_chunk), c_size_t, c_void_p, c_size_t,
                                      P(mi_blend_params), c_void_p, P(mi_blend_stats)]),
})

# A KV method's rows for a cache kept outside a session (the transformers patch's cache).
MODEL_PROTOTYPES.update({
    "mi_session_kv_keep_rows": (ST, [c_char_p, c_int32, c_int32, P(mi_tensor), P(mi_tensor),
                                     c_void_p, P(c_int64), c_char_p, c_size_t]),
})

# A KV method's cache outside a model (the transformers patch: Quest, RetrievalAttention, KIVI,
# LeanK).
class mi_kv_cache_params(ctypes.Structure):
    _fields_ = [("kv", c_char_p), ("n_layers", c_int32), ("n_heads", c_int32),
                ("n_kv_heads", c_int32), ("head_dim", c_int32), ("n_threads", c_int32),
                ("pool_bytes", c_uint64)]


KV_CACHE = c_void_p  # mi_kv_cache *

MODEL_PROTOTYPES.update({
    "mi_kv_cache_default_params": (mi_kv_cache_params, []),
    "mi_kv_cache_create": (ST, [P(mi_kv_cache_params), P(c_void_p), c_char_p, c_size_t]),
    "mi_kv_cache_destroy": (None, [KV_CACHE]),
    "mi_kv_cache_last_error": (c_char_p, [KV_CACHE]),
    "mi_kv_cache_rows": (c_int64, [KV_CACHE, c_int32]),
    "mi_kv_cache_tokens": (c_int64, [KV_CACHE, c_int32]),
    "mi_kv_cache_bytes": (c_uint64, [KV_CACHE]),
    "mi_kv_cache_call": (ST, [KV_CACHE, c_int32, P(mi_tensor), P(mi_tensor), P(mi_tensor),
                              c_float, P(mi_tensor)]),
})

# Batches of sessions in one forward pass.
MODEL_PROTOTYPES.update({
    "mi_session_prefill_batch": (ST, [P(c_void_p), P(c_void_p), P(c_size_t), c_size_t, c_void_p]),
    "mi_session_decode_batch": (ST, [P(c_void_p), c_void_p, c_size_t, c_void_p]),
})

class LibraryNotFound(ImportError):
    pass


class ModelLibraryNotFound(LibraryNotFound):
    """libminference_model (the model runner) cannot be loaded; the kernels still work."""


_LIB_NAMES = ["libminference.so", "libminference.dylib"]
_MODEL_LIB_NAMES = ["libminference_model.so", "libminference_model.dylib"]


def _search_paths(names, first=()):
    """first, then the package's lib/, then the build folders of the repository it sits in."""
    here = Path(__file__).resolve().parent
    out = list(first) + [here / "lib" / n for n in names]
    repo = here.parent.parent  # python/minference -> repository root
    if (repo / "include" / "minference.h").is_file():
        for d in [repo / "build", repo / "python" / "build" / "cmake"] + sorted(repo.glob("build*")):
            out += [d / n for n in names]
    return out


def _candidates():
    env = os.environ.get("MINFERENCE_LIBRARY")
    if env:
        return [Path(env)], True
    first = []
    marker = Path(__file__).resolve().parent / "lib" / "external_library.txt"
    if marker.is_file():
        first.append(Path(marker.read_text().strip()))
    return _search_paths(_LIB_NAMES, first), False


def _model_candidates():
    """libminference_model: MINFERENCE_MODEL_LIBRARY, else beside the loaded libminference, then
    the places libminference itself is looked for."""
    env = os.environ.get("MINFERENCE_MODEL_LIBRARY")
    if env:
        return [Path(env)], True
    first = []
    core = Path(load()._name)
    if core.parent != Path("."):
        for d in dict.fromkeys([core.parent, core.resolve().parent]):
            first += [d / n for n in _MODEL_LIB_NAMES]
    return _search_paths(_MODEL_LIB_NAMES, first), False


def _open(paths, from_env, system_names, errors):
    """The first of paths (then, unless from_env, of system_names) that loads, or None."""
    for p in paths:
        if p.is_file():
            try:
                return ctypes.CDLL(str(p))
            except OSError as e:
                errors.append(f"{p}: {e}")
    if from_env:
        return None
    for name in system_names:
        if not name:
            continue
        try:
            return ctypes.CDLL(name)
        except OSError as e:
            errors.append(f"{name}: {e}")
    return None


def _declare(lib, prototypes, missing):
    for name, (restype, argtypes) in prototypes.items():
        try:
            f = getattr(lib, name)
        except AttributeError:
            missing.add(name)
            setattr(lib, name, _missing_symbol(lib, name))
            continue
        f.restype = restype
        f.argtypes = argtypes


_LIB = None
_MODEL_LIB = None
_MISSING = set()


def _missing_symbol(lib, name):
    def fn(*_a, **_k):
        raise NotImplementedError(
            f"the loaded library ({lib._name}) has no symbol {name}: it is older than this "
            "package's header; rebuild the library (pip install ./python)"
        )

    return fn


def load():
    """Loads libminference once and declares every prototype; returns the CDLL."""
    global _LIB
    if _LIB is not None:
        return _LIB
    paths, from_env = _candidates()
    errors = []
    lib = _open(paths, from_env,
                ("libminference.so.0", "libminference.so", ctypes.util.find_library("minference")),
                errors)
    if lib is None:
        where = "MINFERENCE_LIBRARY=" + os.environ["MINFERENCE_LIBRARY"] if from_env else (
            "the package, the repository build folders and the system library path")
        detail = ("; ".join(errors)) if errors else "no file found"
        raise LibraryNotFound(
            f"minference: cannot load libminference from {where} ({detail}). Install the package "
            "with `pip install ./python` from the repository (it builds the library with CMake), or "
            "set MINFERENCE_LIBRARY to the path of libminference.so."
        )
    _declare(lib, PROTOTYPES, _MISSING)
    _LIB = lib
    return lib


def load_model():
    """Loads libminference_model (the model runner) once, after libminference, whose copy it then
    shares; returns the CDLL. Raises ModelLibraryNotFound when it is absent."""
    global _MODEL_LIB
    if _MODEL_LIB is not None:
        return _MODEL_LIB
    paths, from_env = _model_candidates()
    errors = []
    lib = _open(paths, from_env, ("libminference_model.so.0", "libminference_model.so",
                                  ctypes.util.find_library("minference_model")), errors)
    if lib is None:
        where = ("MINFERENCE_MODEL_LIBRARY=" + os.environ["MINFERENCE_MODEL_LIBRARY"] if from_env
                 else f"beside {load()._name}, the package, the repository build folders and the "
                 "system library path")
        detail = ("; ".join(errors)) if errors else "no file found"
        raise ModelLibraryNotFound(
            f"minference: cannot load libminference_model, the model runner, from {where} "
            f"({detail}). Build it with the library (the CMake target minference_model_shared; "
            "`pip install ./python` ships it), or set MINFERENCE_MODEL_LIBRARY to the path of "
            "libminference_model.so."
        )
    _declare(lib, MODEL_PROTOTYPES, _MISSING)
    _MODEL_LIB = lib
    return lib


def model_library_path():
    """The file the model runner library came from."""
    return load_model()._name


def library_path():
    """The file the loaded library came from."""
    return load()._name


def has_symbol(name):
    load()
    return name not in _MISSING


def _decode(b):
    return b.decode("utf-8", "replace") if b is not None else ""


if sys.byteorder != "little":  # pragma: no cover
    raise ImportError("minference supports little-endian hosts only")
