"""Shared helpers: a naive float64 NumPy reference of causal masked attention, and mask builders.

The reference is the ground truth for the CPU library (DESIGN.md §5): a sparse kernel must equal
dense attention under its mask expanded to elements.
"""

import os
import sys
import zlib

import numpy as np
import pytest

try:  # the installed package; else the source tree (it then loads ../build*/libminference.so)
    import minference  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def causal_mask(L):
    return np.tril(np.ones((L, L), dtype=bool))


def a_shape_mask(L, n_init, n_local, n_last=0, length=None):
    """Keys j <= i with i - j < n_local or j < n_init; the last min(n_last, len-1) rows dense."""
    n = L if length is None else length
    i = np.arange(L)[:, None]
    j = np.arange(L)[None, :]
    m = (j <= i) & ((i - j < n_local) | (j < n_init))
    if n_last > 0 and n > 0:
        last = min(n_last, n - 1)
        m[n - last:n] |= (j <= i)[n - last:n]
    return m


def reference_attention(q, k, v, mask=None, scale=None, seq_lens=None):
    """float64 attention. q [B, H, L, D], k/v [B, H_kv, L, D]; mask: None (causal), [L, L],
    or a callable (b, h) -> [L, L]. Rows past seq_lens[b] and rows with no key are 0 (lse -inf)."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    B, H, L, D = q.shape
    G = H // k.shape[1]
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    out = np.zeros((B, H, L, D))
    lse = np.full((B, H, L), -np.inf)
    for b in range(B):
        n = L if seq_lens is None else int(seq_lens[b])
        for h in range(H):
            if callable(mask):
                m = mask(b, h)
            elif mask is None:
                m = causal_mask(L)
            else:
                m = mask
            m = m & causal_mask(L)
            m = m.copy()
            m[n:, :] = False
            m[:, n:] = False
            s = (q[b, h] @ k[b, h // G].T) * scale
            s = np.where(m, s, -np.inf)
            mx = s.max(axis=1, keepdims=True)
            has = np.isfinite(mx[:, 0])
            mx = np.where(np.isfinite(mx), mx, 0.0)
            p = np.exp(s - mx)
            l = p.sum(axis=1, keepdims=True)
            o = np.where(has[:, None], (p @ v[b, h // G]) / np.where(l > 0, l, 1), 0.0)
            out[b, h] = o
            lse[b, h] = np.where(has, mx[:, 0] + np.log(np.where(l[:, 0] > 0, l[:, 0], 1)), -np.inf)
    return out, lse


TOL = {
    # fp32 inputs, fp32 accumulation against float64: rounding of L-term sums only.
    np.dtype(np.float32): (2e-5, 2e-4),
    # fp16 inputs: the output is rounded to fp16 (2^-11 relative) and P may be rounded for P@V.
    np.dtype(np.float16): (2e-3, 1e-2),
}


def assert_close(out, ref, dtype=np.float32, what="", atol=None, rtol=None):
    out = np.asarray(out, dtype=np.float64)
    a, r = TOL.get(np.dtype(dtype), (1e-2, 2e-2))
    atol = a if atol is None else atol
    rtol = r if rtol is None else rtol
    assert np.isfinite(out).all(), f"{what}: NaN/Inf in the output"
    err = np.abs(out - ref)
    bound = atol + rtol * np.abs(ref)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), (
        f"{what}: max |err| {err.max():.3g} at {worst} (out {out[worst]:.6g}, ref {ref[worst]:.6g}); "
        f"rel L2 {np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30):.3g}")


@pytest.fixture
def rng(request):
    seed = zlib.crc32(request.node.name.encode())
    print(f"seed {seed}")
    return np.random.default_rng(seed)


def qkv(rng, B, H, Hkv, L, D, dtype=np.float32, scale=1.0):
    q = (rng.standard_normal((B, H, L, D)) * scale).astype(dtype)
    k = (rng.standard_normal((B, Hkv, L, D)) * scale).astype(dtype)
    v = rng.standard_normal((B, Hkv, L, D)).astype(dtype)
    return q, k, v
