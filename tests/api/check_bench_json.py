"""Checks the rows that `minference bench --len 2048 --json FILE` appends (standard library only):
each row valid in the results store's schema (scripts/results.py), and the last run complete.

usage: check_bench_json.py FILE [--device cpu|cuda]   (the device the run was on; default cpu)
"""
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import results  # noqa: E402

rows = results.load(sys.argv[1])
device = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--device" else "cpu"
assert rows, "no rows"
for r in rows:
    errs = results.row_errors(r)
    assert not errs, (r, errs)
last = max(r["date"] for r in rows)  # every row of one run has the run's date
rows = [r for r in rows if r["date"] == last]
for r in rows:
    assert r["benchmark"] == "minference-bench", r
    s = r["shape"]
    assert s["len"] == 2048 and s["device"] == device, s
    assert (r["gpu"] is None) == (device == "cpu"), r["gpu"]
by = {}
for r in rows:
    by.setdefault(r["method"], {})[r["metric"]] = r["value"]
for want in ("dense", "a_shape", "tri_shape", "vertical_slash", "block_sparse"):
    assert want in by, f"no {want} result"
for method, m in by.items():
    if method == "openblas sgemm":
        assert device == "cpu" and m["gflops"] > 0, m
        continue
    for key in ("ms", "speedup", "density", "recall", "rel_err"):
        assert key in m and math.isfinite(m[key]), (method, key)
    assert m["ms"] > 0 and m["speedup"] > 0, (method, m)
    assert 0 < m["density"] <= 1.0 + 1e-9 and 0 < m["recall"] <= 1.0 + 1e-9, (method, m)
    assert m["rel_err"] >= 0, (method, m)
    # a pattern that keeps every key computes dense attention: only rounding may differ (the
    # GPU's sparse and dense kernels order their sums differently)
    if m["density"] > 1 - 1e-9:
        assert m["rel_err"] < 1e-2, (method, m)
dense = by["dense"]
assert dense["density"] == 1 and dense["rel_err"] == 0, dense
print(f"bench rows ok: {len(by)} methods, {len(rows)} rows")
