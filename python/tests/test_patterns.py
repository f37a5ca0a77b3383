"""The pattern table seen from Python: names, aliases, fields and config entries come from the
library (no copy in the package), and agree with what the C library and its CLI report."""

import os
import subprocess
from pathlib import Path

import pytest

import minference as mi
from minference import _lib as L
from minference.core import patterns_array


def test_names_come_from_the_library():
    lib = L.load()
    names = mi.pattern_names()
    assert len(names) == lib.mi_pattern_count() >= 5
    assert names == {t: lib.mi_pattern_name(t).decode() for t in range(lib.mi_pattern_count())}
    assert names[L.MI_PATTERN_DENSE] == "dense"
    assert names[L.MI_PATTERN_A_SHAPE] == "stream_llm"
    assert names[L.MI_PATTERN_TRI_SHAPE] == "tri_shape"
    assert names[L.MI_PATTERN_VERTICAL_SLASH] == "vertical_and_slash"
    assert names[L.MI_PATTERN_BLOCK_SPARSE] == "block_sparse"
    assert "a_shape" in mi.pattern_aliases("stream_llm")
    assert "vs" in mi.pattern_aliases(L.MI_PATTERN_VERTICAL_SLASH)


def test_every_name_and_alias_round_trips():
    seen = set()
    for code, name in mi.pattern_names().items():
        assert mi.pattern_from_name(name) == code
        assert mi.HeadPattern(name).name == name
        for alias in mi.pattern_aliases(code):
            assert mi.pattern_from_name(alias) == code
            assert mi.HeadPattern(alias).name == name
            assert alias not in seen
            seen.add(alias)
        assert name not in seen
        seen.add(name)
    with pytest.raises(mi.MInferenceError):
        mi.pattern_from_name("no_such_pattern")


def test_every_pattern_has_defaults_and_a_repr():
    for code, name in mi.pattern_names().items():
        p = mi.HeadPattern.default(name).to_c()
        assert p.type == code
        for f in mi.pattern_fields(code):
            # 0 only for a switch that is off by default
            assert getattr(p, f) > 0 or (f in ("dense_local", "per_head") and getattr(p, f) == 0)
        # repr is an expression that rebuilds the pattern
        h = mi.HeadPattern.default(name)
        again = eval(repr(h), {"HeadPattern": mi.HeadPattern})
        assert bytes(again.to_c()) == bytes(h.to_c())


def test_config_entries_read_as_the_c_reader_reads_them():
    # every pattern, as a config entry with sizes, through the C config reader and through
    # patterns_array: the same mi_head_pattern
    # (first sizes that are powers of two: XAttention's stride must split a 64-row block)
    entries = {str(code): [name, 2 ** (1 + code % 5), 23 + code, 0.5]
               for code, name in mi.pattern_names().items()}
    entries[str(len(entries))] = ["block_sparse", 0, 0]
    cfg = mi.Config.from_list([entries])
    pats, _ = cfg.layer(0, len(entries))
    direct = patterns_array([entries[str(h)] for h in range(len(entries))])
    for h in range(len(entries)):
        assert bytes(pats[h].to_c()) == bytes(direct[h]), entries[str(h)]
    # and back to the same JSON entry
    back = mi.Config.create(1, len(entries))
    for h in range(len(entries)):
        back.set_head(0, h, pats[h], 0.5)
    again, _ = mi.Config.parse(back.to_json()).layer(0, len(entries))
    assert [bytes(p.to_c()) for p in again] == [bytes(p.to_c()) for p in pats]


def test_parse_names_and_fields():
    for code, name in mi.pattern_names().items():
        fields = mi.pattern_fields(code)
        text = ":".join([name] + [str(5 + i) for i in range(len(fields))])
        p = mi.HeadPattern.parse(text).to_c()
        assert p.type == code
        assert [getattr(p, f) for f in fields] == [5 + i for i in range(len(fields))]
    with pytest.raises(mi.MInferenceError):
        mi.HeadPattern.parse("a_shape:1")


def _cli():
    lib = os.environ.get("MINFERENCE_LIBRARY")
    if lib:
        cli = Path(lib).parent / "minference"
        if cli.is_file():
            return cli
    for build in sorted(Path(__file__).resolve().parents[2].glob("build*")):
        if (build / "minference").is_file():
            return build / "minference"
    return None


def test_python_sees_the_names_the_cli_lists():
    cli = _cli()
    if cli is None:
        pytest.skip("no minference CLI built next to the library")
    out = subprocess.run([str(cli), "info"], capture_output=True, text=True, check=True).stdout
    listed = out.split("patterns", 1)[1]
    for code, name in mi.pattern_names().items():
        line = next(l for l in listed.splitlines() if l.split() and l.split()[0].rstrip(":") == name)
        for alias in mi.pattern_aliases(code):
            assert alias in line
        for f in mi.pattern_fields(code):
            assert f in line


def test_method_patterns_of_the_original_attn_types():
    """xattention, flexprefill, dilated1 and dilated2: one pattern per head, with the original's
    defaults (thresholds per mille in the library), and options the kernels lack refused."""
    from minference import MInferenceConfig

    x = MInferenceConfig("xattention").head_pattern().to_c()
    assert (x.type, x.stride, x.threshold) == (L.MI_PATTERN_XATTENTION, 8, 900)
    x = MInferenceConfig("xattention", attn_kwargs={"stride": 16, "threshold": 0.95})
    assert (x.head_pattern().to_c().stride, x.head_pattern().to_c().threshold) == (16, 950)
    f = MInferenceConfig("flexprefill").head_pattern().to_c()
    assert (f.type, f.threshold, f.tau) == (L.MI_PATTERN_FLEXPREFILL, 900, 100)
    d1 = MInferenceConfig("dilated1").head_pattern().to_c()
    d2 = MInferenceConfig("dilated2").head_pattern().to_c()
    assert (d1.n_init, d1.n_local, d1.stride, d1.dense_local) == (1024, 8192, 2, 0)
    assert (d2.n_init, d2.n_local, d2.stride, d2.dense_local) == (1024, 6144, 2, 2048)
    with pytest.raises(ValueError):
        MInferenceConfig("xattention", attn_kwargs={"norm": 2}).head_pattern()
    with pytest.raises(ValueError):
        MInferenceConfig("flexprefill", attn_kwargs={"max_budget": 4096}).head_pattern()
    with pytest.raises(ValueError):
        mi.HeadPattern.xattention(8, 1.5)


@pytest.mark.parametrize("pattern", [
    mi.HeadPattern.xattention(8, 1.0), mi.HeadPattern.flexprefill(1.0, 0.1),
    mi.HeadPattern.dilated(0, 4096, 1, 0), mi.HeadPattern.strided(4096)])
def test_method_patterns_covering_everything_are_dense(pattern):
    """A budget covering every key gives dense attention (through ops.prefill_attention)."""
    from conftest import qkv, reference_attention
    import numpy as np

    q, k, v = qkv(np.random.default_rng(7), 1, 2, 1, 700, 32)
    params = mi.PrefillParams(dense_below=0)
    out = mi.prefill_attention(q, k, v, [pattern, pattern], params=params)
    ref = reference_attention(q, k, v)[0]
    assert np.max(np.abs(out - ref)) < 2e-4


def test_method_patterns_sparse_differ_from_dense():
    """With real budgets the methods keep fewer keys: the output moves away from dense."""
    from conftest import qkv, reference_attention
    import numpy as np

    q, k, v = qkv(np.random.default_rng(8), 1, 4, 2, 1500, 32)
    pats = [mi.HeadPattern.xattention(8, 0.5), mi.HeadPattern.flexprefill(0.5, 0.1),
            mi.HeadPattern.dilated(16, 256, 4, 32), mi.HeadPattern.strided(64)]
    params = mi.PrefillParams(dense_below=0)
    out = mi.prefill_attention(q, k, v, pats, params=params)
    ref = reference_attention(q, k, v)[0]
    for h in range(4):
        assert np.max(np.abs(out[0, h] - ref[0, h])) > 1e-3


def test_static_vs_estimates_once_and_reuses():
    """MInference w/ static: the sets of the first input are reused for the next ones; on the
    first input it is the dynamic vertical-slash prefill with the same estimate parameters, and
    budgets covering everything are dense."""
    from conftest import qkv, reference_attention
    import numpy as np
    from minference.ops import StaticVSAttention, sparse_attention, vs_build_index, vs_estimate

    rng = np.random.default_rng(11)
    q, k, v = qkv(rng, 1, 4, 2, 1200, 32)
    q2, k2, v2 = qkv(rng, 1, 4, 2, 1000, 32)
    st = StaticVSAttention(64, 128)
    first = st(q, k, v)
    vs = mi.VSParams(forced_diagonals=30)
    dyn = mi.prefill_attention(q, k, v, mi.HeadPattern.vertical_slash(64, 128),
                               params=mi.PrefillParams(vs=vs, dense_below=0))
    assert np.array_equal(first, dyn)
    second = st(q2, k2, v2)
    assert st.estimates == 1
    sets = vs_estimate(q, k, 64, 128, vs)
    want = sparse_attention(q2, k2, v2, vs_build_index(1000, sets))
    assert np.array_equal(second, want)
    # the second input's own estimate differs: the reuse is real
    own = mi.prefill_attention(q2, k2, v2, mi.HeadPattern.vertical_slash(64, 128),
                               params=mi.PrefillParams(vs=vs, dense_below=0))
    assert not np.array_equal(second, own)
    everything = StaticVSAttention(1200, 1200)
    everything(q, k, v)
    out = everything(q2, k2, v2)
    assert np.max(np.abs(out - reference_attention(q2, k2, v2)[0])) < 2e-4
