#!/usr/bin/env bash
# Nsight Compute profile of our sm_90a attention kernel on a GPU machine: one dense launch (32K,
# 32 heads) and one sparse launch (the first of the sparse section), with the
# sections that say what bounds a kernel (speed of light, tensor pipe, memory, warp stalls,
# occupancy). Reports go to $OUT (or build-prof/); a summary of the key metrics is printed.
# Nsight Compute locks the SM clock to base (1.36 GHz on an H200), so durations are longer than
# in the benchmark; ratios (issue slots, occupancy, throughputs) are what to read.
# The warp-stall breakdown (cycles per issued instruction, by reason) is printed as well.
#   bench/profile_attention.sh [NAME=TUNING ...]
# Each argument profiles the dense launch once more with that tuning of the library (name=value,...
# as mi_tuning_parse reads it: kernel variants).
# DENSE_KERNEL, SPARSE_KERNEL: the kernel names to profile (regex; default the library's picks).
# PREBUILT: a folder with libminference.so built elsewhere (skips the build).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
OUTDIR=${OUT:-build-prof}
mkdir -p "$OUTDIR"
LIB=${PREBUILT:-build-prof}/libminference.so
if [ -z "${PREBUILT:-}" ]; then
  cmake -S . -B build-prof -G Ninja -DCMAKE_BUILD_TYPE=Release -DMI_WERROR=OFF -DMI_CUDA=ON -DMI_CUDA_ARCHS=90a \
    -DMI_BUILD_TESTS=OFF >build-prof.cmake.log 2>&1 || { tail -20 build-prof.cmake.log; exit 1; }
  cmake --build build-prof -j"$(nproc)" --target libminference.so >build-prof.build.log 2>&1 ||
    { grep -E "error" -A3 build-prof.build.log | head -30; exit 1; }
fi
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
SECTIONS=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
          --section WarpStateStats --section Occupancy --section LaunchStats
          --section SchedulerStats
          --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio")
prof() { # name, kernel regex, skip, torch_ref sections, tuning (optional)
  timeout 300 "$NCU" --target-processes all -k "regex:$2" --launch-skip "$3" --launch-count 1 \
    "${SECTIONS[@]}" --csv --page details \
    python3 bench/torch_ref.py --lib "$LIB" --out "$OUTDIR/ref" --store "" --quick \
    --sections "$4" --tuning "${5:-}" >"$OUTDIR/ncu-$1.csv" 2>"$OUTDIR/ncu-$1.err"
  echo "== $1 (rc=$?)"
  python3 - "$OUTDIR/ncu-$1.csv" <<'PY'
import csv, sys
keep = ("Duration", "Compute (SM) Throughput", "Memory Throughput", "DRAM Throughput",
        "L2 Cache Throughput", "L1/TEX Cache Throughput", "Achieved Occupancy",
        "Registers Per Thread", "Dynamic Shared Memory Per Block", "Block Limit Shared Mem",
        "Executed Ipc Active", "Issue Slots Busy", "No Eligible", "Warp Cycles Per Issued Instruction",
        "Avg. Active Threads Per Warp", "smsp__average_warps_issue_stalled")
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
start = next((i for i, r in enumerate(rows) if "Metric Name" in r), None)
if start is None:
    print(open(sys.argv[1]).read()[-2000:])
    sys.exit()
rows = rows[start:]
hdr = rows[0]
iname, iunit, ival = hdr.index("Metric Name"), hdr.index("Metric Unit"), hdr.index("Metric Value")
for r in rows[1:]:
    if any(r[iname].startswith(k) for k in keep):
        name = r[iname].replace("smsp__average_warps_issue_stalled_", "stall ")
        name = name.replace("_per_issue_active.ratio", "")
        try:
            if name.startswith("stall ") and float(r[ival]) < 0.05:
                continue
        except ValueError:
            pass
        print(f"  {name:45s} {r[ival]:>14s} {r[iunit]}")
PY
  tail -3 "$OUTDIR/ncu-$1.err"
}
# the kernels the library picks for these launches (the dense one on the ring kernel:
# the tuning sm90_dense=-1 and attn_fwd_sm90_ring_kernel; the sparse one: the band-like `local`
# heads go to attn_sparse_sm90_kernel, sm90_sparse=-1 keeps them on the ring kernel)
prof dense "${DENSE_KERNEL:-attn_dense_sm90_kernel}" 3 dense
prof sparse_local "${SPARSE_KERNEL:-attn_sparse_sm90_kernel}" 3 sparse
for v in "$@"; do
  name=${v%%=*}; tuning=${v#*=}
  prof "dense_$name" attn_fwd_sm90 3 dense "$tuning"
done
