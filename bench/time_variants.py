#!/usr/bin/env python3
"""Times kernel variants chosen by environment switches in one process, on the shapes of
bench/torch_ref.py (dense causal and the prescribed sparse index sets), for quick A/B runs during
kernel work; the full benchmark with its JSON stays bench/torch_ref.py.

  time_variants.py --lib build/libminference.so --variant sm90= --variant sm80=MI_CUDA_DISABLE_SM90=1
      [--shapes small] [--out results.json]

Each variant sets its variables (NAME=VALUE, comma-separated) before its timings and unsets them
after; the library reads them at every launch. cuDNN SDPA is timed once per dense shape."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import torch_ref as tr  # noqa: E402

DENSE = [(32768, 32, 8, 5), (131072, 8, 2, 5)]
SPARSE = [(131072, 8, 2, "local", 5), (131072, 8, 2, "mixed", 3), (131072, 8, 2, "small", 5),
          (1048576, 1, 1, "local", 3), (1048576, 1, 1, "small", 3)]
# --shapes small: one dense and three sparse shapes, for a last look when time is short
DENSE_SMALL = DENSE[:1]
SPARSE_SMALL = [SPARSE[0], SPARSE[2], SPARSE[3]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/libminference.so")
    ap.add_argument("--variant", action="append", required=True, help="name=VAR=VAL,VAR=VAL")
    ap.add_argument("--out")
    ap.add_argument("--shapes", default="all", choices=["all", "small"])
    args = ap.parse_args()
    dense, sparse = (DENSE, SPARSE) if args.shapes == "all" else (DENSE_SMALL, SPARSE_SMALL)
    lib = tr.Lib(os.path.abspath(args.lib))
    rows = []
    cudnn = {}
    for i, spec in enumerate(args.variant):
        name, _, env = spec.partition("=")
        sets = [kv.split("=", 1) for kv in env.split(",") if kv]
        for k, v in sets:
            os.environ[k] = v
        for L, H, Hk, reps in dense:
            r = tr.bench_dense(lib, L, H, Hk, reps, do_torch=(i == 0))
            if i == 0:
                cudnn[L] = r.get("cudnn_ms_per_head")
            r["cudnn_ms_per_head"] = cudnn.get(L)
            rows.append({"variant": name, "kind": "dense", **r})
            print(json.dumps(rows[-1]), flush=True)
            torch.cuda.empty_cache()
        for L, H, Hk, sname, reps in sparse:
            r = tr.bench_sparse(lib, L, H, Hk, sname, reps)
            rows.append({"variant": name, "kind": "sparse", **r})
            print(json.dumps(rows[-1]), flush=True)
            torch.cuda.empty_cache()
        for k, _ in sets:
            del os.environ[k]
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(0), "commit": tr.source_commit(),
                       "rows": rows}, f, indent=1)
    print(f"\n{'variant':>8} {'what':>14} {'ms/head':>9} {'TF/s':>6} {'cuDNN ms/h':>10} {'ratio':>6}")
    for r in rows:
        if r["kind"] == "dense":
            c = r.get("cudnn_ms_per_head")
            print(f"{r['variant']:>8} {'dense ' + str(r['L'] // 1024) + 'K':>14} "
                  f"{r['ours_ms_per_head']:>9.3f} {r['ours_tflops']:>6.0f} "
                  f"{c if c is None else round(c, 3)!s:>10} "
                  f"{'' if c is None else round(c / r['ours_ms_per_head'], 2)!s:>6}")
        else:
            print(f"{r['variant']:>8} {r['set'] + ' ' + str(r['L'] // 1024) + 'K':>14} "
                  f"{r['kernel_ms_per_head']:>9.3f} {r['effective_tflops']:>6.0f}")


if __name__ == "__main__":
    sys.exit(main())
