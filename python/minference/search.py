"""Pattern search (choosing each head's pattern and budget from a sample prompt) and the
evaluation helpers of the accuracy harnesses (answer checks, perplexity, haystacks)."""

import ctypes
from dataclasses import dataclass, field

import numpy as np

from . import _lib as L
from .core import (
    METRICS_DTYPE,
    HeadPattern,
    PrefillParams,
    _as_head_pattern,
    _check,
    _ctx_for,
    _describe,
    _int32_host,
    _lib,
    _prefill_params,
    _ptr,
    patterns_array,
)

__all__ = [
    "SearchParams", "search_default_candidates", "search_scale_pattern", "search_layer",
    "needle_match", "passkey_match", "string_match_all", "string_match_part", "kv_match",
    "log_prob", "perplexity", "haystack", "needle_offset", "insert_needle", "EVAL_FILLER",
]

_MODES = {"fixed": L.MI_SEARCH_FIXED, "flops": L.MI_SEARCH_FLOPS, "adaptive": L.MI_SEARCH_ADAPTIVE}


@dataclass
class SearchParams:
    """mi_search_params. mode: "fixed" (the candidates as given, as in the original search),
    "flops" (each candidate scaled to target_density, then the best score wins) or "adaptive"
    (the smallest scale reaching target_recall, the cheapest candidate wins). None takes the
    library default; candidates None: the original's candidates."""

    candidates: list = None
    mode: str = None
    target_density: float = None
    target_recall: float = None
    error_weight: float = None
    max_scale: float = None
    min_scale: float = None
    iterations: int = None
    prefill: PrefillParams = field(default=None)

    def to_c(self, keep):
        p = _lib().mi_search_default_params()
        if self.candidates is not None:
            arr = patterns_array(list(self.candidates))
            keep.append(arr)
            p.candidates = ctypes.addressof(arr)
            p.n_candidates = len(self.candidates)
        if self.mode is not None:
            if self.mode not in _MODES:
                raise ValueError(f"mode must be one of {list(_MODES)}, not {self.mode!r}")
            p.mode = _MODES[self.mode]
        for f in ("target_density", "target_recall", "error_weight", "max_scale", "min_scale"):
            if getattr(self, f) is not None:
                setattr(p, f, float(getattr(self, f)))
        if self.iterations is not None:
            p.iterations = int(self.iterations)
        if self.prefill is not None:
            p.prefill = _prefill_params(self.prefill)
        return p


def _search_params(params, keep):
    if params is None:
        return _lib().mi_search_default_params()
    if isinstance(params, dict):
        params = SearchParams(**params)
    return params.to_c(keep)


def search_default_candidates(sample_len):
    """The original's candidates for a sample of sample_len tokens (docs/algorithms.md §6)."""
    arr = (L.mi_head_pattern * 32)()
    n = ctypes.c_int32()
    _check(_lib().mi_search_default_candidates(int(sample_len), arr, 32, ctypes.byref(n)), None,
           "mi_search_default_candidates")
    return [HeadPattern.from_c(arr[i]) for i in range(n.value)]


def search_scale_pattern(pattern, s):
    """A candidate's budgets scaled by s, as the search scales them."""
    base = _as_head_pattern(pattern).to_c()
    out = L.mi_head_pattern()
    _check(_lib().mi_search_scale_pattern(ctypes.byref(base), float(s), ctypes.byref(out)), None,
           "mi_search_scale_pattern")
    return HeadPattern.from_c(out)


def search_layer(q, k, v, params=None, seq_lens=None, ctx=None):
    """Searches one layer on the CPU: q [B, H_q, L, D], k and v [B, H_kv, L, D] (post-RoPE, from
    a sample prompt). Returns (patterns [H_q] HeadPattern, scores float64 [H_q], metrics
    structured [H_q] with recall, density, flops, dense_flops of the chosen patterns)."""
    dq, dk, dv = _describe(q, "q"), _describe(k, "k"), _describe(v, "v")
    if dq.device != "cpu":
        raise ValueError("search_layer runs on the CPU: pass CPU arrays (tensor.cpu())")
    c = _ctx_for(dq, ctx)
    B, H = int(dq.desc.shape[0]), int(dq.desc.shape[1])
    keep = []
    p = _search_params(params, keep)
    sl = _int32_host(seq_lens, "seq_lens", (B,))
    best = (L.mi_head_pattern * H)()
    scores = np.zeros(H, dtype=np.float64)
    met = (L.mi_head_metrics * H)()
    _check(_lib().mi_search_layer(c.handle, ctypes.byref(dq.desc), ctypes.byref(dk.desc),
                                  ctypes.byref(dv.desc), _ptr(sl), ctypes.byref(p), best,
                                  scores.ctypes.data, met), c.handle, "mi_search_layer")
    metrics = np.zeros(H, dtype=METRICS_DTYPE)
    for h in range(H):
        metrics[h] = (met[h].recall, met[h].density, met[h].flops, met[h].dense_flops)
    return [HeadPattern.from_c(best[h]) for h in range(H)], scores, metrics


# ---------------------------------------------------------------------------------------------
# Evaluation helpers (docs/algorithms.md §7)

EVAL_FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and "
               "back again. ")


def _b(s):
    if s is None:
        return None
    return s.encode("utf-8") if isinstance(s, str) else bytes(s)


def _strings(refs):
    refs = [_b(r) for r in (refs or [])]
    arr = (ctypes.c_char_p * max(1, len(refs)))(*refs)
    return arr, len(refs)


def needle_match(output, answer):
    """Needle-in-a-haystack: the answer's digits appear, in one run, among the output's."""
    m = ctypes.c_int()
    _check(_lib().mi_eval_needle_match(_b(output), _b(answer), ctypes.byref(m)), None,
           "mi_eval_needle_match")
    return bool(m.value)


def passkey_match(output, answer):
    """Passkey: the first integer in output equals answer's."""
    m = ctypes.c_int()
    _check(_lib().mi_eval_passkey_match(_b(output), _b(answer), ctypes.byref(m)), None,
           "mi_eval_passkey_match")
    return bool(m.value)


def string_match_all(output, refs):
    """RULER string_match_all: the fraction of refs contained in output (case-insensitive)."""
    arr, n = _strings(refs)
    s = ctypes.c_double()
    _check(_lib().mi_eval_string_match_all(_b(output), arr, n, ctypes.byref(s)), None,
           "mi_eval_string_match_all")
    return s.value


def string_match_part(output, refs):
    """RULER string_match_part: 1.0 when any ref is contained (case-insensitive), else 0.0."""
    arr, n = _strings(refs)
    s = ctypes.c_double()
    _check(_lib().mi_eval_string_match_part(_b(output), arr, n, ctypes.byref(s)), None,
           "mi_eval_string_match_part")
    return s.value


def kv_match(output, value, distractors=None):
    """Multi-key retrieval: output contains value and none of the distractors."""
    arr, n = _strings(distractors)
    m = ctypes.c_int()
    _check(_lib().mi_eval_kv_match(_b(output), _b(value), arr if n else None, n, ctypes.byref(m)),
           None, "mi_eval_kv_match")
    return bool(m.value)


def log_prob(logits, token):
    """log p(token) from raw logits [n_vocab] (stable log-softmax in double)."""
    arr = np.ascontiguousarray(np.asarray(logits, dtype=np.float32).reshape(-1))
    r = ctypes.c_double()
    _check(_lib().mi_eval_log_prob(arr.ctypes.data, arr.size, int(token), ctypes.byref(r)), None,
           "mi_eval_log_prob")
    return r.value


def perplexity(log_probs):
    """exp(-mean(log_probs))."""
    arr = np.ascontiguousarray(np.asarray(log_probs, dtype=np.float64).reshape(-1))
    r = ctypes.c_double()
    _check(_lib().mi_eval_perplexity(arr.ctypes.data, arr.size, ctypes.byref(r)), None,
           "mi_eval_perplexity")
    return r.value


def _take_string(ptr, length):
    try:
        return ctypes.string_at(ptr, length).decode("utf-8", "replace")
    finally:
        _lib().mi_free(ptr)


def haystack(min_bytes, text=None):
    """A haystack of at least min_bytes bytes: the RULER filler repeated, or text repeated."""
    t = _b(text)
    out = ctypes.c_void_p()
    n = ctypes.c_size_t()
    _check(_lib().mi_eval_haystack(t, len(t) if t else 0, int(min_bytes), ctypes.byref(out),
                                   ctypes.byref(n)), None, "mi_eval_haystack")
    return _take_string(out.value, n.value)


def needle_offset(hay, depth):
    """The byte offset for a needle at depth percent of hay (moved back to a sentence start)."""
    h = _b(hay)
    off = ctypes.c_size_t()
    _check(_lib().mi_eval_needle_offset(h, len(h), float(depth), ctypes.byref(off)), None,
           "mi_eval_needle_offset")
    return off.value


def insert_needle(hay, needle, depth):
    """(hay with needle inserted at needle_offset(depth), the byte offset used)."""
    h = _b(hay)
    out = ctypes.c_void_p()
    off = ctypes.c_size_t()
    _check(_lib().mi_eval_insert_needle(h, len(h), _b(needle), float(depth), ctypes.byref(out),
                                        ctypes.byref(off)), None, "mi_eval_insert_needle")
    text = ctypes.string_at(out.value).decode("utf-8", "replace")
    _lib().mi_free(out.value)
    return text, off.value

