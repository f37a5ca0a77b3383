"""The transformers patch with queries at an offset (CPU): a prompt prefilled in chunks through
transformers' cache, and follow-up turns, run on the library instead of falling back to sdpa.
Skipped where torch or transformers is not installed."""

import inspect
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "AttentionInterface"):
    pytest.skip("transformers without AttentionInterface", allow_module_level=True)

import minference as mi  # noqa: E402
import minference.ops as ops  # noqa: E402
from hf_helpers import (  # noqa: E402
    full_budget_entries,
    left_pad,
    make_model,
    random_ids,
    rel_l2,
    sparse_entries,
    write_config,
)

FORCE_SPARSE = {"dense_below": 0}
L = 700
CHUNKS = ((0, 250), (250, 251), (251, 480), (480, 700))  # one chunk of a single token (decode)


def _cache_kw(model):
    # transformers renamed past_key_values to cache in 5.x; use whichever this version takes.
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@torch.no_grad()
def chunked_logits(model, ids, chunks=CHUNKS, cache=None):
    from transformers import DynamicCache

    cache = DynamicCache() if cache is None else cache
    outs = []
    for a, b in chunks:
        outs.append(model(ids[:, a:b], use_cache=True, **{_cache_kw(model): cache}).logits)
    return torch.cat(outs, 1), cache


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_chunked_prefill_dense_equals_one_pass(arch):
    model = make_model(arch, seed=21)
    ids = random_ids(L, seed=22)
    with torch.no_grad():
        ref = model(ids).logits
    ref_chunked, _ = chunked_logits(model, ids)  # sdpa over the cache: the same logits
    assert rel_l2(ref_chunked, ref) < 1e-5
    mi.MInference("dense", attn_kwargs=FORCE_SPARSE)(model)
    st = model._minference_state
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback, no warning
        out, _ = chunked_logits(model, ids)
    n_layers = model.config.num_hidden_layers
    # chunk 1 is a fresh prompt, chunks 3 and 4 sit at an offset, chunk 2 is one token (sdpa)
    assert st.calls == {"sparse": 3 * n_layers, "dense_fallback": n_layers, "offset": 2 * n_layers}
    err = rel_l2(out, ref)
    print(f"{arch} chunked dense: rel L2 of logits against one pass {err:.2e}")
    assert err < 1e-5
    mi.unpatch(model)


def test_chunked_a_shape_equals_one_pass():
    # A-shape works by absolute position: a chunk's rows see the same keys as in one pass.
    model = make_model("llama", seed=23)
    ids = random_ids(L, seed=24)
    kw = {"n_init": 16, "n_local": 96, **FORCE_SPARSE}
    mi.MInference("a_shape", attn_kwargs=kw)(model)
    with torch.no_grad():
        one = model(ids).logits
    with torch.no_grad():
        dense_ref = mi.unpatch(model)(ids).logits
    mi.MInference("a_shape", attn_kwargs=kw)(model)
    # no one-token chunk here: decode reads every key (sdpa), as the original's decode does
    out, _ = chunked_logits(model, ids, ((0, 250), (250, 480), (480, 700)))
    assert model._minference_state.calls["offset"] == 2 * model.config.num_hidden_layers
    err = rel_l2(out, one)
    print(f"chunked A-shape against one pass: rel L2 {err:.2e} (against dense "
          f"{rel_l2(out, dense_ref):.2e})")
    assert err < 1e-5
    assert rel_l2(out, dense_ref) > 1e-3  # the window really drops keys
    mi.unpatch(model)


def test_chunked_sparse_matches_the_library_on_the_same_tensors(tmp_path, monkeypatch):
    model = make_model("llama", seed=25)
    ids = random_ids(L, seed=26)
    cfg = write_config(tmp_path / "sparse.json", model.config.num_hidden_layers,
                       model.config.num_attention_heads, sparse_entries())
    mi.MInference("minference", config_path=cfg, attn_kwargs=FORCE_SPARSE)(model)
    seen = []
    real = ops.prefill_attention

    def spy(q, k, v, patterns, params=None, **kw):
        res = real(q, k, v, patterns, params, **kw)
        if q.shape[2] < k.shape[2]:
            seen.append((q.clone(), k.clone(), v.clone(), list(patterns), params,
                         kw["out"].clone()))
        return res

    monkeypatch.setattr(ops, "prefill_attention", spy)
    with torch.no_grad():
        dense_ref = mi.unpatch(model)(ids).logits
    mi.MInference("minference", config_path=cfg, attn_kwargs=FORCE_SPARSE)(model)
    out, _ = chunked_logits(model, ids)
    assert len(seen) == 2 * model.config.num_hidden_layers
    for q, k, v, patterns, params, got in seen:
        assert q.shape[2] < k.shape[2]
        # the library called directly, on copies of the same q / k / v
        want = real(q.clone().contiguous(), k.clone().contiguous(), v.clone().contiguous(),
                    patterns, params)
        assert torch.equal(got, want)
        dense = real(q.clone(), k.clone(), v.clone(), "dense", params)
        assert rel_l2(want, dense) > 1e-4  # the sparse patterns drop keys here
    err = rel_l2(out, dense_ref)
    print(f"chunked sparse against dense: rel L2 of logits {err:.3e}")
    assert torch.isfinite(out).all() and err < 0.5
    mi.unpatch(model)


def test_chunked_full_budgets_equal_dense(tmp_path):
    model = make_model("qwen2", seed=27)
    ids = random_ids(L, seed=28)
    with torch.no_grad():
        ref = model(ids).logits
    cfg = write_config(tmp_path / "full.json", model.config.num_hidden_layers,
                       model.config.num_attention_heads, full_budget_entries(L))
    mi.MInference("minference", config_path=cfg, attn_kwargs=FORCE_SPARSE)(model)
    out, _ = chunked_logits(model, ids)
    assert model._minference_state.calls["offset"] == 2 * model.config.num_hidden_layers
    assert rel_l2(out, ref) < 1e-5
    mi.unpatch(model)


def test_follow_up_turns_and_generate():
    model = make_model("llama", seed=29)
    turn1, turn2 = random_ids(300, seed=30), random_ids(120, seed=31)
    name = _cache_kw(model)

    @torch.no_grad()
    def conversation():
        r1 = model(turn1, use_cache=True)
        cache = getattr(r1, name)
        full = torch.cat([turn1, turn2], 1)  # generate runs the tokens its cache has not seen
        g = model.generate(full, attention_mask=torch.ones_like(full), **{name: cache},
                           max_new_tokens=6, do_sample=False, pad_token_id=0)
        return r1.logits, g

    ref_logits, ref_gen = conversation()
    mi.MInference("dense", attn_kwargs=FORCE_SPARSE)(model)
    st = model._minference_state
    logits, gen = conversation()
    assert torch.equal(gen, ref_gen)
    assert rel_l2(logits, ref_logits) < 1e-5
    # the second turn's 120 tokens went through the library at an offset
    assert st.calls["offset"] == model.config.num_hidden_layers
    mi.unpatch(model)


def test_generate_with_prefill_chunks():
    # generate(prefill_chunk_size=...) prefills through the cache chunk by chunk
    model = make_model("qwen2", seed=34)
    ids = random_ids(600, seed=35)
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, prefill_chunk_size=128)
    with torch.no_grad():
        ref = model.generate(ids, **kw)
    mi.MInference("dense", attn_kwargs=FORCE_SPARSE)(model)
    with torch.no_grad():
        out = model.generate(ids, **kw)
    assert torch.equal(out, ref)
    # chunks 2..5 of 128 (the last one 88 tokens) at an offset, in every layer
    assert model._minference_state.calls["offset"] == 4 * model.config.num_hidden_layers
    mi.unpatch(model)


def test_offset_fallbacks_warn_and_stay_correct():
    # a left-padded batch's follow-up turn: padding with queries at an offset runs sdpa
    model = make_model("llama", seed=32)
    seqs = [random_ids(n, seed=n)[0] for n in (300, 200)]
    ids, mask = left_pad(seqs)
    more = random_ids(30, batch=2, seed=33)
    mask2 = torch.cat([mask, torch.ones_like(more)], 1)
    name = _cache_kw(model)

    @torch.no_grad()
    def run():
        r1 = model(ids, attention_mask=mask, use_cache=True)
        return model(more, attention_mask=mask2, use_cache=True, **{name: getattr(r1, name)}).logits

    ref = run()
    mi.MInference("dense", attn_kwargs=FORCE_SPARSE)(model)
    with pytest.warns(UserWarning, match="offset"):
        out = run()
    st = model._minference_state
    assert st.calls["offset"] == 0 and st.calls["dense_fallback"] == 2
    assert rel_l2(out, ref) < 1e-5
    mi.unpatch(model)
