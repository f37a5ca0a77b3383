#!/usr/bin/env python3
"""The dynamic symbols a shared library exports are exactly the functions its public headers
declare, and every such declaration carries MI_API.

    check_exports.py LIBRARY HEADER...

Reads `nm -D --defined-only LIBRARY`; prints each difference and exits 1 on any.
"""
import re
import subprocess
import sys

# Symbols every shared object defines, not part of any API.
LINKER_SYMBOLS = {"_init", "_fini", "_edata", "_end", "__bss_start"}


def strip_comments_and_directives(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"\\\n", " ", text)  # join continued lines (macros)
    lines = [l for l in text.split("\n") if not l.lstrip().startswith("#")]
    text = "\n".join(lines)
    return text.replace('extern "C" {', "")


def declarations(path):
    """(name, has MI_API) for every function declared at file scope in a header."""
    text = strip_comments_and_directives(open(path, encoding="utf-8").read())
    out, depth, stmt = [], 0, []
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth = max(depth - 1, 0)
        if ch == ";" and depth == 0:
            s = " ".join("".join(stmt).split())
            stmt = []
            if s.startswith("typedef") or "(" not in s:
                continue
            m = re.match(r"^(.*?)\b([A-Za-z_]\w*)\s*\(", s)
            if m:
                out.append((m.group(2), "MI_API" in m.group(1).split()))
        else:
            stmt.append(ch)
    return out


def main():
    lib, headers = sys.argv[1], sys.argv[2:]
    nm = subprocess.run(["nm", "-D", "--defined-only", lib], check=True, capture_output=True,
                        text=True).stdout
    exported = {l.split()[-1] for l in nm.splitlines() if l.split()} - LINKER_SYMBOLS
    declared, unmarked = set(), []
    for h in headers:
        for name, marked in declarations(h):
            declared.add(name)
            if not marked:
                unmarked.append(f"{h}: {name} is declared without MI_API")
    errors = unmarked
    errors += [f"{lib}: exports {s}, which no public header declares"
               for s in sorted(exported - declared)]
    errors += [f"{lib}: does not export {s}, declared in a public header"
               for s in sorted(declared - exported)]
    for e in errors:
        print(e)
    print(f"{lib}: {len(exported)} exported symbols, {len(declared)} public declarations, "
          f"{len(errors)} differences")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
