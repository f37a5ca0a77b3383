"""KV methods in the transformers patch (CPU). streamingllm, snapkv and pyramidkv run on
transformers' cache (KVMethodCache): a budget covering the context equals dense; a small budget
keeps exactly the rows the library's rule names (mi_session_kv_keep_rows, the rule a C session
applies). quest, retr_attn, kivi and leank keep their rows in libminference (an mi_kv_cache per
sequence): the patched model equals the C runner's session with that method on the same weights,
and a budget covering the context equals dense. Skipped where torch or transformers is not
installed."""

import inspect

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "AttentionInterface"):
    pytest.skip("transformers without AttentionInterface", allow_module_level=True)
if not hasattr(pytest.importorskip("transformers.cache_utils"), "DynamicLayer"):
    pytest.skip("transformers without cache layers", allow_module_level=True)

import minference as mi  # noqa: E402
import minference.patch as mp  # noqa: E402
from hf_helpers import left_pad, make_model, random_ids, rel_l2, save_for_runner  # noqa: E402

FULL = {
    "streamingllm": {"n_init": 64, "n_local": 4096},
    "snapkv": {"window_size": 16, "max_capacity_prompt": 4096},
    "pyramidkv": {"window_size": 16, "max_capacity_prompt": 4096},
}


def _name(model):
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@torch.no_grad()
def conversation(model, ids, more, n_new=6):
    """A prompt, a follow-up turn over its cache, then a third turn through generate: logits
    and tokens."""
    name = _name(model)
    r1 = model(ids, use_cache=True)
    cache = getattr(r1, name)
    r2 = model(more, use_cache=True, **{name: cache})
    # generate runs the tokens its cache has not seen (the last 20)
    full = torch.cat([ids, more, random_ids(20, seed=99)], 1)
    g = model.generate(full, attention_mask=torch.ones_like(full), **{name: cache},
                       max_new_tokens=n_new, do_sample=False, pad_token_id=0)
    return r1.logits, r2.logits, g, cache


@pytest.mark.parametrize("kv", sorted(FULL))
def test_budget_covering_the_context_equals_dense(kv):
    model = make_model("llama", seed=41)
    ids, more = random_ids(300, seed=42), random_ids(60, seed=43)
    ref = conversation(model, ids, more)
    mi.MInference("dense", kv_type=kv, attn_kwargs={"dense_below": 0, **FULL[kv]})(model)
    out = conversation(model, ids, more)
    cache = out[3]
    assert type(cache).__name__ == "KVMethodCache"
    assert cache.kept_rows(0) == cache.get_seq_length() == 300 + 60 + 20 + 5
    assert rel_l2(out[0], ref[0]) < 1e-5 and rel_l2(out[1], ref[1]) < 1e-5
    assert torch.equal(out[2], ref[2])
    assert model._minference_state.calls["offset"] == 2 * model.config.num_hidden_layers
    mi.unpatch(model)
    with torch.no_grad():  # unpatched: transformers' own cache again
        assert type(getattr(model(ids, use_cache=True), _name(model))).__name__ == "DynamicCache"


def _capture(monkeypatch):
    """(layer, query, key, value) of every attention call, before the KV method runs."""
    seen = []
    real = mp._attend

    def spy(torch_, state, module, query, key, value, *a):
        seen.append((module.layer_idx, query.clone(), key.clone(), value.clone()))
        return real(torch_, state, module, query, key, value, *a)

    monkeypatch.setattr(mp, "_attend", spy)
    return seen


def _snapkv_scores(q, k, w, kernel=5):
    """float64 SnapKV scores [H_kv, prefix]: the window's causal softmax over the rows before it,
    summed over the window, avg-pooled, summed over each KV head's query heads."""
    q = q[0].double().numpy()[:, -w:]
    k = k[0].double().numpy()
    H, Hkv, n_rows, D = q.shape[0], k.shape[0], k.shape[1], q.shape[2]
    prefix = n_rows - w
    out = np.zeros((Hkv, prefix))
    for h in range(H):
        s = q[h] @ k[h // (H // Hkv)].T / np.sqrt(D)
        s = np.where(np.arange(n_rows)[None, :] <= (prefix + np.arange(w))[:, None], s, -np.inf)
        p = np.exp(s - s.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        tot = np.pad(p[:, :prefix].sum(0), kernel // 2)
        out[h // (H // Hkv)] += np.convolve(tot, np.ones(kernel) / kernel, mode="valid")
    return out


@pytest.mark.parametrize("kv", ["snapkv", "pyramidkv"])
def test_small_budget_keeps_the_library_selection(kv, monkeypatch):
    model = make_model("qwen2", seed=44, layers=3)
    ids = random_ids(400, seed=45)
    kw = {"window_size": 16, "max_capacity_prompt": 96}
    mi.MInference("dense", kv_type=kv, attn_kwargs={"dense_below": 0, **kw})(model)
    spec = model._minference_state.kv_spec
    seen = _capture(monkeypatch)
    with torch.no_grad():
        cache = getattr(model(ids, use_cache=True), _name(model))
    assert len(seen) == 3
    counts = []
    for layer, q, k, v in seen:
        keep = mp.kv_keep_rows(spec, 3, layer, q, k)
        assert keep is not None
        idx = torch.as_tensor(keep)[None, :, :, None].expand(1, -1, -1, k.shape[-1])
        assert torch.equal(cache.layers[layer].keys, k.gather(2, idx))
        assert torch.equal(cache.layers[layer].values, v.gather(2, idx))
        # the window is kept whole; the other rows kept score at least as much as those dropped
        n_keep = keep.shape[1] - 16
        assert (keep[:, n_keep:] == np.arange(400 - 16, 400)).all()
        scores = _snapkv_scores(q, k, 16)
        for h in range(keep.shape[0]):
            kept = np.zeros(400 - 16, bool)
            kept[keep[h, :n_keep]] = True
            assert scores[h][kept].min() >= scores[h][~kept].max() - 1e-6
        counts.append(keep.shape[1])
    assert cache.get_seq_length() == 400
    if kv == "snapkv":
        assert counts == [96] * 3
    else:  # budgets shrink with depth around SnapKV's
        assert counts[0] > counts[1] > counts[2] and counts[2] < 96 < counts[0]
    # decoding goes on over the kept rows at the right positions; one-token calls keep them all
    name = _name(model)
    with torch.no_grad():
        model(random_ids(1, seed=46), use_cache=True, **{name: cache})
    assert cache.get_seq_length() == 401 and cache.kept_rows(0) == counts[0] + 1
    mi.unpatch(model)


def test_streamingllm_equals_its_mask_on_the_unpatched_model():
    # Chunked prefill, then decode steps, with sinks 8 + window 64: every query must see exactly
    # what an unpatched run of the whole sequence sees under the equivalent mask: a prefill
    # chunk the rows kept after the chunks before plus its own (causal), a decode step the sinks
    # and the last 64 positions, its own included.
    model = make_model("llama", seed=47)
    ids = random_ids(305, seed=48)
    n_init, n_local = 8, 64
    mi.MInference("dense", kv_type="streamingllm",
                  attn_kwargs={"dense_below": 0, "n_init": n_init, "n_local": n_local})(model)
    cache = mi.kv_cache(model)
    name = _name(model)
    outs = []
    with torch.no_grad():
        for a, b in ((0, 200), (200, 300)) + tuple((p, p + 1) for p in range(300, 305)):
            outs.append(model(ids[:, a:b], use_cache=True, **{name: cache}).logits)
            assert cache.get_seq_length() == b
            assert cache.kept_rows(0) == min(b, n_init + n_local)
    assert model._minference_state.calls["offset"] == model.config.num_hidden_layers
    out = torch.cat(outs, 1)
    mi.unpatch(model)
    n = ids.shape[1]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    allowed = j <= i
    # chunk 2 (rows 200..299) sees the sinks and rows 200 - 64 .. of chunk 1, then itself
    allowed[200:300] &= (j < n_init) | (j >= 200 - n_local)
    allowed[300:] &= ((j < n_init) | (i - j < n_local))[300:]
    with torch.no_grad():
        ref = model(ids, attention_mask=allowed[None, None]).logits
    err = rel_l2(out, ref)
    print(f"streamingllm against its mask: rel L2 of logits {err:.2e}")
    assert err < 1e-5
    with torch.no_grad():
        full = model(ids).logits
    assert rel_l2(out[:, 200:], full[:, 200:]) > 1e-3  # the eviction changed something


def test_snapkv_compresses_after_every_prefill_chunk():
    model = make_model("llama", seed=49)
    ids = random_ids(500, seed=50)
    mi.MInference("dense", kv_type="snapkv",
                  attn_kwargs={"window_size": 8, "max_capacity_prompt": 120})(model)
    cache = mi.kv_cache(model)
    name = _name(model)
    with torch.no_grad():
        for a, b, rows in ((0, 100, 100), (100, 300, 120), (300, 301, 121), (301, 500, 120)):
            model(ids[:, a:b], use_cache=True, **{name: cache})
            assert cache.get_seq_length() == b and cache.kept_rows(1) == rows
    mi.unpatch(model)


def test_hf_attention_with_a_kv_method():
    model = make_model("llama", seed=51)
    ids, more = random_ids(200, seed=52), random_ids(30, seed=53)
    ref = conversation(model, ids, more)
    mi.MInference("hf", kv_type="snapkv", attn_kwargs=FULL["snapkv"])(model)
    out = conversation(model, ids, more)
    assert type(out[3]).__name__ == "KVMethodCache"
    assert rel_l2(out[1], ref[1]) < 1e-5 and torch.equal(out[2], ref[2])
    assert model._minference_state.calls["sparse"] == 0
    mi.unpatch(model)


def test_refusals():
    model = make_model("llama", seed=54)
    with pytest.raises(ValueError, match="leank"):
        mi.MInference("dense", kv_type="leank")(model)  # no mask file
    with pytest.raises(ValueError, match="max_capacity_prompt"):
        mi.MInference("dense", kv_type="snapkv",
                      attn_kwargs={"window_size": 64, "max_capacity_prompt": 32})(model)
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(NotImplementedError, match="sliding"):
        mi.MInference("dense", kv_type="streamingllm")(make_model("mistral", sliding_window=128))
    # padding: the rule would keep padding rows as sinks or scores; refused
    mi.MInference("dense", kv_type="streamingllm", attn_kwargs={"n_init": 4, "n_local": 32})(model)
    ids, mask = left_pad([random_ids(n, seed=n)[0] for n in (120, 80)])
    with pytest.raises(NotImplementedError, match="without padding"), torch.no_grad():
        model(ids, attention_mask=mask, use_cache=True)
    mi.unpatch(model)


# ---- the methods libminference keeps (quest, retr_attn, kivi, leank) ---------------------------


def _leank_mask(path, model, seed, keep=0.5):
    """A LeanK mask file (docs/kv-methods.md) for model: each head keeps a random `keep` of its
    key channels (keep=1: every channel)."""
    import json

    cfg = model.config
    hd = cfg.hidden_size // cfg.num_attention_heads
    rng = np.random.default_rng(seed)
    masks = [["".join("1" if x else "0" for x in rng.random(hd) < keep) if keep < 1 else "1" * hd
              for _ in range(cfg.num_key_value_heads)] for _ in range(cfg.num_hidden_layers)]
    with open(path, "w") as f:
        json.dump({"format": "minference-leank-mask", "version": 1,
                   "n_layers": cfg.num_hidden_layers, "n_kv_heads": cfg.num_key_value_heads,
                   "head_dim": hd, "masks": masks}, f)
    return str(path)


@torch.no_grad()
def _hf_turns(model, ids, more, steps):
    """A prompt, a follow-up turn over its cache, then decode steps: last-position logits."""
    name = _name(model)
    r = model(ids, use_cache=True)
    cache = getattr(r, name)
    out = [r.logits[0, -1].numpy()]
    r = model(more, use_cache=True, **{name: cache})
    out.append(r.logits[0, -1].numpy())
    for t in steps[0]:
        r = model(t.view(1, 1), use_cache=True, **{name: cache})
        out.append(r.logits[0, -1].numpy())
    return out, cache


def _c_turns(runner, spec, ids, more, steps):
    s = runner.session(kv=spec)
    out = [s.prefill(ids[0].tolist()), s.prefill(more[0].tolist())]
    out += [s.decode(int(t)) for t in steps[0]]
    return out, s


SMALL = {  # budgets well under the 380-token context
    "quest": {"token_budget": 128, "dense_layers": 0},
    "retr_attn": {"top_k": 48, "n_init": 4, "n_local": 32},
    "kivi": {"bits": 4, "residual_length": 32},
    "leank": {"sink_size": 16, "recent_size": 32},
}


@pytest.mark.parametrize("kv", sorted(SMALL))
def test_native_methods_equal_the_c_session(kv, tmp_path):
    model = make_model("llama", seed=61)
    runner = mi.Model(save_for_runner(model, str(tmp_path / "m")), threads=2)
    ids, more, steps = random_ids(300, seed=62), random_ids(20, seed=63), random_ids(6, seed=64)
    kw = dict(SMALL[kv])
    if kv == "leank":
        kw["leank_path"] = _leank_mask(tmp_path / "mask.json", model, seed=65)
    dense, _ = _hf_turns(model, ids, more, steps)
    mi.MInference("dense", kv_type=kv, attn_kwargs={"dense_below": 0, **kw})(model)
    got, cache = _hf_turns(model, ids, more, steps)
    mi.unpatch(model)
    spec = kv + ":" + ",".join(f"{k}={v}" for k, v in kw.items())
    want, session = _c_turns(runner, spec, ids, more, steps)
    assert type(cache).__name__ == "KVMethodCache" and cache.get_seq_length() == 326
    # the same method on the same weights: the rows, selections and codes of a C session (KIVI's
    # codes may round the other way where the two forward passes differ in the last bit)
    tol = 2e-2 if kv == "kivi" else 1e-4
    errs = [rel_l2(torch.from_numpy(a), torch.from_numpy(b)) for a, b in zip(got, want)]
    assert max(errs) < tol, errs
    # ... which is not dense: the method changed the later calls
    off = [rel_l2(torch.from_numpy(a), torch.from_numpy(b)) for a, b in zip(got, dense)]
    assert off[0] < 1e-5 and max(off[1:]) > 10 * max(errs[1:]), (off, errs)
    assert cache.kept_rows(0) == session.stats["kv_rows"]


NATIVE_FULL = {
    "quest": {"token_budget": 4096, "dense_layers": 0},
    "retr_attn": {"top_k": 4096},
    "kivi": {"bits": 16},
    "leank": {},
}


@pytest.mark.parametrize("kv", sorted(NATIVE_FULL))
def test_native_budget_covering_the_context_equals_dense(kv, tmp_path):
    model = make_model("llama", seed=71)
    ids, more = random_ids(300, seed=72), random_ids(60, seed=73)
    ref = conversation(model, ids, more)
    kw = dict(NATIVE_FULL[kv])
    if kv == "leank":  # every channel kept
        kw["leank_path"] = _leank_mask(tmp_path / "all.json", model, seed=0, keep=1.0)
    mi.MInference("dense", kv_type=kv, attn_kwargs={"dense_below": 0, **kw})(model)
    out = conversation(model, ids, more)
    cache = out[3]
    assert type(cache).__name__ == "KVMethodCache"
    assert cache.kept_rows(0) == cache.get_seq_length() == 300 + 60 + 20 + 5
    assert rel_l2(out[0], ref[0]) < 1e-5 and rel_l2(out[1], ref[1]) < 1e-5
    assert torch.equal(out[2], ref[2])
    mi.unpatch(model)


def test_kivi_keeps_fewer_bytes():
    model = make_model("llama", seed=81)
    ids = random_ids(600, seed=82)
    sizes = {}
    for kv, kw in (("quest", {"token_budget": 4096}), ("kivi", {"bits": 2})):
        mi.MInference("dense", kv_type=kv, attn_kwargs={"dense_below": 0, **kw})(model)
        with torch.no_grad():
            cache = getattr(model(ids, use_cache=True), _name(model))
        sizes[kv] = cache.kv_bytes()
        mi.unpatch(model)
    # f32 pages against 2-bit codes with their group parameters and a 32-row f32 residual
    assert 0 < sizes["kivi"] < 0.25 * sizes["quest"], sizes


def test_native_batch_and_padding():
    model = make_model("llama", seed=91)
    a, b = random_ids(200, seed=92), random_ids(200, seed=93)
    step = random_ids(1, batch=2, seed=94)
    mi.MInference("dense", kv_type="quest", attn_kwargs={"token_budget": 64, "dense_layers": 0,
                                                         "dense_below": 0})(model)
    with torch.no_grad():
        name = _name(model)
        r = model(torch.cat([a, b]), use_cache=True)
        c = getattr(r, name)
        both = model(step, use_cache=True, **{name: c}).logits[:, -1]
        singles = []
        for i, x in enumerate((a, b)):
            r = model(x, use_cache=True)
            singles.append(model(step[i:i + 1], use_cache=True,
                                 **{name: getattr(r, name)}).logits[0, -1])
    # each sequence of the batch has its own cache: the same as alone
    assert rel_l2(both[0], singles[0]) < 1e-5 and rel_l2(both[1], singles[1]) < 1e-5
    ids, mask = left_pad([random_ids(n, seed=n)[0] for n in (120, 80)])
    with pytest.raises(NotImplementedError, match="without padding"), torch.no_grad():
        model(ids, attention_mask=mask, use_cache=True)
    mi.unpatch(model)
