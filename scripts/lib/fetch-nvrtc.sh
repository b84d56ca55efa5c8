#!/usr/bin/env bash
# Installs NVRTC (CUDA 13, libnvrtc.so.13) from PyPI's `nvidia-cuda-nvrtc`
# into a git-ignored venv under .cache/, so that the NVRTC compile test
# (kernels/tests/cuda_compile.rs) can run on a machine without a CUDA
# toolkit. Prints the directory holding libnvrtc.so* as its last line;
# callers put it on LD_LIBRARY_PATH (cudarc dlopens `libnvrtc.so` /
# `libnvrtc.so.13` through the dynamic linker's search path).
#
#   export LD_LIBRARY_PATH="$(scripts/lib/fetch-nvrtc.sh)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
#
# Env: NVRTC_VERSION (pip specifier, default 13.0.*: the CUDA 13.0 that the
# GPU machine's driver runs, so PTX it emits loads there too).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="$root/.cache/venv-nvrtc"
version="${NVRTC_VERSION:-13.0.*}"

find_lib() {
    find "$venv" -name 'libnvrtc.so*' ! -name '*builtins*' -print 2>/dev/null | head -n1 || true
}

lib="$(find_lib)"
if [[ -z "$lib" ]]; then
    mkdir -p "$root/.cache"
    python3 -m venv "$venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        "nvidia-cuda-nvrtc==$version" >&2
    lib="$(find_lib)"
fi
if [[ -z "$lib" ]]; then
    echo "fetch-nvrtc: nvidia-cuda-nvrtc installed but no libnvrtc.so* under $venv" >&2
    exit 1
fi
dir="$(dirname "$lib")"
# cudarc tries `libnvrtc.so` first and then `libnvrtc.so.13`; the wheel
# ships only the versioned name, which is enough.
echo "$dir"
