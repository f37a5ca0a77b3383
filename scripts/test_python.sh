#!/usr/bin/env bash
# Python binding tests on the CPU library that scripts/test.sh built in build/: a private
# virtual environment, the package installed against that library, then pytest.
# The transformers patch tests need torch and transformers; they are installed into that
# environment (pinned, about 4 minutes and 6 GB the first time: PyPI's torch wheel brings the
# CUDA libraries). MI_TEST_TRANSFORMERS=0 leaves them out, and those tests then skip.
# matplotlib (about 10 MB of wheels) is there so that scbench.plot's test draws a figure.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build}"
VENV="$BUILD_DIR/pyvenv"
TORCH_PINS="torch==2.15.0 transformers==5.24.0"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip numpy pytest matplotlib
if [ "${MI_TEST_TRANSFORMERS:-1}" != 0 ]; then
    echo "test_python: installing $TORCH_PINS into $VENV (MI_TEST_TRANSFORMERS=0 skips)"
    # shellcheck disable=SC2086
    "$VENV/bin/python" -m pip install -q $TORCH_PINS
fi
MINFERENCE_LIBRARY="$PWD/$BUILD_DIR/libminference.so" "$VENV/bin/python" -m pip install -q ./python
MINFERENCE_LIBRARY="$PWD/$BUILD_DIR/libminference.so" "$VENV/bin/python" -m pytest -q python/tests
