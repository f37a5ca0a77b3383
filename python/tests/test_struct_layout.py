"""The ctypes structs of minference/_lib.py against the C headers: every public struct's size and
each field's offset and size as the C compiler lays them out (printed by the test helper
tests/api/struct_layout.c, which CMake builds as mi_struct_layout). Structs the package does not
bind (yet) are printed too, so that binding one is checked at once.

Under pytest the helper is $MINFERENCE_STRUCT_LAYOUT, else the one of the build that
$MINFERENCE_LIBRARY comes from, else of ../build*; the test skips when there is none. ctest runs
this file directly: python3 test_struct_layout.py HELPER.
"""

import ctypes
import glob
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIB_PY = ROOT / "python" / "minference" / "_lib.py"
HEADERS = sorted((ROOT / "include").glob("minference*.h"))


def _ctypes_structs():
    # The module file itself, not the package: it needs no NumPy and loads no library.
    spec = importlib.util.spec_from_file_location("minference_lib_layout", LIB_PY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return {name: cls for name, cls in vars(mod).items()
            if isinstance(cls, type) and issubclass(cls, ctypes.Structure)
            and cls is not ctypes.Structure}


def _header_structs():
    names = set()
    for h in HEADERS:
        names.update(re.findall(r"typedef struct (mi_\w+) \{", h.read_text(encoding="utf-8")))
    return names


def layout_errors(helper):
    c = json.loads(subprocess.run([helper], check=True, capture_output=True, text=True).stdout)
    py = _ctypes_structs()
    errors = []
    for name in sorted(_header_structs() - set(c)):
        errors.append(f"{name}: declared in a public header, missing from struct_layout.c")
    for name in sorted(set(py) - set(c)):
        errors.append(f"{name}: declared in _lib.py, unknown to struct_layout.c")
    for name in sorted(set(c) & set(py)):
        cls, want = py[name], c[name]
        if ctypes.sizeof(cls) != want["size"]:
            errors.append(f"{name}: ctypes size {ctypes.sizeof(cls)}, C size {want['size']}")
        fields = [f[0] for f in cls._fields_]
        if fields != list(want["fields"]):
            errors.append(f"{name}: ctypes fields {fields}, C fields {list(want['fields'])}")
            continue
        for f in fields:
            got = [getattr(cls, f).offset, getattr(cls, f).size]
            if got != want["fields"][f]:
                errors.append(f"{name}.{f}: ctypes [offset, size] {got}, C {want['fields'][f]}")
    return errors, len(c)


def _find_helper():
    env = os.environ.get("MINFERENCE_STRUCT_LAYOUT")
    if env:
        return env
    lib = os.environ.get("MINFERENCE_LIBRARY")
    dirs = [os.path.dirname(lib)] if lib else []
    dirs += sorted(glob.glob(str(ROOT / "build*")))
    for d in dirs:
        p = os.path.join(d, "tests", "api", "mi_struct_layout")
        if os.access(p, os.X_OK):
            return p
    return None


def test_struct_layout():
    import pytest

    helper = _find_helper()
    if helper is None:
        pytest.skip("mi_struct_layout not built (cmake builds it with the tests)")
    errors, _ = layout_errors(helper)
    assert not errors, "\n".join(errors)


if __name__ == "__main__":
    errs, n = layout_errors(sys.argv[1])
    for e in errs:
        print(e)
    print(f"{n} structs, {len(errs)} differences")
    sys.exit(1 if errs else 0)
