#!/usr/bin/env bash
# On a GPU machine: builds libminference with CUDA and runs the Python GPU tests (kernels on CUDA
# tensors against the CPU library; the transformers patch on small random Llama and Qwen2 models).
#   bench/run_gpu_python.sh            (carry .gpudeps/ where no package mirror is reachable)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
BUILD_DIR=${BUILD_DIR:-build-gpu}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMI_WERROR=OFF -DMI_CUDA=ON -DMI_BUILD_TESTS=OFF \
    -DMI_CUDA_ARCHS="${MI_CUDA_ARCHS:-90a;80}" >"$BUILD_DIR.cmake.log" 2>&1 ||
    { tail -30 "$BUILD_DIR.cmake.log"; exit 1; }
cmake --build "$BUILD_DIR" -j"$(nproc)" --target libminference.so >"$BUILD_DIR.build.log" 2>&1 ||
    { grep -E "error" -A3 "$BUILD_DIR.build.log" | head -40; exit 1; }
export MINFERENCE_LIBRARY="$PWD/$BUILD_DIR/libminference.so"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
python3 -m pytest python/tests/gpu -q -s -p no:cacheprovider "$@"
