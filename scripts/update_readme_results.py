#!/usr/bin/env python3
"""Regenerates the Performance section of README.md from bench/results/*.json.

Each results file is one benchmark run; the newest run of each kind (CPU attention, GPU attention,
model TTFT, accuracy) fills its table, and the GPU plot is redrawn from the runs behind the GPU
tables (bench/attention_plot.py; with matplotlib installed, else the plot is left as it is).
Run after adding results: scripts/update_readme_results.py
"""
import glob
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def load_runs():
    runs = []
    for path in sorted(glob.glob(os.path.join(ROOT, "bench", "results", "*.json"))):
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            print(f"skipping {path}: {e}", file=sys.stderr)
            continue
        if isinstance(data, dict) and data.get("experiment"):
            continue  # a dev/ kernel's run: not what the library ships
        if isinstance(data, dict):
            data["_file"] = os.path.relpath(path, ROOT)
            runs.append(data)
    return runs


def length(L):
    """32K, 128K, 1M: the way the benchmarks name lengths."""
    return f"{L // 1048576}M" if L % 1048576 == 0 else f"{L // 1024}K"


def fmt(x, spec):
    return format(x, spec) if isinstance(x, (int, float)) else "-"


def pct(x):
    """A fraction as a percentage with one decimal; - where there is none."""
    return f"{100 * x:.1f} %" if isinstance(x, (int, float)) else "-"


def times(x):
    """A speed-up factor as 1.23x; - where there is none."""
    return f"{x:.2f}x" if isinstance(x, (int, float)) else "-"


def bench_runs(runs, device):
    """`minference bench --json` runs on that device (runs before --device were on the CPU)."""
    return [r for r in runs if "sgemm_gflops" in r and "results" in r and
            r.get("device", "cpu") == device]


def cpu_table(runs):
    cpu = bench_runs(runs, "cpu")
    if not cpu:
        return []
    out = []
    for r in sorted(cpu, key=lambda r: (r.get("len", 0), r.get("date", ""))):
        out.append(f"**CPU, L = {r['len']}**, {r.get('heads', 1)} head(s), D = {r.get('dim')}, "
                   f"{r.get('dtype')}, {r.get('threads')} threads on {r.get('machine', '?')} "
                   f"({r.get('date', '?')[:10]}, `{r['_file']}`). OpenBLAS sgemm: "
                   f"{fmt(r['sgemm_gflops'], '.1f')} GFLOP/s in the same run.")
        out.append("")
        out.append("| method | ms | speed-up | density | recall | rel. error | GFLOP/s |")
        out.append("|---|---|---|---|---|---|---|")
        for e in r["results"]:
            out.append(f"| {e['method']} | {fmt(e.get('ms'), '.1f')} | "
                       f"{fmt(e.get('speedup'), '.2f')}x | {fmt(e.get('density'), '.4f')} | "
                       f"{fmt(e.get('recall'), '.4f')} | {fmt(e.get('rel_err'), '.2e')} | "
                       f"{fmt(e.get('gflops'), '.1f')} |")
        out.append("")
    return out


def cli_gpu_table(runs):
    """`minference bench --device cuda` runs: times for all heads, error against dense."""
    out = []
    newest = {}  # the latest run of each shape: an older one describes kernels since replaced
    for r in bench_runs(runs, "cuda"):
        shape = (r.get("len", 0), r.get("heads", 0), r.get("kv_heads"), r.get("dim"),
                 r.get("dtype"), bool(r.get("metrics")))
        if shape not in newest or r.get("date", "") >= newest[shape].get("date", ""):
            newest[shape] = r
    for r in sorted(newest.values(), key=lambda r: (r.get("len", 0), r.get("heads", 0))):
        out.append(f"**GPU, `minference bench --device cuda`, L = {r['len']}**, "
                   f"{r.get('heads', 1)} query / {r.get('kv_heads', r.get('heads', 1))} KV "
                   f"head(s), D = {r.get('dim')}, {r.get('dtype')}, {r.get('gpu', '?')} "
                   f"({r.get('date', '?')[:10]}, commit {r.get('commit', '?')}, "
                   f"`{r['_file']}`). Times for all heads, estimation and index included.")
        out.append("")
        out.append("| method | ms | speed-up | density | recall | rel. error | TFLOP/s |")
        out.append("|---|---|---|---|---|---|---|")
        for e in r["results"]:
            tf = e.get("gflops")
            out.append(f"| {e['method']} | {fmt(e.get('ms'), '.2f')} | "
                       f"{fmt(e.get('speedup'), '.2f')}x | {fmt(e.get('density'), '.4f')} | "
                       f"{fmt(e.get('recall'), '.4f')} | {fmt(e.get('rel_err'), '.2e')} | "
                       f"{fmt(tf / 1e3 if isinstance(tf, (int, float)) else None, '.1f')} |")
        out.append("")
    return out


def gpu_tables(runs):
    """GPU attention runs (bench/torch_ref.py). For each section: among the runs with the full
    set of lengths, the newest one that records its time (the build as it is), else, for older
    records, the one with the highest throughput (several recorded kernel variants)."""
    gpu = [r for r in runs if r.get("gpu") and
           any(isinstance(r.get(k), list) for k in ("dense", "sparse", "patterns", "estimation"))]
    if not gpu:
        return []

    def best(key, score):
        """The run for section `key`; score(entries) ranks untimed runs, higher is better."""
        cands = [r for r in gpu if isinstance(r.get(key), list) and r[key]]
        if not cands:
            return None
        most = max(len(r[key]) for r in cands)
        full = [r for r in cands if len(r[key]) == most]
        timed = [r for r in full if r.get("time")]
        if timed:
            return max(timed, key=lambda r: r["time"])
        return max(full, key=lambda r: score(r[key]))

    def mean_of(rate):
        return lambda entries: sum(e.get(rate, 0) for e in entries) / len(entries)

    out = []
    d = best("dense", mean_of("ours_tflops"))
    if d:
        out += [f"**GPU dense attention**, {d['gpu']}, {d.get('dtype', 'bf16')}, D = "
                f"{d.get('head_dim', 128)}, causal (`{d['_file']}`, commit {d.get('commit', '?')}). "
                "Per-head times; cuDNN and FlashAttention-2 are PyTorch SDPA backends measured in "
                "the same run on the same inputs.", "",
                "| L | heads | ours ms/head | ours TFLOP/s | cuDNN TFLOP/s | flash TFLOP/s | ours / cuDNN |",
                "|---|---|---|---|---|---|---|"]
        for e in d["dense"]:
            out.append(f"| {length(e['L'])} | {e.get('heads')} | {fmt(e.get('ours_ms_per_head'), '.2f')} "
                       f"| {fmt(e.get('ours_tflops'), '.0f')} | {fmt(e.get('cudnn_tflops'), '.0f')} "
                       f"| {fmt(e.get('flash_tflops'), '.0f')} | {fmt(e.get('ratio_to_cudnn'), '.2f')} |")
        out.append("")
    sp = best("sparse", mean_of("effective_tflops"))
    if sp:
        out += [f"**GPU sparse kernel** on the prescribed index sets (`{sp['_file']}`, commit "
                f"{sp.get('commit', '?')}); effective TFLOP/s count only the keys computed.", "",
                "| L | set | keys/row | ms/head | effective TFLOP/s | index build ms |",
                "|---|---|---|---|---|---|"]
        for e in sp["sparse"]:
            out.append(f"| {length(e['L'])} | {e['set']} | {fmt(e.get('keys_per_row'), '.0f')} "
                       f"| {fmt(e.get('kernel_ms_per_head'), '.2f')} "
                       f"| {fmt(e.get('effective_tflops'), '.0f')} | {fmt(e.get('index_ms'), '.2f')} |")
        out.append("")
    pt = best("patterns", mean_of("effective_tflops"))
    if pt:
        out += [f"**GPU block-sparse and A-shape kernels** (`{pt['_file']}`, commit "
                f"{pt.get('commit', '?')}) against the original's Triton kernels on the same GPU "
                "(kernel only, from BENCHMARKS.md). Block-sparse keeps the top 100 64-key blocks "
                "per row block, on random inputs (scattered blocks) and on position-coded ones "
                "(near-diagonal blocks); A-shape keeps 128 sink keys and a 4096-key window, its "
                "effective TFLOP/s counting exactly those keys.", "",
                "| L | pattern | inputs | keys/row | ms/head | effective TFLOP/s | estimation ms/head "
                "| estimation share | original ms/head | speed-up |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        names = {"block_sparse": "block-sparse top-100", "a_shape": "A-shape 128 + 4096"}
        for e in pt["patterns"]:
            out.append(f"| {length(e['L'])} | {names.get(e['pattern'], e['pattern'])} "
                       f"| {e.get('inputs', '-')} | {fmt(e.get('keys_per_row'), '.0f')} "
                       f"| {fmt(e.get('kernel_ms_per_head'), '.2f')} "
                       f"| {fmt(e.get('effective_tflops'), '.0f')} "
                       f"| {fmt(e.get('estimate_ms_per_head'), '.3f')} "
                       f"| {pct(e.get('estimate_share'))} "
                       f"| {fmt(e.get('original_kernel_ms_per_head'), '.2f')} "
                       f"| {times(e.get('speedup_vs_original'))} |")
        out.append("")
    # untimed runs: the fastest prefill
    es = best("estimation", lambda entries: -sum(e.get("prefill_ms_per_head", 0) for e in entries))
    if es:
        out += [f"**GPU whole-layer prefill** (every head vertical-slash 1000/6096, estimation and "
                f"index included; `{es['_file']}`)", "",
                "| L | heads | prefill ms/head | estimation + index share | keys/row of the index "
                "| kernel effective TFLOP/s |", "|---|---|---|---|---|---|"]
        for e in es["estimation"]:
            out.append(f"| {length(e['L'])} | {e['heads']} | {fmt(e.get('prefill_ms_per_head'), '.2f')} "
                       f"| {fmt(100 * e.get('estimate_index_share', 0), '.1f')} % "
                       f"| {fmt(e.get('keys_per_row'), '.0f')} "
                       f"| {fmt(e.get('kernel_effective_tflops'), '.0f')} |")
        out.append("")
    if d or sp:
        # the plot of the runs the tables come from: dense from the dense table's run, the sparse
        # patterns from the sparse table's (drawn again here; kept as it is without matplotlib)
        png = os.path.join(ROOT, "bench", "results", "gpu-attention-readme.png")
        sys.path.insert(0, os.path.join(ROOT, "bench"))
        import attention_plot
        base = d or sp
        if not attention_plot.plot(attention_plot.merged(base, sp), png):
            print("matplotlib missing: the README's plot was not redrawn", file=sys.stderr)
        if os.path.exists(png):
            src = ", ".join(sorted({f"`{r['_file']}`" for r in (d, sp) if r}))
            out += [f"Time per head against length, from {src}:", "",
                    f"![time per head against length]({os.path.relpath(png, ROOT)})", ""]
    return out


def ttft_tables(runs):
    """Projected TTFT of the 8B shape (bench/project_8b_ttft.py)."""
    out = []
    for r in runs:
        if r.get("model_shape") is None or not isinstance(r.get("rows"), list):
            continue
        out += [f"**Projected TTFT, {r['model_shape']}**, {r.get('gpu', '?')} (`{r['_file']}`): "
                f"{r.get('what', '')}.", "",
                "| L | GEMMs / layer | attention / layer, dense | attention / layer, minference "
                "| TTFT dense | TTFT minference |", "|---|---|---|---|---|---|"]
        for e in r["rows"]:
            out.append(f"| {length(e['L'])} | {fmt(e['gemm_ms_per_layer'], '.0f')} ms "
                       f"| {fmt(e['attn_dense_ms_per_layer'], '.0f')} ms "
                       f"| {fmt(e['attn_minference_ms_per_layer'], '.0f')} ms "
                       f"| {fmt(e['ttft_dense_s'], '.1f')} s | {fmt(e['ttft_minference_s'], '.1f')} s |")
        out.append("")
    return out


def runner_tables(runs):
    """Whole-model TTFT from the model runner (bench/model_ttft.c via bench/run_gpu_model.sh):
    the files of one model and device are merged, newest row per (length, method)."""
    groups = {}
    for r in sorted(runs, key=lambda r: r.get("date", "")):
        rows = r.get("rows")
        if not isinstance(rows, list) or not rows or "ttft_s" not in rows[0]:
            continue
        # one model whatever path it was read from: the name before the parenthesised details
        key = (r.get("model", "?").split(" (")[0], r.get("device", "?"), r.get("gpu", ""))
        g = groups.setdefault(key, {"files": [], "rows": {}, "run": r, "commits": []})
        g["files"].append(r["_file"])
        if r.get("commit") and r["commit"] not in g["commits"]:
            g["commits"].append(r["commit"])
        for e in rows:
            g["rows"][(e["tokens"], e["method"])] = dict(e, _commit=r.get("commit", "?"))
    out = []
    for (model, device, gpu), g in groups.items():
        r, sh = g["run"], g["run"].get("shape", {})
        name = model.split(" (")[0]
        name = os.path.basename(name) if "/" in name else name
        out += [f"**Model TTFT, {name}** ({sh.get('layers')} layers, {sh.get('heads')}/"
                f"{sh.get('kv_heads')} heads of {sh.get('head_dim')}, hidden {sh.get('hidden')}, "
                f"{sh.get('weights', '')} weights), {device} {gpu}, commits {', '.join(g['commits']) or '?'} "
                f"({', '.join('`' + f + '`' for f in g['files'])}). One prefill per cell, the "
                "newest run of each; attention and GEMM are the runner's own measurements of the "
                "prefill; a speed-up is given only against dense of the same commit.", "",
                "| L | method | commit | TTFT | speed-up | attention | GEMMs | decode | device peak |",
                "|---|---|---|---|---|---|---|---|---|"]
        for (L, method), e in sorted(g["rows"].items()):
            dense = g["rows"].get((L, "dense"))
            same = dense is not None and dense["_commit"] == e["_commit"]
            sp = dense["ttft_s"] / e["ttft_s"] if same and e["ttft_s"] > 0 else None
            out.append(f"| {length(L)} | {method} | {e['_commit']} | {fmt(e['ttft_s'], '.2f')} s "
                       f"| {fmt(sp, '.1f') + 'x' if sp else '-'} "
                       f"| {fmt(e['attention_s'], '.2f')} s ({fmt(100 * e['attention_share'], '.0f')}%) "
                       f"| {fmt(e['gemm_s'], '.2f')} s ({fmt(100 * e['gemm_share'], '.0f')}%) "
                       f"| {fmt(e.get('decode_tokens_per_s'), '.0f')} tok/s "
                       f"| {fmt(e.get('device_peak_bytes', 0) / 2**30, '.1f')} GiB |")
        out.append("")
    return out


def generic_tables(runs):
    """Other result files carry a ready-made table: 'columns' (names) and 'table' (row dicts)."""
    out = []
    for r in runs:
        if "table" not in r or "columns" not in r:
            continue
        out.append(f"**{r.get('title', r['_file'])}** (`{r['_file']}`, {r.get('date', '?')[:10]}"
                   f"{', ' + r['gpu'] if r.get('gpu') else ''})")
        out.append("")
        cols = r["columns"]
        out.append("| " + " | ".join(cols) + " |")
        out.append("|" + "---|" * len(cols))
        for row in r["table"]:
            cells = [row.get(c, "-") if isinstance(row, dict) else "-" for c in cols]
            out.append("| " + " | ".join(str(c) for c in cells) + " |")
        out.append("")
    return out


def main():
    runs = load_runs()
    lines = (cpu_table(runs) + gpu_tables(runs) + cli_gpu_table(runs) + runner_tables(runs) +
             ttft_tables(runs) + generic_tables(runs))
    if not lines:
        lines = ["No benchmark results recorded yet."]
    readme_path = os.path.join(ROOT, "README.md")
    with open(readme_path) as f:
        readme = f.read()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(readme):
        sys.exit("README.md has no results markers")
    body = BEGIN + "\n" + "\n".join(lines).rstrip() + "\n" + END
    readme = pattern.sub(lambda _: body, readme)
    with open(readme_path, "w") as f:
        f.write(readme)
    print(f"README.md: {len(runs)} result files, {len(lines)} lines")


if __name__ == "__main__":
    main()
