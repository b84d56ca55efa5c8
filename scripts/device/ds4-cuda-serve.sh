#!/usr/bin/env bash
# DeepSeek V4 served on an NVIDIA GPU: from a CUDA VMM weight owner by a
# CUDA worker, answering over HTTP exactly as a CPU worker does, batched or
# not; a resent conversation resumes from cached state, and from the disk
# KV cache after a restart.
#
#   scripts/device/ds4-cuda-serve.sh BIN_DIR LOG_DIR MODEL.gguf
#
# BIN_DIR holds prebuilt ds4-weight-server and ds4-server (release build
# from any Linux machine with glibc >= 2.34; no CUDA toolkit needed, the
# driver and NVRTC are loaded at run time). MODEL is a DeepSeek V4 GGUF
# (scripts/gen-ds4-tiny.sh's ds4-tiny.gguf for the check). LOG_DIR
# receives every log and answer.
#
# Steps: (1) an owner holds the model in CUDA VMM memory (--backend vmm);
# (2) a CUDA worker attaches (weights bound in place) and answers a set of
# greedy chat requests (short and 2,500-token prompts, thinking on and
# off) in exact numerics (--exact-numerics: f32 everywhere, so the two
# devices agree to float rounding and greedy tokens are the same); (3) a
# CPU worker on the same file answers the same requests; (4) the token ids
# of both must be equal, request by request, and the CUDA worker's answers
# to all requests sent at once (batched steps) equal its answers one by
# one; (5) a standalone CUDA worker with --kv-disk-dir answers a
# 2,000-token conversation, then the conversation resent with a new turn
# (at least 1,800 cached tokens, the same answer as the CPU worker's cold
# run), is restarted, and answers it again from the disk cache. Prints a
# short table last; exits non-zero if a step failed.
set -uo pipefail

bin="${1:?usage: $0 BIN_DIR LOG_DIR MODEL.gguf}"
logs="${2:?usage: $0 BIN_DIR LOG_DIR MODEL.gguf}"
model="${3:?usage: $0 BIN_DIR LOG_DIR MODEL.gguf}"
mkdir -p "$logs"
logs="$(cd "$logs" && pwd)"
export NO_COLOR=1 RUST_LOG=info
run="$(mktemp -d "${TMPDIR:-/tmp}/ds4-http.XXXXXX")"
pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$run"; }
trap cleanup EXIT
failed=0
results=()
record() { results+=("$1|$2"); echo "$1: $2" >>"$logs/summary.log"; }

wait_http() {
  # A first start on a machine compiles the kernels (about a minute).
  for _ in $(seq 1 1800); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0
    sleep 0.1
  done
  return 1
}

# ask_all PORT NAME: every request of the set at once (batched by the
# engine), token ids saved in request order.
ask_all() {
  local port="$1" name="$2" i=0 curls=()
  while IFS= read -r body; do
    i=$((i + 1))
    curl -s "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' \
      -d "$body" >"$logs/$name-$i.json" &
    curls+=($!)
  done <"$run/requests.jsonl"
  wait "${curls[@]}"
  : >"$logs/$name.ids"
  for j in $(seq 1 "$i"); do
    python3 -c 'import json,sys; v=json.load(open(sys.argv[1])); print(v["choices"][0].get("token_ids"))' \
      "$logs/$name-$j.json" >>"$logs/$name.ids" 2>>"$logs/$name.err" || echo "error" >>"$logs/$name.ids"
  done
}

# ask PORT NAME: every request of the set, greedy, token ids saved.
ask() {
  local port="$1" name="$2" i=0
  : >"$logs/$name.ids"
  while IFS= read -r body; do
    i=$((i + 1))
    curl -s "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' \
      -d "$body" >"$logs/$name-$i.json"
    python3 -c 'import json,sys; v=json.load(open(sys.argv[1])); print(v["choices"][0].get("token_ids"))' \
      "$logs/$name-$i.json" >>"$logs/$name.ids" 2>>"$logs/$name.err" || echo "error" >>"$logs/$name.ids"
  done <"$run/requests.jsonl"
}

python3 - "$run/requests.jsonl" <<'PY'
import json, sys
reqs = []
long = "".join(f"Item {i}: the value is {i * 7 + 3}.\n" for i in range(120))
for i, text in enumerate(["Hello", "The capital of France is", long, "def f(x):", long + "And item 7?"]):
    for effort in ["none", "high"]:
        reqs.append({"messages": [{"role": "user", "content": text}], "temperature": 0,
                     "max_tokens": 24, "reasoning_effort": effort, "return_token_ids": True})
with open(sys.argv[1], "w") as f:
    for r in reqs:
        f.write(json.dumps(r) + "\n")
PY

manifest="$run/weights.json"
"$bin/ds4-weight-server" --base "$model" --manifest "$manifest" --backend vmm >"$logs/owner.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 600); do [[ -e "$manifest" ]] && break; sleep 0.1; done
if [[ -e "$manifest" ]]; then record "vmm owner" "ready"; else record "vmm owner" "FAILED"; failed=1; fi

"$bin/ds4-server" --weights-manifest "$manifest" --device cuda --exact-numerics --port 18101 --ctx 4096 \
  >"$logs/cuda-worker.log" 2>&1 &
pids+=($!)
if wait_http 18101; then
  ask 18101 cuda
  record "cuda worker (attached)" "$(grep -c '^\[' "$logs/cuda.ids") answers"
  ask_all 18101 cuda-batched
  if cmp -s "$logs/cuda.ids" "$logs/cuda-batched.ids"; then
    record "cuda batched == alone" "yes"
  else
    record "cuda batched == alone" "NO (see cuda-batched.ids)"; failed=1
  fi
else
  record "cuda worker (attached)" "FAILED to start"; failed=1
fi

"$bin/ds4-server" -m "$model" --device cpu --exact-numerics --port 18102 --ctx 4096 \
  >"$logs/cpu-worker.log" 2>&1 &
pids+=($!)
if wait_http 18102; then
  ask 18102 cpu
  record "cpu worker" "$(grep -c '^\[' "$logs/cpu.ids") answers"
else
  record "cpu worker" "FAILED to start"; failed=1
fi

# resume PORT NAME: the conversation, then it resent with a new turn;
# prints "cached=N" of the resent request and saves its token ids.
resume() {
  python3 - "$1" "$logs/$2" <<'PY'
import json, sys, urllib.request
port, out = sys.argv[1], sys.argv[2]
def chat(messages):
    body = json.dumps({"messages": messages, "temperature": 0, "max_tokens": 12,
                       "reasoning_effort": "none", "return_token_ids": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                 {"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=300))
long = "".join(f"Item {i}: the alpha value is {i * 7 + 3}.\n" for i in range(90))
first = [{"role": "user", "content": long}]
a = chat(first)
nxt = first + [{"role": "assistant", "content": a["choices"][0]["message"]["content"]},
               {"role": "user", "content": "And item 12?"}]
b = chat(nxt)
open(out + ".ids", "w").write(json.dumps(b["choices"][0]["token_ids"]) + "\n")
print(f'prompt={a["usage"]["prompt_tokens"]} cached={b["usage"]["prompt_tokens_details"]["cached_tokens"]}')
PY
}

if [[ -s "$logs/cuda.ids" ]] && cmp -s "$logs/cuda.ids" "$logs/cpu.ids"; then
  record "cuda == cpu token ids" "yes ($(wc -l <"$logs/cuda.ids") requests)"
else
  record "cuda == cpu token ids" "NO (see cuda.ids / cpu.ids)"; failed=1
fi
grep -h "computing on CUDA\|model loaded" "$logs/cuda-worker.log" | head -3 >"$logs/binding.txt"

# Prefix reuse and the disk KV cache on the CUDA worker; the CPU worker's
# cold answer to the resent conversation is the reference.
resume 18102 cpu-resume >/dev/null
kv="$run/kv"
"$bin/ds4-server" -m "$model" --device cuda --exact-numerics --port 18103 --ctx 4096 \
  --kv-disk-dir "$kv" >"$logs/cuda-disk-1.log" 2>&1 &
pids+=($!)
if wait_http 18103; then
  r=$(resume 18103 cuda-resume)
  c=${r##*cached=}
  if [[ "$c" -ge 1800 ]] && cmp -s "$logs/cuda-resume.ids" "$logs/cpu-resume.ids"; then
    record "cuda resent conversation" "$r, answer == cpu cold"
  else
    record "cuda resent conversation" "FAILED: $r"; failed=1
  fi
  kill -TERM "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null
  "$bin/ds4-server" -m "$model" --device cuda --exact-numerics --port 18104 --ctx 4096 \
    --kv-disk-dir "$kv" >"$logs/cuda-disk-2.log" 2>&1 &
  pids+=($!)
  if wait_http 18104; then
    r=$(resume 18104 cuda-restored)
    if grep -q "prefix restored" "$logs/cuda-disk-2.log" \
      && cmp -s "$logs/cuda-restored.ids" "$logs/cpu-resume.ids"; then
      record "cuda restart, from disk" "$r, restored, answer == cpu cold"
    else
      record "cuda restart, from disk" "FAILED: $r"; failed=1
    fi
  else
    record "cuda restart, from disk" "FAILED to start"; failed=1
  fi
else
  record "cuda resent conversation" "FAILED to start"; failed=1
fi

echo
printf '%-28s %s\n' "step" "result"
for r in "${results[@]}"; do printf '%-28s %s\n' "${r%%|*}" "${r#*|}"; done
exit $failed
