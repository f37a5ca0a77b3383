#!/usr/bin/env bash
# Builds the library with CUDA, runs the GPU tests, then the attention benchmark against PyTorch
# SDPA. Its rows are appended to the results store $STORE (default bench/results.jsonl; render
# the tables with scripts/results.py render); the run's JSON and plot land in $RESULTS (default
# $LOGS/bench), logs in $LOGS.
#   bench/run_gpu_bench.sh [--quick] [--no-test] [--sections dense,sparse,patterns,estimation,crossover]
set -uo pipefail
cd "$(dirname "$0")/.."
QUICK=""; TEST=1; SECTIONS="dense,sparse,patterns,estimation,crossover"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK="--quick" ;;
    --no-test) TEST=0 ;;
    --sections) SECTIONS="$2"; shift ;;
  esac
  shift
done
LOGS=${LOGS:-build}
RESULTS=${RESULTS:-$LOGS/bench}
STORE=${STORE:-bench/results.jsonl}
mkdir -p "$RESULTS" "$LOGS"
export PYTHONUNBUFFERED=1
source scripts/gpu_env.sh  # build dependencies on machines without a package mirror

# Only the library is built through CMake (the other test directories are not needed here); the
# GPU test is one C file linked against it.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMI_WERROR=OFF -DMI_CUDA=ON -DMI_BUILD_TESTS=OFF \
  >"$LOGS/cmake.log" 2>&1 || { tail -30 "$LOGS/cmake.log"; exit 1; }
cmake --build build -j"$(nproc)" --target libminference.so >"$LOGS/build.log" 2>&1 ||
  { grep -E "error|Error" -A3 "$LOGS/build.log" | head -60; exit 1; }
bench/compile_test_cuda.sh build build/tests/cuda/test_cuda >>"$LOGS/build.log" 2>&1 ||
  { tail -20 "$LOGS/build.log"; exit 1; }
grep -E "spill|warning" "$LOGS/build.log" | grep -v " 0 bytes spill" | head -20
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader

# Tensor-core instructions in the kernels (HMMA: mma.sync; HGMMA: wgmma)
for f in attn_fwd attn_fwd_sm90 attn_dense_sm90 attn_sparse_sm90 bs_estimate; do
  obj=$(find build -name "$f.cu.o" | head -1)
  [ -n "$obj" ] || continue
  cuobjdump -sass "$obj" > "$LOGS/$f.sass" 2>/dev/null
  echo "$f SASS: HMMA $(grep -c HMMA "$LOGS/$f.sass") HGMMA $(grep -c HGMMA "$LOGS/$f.sass")"
done

if [ "$TEST" = 1 ]; then
  # every kernel path on a Hopper GPU: wgmma (default: sparse heads routed per head), every
  # sparse head on the warp-specialised kernel, every one on the ring kernel, the ring kernel for
  # A-/Tri-shape heads and for dense launches, and the portable mma.sync one
  for path in sm90 sm90_ws_sparse sm90_ring_sparse sm90_ring_a_shape sm90_ring_dense sm80; do
    tuning=""
    case "$path" in
      sm90_ws_sparse) tuning=sm90_sparse=1 ;;
      sm90_ring_sparse) tuning=sm90_sparse=-1 ;;
      sm90_ring_a_shape) tuning=sm90_a_shape=-1 ;;
      sm90_ring_dense) tuning=sm90_dense=-1 ;;
      sm80) tuning=sm90=-1 ;;
    esac
    timeout 900 build/tests/cuda/test_cuda $QUICK --tuning "$tuning" \
      > "$LOGS/test_cuda_$path.log" 2>&1
    echo "test_cuda ($path) rc=$? : $(tail -1 "$LOGS/test_cuda_$path.log")"
    grep FAIL "$LOGS/test_cuda_$path.log" | head -20
  done
fi

timeout 1500 python3 bench/torch_ref.py --lib build/libminference.so --out "$RESULTS" \
  --store "$STORE" $QUICK --sections "$SECTIONS" 2>&1 | tee "$LOGS/bench.log" | grep -v "^dense {\|^sparse {\|^patterns {\|^estimation {\|^crossover {"
