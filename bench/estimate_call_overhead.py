#!/usr/bin/env python3
"""Where the time of one block-sparse estimate call goes beyond its kernels, on a GPU machine:

  estimate_call_overhead.py --lib build/libminference.so [--length 1M] [--inputs position-coded]

Prints, for mi_block_sparse_estimate (one head, top 100, the inputs of bench/torch_ref.py): the
host's time to issue a call (from an idle GPU), a call timed alone between two CUDA events (as
bench/torch_ref.py times it), calls back to back (the GPU never waits for the host), and each
kernel of three profiled calls with the gap before it. A lone call's excess over back to back is
the host's issue before the first kernel starts."""
import argparse
import ctypes as C
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import torch_ref as tr  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", default="build/libminference.so")
    ap.add_argument("--length", default="1M", choices=sorted(tr.LENGTHS))
    ap.add_argument("--inputs", default="position-coded", choices=["random", "position-coded"])
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    if args.calls < 1:
        ap.error("--calls must be at least 1")
    lib = tr.Lib(os.path.abspath(args.lib))
    L = tr.LENGTHS[args.length]
    q, k, _ = tr.qkv(1, 1, L, seed=5, local=args.inputs == "position-coded")
    spi, _buf = tr.make_sparse_index(lib, 1, L, tr.BS_TOP_K, 1)
    top_k = (C.c_int32 * 1)(tr.BS_TOP_K)
    dq, dk = tr.tdesc(q), tr.tdesc(k)

    def estimate():
        lib.check(lib.l.mi_block_sparse_estimate(lib.ctx, C.byref(dq), C.byref(dk), None, top_k,
                                                 C.byref(spi)), "mi_block_sparse_estimate")

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.3:  # a warm GPU, as bench/torch_ref.py times
        estimate()
        torch.cuda.synchronize()
    host = []
    for _ in range(args.calls):
        torch.cuda.synchronize()
        t = time.perf_counter()
        estimate()
        host.append(1e3 * (time.perf_counter() - t))
    torch.cuda.synchronize()
    alone = []
    for _ in range(args.calls):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        estimate()
        b.record()
        b.synchronize()
        alone.append(a.elapsed_time(b))
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(args.calls):
        estimate()
    b.record()
    b.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            estimate()
            torch.cuda.synchronize()
    kernels = sorted((e.time_range.start, e.time_range.end, tr.kernel_name(e))
                     for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    print(f"{torch.cuda.get_device_name()}  commit {tr.source_commit(lib)}  "
          f"{args.length} x 1 {args.inputs}, top {tr.BS_TOP_K}")
    print(f"host issue ms: median {statistics.median(host):.4f}, least {min(host):.4f}")
    print(f"a call alone ms (events): median {statistics.median(alone):.4f}")
    print(f"calls back to back ms a call: {a.elapsed_time(b) / args.calls:.4f}")
    prev = None
    for start, end, name in kernels:
        gap = "" if prev is None else f"  gap before {(start - prev) / 1000:.4f}"
        print(f"  {name:28s} {(end - start) / 1000:.4f} ms{gap}")
        prev = end


if __name__ == "__main__":
    main()
