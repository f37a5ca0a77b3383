#!/usr/bin/env python3
"""The benchmark results store: one JSON object a line in bench/results.jsonl, one schema.

A row is one measured number:
  commit     the library's source commit ("ae55946", "-dirty" where the tree had changes)
  date       when it was measured, ISO 8601 ("2026-12-02" or "2026-12-02T16:37:32Z")
  machine    the host (CPU model and cores), "not recorded" for older GPU runs
  gpu        the GPU ("NVIDIA H200"), null on the CPU
  benchmark  what ran: minference-bench, dense-sdpa, sparse-sets, patterns, prefill,
             model-ttft, ttft-projection, crossover, eval-<task>
  shape      the problem (an object: length, heads, head dim, dtype, index set, model, ...)
  method     what was measured on it (dense, a_shape, cudnn, ...)
  metric     the quantity (ms, speedup, tflops, ...) and value, a finite number
  unit       optional ("ms", "s", "TFLOP/s", "x"); params and note, optional objects/strings

Subcommands:
  render [--check]        rewrite the tables between <!-- results:NAME --> and <!-- results:end -->
                          in README.md and docs/performance.md from the store (--check: only
                          say whether they are up to date; exit status 1 if not)
  compare A B             a table of the metrics commits A and B share, with the ratio B / A
  append FILE...          append rows (a .jsonl file of rows, or a benchmark's own JSON run:
                          bench/torch_ref.py, bench/model_ttft.c, bench/project_8b_*.py,
                          bench/crossover_patterns.py, minference eval) to the store
  check [FILE]            validate every row of the store (or FILE) against the schema
Benchmarks written in Python import this file and call append_rows().
"""
import argparse
import datetime
import json
import math
import os
import re
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STORE = os.path.join(ROOT, "bench", "results.jsonl")
DOCS = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "docs", "performance.md")]
REQUIRED = {"commit": str, "date": str, "machine": str, "gpu": (str, type(None)),
            "benchmark": str, "shape": (dict, str), "method": str, "metric": str,
            "value": (int, float)}
OPTIONAL = {"unit": str, "params": dict, "note": str}
DATE = re.compile(r"^\d{4}-\d\d-\d\d(T\d\d:\d\d:\d\dZ)?$")


# ---------------------------------------------------------------------------------------------
# schema

def row_errors(row):
    """What is wrong with one row (empty when nothing)."""
    if not isinstance(row, dict):
        return ["not an object"]
    errs = []
    for key, types in REQUIRED.items():
        if key not in row:
            errs.append(f"missing {key}")
        elif not isinstance(row[key], types) or isinstance(row[key], bool):
            errs.append(f"{key}: {type(row[key]).__name__}")
    for key in row:
        if key not in REQUIRED and key not in OPTIONAL:
            errs.append(f"unknown key {key}")
        elif key in OPTIONAL and not isinstance(row[key], OPTIONAL[key]):
            errs.append(f"{key}: {type(row[key]).__name__}")
    if not errs:
        if not DATE.match(row["date"]):
            errs.append(f"date: {row['date']!r} is not ISO 8601")
        if not math.isfinite(row["value"]):
            errs.append("value: not finite")
        for key in ("commit", "benchmark", "method", "metric"):
            if not row[key]:
                errs.append(f"{key}: empty")
    return errs


def load(path=STORE):
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as e:
                    raise SystemExit(f"{path}:{n}: {e}")
    return rows


def check(path=STORE):
    rows, bad = load(path), 0
    for n, row in enumerate(rows, 1):
        for e in row_errors(row):
            print(f"{path}: row {n}: {e}", file=sys.stderr)
            bad += 1
    shown = os.path.relpath(path, ROOT) if os.path.abspath(path).startswith(ROOT) else path
    print(f"{shown}: {len(rows)} rows, {bad} problems")
    return bad == 0


def append_rows(rows, path=STORE):
    """Validates the rows and appends them to the store; returns how many."""
    rows = list(rows)
    for row in rows:
        errs = row_errors(row)
        if errs:
            raise ValueError(f"bad row {json.dumps(row)}: {'; '.join(errs)}")
    with open(path, "a") as f:
        for row in rows:
            f.write(json.dumps(row, separators=(", ", ": ")) + "\n")
    return len(rows)


def row(run, benchmark, shape, method, metric, value, unit=None, params=None):
    """A row from a run's common fields (commit, date, machine, gpu); None for no value."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return None
    r = {"commit": run.get("commit") or "unknown", "date": iso_date(run.get("date")),
         "machine": run.get("machine") or "not recorded", "gpu": run.get("gpu"),
         "benchmark": benchmark, "shape": shape, "method": method, "metric": metric,
         "value": round(value, 6) if isinstance(value, float) else value}
    if unit:
        r["unit"] = unit
    if params:
        r["params"] = params
    return r


def host():
    """This machine as the rows name it: CPU model and cores."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as fh:
            model = next(l.split(":", 1)[1].strip() for l in fh if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {os.cpu_count()} cores"


def iso_date(d):
    if not d:
        return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return d[:19] + "Z" if len(d) > 10 and not d.endswith("Z") else d


# ---------------------------------------------------------------------------------------------
# benchmarks' own JSON runs -> rows

UNITS = {"ms": "ms", "speedup": "x", "gflops": "GFLOP/s", "tflops": "TFLOP/s", "ttft_s": "s",
         "attention_s": "s", "gemm_s": "s", "ms_per_head": "ms", "index_ms": "ms",
         "effective_tflops": "TFLOP/s", "estimate_ms_per_head": "ms", "prefill_ms_per_head": "ms",
         "kernel_effective_tflops": "TFLOP/s", "decode_tokens_per_s": "tokens/s",
         "device_peak_bytes": "bytes", "gemm_ms_per_layer": "ms", "attention_ms_per_layer": "ms",
         "sparse_ms": "ms", "dense_ms": "ms", "estimate_ms": "ms", "rest_s": "s",
         "ttft_128k_s": "s", "prefill_s": "s", "fork_s": "s", "followup_s": "s",
         "fork_added_mib": "MiB", "device_peak_gib": "GiB", "multi_request_s": "s",
         "reprefill_s": "s", "decode_first_s": "s", "decode_later_tokens_per_s": "tokens/s"}


def rows_of_run(run):
    """The rows of one benchmark's JSON run, whichever benchmark wrote it."""
    out = []

    def add(*a, **k):
        r = row(run, *a, unit=UNITS.get(a[3]), **k)
        if r:
            out.append(r)

    dtype, dim = run.get("dtype", "bf16"), run.get("head_dim", 128)
    if str(run.get("kernel_path", "")).startswith("sm80"):
        dtype += ", sm80 kernels"  # the portable kernels on a Hopper GPU: not the default
    if isinstance(run.get("results"), list) and "len" in run:  # minference bench --json (old)
        shape = {"device": run.get("device", "cpu"), "len": run["len"], "heads": run["heads"],
                 "kv_heads": run.get("kv_heads", run["heads"]), "dim": run["dim"],
                 "dtype": run["dtype"], "threads": run["threads"]}
        for e in run["results"]:
            for m in ("ms", "speedup", "density", "recall", "rel_err", "gflops"):
                add("minference-bench", shape, e["method"], m, e.get(m))
        add("minference-bench", shape, "openblas sgemm", "gflops", run.get("sgemm_gflops"))
    for e in run.get("dense", []) if isinstance(run.get("dense"), list) else []:
        shape = {"L": e["L"], "heads": e["heads"], "kv_heads": e.get("heads_kv"), "dim": dim,
                 "dtype": dtype}
        for method, key in (("minference", "ours"), ("cudnn", "cudnn"), ("flash", "flash")):
            add("dense-sdpa", shape, method, "ms_per_head", e.get(key + "_ms_per_head"))
            add("dense-sdpa", shape, method, "tflops", e.get(key + "_tflops"))
    for e in run.get("sparse", []) if isinstance(run.get("sparse"), list) else []:
        shape = {"L": e["L"], "heads": e["heads"], "set": e["set"], "dim": dim, "dtype": dtype}
        add("sparse-sets", shape, "minference", "ms_per_head", e.get("kernel_ms_per_head"))
        add("sparse-sets", shape, "minference", "effective_tflops", e.get("effective_tflops"))
        add("sparse-sets", shape, "minference", "keys_per_row", e.get("keys_per_row"))
        add("sparse-sets", shape, "minference", "index_ms", e.get("index_ms"))
    for e in run.get("patterns", []) if isinstance(run.get("patterns"), list) else []:
        shape = {"L": e["L"], "heads": e["heads"], "pattern": pattern_name(e),
                 "inputs": e.get("inputs", "random"), "dim": dim, "dtype": dtype}
        for m in ("ms_per_head", "effective_tflops", "keys_per_row", "estimate_ms_per_head",
                  "estimate_share"):
            key = "kernel_" + m if m == "ms_per_head" else m
            add("patterns", shape, "minference", m, e.get(key))
        add("patterns", shape, "original", "ms_per_head", e.get("original_kernel_ms_per_head"))
    for e in run.get("estimation", []) if isinstance(run.get("estimation"), list) else []:
        shape = {"L": e["L"], "heads": e["heads"], "pattern": "vertical_slash 1000+6096",
                 "dim": dim, "dtype": dtype}
        for m in ("prefill_ms_per_head", "estimate_index_share", "keys_per_row",
                  "kernel_effective_tflops", "estimate_ms", "index_ms"):
            add("prefill", shape, "minference", m, e.get(m))
    rows = run.get("rows")
    if isinstance(rows, list) and rows and "ttft_s" in rows[0]:  # bench/model_ttft.c
        sh = run.get("shape", {})
        model = os.path.basename(run.get("model", "?").split(" (")[0])
        for e in rows:
            shape = {"model": model, "tokens": e["tokens"], "device": run.get("device", "cuda"),
                     "layers": sh.get("layers"), "heads": sh.get("heads"),
                     "kv_heads": sh.get("kv_heads"), "head_dim": sh.get("head_dim"),
                     "hidden": sh.get("hidden"), "weights": sh.get("weights")}
            for m in ("ttft_s", "attention_s", "gemm_s", "decode_tokens_per_s",
                      "device_peak_bytes"):
                add("model-ttft", shape, e["method"], m, e.get(m))
    elif isinstance(rows, list) and run.get("bench") == "session":  # bench/session_bench.c
        model = "LLaMA-3-8B shape, random" if "random" in str(run.get("model")) else \
            os.path.basename(str(run.get("model", "?")))
        for e in rows:
            shape = {"model": model, "tokens": e["tokens"], "device": run.get("device", "cuda"),
                     "kv_offload": bool(run.get("kv_offload")), "kv_dtype": run.get("kv_dtype", 0),
                     "kv": e.get("kv", run.get("kv", "dense")),
                     "followup_tokens": e.get("followup_tokens")}
            if e.get("chunk"):  # the prompt prefilled in calls of this many tokens
                shape["chunk"] = e["chunk"]
            if run.get("kv_pinned"):  # pages in pinned memory, decoded by the device
                shape["kv_pinned"] = True
            for m in ("prefill_s", "fork_s", "fork_added_mib", "followup_s",
                      "decode_tokens_per_s", "decode_first_s", "decode_later_tokens_per_s",
                      "kv_device_calls", "device_peak_gib", "pool_mib"):
                add("session", shape, run.get("method", "minference"), m, e.get(m))
            if e.get("requests") and e.get("reprefill_s"):
                # multi-request: R questions on forks of the context against re-prefilling it
                for m in ("requests", "multi_request_s", "reprefill_s"):
                    add("session", shape, run.get("method", "minference"), m, e.get(m))
            if e.get("prefill_s") and e.get("followup_s"):
                add("session", shape, run.get("method", "minference"), "followup_share",
                    e["followup_s"] / e["prefill_s"])
    elif isinstance(rows, list) and run.get("model_shape"):  # bench/project_8b_ttft.py
        for e in rows:
            shape = {"model": run["model_shape"], "L": e["L"], "how": "32 x measured layer"}
            add("ttft-projection", shape, "gemm", "gemm_ms_per_layer", e.get("gemm_ms_per_layer"))
            for method in ("dense", "minference"):
                add("ttft-projection", shape, method, "attention_ms_per_layer",
                    e.get(f"attn_{method}_ms_per_layer"))
                add("ttft-projection", shape, method, "ttft_s", e.get(f"ttft_{method}_s"))
    elif isinstance(rows, list) and rows and "speedup" in rows[0]:  # crossover_patterns.py
        for e in rows:
            shape = {"L": e["L"], "heads": e["heads"], "kv_heads": e.get("heads_kv"),
                     "dim": e.get("head_dim", dim), "dtype": dtype}
            for m in ("speedup", "sparse_ms", "dense_ms"):
                add("crossover", shape, e["pattern"], m, e.get(m))
    if isinstance(run.get("projection_1m"), list):  # bench/project_8b_1m.py
        for e in run["projection_1m"]:
            shape = {"model": run.get("model", "LLaMA-3-8B"), "L": 1048576,
                     "how": "runner at 128K scaled + 1M kernels"}
            for m in ("ttft_128k_s", "gemm_s", "rest_s", "attention_s", "ttft_s"):
                add("ttft-projection", shape, e["method"], m, e.get(m))
    if run.get("task") and isinstance(run.get("methods"), list):  # minference eval --json
        metric = {"ppl": "perplexity", "recall": "recall"}.get(run["task"], "correct")
        for m in run["methods"]:
            for i, L in enumerate(run["lengths"]):
                for j, s in enumerate(m["scores"][i]):
                    shape = {"model": run.get("model"), "length": L}
                    if run.get("depths"):
                        shape["depth"] = run["depths"][j]
                    add("eval-" + run["task"], shape, m["name"], metric, s)
    return out


SHAPE_KEYS = {"L", "heads", "heads_kv", "kv_heads", "head_dim", "inputs", "set", "band",
              "columns", "kind", "round", "pattern", "top_k", "tuning"}


def rows_of_variants(run, benchmark, entries):
    """Rows of an A/B tool's entries ({variant, shape keys..., numbers...}; a nested object of
    numbers gives one metric per key, "name.key"): the variant is the method. Its benchmark name
    keeps the rows apart from the main benchmarks' tables."""
    out = []
    for e in entries:
        shape = {k: v for k, v in e.items() if k in SHAPE_KEYS}
        for k, v in e.items():
            if k in SHAPE_KEYS or k == "variant":
                continue
            for metric, value in (v.items() if isinstance(v, dict) else [(None, v)]):
                name = k if metric is None else f"{k}.{metric}"
                r = row(run, benchmark, shape, str(e.get("variant", "default")), name, value,
                        unit=UNITS.get(name))
                if r:
                    out.append(r)
    return out


def pattern_name(e):
    if e.get("pattern") == "block_sparse":
        return f"block_sparse top-{e.get('top_k', 100)}"
    if e.get("pattern") == "a_shape":
        return f"a_shape {e.get('n_init', 128)}+{e.get('n_local', 4096)}"
    return e.get("pattern", "?")


def read_any(path):
    """Rows from a .jsonl file of rows or from one benchmark run's JSON."""
    with open(path) as f:
        text = f.read()
    try:
        doc = json.loads(text)
    except ValueError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if isinstance(doc, dict) and "benchmark" in doc and "metric" in doc:
        return [doc]
    if isinstance(doc, dict):
        doc.setdefault("machine", host())  # appended where it ran, right after the run
    rows = rows_of_run(doc) if isinstance(doc, dict) else []
    if not rows:
        raise SystemExit(f"{path}: no rows recognised")
    return rows


# ---------------------------------------------------------------------------------------------
# tables

def key_of(shape):
    return json.dumps(shape, sort_keys=True) if isinstance(shape, dict) else shape


def newest(rows, benchmark, match=lambda s: True):
    """{(shape key, method, metric): row}, the newest row of each; and the rows' runs."""
    out = {}
    for r in sorted((r for r in rows if r["benchmark"] == benchmark and match(r["shape"])),
                    key=lambda r: r["date"]):
        out[(key_of(r["shape"]), r["method"], r["metric"])] = r
    return out


def length(L):
    return f"{L // 1048576}M" if L % 1048576 == 0 else f"{L // 1024}K"


def f(x, spec):
    return format(x, spec) if isinstance(x, (int, float)) else "-"


def source(rs):
    """'commits X, Y (date, gpu)' for the runs behind a table."""
    by = {}
    for r in rs:
        by.setdefault((r["gpu"] or r["machine"], r["date"][:10]), set()).add(r["commit"])
    return "; ".join(f"{'commits' if len(c) > 1 else 'commit'} {', '.join(sorted(c))} ({d}, {g})"
                     for (g, d), c in sorted(by.items(), key=lambda x: x[0][1]))


def shapes_in_order(tab, keyf):
    # the shape's own text breaks ties: a set's order changes from one process to the next
    return sorted({k[0] for k in tab}, key=lambda s: (keyf(json.loads(s)), s))


def table_cpu(rows):
    tab = newest(rows, "minference-bench", lambda s: s["device"] == "cpu" and s["threads"] == 2)
    shapes = shapes_in_order(tab, lambda s: s["len"])
    methods = ["dense", "a_shape", "tri_shape", "vertical_slash", "block_sparse"]
    head = "| method | " + " | ".join(f"{length(json.loads(s)['len'])} ms | speed-up"
                                       for s in shapes) + " | density | recall |"
    out = [head, "|---" * (2 * len(shapes) + 3) + "|"]
    last = shapes[-1] if shapes else None
    for m in methods:
        cells = []
        for s in shapes:
            cells += [f(g(tab, s, m, "ms"), ".0f"), f(g(tab, s, m, "speedup"), ".2f") + "x"]
        mid = shapes[len(shapes) // 2] if shapes else None
        out.append((f"| {m} | " + " | ".join(cells) + f" | {f(g(tab, mid, m, 'density'), '.3f')} "
                    f"| {f(g(tab, mid, m, 'recall'), '.3f')} |").replace("| -x |", "| - |"))
    return out, [tab[k] for k in tab], (f"density and recall at "
                                       f"{length(json.loads(mid)['len'])}" if last else "")


def g(tab, shape, method, metric):
    r = tab.get((shape, method, metric))
    return r["value"] if r else None


def table_gpu_dense(rows):
    tab = newest(rows, "dense-sdpa", lambda s: s["dim"] == 128)
    out = ["| L | heads | ms / head | TFLOP/s | cuDNN TFLOP/s | FlashAttention-2 TFLOP/s "
           "| vs cuDNN |", "|---|---|---|---|---|---|---|"]
    for s in shapes_in_order(tab, lambda s: s["L"]):
        sh = json.loads(s)
        ours, cudnn = g(tab, s, "minference", "tflops"), g(tab, s, "cudnn", "tflops")
        ms, flash = g(tab, s, "minference", "ms_per_head"), g(tab, s, "flash", "tflops")
        out.append(f"| {length(sh['L'])} | {sh['heads']} | {f(ms, '.2f')} "
                   f"| {f(ours, '.0f')} | {f(cudnn, '.0f')} | {f(flash, '.0f')} "
                   f"| {f(ours / cudnn if ours and cudnn else None, '.2f')}x |")
    return out, list(tab.values()), ""


def table_gpu_sparse(rows):
    tab = newest(rows, "sparse-sets")
    out = ["| L | set | keys / row | ms / head | effective TFLOP/s | index build ms |",
           "|---|---|---|---|---|---|"]
    order = {"local": 0, "mixed": 1, "small": 2}
    for s in shapes_in_order(tab, lambda s: (s["L"], order.get(s["set"], 9))):
        sh = json.loads(s)
        out.append(f"| {length(sh['L'])} | {sh['set']} "
                   f"| {f(g(tab, s, 'minference', 'keys_per_row'), '.0f')} "
                   f"| {f(g(tab, s, 'minference', 'ms_per_head'), '.2f')} "
                   f"| {f(g(tab, s, 'minference', 'effective_tflops'), '.0f')} "
                   f"| {f(g(tab, s, 'minference', 'index_ms'), '.2f')} |")
    return out, list(tab.values()), ""


def table_gpu_patterns(rows):
    tab = newest(rows, "patterns")
    out = ["| L | pattern | inputs | ms / head | effective TFLOP/s | estimate share "
           "| original ms / head | speed-up |", "|---|---|---|---|---|---|---|---|"]
    for s in shapes_in_order(tab, lambda s: (s["L"], s["pattern"], s["inputs"])):
        sh = json.loads(s)
        ours, orig = g(tab, s, "minference", "ms_per_head"), g(tab, s, "original", "ms_per_head")
        share = g(tab, s, "minference", "estimate_share")
        out.append(f"| {length(sh['L'])} | {sh['pattern']} | {sh['inputs']} | {f(ours, '.2f')} "
                   f"| {f(g(tab, s, 'minference', 'effective_tflops'), '.0f')} "
                   f"| {f(100 * share, '.1f') + ' %' if share is not None else '-'} "
                   f"| {f(orig, '.2f')} | {f(orig / ours if orig and ours else None, '.2f')}x |")
    out = [o.replace("| - % |", "| - |").replace("| -x |", "| - |") for o in out]
    return out, list(tab.values()), ""


def table_gpu_prefill(rows):
    tab = newest(rows, "prefill")
    out = ["| L | heads | prefill ms / head | estimate + index share | keys / row "
           "| kernel effective TFLOP/s |", "|---|---|---|---|---|---|"]
    for s in shapes_in_order(tab, lambda s: s["L"]):
        sh = json.loads(s)
        share = g(tab, s, "minference", "estimate_index_share")
        out.append(f"| {length(sh['L'])} | {sh['heads']} "
                   f"| {f(g(tab, s, 'minference', 'prefill_ms_per_head'), '.2f')} "
                   f"| {f(100 * share, '.1f') + ' %' if share is not None else '-'} "
                   f"| {f(g(tab, s, 'minference', 'keys_per_row'), '.0f')} "
                   f"| {f(g(tab, s, 'minference', 'kernel_effective_tflops'), '.0f')} |")
    return out, list(tab.values()), ""


def table_gpu_cli(rows):
    tab = newest(rows, "minference-bench",
                 lambda s: s["device"] == "cuda" and s["len"] >= 131072)
    shapes = shapes_in_order(tab, lambda s: (s["len"], s["heads"]))
    names = [f"{length(json.loads(s)['len'])} x {json.loads(s)['heads']}" for s in shapes]
    out = ["| method | " + " | ".join(f"{n} ms | speed-up | rel. error" for n in names) + " |",
           "|---" * (3 * len(shapes) + 1) + "|"]
    first = ["dense", "a_shape", "tri_shape", "vertical_slash", "block_sparse"]
    others = sorted({k[1] for k in tab if k[1] not in first and k[2] == "ms"})
    for m in first + others:
        cells = []
        for s in shapes:
            cells += [f(g(tab, s, m, "ms"), ".2f"), f(g(tab, s, m, "speedup"), ".1f") + "x",
                      f(g(tab, s, m, "rel_err"), ".2e")]
        out.append(f"| {m} | " + " | ".join(cells) + " |")
    return out, list(tab.values()), ""


def table_model_ttft(rows):
    tab = newest(rows, "model-ttft", lambda s: s["device"] == "cuda")
    out = ["| model | L | dense TTFT | minference TTFT | speed-up | attention share, minference "
           "| commit |", "|---|---|---|---|---|---|---|"]
    for s in shapes_in_order(tab, lambda s: (s["model"], s["tokens"])):
        sh = json.loads(s)
        d, m = tab.get((s, "dense", "ttft_s")), tab.get((s, "minference", "ttft_s"))
        att = g(tab, s, "minference", "attention_s")
        same = d and m and d["commit"] == m["commit"]
        name = "LLaMA-3-8B shape" if "8B" in sh["model"] else sh["model"].split("-Instruct")[0]
        commits = sorted({x["commit"] for x in (d, m) if x})
        out.append(f"| {name} | {length(sh['tokens'])} | {f(d and d['value'], '.2f')} s "
                   f"| {f(m and m['value'], '.2f')} s "
                   f"| {f(d['value'] / m['value'] if same else None, '.1f')}x "
                   f"| {f(100 * att / m['value'] if att and m else None, '.0f')} % "
                   f"| {', '.join(commits)} |")
    out = [o.replace("| -x |", "| - |") for o in out]
    return out, list(tab.values()), ""


def table_sessions(rows):
    tab = newest(rows, "session", lambda s: s["device"] == "cuda")
    out = ["| model | L | cache | prefill | fork | follow-up turn | share of the prefill "
           "| decode | R questions: forks / re-prefill | device peak | KV pages |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in shapes_in_order(tab, lambda s: (s["model"], s["tokens"], s["kv_offload"], s["kv"])):
        sh = json.loads(s)
        cache = "offloaded" if sh["kv_offload"] else "on the device"
        dtype = {1: "f16", 2: "bf16", 3: "fp8"}.get(sh.get("kv_dtype", 0))
        if dtype:
            cache += f", {dtype} pages"
        if sh.get("chunk"):
            cache += f", prefilled in chunks of {length(sh['chunk'])}"
        if sh.get("kv_pinned"):  # the device reads the pages itself
            cache += ", pinned pages"
        if sh.get("kv", "dense") != "dense":  # a KV method attends on the host after the prefill
            cache = f"{sh['kv']} (host pages)"
        fork_s, added = g(tab, s, "minference", "fork_s"), g(tab, s, "minference", "fork_added_mib")
        share = g(tab, s, "minference", "followup_share")
        mib = g(tab, s, "minference", "pool_mib")
        turn = f"{sh['followup_tokens']} tokens: " \
               f"{f(g(tab, s, 'minference', 'followup_s'), '.3f')} s" \
            if sh.get("followup_tokens") else "-"
        if not sh.get("followup_tokens"):
            share = None
        tps = g(tab, s, 'minference', 'decode_tokens_per_s')
        n_req = g(tab, s, "minference", "requests")
        multi, re_pre = g(tab, s, "minference", "multi_request_s"), g(tab, s, "minference",
                                                                        "reprefill_s")
        reuse = f"{n_req:.0f}: {multi:.2f} s / {re_pre:.2f} s" if n_req and multi and re_pre \
            else "-"
        out.append(f"| {sh['model']} | {length(sh['tokens'])} | {cache} "
                   f"| {f(g(tab, s, 'minference', 'prefill_s'), '.2f')} s "
                   f"| {f(1e3 * fork_s if fork_s is not None else None, '.3f')} ms, "
                   f"+{f(added, '.0f')} MiB | {turn} "
                   f"| {f(100 * share, '.1f') + ' %' if share is not None else '-'} "
                   f"| {f(tps, '.1f' if tps is None or tps >= 1 else '.3f')} tokens/s "
                   f"| {reuse} "
                   f"| {f(g(tab, s, 'minference', 'device_peak_gib'), '.1f')} GiB "
                   f"| {f(mib / 1024 if mib is not None else None, '.2f')} GiB |")
    return out, list(tab.values()), ""


def table_ttft_projection(rows):
    tab = newest(rows, "ttft-projection")
    out = ["| L | method | how | GEMMs | attention | TTFT |", "|---|---|---|---|---|---|"]
    for s in shapes_in_order(tab, lambda s: (s["L"], s["how"])):
        sh = json.loads(s)
        methods = sorted({k[1] for k in tab if k[0] == s and k[1] != "gemm"},
                         key=lambda m: (m != "dense", len(m)))
        for m in methods:
            gemm = g(tab, s, "gemm", "gemm_ms_per_layer")
            gemm = 32 * gemm / 1e3 if gemm else g(tab, s, m, "gemm_s")
            att = g(tab, s, m, "attention_ms_per_layer")
            att = 32 * att / 1e3 if att else g(tab, s, m, "attention_s")
            out.append(f"| {length(sh['L'])} | {m} | {sh['how']} | {f(gemm, '.1f')} s "
                       f"| {f(att, '.1f')} s "
                       f"| {f(g(tab, s, m, 'ttft_s'), '.1f')} s |")
    return out, list(tab.values()), ""


TABLES = {"cpu": table_cpu, "gpu-dense": table_gpu_dense, "gpu-sparse": table_gpu_sparse,
          "gpu-patterns": table_gpu_patterns, "gpu-prefill": table_gpu_prefill,
          "gpu-cli": table_gpu_cli, "model-ttft": table_model_ttft,
          "ttft-projection": table_ttft_projection, "sessions": table_sessions}
# <!-- results:NAME --> or <!-- results:NAME 128K,1M --> (only those lengths)
BLOCK = re.compile(r"<!-- results:([a-z0-9-]+)((?: [0-9KM,]+)?) -->\n.*?<!-- results:end -->", re.S)


def of_lengths(rows, lens):
    """The rows whose shape's length is one of lens ("128K,1M"); every row for no lens."""
    if not lens:
        return rows
    want = {int(x[:-1]) * (1024 if x.endswith("K") else 1048576) for x in lens.split(",")}

    def length_of(s):
        return next((s[k] for k in ("L", "len", "tokens") if isinstance(s, dict) and k in s),
                    None)
    return [r for r in rows if length_of(r["shape"]) in want]


def render_text(text, rows):
    def sub(m):
        name, lens = m.group(1), m.group(2).strip()
        if name not in TABLES:
            raise SystemExit(f"unknown results table {name!r}")
        lines, used, note = TABLES[name](of_lengths(rows, lens))
        caption = f"From `bench/results.jsonl`: {source(used)}" + (f"; {note}" if note else "")
        caption = "\n".join(textwrap.wrap(caption + ".", 100, break_on_hyphens=False))
        return (f"<!-- results:{name}{m.group(2)} -->\n" + "\n".join(lines) +
                f"\n\n{caption}\n<!-- results:end -->")
    return BLOCK.sub(sub, text)


def render(check_only=False, store=STORE, docs=DOCS):
    rows, stale = load(store), []
    for path in docs:
        with open(path) as fh:
            text = fh.read()
        new = render_text(text, rows)
        if new != text:
            stale.append(os.path.relpath(path, ROOT))
            if not check_only:
                with open(path, "w") as fh:
                    fh.write(new)
    if check_only and stale:
        print(f"tables out of date in {', '.join(stale)}: run scripts/results.py render",
              file=sys.stderr)
        return False
    print(("up to date: " if check_only else "rendered: ") +
          ", ".join(os.path.relpath(p, ROOT) for p in docs))
    return True


# ---------------------------------------------------------------------------------------------
# compare

def short(name, v):
    """A shape's value as the tables write it: lengths as 128K, 1M."""
    is_length = name in ("L", "len", "tokens") and isinstance(v, int) and v >= 1024
    return length(v) if is_length else v


def compare(a, b, store=STORE, benchmark=None):
    rows = load(store)

    def of(commit):
        sel = [r for r in rows if r["commit"].startswith(commit) and
               (benchmark is None or r["benchmark"] == benchmark)]
        return {(r["benchmark"], key_of(r["shape"]), r["method"], r["metric"]): r
                for r in sorted(sel, key=lambda r: r["date"])}

    ra, rb = of(a), of(b)
    shared = sorted(set(ra) & set(rb))
    if not shared:
        print(f"no metric measured at both {a} and {b}", file=sys.stderr)
        return False
    print(f"| benchmark | shape | method | metric | {a} | {b} | {b} / {a} |")
    print("|---|---|---|---|---|---|---|")
    for k in shared:
        va, vb = ra[k]["value"], rb[k]["value"]
        shape = json.loads(k[1]) if k[1].startswith("{") else k[1]
        if isinstance(shape, dict):
            shape = ", ".join(f"{n}={short(n, v)}" for n, v in shape.items() if v is not None)
        unit = ra[k].get("unit", "")
        metric = f"{k[3]} ({unit})" if unit and unit != k[3] else k[3]
        print(f"| {k[0]} | {shape} | {k[2]} | {metric} "
              f"| {va:.4g} | {vb:.4g} | {f(vb / va if va else None, '.3f')} |")
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("render")
    p.add_argument("--check", action="store_true")
    p.add_argument("--store", default=STORE)
    p = sub.add_parser("compare")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--benchmark")
    p.add_argument("--store", default=STORE)
    p = sub.add_parser("append")
    p.add_argument("files", nargs="+")
    p.add_argument("--store", default=STORE)
    p = sub.add_parser("check")
    p.add_argument("file", nargs="?", default=STORE)
    a = ap.parse_args()
    if a.cmd == "render":
        ok = render(a.check, a.store)
    elif a.cmd == "compare":
        ok = compare(a.a, a.b, a.store, a.benchmark)
    elif a.cmd == "append":
        n = sum(append_rows(read_any(p), a.store) for p in a.files)
        print(f"{a.store}: {n} rows appended")
        ok = True
    else:
        ok = check(a.file)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
