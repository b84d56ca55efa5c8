#!/usr/bin/env bash
# DeepSeek V4 Flash at full size on one GPU: the synthetic 43-layer q2
# file (scripts/gen-synth-ds4-flash.sh) written into /dev/shm, checked
# with --dry-run (fits on this GPU; refused on a GPU with less free memory
# than the file, emulated with --reserve-gb), loaded by a VMM owner, then
# CUDA workers attach: the first compiles the kernels and answers a
# greedy request (TTFT and decode tok/s of a short prompt); the second is
# started after a SIGKILL of the first and timed from process start to its
# first token.
#
#   scripts/device/ds4-flash-full-size.sh BIN_DIR GEN_DIR LOG_DIR
#
# BIN_DIR holds release ds4-weight-server and ds4-server; GEN_DIR is what
# `scripts/gen-synth-ds4-flash.sh prepare` wrote. Needs about 87 GB free
# in /dev/shm (DS4_FLASH_FILE to put the file elsewhere). Prints a table
# last; the logs go to LOG_DIR.
set -uo pipefail
bin="${1:?usage: $0 BIN_DIR GEN_DIR LOG_DIR}"
gen="${2:?usage: $0 BIN_DIR GEN_DIR LOG_DIR}"
logs="${3:?usage: $0 BIN_DIR GEN_DIR LOG_DIR}"
file="${DS4_FLASH_FILE:-/dev/shm/ds4-flash-q2.gguf}"
mkdir -p "$logs"
export NO_COLOR=1
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
rows=()
row() { rows+=("| $1 | $2 |"); echo "$1: $2" >&2; }

if [[ ! -s "$file" ]]; then
  t0=$(now_ms)
  "$gen/synth_gguf" fill "$gen/ds4-flash.header.gguf" "$file" --threads "$(nproc)" >"$logs/fill.log" 2>&1 ||
    { cat "$logs/fill.log" >&2; exit 1; }
  row "file written" "$(( ($(now_ms) - t0) / 1000 )) s, $(tail -1 "$logs/fill.log" | grep -o '[0-9.]* GB/s')"
fi
row "file bytes" "$(stat -c %s "$file")"

"$bin/ds4-weight-server" --base "$file" --manifest /tmp/unused.json --backend vmm --dry-run >"$logs/dry-run.log" 2>&1
row "dry-run on this GPU (exit)" "$? ($(grep -o 'verdict.*' "$logs/dry-run.log" | head -1))"
total_gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | awk '{print int($1/1024)}')
"$bin/ds4-weight-server" --base "$file" --manifest /tmp/unused.json --backend vmm --dry-run \
  --reserve-gb $(( total_gib - 60 )) >"$logs/dry-run-small.log" 2>&1
row "dry-run, 60 GiB left for it (exit)" "$? ($(grep -o 'verdict.*' "$logs/dry-run-small.log" | head -1))"

run="$(mktemp -d)"
manifest="$run/weights.json"
t0=$(now_ms)
"$bin/ds4-weight-server" --base "$file" --manifest "$manifest" --backend vmm >"$logs/owner.log" 2>&1 &
owner=$!
worker=""
trap 'kill -9 $worker 2>/dev/null; kill -TERM $owner 2>/dev/null; wait; rm -rf "$run"' EXIT
for _ in $(seq 1 6000); do [[ -e "$manifest" ]] && break; kill -0 $owner 2>/dev/null || break; sleep 0.1; done
[[ -e "$manifest" ]] || { echo "owner did not publish its manifest" >&2; tail -20 "$logs/owner.log" >&2; exit 1; }
row "owner load to manifest" "$(( ($(now_ms) - t0) / 1000 )) s"
row "owner log: weights uploaded" "$(grep -o 'bytes=[0-9]* load_s="[0-9.]*"' "$logs/owner.log" | tail -1)"
row "GPU memory used after load" "$(nvidia-smi --query-gpu=memory.used --format=csv,noheader | head -1)"
"$bin/ds4-weight-server" status --manifest "$manifest" >"$logs/status.txt" 2>&1

body='{"messages":[{"role":"user","content":"Write a long story about a lighthouse."}],"temperature":0,"max_tokens":128,"reasoning_effort":"none"}'
start_worker() { # $1 = port, $2 = log name
  t0=$(now_ms)
  "$bin/ds4-server" --weights-manifest "$manifest" --device cuda --port "$1" --ctx 8192 >"$logs/$2.log" 2>&1 &
  worker=$!
  for _ in $(seq 1 3000); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && break
    kill -0 $worker 2>/dev/null || break
    sleep 0.02
  done
}
first_token_ms() { # $1 = port: ms from $t0 to the first streamed token
  curl -sN "http://127.0.0.1:$1/v1/chat/completions" -H 'content-type: application/json' \
    -d '{"messages":[{"role":"user","content":"hi"}],"temperature":0,"max_tokens":2,"stream":true,"reasoning_effort":"none"}' |
    while read -r line; do [[ "$line" == data:* ]] && { echo $(( $(now_ms) - t0 )); break; }; done
}

start_worker 18401 worker-1
row "worker 1 (compiles kernels): start to healthy" "$(( $(now_ms) - t0 )) ms"
answer="$(curl -s "http://127.0.0.1:18401/v1/chat/completions" -H 'content-type: application/json' -d "$body")"
echo "$answer" >"$logs/answer-1.json"
row "greedy 128 tokens: TTFT / decode tok/s" "$(python3 -c 'import json,sys; t=json.loads(sys.argv[1])["timings"]; print("%.0f ms / %.1f" % (t["ttft_ms"], t["decode_tokens_per_s"]))' "$answer" 2>/dev/null || echo "failed: ${answer:0:300}")"
answer="$(curl -s "http://127.0.0.1:18401/v1/chat/completions" -H 'content-type: application/json' -d "$body")"
row "same again (warm): decode tok/s" "$(python3 -c 'import json,sys; t=json.loads(sys.argv[1])["timings"]; print("%.1f" % t["decode_tokens_per_s"])' "$answer" 2>/dev/null || echo failed)"
row "GPU memory used with a worker" "$(nvidia-smi --query-gpu=memory.used --format=csv,noheader | head -1)"
kill -9 "$worker"; wait "$worker" 2>/dev/null
start_worker 18402 worker-2
row "worker 2 after SIGKILL: start to first token" "$(first_token_ms 18402) ms"
kill -9 "$worker"; wait "$worker" 2>/dev/null; worker=""

echo
echo "| DeepSeek V4 Flash, synthetic q2, 43 layers | |"
echo "| --- | --- |"
printf '%s\n' "${rows[@]}"
