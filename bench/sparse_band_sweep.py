#!/usr/bin/env python3
"""Band-width sweep of the sparse kernels, for kernel work on a GPU machine.

Each index set is a band of slash distances 0..W-1 per head, optionally with random vertical
columns (as the benchmark's sets draw them), timed with each kernel path chosen by the library's
tuning (as in time_variants.py). Time against band width separates what a shared 128-key tile
costs from what each 128-row work item costs; the sets with columns show what gathered or copied
columns cost against range keys; --full-band (W = L: every tile shared, no columns) compares the
sparse kernel's per-tile rate with the dense kernel's on the same work, in the same process.

  sparse_band_sweep.py --lib build/libminference.so
      [--variant ws=sm90_sparse=1 --variant ring=sm90_sparse=-1]
      [--full-band] [--rounds 2] [--out results.json]

Variants are timed in turn for each set, --rounds times, so that a slow drift of the clocks hits
them alike. Two builds are compared by running this once per build, alternately."""
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

# (L, heads, band W, vertical columns)
SWEEP = [(131072, 8, w, 0) for w in (512, 1024, 2048, 4096, 8192)] + \
        [(131072, 8, 1024, 100), (131072, 8, 1024, 1000), (131072, 8, 6096, 0),
         (131072, 8, 6096, 1000),
         (1048576, 1, 1024, 0), (1048576, 1, 1024, 100), (1048576, 1, 6096, 0),
         (1048576, 1, 6096, 1000)]
FULL_BAND = [(32768, 32, 32768, 0), (131072, 8, 16384, 0), (131072, 8, 131072, 0)]


def band_sets(L, H, band, columns, gen):
    """Per head: `columns` vertical columns (0..29 and random others, ascending) and the slash
    distances 0..band-1 (descending)."""
    vs, ss = [], []
    for _ in range(H):
        first = torch.arange(min(30, columns))
        rnd = torch.randperm(max(L - 30, 1), generator=gen)[:max(columns - 30, 0)] + 30
        v = torch.cat([first, rnd]) if columns else torch.zeros(0, dtype=torch.long)
        vs.append(v[v < L].unique().sort().values)
        ss.append(torch.arange(min(band, L)).sort(descending=True).values)
    return vs, ss


def time_set(lib, L, H, band, columns, variants, reps):
    """TFLOP/s (effective) and ms per head of each variant on one set."""
    gen = torch.Generator().manual_seed(1)
    vs, ss = band_sets(L, H, band, columns, gen)
    build, run, keys = tr.sparse_case(lib, L, H, max(1, H // 4), vs, ss)
    build()
    pairs = keys()
    out = {"L": L, "heads": H, "band": band, "columns": columns, "keys_per_row": pairs / (H * L)}
    for name, sets in variants:
        with tr.variant_tuning(lib, sets):
            t = tr.time_cuda(run, reps)
        out[name] = {"ms_per_head": t / H, "tflops": tr.effective_tflops(pairs, t)}
    del build, run, keys
    torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/libminference.so")
    ap.add_argument("--variant", action="append", help="NAME=TUNING (name=value,...)")
    ap.add_argument("--full-band", action="store_true",
                    help="the full-band sets against the dense kernel instead of the sweep")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out")
    ap.add_argument("--store", help="also append the rows to this results store "
                    "(bench/results.jsonl; see scripts/results.py)")
    args = ap.parse_args()
    specs = args.variant or ["ws=sm90_sparse=1", "ring=sm90_sparse=-1"]
    variants = tr.parse_variants(specs)
    lib = tr.Lib(os.path.abspath(args.lib))
    rows = []
    for rnd in range(args.rounds):
        dense_done = set()
        for L, H, band, columns in (FULL_BAND if args.full_band else SWEEP):
            if args.full_band and L not in dense_done:  # the dense kernel, once per length
                dense_done.add(L)
                d = tr.bench_dense(lib, L, H, max(1, H // 4), 5, do_torch=False)
                rows.append({"kind": "dense", "round": rnd, "L": L, "heads": H,
                             "tflops": d["ours_tflops"], "ms_per_head": d["ours_ms_per_head"]})
                print(f"dense L={L} {d['ours_tflops']:.0f} TFLOP/s", flush=True)
            r = time_set(lib, L, H, band, columns, variants, 5 if L < 500000 else 3)
            rows.append({"kind": "sparse", "round": rnd, **r})
            print(f"L={L} band={band} columns={columns} keys/row={r['keys_per_row']:.0f} " +
                  " ".join(f"{n}={r[n]['tflops']:.0f}" for n, _ in variants), flush=True)
    # one entry a variant: {variant, shape..., ms_per_head, tflops}
    flat = [dict({k: v for k, v in r.items() if not isinstance(v, dict)}, variant=n, **r[n])
            if n in r else dict(r, variant="dense kernel")
            for r in rows for n in ([n for n, _ in variants] if r["kind"] == "sparse" else [0])]
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(0), "commit": tr.source_commit(lib),
                       "variants": specs, "rows": rows}, f, indent=1)
    if args.store:
        run = {"gpu": torch.cuda.get_device_name(), "commit": tr.source_commit(lib),
               "machine": results.host()}
        rows_out = results.rows_of_variants(run, "band-sweep", flat)
        n = results.append_rows(rows_out, args.store)
        print(f"{args.store}: {n} rows")


if __name__ == "__main__":
    sys.exit(main())
