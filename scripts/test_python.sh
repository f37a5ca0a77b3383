#!/usr/bin/env bash
# Python binding tests on the CPU library that scripts/test.sh built in build/: a private
# virtual environment, the package installed against that library, then pytest.
# The transformers patch tests need torch and transformers; they are installed into that
# environment (pinned, about 4 minutes and 6 GB the first time: PyPI's torch wheel brings the
# CUDA libraries). MI_TEST_TRANSFORMERS=0 leaves them out, and those tests then skip; so does a
# disk with less than MI_TEST_TORCH_MIN_GB (default 10) free, with a message that says so.
# matplotlib (about 10 MB of wheels) is there so that scbench.plot's test draws a figure.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build}"
VENV="$BUILD_DIR/pyvenv"
TORCH_PINS="torch==2.15.0 transformers==5.24.0"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip numpy pytest matplotlib
want_torch="${MI_TEST_TRANSFORMERS:-1}"
if [ "$want_torch" != 0 ] && ! "$VENV/bin/python" -c "import torch, transformers" 2>/dev/null; then
    min_gb="${MI_TEST_TORCH_MIN_GB:-10}"
    free_gb=$(( $(df -Pk "$VENV" | awk 'NR == 2 { print $4 }') / 1048576 ))
    if [ "$free_gb" -lt "$min_gb" ]; then
        echo "test_python: WARNING: only $free_gb GB free where $VENV lives; torch needs about" \
            "6 GB (MI_TEST_TORCH_MIN_GB=$min_gb), so the transformers patch tests will skip"
        want_torch=0
    fi
fi
if [ "$want_torch" != 0 ]; then
    echo "test_python: installing $TORCH_PINS into $VENV (MI_TEST_TRANSFORMERS=0 skips)"
    # No wheel cache: the CUDA wheels would take as much space again.
    # shellcheck disable=SC2086
    "$VENV/bin/python" -m pip install -q --no-cache-dir $TORCH_PINS
fi
MINFERENCE_LIBRARY="$PWD/$BUILD_DIR/libminference.so" "$VENV/bin/python" -m pip install -q ./python
MINFERENCE_LIBRARY="$PWD/$BUILD_DIR/libminference.so" "$VENV/bin/python" -m pytest -q python/tests
