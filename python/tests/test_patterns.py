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
            assert getattr(p, f) > 0
        # repr is an expression that rebuilds the pattern
        h = mi.HeadPattern.default(name)
        again = eval(repr(h), {"HeadPattern": mi.HeadPattern})
        assert bytes(again.to_c()) == bytes(h.to_c())


def test_config_entries_read_as_the_c_reader_reads_them():
    # every pattern, as a config entry with sizes, through the C config reader and through
    # patterns_array: the same mi_head_pattern
    entries = {str(code): [name, 11 + code, 23 + code, 0.5]
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
