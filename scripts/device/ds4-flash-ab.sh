#!/usr/bin/env bash
# A kernel switch measured on DeepSeek V4 Flash at full size, both sides
# in the same run, with llama.cpp on the same file: the parity tests of
# the kernels it touches first, then ds4-bench with the switch off (A)
# and on (B), each with the per-kernel profile, then llama-bench, then
# one table per side.
#
#   scripts/device/ds4-flash-ab.sh               # GPU machine, repo root
#
# Env: A and B (the environment of each side, default
# DS4_CUDA_STAGED_Q8=0 and DS4_CUDA_STAGED_Q8=1; C, where set, a third
# side), PARITY (test binary and
# filters, run with B's environment: "BIN FILTER..." entries separated by
# ';', default the staged Q8_0 and grouped matvec tests), LLAMA (0: no
# llama-bench, for a run that compares ds4 sides only), REPS (default
# 5), PROMPTS (default 512), DEPTHS (default 4096), OUT (default
# /tmp/ds4-flash-ab), plus what scripts/device/bench-ds4-vs-llamacpp.sh
# reads (BIN, GEN, DS4_FLASH_FILE, DS4_FLAGS, WORK). A GPU with less than
# 100 GB gets the first 28 blocks only (LAYERS=28, a smaller file of the
# same shapes). PROFILE=0 leaves out the per-kernel profiles. Kernel PTX is cached in DS4_KERNEL_CACHE (default
# $OUT/kernel-cache).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bench="$root/scripts/device/bench-ds4-vs-llamacpp.sh"
bin="${BIN:-$root/.device/bin}"
out="${OUT:-/tmp/ds4-flash-ab}"
side_a="${A:-DS4_CUDA_STAGED_Q8=0}"
side_b="${B:-DS4_CUDA_STAGED_Q8=1}"
side_c="${C:-}"
sides="a b"; [[ -n "$side_c" ]] && sides="a b c"
parity="${PARITY-cuda_parity q8_0_decode matmul_many matmul_every_type_production; cuda_moe grouped experts_row_independent}"
export REPS="${REPS:-5}" PROMPTS="${PROMPTS:-512}" DEPTHS="${DEPTHS-4096}" LLAMA_DEPTHS="${LLAMA_DEPTHS-${DEPTHS-4096}}"
export DS4_KERNEL_CACHE="${DS4_KERNEL_CACHE:-$out/kernel-cache}" NO_COLOR=1
for side in $sides; do mkdir -p "$out/$side"; done
say() { echo "[$(date +%T)] $*" >&2; }
side_env() { case $1 in a) echo "$side_a" ;; b) echo "$side_b" ;; c) echo "$side_c" ;; esac; }

nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv | tee "$out/gpu.txt" >&2
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [[ -z "${DS4_FLASH_FILE:-}" && "${mem:-0}" -lt 100000 ]]; then
  export LAYERS=28 DS4_FLASH_FILE=/dev/shm/ds4-flash-q2-l28.gguf
fi

if [[ "${LLAMA:-1}" == 1 ]]; then
  OUT="$out/a" "$bench" build file || exit 1
else
  OUT="$out/a" "$bench" file || exit 1
fi

status=0
IFS=';' read -ra runs <<<"$parity"
for r in "${runs[@]}"; do
  read -ra words <<<"$r"
  [[ ${#words[@]} -eq 0 ]] && continue
  t="${words[0]}"
  say "parity: $r (with $side_b)"
  env $side_b "$bin/$t" --ignored --test-threads=1 "${words[@]:1}" >"$out/parity-$t.log" 2>&1 || status=1
  grep -E '^test result|FAILED|panicked' "$out/parity-$t.log" >&2
done

for side in $sides; do
  envs="$(side_env $side)"
  say "ds4 side $side: $envs"
  env $envs DS4_CUDA_TIMING="${DS4_CUDA_TIMING:-0}" PROFILE="${PROFILE:-1}" OUT="$out/$side" "$bench" ds4
done

[[ "${LLAMA:-1}" == 1 ]] && OUT="$out/a" "$bench" llama
for f in llama.json llama-depth.json; do
  for side in $sides; do [[ -e "$out/a/$f" && $side != a ]] && cp "$out/a/$f" "$out/$side/$f"; done
done
for phase in profile table; do
  for side in $sides; do
    echo
    echo "## side $side: $(side_env $side)"
    if [[ $phase == profile ]]; then
      [[ -s "$out/$side/ds4-profile.txt" ]] && head -60 "$out/$side/ds4-profile.txt"
    else
      OUT="$out/$side" "$bench" table
    fi
  done
done
# Everything measured in one archive beside the logs.
tar -C "$out" --exclude kernel-cache -czf "$out.tar.gz" . 2>/dev/null
exit $status
