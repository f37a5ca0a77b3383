"""Checks the JSON that `minference bench --len 2048 --json` writes (standard library only).

usage: check_bench_json.py FILE [--device cpu|cuda]   (the device the run was on; default cpu)
"""
import json
import math
import sys

with open(sys.argv[1]) as f:
    doc = json.load(f)
device = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--device" else "cpu"
for key in ("date", "machine", "device", "gpu", "commit", "threads", "len", "heads", "dim",
            "dtype", "seed", "metrics", "sgemm_gflops", "results"):
    assert key in doc, f"missing top-level key {key}"
assert doc["len"] == 2048, doc["len"]
assert doc["device"] == device and doc["metrics"] is True, (doc["device"], doc["metrics"])
assert (doc["gpu"] is None) == (device == "cpu"), doc["gpu"]
results = doc["results"]
assert isinstance(results, list) and len(results) >= 5, results
methods = [r["method"] for r in results]
for want in ("dense", "a_shape", "tri_shape", "vertical_slash", "block_sparse"):
    assert want in methods, f"no {want} result"
for r in results:
    for key in ("method", "ms", "speedup", "density", "recall", "rel_err", "gflops"):
        assert key in r, f"{r.get('method')}: missing {key}"
    for key in ("ms", "speedup", "density", "recall", "rel_err"):
        assert isinstance(r[key], (int, float)) and math.isfinite(r[key]), (r["method"], key)
    assert r["ms"] > 0 and r["speedup"] > 0, r
    assert 0 < r["density"] <= 1.0 + 1e-9 and 0 < r["recall"] <= 1.0 + 1e-9, r
    assert r["rel_err"] >= 0, r
    # a pattern that keeps every key computes dense attention: only rounding may differ (the
    # GPU's sparse and dense kernels order their sums differently)
    if r["density"] > 1 - 1e-9:
        assert r["rel_err"] < 1e-2, r
dense = results[methods.index("dense")]
assert dense["density"] == 1 and dense["rel_err"] == 0, dense
print(f"bench JSON ok: {len(results)} results")
