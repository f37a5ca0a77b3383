#!/usr/bin/env bash
# Downloads the Debian packages the library needs (jansson, OpenBLAS, pkg-config's library) into
# .gpudeps/, for GPU machines that cannot reach a package mirror. There,
# scripts/gpu_env.sh unpacks them. .gpudeps/ is ignored by git.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpudeps
cd .gpudeps
apt-get download libjansson4 libjansson-dev libopenblas0-pthread libopenblas-pthread-dev \
    libopenblas-dev libgfortran5 libpkgconf3 pkgconf pkgconf-bin 2>/dev/null ||
    apt-get download libjansson4 libjansson-dev libopenblas0-pthread libopenblas-pthread-dev \
        libopenblas-dev libgfortran5 libpkgconf3
ls
