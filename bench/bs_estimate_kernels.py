#!/usr/bin/env python3
"""Per-kernel GPU times of the block-sparse estimate (mi_block_sparse_estimate, top 100), from
torch.profiler, per shape, input and variant, on the inputs of bench/torch_ref.py (random, and
position-coded: near-diagonal blocks score highest). For work on the estimate's kernels, where
bench/time_variants.py --shapes block-sparse gives only the estimate's total:

  bs_estimate_kernels.py --lib build/libminference.so --variant new= \\
      --variant ntile=bs_mask_append=-1 [--shapes 512K,1M] [--heads 1] [--out times.json]

Each variant sets the context's tuning (name=value, comma-separated: mi_tuning_parse) before its
timings and resets it to the defaults after. Prints one line per shape, input and variant: each
kernel's time in ms for all heads, averaged over --repeat calls after one warm-up call, and
whether the variant's whole index equals the first variant's, bit for bit (variants that score
with the same sums must agree exactly)."""
import argparse
import ctypes as C
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import torch_ref as tr  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "scripts"))
import results  # noqa: E402


def kernel_times(lib, dq, dk, top_k, spi, repeat, warm_s=0.2):
    """ms per call of each CUDA kernel the estimate launches."""
    def estimate():
        lib.check(lib.l.mi_block_sparse_estimate(lib.ctx, C.byref(dq), C.byref(dk), None, top_k,
                                                 C.byref(spi)), "mi_block_sparse_estimate")
    return tr.profile_kernels(estimate, repeat, warm_s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", default="build/libminference.so")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=TUNING (name=value,...); NAME= for the defaults (repeatable)")
    ap.add_argument("--shapes", default="512K,1M", help="lengths: 128K, 512K, 1M (comma-separated)")
    ap.add_argument("--heads", type=int, default=1, help="query heads (KV heads: heads / 4 or 1)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", help="also write the times as JSON here")
    ap.add_argument("--store", help="also append the rows to this results store "
                    "(bench/results.jsonl; see scripts/results.py)")
    ap.add_argument("--save-index", metavar="DIR",
                    help="also save the first variant's index of each shape and input in DIR "
                         "(index-<L>-<inputs>.pt: block counts and offsets as one int32 tensor), "
                         "to compare builds")
    args = ap.parse_args()
    variants = tr.parse_variants(args.variant or ["default="])
    try:
        lengths = [tr.LENGTHS[s.strip()] for s in args.shapes.split(",")]
    except KeyError as e:
        ap.error(f"unknown length {e}; one of {', '.join(tr.LENGTHS)}")
    if args.heads < 1 or args.repeat < 1:
        ap.error("--heads and --repeat must be at least 1")
    lib = tr.Lib(os.path.abspath(args.lib))
    H = args.heads
    Hk = max(1, H // 4)
    rows = []
    for L in lengths:
        for inputs in ("random", "position-coded"):
            q, k, _ = tr.qkv(H, Hk, L, seed=5, local=inputs == "position-coded")
            spi, buf = tr.make_sparse_index(lib, H, L, tr.BS_TOP_K, 1)
            top_k = (C.c_int32 * H)(*([tr.BS_TOP_K] * H))
            dq, dk = tr.tdesc(q), tr.tdesc(k)
            first = None
            for name, sets in variants:
                buf.fill_(-7)
                with tr.variant_tuning(lib, sets):
                    times = kernel_times(lib, dq, dk, top_k, spi, args.repeat)
                torch.cuda.synchronize()
                index = buf.clone()
                differ = 0 if first is None else int((index != first).sum().item())
                if first is None:
                    first = index
                    if args.save_index:
                        os.makedirs(args.save_index, exist_ok=True)
                        torch.save(index.cpu(), os.path.join(args.save_index,
                                                             f"index-{L}-{inputs}.pt"))
                rows.append({"L": L, "heads": H, "inputs": inputs, "variant": name,
                             "ms_all_heads": times, "index_words_differing_from_first": differ})
                print(f"{L // 1024}K x{H} {inputs:14s} {name:10s} "
                      f"{'same' if differ == 0 else f'DIFF {differ}':>10s} "
                      + "  ".join(f"{n}={t:.3f}" for n, t in times.items()), flush=True)
            del q, k, first, index
            torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "commit": tr.source_commit(lib),
                       "rows": rows}, f, indent=1)
    if args.store:
        run = {"gpu": torch.cuda.get_device_name(), "commit": tr.source_commit(lib),
               "machine": results.host()}
        rows_out = results.rows_of_variants(run, "bs-estimate-kernels", rows)
        n = results.append_rows(rows_out, args.store)
        print(f"{args.store}: {n} rows")


if __name__ == "__main__":
    main()
