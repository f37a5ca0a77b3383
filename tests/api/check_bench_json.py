"""Checks the JSON that `minference bench --json` writes (standard library only)."""
import json
import math
import sys

with open(sys.argv[1]) as f:
    doc = json.load(f)
for key in ("date", "machine", "threads", "len", "heads", "dim", "dtype", "seed",
            "sgemm_gflops", "results"):
    assert key in doc, f"missing top-level key {key}"
assert doc["len"] == 2048, doc["len"]
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
dense = results[methods.index("dense")]
assert dense["density"] == 1 and dense["rel_err"] == 0, dense
print(f"bench JSON ok: {len(results)} results")
