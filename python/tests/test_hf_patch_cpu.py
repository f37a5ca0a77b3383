"""The transformers patch on the CPU: small random Llama / Qwen2 / Mistral models, patched against
unpatched. Skipped where torch or transformers is not installed (scripts/test_python.sh installs
both unless MI_TEST_TRANSFORMERS=0)."""

import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "AttentionInterface"):
    pytest.skip("transformers without AttentionInterface", allow_module_level=True)

import minference as mi  # noqa: E402
from hf_helpers import (  # noqa: E402
    full_budget_entries,
    generate,
    left_pad,
    make_model,
    make_tokenizer,
    prefill_logits,
    random_ids,
    rel_l2,
    right_pad,
    sparse_entries,
    write_config,
)

L = 700  # several 64-blocks, not a multiple of 64, quick on two cores
FORCE_SPARSE = {"dense_below": 0}  # the library's dense crossover would otherwise take short prompts


@pytest.fixture(scope="module", params=["llama", "qwen2", "mistral"])
def arch_model(request):
    return request.param, make_model(request.param)


def _patched(model, *args, **kw):
    mi.unpatch(model)
    return mi.MInference(*args, **kw)(model)


def test_dense_patch_equals_unpatched(arch_model):
    arch, model = arch_model
    mi.unpatch(model)
    ids = random_ids(L)
    ref = prefill_logits(model, ids)
    ref_gen = generate(model, ids)
    _patched(model, "dense")
    assert model.config._attn_implementation == "minference"
    out = prefill_logits(model, ids)
    err = rel_l2(out, ref)
    print(f"{arch} dense: rel L2 of logits {err:.2e}")
    assert err < 1e-5
    assert torch.equal(generate(model, ids), ref_gen)
    assert model._minference_state.calls["sparse"] > 0
    mi.unpatch(model)


def test_sparse_full_budgets_equal(arch_model, tmp_path):
    arch, model = arch_model
    mi.unpatch(model)
    ids = random_ids(L, seed=2)
    ref = prefill_logits(model, ids)
    ref_gen = generate(model, ids)
    cfg = write_config(tmp_path / "full.json", model.config.num_hidden_layers,
                       model.config.num_attention_heads, full_budget_entries(L))
    _patched(model, "minference", config_path=cfg, attn_kwargs=FORCE_SPARSE)
    err = rel_l2(prefill_logits(model, ids), ref)
    print(f"{arch} minference full budgets: rel L2 of logits {err:.2e}")
    assert err < 1e-5
    assert torch.equal(generate(model, ids), ref_gen)
    mi.unpatch(model)


def test_sparse_budgets_close(arch_model, tmp_path):
    arch, model = arch_model
    mi.unpatch(model)
    ids = random_ids(L, seed=3)
    ref = prefill_logits(model, ids)
    cfg = write_config(tmp_path / "sparse.json", model.config.num_hidden_layers,
                       model.config.num_attention_heads, sparse_entries())
    _patched(model, "minference", config_path=cfg, attn_kwargs=FORCE_SPARSE)
    out = prefill_logits(model, ids)
    err = rel_l2(out, ref)
    agree = float((out.argmax(-1) == ref.argmax(-1)).float().mean())
    print(f"{arch} minference sparse budgets: rel L2 of logits {err:.3e}, argmax agreement {agree:.3f}")
    assert torch.isfinite(out).all()
    assert err < 0.5
    mi.unpatch(model)


def test_default_budgets_warn(tmp_path):
    model = make_model("llama")
    ids = random_ids(300)
    ref = prefill_logits(model, ids)
    # a model name without a shipped config gets the default budgets, with a warning
    with pytest.warns(UserWarning, match="minference search"):
        mi.MInference("minference", "my-org/tiny-llama-for-tests")(model)
    # 1000 / 6096 cover a 300-token prompt: same as dense.
    assert rel_l2(prefill_logits(model, ids), ref) < 1e-5


def test_batch_left_and_right_padding(tmp_path):
    model = make_model("llama", seed=4)
    seqs = [random_ids(n, seed=10 + n)[0] for n in (L, 420, 130)]
    cfg = write_config(tmp_path / "full.json", 2, 4, full_budget_entries(L))
    for pad in (left_pad, right_pad):
        mi.unpatch(model)
        ids, mask = pad(seqs)
        ref = prefill_logits(model, ids, mask)
        ref_gen = generate(model, ids, mask) if pad is left_pad else None
        for attn, kw in (("dense", {}), ("minference", {"config_path": cfg})):
            _patched(model, attn, attn_kwargs=FORCE_SPARSE, **kw)
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # the masks must be expressed, not fall back
                out = prefill_logits(model, ids, mask)
            assert model._minference_state.calls == {"sparse": 2, "dense_fallback": 0, "offset": 0}
            for i, s in enumerate(seqs):
                real = mask[i].bool()
                err = rel_l2(out[i][real], ref[i][real])
                print(f"{pad.__name__} {attn} seq {i} ({len(s)} tokens): rel L2 {err:.2e}")
                assert err < 1e-5
            if ref_gen is not None:
                assert torch.equal(generate(model, ids, mask), ref_gen)
    mi.unpatch(model)


def test_gqa_passes_kv_heads_unrepeated(monkeypatch):
    model = make_model("qwen2", heads=8, kv_heads=2, hidden=256)
    seen = []
    import minference.ops as ops

    real = ops.prefill_attention

    def spy(q, k, v, *a, **kw):
        seen.append((q.shape[1], k.shape[1], v.shape[1]))
        return real(q, k, v, *a, **kw)

    monkeypatch.setattr(ops, "prefill_attention", spy)
    mi.MInference("dense")(model)
    prefill_logits(model, random_ids(200))
    assert seen and all(s == (8, 2, 2) for s in seen)


def test_follow_up_turn_runs_sparse_and_decode_stays_dense():
    model = make_model("llama", seed=5)
    ids = random_ids(300, seed=6)
    more = random_ids(40, seed=7)
    mi.unpatch(model)
    import inspect

    # transformers renamed past_key_values to cache in 5.x; use whichever this version takes.
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def past(r):
        return {name: r.past_key_values if hasattr(r, "past_key_values") else r.cache}

    with torch.no_grad():
        r1 = model(ids, use_cache=True)
        r2 = model(more, use_cache=True, **past(r1))
        r3 = model(more[:, :1], use_cache=True, **past(r2))
    mi.MInference("dense", attn_kwargs=FORCE_SPARSE)(model)
    st = model._minference_state
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            p1 = model(ids, use_cache=True)
            p2 = model(more, use_cache=True, **past(p1))
            assert st.calls == {"sparse": 4, "dense_fallback": 0, "offset": 2}  # the turn: offset
            p3 = model(more[:, :1], use_cache=True, **past(p2))
    assert st.calls == {"sparse": 4, "dense_fallback": 2, "offset": 2}  # decode: sdpa
    for p, r in ((p1, r1), (p2, r2), (p3, r3)):
        assert rel_l2(p.logits, r.logits) < 1e-5


def test_pipeline_text_generation():
    model = make_model("llama", seed=8)
    tok = make_tokenizer()
    prompt = " ".join(f"w{i % 500}" for i in range(400))
    pipe = transformers.pipeline("text-generation", model=model, tokenizer=tok, device="cpu")
    ref = pipe(prompt, max_new_tokens=6, do_sample=False)[0]["generated_text"]
    mi.MInference("dense")(model)
    out = pipe(prompt, max_new_tokens=6, do_sample=False)[0]["generated_text"]
    assert out == ref
    assert model._minference_state.calls["sparse"] > 0


def test_sliding_window():
    # Dense within a window shorter than the prompt runs as an A-shape without sinks; sparse
    # patterns cannot be combined with the window: sdpa, with a warning.
    model = make_model("mistral", sliding_window=128, seed=9)
    ids = random_ids(300)
    ref = prefill_logits(model, ids)
    mi.MInference("dense", attn_kwargs=FORCE_SPARSE)(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = prefill_logits(model, ids)
    assert model._minference_state.calls == {"sparse": 2, "dense_fallback": 0, "offset": 0}
    assert rel_l2(out, ref) < 1e-5
    # With left padding too.
    seqs = [random_ids(n, seed=n)[0] for n in (300, 200)]
    ids2, mask2 = left_pad(seqs)
    mi.unpatch(model)
    ref2 = prefill_logits(model, ids2, mask2)
    mi.MInference("dense", attn_kwargs=FORCE_SPARSE)(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out2 = prefill_logits(model, ids2, mask2)
    for i in range(2):
        real = mask2[i].bool()
        assert rel_l2(out2[i][real], ref2[i][real]) < 1e-5
    mi.unpatch(model)
    mi.MInference("a_shape", attn_kwargs=FORCE_SPARSE)(model)
    with pytest.warns(UserWarning, match="sliding window"):
        out = prefill_logits(model, ids)
    assert rel_l2(out, ref) < 1e-6


def test_fallbacks_warn_and_stay_correct():
    # Gradients: the kernels are inference only.
    model = make_model("llama", seed=9)
    mi.MInference("dense")(model)
    model.model.embed_tokens.weight.requires_grad_(True)
    with pytest.warns(UserWarning, match="inference only"):
        model(random_ids(100)).logits.sum().backward()


def test_unsupported_types_raise_before_touching_the_model():
    model = make_model("llama")
    with pytest.raises(NotImplementedError):
        mi.MInference("vllm")(model)
    with pytest.raises(ValueError, match="leank"):  # a KV method without its mask file
        mi.MInference("dense", kv_type="leank")(model)
    assert model.config._attn_implementation == "sdpa"


def test_is_search_writes_a_config(tmp_path):
    model = make_model("qwen2", seed=13)
    ids = random_ids(L, seed=14)
    ref = prefill_logits(model, ids)
    out_path = tmp_path / "searched.json"
    mi.MInference("minference", is_search=True, config_path=str(out_path),
                  attn_kwargs={"search": {"mode": "adaptive", "target_recall": 0.9}})(model)
    with pytest.warns(UserWarning, match="search complete"):
        logits = prefill_logits(model, ids)
    assert rel_l2(logits, ref) < 1e-6  # the model runs dense while searching
    cfg = mi.Config.load(out_path)
    assert cfg.n_layers == model.config.num_hidden_layers
    assert cfg.n_heads == model.config.num_attention_heads
    mi.unpatch(model)
    # The searched config drives the sparse patch.
    mi.MInference("minference", config_path=str(out_path), attn_kwargs=FORCE_SPARSE)(model)
    out = prefill_logits(model, ids)
    print(f"searched config: rel L2 of logits {rel_l2(out, ref):.3e}")
    assert torch.isfinite(out).all() and rel_l2(out, ref) < 0.5
