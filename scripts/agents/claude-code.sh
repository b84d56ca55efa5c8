#!/usr/bin/env bash
# Claude Code (npm @anthropic-ai/claude-code) against ds4-server over the
# Anthropic Messages API, offline: two non-interactive turns (`claude -p`,
# then `claude -c -p` continuing the session) in a network namespace with
# only loopback up. Prints a table (see scripts/agents/lib.sh).
#
# With its own system prompt and tools (DS4_AGENTS_FULL=1), Claude Code's
# first request is 12,600 tokens; the server runs with --ctx 32768. Claude Code's own model
# names (its "default" is a Claude model) are not served: it is told to ask
# for deepseek-v4-flash, a name every ds4 model answers to.
#   ./scripts/agents/claude-code.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CLAUDE_CODE="@anthropic-ai/claude-code@2.1.332"

claude_turn() {
  local cont=() trim=()
  [[ "$1" == 2 ]] && cont=(-c)
  [[ "$DS4_AGENTS_FULL" == 1 ]] || trim=(--bare --tools Bash --system-prompt "$AGENTS_SYSTEM")
  ANTHROPIC_BASE_URL="$BASE" ANTHROPIC_AUTH_TOKEN=ds4 ANTHROPIC_API_KEY=ds4 \
    ANTHROPIC_MODEL=deepseek-v4-flash ANTHROPIC_SMALL_FAST_MODEL=deepseek-v4-flash \
    ANTHROPIC_DEFAULT_HAIKU_MODEL=deepseek-v4-flash \
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1 \
    DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1 API_TIMEOUT_MS=900000 \
    claude "${cont[@]}" "${trim[@]}" -p "$2" --model deepseek-v4-flash --max-turns 3 \
    --allowedTools Bash --output-format json
}
export -f claude_turn

agents_setup "$CLAUDE_CODE"
agents_begin
agents_case claude-code 32768 claude_turn
agents_table
