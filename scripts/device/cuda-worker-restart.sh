#!/usr/bin/env bash
# A CUDA worker serving from weights a VMM owner holds, restarted: how
# long from process start until it answers again.
#
#   scripts/device/cuda-worker-restart.sh BIN_DIR LOG_DIR MODEL.gguf
#
# BIN_DIR holds release ds4-weight-server and ds4-server. The owner loads
# MODEL into CUDA VMM; then DS4_RESTARTS (default 5) fresh workers each
# attach (--device cuda), bind the imported weights in place, and answer
# one greedy chat request; each is killed with SIGKILL before the next
# starts. The first worker may compile the kernels (NVRTC); later ones
# load them from the disk cache. Prints a table last; exits non-zero if a
# worker failed or answered wrongly.
set -uo pipefail
bin="${1:?usage: $0 BIN_DIR LOG_DIR MODEL.gguf}"
logs="${2:?usage: $0 BIN_DIR LOG_DIR MODEL.gguf}"
model="${3:?usage: $0 BIN_DIR LOG_DIR MODEL.gguf}"
restarts="${DS4_RESTARTS:-5}"
mkdir -p "$logs"
export NO_COLOR=1
run="$(mktemp -d)"
manifest="$run/weights.json"
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
"$bin/ds4-weight-server" --base "$model" --manifest "$manifest" --backend vmm >"$logs/owner.log" 2>&1 &
owner=$!
trap 'kill -9 $worker 2>/dev/null; kill -TERM $owner 2>/dev/null; wait; rm -rf "$run"' EXIT
worker=""
for _ in $(seq 1 600); do [[ -e "$manifest" ]] && break; sleep 0.05; done
[[ -e "$manifest" ]] || { echo "owner did not publish its manifest" >&2; tail -5 "$logs/owner.log" >&2; exit 1; }
body='{"messages":[{"role":"user","content":"What is the capital of France? Answer in one sentence."}],"temperature":0,"max_tokens":16}'
fail=0
rows=()
for i in $(seq 1 "$restarts"); do
  port=$((18300 + i))
  t0=$(now_ms)
  "$bin/ds4-server" --weights-manifest "$manifest" --device cuda --port "$port" >"$logs/worker-$i.log" 2>&1 &
  worker=$!
  healthy=""
  for _ in $(seq 1 600); do
    if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then healthy=$(( $(now_ms) - t0 )); break; fi
    sleep 0.01
  done
  answer="$(curl -s "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' -d "$body")"
  answered=$(( $(now_ms) - t0 ))
  text="$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["choices"][0]["message"]["content"])' "$answer" 2>/dev/null)"
  [[ "$text" == "The capital of France is Paris." ]] || { fail=1; echo "worker $i answered: $answer" >&2; tail -3 "$logs/worker-$i.log" >&2; }
  kernels="$(grep -o 'kernels_compiled=[0-9]* kernels_cached=[0-9]*' "$logs/worker-$i.log" | head -1)"
  rows+=("| $i | ${healthy:--} | $answered | $kernels | $text |")
  kill -9 "$worker"; wait "$worker" 2>/dev/null; worker=""
done
echo "| worker | start to healthy ms | start to first answer ms | kernels | answer |"
echo "| ---: | ---: | ---: | --- | --- |"
printf '%s\n' "${rows[@]}"
grep -o 'load_count[^ ]*' "$logs/owner.log" | tail -1
exit $fail
