#!/usr/bin/env bash
# Stage timings of the fused CUDA decoder layer (kernels/cuda/decode_layer.cu)
# on an sm_90+ GPU with the CUDA toolkit (nvcc): builds
# bench/cuda/decode_layer_phases.cu against the kernel sources and runs it
# at a few positions. Prints, per position, the time per launch and a
# table of the stage marks. DL_DEFS passes kernel defines (for example
# "-DDL_THREADS=512 -DDL_GU=3") to compare shapes of the kernel.
#
#   scripts/device/decode-layer-phases.sh [POSITION ...]   # default 16 600
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
nvcc="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cat "$root"/kernels/cuda/{common.cuh,quant.cuh,decode_layer.cu} >"$work/sources.cu"
# shellcheck disable=SC2086 # DL_DEFS is a list of flags
"$nvcc" -arch="sm_${CUDA_ARCH:-90}" -O3 ${DL_DEFS:-} -DDS4_KERNEL_SOURCES="\"$work/sources.cu\"" \
    "$root/bench/cuda/decode_layer_phases.cu" -o "$work/phases"
positions=("$@")
[[ ${#positions[@]} -gt 0 ]] || positions=(16 600)
for pos in "${positions[@]}"; do
    "$work/phases" "$pos"
done
