#!/usr/bin/env bash
# The ops of one DeepSeek V4 Flash decode step at full-size shapes, timed
# by cuda_perf's perf_ds4_decode_ops (no model file needed): with the
# built-in kernels, with the kernel sources of a folder where KERNEL_DIR
# names one (kernels/cuda: the working tree's), with each of VARIANTS
# ("label:VAR=value,VAR=value" entries separated by spaces; default the
# staged Q8_0 matvecs and the block-per-rows expert matvecs), then Nsight
# Compute on the kernels named in NCU_KERNELS (one launch each, after
# warm-up). Logs under $OUT (default /tmp/ds4-decode-ops).
#
#   scripts/device/ds4-decode-ops.sh       # GPU machine, repo root
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${BIN:-$root/.device/bin}"
out="${OUT:-/tmp/ds4-decode-ops}"
kdir="${KERNEL_DIR:-}"
mkdir -p "$out"
export NO_COLOR=1 DS4_KERNEL_CACHE="${DS4_KERNEL_CACHE:-$out/kernel-cache}"
perf() { "$bin/cuda_perf" --ignored --exact perf_ds4_decode_ops --nocapture 2>&1 | grep '^PERF' | sed "s/^PERF /$1 /"; }
{
  perf built-in
  [[ -n "$kdir" ]] && DS4_CUDA_KERNEL_DIR="$kdir" perf kernel-dir
  for v in ${VARIANTS-staged-q8:DS4_CUDA_STAGED_Q8=1 block-mv:DS4_CUDA_WARP_MV=0}; do
    vars="${v#*:}"
    (export ${vars//,/ }; perf "${v%%:*}")
  done
} | tee "$out/perf.txt"
if command -v ncu >/dev/null; then
  for k in ${NCU_KERNELS:-moe_dvgu_iq2_xxs moe_dv_q2_k moe_dv_q8_0 hc_split}; do
    ncu --clock-control none -k "regex:^$k\$" -s 20 -c 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
      --section WarpStateStats --section LaunchStats --section SchedulerStats \
      "$bin/cuda_perf" --ignored --exact perf_ds4_decode_ops >"$out/ncu-$k.txt" 2>&1
    echo "ncu $k: rc $?, $(grep -c . "$out/ncu-$k.txt") lines"
  done
fi
