#!/usr/bin/env bash
# A/B of kernel variants in one GPU call on a small device budget: the timings first (the base
# path and each variant, shape by shape: bench/time_variants.py --shapes sparse, plus the
# whole-layer prefill at 1M), then the GPU tests all at once, since the GPU is no longer being
# timed: the full test on the default path and on each variant, the quick subset on each variant,
# and a compute-sanitizer memcheck of the quick subset on the default path (MEMCHECK_VARIANT=1:
# on the first variant). Everything stops at a common deadline, so that a slow step costs its own
# result and not the whole call.
#   bench/run_gpu_ab.sh NAME=TUNING ...   (TUNING: the library's tuning, name=value,... as
#   mi_tuning_parse reads it, e.g. ws=sm90_sparse=1)
# PREBUILT: a folder with libminference.so* and test_cuda built elsewhere with the same CUDA
# (test_cuda linked with rpath $ORIGIN); without it, or if it does not load, the library is built
# here. EXTRA_QUICK: more "NAME=TUNING" (space-separated) for the quick test only.
# DEADLINE: seconds for the whole script (default 150). LOGS: where logs and JSON go. SHAPES:
# time_variants.py's shape set (default sparse; all adds dense; dense alone). PREFILL: the length
# of the whole-layer prefill timing (default 1048576; 0: none).
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$SECONDS
DEADLINE=${DEADLINE:-150}
LOGS=${LOGS:-build-ab/logs}
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1
left() { local s=$((DEADLINE - (SECONDS - T0))); echo $((s > 1 ? s : 1)); }
source scripts/gpu_env.sh
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$CUDA_HOME/lib64

B=${PREBUILT:-}
if [ -z "$B" ] || ! [ -x "$B/test_cuda" ] || ldd "$B/test_cuda" | grep -q "not found"; then
  [ -n "$B" ] && { echo "prebuilt $B does not load here:"; ldd "$B/test_cuda" | grep "not found"; }
  B=build-ab
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DMI_WERROR=OFF -DMI_CUDA=ON -DMI_CUDA_ARCHS=90a \
    -DMI_BUILD_TESTS=OFF >"$B.cmake.log" 2>&1 || { tail -30 "$B.cmake.log"; exit 1; }
  cmake --build $B -j"$(nproc)" --target libminference.so >"$B.build.log" 2>&1 ||
    { grep -E "error" -A3 "$B.build.log" | head -40; exit 1; }
  bench/compile_test_cuda.sh $B $B/test_cuda >>"$B.build.log" 2>&1 ||
    { tail -20 "$B.build.log"; exit 1; }
fi
echo "library: $B ($((SECONDS - T0)) s)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader

args=(--variant base=)
for v in "$@"; do args+=(--variant "$v"); done
timeout "$(left)" python3 bench/time_variants.py --lib "$B/libminference.so" --shapes "${SHAPES:-sparse}" \
  --prefill "${PREFILL:-1048576}" --out "$LOGS/variants.json" "${args[@]}" >"$LOGS/timings.log" 2>&1
rc=$?
echo "timings rc=$rc ($((SECONDS - T0)) s)"
grep -v "^{" "$LOGS/timings.log"
if [ $rc != 0 ]; then # no table: the rows done so far, so that a stall shows where it happened
  grep "^{" "$LOGS/timings.log" | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l)
    print(r["variant"], r.get("set", r["kind"]), r["L"],
          r.get("kernel_ms_per_head", r.get("ours_ms_per_head", r.get("prefill_ms_per_head"))))'
fi

t() { # name, command... (in the background)
  local name=$1; shift
  env OMP_NUM_THREADS=3 timeout "$(left)" "$@" >"$LOGS/test_$name.log" 2>&1 &
}
t full_default $B/test_cuda
for v in "$@"; do
  name=${v%%=*}; tuning=${v#*=}
  t "full_$name" $B/test_cuda --tuning "$tuning"
  t "quick_$name" $B/test_cuda --quick --tuning "$tuning"
done
for v in ${EXTRA_QUICK:-}; do
  name=${v%%=*}; tuning=${v#*=}
  t "quick_$name" $B/test_cuda --quick --tuning "$tuning"
done
if [ "${MEMCHECK_VARIANT:-0}" = 1 ] && [ $# -gt 0 ]; then
  tuning=${1#*=}
  t "memcheck_${1%%=*}" compute-sanitizer --tool memcheck $B/test_cuda --quick --tuning "$tuning"
else
  t memcheck_default compute-sanitizer --tool memcheck $B/test_cuda --quick
fi
wait
echo "tests done ($((SECONDS - T0)) s)"
for f in "$LOGS"/test_*.log; do
  echo "$(basename "$f" .log): $(grep -E "passed|ERROR SUMMARY" "$f" | tr '\n' ' ')"
  grep FAIL "$f" | head -5
done
exit 0
