"""Finding and loading libminference (subprocesses, so the loaded library stays as it is)."""

import os
import subprocess
import sys

import minference


def _run(code, **env):
    e = dict(os.environ)
    e.update(env)
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(minference.__file__)))
    e["PYTHONPATH"] = pkg + os.pathsep + e.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e,
                          timeout=120)


def test_library_env_var_is_used():
    path = minference.library_path()
    r = _run("import minference as m; print(m.library_path()); print(m.version())",
             MINFERENCE_LIBRARY=path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [path, minference.version()]


def test_missing_library_is_a_clear_error():
    r = _run(
        "import minference as m\n"
        "print(m.MInferenceConfig.get_available_kv_types()[0])\n"  # needs no library
        "try:\n"
        "    m.version()\n"
        "except ImportError as e:\n"
        "    print('ERR', e)\n",
        MINFERENCE_LIBRARY="/nonexistent/libminference.so")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("dense")
    assert "ERR" in r.stdout and "MINFERENCE_LIBRARY" in r.stdout and "pip install" in r.stdout
