#!/usr/bin/env bash
# Exercise the CUDA VMM weight owner and worker import on an NVIDIA GPU.
#
#   scripts/device/vmm-owner-worker.sh BIN_DIR LOG_DIR [MODEL.gguf]
#
# BIN_DIR holds prebuilt ds4-weight-server and ds4-server (release build
# from any Linux machine with glibc >= 2.34; no CUDA toolkit needed, the
# driver is loaded at run time). LOG_DIR receives every log. MODEL defaults
# to BIN_DIR/ds4.gguf when present. Environment: DS4_DEVICE (ordinal, 0),
# DS4_SYNTHETIC_GB (large run, 80 = 40 x 2 GiB), DS4_RESTARTS (5),
# DS4_BACKEND (vmm; host rehearses the script without a GPU).
#
# Steps: (1) dry-run of the model on vmm; (2) owner with the model on
# vmm, then DS4_RESTARTS fresh worker processes that attach, import, map
# read-only and verify a sample of every tensor against the model file
# (`ds4-server --weights-check`; serving from device memory needs the CUDA
# compute backend, which does not exist yet); (3) an owner filling
# DS4_SYNTHETIC_GB of 2 GiB regions, then worker imports of all of it.
# Prints a short table last; exits non-zero if a step failed.
set -uo pipefail

bin="${1:?usage: $0 BIN_DIR LOG_DIR [MODEL.gguf]}"
logs="${2:?usage: $0 BIN_DIR LOG_DIR [MODEL.gguf]}"
model="${3:-$bin/ds4.gguf}"
device="${DS4_DEVICE:-0}"
synthetic_gb="${DS4_SYNTHETIC_GB:-80}"
restarts="${DS4_RESTARTS:-5}"
backend="${DS4_BACKEND:-vmm}"   # host: rehearse the script on a machine without a GPU
owner_bin="$bin/ds4-weight-server"
worker_bin="$bin/ds4-server"
mkdir -p "$logs"
export NO_COLOR=1
logs="$(cd "$logs" && pwd)"
run="$(mktemp -d "${TMPDIR:-/tmp}/ds4-vmm.XXXXXX")"
results=()
failed=0
owner_pid=""

note() { echo "== $*" | tee -a "$logs/summary.log" >&2; }
record() { results+=("$1|$2"); echo "$1: $2" >>"$logs/summary.log"; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
median() { sort -n | awk '{a[NR]=$1} END {if (NR==0) print "-"; else if (NR%2) print a[(NR+1)/2]; else printf "%.1f\n", (a[NR/2]+a[NR/2+1])/2}'; }

stop_owner() {
  if [[ -n "$owner_pid" ]]; then
    kill -TERM "$owner_pid" 2>/dev/null
    wait "$owner_pid" 2>/dev/null
    owner_pid=""
  fi
}
trap 'stop_owner; rm -rf "$run"' EXIT

# start_owner NAME ARGS...: start an owner, wait for its manifest (path
# left in $manifest).
start_owner() {
  local name="$1"; shift
  manifest="$run/$name.json"
  local t0; t0=$(now_ms)
  "$owner_bin" --manifest "$manifest" --backend "$backend" --device "$device" "$@" \
    >"$logs/$name-owner.log" 2>&1 &
  owner_pid=$!
  while [[ ! -e "$manifest" ]]; do
    if ! kill -0 "$owner_pid" 2>/dev/null; then
      wait "$owner_pid"; owner_pid=""
      note "$name: owner exited during start-up (see $logs/$name-owner.log)"
      tail -3 "$logs/$name-owner.log" >&2
      return 1
    fi
    sleep 0.05
  done
  record "$name owner start-to-ready (ms)" "$(( $(now_ms) - t0 ))"
  record "$name owner upload (s)" "$(grep -o 'load_s="[0-9.]*"' "$logs/$name-owner.log" | head -1 | tr -dc '0-9.')"
}

# check_workers NAME MANIFEST N [ARGS...]: N fresh worker imports.
check_workers() {
  local name="$1" manifest="$2" n="$3"; shift 3
  local walls=() imports=() i t0 out
  for ((i = 1; i <= n; i++)); do
    t0=$(now_ms)
    if ! out=$("$worker_bin" --weights-manifest "$manifest" --weights-check "$@" 2>>"$logs/$name-worker.log"); then
      note "$name: worker check $i failed (see $logs/$name-worker.log)"
      tail -3 "$logs/$name-worker.log" >&2
      failed=1
      return 1
    fi
    walls+=("$(( $(now_ms) - t0 ))")
    echo "$out" >>"$logs/$name-worker.log"
    imports+=("$(grep -o 'import_ms=[0-9.]*' <<<"$out" | cut -d= -f2)")
  done
  record "$name worker process start-to-verified, median of $n (ms)" "$(printf '%s\n' "${walls[@]}" | median)"
  record "$name worker attach+import, median of $n (ms)" "$(printf '%s\n' "${imports[@]}" | median)"
  record "$name regions / bytes" "$(grep -o 'regions=[0-9]* bytes=[0-9]*' <<<"$out")"
}

[[ -x "$owner_bin" && -x "$worker_bin" ]] || { echo "missing binaries in $bin" >&2; exit 2; }
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv >"$logs/gpu.txt" 2>&1
note "logs in $logs"

if [[ -f "$model" ]]; then
  note "1. dry-run of $model on $backend"
  "$owner_bin" --base "$model" --manifest "$run/dry.json" --backend "$backend" --device "$device" --dry-run \
    >"$logs/dry-run.log" 2>&1
  rc=$?
  record "dry-run exit code (0 fits)" "$rc"
  [[ $rc -eq 0 ]] || failed=1

  note "2. owner with the model, $restarts worker restarts"
  if start_owner model --base "$model"; then
    check_workers model "$manifest" "$restarts" -m "$model"
    "$owner_bin" status --manifest "$manifest" >"$logs/model-status.txt" 2>&1
    record "model owner load_count after restarts" "$(awk '/^load_count/ {print $2}' "$logs/model-status.txt")"
    stop_owner
  else
    failed=1
  fi
else
  note "no model at $model: skipping steps 1 and 2"
fi

note "3. owner filling ${synthetic_gb} GiB of 2 GiB regions"
if start_owner synthetic --synthetic-gb "$synthetic_gb"; then
  check_workers synthetic "$manifest" 3
  stop_owner
else
  failed=1
fi

echo
printf '%-58s %s\n' "measurement" "value"
printf '%-58s %s\n' "-----------" "-----"
for r in "${results[@]}"; do
  printf '%-58s %s\n' "${r%%|*}" "${r#*|}"
done
exit "$failed"
