#!/usr/bin/env python3
"""GPU attention benchmark: minference's CUDA kernels against PyTorch SDPA (cuDNN and flash
backends) in one run, on the same inputs. The library is loaded with ctypes and fed
tensor.data_ptr(), on torch's current stream.

Measures (bf16, D = 128, causal; BENCHMARKS.md; every section at 32K, 128K, 512K and 1M):
  dense           ours vs cuDNN vs flash, per-head ms and TFLOP/s (2 L^2 D per head)
  sparse          VS kernel on the prescribed index sets local / mixed / small (index built on
                  the GPU and timed apart), effective TFLOP/s = 4 D (keys visited) / time
  patterns        block-sparse top-100 (estimation timed apart; random and position-coded
                  inputs) and A-shape 128 + 4096, against the original's kernel times
  estimation      VS estimation + index build at default budgets (1000 / 6096), share of total
  prefill         whole layer, every head VS 1000/6096, estimation included (random inputs)
  crossover       prefill vs dense per length: where sparse starts to pay
  crossover-d64   the same for heads of 64 dimensions (9 / 3 heads); not in the default set

Usage: torch_ref.py --lib build/libminference.so [--out DIR] [--store FILE] [--quick]
                    [--sections dense,sparse,patterns,estimation,crossover]
Appends its rows to the results store (--store, default bench/results.jsonl; "" for none: see
scripts/results.py), writes the whole run to DIR/<date>-gpu-attention.json and its plot to
DIR/<date>-gpu-attention.png (DIR default build/bench); prints a table last.
"""
import argparse
import collections
import contextlib
import ctypes as C
import datetime
import json
import math
import os
import re
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from attention_plot import plot  # noqa: E402
import results  # noqa: E402

# ---------------------------------------------------------------------------------------------
# ctypes mirror of the public API (include/minference.h)

MI_DEVICE_CUDA = 1
MI_DTYPE_BF16 = 2
MI_PATTERN_VERTICAL_SLASH = 3


class ContextParams(C.Structure):
    _fields_ = [("device", C.c_int), ("device_id", C.c_int), ("n_threads", C.c_int)]


class Tensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("dtype", C.c_int), ("device", C.c_int),
                ("shape", C.c_int64 * 4), ("stride", C.c_int64 * 4)]


class VsIndex(C.Structure):
    _fields_ = [("batch", C.c_int32), ("heads", C.c_int32), ("max_vertical", C.c_int32),
                ("max_slash", C.c_int32), ("vertical_count", C.c_void_p),
                ("vertical_idx", C.c_void_p), ("slash_count", C.c_void_p),
                ("slash_idx", C.c_void_p)]


class SparseIndex(C.Structure):
    _fields_ = [("batch", C.c_int32), ("heads", C.c_int32), ("row_blocks", C.c_int32),
                ("max_blocks", C.c_int32), ("max_columns", C.c_int32),
                ("block_count", C.c_void_p), ("block_offset", C.c_void_p),
                ("column_count", C.c_void_p), ("column_index", C.c_void_p)]


class HeadPattern(C.Structure):
    _fields_ = [("type", C.c_int), ("vertical_size", C.c_int32), ("slash_size", C.c_int32),
                ("n_init", C.c_int32), ("n_local", C.c_int32), ("n_last", C.c_int32),
                ("top_k", C.c_int32)]


class VsParams(C.Structure):
    _fields_ = [("last_q", C.c_int32), ("forced_columns", C.c_int32),
                ("forced_diagonals", C.c_int32), ("min_vertical", C.c_int32),
                ("min_slash", C.c_int32)]


class PrefillParams(C.Structure):
    _fields_ = [("softmax_scale", C.c_float), ("vs", VsParams), ("dense_below", C.c_int32)]


class Lib:
    def __init__(self, path):
        self.l = C.CDLL(path)
        l = self.l
        l.mi_context_default_params.restype = ContextParams
        l.mi_context_last_error.restype = C.c_char_p
        l.mi_status_name.restype = C.c_char_p
        l.mi_vs_default_params.restype = VsParams
        l.mi_prefill_default_params.restype = PrefillParams
        l.mi_head_pattern_default.restype = HeadPattern
        l.mi_vs_index_bytes.restype = C.c_size_t
        l.mi_sparse_index_bytes.restype = C.c_size_t
        l.mi_build_features.restype = C.c_char_p
        p = l.mi_context_default_params()
        p.device = MI_DEVICE_CUDA
        p.device_id = 0
        self.ctx = C.c_void_p()
        self.check(l.mi_context_create(C.byref(p), C.byref(self.ctx)), "context")
        stream = torch.cuda.current_stream().cuda_stream
        self.check(l.mi_context_set_stream(self.ctx, C.c_void_p(stream)), "stream")
        # the context's tuning as it was made (every field auto), to go back to after a variant;
        # kept as bytes, so that this binding needs no copy of the struct's layout
        self.default_tuning = C.create_string_buffer(4096)
        self.check(l.mi_context_get_tuning(self.ctx, self.default_tuning), "tuning")

    def set_tuning(self, spec):
        """The context's tuning: the defaults with spec (mi_tuning_parse's name=value,...)."""
        self.check(self.l.mi_context_set_tuning(self.ctx, self.default_tuning), "tuning")
        self.check(self.l.mi_context_parse_tuning(self.ctx, spec.encode()), f"tuning {spec}")

    def check(self, st, what):
        if st != 0:
            msg = self.l.mi_context_last_error(self.ctx).decode() if self.ctx else ""
            raise RuntimeError(f"{what}: {self.l.mi_status_name(st).decode()}: {msg}")


def parse_variants(specs):
    """The --variant arguments of the A/B scripts, NAME=TUNING (TUNING: the library's tuning as
    name=value[,name=value...], e.g. ws=sm90_sparse=1; NAME= for the defaults), as (name, tuning)
    pairs."""
    return [tuple(spec.split("=", 1)) if "=" in spec else (spec, "") for spec in specs]


@contextlib.contextmanager
def variant_tuning(lib, tuning):
    """The context's tuning of one variant for the block's calls, the defaults after it."""
    lib.set_tuning(tuning)
    try:
        yield
    finally:
        lib.set_tuning("")


def source_commit(lib=None):
    """The commit the measured library was built from: MI_COMMIT first, else what the library
    says (mi_build_commit, written at build time), else git (a copied tree may carry a stale
    .git, so git comes last)."""
    if os.environ.get("MI_COMMIT"):
        return os.environ["MI_COMMIT"]
    if lib is not None:
        try:
            fn = lib.l.mi_build_commit
            fn.restype = C.c_char_p
            commit = fn().decode()
            if commit != "unknown":
                return commit
        except AttributeError:  # a library older than mi_build_commit
            pass
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except Exception:  # noqa: BLE001
        return "unknown"


def tdesc(t):
    """[B, H, L, D] view of a torch tensor (any strides, D contiguous)."""
    assert t.dim() == 4 and t.stride(3) == 1
    d = Tensor()
    d.data = t.data_ptr()
    d.dtype = MI_DTYPE_BF16
    d.device = MI_DEVICE_CUDA
    for i in range(4):
        d.shape[i] = t.shape[i]
        d.stride[i] = t.stride(i)
    return d


def time_cuda(fn, reps, warmup=1, warm_s=0.2):
    """Median of reps timed calls, after warmup calls and at least warm_s seconds of calls: a
    GPU left idle while the inputs were made runs its first milliseconds at a lower clock, which
    a single warm-up call of a short kernel does not cover."""
    t0 = time.perf_counter()
    n = 0
    while n < warmup or time.perf_counter() - t0 < warm_s:
        fn()
        n += 1
        torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def kernel_name(event):
    """A profiler event's kernel name without its namespaces, template arguments and parameters."""
    return event.name.split("<")[0].split("(")[0].split("::")[-1]


def profile_kernels(fn, repeat, warm_s=0.2, name=kernel_name):
    """ms per call of each CUDA kernel fn launches (torch.profiler; named by name(event): by
    default templates and namespaces cut), averaged over repeat calls after at least warm_s
    seconds of calls, as time_cuda warms up."""
    from torch.profiler import ProfilerActivity, profile
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    while time.perf_counter() - t0 < warm_s:
        fn()
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeat):
            fn()
        torch.cuda.synchronize()
    total = collections.defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total[name(e)] += e.device_time_total / repeat / 1000
    return dict(total)


# the lengths the per-kernel tools (bs_estimate_kernels.py, vs_estimate_kernels.py) take by name
LENGTHS = {"128K": 131072, "512K": 524288, "1M": 1048576}


# ---------------------------------------------------------------------------------------------
# Index sets (BENCHMARKS.md)

def index_set(name, L, H, gen):
    """Per-head vertical columns and slash distances of the prescribed sets."""
    vs, ss = [], []
    for _ in range(H):
        if name in ("local", "mixed"):
            rnd = torch.randperm(max(L - 30, 1), generator=gen)[:970] + 30
            v = torch.cat([torch.arange(30), rnd])
        else:  # small
            rnd = torch.randperm(max(L - 30, 1), generator=gen)[:70] + 30
            v = torch.cat([torch.arange(30), rnd])
        if name == "local":
            s = torch.arange(min(6096, L))
        elif name == "mixed":
            rnd = torch.randperm(max(L - 4096, 1), generator=gen)[:2000] + 4096
            s = torch.cat([torch.arange(min(4096, L)), rnd])
        else:
            s = torch.arange(min(1024, L))
        v = v[v < L].unique()
        s = s[s < L].unique()
        vs.append(v.sort().values)
        ss.append(s.sort(descending=True).values)
    return vs, ss


def make_vs_index(lib, vs, ss):
    H = len(vs)
    mv = max(len(v) for v in vs)
    ms = max(len(s) for s in ss)
    n = lib.l.mi_vs_index_bytes(1, H, mv, ms)
    buf = torch.zeros(n // 4 + 64, dtype=torch.int32, device="cuda")
    idx = VsIndex()
    lib.check(lib.l.mi_vs_index_init(C.byref(idx), 1, H, mv, ms, C.c_void_p(buf.data_ptr()),
                                     C.c_size_t(n)), "vs index")
    host = torch.zeros(n // 4, dtype=torch.int32)
    for h in range(H):
        host[h] = len(vs[h])
        host[H + h] = len(ss[h])
        host[2 * H + h * mv: 2 * H + h * mv + len(vs[h])] = vs[h].int()
        o = 2 * H + H * mv + h * ms
        host[o: o + len(ss[h])] = ss[h].int()
    buf[: n // 4].copy_(host)
    return idx, buf, mv, ms


def make_sparse_index(lib, H, L, mb, mc):
    R = (L + 63) // 64
    n = lib.l.mi_sparse_index_bytes(1, H, R, mb, mc)
    buf = torch.empty(n // 4 + 64, dtype=torch.int32, device="cuda")
    idx = SparseIndex()
    lib.check(lib.l.mi_sparse_index_init(C.byref(idx), 1, H, R, mb, mc,
                                         C.c_void_p(buf.data_ptr()), C.c_size_t(n)), "sp index")
    return idx, buf


def effective_tflops(pairs, t_ms, D=128):
    """TFLOP/s of the (row, key) pairs a kernel computed in t_ms (QK^T and PV, D each)."""
    return 4.0 * D * pairs / t_ms / 1e9


def keys_visited(buf, H, L, mb, mc):
    """Sum over row blocks of 64 * (64 * block_count + column_count), i.e. (row, key) pairs
    the kernel computes (rows >= L excluded)."""
    R = (L + 63) // 64
    bc = buf[: H * R].view(H, R).long()
    cc = buf[H * R: 2 * H * R].view(H, R).long()
    rows = torch.full((R,), 64, dtype=torch.long, device=buf.device)
    rows[-1] = L - 64 * (R - 1)
    return int(((64 * bc + cc) * rows).sum().item())


# ---------------------------------------------------------------------------------------------

def qkv(H, Hk, L, D=128, seed=0, local=False):
    """Random N(0, 1) inputs; with local=True the first 32 dims of q and k carry a rotary-style
    position code (16 frequencies, periods 16 .. 64K), so q_i.k_j peaks at i = j and decays with
    the distance, as in real heads: the estimate then picks near diagonals."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(1, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, Hk, L, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(1, Hk, L, D, device="cuda", dtype=torch.bfloat16, generator=g)
    if local:
        pos = torch.arange(L, device="cuda", dtype=torch.float32)[:, None]
        w = 2 * math.pi / torch.logspace(math.log10(16), math.log10(65536), 16, device="cuda")
        ang = pos * w[None, :]
        code = torch.stack([torch.cos(ang), torch.sin(ang)], dim=-1).reshape(L, 32) * 2.6
        q[..., :32] = code.to(q.dtype)
        k[..., :32] = code.to(k.dtype)
    return q, k, v


def bench_dense(lib, L, H, Hk, reps, do_torch=True, D=128):
    q, k, v = qkv(H, Hk, L, D=D)
    o = torch.empty_like(q)
    dq, dk, dv, do_ = tdesc(q), tdesc(k), tdesc(v), tdesc(o)

    def ours():
        lib.check(lib.l.mi_attention_dense(lib.ctx, C.byref(dq), C.byref(dk), C.byref(dv), None,
                                           C.c_float(0), C.byref(do_), None), "dense")

    t_ours = time_cuda(ours, reps)
    res = {"L": L, "heads": H, "heads_kv": Hk, "ours_ms": t_ours}
    if D != 128:
        res["head_dim"] = D
    flops = 2.0 * L * L * D * H
    res["ours_tflops"] = flops / t_ours / 1e9
    if do_torch:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        ke = k.repeat_interleave(H // Hk, dim=1)
        ve = v.repeat_interleave(H // Hk, dim=1)
        ref = None
        for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                         ("flash", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel(be):
                    fn = lambda: F.scaled_dot_product_attention(q, ke, ve, is_causal=True)
                    t = time_cuda(fn, reps)
                    if ref is None:
                        ref = fn()
                res[name + "_ms"] = t
                res[name + "_tflops"] = flops / t / 1e9
            except Exception as e:  # noqa: BLE001 - report and go on
                res[name + "_error"] = str(e)[:200]
        if ref is not None:
            ours()
            torch.cuda.synchronize()
            res["max_abs_diff_vs_torch"] = float((o.float() - ref.float()).abs().max().item())
        del ke, ve
    for key in list(res):
        if key.endswith("_ms"):
            res[key.replace("_ms", "_ms_per_head")] = res[key] / H
    if "cudnn_ms" in res:
        res["ratio_to_cudnn"] = res["cudnn_ms"] / res["ours_ms"]
    return res


def sparse_case(lib, L, H, Hk, vs, ss, D=128):
    """Random inputs and the block index of per-head columns vs and distances ss: build() builds
    the index on the GPU, run() the sparse kernel on it; keys() the (row, key) pairs computed,
    once the index is built."""
    q, k, v = qkv(H, Hk, L, D=D, seed=2)
    o = torch.empty_like(q)
    vsi, vbuf, mv, ms = make_vs_index(lib, vs, ss)
    mb, mc = ms + 1, mv
    spi, sbuf = make_sparse_index(lib, H, L, mb, mc)
    dq, dk, dv, do_ = tdesc(q), tdesc(k), tdesc(v), tdesc(o)

    def build():
        lib.check(lib.l.mi_vs_build_index(lib.ctx, C.c_int64(L), None, C.byref(vsi),
                                          C.byref(spi)), "index")

    def run():
        lib.check(lib.l.mi_attention_sparse(lib.ctx, C.byref(dq), C.byref(dk), C.byref(dv), None,
                                            C.byref(spi), C.c_float(0), C.byref(do_), None),
                  "sparse")

    # the tensors the descriptors point to live as long as the functions that use them
    build.buffers = (vbuf, sbuf)
    run.buffers = (q, k, v, o, sbuf)
    return build, run, lambda: keys_visited(sbuf, H, L, mb, mc)


def bench_sparse(lib, L, H, Hk, name, reps, D=128):
    gen = torch.Generator().manual_seed(1)
    vs, ss = index_set(name, L, H, gen)
    build, run, keys = sparse_case(lib, L, H, Hk, vs, ss, D=D)
    t_idx = time_cuda(build, reps)
    t = time_cuda(run, reps)
    pairs = keys()
    res = {"L": L, "heads": H, "set": name, "kernel_ms": t, "kernel_ms_per_head": t / H,
           "index_ms": t_idx, "effective_tflops": effective_tflops(pairs, t, D),
           "keys_per_row": pairs / (H * L)}
    if D != 128:
        res["head_dim"] = D
    return res


# The original's Triton kernels on the same GPU, ms per head, kernel only (BENCHMARKS.md):
# block-sparse top-100 and A-shape with 128 sink keys and a 4096-key window.
ORIGINAL_MS = {("block_sparse", 131072): 1.39, ("block_sparse", 1048576): 17.0,
               ("a_shape", 131072): 0.94, ("a_shape", 1048576): 7.5}
BS_TOP_K, A_INIT, A_LOCAL = 100, 128, 4096


def a_shape_keys(L, n_init, n_local):
    """(row, key) pairs of A-shape attention, exactly: row i sees its window
    [max(0, i - n_local + 1), i] and the sinks [0, n_init) left of it."""
    i = torch.arange(L, dtype=torch.int64)
    lo = (i - n_local + 1).clamp(min=0)
    return int(((i + 1 - lo) + lo.clamp(max=n_init)).sum().item())


def pattern_timing(pattern, L, H, t, pairs):
    """A patterns row's timing fields: kernel time t (ms, all H heads) over (row, key) pairs,
    against the original kernel's time where BENCHMARKS.md has one."""
    orig = ORIGINAL_MS.get((pattern, L))
    return {"kernel_ms_per_head": t / H, "effective_tflops": effective_tflops(pairs, t),
            "keys_per_row": pairs / (H * L), "original_kernel_ms_per_head": orig,
            "speedup_vs_original": orig / (t / H) if orig else None}


def bench_block_sparse(lib, L, H, Hk, inputs, reps):
    """Block-sparse top-100 (spec: 64-row mean pooling, block-causal top-k): estimation and
    kernel timed apart. inputs "random" (scattered blocks) or "position-coded" (near-diagonal
    blocks, as real heads pick)."""
    q, k, v = qkv(H, Hk, L, seed=5, local=inputs == "position-coded")
    o = torch.empty_like(q)
    spi, sbuf = make_sparse_index(lib, H, L, BS_TOP_K, 1)
    top_k = (C.c_int32 * H)(*([BS_TOP_K] * H))
    dq, dk, dv, do_ = tdesc(q), tdesc(k), tdesc(v), tdesc(o)

    def est():
        lib.check(lib.l.mi_block_sparse_estimate(lib.ctx, C.byref(dq), C.byref(dk), None, top_k,
                                                 C.byref(spi)), "block-sparse estimate")

    def run():
        lib.check(lib.l.mi_attention_sparse(lib.ctx, C.byref(dq), C.byref(dk), C.byref(dv), None,
                                            C.byref(spi), C.c_float(0), C.byref(do_), None),
                  "sparse")

    t_est = time_cuda(est, reps)
    t = time_cuda(run, reps)
    return {"L": L, "heads": H, "pattern": "block_sparse", "top_k": BS_TOP_K, "inputs": inputs,
            "estimate_ms_per_head": t_est / H, "estimate_share": t_est / (t_est + t),
            **pattern_timing("block_sparse", L, H, t, keys_visited(sbuf, H, L, BS_TOP_K, 1))}


def bench_a_shape(lib, L, H, Hk, reps):
    """A-shape with 128 sinks and a 4096-key window; effective FLOPs count the exact keys."""
    q, k, v = qkv(H, Hk, L, seed=6)
    o = torch.empty_like(q)
    dq, dk, dv, do_ = tdesc(q), tdesc(k), tdesc(v), tdesc(o)

    def run():
        lib.check(lib.l.mi_attention_a_shape(lib.ctx, C.byref(dq), C.byref(dk), C.byref(dv),
                                             None, A_INIT, A_LOCAL, 0, C.c_float(0),
                                             C.byref(do_), None), "a-shape")

    t = time_cuda(run, reps)
    return {"L": L, "heads": H, "pattern": "a_shape", "n_init": A_INIT, "n_local": A_LOCAL,
            "inputs": "random",
            **pattern_timing("a_shape", L, H, t, H * a_shape_keys(L, A_INIT, A_LOCAL))}


def prefill_call(lib, q, k, v, o, H, dense_below, vsz=1000, ssz=6096, pattern=None):
    """A whole-layer prefill call on every head with one pattern: vertical-slash (vsz, ssz), or
    the HeadPattern `pattern`."""
    pats = (HeadPattern * H)()
    for h in range(H):
        if pattern is not None:
            pats[h] = pattern
            continue
        pats[h] = lib.l.mi_head_pattern_default(MI_PATTERN_VERTICAL_SLASH)
        pats[h].vertical_size = vsz
        pats[h].slash_size = ssz
    pp = lib.l.mi_prefill_default_params()
    pp.dense_below = dense_below
    dq, dk, dv, do_ = tdesc(q), tdesc(k), tdesc(v), tdesc(o)
    nbytes = C.c_size_t(0)
    lib.check(lib.l.mi_prefill_workspace_size(lib.ctx, C.byref(dq), C.byref(dk), pats,
                                              C.byref(pp), C.byref(nbytes)), "ws")
    ws = torch.empty(nbytes.value, dtype=torch.uint8, device="cuda")

    def run():
        lib.check(lib.l.mi_prefill_attention(lib.ctx, C.byref(dq), C.byref(dk), C.byref(dv),
                                             None, pats, C.byref(pp), C.byref(do_), None,
                                             C.c_void_p(ws.data_ptr()), nbytes), "prefill")
    return run, ws


def bench_estimation(lib, L, H, Hk, reps):
    q, k, v = qkv(H, Hk, L, seed=3, local=True)
    o = torch.empty_like(q)
    vsz = (C.c_int32 * H)(*([1000] * H))
    ssz = (C.c_int32 * H)(*([6096] * H))
    mv, ms = min(1000, L), min(6096, L)
    n = lib.l.mi_vs_index_bytes(1, H, mv, ms)
    buf = torch.empty(n // 4 + 64, dtype=torch.int32, device="cuda")
    vsi = VsIndex()
    lib.check(lib.l.mi_vs_index_init(C.byref(vsi), 1, H, mv, ms, C.c_void_p(buf.data_ptr()),
                                     C.c_size_t(n)), "vsi")
    spi, sbuf = make_sparse_index(lib, H, L, ms + 1, mv)
    dq, dk = tdesc(q), tdesc(k)
    vp = lib.l.mi_vs_default_params()

    def est():
        lib.check(lib.l.mi_vs_estimate(lib.ctx, C.byref(dq), C.byref(dk), None, vsz, ssz,
                                       C.byref(vp), C.c_float(0), C.byref(vsi)), "estimate")

    def build():
        lib.check(lib.l.mi_vs_build_index(lib.ctx, C.c_int64(L), None, C.byref(vsi),
                                          C.byref(spi)), "index")

    t_est = time_cuda(est, reps)
    t_idx = time_cuda(build, reps)
    # the index the prefill computes on: its (row, key) pairs, and the kernel's share of the time
    pairs = keys_visited(sbuf, H, L, ms + 1, mv)
    run, ws = prefill_call(lib, q, k, v, o, H, 0)
    t_pre = time_cuda(run, reps)
    t_kernel = t_pre - t_est - t_idx
    return {"L": L, "heads": H, "estimate_ms": t_est, "index_ms": t_idx, "prefill_ms": t_pre,
            "prefill_ms_per_head": t_pre / H,
            "estimate_index_share": (t_est + t_idx) / t_pre,
            "keys_per_row": pairs / (H * L),
            "kernel_effective_tflops": effective_tflops(pairs, t_kernel) if t_kernel > 0 else None,
            "note": "q/k random plus a rotary-style position code; the estimate keeps the near "
                    "diagonals and, beyond them, scattered ones: keys_per_row is the density of "
                    "the index the prefill computes on"}


def bench_crossover(lib, H, Hk, lengths, reps, D=128):
    rows = []
    for L in lengths:
        q, k, v = qkv(H, Hk, L, D=D, seed=4, local=True)
        o = torch.empty_like(q)
        run, ws = prefill_call(lib, q, k, v, o, H, 0)
        t_sparse = time_cuda(run, reps)
        dq, dk, dv, do_ = tdesc(q), tdesc(k), tdesc(v), tdesc(o)

        def dense():
            lib.check(lib.l.mi_attention_dense(lib.ctx, C.byref(dq), C.byref(dk), C.byref(dv),
                                               None, C.c_float(0), C.byref(do_), None), "dense")
        t_dense = time_cuda(dense, reps)
        rows.append({"L": L, "heads": H, "heads_kv": Hk, "head_dim": D,
                     "sparse_prefill_ms": t_sparse, "dense_ms": t_dense,
                     "speedup": t_dense / t_sparse})
        del ws
    cross = None
    for r in rows:
        if r["speedup"] > 1.0:
            cross = r["L"]
            break
    return rows, cross


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/libminference.so")
    ap.add_argument("--out", default="build/bench")
    ap.add_argument("--store", default=os.path.join(ROOT, "bench", "results.jsonl"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sections", default="dense,sparse,patterns,estimation,crossover")
    ap.add_argument("--tuning", default="",
                    help="the library's tuning, name=value,... (e.g. sm90=-1: the sm_80 kernels)")
    args = ap.parse_args()
    lib = Lib(os.path.abspath(args.lib))
    lib.set_tuning(args.tuning)
    sections = args.sections.split(",")
    now = datetime.datetime.now(datetime.timezone.utc)
    date = now.strftime("%Y-%m-%d")
    commit = source_commit(lib)
    res = {"date": date, "time": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
           "gpu": torch.cuda.get_device_name(0), "commit": commit,
           "torch": torch.__version__, "features": lib.l.mi_build_features().decode(),
           "dtype": "bf16", "head_dim": 128, "causal": True}
    # (L, H, Hk, reps): fewer heads at long L, per-head times reported
    if args.quick:
        shapes = [(32768, 32, 8, 5), (131072, 8, 2, 5)]
    else:
        shapes = [(32768, 32, 8, 7), (131072, 32, 8, 5), (524288, 4, 1, 3), (1048576, 1, 1, 2)]
    if "dense" in sections:
        res["dense"] = []
        for L, H, Hk, reps in shapes:
            r = bench_dense(lib, L, H, Hk, reps)
            print("dense", json.dumps(r), flush=True)
            res["dense"].append(r)
            torch.cuda.empty_cache()
    if "sparse" in sections:
        res["sparse"] = []
        for L, H, Hk, reps in shapes:
            for name in ("local", "mixed", "small"):
                r = bench_sparse(lib, L, max(H // 4, 1) if L >= 524288 else H, Hk, name,
                                 max(reps, 3))
                print("sparse", json.dumps(r), flush=True)
                res["sparse"].append(r)
                torch.cuda.empty_cache()
    if "patterns" in sections:
        res["patterns"] = []
        for L, H, Hk, reps in shapes:
            H1 = max(H // 4, 1) if L >= 524288 else H
            for r in (bench_block_sparse(lib, L, H1, Hk, "random", max(reps, 3)),
                      bench_block_sparse(lib, L, H1, Hk, "position-coded", max(reps, 3)),
                      bench_a_shape(lib, L, H1, Hk, max(reps, 3))):
                print("patterns", json.dumps(r), flush=True)
                res["patterns"].append(r)
                torch.cuda.empty_cache()
    if "estimation" in sections:
        res["estimation"] = []
        for L, H, Hk, reps in shapes:
            # at least 8 heads, so the per-call fixed costs are shared as in a real layer
            r = bench_estimation(lib, L, max(H, 8), max(Hk, 2), max(reps, 3))
            print("estimation", json.dumps(r), flush=True)
            res["estimation"].append(r)
            torch.cuda.empty_cache()
    if "crossover" in sections:
        lengths = [4096, 8192, 12288, 16384, 24576, 32768, 49152]
        rows, cross = bench_crossover(lib, 32, 8, lengths, 5)
        res["crossover"] = {"rows": rows, "first_length_sparse_wins": cross,
                            "pattern": "every head VS 1000/6096, estimation + index included, "
                                       "position-coded q/k (near and scattered diagonals "
                                       "estimated)"}
        for r in rows:
            print("crossover", json.dumps(r), flush=True)
    if "crossover-d64" in sections:
        # heads of 64 dimensions (SmolLM2's 9 / 3), whose dense and sparse kernels differ from
        # D = 128's
        lengths = [16384, 32768, 49152, 65536, 98304, 131072]
        rows, cross = bench_crossover(lib, 9, 3, lengths, 5, D=64)
        res["crossover_d64"] = {"rows": rows, "first_length_sparse_wins": cross,
                                "pattern": "every head VS 1000/6096, estimation + index "
                                           "included, position-coded q/k, D = 64, dense_below 0"}
        for r in rows:
            print("crossover-d64", json.dumps(r), flush=True)
    os.makedirs(args.out, exist_ok=True)
    tag = "-sm80path" if re.search(r"(^|,)sm90=(-1|off)(,|$)", args.tuning) else ""
    res["kernel_path"] = "sm80 mma.sync" if tag else "default (sm90a wgmma on Hopper)"
    path = os.path.join(args.out, f"{date}-gpu-attention{tag}.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    if args.store:
        rows = results.rows_of_run(dict(res, machine=results.host()))
        print(f"{args.store}: {results.append_rows(rows, args.store)} rows")
    plot(res, os.path.join(args.out, f"{date}-gpu-attention{tag}.png"))
    table(res)


def print_rows(rows, cols):
    """A right-aligned table: cols are (title, width, format, key of a row); a missing value
    prints as nan."""
    print(" ".join(f"{title:>{w}}" for title, w, _, _ in cols))
    for r in rows:
        print(" ".join(format(float("nan") if r.get(key) is None else r[key], f">{w}{spec}")
                       for _, w, spec, key in cols))


def table(res):
    print()
    print(f"{res['gpu']}  commit {res['commit']}  {res['features']}")
    if res.get("dense"):
        print_rows(res["dense"], [
            ("dense L", 9, "", "L"), ("H", 3, "", "heads"),
            ("ours ms/h", 10, ".3f", "ours_ms_per_head"), ("TF/s", 6, ".0f", "ours_tflops"),
            ("cuDNN ms/h", 11, ".3f", "cudnn_ms_per_head"), ("TF/s", 6, ".0f", "cudnn_tflops"),
            ("flash TF/s", 10, ".0f", "flash_tflops"), ("ours/cuDNN", 10, ".2f", "ratio_to_cudnn")])
    if res.get("sparse"):
        print_rows(res["sparse"], [
            ("sparse L", 9, "", "L"), ("set", 6, "", "set"),
            ("ms/head", 8, ".3f", "kernel_ms_per_head"), ("eff TF/s", 8, ".0f", "effective_tflops"),
            ("index ms", 9, ".3f", "index_ms"), ("keys/row", 8, ".0f", "keys_per_row")])
    if res.get("patterns"):
        print_rows(res["patterns"], [
            ("pattern L", 9, "", "L"), ("pattern", 12, "", "pattern"), ("inputs", 14, "", "inputs"),
            ("ms/head", 8, ".3f", "kernel_ms_per_head"), ("eff TF/s", 8, ".0f", "effective_tflops"),
            ("est ms/h", 8, ".3f", "estimate_ms_per_head"),
            ("est share", 9, ".3f", "estimate_share"),
            ("orig ms/h", 9, ".2f", "original_kernel_ms_per_head"),
            ("speed-up", 8, ".2f", "speedup_vs_original")])
    for r in res.get("estimation", []):
        kernel = r.get("kernel_effective_tflops")
        print(f"estimation L {r['L']} H {r['heads']}: estimate {r['estimate_ms']:.2f} ms, index "
              f"{r['index_ms']:.2f} ms, prefill {r['prefill_ms']:.2f} ms "
              f"({100 * r['estimate_index_share']:.1f} % estimation+index), "
              f"{r.get('keys_per_row', 0):.0f} keys/row"
              + (f", kernel {kernel:.0f} effective TF/s" if kernel else ""))
    if res.get("crossover"):
        c = res["crossover"]
        for r in c["rows"]:
            print(f"crossover L {r['L']:>6}: sparse prefill {r['sparse_prefill_ms']:.3f} ms, "
                  f"dense {r['dense_ms']:.3f} ms, speed-up {r['speedup']:.2f}")
        print(f"first length where sparse wins: {c['first_length_sparse_wins']}")


if __name__ == "__main__":
    sys.exit(main())
