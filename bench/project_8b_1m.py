#!/usr/bin/env python3
"""TTFT of the LLaMA-3-8B shape at 1M tokens on one GPU, projected from measured parts.

At 1M the 8B model's bf16 KV cache alone (32 layers x 2 x 8 heads x 128 x 1M x 2 bytes = 128 GiB)
plus its weights (15 GiB) exceed one H200, so the whole-model run stops at 128K. This combines:
  - the model runner at 128K (*-gpu-model-ttft-8b.json): GEMM time and the rest
    (norms, RoPE, embeddings) per token, which are linear in L, scaled by 8;
  - dense attention per layer at 1M measured on the kernels (*-ttft-8b-projection.json,
    bench/project_8b_ttft.py), times 32 layers;
  - minference attention per head at 1M from the kernel benchmark's whole-layer prefill
    (*-gpu-attention*.json, estimation + index + kernel, every head VS 1000/6096)
    on q/k without attention structure, so the estimated slash lines scatter (the pessimistic
    case), times 32 heads x 32 layers;
  - and, as a second minference row, attention per head at 1M from the kernel benchmark
    (*-gpu-attention.json): the sparse kernel on the `local` index set (slash
    lines near the diagonal, as real heads mostly have them) plus its index building and the
    estimation cost per head, times 32 heads x 32 layers.

The inputs are the runs' own JSON files, which bench/run_gpu_model.sh, bench/project_8b_ttft.py
and bench/torch_ref.py write (--results: the folder that holds them). The projection's rows are
appended to the results store (--store, default bench/results.jsonl; "" for none).

Usage: bench/project_8b_1m.py --results DIR [--store FILE]
"""
import argparse
import glob
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import results  # noqa: E402


def newest(pattern):
    files = sorted(glob.glob(pattern))
    if not files:
        raise SystemExit(f"no {pattern}")
    return files[-1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True)
    ap.add_argument("--store", default=os.path.join(ROOT, "bench", "results.jsonl"))
    a = ap.parse_args()
    kernel_f = newest(os.path.join(a.results, "*-ttft-8b-projection.json"))
    kernel = json.load(open(kernel_f))
    # runner rows at 128K: per method the fastest recorded run (the kernel the build ships)
    runner_rows, runner_files = {}, []
    for f in sorted(glob.glob(os.path.join(a.results, "*-gpu-model-ttft-8b*.json"))):
        run = json.load(open(f))
        runner_files.append(f)
        for e in run["rows"]:
            if e["tokens"] == 131072 and (e["method"] not in runner_rows or
                                          e["ttft_s"] < runner_rows[e["method"]][0]["ttft_s"]):
                runner_rows[e["method"]] = (e, run, f)
    if not runner_rows:
        raise SystemExit("no 8B runner rows at 128K")
    runner = next(iter(runner_rows.values()))[1]
    k1m = next(r for r in kernel["rows"] if r["L"] == 1048576)
    # the kernel benchmark of the shipped kernel: of the runs with sparse and estimation sections
    # (experiments excluded), the fastest on the 1M `local` set
    cands = []
    for f in glob.glob(os.path.join(a.results, "*-gpu-attention*.json")):
        d = json.load(open(f))
        if "sparse" in d and "estimation" in d and not d.get("experiment"):
            ms = next((r["kernel_ms_per_head"] for r in d["sparse"]
                       if r["L"] == 1048576 and r["set"] == "local"), None)
            if ms is not None:
                cands.append((ms, f, d))
    _, attn_f, att = min(cands)
    local = next(r for r in att["sparse"] if r["L"] == 1048576 and r["set"] == "local")
    est = next(r for r in att["estimation"] if r["L"] == 1048576)
    local_head_ms = (local["kernel_ms_per_head"] + local["index_ms"] / local["heads"] +
                     est["estimate_ms"] / est["heads"])
    table, numbers = [], []
    est1m = next(r for r in att["estimation"] if r["L"] == 1048576)
    per_layer_ms = {"dense": k1m["attn_dense_ms_per_layer"],
                    "minference": 32 * est1m["prefill_ms_per_head"],
                    "minference, local-structured heads": 32 * local_head_ms}
    for method in per_layer_ms:
        r, _, used_f = runner_rows[method.split(",")[0]]
        scale = 1048576 / r["tokens"]
        gemm, other = r["gemm_s"] * scale, r["other_s"] * scale
        attn = 32 * per_layer_ms[method] / 1e3
        table.append({"method": method,
                      "128K measured TTFT": f"{r['ttft_s']:.1f} s",
                      "1M GEMMs (x8)": f"{gemm:.1f} s",
                      "1M rest (x8)": f"{other:.1f} s",
                      "1M attention (32 x kernel)": f"{attn:.1f} s",
                      "1M TTFT projected": f"{gemm + other + attn:.1f} s"})
        numbers.append({"method": method, "ttft_128k_s": r["ttft_s"], "gemm_s": gemm,
                        "rest_s": other, "attention_s": attn, "ttft_s": gemm + other + attn})
    out = {"title": "Projected TTFT of the LLaMA-3-8B shape at 1M on one GPU (runner at 128K "
                    "scaled linearly + measured 1M attention kernels; the 1M KV cache does not "
                    "fit one H200)",
           "date": runner["date"], "gpu": runner.get("gpu", ""),
           "commit": runner.get("commit", ""), "inputs": runner_files + [kernel_f, attn_f],
           "local_structured_ms_per_head": local_head_ms,
           "model": "LLaMA-3-8B (random weights)", "projection_1m": numbers,
           "columns": list(table[0].keys()), "table": table}
    path = os.path.join(a.results, runner["date"][:10] + "-ttft-8b-1m-projection.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    for row in table:
        print(row)
    print("wrote", path)
    if a.store:
        rows = results.rows_of_run(dict(out, machine=results.host()))
        print(f"{a.store}: {results.append_rows(rows, a.store)} rows")


if __name__ == "__main__":
    main()
