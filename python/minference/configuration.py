"""MInferenceConfig: the original's attention / KV-cache type lists, model names and config
resolution, and what this package implements of them."""

import ctypes
import os
import warnings

__all__ = ["MInferenceConfig", "MODEL2PATH", "get_support_models", "shipped_config_path"]

# The original's MODEL2PATH: Hugging Face model ids and their pattern config files. The files are
# shipped with the library (data/configs in the repository, installed under
# <datadir>/minference/configs, with the original's MIT notice); the library's own map
# (mi_config_model_name / mi_config_model_file) is the same, and a test keeps the two equal.
MODEL2PATH = {
    "gradientai/Llama-3-8B-Instruct-262k": "Llama_3_8B_Instruct_262k_kv_out_v32_fit_o_best_pattern.json",
    "gradientai/Llama-3-8B-Instruct-Gradient-1048k": "Llama_3_8B_Instruct_262k_kv_out_v32_fit_o_best_pattern.json",
    "gradientai/Llama-3-8B-Instruct-Gradient-4194k": "Llama_3_8B_Instruct_262k_kv_out_v32_fit_o_best_pattern.json",
    "01-ai/Yi-9B-200K": "Yi_9B_200k_kv_out_v32_fit_o_best_pattern.json",
    "microsoft/Phi-3-mini-128k-instruct": "Phi_3_mini_128k_instruct_kv_out_v32_fit_o_best_pattern.json",
    "Qwen/Qwen2-7B-Instruct": "Qwen2_7B_Instruct_128k_instruct_kv_out_v32_fit_o_best_pattern.json",
    "Qwen/Qwen2.5-7B-Instruct": "Qwen2.5_7B_Instruct_128k_instruct_kv_out_v32_fit_o_best_pattern.json",
    "Qwen/Qwen2.5-32B-Instruct": "Qwen2.5_32B_Instruct_128k_kv_out_v32_fit_o_best_pattern.json",
    "Qwen/Qwen2.5-72B-Instruct": "Qwen2.5_72B_Instruct_128k_kv_out_v32_fit_o_best_pattern.json",
    "Qwen/Qwen2.5-7B-Instruct-1M": "Qwen2.5_7B_Instruct_1M.json",
    "Qwen/Qwen2.5-14B-Instruct-1M": "Qwen2.5_14B_Instruct_1M.json",
    "THUDM/glm-4-9b-chat-1m": "GLM_4_9B_1M_instruct_kv_out_v32_fit_o_best_pattern.json",
    "meta-llama/Meta-Llama-3.1-8B-Instruct": "Llama_3.1_8B_Instruct_128k_kv_out_v32_fit_o_best_pattern_v2.json",
    "meta-llama/Meta-Llama-3.1-70B-Instruct": "Llama_3.1_70B_Instruct_128k_kv_out_v32_fit_o_best_pattern_v2.json",
    "meta-llama/Llama-3.1-8B-Instruct": "Llama_3.1_8B_Instruct_128k_kv_out_v32_fit_o_best_pattern_v2.json",
    "meta-llama/Llama-3.1-70B-Instruct": "Llama_3.1_70B_Instruct_128k_kv_out_v32_fit_o_best_pattern_v2.json",
    "gradientai/Llama-3-70B-Instruct-Gradient-262k": "Llama_3_70B_Instruct_262k_kv_out_v32_fit_o_best_pattern.json",
    "gradientai/Llama-3-70B-Instruct-Gradient-1048k": "Llama_3_70B_Instruct_262k_kv_out_v32_fit_o_best_pattern.json",
}

NO_SHIPPED_CONFIG = (
    "no shipped config is found for it: pass config_path= (a config JSON, e.g. one written by "
    "`minference search`), or set MINFERENCE_CONFIG_DIR to a folder holding the original files")


def get_support_models():
    """The model ids a pattern config is shipped for (the original's MODEL2PATH keys)."""
    return list(MODEL2PATH.keys())


def shipped_config_path(model_name):
    """The shipped config file of model_name (an id of get_support_models(), or a path or name
    that holds one's name), or None: MINFERENCE_CONFIG_DIR first, then where libminference finds
    its data/configs (installed, or the source tree it was built from), then this repository's
    data/configs."""
    if not model_name:
        return None
    from . import _lib as L

    name = os.fspath(model_name)
    file = MODEL2PATH.get(name)
    lib = None
    try:
        lib = L.load()
    except Exception:  # the lookup still works from MODEL2PATH and the folders below
        lib = None
    if file is None and lib is not None:
        f = lib.mi_config_model_file(os.fsencode(name))
        file = f.decode() if f else None
    if file is None:
        return None
    folder = os.environ.get("MINFERENCE_CONFIG_DIR")
    if folder and os.path.isfile(os.path.join(folder, file)):
        return os.path.join(folder, file)
    if lib is not None:
        p = lib.mi_config_model_path(os.fsencode(name))
        if p:
            try:
                return os.fsdecode(ctypes.string_at(p))
            finally:
                lib.mi_free(p)
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", "configs")
    path = os.path.normpath(os.path.join(here, file))
    return path if os.path.isfile(path) else None


class MInferenceConfig:
    # The original's lists (get_available_*), then the subsets this package implements.
    MINFERENCE_ATTENTION_TYPES = ["minference", "vllm_minference", "tri_mix_minference"]
    OTHER_ATTENTION_TYPES = [
        "hf", "vllm", "dense", "static", "dilated1", "dilated2", "a_shape", "tri_shape",
        "vllm_a_shape", "vllm_tri_shape", "inf_llm", "flexprefill", "vllm_flexprefill",
        "xattention", "tri_mix",
    ]
    KV_TYPES = ["dense", "streamingllm", "snapkv", "pyramidkv", "quest", "retr_attn", "kivi",
                "leank"]
    ATTENTION_ALIASES = {"minference_with_dense": "dense"}

    SUPPORTED_ATTENTION_TYPES = ["minference", "tri_mix_minference", "hf", "dense", "a_shape",
                                 "tri_shape", "tri_mix", "xattention", "flexprefill", "dilated1",
                                 "dilated2", "static", "inf_llm"]
    # The types that run one library pattern on every head (head_pattern()).
    PATTERN_ATTENTION_TYPES = ["xattention", "flexprefill", "dilated1", "dilated2", "inf_llm"]
    # KV types the C model runner's sessions run (Model.session(kv=...)); the transformers patch
    # runs HF_KV_TYPES: the methods that only drop rows on transformers' own cache, the others on
    # a cache libminference keeps (patch.py, HF_NATIVE_KV_METHODS).
    SUPPORTED_KV_TYPES = ["dense", "streamingllm", "snapkv", "pyramidkv", "quest", "retr_attn",
                          "kivi", "leank"]
    HF_KV_TYPES = ["dense", "streamingllm", "snapkv", "pyramidkv", "quest", "retr_attn", "kivi",
                   "leank"]
    # The attn_kwargs keys each KV type reads (the original's names), passed to the C runner's
    # spec "kv_type:key=value,..."; the library checks the values and fills the defaults.
    KV_KEYS = {
        "dense": [],
        "streamingllm": ["n_init", "n_local"],
        "snapkv": ["window_size", "max_capacity_prompt", "kernel_size", "pooling"],
        "pyramidkv": ["window_size", "max_capacity_prompt", "kernel_size", "pooling", "beta"],
        "quest": ["token_budget", "chunk_size", "dense_layers"],
        "retr_attn": ["top_k", "from_layer", "n_init", "n_local", "list_size", "recall", "samples"],
        "kivi": ["bits", "group_size", "residual_length"],
        "leank": ["leank_path", "sink_size", "recent_size", "accumu_size", "round_to"],
    }

    # Per-type defaults (the original's), set onto attn_kwargs unless the caller gave them.
    ATTENTION_DEFAULTS = {
        "a_shape": {"n_init": 128, "n_local": 3968},
        "tri_shape": {"n_init": 128, "n_local": 3968, "n_last": 100},
        "tri_mix": {"n_init": 8, "n_local": 512, "n_last": 128, "starting_layer": 16},
        "tri_mix_minference": {"n_init": 8, "n_local": 512, "n_last": 128, "starting_layer": 16},
        # the original's xattention_forward / flexprefill_forward defaults
        "xattention": {"stride": 8, "threshold": 0.9, "norm": 1},
        "flexprefill": {"gamma": 0.9, "tau": 0.1},
        # the original's dilated1 / dilated2 layouts
        "dilated1": {"n_init": 1024, "n_local": 8192, "stride": 2, "dense_local": 0},
        "dilated2": {"n_init": 1024, "n_local": 6144, "stride": 2, "dense_local": 2048},
        # the original's MInference("inf_llm") settings (models_patch.py)
        "inf_llm": {"block_size": 128, "n_init": 128, "n_local": 4096, "topk": 16, "repr_topk": 4,
                    "max_cached_block": 32, "exc_block_size": 512, "dense_decoding": True},
    }

    def __init__(self, attn_type="minference", model_name=None, config_path=None,
                 starting_layer=-1, kv_cache_cpu=False, kv_cache_cpu_device="cpu",
                 kv_type="dense", is_search=False, attn_kwargs=None, **kwargs):
        attn_type = self.ATTENTION_ALIASES.get(attn_type, attn_type)
        if attn_type not in self.get_available_attn_types():
            raise ValueError(f"unknown attn_type {attn_type!r}; the available types are "
                             f"{self.get_available_attn_types()}")
        if attn_type not in self.SUPPORTED_ATTENTION_TYPES:
            raise NotImplementedError(
                f"attn_type {attn_type!r} is not implemented by this minference yet; implemented: "
                f"{self.SUPPORTED_ATTENTION_TYPES}")
        kv_type = kv_type or "dense"
        if kv_type not in self.KV_TYPES:
            raise ValueError(f"unknown kv_type {kv_type!r}; the available types are {self.KV_TYPES}")
        if kv_type not in self.SUPPORTED_KV_TYPES:
            raise NotImplementedError(
                f"kv_type {kv_type!r} is not implemented by this minference yet; implemented (in "
                f"the C model runner's sessions): {self.SUPPORTED_KV_TYPES}")
        if kv_cache_cpu:
            raise NotImplementedError("kv_cache_cpu is not implemented by this minference yet")
        if is_search and attn_type not in self.MINFERENCE_ATTENTION_TYPES:
            raise ValueError(f"is_search applies to {self.MINFERENCE_ATTENTION_TYPES}, not {attn_type!r}")
        if is_search and not config_path:
            raise ValueError("is_search=True needs config_path=, the JSON file the search writes")
        self.attn_type = attn_type
        self.kv_type = kv_type
        self.model_name = model_name
        self.starting_layer = int(starting_layer)
        self.kv_cache_cpu = kv_cache_cpu
        self.kv_cache_cpu_device = kv_cache_cpu_device
        self.is_search = is_search
        self.kwargs = kwargs
        kw = dict(attn_kwargs or {})
        if "last_n" in kw and "n_last" not in kw:  # the key TriangleMix's scripts pass
            kw["n_last"] = kw.pop("last_n")
        if self.starting_layer >= 0:
            kw.setdefault("starting_layer", self.starting_layer)
        for key, val in self.ATTENTION_DEFAULTS.get(attn_type, {}).items():
            kw.setdefault(key, val)
        kw.setdefault("starting_layer", -1)
        self.starting_layer = int(kw["starting_layer"])
        self.attn_kwargs = kw
        self.config_path = self.update_config_path(config_path, model_name)

    def kv_spec(self):
        """The C runner's KV method spec ("snapkv:window_size=32,..."): kv_type with the
        attn_kwargs it reads (KV_KEYS); None for dense."""
        if self.kv_type == "dense":
            return None
        parts = []
        for key in self.KV_KEYS.get(self.kv_type, []):
            if key in self.attn_kwargs and self.attn_kwargs[key] is not None:
                val = self.attn_kwargs[key]
                if isinstance(val, bool) or not isinstance(val, (int, float, str)):
                    raise ValueError(f"attn_kwargs[{key!r}] = {val!r} is not a number or a name")
                if isinstance(val, str) and ("," in val or ":" in val and key != "leank_path"):
                    raise ValueError(f"attn_kwargs[{key!r}] = {val!r} may not hold ',' or ':'")
                parts.append(f"{key}={val}")
        return self.kv_type + (":" + ",".join(parts) if parts else "")

    @classmethod
    def get_available_attn_types(cls):
        return cls.MINFERENCE_ATTENTION_TYPES + cls.OTHER_ATTENTION_TYPES

    @classmethod
    def get_available_kv_types(cls):
        return list(cls.KV_TYPES)

    @classmethod
    def get_supported_attn_types(cls):
        """The attention types this package implements."""
        return list(cls.SUPPORTED_ATTENTION_TYPES)

    @classmethod
    def get_supported_kv_types(cls):
        return list(cls.SUPPORTED_KV_TYPES)

    @property
    def uses_config(self):
        # "static" reads the config's sizes too (its sets are estimated once, then reused)
        return self.attn_type in self.MINFERENCE_ATTENTION_TYPES or self.attn_type == "static"

    def update_config_path(self, config_path, model_name):
        """The config file for the MInference types: config_path when given, else the shipped
        file for model_name (shipped_config_path), else None (default budgets)."""
        if not self.uses_config:
            return None
        if self.is_search:
            return os.fspath(config_path)  # the output; layers already in it are kept
        if config_path is not None:
            if not os.path.isfile(config_path):
                raise FileNotFoundError(f"pattern config {config_path!r} does not exist")
            return os.fspath(config_path)
        path = shipped_config_path(model_name)
        if path is None and model_name in MODEL2PATH:
            warnings.warn(f"the shipped config {MODEL2PATH[model_name]} of {model_name} is not found "
                          "(MINFERENCE_CONFIG_DIR, the library's data/configs)", stacklevel=3)
        return path

    def head_pattern(self):
        """The pattern every head runs for the PATTERN_ATTENTION_TYPES (a core.HeadPattern).
        Options of the original these kernels do not have (XAttention's norm other than 1 and
        block_size other than 64, FlexPrefill's budgets and block_size) raise ValueError."""
        from .core import HeadPattern

        kw, t = self.attn_kwargs, self.attn_type
        if t == "xattention":
            if float(kw.get("norm", 1)) != 1.0 or int(kw.get("block_size", 64)) != 64:
                raise ValueError("xattention runs with norm 1 and 64-token blocks here")
            return HeadPattern.xattention(int(kw["stride"]), float(kw["threshold"]))
        if t == "flexprefill":
            for key in ("min_budget", "max_budget"):
                if kw.get(key) is not None:
                    raise ValueError(f"flexprefill's {key} is not supported here")
            if int(kw.get("block_size", 64)) != 64:
                raise ValueError("flexprefill runs with 64-token blocks here")
            return HeadPattern.flexprefill(float(kw["gamma"]), float(kw["tau"]))
        if t in ("dilated1", "dilated2"):
            return HeadPattern.dilated(int(kw["n_init"]), int(kw["n_local"]), int(kw["stride"]),
                                       int(kw["dense_local"]))
        if t == "inf_llm":
            # decoding runs dense (the original's dense_decoding); the GPU block cache
            # (max_cached_block, cache_strategy, faiss, pin_memory) changes no result
            if not kw.get("dense_decoding", True):
                raise ValueError("inf_llm decodes densely here (dense_decoding=False is not done)")
            for key in ("chunk_topk_calc", "score_decay"):
                if kw.get(key) is not None:
                    raise ValueError(f"inf_llm's {key} is not supported here")
            return HeadPattern.inf_llm(int(kw["topk"]), int(kw["n_local"]), int(kw["n_init"]),
                                       int(kw["block_size"]), int(kw["repr_topk"]),
                                       int(kw["exc_block_size"]), bool(kw.get("perhead", False)))
        raise ValueError(f"attn_type {t!r} is not one pattern on every head")

    def missing_config_message(self, what):
        return (f"MInference: no pattern config for {what}: every head uses the default budget "
                f"(vertical_and_slash, 1000 vertical / 6096 slash); {NO_SHIPPED_CONFIG}. "
                "Run `minference search` on the model to find per-head patterns.")

    def __repr__(self):
        return (f"MInferenceConfig(attn_type={self.attn_type!r}, model_name={self.model_name!r}, "
                f"config_path={self.config_path!r}, kv_type={self.kv_type!r}, "
                f"attn_kwargs={self.attn_kwargs!r})")
