"""Low-level binding of libminference: errors, contexts, tensor descriptors, patterns, indices,
configs, synthetic data and metrics.

Arrays are NumPy arrays (CPU) or PyTorch tensors (CPU or CUDA), [B, H, L, D], described to the
library without a copy: data pointer, dtype, device and strides in elements. An array whose last
dimension is not contiguous (or that has negative strides) is copied once into a contiguous one.
Outputs have the type, device and dtype of q. torch is imported only when a tensor is passed.
"""

import ctypes
import math
import threading
from dataclasses import dataclass, field, fields

import numpy as np

from . import _lib as L
from ._lib import _decode

__all__ = [
    "MInferenceError",
    "Context",
    "HeadPattern",
    "VSParams",
    "PrefillParams",
    "VSIndex",
    "SparseIndex",
    "Config",
    "SynthParams",
    "version",
    "version_number",
    "build_features",
    "cuda_device_count",
    "status_name",
    "status_string",
    "pattern_name",
    "pattern_from_name",
    "pattern_names",
    "pattern_aliases",
    "pattern_fields",
    "get_context",
]


# ---------------------------------------------------------------------------------------------
# Errors


class MInferenceError(RuntimeError):
    """A failed libminference call: `status` (int), `status_name` ("MI_STATUS_...") and `message`
    (the context's last-error text, or the status description when there is none)."""

    def __init__(self, status, message="", function=None):
        self.status = int(status)
        self.status_name = status_name(self.status)
        self.message = message or status_string(self.status)
        self.function = function
        where = f" in {function}" if function else ""
        super().__init__(f"{self.status_name}{where}: {self.message}")


def _lib():
    return L.load()


def status_name(status):
    return _decode(_lib().mi_status_name(int(status)))


def status_string(status):
    return _decode(_lib().mi_status_string(int(status)))


def version():
    """Runtime version of the loaded library, e.g. "0.1.0"."""
    return _decode(_lib().mi_version())


def version_number():
    return int(_lib().mi_version_number())


def build_features():
    """Build features of the loaded library, e.g. "cpu openmp openblas cuda(sm_90a)"."""
    return _decode(_lib().mi_build_features())


def build_commit():
    """The source commit the loaded library was built from (short hash, "-dirty" where tracked
    files differed from it, "unknown" outside a git checkout)."""
    return _decode(_lib().mi_build_commit())


def cuda_device_count():
    return int(_lib().mi_cuda_device_count())


def _check(status, ctx=None, function=None):
    if status != 0:
        msg = ""
        if ctx is not None:
            msg = _decode(_lib().mi_context_last_error(ctx))
        raise MInferenceError(status, msg, function)


# ---------------------------------------------------------------------------------------------
# Contexts


class _Closing:
    """An owner of a library handle: close() at the end of a `with` block and when collected."""

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Context(_Closing):
    """A libminference context: the device the kernels run on and, on the CPU, the thread count.

    A context is used by one thread at a time. The module-level functions use one context per
    thread and device (get_context); create your own to choose n_threads."""

    def __init__(self, device="cpu", device_id=0, n_threads=0):
        if device in ("cpu", L.MI_DEVICE_CPU):
            dev = L.MI_DEVICE_CPU
        elif device in ("cuda", L.MI_DEVICE_CUDA):
            dev = L.MI_DEVICE_CUDA
        else:
            raise ValueError(f"device must be 'cpu' or 'cuda', not {device!r}")
        lib = _lib()
        params = lib.mi_context_default_params()
        params.device = dev
        params.device_id = int(device_id)
        params.n_threads = int(n_threads)
        handle = ctypes.c_void_p()
        st = lib.mi_context_create(ctypes.byref(params), ctypes.byref(handle))
        if st != 0:
            hint = ""
            if st == L.MI_STATUS_NOT_BUILT:
                hint = (" (this libminference was built without CUDA: rebuild with nvcc on PATH, "
                        "e.g. MINFERENCE_CMAKE_ARGS=-DMI_CUDA=ON pip install ./python)")
            raise MInferenceError(st, status_string(st) + hint, "mi_context_create")
        self._h = handle.value
        self.device = "cpu" if dev == L.MI_DEVICE_CPU else "cuda"
        self.device_id = int(device_id)

    @property
    def handle(self):
        if self._h is None:
            raise ValueError("the context was closed")
        return self._h

    @property
    def n_threads(self):
        return int(_lib().mi_context_n_threads(self.handle))

    @property
    def last_error(self):
        return _decode(_lib().mi_context_last_error(self.handle))

    @property
    def tuning(self):
        """The kernel-path choices of this context, as "name=value,..." (fields that differ from
        "auto"; "" when none). See mi_tuning in minference.h for the names."""
        lib = _lib()
        n = lib.mi_context_format_tuning(self.handle, None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        lib.mi_context_format_tuning(self.handle, buf, n + 1)
        return _decode(buf.value)

    @tuning.setter
    def tuning(self, spec):
        """Replaces the tuning by spec ("name=value,..."; "" or None: every field auto). A bad
        name or value raises and leaves the tuning as it was."""
        spec = spec or ""
        if not isinstance(spec, str):
            raise TypeError(f"tuning must be a str like 'sm90_sparse=1', not {type(spec).__name__}")
        old = self.tuning
        reset = ",".join(f"{kv.split('=')[0]}=auto" for kv in old.split(",") if kv)
        lib = _lib()
        # validate first on a scratch context, so that a bad spec changes nothing
        probe = Context(self.device if self.device == "cpu" else "cpu")
        try:
            _check(lib.mi_context_parse_tuning(probe.handle, spec.encode()), probe.handle,
                   "mi_context_parse_tuning")
        finally:
            probe.close()
        _check(lib.mi_context_parse_tuning(self.handle, reset.encode()), self.handle,
               "mi_context_parse_tuning")
        _check(lib.mi_context_parse_tuning(self.handle, spec.encode()), self.handle,
               "mi_context_parse_tuning")

    def set_stream(self, stream):
        """CUDA stream (an int handle, a torch.cuda.Stream, or None for the legacy default)."""
        if stream is not None and not isinstance(stream, int):
            stream = getattr(stream, "cuda_stream", stream)
        _check(_lib().mi_context_set_stream(self.handle, stream), self.handle,
               "mi_context_set_stream")

    @property
    def stream(self):
        return _lib().mi_context_stream(self.handle)

    def synchronize(self):
        _check(_lib().mi_context_synchronize(self.handle), self.handle, "mi_context_synchronize")

    def close(self):
        if getattr(self, "_h", None) is not None:
            _lib().mi_context_destroy(self._h)
            self._h = None

    def __repr__(self):
        return f"Context(device={self.device!r}, device_id={self.device_id})"


_tls = threading.local()


def get_context(device="cpu", device_id=0):
    """The calling thread's shared context for a device."""
    cache = getattr(_tls, "contexts", None)
    if cache is None:
        cache = _tls.contexts = {}
    key = (device, int(device_id) if device == "cuda" else 0)
    ctx = cache.get(key)
    if ctx is None:
        ctx = cache[key] = Context(device, key[1])
    return ctx


# ---------------------------------------------------------------------------------------------
# Arrays: NumPy and torch, described without copies


def _is_torch(x):
    return type(x).__module__.split(".")[0] == "torch"


def _torch():
    import torch

    return torch


class _Arr:
    """An operand described for the library; `obj` keeps the memory alive."""

    __slots__ = ("obj", "desc", "is_torch", "device", "device_id", "dtype_code")

    def __init__(self, obj, desc, is_torch, device, device_id, dtype_code):
        self.obj = obj
        self.desc = desc
        self.is_torch = is_torch
        self.device = device
        self.device_id = device_id
        self.dtype_code = dtype_code


def _np_dtype_code(dt):
    if dt == np.float32:
        return L.MI_DTYPE_F32
    if dt == np.float16:
        return L.MI_DTYPE_F16
    if dt.name == "bfloat16":  # ml_dtypes.bfloat16
        return L.MI_DTYPE_BF16
    return None


def _torch_dtype_code(dt):
    torch = _torch()
    return {torch.float32: L.MI_DTYPE_F32, torch.float16: L.MI_DTYPE_F16,
            torch.bfloat16: L.MI_DTYPE_BF16}.get(dt)


def _describe(x, name):
    """Describes a [B, H, L, D] NumPy array or torch tensor as an mi_tensor (no copy unless the
    last dimension is not contiguous)."""
    desc = L.mi_tensor()
    if _is_torch(x):
        torch = _torch()
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name} must be 4-D [B, H, L, D], got shape {tuple(x.shape)}")
        code = _torch_dtype_code(x.dtype)
        if code is None:
            raise ValueError(f"{name}: dtype {x.dtype} is not supported (float32, float16, bfloat16)")
        if x.device.type not in ("cpu", "cuda"):
            raise ValueError(f"{name}: device {x.device} is not supported (cpu or cuda)")
        x = x.detach()
        if x.shape[3] > 1 and x.stride(3) != 1:
            x = x.contiguous()
        device = L.MI_DEVICE_CUDA if x.is_cuda else L.MI_DEVICE_CPU
        device_id = (x.device.index or 0) if x.is_cuda else 0
        strides = list(x.stride())
        if x.shape[3] == 1:
            strides[3] = 1
        desc.data = x.data_ptr() or None
        desc.dtype = code
        desc.device = device
        for i in range(4):
            desc.shape[i] = int(x.shape[i])
            desc.stride[i] = int(strides[i])
        return _Arr(x, desc, True, "cuda" if x.is_cuda else "cpu", device_id, code)
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a NumPy array or a torch tensor, got {type(x).__name__}")
    if x.ndim != 4:
        raise ValueError(f"{name} must be 4-D [B, H, L, D], got shape {x.shape}")
    code = _np_dtype_code(x.dtype)
    if code is None:
        raise ValueError(
            f"{name}: dtype {x.dtype} is not supported (float32 or float16; bfloat16 through torch "
            "or ml_dtypes)")
    if not x.dtype.isnative:
        x = x.astype(x.dtype.newbyteorder("="))
    item = x.itemsize
    if (any(s < 0 or s % item for s in x.strides) or (x.shape[3] > 1 and x.strides[3] != item)):
        x = np.ascontiguousarray(x)
    strides = [s // item for s in x.strides]
    if x.shape[3] == 1:
        strides[3] = 1
    desc.data = x.ctypes.data or None
    desc.dtype = code
    desc.device = L.MI_DEVICE_CPU
    for i in range(4):
        desc.shape[i] = int(x.shape[i])
        desc.stride[i] = int(strides[i])
    return _Arr(x, desc, False, "cpu", 0, code)


def _empty_like(a: _Arr, shape=None):
    """A contiguous output of q's kind, dtype and device."""
    x = a.obj
    shape = tuple(x.shape) if shape is None else tuple(shape)
    if a.is_torch:
        return _torch().empty(shape, dtype=x.dtype, device=x.device)
    return np.empty(shape, dtype=x.dtype)


def _ctx_for(a: _Arr, ctx):
    if ctx is not None:
        c = ctx
    else:
        c = get_context(a.device, a.device_id)
    if c.device != a.device:
        raise ValueError(f"the context is on the {c.device} but the data is on the {a.device}")
    if a.device == "cuda" and a.is_torch:
        torch = _torch()
        # Kernels run on torch's current stream so that they are ordered with the surrounding work.
        with torch.cuda.device(a.device_id):
            c.set_stream(torch.cuda.current_stream().cuda_stream)
    return c


def _int32_host(x, name, shape=None):
    """A contiguous int32 host array (keeps a reference), or None."""
    if x is None:
        return None
    if _is_torch(x):
        x = x.detach().cpu().numpy()
    arr = np.ascontiguousarray(np.asarray(x), dtype=np.int32)
    if shape is not None and arr.shape != tuple(shape):
        try:
            arr = np.ascontiguousarray(np.broadcast_to(arr, shape), dtype=np.int32)
        except ValueError:
            raise ValueError(f"{name} must have shape {tuple(shape)}, got {arr.shape}") from None
    return arr


def _ptr(arr):
    if arr is None:
        return None
    if _is_torch(arr):
        return arr.data_ptr()
    return arr.ctypes.data


def _int32_zeros(a: _Arr, shape):
    """Index memory on the data's device: NumPy on the CPU, torch on CUDA."""
    if a.device == "cuda":
        torch = _torch()
        return torch.zeros(shape, dtype=torch.int32, device=a.obj.device)
    return np.zeros(shape, dtype=np.int32)


def _to_device_int32(a: _Arr, x, shape):
    arr = _int32_host(x, "index", shape)
    if a.device == "cuda":
        torch = _torch()
        return torch.from_numpy(arr).to(a.obj.device)
    return arr


def _scale(scale):
    if scale is None:
        return 0.0
    scale = float(scale)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite number, got {scale}")
    return scale


def _lse_buffer(a: _Arr, want):
    if not want:
        return None
    B, H, Lq = (int(a.desc.shape[i]) for i in range(3))
    if a.is_torch:
        torch = _torch()
        return torch.empty((B, H, Lq), dtype=torch.float32, device=a.obj.device)
    return np.empty((B, H, Lq), dtype=np.float32)


# ---------------------------------------------------------------------------------------------
# Patterns and parameters

def pattern_names():
    """{MI_PATTERN_* value: config-file name} for every pattern of the library's table."""
    global _PATTERN_NAMES
    if _PATTERN_NAMES is None:
        lib = _lib()
        _PATTERN_NAMES = {t: _decode(lib.mi_pattern_name(t)) for t in range(lib.mi_pattern_count())}
    return _PATTERN_NAMES


_PATTERN_NAMES = None


def pattern_aliases(type_code):
    """The other names the library reads pattern type_code under (the first, where there is one,
    is its short name: "a_shape" for "stream_llm")."""
    out, lib = [], _lib()
    while True:
        s = lib.mi_pattern_alias(_pattern_code(type_code), len(out))
        if s is None:
            return out
        out.append(_decode(s))


def pattern_fields(type_code):
    """The mi_head_pattern fields pattern type_code reads, in the library's order."""
    out, lib = [], _lib()
    while True:
        s = lib.mi_pattern_field(_pattern_code(type_code), len(out))
        if s is None:
            return out
        out.append(_decode(s))


def pattern_name(type_code):
    s = _lib().mi_pattern_name(int(type_code))
    return _decode(s) if s is not None else None


def pattern_from_name(name):
    out = ctypes.c_int()
    st = _lib().mi_pattern_from_name(str(name).encode(), ctypes.byref(out))
    if st != 0:
        raise MInferenceError(st, f"unknown pattern name {name!r}", "mi_pattern_from_name")
    return out.value


def _pattern_code(t):
    if isinstance(t, str):
        return pattern_from_name(t)
    t = int(t)
    if t not in pattern_names():
        raise ValueError(f"unknown pattern type {t}")
    return t


_FIELDS = ("vertical_size", "slash_size", "n_init", "n_local", "n_last", "top_k", "stride",
           "threshold", "tau", "dense_local", "block_size", "repr_topk", "chunk_size", "per_head")


@dataclass
class HeadPattern:
    """The sparse pattern of one query head (mi_head_pattern). `type` is a name of the library's
    table (pattern_names(), pattern_aliases(): "vertical_and_slash", "stream_llm"/"a_shape",
    "tri_shape", "block_sparse", "dense", ...) or an MI_PATTERN_* value; unset sizes take the
    library's defaults for that type."""

    type: object = "vertical_and_slash"
    vertical_size: int = None
    slash_size: int = None
    n_init: int = None
    n_local: int = None
    n_last: int = None
    top_k: int = None
    stride: int = None
    threshold: int = None  # per mille
    tau: int = None  # per mille
    dense_local: int = None
    block_size: int = None  # InfLLM
    repr_topk: int = None
    chunk_size: int = None
    per_head: int = None

    @classmethod
    def default(cls, type="vertical_and_slash"):
        return cls.from_c(_lib().mi_head_pattern_default(_pattern_code(type)))

    @classmethod
    def parse(cls, text):
        """From "NAME[:V1[:V2...]]", the pattern's fields in order (mi_head_pattern_parse):
        "a_shape:100:800", "vs:1000:6096", "block_sparse:8", "dense"."""
        p = L.mi_head_pattern()
        st = _lib().mi_head_pattern_parse(str(text).encode(), ctypes.byref(p))
        if st != 0:
            raise MInferenceError(st, f"bad pattern {text!r}", "mi_head_pattern_parse")
        return cls.from_c(p)

    @classmethod
    def dense(cls):
        return cls.default("dense")

    @classmethod
    def a_shape(cls, n_init=128, n_local=3968):
        return cls("stream_llm", n_init=n_init, n_local=n_local)

    @classmethod
    def tri_shape(cls, n_init=128, n_local=3968, n_last=100):
        return cls("tri_shape", n_init=n_init, n_local=n_local, n_last=n_last)

    @classmethod
    def vertical_slash(cls, vertical_size=1000, slash_size=6096):
        return cls("vertical_and_slash", vertical_size=vertical_size, slash_size=slash_size)

    @classmethod
    def block_sparse(cls, top_k=100):
        return cls("block_sparse", top_k=top_k)

    @classmethod
    def xattention(cls, stride=8, threshold=0.9):
        """XAttention: antidiagonal block scores with this stride, blocks kept per row block up
        to the cumulative threshold (a fraction, stored per mille)."""
        return cls("xattention", stride=stride, threshold=_per_mille(threshold, "threshold"))

    @classmethod
    def flexprefill(cls, gamma=0.9, tau=0.1):
        """FlexPrefill: query-aware or vertical-slash by the sqrt-JS distance against tau,
        blocks up to the cumulative mass gamma (fractions, stored per mille)."""
        return cls("flexprefill", threshold=_per_mille(gamma, "gamma"), tau=_per_mille(tau, "tau"))

    @classmethod
    def dilated(cls, n_init=1024, n_local=8192, stride=2, dense_local=0):
        """Sinks, the dense_local nearest keys, every stride-th key of the n_local span (the
        original's dilated1; dilated2 is n_local=6144, dense_local=2048)."""
        return cls("dilated", n_init=n_init, n_local=n_local, stride=stride,
                   dense_local=dense_local)

    @classmethod
    def strided(cls, stride=128):
        """Sparse Transformer strided attention: the last stride keys and every stride-th."""
        return cls("strided", stride=stride)

    @classmethod
    def inf_llm(cls, topk=16, n_local=4096, n_init=128, block_size=128, repr_topk=4,
                exc_block_size=512, perhead=False):
        """InfLLM, with the original's argument names: n_init sinks, an n_local window, and the
        topk blocks of block_size keys (each represented by its repr_topk keys most attended
        from the window) retrieved per chunk of exc_block_size queries; perhead=False shares
        the retrieval between the heads."""
        return cls("inf_llm", top_k=topk, n_local=n_local, n_init=n_init, block_size=block_size,
                   repr_topk=repr_topk, chunk_size=exc_block_size, per_head=int(bool(perhead)))

    @classmethod
    def from_c(cls, p):
        return cls(pattern_names().get(p.type, p.type), p.vertical_size, p.slash_size, p.n_init,
                   p.n_local, p.n_last, p.top_k, p.stride, p.threshold, p.tau, p.dense_local,
                   p.block_size, p.repr_topk, p.chunk_size, p.per_head)

    @property
    def type_code(self):
        return _pattern_code(self.type)

    @property
    def name(self):
        return pattern_names()[self.type_code]

    def to_c(self, out=None):
        code = self.type_code
        p = _lib().mi_head_pattern_default(code)
        for f in _FIELDS:
            val = getattr(self, f)
            if val is not None:
                setattr(p, f, int(val))
        if out is not None:
            ctypes.pointer(out)[0] = p
            return out
        return p

    def __repr__(self):
        # the fields the pattern reads, as the library lists them
        c = self.to_c()
        args = "".join(f", {f}={getattr(c, f)}" for f in pattern_fields(self.type_code))
        return f"HeadPattern({self.name!r}{args})"


def _per_mille(x, what):
    """A fraction in [0, 1] as the library's per-mille integer."""
    x = float(x)
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"{what} must be in [0, 1], not {x}")
    return int(round(x * 1000))


def _as_head_pattern(p):
    if isinstance(p, HeadPattern):
        return p
    if isinstance(p, L.mi_head_pattern):
        return HeadPattern.from_c(p)
    if isinstance(p, str):
        return HeadPattern.default(p)
    if isinstance(p, (tuple, list)):
        # A config entry: [pattern, size1, size2(, score)], read as the C config reader reads it
        # (what the sizes carry is the pattern's: mi_head_pattern_from_sizes).
        code = _pattern_code(p[0])
        lib = _lib()
        sizes = [ctypes.c_int32(), ctypes.c_int32()]
        lib.mi_head_pattern_sizes(ctypes.byref(lib.mi_head_pattern_default(code)),
                                  ctypes.byref(sizes[0]), ctypes.byref(sizes[1]))
        size1 = int(p[1]) if len(p) > 1 else sizes[0].value
        size2 = int(p[2]) if len(p) > 2 else sizes[1].value
        out = L.mi_head_pattern()
        st = lib.mi_head_pattern_from_sizes(code, size1, size2, ctypes.byref(out))
        if st != 0:
            raise MInferenceError(st, f"bad config entry {p!r}", "mi_head_pattern_from_sizes")
        return HeadPattern.from_c(out)
    raise TypeError(f"cannot make a head pattern from {p!r}")


def patterns_array(patterns, n_heads=None):
    """A ctypes mi_head_pattern[n] from HeadPatterns, names, config entries or one pattern
    (repeated over n_heads)."""
    if isinstance(patterns, ctypes.Array) and patterns._type_ is L.mi_head_pattern:
        if n_heads is not None and len(patterns) != n_heads:
            raise ValueError(f"patterns has {len(patterns)} entries, the query has {n_heads} heads")
        return patterns
    if isinstance(patterns, (HeadPattern, str, L.mi_head_pattern)) or (
            isinstance(patterns, tuple) and patterns and isinstance(patterns[0], str)):
        if n_heads is None:
            raise ValueError("a single pattern needs n_heads")
        patterns = [patterns] * n_heads
    patterns = list(patterns)
    if n_heads is not None and len(patterns) != n_heads:
        raise ValueError(f"patterns has {len(patterns)} entries, the query has {n_heads} heads")
    arr = (L.mi_head_pattern * max(1, len(patterns)))()
    for i, p in enumerate(patterns):
        arr[i] = _as_head_pattern(p).to_c()
    return arr


@dataclass
class VSParams:
    """Vertical-slash estimation parameters (mi_vs_params); None takes the library default."""

    last_q: int = None
    forced_columns: int = None
    forced_diagonals: int = None
    min_vertical: int = None
    min_slash: int = None

    def to_c(self):
        p = _lib().mi_vs_default_params()
        for f in fields(self):
            v = getattr(self, f.name)
            if v is not None:
                setattr(p, f.name, int(v))
        return p

    @classmethod
    def default(cls):
        p = _lib().mi_vs_default_params()
        return cls(**{f.name: getattr(p, f.name) for f in fields(cls)})


@dataclass
class PrefillParams:
    """Whole-layer prefill parameters (mi_prefill_params). dense_below: sequences shorter than
    this run dense (None/-1: the library's measured crossover; 0: never)."""

    softmax_scale: float = None
    vs: VSParams = field(default_factory=VSParams)
    dense_below: int = None

    def to_c(self):
        p = _lib().mi_prefill_default_params()
        if self.softmax_scale is not None:
            p.softmax_scale = float(self.softmax_scale)
        vs = self.vs if isinstance(self.vs, VSParams) else VSParams(**(self.vs or {}))
        p.vs = vs.to_c()
        if self.dense_below is not None:
            p.dense_below = int(self.dense_below)
        return p

    @classmethod
    def default(cls):
        p = _lib().mi_prefill_default_params()
        return cls(p.softmax_scale, VSParams(**{f.name: getattr(p.vs, f.name) for f in fields(VSParams)}),
                   p.dense_below)


def _prefill_params(params):
    if params is None:
        return _lib().mi_prefill_default_params()
    if isinstance(params, L.mi_prefill_params):
        return params
    if isinstance(params, dict):
        params = PrefillParams(**params)
    return params.to_c()


def _vs_params(params):
    if params is None:
        return _lib().mi_vs_default_params()
    if isinstance(params, L.mi_vs_params):
        return params
    if isinstance(params, dict):
        params = VSParams(**params)
    return params.to_c()


# ---------------------------------------------------------------------------------------------
# Indices (caller-owned int32 arrays on the data's device)


@dataclass
class VSIndex:
    """Estimated vertical-slash sets: vertical_count [B, H], vertical_idx [B, H, max_vertical]
    (key columns, ascending), slash_count [B, H], slash_idx [B, H, max_slash] (distances,
    descending)."""

    vertical_count: object
    vertical_idx: object
    slash_count: object
    slash_idx: object

    @classmethod
    def empty(cls, like: _Arr, batch, heads, max_vertical, max_slash):
        return cls(_int32_zeros(like, (batch, heads)),
                   _int32_zeros(like, (batch, heads, max(1, max_vertical))),
                   _int32_zeros(like, (batch, heads)),
                   _int32_zeros(like, (batch, heads, max(1, max_slash))))

    @classmethod
    def in_buffer(cls, batch, heads, max_vertical, max_slash):
        """CPU index laid out by mi_vs_index_init over one buffer of mi_vs_index_bytes()."""
        lib = _lib()
        n = lib.mi_vs_index_bytes(batch, heads, max_vertical, max_slash)
        buf = np.zeros(n, dtype=np.uint8)
        s = L.mi_vs_index()
        _check(lib.mi_vs_index_init(ctypes.byref(s), batch, heads, max_vertical, max_slash,
                                    buf.ctypes.data, n), None, "mi_vs_index_init")
        base = buf.ctypes.data

        def view(ptr, shape):
            return np.frombuffer(buf, np.int32, int(np.prod(shape)), ptr - base).reshape(shape)

        return cls(view(s.vertical_count, (batch, heads)),
                   view(s.vertical_idx, (batch, heads, max_vertical)),
                   view(s.slash_count, (batch, heads)),
                   view(s.slash_idx, (batch, heads, max_slash)))

    def to_c(self):
        s = L.mi_vs_index()
        B, H, mv = self.vertical_idx.shape
        s.batch, s.heads, s.max_vertical, s.max_slash = B, H, mv, self.slash_idx.shape[2]
        s.vertical_count = _ptr(self.vertical_count)
        s.vertical_idx = _ptr(self.vertical_idx)
        s.slash_count = _ptr(self.slash_count)
        s.slash_idx = _ptr(self.slash_idx)
        return s

    def verticals(self, b, h):
        n = int(self.vertical_count[b, h])
        return self.vertical_idx[b, h, :n]

    def slashes(self, b, h):
        n = int(self.slash_count[b, h])
        return self.slash_idx[b, h, :n]


@dataclass
class SparseIndex:
    """A compiled block index (mi_sparse_index): block_count [B, H, R], block_offset
    [B, H, R, max_blocks] (start key of each 64-key range), column_count [B, H, R], column_index
    [B, H, R, max_columns]."""

    block_count: object
    block_offset: object
    column_count: object
    column_index: object

    @classmethod
    def empty(cls, like: _Arr, batch, heads, row_blocks, max_blocks, max_columns):
        return cls(_int32_zeros(like, (batch, heads, row_blocks)),
                   _int32_zeros(like, (batch, heads, row_blocks, max(1, max_blocks))),
                   _int32_zeros(like, (batch, heads, row_blocks)),
                   _int32_zeros(like, (batch, heads, row_blocks, max(1, max_columns))))

    @classmethod
    def in_buffer(cls, batch, heads, row_blocks, max_blocks, max_columns):
        """CPU index laid out by mi_sparse_index_init over one buffer of mi_sparse_index_bytes()."""
        lib = _lib()
        n = lib.mi_sparse_index_bytes(batch, heads, row_blocks, max_blocks, max_columns)
        buf = np.zeros(n, dtype=np.uint8)
        s = L.mi_sparse_index()
        _check(lib.mi_sparse_index_init(ctypes.byref(s), batch, heads, row_blocks, max_blocks,
                                        max_columns, buf.ctypes.data, n), None,
               "mi_sparse_index_init")
        base = buf.ctypes.data

        def view(ptr, shape):
            return np.frombuffer(buf, np.int32, int(np.prod(shape)), ptr - base).reshape(shape)

        return cls(view(s.block_count, (batch, heads, row_blocks)),
                   view(s.block_offset, (batch, heads, row_blocks, max_blocks)),
                   view(s.column_count, (batch, heads, row_blocks)),
                   view(s.column_index, (batch, heads, row_blocks, max_columns)))

    def to_c(self, max_blocks=None, max_columns=None):
        s = L.mi_sparse_index()
        B, H, R, mb = self.block_offset.shape
        s.batch, s.heads, s.row_blocks = B, H, R
        s.max_blocks = mb if max_blocks is None else max_blocks
        s.max_columns = self.column_index.shape[3] if max_columns is None else max_columns
        s.block_count = _ptr(self.block_count)
        s.block_offset = _ptr(self.block_offset)
        s.column_count = _ptr(self.column_count)
        s.column_index = _ptr(self.column_index)
        return s

    def to_mask(self, L_, b, h, seq_len=None):
        """The (row, key) pairs the kernel visits for (b, h), as a boolean [L, L] NumPy mask
        (ranges and columns, intersected with causality and the sequence length)."""

        def host(x):
            return x.detach().cpu().numpy() if _is_torch(x) else np.asarray(x)

        n = L_ if seq_len is None else int(seq_len)
        bc, bo = host(self.block_count)[b, h], host(self.block_offset)[b, h]
        cc, ci = host(self.column_count)[b, h], host(self.column_index)[b, h]
        mask = np.zeros((L_, L_), dtype=bool)
        for m in range(bc.shape[0]):
            r0, r1 = m * 64, min((m + 1) * 64, L_)
            for t in range(int(bc[m])):
                o = int(bo[m, t])
                mask[r0:r1, max(o, 0):max(min(o + 64, L_), 0)] = True
            for t in range(int(cc[m])):
                c = int(ci[m, t])
                if 0 <= c < L_:
                    mask[r0:r1, c] = True
        mask &= np.tril(np.ones((L_, L_), dtype=bool))
        mask[n:, :] = False
        mask[:, n:] = False
        return mask


# ---------------------------------------------------------------------------------------------
# Configs (the original's JSON)


class Config(_Closing):
    """A per-model pattern config (mi_config): layer -> query head -> pattern and budget.

    Config.load(path), Config.parse(json_text) or Config.create(n_layers, n_heads, default)."""

    def __init__(self, handle):
        self._h = handle

    @classmethod
    def load(cls, path, ctx=None):
        import os

        ctx = ctx or get_context()
        out = ctypes.c_void_p()
        _check(_lib().mi_config_load(ctx.handle, os.fsencode(path), ctypes.byref(out)), ctx.handle,
               "mi_config_load")
        return cls(out.value)

    @classmethod
    def parse(cls, text, ctx=None):
        ctx = ctx or get_context()
        data = text.encode() if isinstance(text, str) else bytes(text)
        out = ctypes.c_void_p()
        _check(_lib().mi_config_parse(ctx.handle, data, len(data), ctypes.byref(out)), ctx.handle,
               "mi_config_parse")
        return cls(out.value)

    @classmethod
    def from_list(cls, entries, ctx=None):
        """From the parsed JSON structure: a list (one dict per layer) of head -> entry."""
        import json

        return cls.parse(json.dumps(entries), ctx)

    @classmethod
    def create(cls, n_layers, n_heads, default=None, ctx=None):
        ctx = ctx or get_context()
        out = ctypes.c_void_p()
        p = None
        if default is not None:
            p = ctypes.byref(_as_head_pattern(default).to_c())
        _check(_lib().mi_config_create(ctx.handle, int(n_layers), int(n_heads), p, ctypes.byref(out)),
               ctx.handle, "mi_config_create")
        return cls(out.value)

    @property
    def handle(self):
        if self._h is None:
            raise ValueError("the config was closed")
        return self._h

    @property
    def n_layers(self):
        return int(_lib().mi_config_n_layers(self.handle))

    @property
    def n_heads(self):
        return int(_lib().mi_config_n_heads(self.handle))

    def check(self, n_layers, n_heads, ctx=None):
        ctx = ctx or get_context()
        _check(_lib().mi_config_check(ctx.handle, self.handle, int(n_layers), int(n_heads)),
               ctx.handle, "mi_config_check")

    def layer_array(self, layer, n_heads, ctx=None, with_scores=False):
        """The layer's patterns as a ctypes mi_head_pattern[n_heads] (defaults filled in)."""
        ctx = ctx or get_context()
        arr = (L.mi_head_pattern * n_heads)()
        scores = np.empty(n_heads, dtype=np.float64)
        _check(_lib().mi_config_layer(ctx.handle, self.handle, int(layer), int(n_heads), arr,
                                      scores.ctypes.data), ctx.handle, "mi_config_layer")
        return (arr, scores) if with_scores else arr

    def layer(self, layer, n_heads=None, ctx=None):
        """([HeadPattern] * n_heads, scores float64 [n_heads], NaN where absent)."""
        n_heads = self.n_heads if n_heads is None else n_heads
        arr, scores = self.layer_array(layer, n_heads, ctx, with_scores=True)
        return [HeadPattern.from_c(p) for p in arr], scores

    def set_head(self, layer, head, pattern, score=float("nan"), ctx=None):
        ctx = ctx or get_context()
        p = _as_head_pattern(pattern).to_c()
        _check(_lib().mi_config_set_head(ctx.handle, self.handle, int(layer), int(head),
                                         ctypes.byref(p), float(score)), ctx.handle,
               "mi_config_set_head")

    def to_json(self, ctx=None):
        ctx = ctx or get_context()
        out = ctypes.c_void_p()
        _check(_lib().mi_config_to_json(ctx.handle, self.handle, ctypes.byref(out)), ctx.handle,
               "mi_config_to_json")
        try:
            return ctypes.string_at(out.value).decode()
        finally:
            _lib().mi_free(out.value)

    def to_list(self, ctx=None):
        import json

        return json.loads(self.to_json(ctx))

    def save(self, path, ctx=None):
        import os

        ctx = ctx or get_context()
        _check(_lib().mi_config_save(ctx.handle, self.handle, os.fsencode(path)), ctx.handle,
               "mi_config_save")

    def close(self):
        if getattr(self, "_h", None) is not None:
            _lib().mi_config_destroy(self._h)
            self._h = None

    def __repr__(self):
        if self._h is None:
            return "Config(closed)"
        return f"Config(n_layers={self.n_layers}, n_heads={self.n_heads})"


# ---------------------------------------------------------------------------------------------
# Synthetic data and metrics


@dataclass
class SynthParams:
    """mi_synth_params; None takes the library default."""

    seed: int = None
    n_sinks: int = None
    n_verticals: int = None
    n_slashes: int = None
    slash_distances: object = None
    local_window: int = None
    n_needles: int = None
    strength: float = None
    noise: float = None


def synth_generate(batch, heads, heads_kv, length, head_dim, dtype=np.float32, params=None,
                   ctx=None, **kw):
    """Seeded q [B, H, L, D], k and v [B, H_kv, L, D] NumPy arrays whose dense attention shows
    planted structure; returns (q, k, v, truth) where truth has "vertical_cols" [H, n_verticals],
    "slash_dists" [H, n_slashes], "needle_rows" and "needle_cols" [H, n_needles]."""
    if params is None:
        params = SynthParams(**kw)
    elif kw:
        raise TypeError("pass either params or keyword arguments")
    lib = _lib()
    p = lib.mi_synth_default_params()
    keep = []
    for f in fields(SynthParams):
        v = getattr(params, f.name)
        if v is None:
            continue
        if f.name == "slash_distances":
            arr = _int32_host(v, "slash_distances")
            keep.append(arr)
            p.slash_distances = arr.ctypes.data
            if params.n_slashes is None:
                p.n_slashes = arr.size
            elif arr.size != p.n_slashes:
                raise ValueError("slash_distances must have n_slashes entries")
        elif f.name in ("strength", "noise"):
            setattr(p, f.name, float(v))
        else:
            setattr(p, f.name, int(v))
    dt = np.dtype(dtype)
    q = np.zeros((batch, heads, length, head_dim), dtype=dt)
    k = np.zeros((batch, heads_kv, length, head_dim), dtype=dt)
    v = np.zeros((batch, heads_kv, length, head_dim), dtype=dt)
    dq, dk, dv = _describe(q, "q"), _describe(k, "k"), _describe(v, "v")
    truth = {
        "vertical_cols": np.zeros((heads, max(0, p.n_verticals)), dtype=np.int32),
        "slash_dists": np.zeros((heads, max(0, p.n_slashes)), dtype=np.int32),
        "needle_rows": np.zeros((heads, max(0, p.n_needles)), dtype=np.int32),
        "needle_cols": np.zeros((heads, max(0, p.n_needles)), dtype=np.int32),
    }
    t = L.mi_synth_truth()
    for name in ("vertical_cols", "slash_dists", "needle_rows", "needle_cols"):
        setattr(t, name, truth[name].ctypes.data if truth[name].size else None)
    ctx = ctx or get_context()
    _check(lib.mi_synth_generate(ctx.handle, ctypes.byref(p), ctypes.byref(dq.desc),
                                 ctypes.byref(dk.desc), ctypes.byref(dv.desc), ctypes.byref(t)),
           ctx.handle, "mi_synth_generate")
    return q, k, v, truth


METRICS_DTYPE = np.dtype([("recall", "f8"), ("density", "f8"), ("flops", "f8"),
                          ("dense_flops", "f8")])


def metrics_evaluate(q, k, patterns, seq_lens=None, params=None, ctx=None):
    """Recall, density and FLOPs of each (b, h)'s pattern on these q/k (CPU): a structured NumPy
    array [B, H] with fields recall, density, flops, dense_flops."""
    dq, dk = _describe(q, "q"), _describe(k, "k")
    B, H = int(dq.desc.shape[0]), int(dq.desc.shape[1])
    c = _ctx_for(dq, ctx)
    pats = patterns_array(patterns, H)
    sl = _int32_host(seq_lens, "seq_lens", (B,))
    out = (L.mi_head_metrics * (B * H))()
    pp = _prefill_params(params)
    _check(_lib().mi_metrics_evaluate(c.handle, ctypes.byref(dq.desc), ctypes.byref(dk.desc),
                                      _ptr(sl), pats, ctypes.byref(pp), out), c.handle,
           "mi_metrics_evaluate")
    res = np.zeros((B, H), dtype=METRICS_DTYPE)
    flat = res.reshape(-1)
    for i in range(B * H):
        flat[i] = (out[i].recall, out[i].density, out[i].flops, out[i].dense_flops)
    return res


def metrics_rel_l2(out, ref, seq_lens=None, ctx=None):
    """||out - ref|| / ||ref|| over the valid rows (float64 sums)."""
    do, dr = _describe(out, "out"), _describe(ref, "ref")
    c = _ctx_for(do, ctx)
    sl = _int32_host(seq_lens, "seq_lens", (int(do.desc.shape[0]),))
    res = ctypes.c_double()
    _check(_lib().mi_metrics_rel_l2(c.handle, ctypes.byref(do.desc), ctypes.byref(dr.desc),
                                    _ptr(sl), ctypes.byref(res)), c.handle, "mi_metrics_rel_l2")
    return res.value


# fp16 / bf16 scalar conversions (round to nearest even), as the library does them.
def f32_to_f16(x):
    return int(_lib().mi_f32_to_f16(float(x)))


def f16_to_f32(h):
    return float(_lib().mi_f16_to_f32(int(h)))


def f32_to_bf16(x):
    return int(_lib().mi_f32_to_bf16(float(x)))


def bf16_to_f32(h):
    return float(_lib().mi_bf16_to_f32(int(h)))


def vs_index_bytes(batch, heads, max_vertical, max_slash):
    return int(_lib().mi_vs_index_bytes(batch, heads, max_vertical, max_slash))


def sparse_index_bytes(batch, heads, row_blocks, max_blocks, max_columns):
    return int(_lib().mi_sparse_index_bytes(batch, heads, row_blocks, max_blocks, max_columns))


def tensor_descriptor(x, name="x"):
    """The mi_tensor (ctypes) describing a [B, H, L, D] array or tensor, and the object that
    holds its memory (keep it alive while the descriptor is used)."""
    a = _describe(x, name)
    return a.desc, a.obj


def dtype_size(code):
    return int(_lib().mi_dtype_size(int(code)))


def dtype_name(code):
    return _decode(_lib().mi_dtype_name(int(code)))
