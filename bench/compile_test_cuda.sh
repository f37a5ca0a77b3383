#!/usr/bin/env bash
# Compiles the GPU test program (tests/cuda/test_cuda.c) against an already built
# libminference.so, for the GPU scripts that build the library alone (without CMake's test
# directories, which a GPU run does not need). The program finds the library through its rpath:
# the library's folder, as an absolute path and relative to the program.
#   bench/compile_test_cuda.sh LIBDIR OUT
# The test includes src/cuda/dense_fallback.h, the rule it checks the library's fallback against.
set -euo pipefail
cd "$(dirname "$0")/.."
LIBDIR=$1 OUT=$2
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
mkdir -p "$(dirname "$OUT")"
rel=$(realpath --relative-to="$(dirname "$OUT")" "$LIBDIR")
cc -O2 -std=c11 -Wall -Wextra -Iinclude -Isrc/cuda -I"$CUDA_HOME/include" \
  tests/cuda/test_cuda.c -o "$OUT" -L"$LIBDIR" -lminference -L"$CUDA_HOME/lib64" -lcudart -lm \
  -Wl,-rpath,"$(realpath "$LIBDIR")" -Wl,-rpath,"\$ORIGIN/$rel"
