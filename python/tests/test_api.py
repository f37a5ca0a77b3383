"""Configs, errors, the original's public names, synthetic data and metrics."""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

import minference as mi
from minference import MInference, MInferenceConfig, MInferenceError
from conftest import qkv, reference_attention
from minference.core import patterns_array


# ---- library basics ----------------------------------------------------------------------------

def test_version_and_features():
    assert mi.version() == "0.1.0"
    assert mi.version_number() == (0 << 16) | (1 << 8) | 0
    assert "cpu" in mi.build_features()
    assert mi.cuda_device_count() >= 0
    assert mi.status_name(2) == "MI_STATUS_SHAPE_MISMATCH"
    assert mi.pattern_name(mi.pattern_from_name("a_shape")) == "stream_llm"
    assert mi.f16_to_f32(mi.f32_to_f16(1.5)) == 1.5
    assert mi.bf16_to_f32(mi.f32_to_bf16(-2.0)) == -2.0
    assert mi.dtype_name(1) == "f16" or "16" in mi.dtype_name(1)


def test_build_commit_names_the_checkout():
    """The library built from this checkout names its commit (the hash HEAD starts with)."""
    commit = mi.build_commit()
    assert commit
    root = Path(__file__).resolve().parents[2]
    if not Path(mi.library_path()).resolve().is_relative_to(root):
        pytest.skip("the loaded library was built elsewhere")
    try:
        head = subprocess.check_output(["git", "-C", str(root), "rev-parse", "HEAD"], text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        assert commit == "unknown"
        return
    short = commit.removesuffix("-dirty")
    assert len(short) >= 7 and head.startswith(short), (commit, head)


def test_context_threads():
    with mi.Context("cpu", n_threads=1) as ctx:
        assert ctx.n_threads == 1
        rng = np.random.default_rng(0)
        q, k, v = qkv(rng, 1, 2, 2, 70, 16)
        out = mi.dense_attention(q, k, v, ctx=ctx)
        np.testing.assert_allclose(out, reference_attention(q, k, v)[0], atol=2e-5, rtol=2e-4)
        with pytest.raises(MInferenceError) as e:
            ctx.set_stream(None)  # streams apply to CUDA contexts only
        assert e.value.status_name == "MI_STATUS_INVALID_ARGUMENT"


def test_context_tuning():
    """Kernel-path choices set from Python: replaced whole, validated first, results unchanged."""
    rng = np.random.default_rng(1)
    q, k, v = qkv(rng, 1, 2, 2, 130, 32)
    with mi.Context("cpu", n_threads=1) as ctx:
        assert ctx.tuning == ""
        ref = mi.dense_attention(q, k, v, ctx=ctx)
        ctx.tuning = "cpu_engine=base,sm90_sparse=1"  # CUDA fields are accepted on the CPU
        assert set(ctx.tuning.split(",")) == {"cpu_engine=1", "sm90_sparse=1"}
        out = mi.dense_attention(q, k, v, ctx=ctx)
        np.testing.assert_allclose(out, ref, atol=2e-5, rtol=2e-4)
        with pytest.raises(MInferenceError) as e:
            ctx.tuning = "no_such_field=1"
        assert e.value.status_name == "MI_STATUS_INVALID_ARGUMENT"
        assert "no_such_field" in str(e.value)
        assert set(ctx.tuning.split(",")) == {"cpu_engine=1", "sm90_sparse=1"}  # unchanged
        ctx.tuning = "bs_split=-1"  # replaces, does not add
        assert ctx.tuning == "bs_split=-1"
        ctx.tuning = None
        assert ctx.tuning == ""
        with pytest.raises(TypeError):
            ctx.tuning = 3


# ---- configs -----------------------------------------------------------------------------------

ORIGINAL_STYLE = [
    {"0": ["vertical_and_slash", 1000, 6096, 0.91], "1": ["stream_llm", 100, 800, 0.5],
     "2": ["vertical_and_slash", 30, 800, 12]},
    {"1": ["block_sparse", 8, 1, 0.3], "2": ["block_sparse", 0, 0]},
]


def test_config_parse_layers_and_defaults():
    cfg = mi.Config.from_list(ORIGINAL_STYLE)
    assert cfg.n_layers == 2 and cfg.n_heads == 3
    pats, scores = cfg.layer(0, 4)
    assert pats[0].to_c().vertical_size == 1000 and pats[0].to_c().slash_size == 6096
    assert pats[1].name == "stream_llm" and pats[1].to_c().n_init == 100
    assert pats[1].to_c().n_local == 800
    assert pats[2].to_c().vertical_size == 30
    assert pats[3].name == "vertical_and_slash"  # missing head -> default
    assert scores[0] == pytest.approx(0.91) and np.isnan(scores[3])
    pats1, _ = cfg.layer(1, 4)
    assert pats1[1].name == "block_sparse" and pats1[1].to_c().top_k == 8  # first size = blocks
    assert pats1[2].to_c().top_k == 100  # 0: the original's fixed budget, not none
    # The same entries given as patterns directly, not through a Config.
    assert patterns_array([["block_sparse", 0, 0]])[0].top_k == 100
    assert patterns_array([["block_sparse", 8, 1]])[0].top_k == 8
    cfg.check(2, 3)
    cfg.check(32, 32)  # fewer layers / heads than the model: defaults fill them
    with pytest.raises(MInferenceError) as e:
        cfg.check(1, 3)
    assert e.value.status == 2 and e.value.status_name == "MI_STATUS_SHAPE_MISMATCH"
    assert "layer" in e.value.message


def test_config_round_trip(tmp_path):
    cfg = mi.Config.create(3, 4)
    cfg.set_head(0, 1, mi.HeadPattern.a_shape(64, 512), 0.25)
    cfg.set_head(1, 2, mi.HeadPattern.vertical_slash(30, 800), 0.75)
    cfg.set_head(2, 3, "dense")
    cfg.set_head(2, 0, mi.HeadPattern.tri_shape(32, 256))
    text = cfg.to_json()
    data = json.loads(text)
    assert data[0]["1"][:3] == ["stream_llm", 64, 512] and data[0]["1"][3] == 0.25
    path = tmp_path / "cfg.json"
    cfg.save(path)
    back = mi.Config.load(path)
    for layer in range(3):
        a, sa = cfg.layer(layer, 4)
        b, sb = back.layer(layer, 4)
        assert [p.to_c().type for p in a] == [p.to_c().type for p in b]
        for pa, pb in zip(a, b):
            ca, cb = pa.to_c(), pb.to_c()
            assert (ca.vertical_size, ca.slash_size, ca.n_init, ca.n_local) == (
                cb.vertical_size, cb.slash_size, cb.n_init, cb.n_local)
        np.testing.assert_array_equal(np.isnan(sa), np.isnan(sb))
    assert mi.Config.parse(back.to_json()).to_list() == back.to_list()


@pytest.mark.parametrize("text,status", [
    ("[{", "MI_STATUS_PARSE_ERROR"),
    ('{"0": 1}', "MI_STATUS_PARSE_ERROR"),
    ('[{"0": ["bogus", 1, 2, 3]}]', "MI_STATUS_PARSE_ERROR"),
])
def test_config_malformed(text, status):
    with pytest.raises(MInferenceError) as e:
        mi.Config.parse(text)
    assert e.value.status_name == status and e.value.message


def test_config_missing_file(tmp_path):
    with pytest.raises(MInferenceError) as e:
        mi.Config.load(tmp_path / "nope.json")
    assert e.value.status_name == "MI_STATUS_IO_ERROR"
    assert "nope.json" in str(e.value)


# ---- errors: a status or a ValueError, never a crash -------------------------------------------

def test_bad_shapes_and_dtypes(rng):
    q, k, v = qkv(rng, 1, 4, 2, 64, 16)
    with pytest.raises(ValueError):
        mi.dense_attention(q[0], k, v)  # 3-D
    with pytest.raises(ValueError):
        mi.dense_attention(q.astype(np.float64), k, v)  # float64 is not a kernel dtype
    with pytest.raises(ValueError):
        mi.dense_attention(q.astype(np.int32), k, v)
    with pytest.raises(TypeError):
        mi.dense_attention([[1.0]], k, v)
    with pytest.raises(MInferenceError) as e:
        mi.dense_attention(q, k[:, :, :32], v)  # L differs
    assert e.value.status_name == "MI_STATUS_SHAPE_MISMATCH" and "k is" in e.value.message
    with pytest.raises(MInferenceError) as e:
        mi.dense_attention(q, k.astype(np.float16), v)  # dtype differs
    assert e.value.status_name == "MI_STATUS_SHAPE_MISMATCH"
    q3 = np.zeros((1, 3, 64, 16), np.float32)
    with pytest.raises(MInferenceError) as e:
        mi.dense_attention(q3, k, v)  # 3 % 2 != 0
    assert "multiple" in e.value.message
    big = np.zeros((1, 1, 8, 300), np.float32)
    with pytest.raises(MInferenceError) as e:
        mi.dense_attention(big, big, big)  # head_dim > 256
    assert e.value.status_name == "MI_STATUS_UNSUPPORTED"
    with pytest.raises(MInferenceError) as e:
        mi.dense_attention(q, k, v, seq_lens=[65])
    assert e.value.status_name == "MI_STATUS_INVALID_ARGUMENT"
    with pytest.raises(ValueError):
        mi.dense_attention(q, k, v, seq_lens=[1, 2])  # one length per sequence
    empty = np.zeros((1, 4, 0, 16), np.float32)
    with pytest.raises(MInferenceError):
        mi.dense_attention(empty, empty[:, :2], empty[:, :2])
    with pytest.raises(ValueError):
        mi.dense_attention(q, k, v, scale=float("nan"))
    with pytest.raises(ValueError):
        mi.prefill_attention(q, k, v, [mi.HeadPattern.dense()] * 3)  # 3 patterns for 4 heads
    with pytest.raises(MInferenceError):
        mi.pattern_from_name("nope")
    with pytest.raises(ValueError):
        mi.block_sparse_attention(q, k, v, top_k=-1)
    with pytest.raises(ValueError):
        mi.vertical_slash_sparse_attention(q, k, v, np.zeros((1, 3, 2), int), [0])


def test_error_is_reported_not_written(rng):
    q, k, v = qkv(rng, 1, 2, 2, 64, 16)
    out = np.full_like(q, 7.0)
    with pytest.raises(MInferenceError):
        mi.dense_attention(q, k[:, :, :10], v, out=out)
    assert (out == 7.0).all(), "outputs are not written on error"


# ---- the original's names ----------------------------------------------------------------------

def test_minference_config_lists():
    attn = MInferenceConfig.get_available_attn_types()
    for t in ["minference", "vllm_minference", "tri_mix_minference", "hf", "vllm", "dense", "static",
              "dilated1", "dilated2", "a_shape", "tri_shape", "vllm_a_shape", "vllm_tri_shape",
              "inf_llm", "flexprefill", "vllm_flexprefill", "xattention", "tri_mix"]:
        assert t in attn
    assert len(attn) == 18
    assert MInferenceConfig.get_available_kv_types() == [
        "dense", "streamingllm", "snapkv", "pyramidkv", "quest", "retr_attn", "kivi", "leank"]
    models = mi.get_support_models()
    assert len(models) == 18
    assert "gradientai/Llama-3-8B-Instruct-262k" in models
    assert "meta-llama/Meta-Llama-3.1-8B-Instruct" in models
    assert "Qwen/Qwen2.5-7B-Instruct-1M" in models
    assert set(MInferenceConfig.get_supported_attn_types()) <= set(attn)


@pytest.mark.parametrize("attn_type", ["vllm", "vllm_minference"])
def test_unimplemented_attn_types(attn_type):
    with pytest.raises(NotImplementedError, match="not implemented"):
        MInference(attn_type)


def test_inf_llm_config():
    # the original's MInference("inf_llm") settings, its argument names mapped to the pattern
    p = MInference("inf_llm").config.head_pattern()
    assert (p.type, p.top_k, p.n_local, p.n_init, p.block_size, p.repr_topk, p.chunk_size,
            p.per_head) == ("inf_llm", 16, 4096, 128, 128, 4, 512, 0)
    p = MInference("inf_llm", attn_kwargs={"topk": 4, "exc_block_size": 256,
                                           "perhead": True}).config.head_pattern()
    assert (p.top_k, p.chunk_size, p.per_head) == (4, 256, 1)
    assert mi.HeadPattern.parse("infllm:8:1024").to_c().n_local == 1024
    with pytest.raises(ValueError, match="dense_decoding"):
        MInference("inf_llm", attn_kwargs={"dense_decoding": False}).config.head_pattern()
    with pytest.raises(ValueError, match="chunk_topk_calc"):
        MInference("inf_llm", attn_kwargs={"chunk_topk_calc": 2048}).config.head_pattern()


@pytest.mark.parametrize("kv_type", ["snapkv", "pyramidkv", "quest", "streamingllm", "retr_attn",
                                     "kivi", "leank"])
def test_runner_kv_types(kv_type):  # the C runner's sessions run them (python/tests/test_kv.py)
    assert MInference("minference", kv_type=kv_type).config.kv_spec() == kv_type


def test_minference_constructor():
    with pytest.raises(ValueError):
        MInference("no_such_type")
    with pytest.raises(ValueError, match="config_path"):
        MInferenceConfig("minference", is_search=True)  # the output file is required
    assert MInferenceConfig("minference", is_search=True,
                            config_path="/tmp/not-yet.json").config_path == "/tmp/not-yet.json"
    with pytest.raises(FileNotFoundError):
        MInference("minference", config_path="/nonexistent/config.json")
    m = MInference("minference", "meta-llama/Llama-3.1-8B-Instruct")
    assert m.config.config_path.endswith(mi.MODEL2PATH["meta-llama/Llama-3.1-8B-Instruct"])
    m = MInference("minference", "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert m.config.config_path is None  # none shipped: default budgets (with a warning at patch)
    assert "minference search" in m.config.missing_config_message("x")
    assert MInference("minference_with_dense").config.attn_type == "dense"
    tm = MInference("tri_mix", attn_kwargs={"last_n": 64})
    assert tm.config.attn_kwargs["n_last"] == 64 and tm.config.attn_kwargs["starting_layer"] == 16
    assert MInference("a_shape").config.attn_kwargs["n_local"] == 3968
    model = object()
    assert MInference("hf")(model) is model


def test_shipped_configs():
    """Every supported model's shipped config loads with its model's shape; the library's map is
    the Python one; a path holding a model's name finds its config."""
    from minference import _lib as L
    from minference.configuration import shipped_config_path

    lib = L.load()
    names = [lib.mi_config_model_name(i).decode() for i in range(lib.mi_config_model_count())]
    assert names == mi.get_support_models()
    for name in names:
        assert lib.mi_config_model_file(name.encode()).decode() == mi.MODEL2PATH[name]
        path = shipped_config_path(name)
        assert path and path.endswith(mi.MODEL2PATH[name])
        cfg = mi.Config.load(path)
        assert cfg.n_layers in (28, 32, 40, 48, 64, 80) and cfg.n_heads in (28, 32, 40, 64)
        assert MInferenceConfig("minference", name).config_path == path
    p = shipped_config_path("/models/Qwen2.5-7B-Instruct-1M-Q4_K_M.gguf")
    assert p and p.endswith("Qwen2.5_7B_Instruct_1M.json")
    assert shipped_config_path("/models/SmolLM2-135M-Instruct.gguf") is None
    assert MInferenceConfig("dense", names[0]).config_path is None  # no config for dense


def test_config_dir_lookup(tmp_path, monkeypatch):
    name = "Qwen/Qwen2-7B-Instruct"
    (tmp_path / mi.MODEL2PATH[name]).write_text(json.dumps(ORIGINAL_STYLE))
    monkeypatch.setenv("MINFERENCE_CONFIG_DIR", str(tmp_path))
    cfg = MInferenceConfig("minference", name)
    assert cfg.config_path == str(tmp_path / mi.MODEL2PATH[name])


# ---- synthetic data and metrics ----------------------------------------------------------------

def test_synth_and_metrics():
    q, k, v, truth = mi.synth_generate(2, 4, 2, 300, 32, seed=11, n_verticals=3, n_slashes=2)
    assert q.shape == (2, 4, 300, 32) and k.shape == (2, 2, 300, 32)
    assert np.isfinite(q).all() and np.abs(q).sum() > 0
    assert truth["vertical_cols"].shape == (4, 3)
    q2, *_ = mi.synth_generate(2, 4, 2, 300, 32, seed=11, n_verticals=3, n_slashes=2)
    np.testing.assert_array_equal(q, q2)  # seeded
    pats = [mi.HeadPattern.dense(), mi.HeadPattern.vertical_slash(300, 300),
            mi.HeadPattern.a_shape(4, 16), mi.HeadPattern.vertical_slash(30, 50)]
    m = mi.metrics_evaluate(q, k, pats, params={"dense_below": 0})
    assert m.shape == (2, 4)
    np.testing.assert_allclose(m["recall"][:, :2], 1.0, atol=1e-6)
    np.testing.assert_allclose(m["density"][:, :2], 1.0, atol=1e-6)
    assert (m["density"][:, 2] < 0.2).all() and (m["recall"][:, 2] < 1).all()
    assert ((m["flops"] <= m["dense_flops"] * (1 + 1e-9))).all()
    out = mi.dense_attention(q, k, v)
    assert mi.metrics_rel_l2(out, out.copy()) == 0.0
    ref = reference_attention(q, k, v)[0]
    noisy = (ref * 1.01).astype(np.float32)
    assert mi.metrics_rel_l2(noisy, out) == pytest.approx(0.01, rel=1e-3)
