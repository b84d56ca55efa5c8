#!/usr/bin/env bash
# Serve the embedded default model (SmolLM2-135M-Instruct) on the CPU, the
# way production runs: fetch the model if missing, build in release mode,
# start the weight owner (ds4-weight-server, host backend), wait until it
# has published its manifest, then start a ds4-server worker attached to
# it. Ctrl-C stops both. Extra arguments go to ds4-server (see:
# ds4-server --help), e.g.
#   ./scripts/serve.sh --port 8080 --ctx 4096
# DS4_SERVE_STANDALONE=1 runs the worker alone (it loads the model itself).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
[[ -e ds4.gguf ]] || ./scripts/fetch-model.sh >/dev/null
cargo build --release -p ds4-inference-worker --bin ds4-server -p ds4-weight-server --bin ds4-weight-server

host="${DS4_HOST:-127.0.0.1}"
port="${DS4_PORT:-8000}"
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --port) port="${args[i + 1]:-$port}" ;;
    --port=*) port="${args[i]#--port=}" ;;
    --host) host="${args[i + 1]:-$host}" ;;
    --host=*) host="${args[i]#--host=}" ;;
  esac
done

cat >&2 <<MSG

ds4-server is starting on http://$host:$port (Ctrl-C to stop). Try:

  curl -s http://$host:$port/v1/chat/completions -H 'content-type: application/json' \\
    -d '{"messages":[{"role":"user","content":"What is the capital of France?"}],"temperature":0}'

MSG

if [[ "${DS4_SERVE_STANDALONE:-0}" == 1 ]]; then
  DS4_HOST="$host" DS4_PORT="$port" exec ./target/release/ds4-server -m ds4.gguf "$@"
fi

run_dir="$(mktemp -d "${TMPDIR:-/tmp}/ds4-serve.XXXXXX")"
manifest="$run_dir/weights.json"
owner_pid=""
worker_pid=""
cleanup() {
  trap - INT TERM EXIT
  [[ -n "$worker_pid" ]] && kill "$worker_pid" 2>/dev/null && wait "$worker_pid" 2>/dev/null
  [[ -n "$owner_pid" ]] && kill "$owner_pid" 2>/dev/null && wait "$owner_pid" 2>/dev/null
  rm -rf "$run_dir"
}
trap cleanup INT TERM EXIT

# The worker computes on the CPU, so the owner holds host memory.
./target/release/ds4-weight-server --base ds4.gguf --manifest "$manifest" --backend host &
owner_pid=$!
for _ in $(seq 1 600); do
  [[ -e "$manifest" ]] && break
  kill -0 "$owner_pid" 2>/dev/null || { echo "ds4-weight-server exited during start-up" >&2; exit 1; }
  sleep 0.1
done
[[ -e "$manifest" ]] || { echo "ds4-weight-server did not publish $manifest in 60 s" >&2; exit 1; }

# Host and port reach the worker through the environment, so that the same
# flags among the extra arguments do not clash.
DS4_HOST="$host" DS4_PORT="$port" ./target/release/ds4-server -m ds4.gguf --weights-manifest "$manifest" "$@" &
worker_pid=$!
# The worker keeps serving even if the owner stops; the session ends with it.
set +e
wait "$worker_pid"
status=$?
worker_pid=""
exit "$status"
