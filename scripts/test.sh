#!/usr/bin/env bash
# Runs every test that needs no GPU: the C test suite (ctest) and the Python binding tests.
#   scripts/test.sh             Release build in build/
#   scripts/test.sh --sanitize  ASan + UBSan build in build-asan/ (C tests only)
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:-release}"
if [ "$mode" = "--sanitize" ]; then
    BUILD_DIR=build-asan
    cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMI_SANITIZE=ON -DMI_CUDA=OFF \
        >/dev/null
else
    BUILD_DIR=build
    scripts/setup.sh
fi
cmake --build "$BUILD_DIR" -j"$(nproc)"

# OpenMP's runtime keeps thread pools alive at exit, which LeakSanitizer would report.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
exclude=()
if [ "$mode" = "--sanitize" ]; then
    # The end-to-end model runs take minutes even optimised; their code paths are exercised
    # under the sanitizers by the smaller model tests.
    exclude=(-E "model\.passkey|eval\.e2e|eval\.scbench_e2e")
fi
ctest --test-dir "$BUILD_DIR" --output-on-failure -LE gpu "${exclude[@]}" -j"$(nproc)"

if [ "$mode" != "--sanitize" ] && [ -f python/pyproject.toml ] && [ -d python/tests ]; then
    if [ -x scripts/test_python.sh ]; then
        scripts/test_python.sh
    fi
fi
