"""SCBench from Python: runs ``minference scbench`` (the C harness) and returns its results.

    from minference import scbench
    res = scbench.run(tasks=["scbench_kv", "scbench_vt"], length=2048, turns=3,
                      attn=["dense", "a_shape:64:512"], kv=["dense"])
    print(scbench.table(res))

The run is the command-line tool's (docs/scbench.md): the same generators, prompts, modes and
scores. The tool is found, in order: the ``cli`` argument; $MINFERENCE_CLI; the ``minference``
program beside the loaded libminference (a CMake build folder); the repository's build folders;
``minference`` on $PATH.
"""

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["run", "table", "find_cli", "command", "GENERATED_TASKS", "DATA_TASKS"]

GENERATED_TASKS = (
    "scbench_kv",
    "scbench_prefix_suffix",
    "scbench_vt",
    "scbench_mf",
    "scbench_many_shot",
    "scbench_summary_with_needles",
    "scbench_repoqa",
    "scbench_repoqa_and_kv",
)
# The tasks built from books: they need the public files (data=DIR).
DATA_TASKS = ("scbench_qa_eng", "scbench_qa_chn", "scbench_choice_eng", "scbench_summary")

_MODES = ("both", "multi-turn", "multi-request")
_CHATS = ("auto", "chatml", "llama3", "none")


def _is_exe(p):
    return p is not None and os.path.isfile(p) and os.access(p, os.X_OK)


def find_cli():
    """The path of the ``minference`` command-line tool, or None."""
    env = os.environ.get("MINFERENCE_CLI")
    if env:
        return env if _is_exe(env) else None
    try:
        from . import _lib

        beside = Path(_lib.library_path()).resolve().parent / "minference"
        if _is_exe(str(beside)):
            return str(beside)
    except Exception:  # no library loaded: the other places may still have the tool
        pass
    repo = Path(__file__).resolve().parents[2]
    for build in sorted(repo.glob("build*")):
        cand = build / "minference"
        if _is_exe(str(cand)):
            return str(cand)
    return shutil.which("minference")


def _names(value, what, sep=","):
    if isinstance(value, str):
        value = [value]
    value = [str(v) for v in value]
    if not value or any(not v or sep in v for v in value):
        raise ValueError(f"{what}: a non-empty list of names without '{sep}'")
    return sep.join(value)


def command(model=None, tasks=None, data=None, length=1024, turns=5, examples=1, seed=1,
            mode="both", attn=("dense",), kv=("dense",), max_new_tokens=0, max_length=0,
            chat="auto", reprefill=False, json_path=None, png=None, curves=None, save_data=None,
            threads=0, dense_below=0, config=None, quiet=True):
    """The argument list of the tool (without the program), after checking the values."""
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, not {mode!r}")
    if chat not in _CHATS:
        raise ValueError(f"chat must be one of {_CHATS}, not {chat!r}")
    for name, v, lo in (("length", length, 64), ("turns", turns, 1), ("examples", examples, 0),
                        ("seed", seed, 0), ("max_new_tokens", max_new_tokens, 0),
                        ("max_length", max_length, 0), ("threads", threads, 0),
                        ("dense_below", dense_below, 0)):
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, not {v!r}")
    if turns > 64:
        raise ValueError("turns must be at most 64")
    args = ["scbench", "--length", str(length), "--turns", str(turns), "--examples",
            str(examples), "--seed", str(seed), "--mode", mode, "--attn", _names(attn, "attn"),
            "--kv", _names(kv, "kv", ";"), "--max-new-tokens", str(max_new_tokens), "--chat", chat,
            "--threads", str(threads), "--dense-below", str(dense_below)]
    if tasks is not None:
        args += ["--tasks", _names(tasks, "tasks")]
        if data is None:
            needs = [t for t in ([tasks] if isinstance(tasks, str) else tasks) if t in DATA_TASKS]
            if needs:
                raise ValueError(f"{', '.join(needs)} need the public data (data=DIR)")
    for flag, v in (("--model", model), ("--data", data), ("--json", json_path), ("--png", png),
                    ("--curves", curves), ("--save-data", save_data), ("--config", config)):
        if v is not None:
            args += [flag, os.fspath(v)]
    if max_length:
        args += ["--max-length", str(max_length)]
    if reprefill:
        args.append("--reprefill")
    if quiet:
        args.append("--quiet")
    return args


def run(model=None, tasks=None, data=None, length=1024, turns=5, examples=1, seed=1,
        mode="both", attn=("dense",), kv=("dense",), max_new_tokens=0, max_length=0,
        chat="auto", reprefill=False, png=None, curves=None, save_data=None, threads=0,
        dense_below=0, config=None, quiet=True, cli=None, timeout=None):
    """Runs SCBench and returns the tool's JSON as a dict, with the printed table under "table".

    tasks: SCBench task names (default: the generated ones); data: a folder of the public
    <task>.jsonl files; length: generated context length in the model's tokens; attn: prefill
    patterns (names, or NAME:V1:... with budgets); kv: KV-cache specs (a method the library
    refuses is reported with "supported": False in "methods"). Raises ValueError for bad
    arguments, FileNotFoundError when the tool is not found, RuntimeError when it fails.
    """
    exe = cli or find_cli()
    if not exe or not _is_exe(exe):
        raise FileNotFoundError("the minference command-line tool was not found "
                                "(build it, or set MINFERENCE_CLI)")
    with tempfile.TemporaryDirectory(prefix="mi_scbench_") as tmp:
        out = os.path.join(tmp, "scbench.json")
        args = command(model=model, tasks=tasks, data=data, length=length, turns=turns,
                       examples=examples, seed=seed, mode=mode, attn=attn, kv=kv,
                       max_new_tokens=max_new_tokens, max_length=max_length, chat=chat,
                       reprefill=reprefill, json_path=out, png=png, curves=curves,
                       save_data=save_data, threads=threads, dense_below=dense_below,
                       config=config, quiet=quiet)
        proc = subprocess.run([exe] + args, stdout=subprocess.PIPE,
                              stderr=None if not quiet else subprocess.PIPE, text=True,
                              timeout=timeout, check=False)
        if proc.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"minference scbench failed ({proc.returncode}): "
                               f"{(proc.stderr or '').strip()[-2000:]}")
        with open(out, encoding="utf-8") as f:
            res = json.load(f)
    res["table"] = proc.stdout
    return res


def table(result, mode=None, digits=1):
    """A Markdown table of a result (run()'s dict or the tool's JSON): per mode, one row per
    method (attn + kv), one column per task (score x 100), the mean, and the seconds spent."""
    tasks = result["tasks"]
    modes = [mode] if mode else [m for m in ("multi-turn", "multi-request")
                                 if any(r["mode"] == m for r in result["results"])]
    lines = []
    for md in modes:
        lines.append(f"**{md}**\n")
        short = [t[len("scbench_"):] if t.startswith("scbench_") else t for t in tasks]
        lines.append("| method | " + " | ".join(short) + " | mean | time (s) |")
        lines.append("|---" * (len(tasks) + 3) + "|")
        for m in result["methods"]:
            label = f"{m['attn']} + {m['kv'] or 'dense'}"
            if not m.get("supported", True):
                why = m.get("why", "") or "refused by the library"
                lines.append(f"| {label} | unsupported: {why} |" + " |" * (len(tasks) + 1))
                continue
            rows = {r["task"]: r for r in result["results"]
                    if r["mode"] == md and r["attn"] == m["attn"] and r["kv"] == m["kv"]}
            if not rows:
                continue
            cells, vals, secs = [], [], 0.0
            for t in tasks:
                r = rows.get(t)
                if r is None or r["score"] is None:
                    cells.append("–")
                    continue
                vals.append(r["score"])
                secs += r.get("total_s", 0.0)
                cells.append(f"{100 * r['score']:.{digits}f}")
            mean = f"{100 * sum(vals) / len(vals):.{digits}f}" if vals else "–"
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {mean} | {secs:.0f} |")
        lines.append("")
    return "\n".join(lines)
