#!/usr/bin/env bash
# opencode (npm opencode-ai) against ds4-server through each of its three
# provider kinds: OpenAI-compatible Chat Completions, OpenAI Responses and
# Anthropic Messages. Offline: two non-interactive turns per provider
# (`opencode run`, then `opencode run -c`) in a network namespace with
# only loopback up (opencode 1.18 carries these three AI SDK providers in
# its binary: nothing is fetched at run time). Prints a table (see lib.sh).
#   ./scripts/agents/opencode.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

OPENCODE="opencode-ai@1.18.33"
export OPENCODE_CACHE="$AGENTS_DIR/opencode-cache"

# opencode's configuration: the three providers on $1 (the server's base).
opencode_config() {
  cat <<JSON
{
  "\$schema": "https://opencode.ai/config.json",
  "autoupdate": false,
  "share": "disabled",
  "agent": {"ds4-check": {"mode": "primary", "prompt": "$AGENTS_SYSTEM",
    "tools": {"*": false, "bash": true}}},
  "provider": {
    "ds4-chat": {"npm": "@ai-sdk/openai-compatible", "name": "ds4 (Chat Completions)",
      "options": {"baseURL": "$1/v1", "apiKey": "ds4"}, "models": {"default": {"name": "default"}}},
    "ds4-responses": {"npm": "@ai-sdk/openai", "name": "ds4 (Responses)",
      "options": {"baseURL": "$1/v1", "apiKey": "ds4"}, "models": {"default": {"name": "default"}}},
    "ds4-anthropic": {"npm": "@ai-sdk/anthropic", "name": "ds4 (Messages)",
      "options": {"baseURL": "$1/v1", "apiKey": "ds4"}, "models": {"default": {"name": "default"}}}
  }
}
JSON
}
export -f opencode_config

# One turn on provider $OPENCODE_PROVIDER.
opencode_turn() {
  opencode_config "$BASE" >opencode.json
  local cont=() trim=()
  [[ "$1" == 2 ]] && cont=(-c)
  [[ "$DS4_AGENTS_FULL" == 1 ]] || trim=(--agent ds4-check)
  XDG_CACHE_HOME="$OPENCODE_CACHE" OPENCODE_DISABLE_MODELS_FETCH=1 \
    OPENCODE_DISABLE_AUTOUPDATE=1 OPENCODE_DISABLE_LSP_DOWNLOAD=1 \
    opencode run "${cont[@]}" "${trim[@]}" -m "$OPENCODE_PROVIDER/default" "$2"
}
export -f opencode_turn

agents_setup "$OPENCODE"

agents_begin
for p in ds4-chat ds4-responses ds4-anthropic; do
  OPENCODE_PROVIDER="$p" agents_case "opencode-$p" 32768 opencode_turn
done
agents_table
