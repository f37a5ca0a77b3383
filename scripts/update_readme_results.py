#!/usr/bin/env python3
"""Regenerates the Performance section of README.md from bench/results/*.json.

Each results file is one benchmark run; the newest run of each kind (CPU attention, GPU attention,
model TTFT, accuracy) fills its table. Run after adding results: scripts/update_readme_results.py
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
        if isinstance(data, dict):
            data["_file"] = os.path.relpath(path, ROOT)
            runs.append(data)
    return runs


def fmt(x, spec):
    return format(x, spec) if isinstance(x, (int, float)) else "-"


def cpu_table(runs):
    cpu = [r for r in runs if "sgemm_gflops" in r and "results" in r]
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
    lines = cpu_table(runs) + generic_tables(runs)
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
