#!/bin/sh
# The SCBench method matrix on the demo model (docs/scbench.md, "Results"): RepoQA at the
# task's own new-token limit, then every prefill pattern x KV method on the retrieval, many-shot
# and summary tasks, both modes. Usage: bench/scbench_matrix.sh OUT_DIR [LENGTH]
# $MINFERENCE (default build/minference) is the tool; results go to OUT_DIR (json, png, log).
set -eu
out=${1:?usage: scbench_matrix.sh OUT_DIR [LENGTH]}
len=${2:-4096}
exe=${MINFERENCE:-build/minference}
mkdir -p "$out"
# budgets about 19 % of the context where a method has one (the defaults are sized for 128K)
b=$((len * 3 / 16))
"$exe" scbench --length "$len" --turns 2 --tasks scbench_repoqa --mode both \
    --attn dense --kv dense --seed 1 --save-data "$out" \
    --json "$out/repoqa.json" >"$out/repoqa.txt" 2>"$out/repoqa.log"
"$exe" scbench --length "$len" --turns 3 --seed 1 --mode both \
    --tasks scbench_kv,scbench_many_shot,scbench_summary_with_needles \
    --attn "dense,vs:$((b / 6)):$b,a_shape:64:$b,tri_shape:64:$b:64" \
    --kv "dense;streamingllm:n_init=64,n_local=$((b - 64));snapkv:max_capacity_prompt=$b;quest:token_budget=$b;kivi:bits=2" \
    --save-data "$out" --json "$out/matrix.json" --png "$out/matrix.png" \
    --curves "$out/matrix_turns.png" >"$out/matrix.txt" 2>"$out/matrix.log"
