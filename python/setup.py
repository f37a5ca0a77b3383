"""Build step of the minference package: builds libminference with CMake and ships it.

The package lives in python/ inside the minference repository; the C library is the CMake project
one level up. `pip install ./python` configures that project in python/build/cmake, builds the
shared library targets (libminference and the model runner, libminference_model) and copies them
into the package (minference/lib/), where the ctypes loader finds them.

Environment:
  MINFERENCE_LIBRARY     path of an already built libminference.so: nothing is compiled, and the
                         package loads that file at run time (the variable still wins at run time);
                         the model runner is then looked for beside it.
  MINFERENCE_SOURCE_DIR  the repository root, when the package is built outside the repository.
  MINFERENCE_CMAKE_ARGS  extra CMake arguments, e.g. "-DMI_CUDA=OFF" or "-DMI_NATIVE=ON".
  CMAKE_BUILD_PARALLEL_LEVEL  build jobs (default: all cores).
"""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py as _build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel as _bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel as _bdist_wheel

HERE = Path(__file__).resolve().parent
LIB_SUFFIX = ".so" if sys.platform != "darwin" else ".dylib"
LIB_NAME = "libminference" + LIB_SUFFIX
MODEL_LIB_NAME = "libminference_model" + LIB_SUFFIX


def _source_dir():
    env = os.environ.get("MINFERENCE_SOURCE_DIR")
    candidates = [Path(env)] if env else [HERE.parent]
    for c in candidates:
        if (c / "CMakeLists.txt").is_file() and (c / "include" / "minference.h").is_file():
            return c.resolve()
    raise RuntimeError(
        "minference: cannot find the libminference sources (CMakeLists.txt and include/minference.h) "
        f"in {', '.join(str(c) for c in candidates)}. Build the package from inside the minference "
        "repository (pip install ./python), set MINFERENCE_SOURCE_DIR to the repository root, or set "
        "MINFERENCE_LIBRARY to an installed libminference.so."
    )


def _run(cmd, **kw):
    print("minference build:", " ".join(shlex.quote(str(c)) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, **kw)


def _built(build_dir: Path, name):
    found = sorted(p for p in build_dir.rglob(name + "*") if p.is_file() and not p.is_symlink())
    return found[0] if found else None


def build_library(build_dir: Path):
    """Configures and builds the `minference` and `minference_model_shared` targets; returns the
    paths of the two shared libraries (the second None when the model runner did not build)."""
    src = _source_dir()
    cmake = shutil.which("cmake")
    if cmake is None:
        raise RuntimeError("minference: CMake >= 3.24 is needed to build libminference (pip install cmake)")
    args = [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DMI_BUILD_TESTS=OFF",
    ] + shlex.split(os.environ.get("MINFERENCE_CMAKE_ARGS", ""))
    cache = build_dir / "CMakeCache.txt"
    if cache.exists():
        # A cache written for another source tree (the repository moved) cannot be reused.
        text = cache.read_text(errors="replace")
        if f"CMAKE_HOME_DIRECTORY:INTERNAL={src}" not in text:
            shutil.rmtree(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    _run([cmake, "-S", src, "-B", build_dir] + args)
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
    _run([cmake, "--build", build_dir, "--target", "minference", "--parallel", jobs])
    lib = _built(build_dir, LIB_NAME)
    if lib is None:
        raise RuntimeError(f"minference: the build produced no {LIB_NAME} under {build_dir}")
    try:
        _run([cmake, "--build", build_dir, "--target", "minference_model_shared", "--parallel",
              jobs])
    except subprocess.CalledProcessError:
        print("minference build: the model runner (minference_model_shared) did not build; "
              "minference.Model will be unavailable", flush=True)
    return lib, _built(build_dir, MODEL_LIB_NAME)


class build_py(_build_py):
    """build_py that also builds (or points at) libminference."""

    def run(self):
        super().run()
        external = os.environ.get("MINFERENCE_LIBRARY")
        if getattr(self, "editable_mode", False):
            target = HERE / "minference" / "lib"
        else:
            target = Path(self.build_lib) / "minference" / "lib"
        target.mkdir(parents=True, exist_ok=True)
        for old in target.glob("libminference*"):
            old.unlink()
        marker = target / "external_library.txt"
        if marker.exists():
            marker.unlink()
        if external:
            path = Path(external).resolve()
            if not path.is_file():
                raise RuntimeError(f"minference: MINFERENCE_LIBRARY={external} is not a file")
            marker.write_text(str(path) + "\n")
            print(f"minference build: using the prebuilt library {path}", flush=True)
            return
        lib, model_lib = build_library(HERE / "build" / "cmake")
        shutil.copy2(lib, target / LIB_NAME)
        print(f"minference build: shipped {lib} as {target / LIB_NAME}", flush=True)
        if model_lib is not None:
            shutil.copy2(model_lib, target / MODEL_LIB_NAME)
            print(f"minference build: shipped {model_lib} as {target / MODEL_LIB_NAME}", flush=True)


class bdist_wheel(_bdist_wheel):
    """The wheel holds a native library (loaded with ctypes, so any CPython 3 can use it)."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(cmdclass={"build_py": build_py, "bdist_wheel": bdist_wheel})
