#!/usr/bin/env python3
"""The GPU attention plot: ms per head against sequence length (log-log) for dense (ours, cuDNN
and flash SDPA) and the sparse patterns, from bench/torch_ref.py runs. Needs matplotlib, not
torch, so that a plot can be drawn from the runs' JSON on any machine (dense from one run,
sparse from another):

  attention_plot.py --dense RUN.json [--sparse RUN.json] --out PLOT.png
"""
import argparse
import json


def plot(res, path):
    """Writes the plot of a run's dense, sparse and patterns sections to path; returns whether
    it could (False without matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001
        return False
    fig, ax = plt.subplots(figsize=(7, 5))
    d = res.get("dense", [])
    for key, lab in (("ours_ms_per_head", "minference dense"),
                     ("cudnn_ms_per_head", "SDPA cuDNN"), ("flash_ms_per_head", "SDPA flash")):
        pts = [(r["L"], r[key]) for r in d if key in r]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=lab)
    for name in ("local", "mixed", "small"):
        pts = [(r["L"], r["kernel_ms_per_head"]) for r in res.get("sparse", []) if r["set"] == name]
        if pts:
            ax.plot(*zip(*pts), marker="s", linestyle="--", label=f"minference VS {name}")
    for pat, inputs, lab in (("block_sparse", "random", "block-sparse top-100"),
                             ("a_shape", "random", "A-shape 128+4096")):
        pts = [(r["L"], r["kernel_ms_per_head"]) for r in res.get("patterns", [])
               if r["pattern"] == pat and r["inputs"] == inputs]
        if pts:
            ax.plot(*zip(*pts), marker="^", linestyle=":", label=f"minference {lab}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length")
    ax.set_ylabel("ms per head")
    ax.set_title(f"{res['gpu']}, bf16, D=128, causal")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def merged(dense_run, sparse_run=None):
    """A run with the dense section of dense_run and the sparse and patterns sections of
    sparse_run (dense_run's own where there is none)."""
    src = sparse_run or dense_run
    return {"gpu": dense_run["gpu"], "dense": dense_run.get("dense", []),
            "sparse": src.get("sparse", []), "patterns": src.get("patterns", [])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dense", required=True, help="results JSON with the dense section")
    ap.add_argument("--sparse", help="results JSON with the sparse and patterns sections")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(args.dense) as f:
        d = json.load(f)
    s = None
    if args.sparse:
        with open(args.sparse) as f:
            s = json.load(f)
    if not plot(merged(d, s), args.out):
        raise SystemExit("attention_plot.py: matplotlib is not installed")


if __name__ == "__main__":
    main()
