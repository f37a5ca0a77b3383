#!/usr/bin/env python3
"""Where each sparse pattern starts to pay on the GPU: the whole-layer prefill of one pattern on
every head (dense_below = 0: estimation and index included) against mi_attention_dense, per
length, head count and head dimension. The rule of src/cuda/dense_fallback.h is drawn from these
numbers, and tests/cuda/test_dense_fallback.c checks it against the JSON this writes (kept in
tests/data/crossover). The rows also go to the results store (--store, default
bench/results.jsonl; "" for none).

  crossover_patterns.py --lib build/libminference.so [--head-dim 128] [--heads 4/1,32/8]
      [--patterns a_shape:128+3968,block_sparse:100,vertical_slash:1000+6096]
      [--lengths 2048,4096,...] [--reps 7] [--default] [--out results.json] [--store FILE]

Patterns: a_shape:INIT+LOCAL, tri_shape:INIT+LOCAL+LAST, block_sparse:TOP_K,
vertical_slash:VERTICAL+SLASH. --default also times the library's own choice (dense_below < 0),
which should never be much slower than dense. Inputs: position-coded q/k (torch_ref.qkv with
local=True), so the estimates pick near diagonals and blocks, as real heads do."""
import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import ctypes as C  # noqa: E402

import results  # noqa: E402

import torch  # noqa: E402

import torch_ref as tr  # noqa: E402

TYPES = {"a_shape": 1, "tri_shape": 2, "vertical_slash": 3, "block_sparse": 4}
FIELDS = {"a_shape": ("n_init", "n_local"), "tri_shape": ("n_init", "n_local", "n_last"),
          "block_sparse": ("top_k",), "vertical_slash": ("vertical_size", "slash_size")}
DEFAULT_PATTERNS = ("a_shape:128+3968,a_shape:64+960,tri_shape:128+3968+100,block_sparse:100,"
                    "block_sparse:25,vertical_slash:1000+6096")
DEFAULT_LENGTHS = "2048,3072,4096,6144,8192,12288,16384,24576,32768,40960,49152,65536"


def parse_pattern(lib, text):
    """'a_shape:128+3968' -> (its label, a HeadPattern)."""
    name, _, sizes = text.partition(":")
    if name not in TYPES:
        raise SystemExit(f"unknown pattern {name!r}; one of {', '.join(TYPES)}")
    values = [int(x) for x in sizes.split("+")] if sizes else []
    if len(values) != len(FIELDS[name]):
        raise SystemExit(f"{name} takes {'+'.join(FIELDS[name])}, got {sizes!r}")
    p = lib.l.mi_head_pattern_default(TYPES[name])
    for field, value in zip(FIELDS[name], values):
        setattr(p, field, value)
    return f"{name} {'+'.join(map(str, values))}", p


def parse_heads(text):
    out = []
    for item in text.split(","):
        h, _, hk = item.partition("/")
        out.append((int(h), int(hk or h)))
    return out


def measure(lib, H, Hk, D, L, pattern, reps, with_default):
    q, k, v = tr.qkv(H, Hk, L, D=D, seed=4, local=True)
    o = torch.empty_like(q)
    run, ws = tr.prefill_call(lib, q, k, v, o, H, 0, pattern=pattern)
    row = {"sparse_ms": tr.time_cuda(run, reps)}
    del ws
    if with_default:
        run, ws = tr.prefill_call(lib, q, k, v, o, H, -1, pattern=pattern)
        row["default_ms"] = tr.time_cuda(run, reps)
        del ws
    dq, dk, dv, do_ = tr.tdesc(q), tr.tdesc(k), tr.tdesc(v), tr.tdesc(o)

    def dense():
        lib.check(lib.l.mi_attention_dense(lib.ctx, C.byref(dq), C.byref(dk), C.byref(dv), None,
                                           C.c_float(0), C.byref(do_), None), "dense")
    row["dense_ms"] = tr.time_cuda(dense, reps)
    row["speedup"] = row["dense_ms"] / row["sparse_ms"]
    if with_default:
        row["default_speedup"] = row["dense_ms"] / row["default_ms"]
    return row


def first_win(rows):
    """The first length from which sparse is faster than dense at every longer length measured."""
    win = None
    for r in sorted(rows, key=lambda r: r["L"]):
        if r["speedup"] > 1.0:
            win = r["L"] if win is None else win
        else:
            win = None
    return win


def commit(lib):
    """The commit the library was built from (what ran, whatever the checkout holds)."""
    lib.l.mi_build_commit.restype = C.c_char_p
    return lib.l.mi_build_commit().decode()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", default="build/libminference.so")
    ap.add_argument("--head-dim", type=int, default=128, choices=(64, 128))
    ap.add_argument("--heads", default="4/1,32/8", help="query/KV head counts, comma-separated")
    ap.add_argument("--patterns", default=DEFAULT_PATTERNS)
    ap.add_argument("--lengths", default=DEFAULT_LENGTHS)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--default", action="store_true", help="also time dense_below < 0")
    ap.add_argument("--max-ms", type=float, default=60.0,
                    help="skip longer lengths of a pattern once its dense time passes this")
    ap.add_argument("--out", default=None)
    ap.add_argument("--store", default=os.path.join(ROOT, "bench", "results.jsonl"))
    args = ap.parse_args()

    lib = tr.Lib(args.lib)
    patterns = [parse_pattern(lib, t) for t in args.patterns.split(",")]
    lengths = [int(x) for x in args.lengths.split(",")]
    res = {"experiment": "sparse prefill against dense per pattern, length and head count (the "
                         "crossovers of src/cuda/dense_fallback.h)",
           "date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(0),
           "commit": commit(lib),
           "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("MI_")},
           "dtype": "bf16", "head_dim": args.head_dim,
           "inputs": "position-coded q/k (bench/torch_ref.py qkv(local=True), seed 4)",
           "timing": f"median of {args.reps} after at least 0.2 s of warm-up calls; sparse = "
                     "mi_prefill_attention with dense_below = 0 (estimation and index "
                     "included), default = dense_below -1, dense = mi_attention_dense",
           "rows": []}
    t0 = time.time()
    for H, Hk in parse_heads(args.heads):
        for label, pattern in patterns:
            for L in lengths:
                r = measure(lib, H, Hk, args.head_dim, L, pattern, args.reps, args.default)
                row = {"heads": H, "heads_kv": Hk, "head_dim": args.head_dim, "L": L,
                       "pattern": label, **r}
                res["rows"].append(row)
                print(json.dumps(row), f"({time.time() - t0:.0f} s)", flush=True)
                torch.cuda.empty_cache()
                if r["dense_ms"] > args.max_ms:
                    break
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    if args.store:
        rows = results.rows_of_run(dict(res, machine=results.host()))
        print(f"{args.store}: {results.append_rows(rows, args.store)} rows")
    print(f"\n{'heads':>6} {'pattern':<24} {'sparse pays from':>16}  speed-ups (dense / sparse)")
    for H, Hk in parse_heads(args.heads):
        for label, _ in patterns:
            rows = [r for r in res["rows"] if (r["heads"], r["heads_kv"], r["pattern"]) ==
                    (H, Hk, label)]
            ups = " ".join(f"{r['L'] // 1024}K:{r['speedup']:.2f}" for r in rows)
            win = first_win(rows)
            print(f"{H:>3}/{Hk:<2} {label:<24} {str(win):>16}  {ups}")
    if args.default:
        worst = min(res["rows"], key=lambda r: r["default_speedup"])
        print(f"library default against dense, worst: {worst['default_speedup']:.2f}x "
              f"({worst['heads']}/{worst['heads_kv']} heads, {worst['pattern']}, L {worst['L']})")


if __name__ == "__main__":
    main()
