#!/usr/bin/env bash
# A DeepSeek V4 Flash decode-step change checked on the GPU before it is
# measured: starts the llama.cpp build and the full-size file in the
# background (scripts/device/bench-ds4-vs-llamacpp.sh build file, so that
# scripts/device/ds4-flash-ab.sh finds both), runs the CUDA tests of the
# kernels a decode step uses (cuda_hyper, cuda_moe, cuda_parity, and
# cuda_ds4 against the llama.cpp oracle when DS4_TINY_DIR, default
# .device/ds4-tiny, holds scripts/gen-ds4-tiny.sh's models), then the
# decode ops at full-size shapes (scripts/device/ds4-decode-ops.sh, with
# its VARIANTS and NCU_KERNELS), waits for the file, and prints a table.
#
#   scripts/device/ds4-decode-check.sh     # GPU machine, repo root
#
# Env: BIN (default .device/bin), OUT (default /tmp/ds4-decode-check),
# TESTS (default "cuda_hyper cuda_moe cuda_parity cuda_ds4"), plus what
# the two scripts above read. Exits non-zero if a test failed.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${BIN:-$root/.device/bin}"
out="${OUT:-/tmp/ds4-decode-check}"
mkdir -p "$out"
export NO_COLOR=1 DS4_KERNEL_CACHE="${DS4_KERNEL_CACHE:-$out/kernel-cache}"
export DS4_TINY_DIR="${DS4_TINY_DIR:-$root/.device/ds4-tiny}"
say() { echo "[$(date +%T)] $*" >&2; }

mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [[ -z "${DS4_FLASH_FILE:-}" && "${mem:-0}" -lt 100000 ]]; then
  export LAYERS=28 DS4_FLASH_FILE=/dev/shm/ds4-flash-q2-l28.gguf
fi
# The same places ds4-flash-ab.sh uses (its side a).
OUT=/tmp/ds4-flash-ab/a "$root/scripts/device/bench-ds4-vs-llamacpp.sh" build >"$out/build.log" 2>&1
OUT=/tmp/ds4-flash-ab/a "$root/scripts/device/bench-ds4-vs-llamacpp.sh" file >"$out/file.log" 2>&1 &
file_pid=$!

status=0
rows=()
for t in ${TESTS:-cuda_hyper cuda_moe cuda_parity cuda_ds4}; do
  [[ -x "$bin/$t" ]] || { rows+=("$t | not built"); continue; }
  if [[ $t == cuda_ds4 && ! -s "$DS4_TINY_DIR/ds4-tiny.gguf" ]]; then
    rows+=("$t | no models in $DS4_TINY_DIR"); continue
  fi
  say "test $t"
  "$bin/$t" --ignored --test-threads=1 >"$out/$t.log" 2>&1 || status=1
  grep -E 'FAILED|panicked' "$out/$t.log" | head -20 >&2
  rows+=("$t | $(grep -E '^test result' "$out/$t.log" | tail -1)")
done

say "decode ops"
OUT="$out/ops" "$root/scripts/device/ds4-decode-ops.sh" >"$out/ops.log" 2>&1
wait "$file_pid"
say "file: $(tail -1 "$out/file.log")"

echo
echo "| test | result |"
echo "| --- | --- |"
printf '| %s |\n' "${rows[@]}"
echo
echo "decode ops (us, GB/s):"
cat "$out/ops/perf.txt" 2>/dev/null
grep -h '^ncu' "$out/ops.log" 2>/dev/null
for f in "$out"/ops/ncu-*.txt; do
  [[ -s "$f" ]] || continue
  echo "== $(basename "$f")"
  grep -E 'Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|No Eligible|L1/TEX Hit' "$f" | head -12
done
exit $status
