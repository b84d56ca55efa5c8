#!/usr/bin/env bash
# The ops of one DeepSeek V4 Flash decode step at full-size shapes, timed
# by cuda_perf's perf_ds4_decode_ops (no model file needed): with the
# built-in kernels, with the kernel sources of a folder (KERNEL_DIR,
# default kernels/cuda: the working tree's), with the staged Q8_0
# matvecs, then Nsight Compute on the kernels named in NCU_KERNELS (one
# launch each, after warm-up). Logs under $OUT (default /tmp/ds4-decode-ops).
#
#   scripts/device/ds4-decode-ops.sh       # GPU machine, repo root
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${BIN:-$root/.device/bin}"
out="${OUT:-/tmp/ds4-decode-ops}"
kdir="${KERNEL_DIR:-$root/kernels/cuda}"
mkdir -p "$out"
export NO_COLOR=1 DS4_KERNEL_CACHE="${DS4_KERNEL_CACHE:-$out/kernel-cache}"
perf() { "$bin/cuda_perf" --ignored --exact perf_ds4_decode_ops --nocapture 2>&1 | grep '^PERF' | sed "s/^PERF /$1 /"; }
{
  perf built-in
  DS4_CUDA_KERNEL_DIR="$kdir" perf kernel-dir
  DS4_CUDA_STAGED_Q8=1 perf staged-q8
} | tee "$out/perf.txt"
if command -v ncu >/dev/null; then
  for k in ${NCU_KERNELS:-moe_mvgu_iq2_xxs moe_mv_q2_k hc_split mv32_q8_0}; do
    ncu --clock-control none -k "regex:^$k\$" -s 20 -c 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
      --section WarpStateStats --section LaunchStats --section SchedulerStats \
      "$bin/cuda_perf" --ignored --exact perf_ds4_decode_ops >"$out/ncu-$k.txt" 2>&1
    echo "ncu $k: rc $?, $(grep -c . "$out/ncu-$k.txt") lines"
  done
fi
