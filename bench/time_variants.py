#!/usr/bin/env python3
"""Times kernel variants chosen by the library's tuning in one process, on the shapes of
bench/torch_ref.py (dense causal and the prescribed sparse index sets), for quick A/B runs during
kernel work; the full benchmark with its JSON stays bench/torch_ref.py.

  time_variants.py --lib build/libminference.so --variant sm90= --variant sm80=sm90=-1
      [--shapes small|sparse|dense|block-sparse] [--head-dim 128|64] [--prefill L]
      [--out results.json]

Each variant sets the context's tuning (name=value, comma-separated: mi_tuning_parse) before its
timings and resets it to the defaults after. cuDNN SDPA is timed once per dense shape."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import torch_ref as tr  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "scripts"))
import results  # noqa: E402

DENSE = [(32768, 32, 8, 5), (131072, 8, 2, 5)]
SPARSE = [(131072, 8, 2, "local", 5), (131072, 8, 2, "mixed", 3), (131072, 8, 2, "small", 5),
          (1048576, 1, 1, "local", 3), (1048576, 1, 1, "small", 3)]
# --shapes small: one dense and three sparse shapes, for a last look when time is short
DENSE_SMALL = DENSE[:1]
SPARSE_SMALL = [SPARSE[0], SPARSE[2], SPARSE[3]]
# --shapes sparse: the three sets at 128K and 1M, no dense (for changes to the 64-row kernel)
SPARSE_ONLY = SPARSE[:4] + [(1048576, 1, 1, "mixed", 3), SPARSE[4]]
# --shapes dense: dense causal only, up to 512K (for changes to the dense kernel)
DENSE_ONLY = DENSE + [(524288, 2, 1, 2)]
# --shapes block-sparse: top-100 estimate and kernel on torch_ref.py's pattern shapes and inputs
# (for changes to the block-sparse estimate, e.g. --variant rows=bs_stream=-1)
# (1M x 32 heads: a whole layer's launch, where CTAs fill the GPU as they do in a model's prefill)
BLOCK_SPARSE = [(L, H, Hk, inputs) for L, H, Hk in ((131072, 32, 8), (524288, 1, 1),
                                                    (1048576, 1, 1), (1048576, 32, 8))
                for inputs in ("random", "position-coded")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/libminference.so")
    ap.add_argument("--variant", action="append", required=True, help="NAME=TUNING, e.g. ws=sm90_sparse=1,sm90_tma_store=-1")
    ap.add_argument("--out")
    ap.add_argument("--store", help="also append the rows to this results store "
                    "(bench/results.jsonl; see scripts/results.py)")
    ap.add_argument("--shapes", default="all",
                    choices=["all", "small", "sparse", "dense", "block-sparse"])
    ap.add_argument("--head-dim", type=int, default=128, choices=[64, 128],
                    help="head size of the dense and sparse shapes (the GQA ratios kept)")
    ap.add_argument("--prefill", type=int, default=0,
                    help="also time the whole-layer VS prefill (estimation included) at this L, "
                         "8 heads (torch_ref.py's estimation section)")
    args = ap.parse_args()
    dense, sparse = {"all": (DENSE, SPARSE), "small": (DENSE_SMALL, SPARSE_SMALL),
                     "sparse": ([], SPARSE_ONLY), "dense": (DENSE_ONLY, []),
                     "block-sparse": ([], [])}[args.shapes]
    block_sparse = BLOCK_SPARSE if args.shapes == "block-sparse" else []
    lib = tr.Lib(os.path.abspath(args.lib))
    rows = []
    cudnn = {}
    variants = tr.parse_variants(args.variant)

    def timed(sets, fn):
        """fn() under the variant's tuning; the defaults afterwards."""
        try:
            with tr.variant_tuning(lib, sets):
                return fn()
        finally:
            torch.cuda.empty_cache()

    # shape by shape, every variant in turn: a slow drift of the clocks then hits all variants
    # alike instead of the last one
    for L, H, Hk, reps in dense:
        for i, (name, sets) in enumerate(variants):
            r = timed(sets, lambda: tr.bench_dense(lib, L, H, Hk, reps, do_torch=(i == 0),
                                                   D=args.head_dim))
            if i == 0:
                cudnn[L] = r.get("cudnn_ms_per_head")
            r["cudnn_ms_per_head"] = cudnn.get(L)
            rows.append({"variant": name, "kind": "dense", **r})
            print(json.dumps(rows[-1]), flush=True)
    for L, H, Hk, sname, reps in sparse:
        for name, sets in variants:
            r = timed(sets, lambda: tr.bench_sparse(lib, L, H, Hk, sname, reps, D=args.head_dim))
            rows.append({"variant": name, "kind": "sparse", **r})
            print(json.dumps(rows[-1]), flush=True)
    for L, H, Hk, inputs in block_sparse:
        for name, sets in variants:
            r = timed(sets, lambda: tr.bench_block_sparse(lib, L, H, Hk, inputs, 3))
            rows.append({"variant": name, "kind": "block_sparse", **r})
            print(json.dumps(rows[-1]), flush=True)
    if args.prefill:
        for name, sets in variants:
            r = timed(sets, lambda: tr.bench_estimation(lib, args.prefill, 8, 2, 3))
            rows.append({"variant": name, "kind": "prefill", **r})
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(0), "commit": tr.source_commit(lib),
                       "head_dim": args.head_dim, "rows": rows}, f, indent=1)
    if args.store:
        run = {"gpu": torch.cuda.get_device_name(), "commit": tr.source_commit(lib),
               "machine": results.host()}
        rows_out = results.rows_of_variants(run, "variants",
                                            [dict(r, head_dim=args.head_dim) for r in rows])
        n = results.append_rows(rows_out, args.store)
        print(f"{args.store}: {n} rows")
    print(f"\n{'variant':>8} {'what':>14} {'ms/head':>9} {'TF/s':>6} {'cuDNN ms/h':>10} {'ratio':>6}")
    for r in rows:
        if r["kind"] == "dense":
            c = r.get("cudnn_ms_per_head")
            print(f"{r['variant']:>8} {'dense ' + str(r['L'] // 1024) + 'K':>14} "
                  f"{r['ours_ms_per_head']:>9.3f} {r['ours_tflops']:>6.0f} "
                  f"{c if c is None else round(c, 3)!s:>10} "
                  f"{'' if c is None else round(c / r['ours_ms_per_head'], 2)!s:>6}")
        elif r["kind"] == "sparse":
            print(f"{r['variant']:>8} {r['set'] + ' ' + str(r['L'] // 1024) + 'K':>14} "
                  f"{r['kernel_ms_per_head']:>9.3f} {r['effective_tflops']:>6.0f}")
        elif r["kind"] == "block_sparse":
            print(f"{r['variant']:>8} {'bs ' + str(r['L'] // 1024) + 'K':>14} "
                  f"{r['kernel_ms_per_head']:>9.3f} {r['effective_tflops']:>6.0f}  ({r['inputs']}, "
                  f"estimate {r['estimate_ms_per_head']:.4f} ms/head, "
                  f"{100 * r['estimate_share']:.1f} % of the total)")
        else:
            print(f"{r['variant']:>8} {'prefill ' + str(r['L'] // 1024) + 'K':>14} "
                  f"{r['prefill_ms_per_head']:>9.3f}  (layer {r['prefill_ms']:.1f} ms, "
                  f"{r['heads']} heads, estimate {r['estimate_ms']:.2f} ms, "
                  f"index {r['index_ms']:.2f} ms, {r.get('keys_per_row', 0):.0f} keys/row, "
                  f"kernel {r.get('kernel_effective_tflops') or 0:.0f} TF/s)")


if __name__ == "__main__":
    sys.exit(main())
