#!/usr/bin/env python3
"""TTFT of an 8B-shaped LLaMA (32 layers, 32/8 heads, D = 128, hidden 4096, FFN 14336) on one
GPU, projected from measured parts: one layer's projection and MLP GEMMs (bf16, torch.matmul,
cuBLAS) and one layer's attention through libminference (dense, and every head vertical-slash
1000/6096 with estimation), times 32 layers. Norms, RoPE and the LM head (last position only)
are left out; they are a few percent. GEMM time is linear in L, so 1M is projected from the
measured 128K GEMMs; attention is measured at each length (fewer heads at 1M, scaled to 32).

Appends its rows to the results store (--store, default bench/results.jsonl; "" for none) and
writes the run's JSON to --out (default build/bench), which bench/project_8b_1m.py reads.

Usage: project_8b_ttft.py --lib build/libminference.so [--out DIR] [--store FILE]
"""
import argparse
import datetime
import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import results  # noqa: E402
from torch_ref import Lib, prefill_call, qkv, source_commit, time_cuda  # noqa: E402

HIDDEN, FFN, HQ, HKV, D, LAYERS = 4096, 14336, 32, 8, 128, 32


def gemm_layer_ms(L, reps):
    """One layer's GEMMs at L tokens: fused QKV, O, gate+up, down."""
    x = torch.randn(L, HIDDEN, device="cuda", dtype=torch.bfloat16)
    w_qkv = torch.randn(HIDDEN, (HQ + 2 * HKV) * D, device="cuda", dtype=torch.bfloat16) * 0.02
    w_o = torch.randn(HQ * D, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.02
    w_gu = torch.randn(HIDDEN, 2 * FFN, device="cuda", dtype=torch.bfloat16) * 0.02
    w_d = torch.randn(FFN, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.02

    def run():
        a = x @ w_qkv
        b = x @ w_o
        h = x @ w_gu
        c = h[:, :FFN] @ w_d
        return a, b, c

    ms = time_cuda(run, reps)
    flops = 2.0 * L * (HIDDEN * (HQ + 2 * HKV) * D + HQ * D * HIDDEN + HIDDEN * 2 * FFN +
                       FFN * HIDDEN)
    return ms, flops / (ms * 1e-3) / 1e12


def attention_layer_ms(lib, L, heads, reps):
    hkv = max(1, heads * HKV // HQ)
    q, k, v = qkv(heads, hkv, L, seed=5, local=True)
    o = torch.empty_like(q)
    dense, _ws1 = prefill_call(lib, q, k, v, o, heads, dense_below=1 << 30)
    sparse, _ws2 = prefill_call(lib, q, k, v, o, heads, dense_below=0)
    scale = HQ / heads
    return time_cuda(dense, reps) * scale, time_cuda(sparse, reps) * scale


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--out", default="build/bench")
    ap.add_argument("--store", default=os.path.join(ROOT, "bench", "results.jsonl"))
    a = ap.parse_args()
    lib = Lib(a.lib)
    g128, tflops = gemm_layer_ms(131072, 3)
    rows = []
    for L, heads, reps in ((131072, 32, 3), (1048576, 4, 2)):
        att_dense, att_sparse = attention_layer_ms(lib, L, heads, reps)
        gemm = g128 * L / 131072
        rows.append({
            "L": L, "attention_heads_measured": heads,
            "gemm_ms_per_layer": gemm, "gemm_measured_at": 131072, "gemm_tflops": tflops,
            "attn_dense_ms_per_layer": att_dense, "attn_minference_ms_per_layer": att_sparse,
            "ttft_dense_s": LAYERS * (gemm + att_dense) / 1e3,
            "ttft_minference_s": LAYERS * (gemm + att_sparse) / 1e3,
            "attention_share_minference": att_sparse / (gemm + att_sparse),
        })
    res = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "gpu": torch.cuda.get_device_name(), "commit": source_commit(lib),
           "model_shape": "LLaMA-3-8B (random weights)",
           "shape": {"layers": LAYERS, "hidden": HIDDEN, "ffn": FFN, "heads": HQ, "kv_heads": HKV,
                     "head_dim": D, "dtype": "bf16", "batch": 1},
           "what": "projected TTFT = 32 x (measured layer GEMMs + measured layer attention)",
           "inputs": "attention on q/k with a rotary-style position code (near and scattered "
                     "diagonals estimated)",
           "rows": rows}
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, datetime.date.today().isoformat() + "-ttft-8b-projection.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print("L        GEMM/layer  attn dense  attn minf  TTFT dense  TTFT minf  attn share")
    for r in rows:
        print(f"{r['L']:>8} {r['gemm_ms_per_layer']:9.1f}ms {r['attn_dense_ms_per_layer']:9.1f}ms "
              f"{r['attn_minference_ms_per_layer']:9.1f}ms {r['ttft_dense_s']:9.1f}s "
              f"{r['ttft_minference_s']:9.1f}s {100 * r['attention_share_minference']:8.1f}%")
    print(f"GEMM rate {tflops:.0f} TFLOP/s; wrote {path}")
    if a.store:
        rows = results.rows_of_run(dict(res, machine=results.host()))
        print(f"{a.store}: {results.append_rows(rows, a.store)} rows")


if __name__ == "__main__":
    main()
