"""minference.Session.prefill_blend (CacheBlend) on a small random model: ratio 1 is the full
prefill, a lower ratio recomputes its share of the chunk tokens, bad calls raise."""

import numpy as np
import pytest

import minference as mi
from minference import MInferenceError, Model

try:
    from minference import _lib

    _lib.load_model()
except mi.ModelLibraryNotFound as e:
    pytest.skip(f"no model runner library: {e}", allow_module_level=True)

SMALL = dict(n_layers=3, hidden=128, n_heads=4, n_kv_heads=2, head_dim=32, ffn=256, vocab=300)


def tokens(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n).tolist()


def test_blend_matches_full_prefill_at_ratio_1():
    a, b, q = tokens(40, 1), tokens(33, 2), tokens(7, 3)
    with Model.random(SMALL, seed=4, threads=2) as m:
        m.set_attention("dense")
        full = m.session().prefill(a + b + q)
        ca, cb = m.session(), m.session()
        ca.prefill(a)
        cb.prefill(b)
        s = m.session()
        got, st = s.prefill_blend([(a, ca), (b, cb, 0)], q, recompute_ratio=1.0,
                                  return_stats=True)
        assert np.array_equal(got, full)
        assert s.n_past == 80 and st["n_tokens"] == 80 and st["n_recomputed"] == 73
        s2 = m.session()
        part, st = s2.prefill_blend([(a, ca), (b, cb)], q, return_stats=True)
        assert st["n_recomputed"] == int(np.ceil(0.15 * 73))
        assert part.shape == full.shape and not np.array_equal(part, full)
        s2.decode(5)  # the blended session goes on like any other
        assert s2.n_past == 81
        with pytest.raises(MInferenceError, match="empty session"):
            s2.prefill_blend([(a, ca)], q)
        with pytest.raises(MInferenceError):
            m.session().prefill_blend([(a, ca)], q, recompute_ratio=2.0)
        with pytest.raises(ValueError):
            m.session().prefill_blend([(a, "not a session")], q)
        with pytest.raises(ValueError):
            m.session().prefill_blend([(a, ca)], [])


def test_retr_attn_session_from_config():
    toks = tokens(300, 5)
    with Model.random(SMALL, seed=6, threads=2) as m:
        m.set_attention("dense")
        cfg = mi.MInferenceConfig(attn_type="dense", kv_type="retr_attn",
                                  attn_kwargs={"top_k": 16, "n_init": 4, "n_local": 32})
        assert cfg.kv_spec() == "retr_attn:top_k=16,n_init=4,n_local=32"
        s = m.session(kv=cfg)
        s.prefill(toks[:280])
        for t in toks[280:290]:
            logits = s.decode(t)
        assert np.isfinite(logits).all() and s.n_past == 290
        assert s.stats["kv_rows"] == 290  # the cache stays whole; only reading is sparse
