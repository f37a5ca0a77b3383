#!/usr/bin/env python3
"""Per-kernel GPU times of the vertical-slash estimate and index build (mi_vs_estimate with
budgets 1000 / 6096, then mi_vs_build_index), from torch.profiler, per shape and variant, on the
inputs of bench/torch_ref.py's estimation section (q and k random plus a rotary-style position
code, GQA 4:1). For work on those kernels, where bench/torch_ref.py gives only each call's total:

  vs_estimate_kernels.py --lib build/libminference.so --variant new= \\
      --variant old=vs_index_shortcuts=-1 [--shapes 128K:32,1M:8] [--out times.json]

Each variant sets the context's tuning (name=value, comma-separated: mi_tuning_parse) before its
timings and resets it to the defaults after. Prints one line per shape and variant: each
kernel's time in ms for all heads (the two score passes apart), averaged over --repeat calls
after a warm-up, and whether the variant's vertical-slash lists and block index equal the first
variant's, bit for bit. --save writes the first variant's lists and index per shape to a file,
--against compares with such a file (another build's, say); the diagonal sums add across chunk
edges in any order, so near-ties may differ between runs of one build, by a few words.

--sets local,mixed,small times the index build alone on the prescribed index sets of
BENCHMARKS.md instead (torch_ref.index_set, the sparse benchmark's lists), per shape and variant:
the median of 10 calls (torch_ref.time_cuda), and whether the index equals the first variant's."""
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

V_BUDGET, S_BUDGET = 1000, 6096


def kernel_pass_name(event):
    """torch_ref.kernel_name, with the score kernels' pass (their last template argument)
    appended: both passes are one kernel template."""
    base = tr.kernel_name(event)
    if base.startswith("vs_scores") and "<" in event.name:
        last = event.name.split("<", 1)[1].split(">", 1)[0].split(",")[-1].strip()
        return f"{base}.pass{last}"
    return base


def parse_shapes(text):
    shapes = []
    for item in text.split(","):
        name, _, heads = item.strip().partition(":")
        if name not in tr.LENGTHS:
            raise ValueError(f"unknown length {name!r}; one of {', '.join(tr.LENGTHS)}")
        h = int(heads) if heads else 8
        if h < 1:
            raise ValueError(f"heads must be at least 1 in {item!r}")
        shapes.append((tr.LENGTHS[name], h))
    return shapes


def index_on_sets(lib, shapes, names, variants):
    """The index build alone on the prescribed sets: ms for all heads per shape, set and
    variant, and whether each variant's index equals the first variant's."""
    rows = []
    for L, H in shapes:
        for name in names:
            gen = torch.Generator().manual_seed(1)
            vs, ss = tr.index_set(name, L, H, gen)
            vsi, vbuf, mv, ms = tr.make_vs_index(lib, vs, ss)
            spi, sbuf = tr.make_sparse_index(lib, H, L, ms + 1, mv)

            def build():
                lib.check(lib.l.mi_vs_build_index(lib.ctx, C.c_int64(L), None, C.byref(vsi),
                                                  C.byref(spi)), "index")

            first = None
            for vname, sets in variants:
                sbuf.fill_(-7)
                with tr.variant_tuning(lib, sets):
                    t = tr.time_cuda(build, 10)
                torch.cuda.synchronize()
                same = True if first is None else bool(torch.equal(first, sbuf))
                if first is None:
                    first = sbuf.clone()
                rows.append({"L": L, "heads": H, "set": name, "variant": vname,
                             "index_ms_all_heads": t, "same_as_first": same})
                print(f"{L // 1024}K x{H} {name:5s} {vname:10s} index {t:.3f} ms"
                      f"{'' if same else '  DIFF'}", flush=True)
            del vbuf, sbuf, first
            torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", default="build/libminference.so")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=TUNING (name=value,...); NAME= for the defaults (repeatable)")
    ap.add_argument("--shapes", default="128K:32,1M:8",
                    help="LENGTH:HEADS items, comma-separated (lengths 128K, 512K, 1M)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", help="also write the times as JSON here")
    ap.add_argument("--store", help="also append the rows to this results store "
                    "(bench/results.jsonl; see scripts/results.py)")
    ap.add_argument("--save", help="write the first variant's lists and index here (torch.save)")
    ap.add_argument("--against", help="compare the first variant's with those --save wrote")
    ap.add_argument("--sets", help="time the index build on these prescribed sets instead "
                                   "(local, mixed, small; comma-separated)")
    args = ap.parse_args()
    variants = tr.parse_variants(args.variant or ["default="])
    try:
        shapes = parse_shapes(args.shapes)
    except ValueError as e:
        ap.error(str(e))
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    lib = tr.Lib(os.path.abspath(args.lib))
    if args.sets:
        names = args.sets.split(",")
        bad = [n for n in names if n not in ("local", "mixed", "small")]
        if bad:
            ap.error(f"unknown set {bad[0]!r}; one of local, mixed, small")
        rows = index_on_sets(lib, shapes, names, variants)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"gpu": torch.cuda.get_device_name(), "commit": tr.source_commit(lib),
                           "timing": "median of 10 calls (torch_ref.time_cuda)",
                           "rows": rows}, f, indent=1)
        if args.store:
            run = {"gpu": torch.cuda.get_device_name(), "commit": tr.source_commit(lib),
                   "machine": results.host()}
            rows_out = results.rows_of_variants(run, "vs-index-sets", rows)
            n = results.append_rows(rows_out, args.store)
            print(f"{args.store}: {n} rows")
        return
    saved = {}
    against = torch.load(args.against) if args.against else {}
    rows = []
    for L, H in shapes:
        Hk = max(1, H // 4)
        q, k, _ = tr.qkv(H, Hk, L, seed=3, local=True)
        vsz = (C.c_int32 * H)(*([V_BUDGET] * H))
        ssz = (C.c_int32 * H)(*([S_BUDGET] * H))
        mv, ms = min(V_BUDGET, L), min(S_BUDGET, L)
        n = lib.l.mi_vs_index_bytes(1, H, mv, ms)
        vbuf = torch.empty(n // 4 + 64, dtype=torch.int32, device="cuda")
        vsi = tr.VsIndex()
        lib.check(lib.l.mi_vs_index_init(C.byref(vsi), 1, H, mv, ms,
                                         C.c_void_p(vbuf.data_ptr()), C.c_size_t(n)), "vsi")
        spi, sbuf = tr.make_sparse_index(lib, H, L, ms + 1, mv)
        dq, dk = tr.tdesc(q), tr.tdesc(k)
        vp = lib.l.mi_vs_default_params()

        def call():
            lib.check(lib.l.mi_vs_estimate(lib.ctx, C.byref(dq), C.byref(dk), None, vsz, ssz,
                                           C.byref(vp), C.c_float(0), C.byref(vsi)), "estimate")
            lib.check(lib.l.mi_vs_build_index(lib.ctx, C.c_int64(L), None, C.byref(vsi),
                                              C.byref(spi)), "index")

        first = None
        for name, sets in variants:
            vbuf.fill_(-7)
            sbuf.fill_(-7)
            with tr.variant_tuning(lib, sets):
                times = tr.profile_kernels(call, args.repeat, name=kernel_pass_name)
            torch.cuda.synchronize()
            result = torch.cat([vbuf[: n // 4], sbuf])
            differ = 0 if first is None else int((result != first).sum().item())
            if first is None:
                first = result
                saved[f"{L}x{H}"] = result.cpu()
                ref = against.get(f"{L}x{H}")
                if ref is not None:
                    other = int((result.cpu() != ref).sum().item()) if ref.shape == \
                        result.shape else -1
                    print(f"{L // 1024}K x{H} {name}: {other} words differ from {args.against}"
                          " (-1: another size)", flush=True)
            rows.append({"L": L, "heads": H, "heads_kv": Hk, "variant": name,
                         "ms_all_heads": times, "total_ms": sum(times.values()),
                         "words_differing_from_first": differ})
            print(f"{L // 1024}K x{H} {name:10s} {'same' if differ == 0 else f'DIFF {differ}':>10s}"
                  f" total={sum(times.values()):.3f} "
                  + "  ".join(f"{kn}={t:.3f}" for kn, t in times.items()), flush=True)
        del q, k, first, result, vbuf, sbuf
        torch.cuda.empty_cache()
    if args.save:
        torch.save(saved, args.save)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "commit": tr.source_commit(lib),
                       "budgets": [V_BUDGET, S_BUDGET],
                       "inputs": "q/k random plus a rotary-style position code (torch_ref.qkv "
                                 "seed 3, local=True)", "rows": rows}, f, indent=1)
    if args.store:
        run = {"gpu": torch.cuda.get_device_name(), "commit": tr.source_commit(lib),
               "machine": results.host()}
        rows_out = results.rows_of_variants(run, "vs-estimate-kernels", rows)
        n = results.append_rows(rows_out, args.store)
        print(f"{args.store}: {n} rows")


if __name__ == "__main__":
    main()
