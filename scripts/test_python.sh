#!/usr/bin/env bash
# Python binding tests on the CPU library that scripts/test.sh built in build/: a private
# virtual environment, the package installed against that library, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build}"
VENV="$BUILD_DIR/pyvenv"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip numpy pytest
MINFERENCE_LIBRARY="$PWD/$BUILD_DIR/libminference.so" "$VENV/bin/python" -m pip install -q ./python
MINFERENCE_LIBRARY="$PWD/$BUILD_DIR/libminference.so" "$VENV/bin/python" -m pytest -q python/tests
