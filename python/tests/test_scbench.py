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
