#!/usr/bin/env bash
# Serve the embedded default model (SmolLM2-135M-Instruct) on the CPU:
# fetch it if missing, build ds4 in release mode, start ds4-server.
# Extra arguments go to ds4-server (see: ds4-server --help), e.g.
#   ./scripts/serve.sh --port 8080 --ctx 4096
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
[[ -e ds4.gguf ]] || ./scripts/fetch-model.sh >/dev/null
cargo build --release -p ds4-inference-worker --bin ds4-server

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
exec ./target/release/ds4-server -m ds4.gguf --host "$host" --port "$port" "$@"
