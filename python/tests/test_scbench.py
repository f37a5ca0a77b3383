"""minference.scbench: the argument checks, the Markdown table, and a tiny run of the tool on the
demo model (skipped when the tool or the model is absent)."""

import os

import pytest

from minference import scbench


def test_command_flags():
    args = scbench.command(tasks=["scbench_kv", "scbench_vt"], length=512, turns=2,
                           attn=["dense", "a_shape:64:512"],
                           kv=["dense", "snapkv:max_capacity_prompt=512,window_size=16"],
                           reprefill=True,
                           json_path="/tmp/x.json")
    assert args[0] == "scbench"
    assert args[args.index("--tasks") + 1] == "scbench_kv,scbench_vt"
    assert args[args.index("--attn") + 1] == "dense,a_shape:64:512"
    assert args[args.index("--kv") + 1] == "dense;snapkv:max_capacity_prompt=512,window_size=16"
    assert args[args.index("--length") + 1] == "512"
    assert "--reprefill" in args and "--quiet" in args
    assert args[args.index("--json") + 1] == "/tmp/x.json"
    assert "--no-golden-context" not in args
    assert "--no-golden-context" in scbench.command(golden_context=False)


@pytest.mark.parametrize("kwargs", [
    {"mode": "sideways"},
    {"chat": "klingon"},
    {"length": 10},
    {"turns": 0},
    {"turns": 65},
    {"attn": []},
    {"kv": ["a;b"]},
    {"examples": -1},
    {"length": 1.5},
    {"tasks": ["scbench_qa_eng"]},  # a book task needs data=
])
def test_command_rejects(kwargs):
    with pytest.raises(ValueError):
        scbench.command(**kwargs)


def test_book_task_with_data_is_accepted():
    args = scbench.command(tasks="scbench_qa_eng", data="/some/dir")
    assert args[args.index("--data") + 1] == "/some/dir"


def test_table():
    res = {
        "tasks": ["scbench_kv", "scbench_mf"],
        "methods": [{"attn": "dense", "kv": "dense", "supported": True},
                    {"attn": "dense", "kv": "snapkv", "supported": False, "why": "no such method"}],
        "results": [
            {"mode": "multi-turn", "attn": "dense", "kv": "dense", "task": "scbench_kv",
             "score": 0.5, "total_s": 2.0},
            {"mode": "multi-turn", "attn": "dense", "kv": "dense", "task": "scbench_mf",
             "score": 0.25, "total_s": 1.0},
        ],
    }
    t = scbench.table(res)
    assert "**multi-turn**" in t and "multi-request" not in t
    assert "| dense + dense | 50.0 | 25.0 | 37.5 | 3 |" in t
    assert "| dense + snapkv | unsupported: no such method |" in t


def _model():
    path = os.environ.get("MI_MODEL")
    if path and os.path.exists(path):
        return path
    try:
        from minference.model import default_model_path
        path = default_model_path()
    except Exception:
        return None
    return path if path and os.path.exists(path) else None


def test_run_tiny():
    cli, model = scbench.find_cli(), _model()
    if not cli or not model:
        pytest.skip("no minference tool or no demo model")
    res = scbench.run(model=model, tasks=["scbench_mf"], length=256, turns=2, mode="both",
                      kv=["dense", "no_such_kv_method"], max_new_tokens=6, cli=cli)
    assert [m["supported"] for m in res["methods"]] == [True, False]
    rows = [r for r in res["results"] if r["task"] == "scbench_mf"]
    assert sorted(r["mode"] for r in rows) == ["multi-request", "multi-turn"]
    for r in rows:
        assert 0.0 <= r["score"] <= 1.0
        assert len(r["per_turn"]) == 2 and all(v is not None for v in r["per_turn"])
        assert r["context_tokens"] > 200
    assert "multi-turn" in res["table"]
    with pytest.raises(RuntimeError):
        scbench.run(model="/nonexistent/model.gguf", tasks=["scbench_mf"], length=256, turns=1,
                    cli=cli)


def _matrix_result():
    """A 2 x 2 matrix (attn x kv) in the tool's JSON layout, one method unsupported and one not
    run yet (a file written part way)."""
    methods = [{"attn": a, "kv": k, "supported": True}
               for a in ("dense", "a_shape:64:512") for k in ("dense", "snapkv")]
    methods[1]["supported"] = False
    methods[1]["why"] = "refused"
    results = []
    for mode in ("multi-turn", "multi-request"):
        for i, m in enumerate(methods[:3]):
            if not m["supported"]:
                continue
            for j, task in enumerate(("scbench_kv", "scbench_repoqa")):
                per = [0.25 * ((i + j + t) % 5) for t in range(3)]
                results.append({"mode": mode, "attn": m["attn"], "kv": m["kv"], "task": task,
                                "score": sum(per) / 3, "per_turn": per, "total_s": 1.0})
    return {"model": "/m/SmolLM2.gguf", "length": 1024, "turns": 3, "attn":
            ["dense", "a_shape:64:512"], "kv": ["dense", "snapkv"],
            "tasks": ["scbench_kv", "scbench_repoqa"], "methods": methods, "results": results}


def test_grid_of_a_partial_matrix():
    labels, tasks, scores, turns = scbench._grid(_matrix_result(), "multi-request")
    # the unsupported method stays (no scores); the one not run yet is left out
    assert labels == ["dense + dense", "dense + snapkv (unsupported)", "a_shape:64:512 + dense"]
    assert tasks == ["scbench_kv", "scbench_repoqa"]
    assert scores[1] == [None, None]
    assert scores[2] == pytest.approx([(0.5 + 0.75 + 1.0) / 3, (0.75 + 1.0 + 0.0) / 3])
    # per turn: the mean over the tasks
    assert turns[0] == pytest.approx([(0.0 + 0.25) / 2, (0.25 + 0.5) / 2, (0.5 + 0.75) / 2])


def test_command_passes_all():
    args = scbench.command(attn="all", kv="all")
    assert args[args.index("--attn") + 1] == "all" and args[args.index("--kv") + 1] == "all"


def _png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    src = tmp_path / "r.json"
    src.write_text(__import__("json").dumps(_matrix_result()))
    out = tmp_path / "r.png"
    assert scbench.plot(src, out, size=(900, 640), dpi=80) == out
    assert _png_size(out) == (900, 640)
    # the default size grows with the number of methods
    small = _matrix_result()
    small["methods"] = small["methods"][:1]
    scbench.plot(small, tmp_path / "s.png")
    scbench.plot(_matrix_result(), tmp_path / "l.png")
    assert _png_size(tmp_path / "s.png")[1] < _png_size(tmp_path / "l.png")[1]
    # the command line
    assert scbench.main(["plot", str(src), str(tmp_path / "c.png"), "--size", "640x480"]) == 0
    assert _png_size(tmp_path / "c.png") == (640, 480)
    empty = dict(_matrix_result(), results=[])
    with pytest.raises(ValueError):
        scbench.plot(empty, tmp_path / "e.png")
    with pytest.raises(ValueError):
        scbench.plot(src, tmp_path / "e.png", size=(10, 10))


def test_main_table(tmp_path, capsys):
    src = tmp_path / "r.json"
    src.write_text(__import__("json").dumps(_matrix_result()))
    assert scbench.main(["table", str(src), "--mode", "multi-turn"]) == 0
    out = capsys.readouterr().out
    assert "**multi-turn**" in out and "| a_shape:64:512 + dense |" in out
    assert "| dense + snapkv | unsupported: refused |" in out
    # per turn: dense + dense has turns (0, .25, .5) on kv and (.25, .5, .75) on repoqa
    assert scbench.main(["table", str(src), "--mode", "multi-turn", "--turns"]) == 0
    out = capsys.readouterr().out
    assert "| mean | t1 | t2 | t3 | time (s) |" in out
    assert "| dense + dense | 25.0 | 50.0 | 37.5 | 12.5 | 37.5 | 62.5 | 2 |" in out


def test_merge(tmp_path):
    full = _matrix_result()
    a, b = dict(full), dict(full)
    # two parts of one matrix: the dense row, then the a_shape row (with dense + dense again)
    a["methods"] = full["methods"][:2]
    a["results"] = [r for r in full["results"] if r["attn"] == "dense"]
    b["methods"] = [full["methods"][0]] + full["methods"][2:]
    b["results"] = [dict(r, score=0.99) for r in full["results"]]
    m = scbench.merge(a, b)
    assert [(x["attn"], x["kv"]) for x in m["methods"]] == [(x["attn"], x["kv"])
                                                           for x in full["methods"]]
    assert m["attn"] == ["dense", "a_shape:64:512"] and m["kv"] == ["dense", "snapkv"]
    # dense + dense comes from the first part only
    dd = [r for r in m["results"] if r["attn"] == "dense" and r["kv"] == "dense"]
    assert len(dd) == 4 and all(r["score"] != 0.99 for r in dd)
    assert len(m["results"]) == len(full["results"])
    src_a, src_b = tmp_path / "a.json", tmp_path / "b.json"
    src_a.write_text(__import__("json").dumps(a))
    src_b.write_text(__import__("json").dumps(b))
    assert scbench.main(["merge", str(src_a), str(src_b), "--out", str(tmp_path / "m.json")]) == 0
    assert scbench.load(tmp_path / "m.json")["methods"] == m["methods"]
    with pytest.raises(ValueError):
        scbench.merge(a, dict(b, tasks=["scbench_kv"]))
    with pytest.raises(ValueError):
        scbench.merge()
