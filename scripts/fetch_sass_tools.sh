#!/usr/bin/env bash
# Makes cuobjdump (and the nvdisasm it runs) available for the SASS check of the CUDA build
# (tests/cuda/check_sass.py), and prints the folder that holds it on the last line of stdout.
# The CUDA toolkit's own copy wins; a toolkit installed without it (nvcc alone, as on the CI
# machine) gets NVIDIA's PyPI wheels of both tools, unpacked into .tools/cuda/ (ignored by git).
# Exits 1, printing nothing, when neither is possible: the check then reports itself skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

nvcc_dir=$(dirname "$(command -v nvcc 2>/dev/null || echo .)")
for d in "${CUDA_HOME:-/usr/local/cuda}/bin" "$nvcc_dir"; do
    if [[ -x "$d/cuobjdump" && -x "$d/nvdisasm" ]]; then
        echo "$d"
        exit 0
    fi
done

DEST=.tools/cuda
BIN=$DEST/nvidia/cu13/bin
if [[ ! -x "$BIN/cuobjdump" || ! -x "$BIN/nvdisasm" ]]; then
    rm -rf "$DEST"
    mkdir -p "$DEST/wheels"
    # The 13.x tools read what CUDA 13.0's nvcc writes; the wheels hold nothing but the two
    # programs and their licence.
    python3 -m pip download --quiet --no-deps --dest "$DEST/wheels" \
        "nvidia-cuda-cuobjdump>=13,<14" "nvidia-cuda-nvdisasm>=13,<14" >&2 || exit 1
    python3 - "$DEST" <<'PY'
import glob, os, sys, zipfile
dest = sys.argv[1]
for wheel in glob.glob(os.path.join(dest, "wheels", "*.whl")):
    with zipfile.ZipFile(wheel) as z:
        z.extractall(dest)
PY
    chmod +x "$BIN/cuobjdump" "$BIN/nvdisasm" 2>/dev/null || exit 1
fi
echo "$(cd "$BIN" && pwd)"
