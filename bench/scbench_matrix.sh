#!/bin/sh
# The SCBench method matrix on the demo model (docs/scbench.md, "Results"), both modes:
#   1. RepoQA at the task's own new-token limit (1024), dense;
#   2. dense prefill x seven KV methods on the retrieval, many-shot and summary tasks;
#   3. the sparse prefill patterns x {dense KV, SnapKV} on the same data (the budgeted ones at
#      about 19 % of the context, XAttention and FlexPrefill at their defaults);
# then one merged results file, its tables and its figure.
# Usage: bench/scbench_matrix.sh OUT_DIR [LENGTH]
# $MINFERENCE (default build/minference) is the tool, $PYTHON (default python3) a Python with the
# minference package (and matplotlib for the figure). Everything goes to OUT_DIR.
set -eu
out=${1:?usage: scbench_matrix.sh OUT_DIR [LENGTH]}
len=${2:-4096}
exe=${MINFERENCE:-build/minference}
py=${PYTHON:-python3}
mkdir -p "$out"
# budgets about 19 % of the context where a method has one (the defaults are sized for 128K)
b=$((len * 3 / 16))
tasks=scbench_kv,scbench_many_shot,scbench_summary_with_needles
"$exe" scbench --length "$len" --turns 2 --tasks scbench_repoqa --mode both \
    --attn dense --kv dense --seed 1 --save-data "$out" \
    --json "$out/repoqa.json" >"$out/repoqa.txt" 2>"$out/repoqa.log"
"$exe" scbench --length "$len" --turns 3 --seed 1 --mode both --tasks "$tasks" --attn dense \
    --kv "dense;streamingllm:n_init=64,n_local=$((b - 64));snapkv:max_capacity_prompt=$b;quest:token_budget=$b;pyramidkv:max_capacity_prompt=$b;retr_attn:top_k=$b;kivi:bits=2" \
    --save-data "$out" --json "$out/kv.json" >"$out/kv.txt" 2>"$out/kv.log"
"$exe" scbench --length "$len" --turns 3 --seed 1 --mode both --tasks "$tasks" \
    --attn "vs:$((b / 6)):$b,a_shape:64:$b,tri_shape:64:$b:64,xattention,flexprefill" \
    --kv "dense;snapkv:max_capacity_prompt=$b" \
    --json "$out/sparse.json" >"$out/sparse.txt" 2>"$out/sparse.log"
"$py" -m minference.scbench merge "$out/kv.json" "$out/sparse.json" --out "$out/matrix.json"
"$py" -m minference.scbench table "$out/matrix.json" --turns >"$out/matrix.md"
"$py" -m minference.scbench plot "$out/matrix.json" "$out/matrix.png" ||
    echo "scbench_matrix: no figure (matplotlib missing?)" >&2
