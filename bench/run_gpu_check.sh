#!/usr/bin/env bash
# Kernel work on a GPU machine in one call, most important first: builds the library for sm_90a
# only, runs the GPU tests (full on the default path and with the warp-specialised sparse kernel,
# the quick subset on the sm_80 path, with the ring kernel for dense launches and on each
# variant), a compute-sanitizer memcheck of the quick subset, optionally the dense and sparse
# benchmark against SDPA (bench/torch_ref.py: its JSON, PNG and rows, results.jsonl, into $LOGS;
# scripts/results.py append adds the rows to the store), then times the variants
# (bench/time_variants.py).
#   bench/run_gpu_check.sh [--no-memcheck] [--bench] [--variant NAME=TUNING ...]
# (TUNING: the library's tuning, name=value,... as mi_tuning_parse reads it, e.g.
# ws=sm90_sparse=1,sm90_tma_store=-1)
# Logs and the timings JSON go to $LOGS (default build-gpu/logs); TEST_TIMEOUT (s) bounds each
# test run, so that a hung kernel does not eat the whole call.
set -uo pipefail
cd "$(dirname "$0")/.."
MEMCHECK=1; BENCH=0; VARIANTS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-memcheck) MEMCHECK=0 ;;
    --bench) BENCH=1 ;;
    --variant) VARIANTS+=("$2"); shift ;;
  esac
  shift
done
BUILD=${BUILD:-build-gpu}
LOGS=${LOGS:-$BUILD/logs}
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1
source scripts/gpu_env.sh
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMI_WERROR=OFF -DMI_CUDA=ON -DMI_CUDA_ARCHS=90a \
  -DMI_BUILD_TESTS=OFF >"$BUILD.cmake.log" 2>&1 || { tail -30 "$BUILD.cmake.log"; exit 1; }
cmake --build "$BUILD" -j"$(nproc)" --target libminference.so >"$BUILD.build.log" 2>&1 ||
  { grep -E "error" -A3 "$BUILD.build.log" | head -40; exit 1; }
bench/compile_test_cuda.sh "$BUILD" "$BUILD/test_cuda" >>"$BUILD.build.log" 2>&1 ||
  { tail -20 "$BUILD.build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader

t() { # name, tuning ("" for the defaults), test args...
  local name=$1 tuning=$2; shift 2
  timeout "${TEST_TIMEOUT:-600}" "$BUILD/test_cuda" --tuning "$tuning" "$@" \
    >"$LOGS/test_$name.log" 2>&1
  local rc=$?
  echo "test_cuda $name rc=$rc : $(tail -1 "$LOGS/test_$name.log")"
  grep FAIL "$LOGS/test_$name.log" | head -10
  return $rc
}
t sm90 ""
# a hung kernel (timeout) would hang every later step as well
[ $? = 124 ] && { echo "default path timed out: stopping"; exit 1; }
t sm80quick sm90=-1 --quick
# the sm_90a kernels forced: the warp-specialised sparse one for every sparse head, the ring
# kernel for every sparse head, for A-shape heads, and for dense heads
t ws_sparse sm90_sparse=1
# its other paths: gathered column tiles, items merged inline (longer than the plan), and output
# rows stored from each thread (where O cannot be addressed by TMA)
t ws_gather_quick sm90_sparse=1,sm90_column_copies=-1 --quick
t ws_inline_quick sm90_sparse=1,sm90_plan_tiles=3 --quick
t ws_thread_stores_quick sm90_sparse=1,sm90_tma_store=-1 --quick
t ring_sparse_quick sm90_sparse=-1 --quick
t ring_a_shape_quick sm90_a_shape=-1 --quick
t ring_dense_quick sm90_dense=-1 --quick
# dilated and strided heads in two passes where that walks fewer tiles
t rowmask_two_pass_quick rowmask_two_pass=1 --quick
for v in "${VARIANTS[@]}"; do
  name=${v%%=*}; tuning=${v#*=}
  [ -n "$tuning" ] && [ "$tuning" != "$v" ] && t "${name}quick" "$tuning" --quick
done
if [ "$MEMCHECK" = 1 ]; then
  timeout "$((3 * ${TEST_TIMEOUT:-300}))" compute-sanitizer --tool memcheck "$BUILD/test_cuda" --quick \
    >"$LOGS/memcheck-quick.log" 2>&1
  echo "memcheck rc=$? : $(grep -E "passed|ERROR SUMMARY" "$LOGS/memcheck-quick.log" | tr '\n' ' ')"
fi
if [ "$BENCH" = 1 ]; then
  timeout 900 python3 bench/torch_ref.py --lib "$BUILD/libminference.so" --out "$LOGS" \
    --store "$LOGS/results.jsonl" --sections dense,sparse 2>&1 | grep -v "^dense {\|^sparse {"
fi
args=(); for v in "${VARIANTS[@]}"; do args+=(--variant "$v"); done
[ ${#args[@]} -gt 0 ] && timeout 900 python3 bench/time_variants.py --lib "$BUILD/libminference.so" \
  --out "$LOGS/variants.json" ${VARIANT_SHAPES:+--shapes "$VARIANT_SHAPES"} "${args[@]}" 2>&1
exit 0
