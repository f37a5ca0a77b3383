"""PEP 517 backend for the minference package: setuptools, plus CMake from PyPI on demand.

libminference is built by setup.py with CMake. A build machine that has CMake >= 3.24 on PATH
uses it; one that has none (or an older one) gets the `cmake` package from PyPI as a build
requirement. A build that uses a prebuilt library (MINFERENCE_LIBRARY) needs no CMake at all.
"""

import os
import re
import shutil
import subprocess

from setuptools import build_meta as _orig
from setuptools.build_meta import *  # noqa: F401,F403  (re-exports the hooks we do not override)

_MIN_CMAKE = (3, 24)


def _system_cmake_ok():
    exe = shutil.which("cmake")
    if not exe:
        return False
    try:
        text = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    m = re.search(r"version\s+(\d+)\.(\d+)", text)
    return bool(m) and (int(m.group(1)), int(m.group(2))) >= _MIN_CMAKE


def _extra_requires():
    if os.environ.get("MINFERENCE_LIBRARY"):
        return []
    return [] if _system_cmake_ok() else ["cmake>=3.24"]


def get_requires_for_build_wheel(config_settings=None):
    return _orig.get_requires_for_build_wheel(config_settings) + _extra_requires()


def get_requires_for_build_editable(config_settings=None):
    return _orig.get_requires_for_build_editable(config_settings) + _extra_requires()
