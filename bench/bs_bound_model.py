#!/usr/bin/env python3
"""A CPU model of the block-sparse estimate's bound and streaming appends (src/cuda/bs_estimate.cu),
for planning changes to its two select kernels without a GPU.

Rows of pooled scores are drawn as bench/torch_ref.py draws its inputs (random, or position-coded
so that near-diagonal blocks score highest), and for each sampled row block the model computes:
  - the bound: the k-th largest of the group maxima of the row's tiles, cut to its top 16 bits,
    with the groups laid out as bs_bound_kernel lays them (G groups a 64-key tile, at most
    `slots` maxima a row);
  - the keys that reach it (the streaming kernel's appends if it never compacted);
  - the streaming walk itself: tiles from the diagonal down, n-tiles of 8 keys, a compaction to
    the top k before an n-tile whenever more than CAP - 8 candidates are held, the threshold
    raised to the k-th kept; appends and compactions counted.
The variants: the kernels' bound (512 slots), 256, 1024 or 2048 slots (finer groups, had the maxima
room), 1024 slots of 8-bit codes (the 64 KB of 512 16-bit ones) over a window of 16-bit keys placed
from the tiles nearest the diagonal, 512 slots with 32 groups in the 4 or 8 tiles nearest the
diagonal and the rest shared by the others, and bounds taken from every s-th tile only (what a
cheaper first pass of a one-pass design would see). Counts only, no times.

With --scores, the bound of the estimate through scores in memory instead (bs_row_select_kernel,
over every key of the row, the forced ones included) and how many keys reach it: a row with more
than `--cap` of them (512 there) cannot select from its listed keys alone. Variants: its 16
adjacent keys a group, 8 adjacent keys, 16 keys four apart within a tile, 16 keys 32 apart over a
score CTA's 512 keys, the top 2 of each 16-key group, and what the kernel now does: the top 2 as
their upper 16 bits (the group summaries), alone and with the second bound of rows past the cap
(the k-th largest of the first cap keys reaching the first bound); and, for keys kept as their top
16 bits only, how many keys share the k-th key's 16 bits (those whose exact scores a select would
need again). --all-rows samples the short rows too.

  bs_bound_model.py [--lengths 128K,1M] [--rows 48] [--top-k 100] [--cap 128] [--scores]
                    [--all-rows] [--out model.json]
"""
import argparse
import json
import math
import sys
import time

import numpy as np
import torch

LENGTHS = {"128K": 131072, "512K": 524288, "1M": 1048576}
FORCED_BLOCK0 = 0xFF7FFFFF  # block 0's rank key, float_order_key(FLT_MAX); the diagonal's is ~0
D = 128


def pooled(L, inputs, seed):
    """Pooled q and k (R x D, rounded to bf16 as the estimate pools them) for torch_ref's inputs:
    N(0, 1) values, pooled over 64 rows (drawn directly as N(0, 1/64)); position-coded inputs
    carry torch_ref's rotary-style code in their first 32 dimensions."""
    R = (L + 63) // 64
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(R, D, generator=g) / 8.0
    k = torch.randn(R, D, generator=g) / 8.0
    if inputs == "position-coded":
        pos = torch.arange(R * 64, dtype=torch.float64)[:, None]
        w = 2 * math.pi / torch.logspace(math.log10(16), math.log10(65536), 16,
                                         dtype=torch.float64)
        ang = pos * w[None, :]
        code = torch.stack([torch.cos(ang), torch.sin(ang)], dim=-1).reshape(R * 64, 32) * 2.6
        code = code.to(torch.bfloat16).to(torch.float32).reshape(R, 64, 32).mean(dim=1)
        q[:, :32] = code
        k[:, :32] = code
    return q.to(torch.bfloat16).float(), k.to(torch.bfloat16).float()


def order_key(f):
    """float32 -> uint32 keys in float order (as float_order_key)."""
    b = np.ascontiguousarray(f, dtype=np.float32).view(np.uint32)
    return np.where(b >> 31 != 0, ~b, b | np.uint32(0x80000000)).astype(np.uint32)


def row_keys(q, kk, m):
    """Order keys of row block m's scores against blocks 0 .. 64 (m // 64 + 1) - 1, as the
    kernels rank them: 0 past the diagonal (and past the sequence), the diagonal and block 0
    forced on top."""
    R = q.shape[0]
    n = (m // 64 + 1) * 64
    s = (q[m] @ kk[: min(n, R)].T).numpy()
    keys = np.zeros(n, dtype=np.uint32)
    keys[: len(s)] = order_key(s)
    keys[m + 1:] = 0
    keys[m] = 0xFFFFFFFF
    keys[0] = FORCED_BLOCK0
    return keys


def group_of_key():
    """Group index of each of a tile's 64 keys for G groups (bsb_group_max's layout): key
    8 nt + 2 t + e of lane t; G >= 4: lane t's runs of 32 / G n-tiles; G = 2: lane pairs."""
    out = {}
    nt, t, e = np.meshgrid(np.arange(8), np.arange(4), np.arange(2), indexing="ij")
    q = (8 * nt + 2 * t + e).ravel()
    for G in (1, 2, 4, 8, 16, 32):
        if G >= 4:
            grp = t * (G // 4) + nt // (32 // G)
        elif G == 2:
            grp = t // 2
        else:
            grp = np.zeros_like(t)
        arr = np.empty(64, dtype=np.int64)
        arr[q] = grp.ravel()
        out[G] = arr
    return out


GROUPS = group_of_key()


def bound_of(keys, n_tiles, k, slots, every, near=0, bits=16, below=255):
    """The bound x (a 32-bit order key, low 16 bits 0) for a row: the k-th largest group maximum
    over tiles n_tiles - 1 .. 0 (those with (top - it) % every == 0), G as large as the slots
    allow; with near > 0, the `near` tiles nearest the diagonal take 32 groups each and the
    others share what slots are left. bits = 8: each maximum kept as an 8-bit code over a window
    of 255 16-bit keys whose top lies 255 - below keys above the largest plain key of the two
    tiles nearest the diagonal (a maximum above the window counts as its top, one below it as
    nothing: never more than the true maximum, so the bound holds). keys: order keys of j = 0 .. 64 n_tiles - 1 (0 past the row's
    diagonal, the forced ones on top). Returns x, the groups per tile (near, rest) and the tiles
    scanned."""
    top = n_tiles - 1
    tiles = [it for it in range(top, -1, -1) if (top - it) % every == 0]
    near = min(near, len(tiles))
    rest = len(tiles) - near
    G = 32
    while G > 1 and rest * G > slots - 32 * near:
        G //= 2
    maxima = []
    for i, it in enumerate(tiles):
        g = 32 if i < near else G
        kt = keys[64 * it: 64 * it + 64]
        mx = np.zeros(g, dtype=np.uint32)
        np.maximum.at(mx, GROUPS[g], kt)
        maxima.append(mx)
    allm = np.concatenate(maxima)
    if bits == 8:
        first = keys[max(64 * (top - 1), 0): 64 * top + 64]
        first = first[(first > 0) & (first < FORCED_BLOCK0)]
        if len(first) == 0:
            return 0, (32 if near else G, G), len(tiles)
        base = (int(first.max()) >> 16) - below
        code = np.clip((allm >> 16).astype(np.int64) - base, 0, 255)
        allm = np.where(code > 0, (base + code) << 16, 0).astype(np.uint32)
    allm = np.sort(allm)[::-1]
    kth = allm[k - 1] if len(allm) >= k else np.uint32(0)
    return int(kth) & 0xFFFF0000, (32 if near else G, G), len(tiles)


def walk(cand, k, cap, thr):
    """The streaming walk over one row's candidates (uint64, index = block, 0 where none),
    n-tiles of 8 from the top down; returns appends and compactions."""
    held = []
    appends = compactions = 0
    n = len(cand)
    for hi in range(n, 0, -8):
        if len(held) > cap - 8:
            held.sort(reverse=True)
            held = held[:k]
            thr = held[-1]
            compactions += 1
        piece = cand[max(hi - 8, 0):hi]
        new = piece[piece > thr]
        appends += len(new)
        held.extend(int(c) for c in new)
    return appends, compactions


def model(L, inputs, rows, k, cap, seed):
    q, kk = pooled(L, inputs, seed)
    R = q.shape[0]
    ms = np.unique(np.linspace(R // 2, R - 1, rows).astype(np.int64))
    # (name, slots, every s-th tile, nearest tiles at 32 groups, bits a maximum, 8-bit window:
    # 16-bit keys below the nearest tiles' largest)
    variants = [("bound, 512 slots", 512, 1, 0, 16, 0), ("bound, 256 slots", 256, 1, 0, 16, 0),
                ("bound, 1024 slots", 1024, 1, 0, 16, 0),
                ("bound, 2048 slots", 2048, 1, 0, 16, 0),
                ("1024 of 8 bits, 255 below", 1024, 1, 0, 8, 255),
                ("1024 of 8 bits, 191 below", 1024, 1, 0, 8, 191),
                ("512, nearest 4 tiles at 32", 512, 1, 4, 16, 0),
                ("512, nearest 8 tiles at 32", 512, 1, 8, 16, 0),
                ("bound from every 2nd tile", 512, 2, 0, 16, 0),
                ("bound from every 4th tile", 512, 4, 0, 16, 0),
                ("bound from every 8th tile", 512, 8, 0, 16, 0), ("no bound", 0, 0, 0, 16, 0)]
    acc = {v[0]: {"reach": [], "appends": [], "compactions": [], "G": set(), "tiles": []}
           for v in variants}
    exact_reach = []
    for m in ms:
        m = int(m)
        keys = row_keys(q, kk, m)
        n_tiles = len(keys) // 64
        j = np.arange(64 * n_tiles)
        cand = (keys.astype(np.uint64) << np.uint64(32)) | (~j.astype(np.uint64) & 0xFFFFFFFF)
        cand[j > m] = 0
        plain = keys[1:m]
        kth = np.sort(plain)[::-1][k - 3] if m - 1 >= k - 2 else 0
        exact_reach.append(int((plain >= kth).sum()))
        for name, slots, every, near, bits, below in variants:
            if slots and near and n_tiles - near > slots - 32 * near:
                continue  # the far tiles would not have a slot each
            if slots:
                x, G, nt = bound_of(keys, n_tiles, k, slots, every, near, bits, below)
                thr = (x << 32) - 1 if x > 0 else 0
                acc[name]["G"].add(G)
                acc[name]["tiles"].append(nt / n_tiles)
                acc[name]["reach"].append(int((plain >= x).sum()))
            else:
                thr = 0
                acc[name]["reach"].append(m - 1)
            a, c = walk(cand, k, cap, thr)
            acc[name]["appends"].append(a)
            acc[name]["compactions"].append(c)
    out = []
    for name, *_ in variants:
        r = acc[name]
        if not r["appends"]:
            continue
        out.append({"variant": name,
                    "groups_per_tile": sorted({f"{a}/{b}" if a != b else str(a)
                                               for a, b in r["G"]}),
                    "share_of_tiles_scanned": float(np.mean(r["tiles"])) if r["tiles"] else 0.0,
                    "keys_reaching_bound_mean": float(np.mean(r["reach"])),
                    "keys_reaching_bound_p90": float(np.percentile(r["reach"], 90)),
                    "appends_mean": float(np.mean(r["appends"])),
                    "compactions_mean": float(np.mean(r["compactions"]))})
    return {"L": L, "inputs": inputs, "rows": len(ms), "top_k": k, "cap": cap,
            "keys_at_or_above_kth_mean": float(np.mean(exact_reach)), "variants": out}


def scores_bound(keys, k, grouping):
    """The scores path's bound for one row: keys (order keys of j = 0 .. 64 n_tiles - 1, 0 past
    the diagonal) grouped by `grouping`; the k-th largest of the groups' maxima (or of the union
    of each group's top 2)."""
    n = len(keys)
    j = np.arange(n)
    if grouping == "16 adjacent":
        grp, top = j // 16, 1
    elif grouping == "8 adjacent":
        grp, top = j // 8, 1
    elif grouping == "16 four apart in a tile":
        grp, top = (j // 64) * 4 + j % 4, 1
    elif grouping == "16 32 apart in 512 keys":
        grp, top = (j // 512) * 32 + j % 32, 1
    else:  # "top 2 of 16 adjacent", and the kernel's summaries: their upper 16 bits
        grp, top = j // 16, 2
    order = np.lexsort((-keys.astype(np.int64), grp))
    g_sorted = grp[order]
    first = np.r_[True, g_sorted[1:] != g_sorted[:-1]]
    rank = np.arange(n) - np.maximum.accumulate(np.where(first, np.arange(n), 0))
    vals = np.sort(keys[order][rank < top])[::-1]
    if grouping.startswith("summaries"):
        # bsr_summary_bound: the k-th largest nonzero upper 16 bits, shifted back
        vals = vals[(vals >> 16) > 0] >> 16
        return int(vals[k - 1]) << 16 if len(vals) >= k else 0
    return int(vals[k - 1]) if len(vals) >= k else 0


def raised_bound(keys, m, k, cap, x):
    """bs_row_select_kernel's second bound where more than cap keys reach x: the k-th largest of
    the first cap of them in ascending order (k distinct keys reach it)."""
    reach = keys[: m + 1][keys[: m + 1] >= x]
    if len(reach) <= cap or k > cap:
        return x
    return max(x, int(np.sort(reach[:cap])[::-1][k - 1]))


SCORE_GROUPINGS = ["16 adjacent", "8 adjacent", "16 four apart in a tile",
                   "16 32 apart in 512 keys", "top 2 of 16 adjacent",
                   "summaries (16-bit top 2)", "summaries, raised"]


def model_scores(L, inputs, rows, k, cap, seed, all_rows):
    """Keys reaching the scores path's bound per sampled row, per grouping."""
    q, kk = pooled(L, inputs, seed)
    R = q.shape[0]
    ms = np.unique(np.linspace(k if all_rows else R // 2, R - 1, rows).astype(np.int64))
    acc = {g: [] for g in SCORE_GROUPINGS}
    bucket = []
    for m in ms:
        m = int(m)
        keys = row_keys(q, kk, m)
        for g in SCORE_GROUPINGS:
            if g == "summaries, raised":
                x = raised_bound(keys, m, k, cap, scores_bound(keys, k, g))
            else:
                x = scores_bound(keys, k, g)
            acc[g].append(int((keys[: m + 1] >= x).sum()))
        kth = np.sort(keys[: m + 1])[::-1][k - 1]
        bucket.append(int(((keys[: m + 1] >> 16) == (kth >> 16)).sum()))
    out = [{"grouping": g, "keys_reaching_bound_mean": float(np.mean(v)),
            "keys_reaching_bound_p90": float(np.percentile(v, 90)),
            "rows_past_cap": float(np.mean(np.array(v) > cap))} for g, v in acc.items()]
    return {"L": L, "inputs": inputs, "rows": len(ms), "top_k": k, "cap": cap, "groupings": out,
            "keys_sharing_kth_top16_mean": float(np.mean(bucket)),
            "keys_sharing_kth_top16_max": int(np.max(bucket))}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="128K,1M", help="128K, 512K, 1M (comma-separated)")
    ap.add_argument("--rows", type=int, default=48, help="row blocks sampled per length and input")
    ap.add_argument("--top-k", type=int, default=100)
    ap.add_argument("--cap", type=int, default=128, help="candidate slots per row")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--scores", action="store_true",
                    help="model the scores path's bound (bs_row_select_kernel) instead")
    ap.add_argument("--all-rows", action="store_true",
                    help="with --scores, sample row blocks from k on (default: the second half)")
    ap.add_argument("--out", help="also write the results as JSON here")
    args = ap.parse_args()
    try:
        lengths = [LENGTHS[s.strip()] for s in args.lengths.split(",")]
    except KeyError as e:
        ap.error(f"unknown length {e}; one of {', '.join(LENGTHS)}")
    if args.rows < 1 or not 3 <= args.top_k <= args.cap - 9:
        ap.error("--rows must be at least 1 and --top-k between 3 and --cap - 9")
    results = []
    if args.scores:
        for L in lengths:
            for inputs in ("random", "position-coded"):
                r = model_scores(L, inputs, args.rows, args.top_k, args.cap, args.seed,
                                 args.all_rows)
                results.append(r)
                print(f"L {L // 1024}K {inputs}: {r['rows']} rows, top {r['top_k']}, cap "
                      f"{r['cap']}; keys sharing the k-th key's top 16 bits: mean "
                      f"{r['keys_sharing_kth_top16_mean']:.1f}, max "
                      f"{r['keys_sharing_kth_top16_max']}", flush=True)
                print(f"  {'grouping':26s} {'reach':>8s} {'p90':>8s} {'past cap':>9s}")
                for g in r["groupings"]:
                    print(f"  {g['grouping']:26s} {g['keys_reaching_bound_mean']:8.0f} "
                          f"{g['keys_reaching_bound_p90']:8.0f} {g['rows_past_cap']:9.2f}",
                          flush=True)
        lengths = []
    for L in lengths:
        for inputs in ("random", "position-coded"):
            t0 = time.time()
            r = model(L, inputs, args.rows, args.top_k, args.cap, args.seed)
            results.append(r)
            print(f"L {L // 1024}K {inputs}: {r['rows']} rows, keys at or above the k-th "
                  f"{r['keys_at_or_above_kth_mean']:.0f} ({time.time() - t0:.0f} s)", flush=True)
            print(f"  {'variant':28s} {'G':>6s} {'tiles':>6s} {'reach':>8s} {'p90':>8s} "
                  f"{'appends':>8s} {'compact':>8s}")
            for v in r["variants"]:
                print(f"  {v['variant']:28s} {','.join(v['groups_per_tile']):>6s} "
                      f"{v['share_of_tiles_scanned']:6.2f} {v['keys_reaching_bound_mean']:8.0f} "
                      f"{v['keys_reaching_bound_p90']:8.0f} {v['appends_mean']:8.0f} "
                      f"{v['compactions_mean']:8.1f}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"what": __doc__.split("\n\n")[0], "seed": args.seed, "results": results},
                      f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
