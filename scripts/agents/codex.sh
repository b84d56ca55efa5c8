#!/usr/bin/env bash
# Codex CLI (npm @openai/codex) against ds4-server over the OpenAI
# Responses API, offline: two non-interactive turns (`codex exec`, then
# `codex exec resume --last`) in a network namespace with only loopback
# up. Prints a table (see scripts/agents/lib.sh).
#   ./scripts/agents/codex.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CODEX="@openai/codex@0.171.0"

codex_turn() {
  export CODEX_HOME="$HOME/.codex"
  mkdir -p "$CODEX_HOME"
  cat >"$CODEX_HOME/config.toml" <<TOML
model = "default"
model_provider = "ds4"

[model_providers.ds4]
name = "ds4"
base_url = "$BASE/v1"
wire_api = "responses"
env_key = "DS4_API_KEY"
TOML
  if [[ "$DS4_AGENTS_FULL" != 1 ]]; then
    printf '%s\n' "$AGENTS_SYSTEM" >"$CODEX_HOME/instructions.md"
    sed -i "1i model_instructions_file = \"$CODEX_HOME/instructions.md\"" "$CODEX_HOME/config.toml"
  fi
  local args=(exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox)
  if [[ "$1" == 2 ]]; then
    DS4_API_KEY=ds4 codex "${args[@]}" resume --last "$2"
  else
    DS4_API_KEY=ds4 codex "${args[@]}" "$2"
  fi
}
export -f codex_turn

agents_setup "$CODEX"
agents_begin
agents_case codex 32768 codex_turn
agents_table
