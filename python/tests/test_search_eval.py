"""Pattern search and the evaluation helpers through the binding."""

import numpy as np
import pytest

import minference as mi
from minference import search


def test_default_candidates_and_scaling():
    c = search.search_default_candidates(8192)
    assert len(c) == 7
    assert c[0].name == "stream_llm" and c[0].to_c().n_init == 100 and c[0].to_c().n_local == 800
    assert [(p.to_c().vertical_size, p.to_c().slash_size) for p in c[1:6]] == [
        (30, 800), (100, 750), (500, 700), (3500, 100), (1000, 6096)]
    assert c[6].name == "block_sparse" and c[6].to_c().top_k == 16  # 1/8 of 128 row blocks
    s = search.search_scale_pattern(mi.HeadPattern.vertical_slash(100, 800), 2.0).to_c()
    assert (s.vertical_size, s.slash_size) == (200, 1600)
    with pytest.raises(mi.MInferenceError):
        search.search_scale_pattern(mi.HeadPattern.vertical_slash(100, 800), -1.0)


def test_search_layer_modes():
    q, k, v, _ = mi.synth_generate(1, 4, 2, 700, 32, seed=5)
    pats, scores, metrics = search.search_layer(q, k, v, {"mode": "adaptive",
                                                          "target_recall": 0.9})
    assert len(pats) == 4 and scores.shape == (4,) and metrics.shape == (4,)
    assert np.isfinite(scores).all()
    reached = metrics["recall"] >= 0.9 - 1e-9
    assert reached.any()
    cands = [mi.HeadPattern.a_shape(16, 64), mi.HeadPattern.vertical_slash(30, 100)]
    pats, scores, metrics = search.search_layer(
        q, k, v, search.SearchParams(candidates=cands, mode="fixed", error_weight=0.0))
    for p in pats:
        assert (p.name, repr(p)) in {(c.name, repr(c)) for c in cands}
    # The chosen patterns' recall is what metrics_evaluate measures for them.
    m = mi.metrics_evaluate(q, k, pats, params={"dense_below": 0})
    np.testing.assert_allclose(m["recall"][0], metrics["recall"], rtol=1e-6, atol=1e-9)
    with pytest.raises(ValueError):
        search.search_layer(q, k, v, {"mode": "nope"})
    with pytest.raises(mi.MInferenceError):
        search.search_layer(q, k, v, {"mode": "flops", "target_density": 2.0})


def test_eval_helpers():
    assert search.needle_match("The magic number is 1 234 567.", "1234567")
    assert not search.needle_match("nothing here", "42")
    assert search.passkey_match("The pass key is 71432. Done", "71432")
    assert search.string_match_all("Alpha beta", ["alpha", "gamma"]) == 0.5
    assert search.string_match_part("Alpha beta", ["gamma", "BETA"]) == 1.0
    assert search.kv_match("value: abc", "abc") and not search.kv_match("abc xyz", "abc", ["xyz"])
    assert search.log_prob([0.0, 0.0, 0.0, 0.0], 2) == pytest.approx(np.log(0.25))
    assert search.perplexity([np.log(0.5)] * 4) == pytest.approx(2.0)
    hay = search.haystack(1000)
    assert len(hay.encode()) >= 1000 and hay.startswith(search.EVAL_FILLER[:20])
    off = search.needle_offset(hay, 50)
    assert 0 < off <= len(hay) // 2 + 1 and hay[off - 2] == "."
    text, at = search.insert_needle(hay, "The secret is 42.", 50)
    assert at == off and text[at:].startswith("The secret is 42.")
    assert search.needle_offset(hay, 100) == len(hay.encode())
    with pytest.raises(mi.MInferenceError):
        search.needle_offset(hay, 150)
