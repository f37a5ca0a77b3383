"""KV methods from Python: Model.session(kv=...), MInferenceConfig's kv_type / attn_kwargs mapped
to the C runner's spec, MInference(...) on a minference.Model, and the transformers patch's
refusal of the methods it cannot run."""

import numpy as np
import pytest

import minference as mi
from minference import MInference, MInferenceConfig, Model
from minference.configuration import MInferenceConfig as Cfg

try:
    from minference import _lib

    _lib.load_model()
except mi.ModelLibraryNotFound as e:
    pytest.skip(f"no model runner library: {e}", allow_module_level=True)

SMALL = dict(n_layers=2, hidden=128, n_heads=4, n_kv_heads=2, head_dim=32, ffn=256, vocab=300)


def small(seed=0):
    m = Model.random(SMALL, seed=seed, threads=2)
    m.set_attention("dense")
    return m


def prompt(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, n).tolist()


def test_kv_spec_from_config():
    c = Cfg(attn_type="dense", kv_type="snapkv",
            attn_kwargs={"window_size": 16, "max_capacity_prompt": 512, "n_last": 3})
    assert c.kv_spec() == "snapkv:window_size=16,max_capacity_prompt=512"
    assert Cfg(attn_type="dense", kv_type="quest").kv_spec() == "quest"
    assert Cfg(attn_type="dense", kv_type="dense").kv_spec() is None
    c = Cfg(attn_type="dense", kv_type="streamingllm", attn_kwargs={"n_init": 4, "n_local": 60})
    assert c.kv_spec() == "streamingllm:n_init=4,n_local=60"
    for name in ("streamingllm", "snapkv", "pyramidkv", "quest"):
        assert name in Cfg.get_supported_kv_types()
    with pytest.raises(ValueError, match="unknown kv_type"):
        Cfg(attn_type="dense", kv_type="h2o")


def test_session_kv_budget_covers_is_dense():
    toks = prompt(200, seed=3)
    with small() as m:
        ref = m.session()
        want = [ref.prefill(toks[:150])] + [ref.decode(t) for t in toks[150:160]]
        for spec in ("snapkv:window_size=8,max_capacity_prompt=100000",
                     "streamingllm:n_init=4,n_local=100000", "quest:token_budget=100000",
                     "retr_attn:top_k=100000,n_init=4,n_local=8"):
            s = m.session(kv=spec)
            got = [s.prefill(toks[:150])] + [s.decode(t) for t in toks[150:160]]
            for a, b in zip(got, want):
                assert np.array_equal(a, b), spec
            assert s.stats["kv_rows"] == s.stats["n_tokens"] == 160


def test_session_kv_compacts_and_counts_positions():
    toks = prompt(260, seed=4)
    with small() as m:
        s = m.session(kv=Cfg(attn_type="dense", kv_type="snapkv",
                             attn_kwargs={"window_size": 8, "max_capacity_prompt": 64}))
        s.prefill(toks[:200])
        st = s.stats
        assert st["n_tokens"] == 200 and st["kv_rows"] == 64 and s.n_past == 200
        logits = s.decode(toks[200:205])
        assert np.isfinite(logits).all() and s.n_past == 205
        with pytest.raises(mi.MInferenceError, match="snapkv"):
            s.rewind(100)  # compacted away
        s.rewind(5)
        assert s.n_past == 200
        # StreamingLLM keeps decode memory bounded
        w = m.session(kv="streamingllm:n_init=4,n_local=32")
        w.prefill(toks[:20])
        most = 0
        for t in toks[20:220]:
            w.decode(t)
            most = max(most, w.stats["kv_rows"])
        assert w.n_past == 220 and 36 < most <= 36 + w.stats["page_tokens"]


def test_session_kivi_and_leank():
    toks = prompt(420, seed=6)
    with small() as m:
        ref = m.session()
        want = [ref.prefill(toks[:400])] + [ref.decode(t) for t in toks[400:410]]
        # bits=16 keeps the f32 pages: dense, bit for bit
        s = m.session(kv=Cfg(attn_type="dense", kv_type="kivi", attn_kwargs={"bits": 16}))
        got = [s.prefill(toks[:400])] + [s.decode(t) for t in toks[400:410]]
        assert all(np.array_equal(a, b) for a, b in zip(got, want))
        # 4 bits: near dense, a fraction of its bytes
        q = m.session(kv="kivi:bits=4")
        got = [q.prefill(toks[:400])] + [q.decode(t) for t in toks[400:410]]
        assert np.array_equal(got[0], want[0])  # the prefill reads its own f32 rows
        rel = max(np.linalg.norm(a - b) / np.linalg.norm(b) for a, b in zip(got[1:], want[1:]))
        assert 0 < rel < 1
        assert q.stats["bytes"] < 0.4 * ref.stats["bytes"]
        with pytest.raises(mi.MInferenceError, match="leank"):
            m.session(kv="leank")  # no mask file


def test_bad_specs():
    with small() as m:
        with pytest.raises(ValueError, match="no key 'window'"):
            m.session(kv="snapkv:window=3")
        with pytest.raises(ValueError, match="unknown kv method"):
            m.session(kv="h2o")
        with pytest.raises(ValueError):
            m.session(kv=42)


def test_minference_on_the_runner_and_generate():
    with small() as m:
        base = m.generate_tokens(prompt(40, seed=5), max_new_tokens=8)
        out = MInference("dense", kv_type="snapkv",
                         attn_kwargs={"max_capacity_prompt": 100000})(m)
        assert out is m and m.kv.startswith("snapkv")
        assert m.generate_tokens(prompt(40, seed=5), max_new_tokens=8) == base  # budget covers it
        m.set_kv("snapkv:window_size=4,max_capacity_prompt=16")
        assert len(m.generate_tokens(prompt(40, seed=5), max_new_tokens=8)) <= 8
        m.set_kv(None)
        assert m.kv is None


def test_hf_patch_runs_every_kv_method():
    # the transformers patch runs every method the C sessions run (test_hf_patch_kv.py)
    assert set(MInferenceConfig.get_supported_kv_types()) <= set(MInferenceConfig.HF_KV_TYPES)


def test_session_kv_dtype():
    """Pages stored in bf16 / fp8: the first prefill attends in f32 (the same logits), decode
    reads the rounded rows (close logits, fewer bytes); a bad dtype or combination raises."""
    toks = prompt(300, seed=3)
    with small() as m:
        ref = m.session()
        want = [ref.prefill(toks[:250])] + [ref.decode(t) for t in toks[250:260]]
        for dtype, bound, bytes_ratio in (("bf16", 2e-2, 0.51), ("fp8", 1e-1, 0.27)):
            s = m.session(kv_dtype=dtype)
            got = [s.prefill(toks[:250])] + [s.decode(t) for t in toks[250:260]]
            assert np.array_equal(got[0], want[0])
            rel = max(np.linalg.norm(a - b) / np.linalg.norm(b) for a, b in zip(got[1:], want[1:]))
            assert 0 < rel < bound, (dtype, rel)
            assert s.stats["bytes"] < bytes_ratio * ref.stats["bytes"]
        with pytest.raises(ValueError, match="kv_dtype"):
            m.session(kv_dtype="int3")
        with pytest.raises(mi.MInferenceError, match="kv_dtype"):
            m.session(kv="kivi", kv_dtype="fp8")  # KIVI keeps its own format
        # a method that selects rows reads stored pages: every row selected is no method
        s = m.session(kv="quest:token_budget=100000,dense_layers=0", kv_dtype="fp8")
        plain = m.session(kv_dtype="fp8")
        a = [s.prefill(toks[:250])] + [s.decode(t) for t in toks[250:255]]
        b = [plain.prefill(toks[:250])] + [plain.decode(t) for t in toks[250:255]]
        assert max(np.linalg.norm(x - y) / np.linalg.norm(y) for x, y in zip(a, b)) < 1e-5
