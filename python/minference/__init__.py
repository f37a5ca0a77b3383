"""minference: dynamic sparse attention for long-context LLM prefill, on libminference.

    from minference import MInference
    model = MInference("minference", model_name)(model)      # a transformers causal LM

Kernels on [B, H, L, D] NumPy arrays or torch tensors (output of the same type):
dense_attention, streaming_forward, vertical_slash_sparse_attention, block_sparse_attention,
prefill_attention (one pattern per head), and the lower-level estimate / index / sparse calls.
Errors of the C library raise MInferenceError (status name and the context's message).

Model runs a whole llama-family model (GGUF or Hugging Face directory) with sparse prefill:
    with Model() as m:
        print(m.generate("The capital of France is", max_new_tokens=8))
"""

from .configuration import MODEL2PATH, MInferenceConfig, get_support_models
from .core import (
    Config,
    Context,
    HeadPattern,
    MInferenceError,
    PrefillParams,
    SparseIndex,
    SynthParams,
    VSIndex,
    VSParams,
    bf16_to_f32,
    build_commit,
    build_features,
    cuda_device_count,
    dtype_name,
    dtype_size,
    f16_to_f32,
    f32_to_bf16,
    f32_to_f16,
    get_context,
    metrics_evaluate,
    metrics_rel_l2,
    pattern_aliases,
    pattern_fields,
    pattern_from_name,
    pattern_name,
    pattern_names,
    patterns_array,
    status_name,
    status_string,
    synth_generate,
    sparse_index_bytes,
    tensor_descriptor,
    vs_index_bytes,
    version,
    version_number,
)
from ._lib import library_path, model_library_path
from .ops import (
    a_shape_attention,
    block_sparse_attention,
    block_sparse_estimate,
    dense_attention,
    prefill_attention,
    prefill_workspace_size,
    sparse_attention,
    streaming_forward,
    tri_shape_attention,
    vertical_slash_sparse_attention,
    vs_build_index,
    vs_estimate,
)
from .model import Model, ModelInfo, Session, ModelLibraryNotFound, RopeScaling, default_model_path
from .patch import MInference, kv_cache, unpatch
from . import search
from .search import SearchParams, search_default_candidates, search_layer, search_scale_pattern

__version__ = "0.1.0"

__all__ = [
    "MInference", "MInferenceConfig", "MInferenceError", "get_support_models", "MODEL2PATH",
    "unpatch", "kv_cache",
    "dense_attention", "a_shape_attention", "streaming_forward", "tri_shape_attention",
    "vertical_slash_sparse_attention", "block_sparse_attention", "prefill_attention",
    "prefill_workspace_size", "vs_estimate", "vs_build_index", "block_sparse_estimate",
    "sparse_attention",
    "Config", "Context", "HeadPattern", "PrefillParams", "VSParams", "VSIndex", "SparseIndex",
    "SynthParams", "synth_generate", "metrics_evaluate", "metrics_rel_l2",
    "version", "version_number", "build_features", "build_commit", "cuda_device_count", "library_path",
    "status_name", "status_string", "pattern_name", "pattern_from_name", "patterns_array",
    "pattern_names", "pattern_aliases", "pattern_fields",
    "get_context", "f32_to_f16", "f16_to_f32", "f32_to_bf16", "bf16_to_f32", "dtype_name",
    "dtype_size", "vs_index_bytes", "sparse_index_bytes", "tensor_descriptor", "search", "SearchParams", "search_layer", "search_default_candidates",
    "search_scale_pattern",
    "Model", "ModelInfo", "Session", "RopeScaling", "ModelLibraryNotFound", "default_model_path",
    "model_library_path",
]
