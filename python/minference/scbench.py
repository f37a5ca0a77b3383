"""SCBench from Python: runs ``minference scbench`` (the C harness) and returns its results.

    from minference import scbench
    res = scbench.run(tasks=["scbench_kv", "scbench_vt"], length=2048, turns=3,
                      attn=["dense", "a_shape:64:512"], kv=["dense"])
    print(scbench.table(res))

The run is the command-line tool's (docs/scbench.md): the same generators, prompts, modes and
scores. ``plot(results, "scb.png")`` draws a results file as the paper's figures (a tasks x
methods heat map and per-turn accuracy, per mode); it needs matplotlib (``pip install
minference[plot]``), nothing else here does. From a shell:

    python -m minference.scbench plot scb.json scb.png
    python -m minference.scbench table scb.json
    python -m minference.scbench merge part1.json part2.json --out all.json

The tool is found, in order: the ``cli`` argument; $MINFERENCE_CLI; the ``minference``
program beside the loaded libminference (a CMake build folder); the repository's build folders;
``minference`` on $PATH.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["run", "table", "plot", "load", "merge", "find_cli", "command", "GENERATED_TASKS", "DATA_TASKS"]

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
            threads=0, dense_below=0, config=None, quiet=True, golden_context=True):
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
    if not golden_context:
        args.append("--no-golden-context")
    if quiet:
        args.append("--quiet")
    return args


def run(model=None, tasks=None, data=None, length=1024, turns=5, examples=1, seed=1,
        mode="both", attn=("dense",), kv=("dense",), max_new_tokens=0, max_length=0,
        chat="auto", reprefill=False, png=None, curves=None, save_data=None, threads=0,
        dense_below=0, config=None, quiet=True, cli=None, timeout=None, golden_context=True):
    """Runs SCBench and returns the tool's JSON as a dict, with the printed table under "table".

    tasks: SCBench task names (default: the generated ones); data: a folder of the public
    <task>.jsonl files; length: generated context length in the model's tokens; attn: prefill
    patterns (names, or NAME:V1:... with budgets); kv: KV-cache specs (a method the library
    refuses is reported with "supported": False in "methods"); golden_context=False: a later
    multi-turn turn carries the model's own previous answer, not the reference one (the
    original's --disable_golden_context). Raises ValueError for bad
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
                       config=config, quiet=quiet, golden_context=golden_context)
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


def table(result, mode=None, digits=1, turns=False):
    """A Markdown table of a result (run()'s dict or the tool's JSON): per mode, one row per
    method (attn + kv), one column per task (score x 100), the mean, and the seconds spent;
    turns=True adds the mean over tasks of each turn (t1, t2, ...)."""
    tasks = result["tasks"]
    n_turns = int(result.get("turns", 0)) if turns else 0
    modes = [mode] if mode else [m for m in ("multi-turn", "multi-request")
                                 if any(r["mode"] == m for r in result["results"])]
    lines = []
    for md in modes:
        lines.append(f"**{md}**\n")
        short = [t[len("scbench_"):] if t.startswith("scbench_") else t for t in tasks]
        tcols = "".join(f" t{i + 1} |" for i in range(n_turns))
        lines.append("| method | " + " | ".join(short) + " | mean |" + tcols + " time (s) |")
        lines.append("|---" * (len(tasks) + 3 + n_turns) + "|")
        for m in result["methods"]:
            label = f"{m['attn']} + {m['kv'] or 'dense'}"
            if not m.get("supported", True):
                why = m.get("why", "") or "refused by the library"
                lines.append(f"| {label} | unsupported: {why} |" +
                             " |" * (len(tasks) + 1 + n_turns))
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
            for i in range(n_turns):
                v = [r["per_turn"][i] for r in rows.values()
                     if i < len(r.get("per_turn", [])) and r["per_turn"][i] is not None]
                mean += f" | {100 * sum(v) / len(v):.{digits}f}" if v else " | –"
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {mean} | {secs:.0f} |")
        lines.append("")
    return "\n".join(lines)


def load(result):
    """A result as a dict: run()'s dict as is, or the tool's JSON file (a path)."""
    if isinstance(result, dict):
        return result
    with open(os.fspath(result), encoding="utf-8") as f:
        return json.load(f)


def merge(*results):
    """One result from several runs of the same tasks (a matrix run in parts): the methods and
    results of each in order, a method already present (same attn and kv) kept from the first.
    The header (model, length, turns, ...) is the first's; the runs must agree on the tasks and
    the turns. The "attn" and "kv" axes are recomputed."""
    parts = [load(r) for r in results]
    if not parts:
        raise ValueError("merge: nothing to merge")
    out = dict(parts[0])
    out["methods"], out["results"], out["runs"] = [], [], []
    seen = set()
    for part in parts:
        if list(part["tasks"]) != list(out["tasks"]) or part.get("turns") != out.get("turns"):
            raise ValueError("merge: the results differ in their tasks or turns")
        for m in part["methods"]:
            key = (m["attn"], m["kv"])
            if key in seen:
                continue
            seen.add(key)
            out["methods"].append(m)
            out["results"] += [r for r in part["results"] if (r["attn"], r["kv"]) == key]
            out["runs"] += [r for r in part.get("runs", []) if (r["attn"], r["kv"]) == key]
    out["attn"] = list(dict.fromkeys(m["attn"] for m in out["methods"]))
    out["kv"] = list(dict.fromkeys(m["kv"] for m in out["methods"]))
    return out


def _short(task):
    return task[len("scbench_"):] if task.startswith("scbench_") else task


def _grid(result, mode):
    """(labels, tasks, scores [method][task] or None per cell, per-turn means [method][turn])
    of one mode: the methods that have results in it, in the file's (attn-major) order, and the
    unsupported ones with no scores."""
    tasks = list(result["tasks"])
    labels, scores, turns = [], [], []
    n_turns = int(result.get("turns", 0)) or 1
    for m in result["methods"]:
        label = f"{m['attn']} + {m['kv'] or 'dense'}"
        rows = {r["task"]: r for r in result["results"]
                if r["mode"] == mode and r["attn"] == m["attn"] and r["kv"] == m["kv"]}
        if not m.get("supported", True):
            labels.append(label + " (unsupported)")
            scores.append([None] * len(tasks))
            turns.append([None] * n_turns)
            continue
        if not rows:
            continue  # not run (yet): a file written part way through a matrix
        labels.append(label)
        scores.append([rows[t]["score"] if t in rows else None for t in tasks])
        per = []
        for i in range(n_turns):
            v = [rows[t]["per_turn"][i] for t in tasks
                 if t in rows and i < len(rows[t].get("per_turn", []))
                 and rows[t]["per_turn"][i] is not None]
            per.append(sum(v) / len(v) if v else None)
        turns.append(per)
    return labels, tasks, scores, turns


def plot(result, out_png, size=None, dpi=100):
    """Draws a result (run()'s dict or the tool's JSON file) into out_png, one column per mode:
    on top the heat map of score x 100 (rows: methods, attn + kv; columns: tasks and their mean;
    red 0 to green 100, unsupported methods grey), below it the mean score over tasks per turn,
    one line per method. size: (width, height) in pixels (default: from the numbers of methods
    and tasks); dpi: the figure's resolution. Returns out_png. Needs matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        import matplotlib
    except ImportError as e:
        raise ImportError("scbench.plot needs matplotlib (pip install 'minference[plot]')") from e
    import numpy as np

    res = load(result)
    modes = [m for m in ("multi-turn", "multi-request")
             if any(r["mode"] == m for r in res["results"])]
    if not modes:
        raise ValueError("the result has no scores to draw")
    grids = [_grid(res, m) for m in modes]
    n_methods = max(len(g[0]) for g in grids)
    n_tasks = len(res["tasks"])
    longest = max((len(label) for g in grids for label in g[0]), default=10)
    if size is None:  # room for the labels (left) and the legend (right)
        size = (int(dpi * (0.13 * longest + (0.7 + 0.62 * (n_tasks + 1)) * len(modes))),
                int(dpi * (4.2 + 0.3 * n_methods)))
    if (not isinstance(dpi, (int, float)) or dpi <= 0 or len(size) != 2
            or any(not isinstance(v, int) or v < 64 for v in size)):
        raise ValueError("size: two integers >= 64 (pixels); dpi > 0")
    fig = Figure(figsize=(size[0] / dpi, size[1] / dpi), dpi=dpi, constrained_layout=True)
    FigureCanvasAgg(fig)
    heat_h = 0.6 + 0.32 * n_methods
    axes = fig.subplots(2, len(modes), squeeze=False,
                        gridspec_kw={"height_ratios": [heat_h, 2.6]})
    cmap = matplotlib.colormaps["RdYlGn"].with_extremes(bad="#d0d0d0")
    # the curves: colour by KV method, line style by prefill pattern (the matrix's two axes)
    attns = list(dict.fromkeys(m["attn"] for m in res["methods"]))
    kvs = list(dict.fromkeys(m["kv"] for m in res["methods"]))
    by_label = {f"{m['attn']} + {m['kv'] or 'dense'}": (attns.index(m["attn"]), kvs.index(m["kv"]))
                for m in res["methods"]}
    colors = matplotlib.colormaps["tab10"]
    styles = ("-", "--", ":", "-.")
    markers = ("o", "s", "^", "D", "v", "P", "X", "*")
    for c, (mode, (labels, tasks, scores, turns)) in enumerate(zip(modes, grids)):
        ax = axes[0][c]
        cols = [_short(t) for t in tasks] + ["mean"]
        data = np.full((len(labels), len(cols)), np.nan)
        for i, row in enumerate(scores):
            vals = [v for v in row if v is not None]
            for j, v in enumerate(row):
                if v is not None:
                    data[i, j] = 100 * v
            if vals and len(vals) == len(row):
                data[i, -1] = 100 * sum(vals) / len(vals)
        ax.imshow(np.ma.masked_invalid(data), cmap=cmap, vmin=0, vmax=100, aspect="auto")
        ax.set_xticks(range(len(cols)), cols, rotation=40, ha="right", fontsize=8)
        ax.set_yticks(range(len(labels)), labels if c == 0 else [""] * len(labels), fontsize=8)
        ax.set_title(mode, fontsize=10)
        if len(labels) * len(cols) <= 400:
            for i in range(len(labels)):
                for j in range(len(cols)):
                    if not np.isnan(data[i, j]):
                        ax.text(j, i, f"{data[i, j]:.0f}", ha="center", va="center", fontsize=7)
        ax = axes[1][c]
        n_turns = max((len(t) for t in turns), default=1)
        for i, (label, per) in enumerate(zip(labels, turns)):
            pts = [(k + 1, 100 * v) for k, v in enumerate(per) if v is not None]
            if pts:
                a, k = by_label.get(label, (i, i))
                ax.plot([p[0] for p in pts], [p[1] for p in pts], linestyle=styles[a % 4],
                        marker=markers[(a // 4) % 8], markersize=3, linewidth=1.2,
                        color=colors(k % 10), label=label)
        ax.set_xticks(range(1, n_turns + 1))
        ax.set_xlim(0.8, n_turns + 0.2)
        ax.set_ylim(-2, 102)
        ax.set_xlabel("turn" if mode == "multi-turn" else "query", fontsize=8)
        ax.set_ylabel("mean score x 100" if c == 0 else "", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    handles, names = axes[1][0].get_legend_handles_labels()
    if handles:
        axes[1][-1].legend(handles, names, fontsize=6, loc="center left",
                           bbox_to_anchor=(1.01, 0.5), frameon=False)
    title = res.get("model", "")
    if title:
        title = os.path.basename(title)
    length = res.get("length", 0)
    fig.suptitle(f"SCBench {title}" + (f", {length} tokens" if length else ""), fontsize=10)
    fig.savefig(os.fspath(out_png), dpi=dpi)
    return out_png


def main(argv=None):
    """python -m minference.scbench plot RESULTS.json OUT.png [--size WxH] [--dpi N]
    python -m minference.scbench table RESULTS.json [--mode MODE] [--turns]
    python -m minference.scbench merge A.json B.json ... --out ALL.json"""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m minference.scbench",
                                 description="Draw or tabulate a `minference scbench --json` file.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plot", help="heat map and per-turn curves (needs matplotlib)")
    p.add_argument("results")
    p.add_argument("out_png")
    p.add_argument("--size", help="WIDTHxHEIGHT in pixels (default: from the matrix's size)")
    p.add_argument("--dpi", type=int, default=100)
    t = sub.add_parser("table", help="the Markdown table")
    t.add_argument("results")
    t.add_argument("--mode", choices=("multi-turn", "multi-request"))
    t.add_argument("--turns", action="store_true", help="add the mean score of each turn")
    g = sub.add_parser("merge", help="one results file from several runs of the same tasks")
    g.add_argument("results", nargs="+")
    g.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.cmd == "merge":
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(merge(*args.results), f, indent=1)
        return 0
    if args.cmd == "table":
        print(table(load(args.results), mode=args.mode, turns=args.turns))
        return 0
    size = None
    if args.size:
        try:
            w, h = (int(v) for v in args.size.lower().split("x"))
        except ValueError:
            ap.error("--size: WIDTHxHEIGHT, e.g. 1600x900")
        size = (w, h)
    try:
        plot(args.results, args.out_png, size=size, dpi=args.dpi)
    except ImportError as e:
        print(f"python -m minference.scbench: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
