#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang with ASan + UBSan) into build-fuzz/ and runs each
# for a while over its seed corpus.
#   scripts/fuzz.sh                      every target, 60 s each
#   scripts/fuzz.sh -t 600 fuzz_gguf     one target, 10 minutes
#   scripts/fuzz.sh -j 4 -t 3600         four jobs per target (long runs; see docs/fuzzing.md)
#   scripts/fuzz.sh --merge              also fold inputs that add coverage into fuzz/corpus/
#   scripts/fuzz.sh -t 0                 only builds
# Inputs found on the way go to build-fuzz/corpus/<target>/ (the checked-in seeds stay as they
# are); a crash, timeout or OOM leaves its input in build-fuzz/findings/<target>/ and makes the
# script exit 1 after the other targets have run.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=60
jobs=1
merge=0
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
    -t) secs="$2"; shift 2 ;;
    -j) jobs="$2"; shift 2 ;;
    --merge) merge=1; shift ;;
    -h | --help) sed -n '2,12p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
    esac
done
all=(fuzz_gguf fuzz_hf fuzz_tokenizer_json fuzz_config fuzz_tokenize fuzz_kv_session fuzz_leank_mask)
[ ${#targets[@]} -eq 0 ] && targets=("${all[@]}")

BUILD_DIR="${BUILD_DIR:-build-fuzz}"
cc="${CC:-}"
if [ -z "$cc" ]; then
    for c in clang clang-19 clang-16 clang-15 clang-14; do
        if command -v "$c" >/dev/null; then cc="$c"; break; fi
    done
fi
[ -n "$cc" ] || { echo "fuzz: clang is needed (apt-get install clang libomp-dev)" >&2; exit 2; }
CC="$cc" cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMI_FUZZ=ON \
    -DMI_CUDA=OFF -DMI_BUILD_TESTS=OFF >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target "${targets[@]}"
[ "$secs" -gt 0 ] || exit 0

dict_for() {
    case "$1" in
    fuzz_gguf) echo fuzz/dict/gguf.dict ;;
    fuzz_hf) cat fuzz/dict/hf.dict fuzz/dict/tokenizer_json.dict >"$BUILD_DIR/hf_all.dict"
        echo "$BUILD_DIR/hf_all.dict" ;;
    fuzz_tokenizer_json | fuzz_tokenize) echo fuzz/dict/tokenizer_json.dict ;;
    fuzz_config) echo fuzz/dict/config.dict ;;
    fuzz_kv_session) echo fuzz/dict/kv_session.dict ;;
    fuzz_leank_mask) echo fuzz/dict/leank_mask.dict ;;
    esac
}

# Leaks are findings too; UBSan stops at the first report so that libFuzzer saves the input.
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export OMP_NUM_THREADS=1

failed=()
summary=()
for t in "${targets[@]}"; do
    corpus="$BUILD_DIR/corpus/$t"
    findings="$BUILD_DIR/findings/$t"
    mkdir -p "$corpus" "$findings"
    seeds="fuzz/corpus/$t"
    [ -d "$seeds" ] || seeds="$corpus"
    dict=$(dict_for "$t")
    args=(-max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048
          -artifact_prefix="$findings/" -print_final_stats=1)
    [ -n "$dict" ] && args+=(-dict="$dict")
    [ "$jobs" -gt 1 ] && args+=(-fork="$jobs" -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
    log="$BUILD_DIR/$t.log"
    echo "fuzz: $t for ${secs} s" >&2
    rc=0
    "$BUILD_DIR/fuzz/$t" "${args[@]}" "$corpus" "$seeds" >"$log" 2>&1 || rc=$?
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || true)
    cov=$(grep -oE '(INITED|DONE|pulse|NEW|REDUCE).* cov: [0-9]+' "$log" | tail -1 |
        grep -oE 'cov: [0-9]+' | grep -oE '[0-9]+' || true)
    ft=$(grep -oE ' ft: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || true)
    found=$(find "$findings" -type f | wc -l)
    summary+=("$(printf '%-22s rc %-3s execs %-9s cov %-6s ft %-6s corpus %-5s findings %s' "$t" \
        "$rc" "${execs:-?}" "${cov:-?}" "${ft:-?}" "$(find "$corpus" -type f | wc -l)" "$found")")
    if [ "$rc" -ne 0 ] || [ "$found" -gt 0 ]; then
        failed+=("$t")
        tail -n 40 "$log" >&2
    fi
    if [ "$merge" -eq 1 ] && [ -d "fuzz/corpus/$t" ]; then
        "$BUILD_DIR/fuzz/$t" -merge=1 "fuzz/corpus/$t" "$corpus" >>"$log" 2>&1 || true
    fi
done
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: findings in ${failed[*]} (inputs in $BUILD_DIR/findings/, logs $BUILD_DIR/*.log)" >&2
    exit 1
fi
