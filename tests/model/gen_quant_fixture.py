#!/usr/bin/env python3
"""Writes quant_fixture.json: seeded random blocks of the Q5_0, Q5_1, Q4_K, Q5_K and Q6_K
encodings and their values as the `gguf` Python package (the GGUF format's reference reader)
expands them, for test_model_quant.c.
Run: python3 gen_quant_fixture.py > quant_fixture.json   (needs numpy and gguf)"""
import json

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

# (type, offsets of the f16 scale fields within a block)
TYPES = [(T.Q5_0, [0]), (T.Q5_1, [0, 2]), (T.Q4_K, [0, 2]), (T.Q5_K, [0, 2]), (T.Q6_K, [208])]


def main():
    rng = np.random.default_rng(20241130)
    out = {"generator": "gen_quant_fixture.py, gguf " + getattr(gguf, "__version__", "?"),
           "cases": []}
    for qtype, f16_fields in TYPES:
        block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        n_blocks = 2 if block_elems == 256 else 4
        raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
        # random bytes would make NaN/Inf scales: write finite f16 scales instead
        for b in range(n_blocks):
            for off in f16_fields:
                raw[b, off:off + 2] = np.frombuffer(
                    np.float16(rng.uniform(-0.05, 0.05)).tobytes(), dtype=np.uint8)
        values = dequantize(raw.reshape(-1), qtype).astype(np.float32).reshape(-1)
        out["cases"].append({"type": int(qtype), "name": qtype.name, "n": int(values.size),
                             "hex": raw.tobytes().hex(),
                             "values": [float(v) for v in values]})
    text = json.dumps(out, indent=1)
    import re
    text = re.sub(r"\[\s*([-0-9.e+,\s]*?)\s*\]",
                  lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")
                                            if x.strip()) + "]", text)
    print(text)


if __name__ == "__main__":
    main()
