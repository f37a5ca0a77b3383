#!/usr/bin/env bash
# Makes cuobjdump (and the nvdisasm it runs) available for the SASS check of the CUDA build
# (tests/cuda/check_sass.py), and prints the folder that holds it on the last line of stdout.
# The CUDA toolkit's own copy wins; a toolkit installed without it (nvcc alone, as on the CI
# machine) gets NVIDIA's PyPI wheels of both tools, whose programs end up in .tools/cuda/bin/
# (ignored by git; tests/cuda/CMakeLists.txt looks there). Exits 1, printing nothing, when
# neither is possible: the check then reports itself skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

dirs=("${CUDA_HOME:-/usr/local/cuda}/bin")
if command -v nvcc >/dev/null; then dirs+=("$(dirname "$(command -v nvcc)")"); fi
for d in "${dirs[@]}"; do
    if [[ -x "$d/cuobjdump" && -x "$d/nvdisasm" ]]; then
        echo "$d"
        exit 0
    fi
done

DEST=.tools/cuda
BIN=$DEST/bin
if [[ ! -x "$BIN/cuobjdump" || ! -x "$BIN/nvdisasm" ]]; then
    rm -rf "$DEST"
    mkdir -p "$DEST/wheels" "$BIN"
    # The 13.x tools read what CUDA 13.0's nvcc writes; the wheels hold nothing but the two
    # programs and their licence, under a folder named for the CUDA major version.
    python3 -m pip download --quiet --no-deps --dest "$DEST/wheels" \
        "nvidia-cuda-cuobjdump>=13,<14" "nvidia-cuda-nvdisasm>=13,<14" >&2 || exit 1
    python3 - "$DEST" <<'PY'
import glob, os, shutil, sys, zipfile
dest = sys.argv[1]
for wheel in glob.glob(os.path.join(dest, "wheels", "*.whl")):
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if os.path.basename(name) in ("cuobjdump", "nvdisasm") and "/bin/" in name:
                with z.open(name) as src, open(os.path.join(dest, "bin", os.path.basename(name)),
                                               "wb") as out:
                    shutil.copyfileobj(src, out)
PY
    chmod +x "$BIN/cuobjdump" "$BIN/nvdisasm" 2>/dev/null || exit 1
fi
echo "$(cd "$BIN" && pwd)"
