#!/usr/bin/env bash
# Builds the library with CUDA, runs the GPU tests, then the attention benchmark against PyTorch
# SDPA. Results (JSON + PNG) land in $RESULTS (default bench/results); logs in $LOGS.
#   bench/run_gpu_bench.sh [--quick] [--no-test] [--sections dense,sparse,estimation,crossover]
set -uo pipefail
cd "$(dirname "$0")/.."
QUICK=""; TEST=1; SECTIONS="dense,sparse,estimation,crossover"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK="--quick" ;;
    --no-test) TEST=0 ;;
    --sections) SECTIONS="$2"; shift ;;
  esac
  shift
done
RESULTS=${RESULTS:-bench/results}
LOGS=${LOGS:-build}
mkdir -p "$RESULTS" "$LOGS"
export PYTHONUNBUFFERED=1

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMI_CUDA=ON >"$LOGS/cmake.log" 2>&1 ||
  { tail -30 "$LOGS/cmake.log"; exit 1; }
cmake --build build -j"$(nproc)" --target minference test_cuda >"$LOGS/build.log" 2>&1 || { grep -E "error|Error" -A3 "$LOGS/build.log" | head -60; exit 1; }
grep -E "spill|warning" "$LOGS/build.log" | grep -v " 0 bytes spill" | head -20
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader

# Tensor-core instructions in the kernels (HMMA: mma.sync; HGMMA: wgmma)
obj=$(find build -name "attn_fwd.cu.o" | head -1)
if [ -n "$obj" ]; then
  cuobjdump -sass "$obj" > "$LOGS/attn_fwd.sass" 2>/dev/null
  echo "attn_fwd SASS: HMMA $(grep -c HMMA "$LOGS/attn_fwd.sass") HGMMA $(grep -c HGMMA "$LOGS/attn_fwd.sass")"
fi

if [ "$TEST" = 1 ]; then
  timeout 900 build/tests/cuda/test_cuda $QUICK > "$LOGS/test_cuda.log" 2>&1
  echo "test_cuda rc=$? : $(tail -1 "$LOGS/test_cuda.log")"
  grep FAIL "$LOGS/test_cuda.log" | head -30
fi

timeout 1500 python3 bench/torch_ref.py --lib build/libminference.so --out "$RESULTS" $QUICK \
  --sections "$SECTIONS" 2>&1 | tee "$LOGS/bench.log" | grep -v "^dense {\|^sparse {\|^estimation {\|^crossover {"
