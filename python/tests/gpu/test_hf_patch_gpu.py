"""GPU tests: the kernels on CUDA tensors against the CPU library, and the transformers patch on
small random Llama and Qwen2 models at a few thousand tokens, patched against unpatched (sdpa).

    python -m pytest python/tests/gpu -q -s        (-s shows the measured differences)

Skipped without torch, transformers or a CUDA device. Fails (does not skip) when a GPU is present
but the loaded libminference was built without CUDA: rebuild with nvcc on PATH.
"""

import os
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
# MINFERENCE_TEST_DEVICE=cpu runs the same checks on the CPU library (a dry run without a GPU).
DEV = os.environ.get("MINFERENCE_TEST_DEVICE", "cuda")
if DEV == "cuda" and not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import minference as mi  # noqa: E402
from hf_helpers import (  # noqa: E402
    full_budget_entries,
    make_model,
    random_ids,
    rel_l2,
    write_config,
)


def _sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


@pytest.fixture(scope="module", autouse=True)
def cuda_build():
    if DEV != "cuda":
        return
    if mi.cuda_device_count() == 0:
        pytest.fail(f"libminference at {mi.library_path()} has no CUDA backend "
                    f"(features: {mi.build_features()}); rebuild it with nvcc on PATH")
    print(f"\nlibminference {mi.version()} [{mi.build_features()}] on {torch.cuda.get_device_name()}")


# ---- kernels: CUDA tensors against the CPU library ----------------------------------------------

def _qkv(B, H, Hkv, L, D, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv, L, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, L, D, generator=g).to(dtype)
    return q, k, v


def _close(gpu, cpu, what, tol):
    err = rel_l2(gpu.cpu(), cpu)
    assert torch.isfinite(gpu).all(), f"{what}: NaN/Inf"
    print(f"{what}: rel L2 GPU vs CPU {err:.2e}")
    assert err < tol, what


TOL = {torch.float16: 3e-3, torch.bfloat16: 1.5e-2}  # rel L2; output and P@V roundings


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", [64, 128])
def test_kernels_cuda_vs_cpu(dtype, D):
    B, H, Hkv, L = 2, 8, 2, 1000
    q, k, v = _qkv(B, H, Hkv, L, D, dtype)
    qc, kc, vc = (x.to(DEV) for x in (q, k, v))
    tol = TOL[dtype]
    _close(mi.dense_attention(qc, kc, vc), mi.dense_attention(q, k, v), f"dense {dtype} D={D}", tol)
    _close(mi.streaming_forward(qc, kc, vc, 16, 200), mi.streaming_forward(q, k, v, 16, 200),
           "a_shape", tol)
    vi, si = [0, 5, 77, 400], list(range(64)) + [130, 500]
    _close(mi.vertical_slash_sparse_attention(qc, kc, vc, vi, si),
           mi.vertical_slash_sparse_attention(q, k, v, vi, si), "vertical_slash", tol)
    # Block selection can flip on near-ties between fp32 CPU and GPU sums: compare with full top_k.
    _close(mi.block_sparse_attention(qc, kc, vc, 100), mi.block_sparse_attention(q, k, v, 100),
           "block_sparse full", tol)
    pats = [mi.HeadPattern.dense(), mi.HeadPattern.a_shape(16, 128),
            mi.HeadPattern.tri_shape(16, 128, 50), mi.HeadPattern.vertical_slash(L, L)] * 2
    params = {"dense_below": 0}
    lens = [1000, 517]
    _close(mi.prefill_attention(qc, kc, vc, pats, params, seq_lens=lens),
           mi.prefill_attention(q, k, v, pats, params, seq_lens=lens), "prefill mixed", tol)


def test_kernels_on_a_side_stream():
    if DEV != "cuda":
        pytest.skip("CUDA streams")
    q, k, v = (x.to(DEV) for x in _qkv(1, 4, 4, 2048, 128, torch.float16, seed=1))
    ref = mi.dense_attention(q, k, v)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = mi.dense_attention(q, k, v)
        out2 = out * 1  # ordered after the kernel on the same stream
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    assert rel_l2(out2.cpu(), ref.cpu()) < 1e-3


# ---- the transformers patch --------------------------------------------------------------------

DTYPE = torch.float16  # the patched and the sdpa model both in fp16; references in fp32
SIZE = dict(layers=4, hidden=1024, heads=8, kv_heads=2, vocab=512)  # head_dim 128


def _gen(model, ids, n=16):
    with torch.no_grad():
        return model.generate(ids.to(DEV), max_new_tokens=n, do_sample=False, pad_token_id=0,
                              output_scores=True, return_dict_in_generate=True)


def _prefill(model, ids):
    with torch.no_grad():
        _sync()
        t = time.perf_counter()
        logits = model(ids.to(DEV)).logits
        _sync()
        return logits.float(), time.perf_counter() - t


def _fp32_reference(arch, ids):
    model = make_model(arch, dtype=torch.float32, device=DEV, **SIZE)
    logits, _ = _prefill(model, ids)
    del model
    return logits


def _equivalent(ref, out, what, gap_tol):
    """Greedy sequences equal, or diverging only where the reference's top two logits are closer
    than gap_tol (the size of the rounding differences: such a near-tie may flip)."""
    a, b = ref.sequences[0].cpu(), out.sequences[0].cpu()
    same = int((a == b).cumprod(0).sum()) - (a.numel() - len(ref.scores))
    print(f"{what}: {same}/{len(ref.scores)} generated tokens equal")
    if same < len(ref.scores):
        top2 = torch.topk(ref.scores[same][0].float(), 2).values
        gap = float(top2[0] - top2[1])
        assert gap < gap_tol, f"{what}: diverged at step {same} with a top-2 gap of {gap:.4f}"


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def arch(request):
    return request.param


@pytest.mark.parametrize("L", [4096])
def test_dense_and_full_budget_patch_equal(arch, L, tmp_path):
    ids = random_ids(L, vocab=SIZE["vocab"], seed=11)
    ref32 = _fp32_reference(arch, ids)
    model = make_model(arch, dtype=DTYPE, device=DEV, **SIZE)
    sdpa_logits, t_ref = _prefill(model, ids)
    e_sdpa = rel_l2(sdpa_logits, ref32)
    ref = _gen(model, ids)
    cfg = write_config(tmp_path / "full.json", SIZE["layers"], SIZE["heads"], full_budget_entries(L))
    for attn, kw in (("dense", {}), ("minference", {"config_path": cfg})):
        mi.unpatch(model)
        mi.MInference(attn, attn_kwargs={"dense_below": 0}, **kw)(model)
        _prefill(model, ids)  # warm-up
        logits, t = _prefill(model, ids)
        e = rel_l2(logits, ref32)
        diff = float((logits[0, -1] - sdpa_logits[0, -1]).abs().max())
        print(f"{arch} L={L} {attn}{' full budgets' if kw else ''}: rel L2 of logits vs fp32 "
              f"{e:.2e} (sdpa {DTYPE}: {e_sdpa:.2e}), vs sdpa {rel_l2(logits, sdpa_logits):.2e}; "
              f"prefill {t * 1e3:.1f} ms (sdpa {t_ref * 1e3:.1f} ms)")
        assert torch.isfinite(logits).all()
        # Same precision as sdpa in the same dtype: rounding differences only.
        assert e <= 2 * e_sdpa + 1e-3
        _equivalent(ref, _gen(model, ids), f"{arch} {attn}", max(4 * diff, 1e-2))
        assert model._minference_state.calls["sparse"] > 0
    mi.unpatch(model)


@pytest.mark.parametrize("L", [8192])
def test_default_budgets_close(arch, L):
    ids = random_ids(L, vocab=SIZE["vocab"], seed=12)
    ref32 = _fp32_reference(arch, ids)
    model = make_model(arch, dtype=DTYPE, device=DEV, **SIZE)
    sdpa_logits, t_ref = _prefill(model, ids)
    with pytest.warns(UserWarning, match="minference search"):
        mi.MInference("minference", attn_kwargs={"dense_below": 0})(model)
    _prefill(model, ids)
    logits, t = _prefill(model, ids)
    err = rel_l2(logits, ref32)
    e_sdpa = rel_l2(sdpa_logits, ref32)
    agree = float((logits.argmax(-1) == ref32.argmax(-1)).float().mean())
    agree_sdpa = float((sdpa_logits.argmax(-1) == ref32.argmax(-1)).float().mean())
    last = rel_l2(logits[:, -1], ref32[:, -1])
    print(f"{arch} L={L} minference default budgets (VS 1000/6096): rel L2 of logits vs fp32 "
          f"{err:.3e} (sdpa {DTYPE}: {e_sdpa:.3e}), vs sdpa {rel_l2(logits, sdpa_logits):.3e}, "
          f"last position {last:.3e}, argmax agreement with fp32 {agree:.4f} (sdpa {agree_sdpa:.4f}); "
          f"prefill {t * 1e3:.1f} ms (sdpa {t_ref * 1e3:.1f} ms)")
    assert torch.isfinite(logits).all()
    # Close: the sparse error stays small next to the dtype's own rounding error.
    assert err < e_sdpa + 0.1 and agree > agree_sdpa - 0.1
    out = _gen(model, ids, 8)
    assert out.sequences.shape[1] == L + 8
    mi.unpatch(model)


def test_batch_left_padding_gpu():
    model = make_model("llama", dtype=DTYPE, device=DEV, **SIZE)
    from hf_helpers import left_pad

    seqs = [random_ids(n, vocab=SIZE["vocab"], seed=n)[0] for n in (3000, 2100)]
    ids, mask = left_pad(seqs)
    with torch.no_grad():
        ref = model(ids.to(DEV), attention_mask=mask.to(DEV)).logits.float()
    mi.MInference("dense", attn_kwargs={"dense_below": 0})(model)
    with torch.no_grad():
        out = model(ids.to(DEV), attention_mask=mask.to(DEV)).logits.float()
    assert model._minference_state.calls["dense_fallback"] == 0
    for i in range(2):
        real = mask[i].bool().to(DEV)
        err = rel_l2(out[i][real], ref[i][real])
        print(f"left padding seq {i}: rel L2 vs sdpa {err:.2e}")
        assert err < 1e-2
    mi.unpatch(model)


def test_numpy_default_not_touched():
    # The CPU path still works in the same process as the CUDA one.
    q = np.random.default_rng(0).standard_normal((1, 2, 70, 64)).astype(np.float32)
    assert mi.dense_attention(q, q, q).shape == q.shape
