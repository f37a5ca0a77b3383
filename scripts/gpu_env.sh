#!/usr/bin/env bash
# Sourced by the GPU scripts: makes the build dependencies available on a machine without a
# package mirror by unpacking the .deb files of .gpudeps/ (see scripts/fetch_gpu_deps.sh).
if ! pkg-config --exists jansson 2>/dev/null || [ ! -e /usr/include/jansson.h ]; then
    if ls .gpudeps/*.deb >/dev/null 2>&1; then
        for f in .gpudeps/*.deb; do dpkg -x "$f" /; done
        ldconfig
        # Debian's openblas registers itself through alternatives, which dpkg -x does not run.
        for d in /usr/lib/x86_64-linux-gnu/openblas-pthread; do
            [ -e /usr/lib/x86_64-linux-gnu/libopenblas.so ] || \
                ln -sf "$d/libopenblas.so" /usr/lib/x86_64-linux-gnu/libopenblas.so
            [ -e /usr/lib/x86_64-linux-gnu/libopenblas.so.0 ] || \
                ln -sf "$d/libopenblas.so.0" /usr/lib/x86_64-linux-gnu/libopenblas.so.0
        done
        ldconfig
    else
        echo "gpu_env: jansson is missing; run scripts/fetch_gpu_deps.sh on a machine with a" \
            "package mirror and carry .gpudeps/" >&2
    fi
fi
