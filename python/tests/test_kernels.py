"""The kernels through the binding, on the CPU library, against the float64 NumPy reference."""

import numpy as np
import pytest

import minference as mi
from minference import core
from conftest import a_shape_mask, assert_close, qkv, reference_attention


# ---- dense -----------------------------------------------------------------------------------

@pytest.mark.parametrize("L", [1, 63, 64, 65, 300])
@pytest.mark.parametrize("H,Hkv", [(4, 4), (4, 2), (4, 1)])
def test_dense_matches_reference(rng, L, H, Hkv):
    q, k, v = qkv(rng, 2, H, Hkv, L, 32)
    out, lse = mi.dense_attention(q, k, v, return_lse=True)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == q.shape
    ref, ref_lse = reference_attention(q, k, v)
    assert_close(out, ref, what=f"dense L={L} H={H}/{Hkv}")
    assert lse.dtype == np.float32 and lse.shape == (2, H, L)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("D", [16, 64, 128])
def test_dense_fp16(rng, D):
    q, k, v = qkv(rng, 1, 4, 2, 200, D, np.float16)
    out = mi.dense_attention(q, k, v)
    assert out.dtype == np.float16
    assert_close(out, reference_attention(q, k, v)[0], np.float16, "dense fp16")


def test_dense_scale_and_seq_lens(rng):
    q, k, v = qkv(rng, 3, 2, 2, 130, 16)
    lens = [130, 64, 1]
    out, lse = mi.dense_attention(q, k, v, scale=0.3, seq_lens=lens, return_lse=True)
    ref, ref_lse = reference_attention(q, k, v, scale=0.3, seq_lens=lens)
    assert_close(out, ref, what="dense seq_lens")
    assert (out[1, :, 64:] == 0).all() and (out[2, :, 1:] == 0).all()
    assert np.isneginf(lse[1, :, 64:]).all()
    np.testing.assert_allclose(lse[0], ref_lse[0], rtol=1e-5, atol=1e-5)


def test_strided_views_are_zero_copy(rng):
    # [B, L, H, D] storage seen as [B, H, L, D]: the binding passes strides, no copy.
    B, H, L, D = 2, 4, 150, 32
    qs = rng.standard_normal((B, L, H, D)).astype(np.float32)
    ks = rng.standard_normal((B, L, 2, D)).astype(np.float32)
    vs = rng.standard_normal((B, L, 2, D)).astype(np.float32)
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (qs, ks, vs))
    d = core._describe(q, "q")
    assert d.obj is q and list(d.desc.stride) == [L * H * D, D, H * D, 1]
    out = mi.dense_attention(q, k, v)
    assert_close(out, reference_attention(q, k, v)[0], what="blhd")
    # A non-contiguous head dimension is copied once, still correct.
    qn = np.asfortranarray(np.ascontiguousarray(q))
    assert_close(mi.dense_attention(qn, k, v), reference_attention(q, k, v)[0], what="fortran")
    # out= into a [B, L, H, D] buffer (what the transformers patch does).
    buf = np.empty((B, L, H, D), np.float32)
    mi.dense_attention(q, k, v, out=buf.transpose(0, 2, 1, 3))
    assert_close(buf.transpose(0, 2, 1, 3), reference_attention(q, k, v)[0], what="out view")


# ---- A-shape / Tri-shape -----------------------------------------------------------------------

@pytest.mark.parametrize("n_init,n_local", [(4, 20), (0, 64), (64, 1), (16, 1000)])
def test_streaming_forward(rng, n_init, n_local):
    q, k, v = qkv(rng, 1, 4, 2, 257, 32)
    out = mi.streaming_forward(q, k, v, n_init, n_local)
    ref, _ = reference_attention(q, k, v, a_shape_mask(257, n_init, n_local))
    assert_close(out, ref, what=f"a_shape {n_init}/{n_local}")


def test_tri_shape_with_seq_lens(rng):
    q, k, v = qkv(rng, 2, 2, 1, 200, 16)
    lens = [200, 150]
    out = mi.tri_shape_attention(q, k, v, n_init=8, n_local=32, n_last=20, seq_lens=lens)
    ref, _ = reference_attention(
        q, k, v, lambda b, h: a_shape_mask(200, 8, 32, 20, length=lens[b]), seq_lens=lens)
    assert_close(out, ref, what="tri_shape")


# ---- vertical-slash ----------------------------------------------------------------------------

def _exact_vs_mask(L, verticals, slashes):
    i = np.arange(L)[:, None]
    j = np.arange(L)[None, :]
    m = np.isin(j, verticals) | np.isin(i - j, slashes)
    return m & (j <= i)


def test_vertical_slash_sparse_attention(rng):
    B, H, Hkv, L, D = 1, 4, 2, 333, 32
    q, k, v = qkv(rng, B, H, Hkv, L, D)
    nv, ns = 12, 20
    v_idx = np.stack([rng.choice(L, nv, replace=False) for _ in range(B * H)]).reshape(B, H, nv)
    s_far = np.stack([rng.choice(np.arange(64, L), ns - 5, replace=False) for _ in range(B * H)])
    s_idx = np.concatenate([s_far.reshape(B, H, -1),
                            np.broadcast_to([0, 1, 2, 30, 63], (B, H, 5))], axis=2)
    out = mi.vertical_slash_sparse_attention(q, k, v, v_idx, s_idx)
    # The kernel's exact key set is the compiled index's expansion; it must cover the requested set.
    vsi = mi.VSIndex(np.full((B, H), nv, np.int32), v_idx.astype(np.int32),
                     np.full((B, H), ns, np.int32), s_idx.astype(np.int32))
    index = mi.vs_build_index(L, vsi)
    masks = {(b, h): index.to_mask(L, b, h) for b in range(B) for h in range(H)}
    for (b, h), m in masks.items():
        exact = _exact_vs_mask(L, v_idx[b, h], s_idx[b, h])
        assert (m | ~exact).all(), f"index of head {h} misses requested keys"
    ref, _ = reference_attention(q, k, v, lambda b, h: masks[(b, h)])
    assert_close(out, ref, what="vs")
    # The same index through sparse_attention gives the same result.
    out2 = mi.sparse_attention(q, k, v, index)
    np.testing.assert_array_equal(out, out2)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_vertical_slash_full_sets_equal_dense(rng, dtype):
    q, k, v = qkv(rng, 1, 2, 2, 200, 16, dtype)
    out = mi.vertical_slash_sparse_attention(q, k, v, np.arange(200), np.arange(200))
    assert out.dtype == dtype
    assert_close(out, reference_attention(q, k, v)[0], dtype, "vs full")


def test_vertical_slash_broadcast_and_torch_style_args(rng):
    q, k, v = qkv(rng, 2, 2, 2, 128, 16)
    a = mi.vertical_slash_sparse_attention(q, k, v, [0, 5, 9], list(range(64)))
    b = mi.vertical_slash_sparse_attention(q, k, v, np.broadcast_to([0, 5, 9], (2, 2, 3)),
                                           np.broadcast_to(np.arange(64), (2, 2, 64)))
    np.testing.assert_array_equal(a, b)
    with pytest.raises(NotImplementedError):
        mi.vertical_slash_sparse_attention(q, k, v, [0], [0], block_size_M=128)


def test_vs_estimate_properties(rng):
    B, H, L, D = 1, 2, 700, 32
    q, k, v, truth = mi.synth_generate(B, H, 1, L, D, seed=7, n_verticals=4, n_slashes=3,
                                       n_sinks=2, n_needles=0)
    index = mi.vs_estimate(q, k, 60, 140)
    for h in range(H):
        cols = index.verticals(0, h)
        diags = index.slashes(0, h)
        assert len(cols) == 60 and len(diags) == 140
        assert (np.diff(cols) > 0).all(), "verticals ascending"
        assert (np.diff(diags) < 0).all(), "slashes descending"
        assert set(range(30)) <= set(cols.tolist()), "forced sink columns"
        assert set(range(100)) <= set(diags.tolist()), "forced local diagonals"
        assert set(truth["vertical_cols"][h].tolist()) <= set(cols.tolist()), "planted verticals"


def test_vs_estimate_matches_numpy_estimate(rng):
    # Planted structure makes the top-k unambiguous; the estimate must find the float64 top-k.
    B, H, L, D = 1, 1, 512, 64
    q, k, v, _ = mi.synth_generate(B, H, 1, L, D, seed=3, n_verticals=6, n_slashes=4)
    nv, ns = 40, 110
    index = mi.vs_estimate(q, k, nv, ns)
    qd, kd = q[0, 0].astype(np.float64), k[0, 0].astype(np.float64)
    n = 64
    s = qd[-n:] @ kd.T / np.sqrt(D)
    s[:, L - n:] = np.where(np.tril(np.ones((n, n), bool)), s[:, L - n:], -np.inf)
    p = np.exp(s - s.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    vert = p.sum(0)
    slash = np.zeros(L)
    for r in range(n):
        i = L - n + r
        for d in range(i + 1):
            slash[d] += p[r, i - d]
    vert[:30] = np.inf
    slash[:100] = np.inf
    top_v = np.sort(np.argsort(-vert, kind="stable")[:nv])
    top_s = np.sort(np.argsort(-slash, kind="stable")[:ns])[::-1]
    got_v = index.verticals(0, 0)
    got_s = index.slashes(0, 0)
    # Swaps are allowed only among near-ties (fp32 sums against float64 ones).
    for got, top, score in ((got_v, top_v, vert), (got_s, top_s, slash)):
        kth = np.sort(score)[::-1][len(top) - 1]
        for x in set(got.tolist()) ^ set(top.tolist()):
            assert abs(score[x] - kth) <= 1e-4 * max(1.0, kth), (x, score[x], kth)


# ---- block-sparse ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_block_sparse_full_top_k_equals_dense(rng, dtype):
    q, k, v = qkv(rng, 1, 4, 2, 300, 32, dtype)
    out = mi.block_sparse_attention(q, k, v, top_k=100)
    assert_close(out, reference_attention(q, k, v)[0], dtype, "block full")


def test_block_sparse_index_and_output(rng):
    B, H, L, D = 2, 2, 640, 32
    q, k, v = qkv(rng, B, H, 1, L, D)
    top_k = 3
    index = mi.block_sparse_estimate(q, k, top_k)
    R = 10
    qd = q.astype(np.float64).reshape(B, H, R, 64, D).mean(3)
    kd = k.astype(np.float64).reshape(B, 1, R, 64, D).mean(3)
    for b in range(B):
        for h in range(H):
            for m in range(R):
                cnt = int(index.block_count[b, h, m])
                blocks = index.block_offset[b, h, m, :cnt] // 64
                assert (index.block_offset[b, h, m, :cnt] % 64 == 0).all()
                assert m in blocks and 0 in blocks, "diagonal block and block 0 kept"
                want = min(max(min(top_k, m + 1), 2 if m > 0 else 1), index.block_offset.shape[3])
                assert cnt == want
                assert (blocks <= m).all() and len(set(blocks.tolist())) == cnt
                scores = qd[b, h, m] @ kd[b, 0, : m + 1].T
                chosen = [x for x in blocks if x not in (0, m)]
                rest = [x for x in range(m + 1) if x not in blocks]
                if chosen and rest:
                    assert min(scores[chosen]) >= max(scores[rest]) - 1e-4
            assert (index.column_count[b, h] == 0).all()
    out = mi.block_sparse_attention(q, k, v, top_k)
    ref, _ = reference_attention(q, k, v, lambda b, h: index.to_mask(L, b, h))
    assert_close(out, ref, what="block sparse")


# ---- whole-layer prefill -----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_prefill_per_head_patterns(rng, dtype):
    B, H, Hkv, L, D = 1, 5, 5, 400, 32
    q, k, v = qkv(rng, B, H, Hkv, L, D, dtype)
    patterns = [
        mi.HeadPattern.dense(),
        mi.HeadPattern.a_shape(n_init=8, n_local=50),
        mi.HeadPattern.tri_shape(n_init=8, n_local=50, n_last=30),
        mi.HeadPattern.vertical_slash(L, L),  # full budgets: dense
        mi.HeadPattern.block_sparse(top_k=100),  # >= all blocks: dense
    ]
    out = mi.prefill_attention(q, k, v, patterns, params={"dense_below": 0})
    masks = [None, a_shape_mask(L, 8, 50), a_shape_mask(L, 8, 50, 30), None, None]
    for h in range(H):
        ref, _ = reference_attention(q[:, h:h + 1], k[:, h:h + 1], v[:, h:h + 1], masks[h])
        assert_close(out[:, h:h + 1], ref, dtype, f"prefill head {h} ({patterns[h]})")


def test_prefill_sparse_vs_equals_pipeline(rng):
    # A VS head with small budgets: prefill == estimate -> index -> sparse kernel, done by hand.
    B, H, Hkv, L, D = 2, 4, 2, 520, 32
    q, k, v = qkv(rng, B, H, Hkv, L, D)
    lens = [520, 300]
    pats = [mi.HeadPattern.vertical_slash(40, 120)] * H
    out = mi.prefill_attention(q, k, v, pats, params={"dense_below": 0}, seq_lens=lens)
    vsi = mi.vs_estimate(q, k, 40, 120, seq_lens=lens)
    index = mi.vs_build_index(L, vsi, seq_lens=lens)
    out2 = mi.sparse_attention(q, k, v, index, seq_lens=lens)
    assert_close(out, out2.astype(np.float64), what="prefill vs pipeline", atol=1e-6, rtol=1e-5)
    ref, _ = reference_attention(q, k, v, lambda b, h: index.to_mask(L, b, h, lens[b]),
                                 seq_lens=lens)
    assert_close(out, ref, what="prefill vs reference")
    assert (out[1, :, 300:] == 0).all()


def test_prefill_workspace_and_single_pattern(rng):
    q, k, v = qkv(rng, 1, 2, 1, 256, 16)
    pat = mi.HeadPattern.vertical_slash(30, 60)
    n = mi.prefill_workspace_size(q, k, pat, {"dense_below": 0})
    assert n >= 0
    ws = np.zeros(max(n, 1), np.uint8)
    a = mi.prefill_attention(q, k, v, pat, {"dense_below": 0}, workspace=ws)
    b = mi.prefill_attention(q, k, v, [pat, pat], {"dense_below": 0}, workspace=None)
    np.testing.assert_array_equal(a, b)
    # Config-style entries are accepted as patterns.
    c = mi.prefill_attention(q, k, v, [["vertical_and_slash", 30, 60, 0.9]] * 2, {"dense_below": 0})
    np.testing.assert_array_equal(a, c)


# ---- optional dtypes and torch -----------------------------------------------------------------

def test_bf16_numpy_through_ml_dtypes(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k, v = qkv(rng, 1, 2, 2, 100, 32)
    bf = ml_dtypes.bfloat16
    out = mi.dense_attention(q.astype(bf), k.astype(bf), v.astype(bf))
    assert out.dtype == bf
    ref, _ = reference_attention(q.astype(bf), k.astype(bf), v.astype(bf))
    assert_close(out.astype(np.float64), ref, what="bf16", atol=1e-2, rtol=2e-2)


def test_torch_cpu_tensors(rng):
    torch = pytest.importorskip("torch")
    q, k, v = qkv(rng, 1, 4, 2, 130, 32)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    out = mi.dense_attention(tq, tk, tv)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    assert_close(out.numpy(), reference_attention(q, k, v)[0], what="torch cpu")
    # bf16 through torch; [B, L, H, D] storage through strides.
    tb = [x.to(torch.bfloat16).transpose(1, 2).contiguous().transpose(1, 2) for x in (tq, tk, tv)]
    ob = mi.dense_attention(*tb)
    assert ob.dtype == torch.bfloat16
    ref, _ = reference_attention(*(x.float().numpy() for x in tb))
    assert_close(ob.float().numpy(), ref, what="torch bf16", atol=1e-2, rtol=2e-2)
    with pytest.raises(TypeError):
        mi.dense_attention(tq, k, v)


def test_index_layout_in_one_buffer(rng):
    # Indices laid out by mi_*_index_init over one buffer work like separately allocated ones.
    B, H, L, D = 1, 2, 300, 16
    q, k, v = qkv(rng, B, H, 1, L, D)
    est = mi.vs_estimate(q, k, 40, 80)
    mv, ms = est.vertical_idx.shape[2], est.slash_idx.shape[2]
    assert mi.vs_index_bytes(B, H, mv, ms) >= 4 * (2 * B * H + B * H * (mv + ms))
    vsi = mi.VSIndex.in_buffer(B, H, mv, ms)
    for name in ("vertical_count", "vertical_idx", "slash_count", "slash_idx"):
        getattr(vsi, name)[...] = getattr(est, name)
    R = (L + 63) // 64
    a = mi.vs_build_index(L, est)
    assert mi.sparse_index_bytes(B, H, R, ms + 1, mv) > 0
    b = mi.SparseIndex.in_buffer(B, H, R, ms + 1, mv)
    from minference.core import _check, _lib

    cvs, cb = vsi.to_c(), b.to_c()
    ctx = mi.get_context()
    _check(_lib().mi_vs_build_index(ctx.handle, L, None, cvs, cb), ctx.handle)
    for name in ("block_count", "column_count"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    np.testing.assert_array_equal(mi.sparse_attention(q, k, v, a), mi.sparse_attention(q, k, v, b))
    desc, keep = mi.tensor_descriptor(q)
    assert list(desc.shape) == [B, H, L, D] and keep is q
