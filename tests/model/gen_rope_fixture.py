#!/usr/bin/env python3
"""Writes rope_fixture.json: RoPE inverse frequencies and cos/sin multipliers computed by Hugging
Face transformers' own rope initialisation functions, for test_model_rope.c.
Run: python3 gen_rope_fixture.py > rope_fixture.json   (needs torch and transformers)"""
import json
import re

import numpy as np
import transformers
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

CASES = [
    # name, head_dim, theta, max_position_embeddings, rope parameters, seq_len
    ("default", 64, 10000.0, 2048, {"rope_type": "default"}, None),
    ("linear", 64, 10000.0, 2048, {"rope_type": "linear", "factor": 4.0}, None),
    ("dynamic_short", 64, 10000.0, 2048, {"rope_type": "dynamic", "factor": 2.0}, 1000),
    ("dynamic_long", 64, 10000.0, 2048, {"rope_type": "dynamic", "factor": 2.0}, 8192),
    ("llama3", 128, 500000.0, 131072,
     {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}, None),
    ("yarn", 128, 10000.0, 16384,
     {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}, None),
    ("yarn_beta", 64, 1000000.0, 131072,
     {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16384,
      "beta_fast": 16.0, "beta_slow": 2.0, "attention_factor": 1.25}, None),
]
POSITIONS = [0, 1, 17, 1000, 100000]


def main():
    out = {"generator": "gen_rope_fixture.py, transformers " + transformers.__version__,
           "cases": []}
    for name, hd, theta, max_pos, params, seq_len in CASES:
        p = dict(params)
        p["rope_theta"] = theta
        cfg = LlamaConfig(hidden_size=hd * 4, num_attention_heads=4, head_dim=hd,
                          max_position_embeddings=max_pos, rope_parameters=p)
        fn = ROPE_INIT_FUNCTIONS[p["rope_type"]] if p["rope_type"] != "default" else None
        if fn is None:
            inv = 1.0 / (theta ** (np.arange(0, hd, 2, dtype=np.int64).astype(np.float32) / hd))
            inv = inv.astype(np.float32)
            mscale = 1.0
        else:
            kw = {"seq_len": seq_len} if seq_len is not None else {}
            t, mscale = fn(cfg, "cpu", **kw)
            inv = t.float().numpy()
        # cos(pos * inv) with the product formed in fp32, as the model does
        table = []
        for pos in POSITIONS:
            arg = (np.float32(pos) * inv).astype(np.float32)
            table.append({"pos": pos,
                          "cos": [float(np.cos(a.astype(np.float64)) * mscale) for a in arg[:4]],
                          "sin": [float(np.sin(a.astype(np.float64)) * mscale) for a in arg[:4]]})
        scaling = {k: v for k, v in params.items() if k != "rope_type"}
        out["cases"].append({
            "name": name, "type": p["rope_type"], "dim": hd, "theta": theta,
            "max_position_embeddings": max_pos, "seq_len": seq_len or 0, "params": scaling,
            "inv_freq": [float(x) for x in inv], "mscale": float(mscale), "table": table})
    text = json.dumps(out, indent=1)
    # number lists on one line each
    text = re.sub(r"\[\s*([-0-9.e+,\s]*?)\s*\]",
                  lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")
                                            if x.strip()) + "]", text)
    print(text)


if __name__ == "__main__":
    main()
