# Shared by the agent-client checks in this folder (sourced, not run).
#
# A check installs one client from npm into a scratch prefix, then, inside
# a network namespace where only loopback is up (nothing can leave the
# machine), starts ds4-server on the embedded default model with a trace
# file, runs two non-interactive turns of the client against it (the
# first asks for a shell command, so a model that calls the client's tool
# makes a tool round trip; the second continues the session), and prints
# one table row: client, exit codes, requests the server saw, tool calls
# the model made, cached tokens of the second turn's main request (its
# largest prompt), requests refused / failed or dropped, seconds.
#
# Environment:
#   DS4_SERVER_BIN   ds4-server to run (default: built with cargo --release)
#   DS4_AGENTS_DIR   scratch folder (default: target/agents); npm installs
#                    and each run's server log, trace and client output
#                    stay there
#   DS4_AGENTS_PORT  port inside the namespace (default 8765)
#   DS4_AGENTS_FULL  1: run each client with its own system prompt and
#                    every tool (Claude Code's first request is then 12,600
#                    tokens, tens of minutes of prefill for the 135M model
#                    on a few CPU cores); by default each client gets the
#                    short system prompt below and only its shell tool

set -euo pipefail

AGENTS_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
AGENTS_DIR="${DS4_AGENTS_DIR:-$AGENTS_ROOT/target/agents}"
AGENTS_PORT="${DS4_AGENTS_PORT:-8765}"
export AGENTS_ROOT AGENTS_DIR AGENTS_PORT

# The system prompt the clients get unless DS4_AGENTS_FULL=1.
export AGENTS_SYSTEM="You are a coding agent working in a terminal. To run a shell command, call your shell tool. Answer briefly."
export DS4_AGENTS_FULL="${DS4_AGENTS_FULL:-0}"

# Tokens an answer may take (the server's --max-tokens: a 135M model may
# ramble until its limit, and the clients ask for up to 32,000).
export AGENTS_MAX_OUTPUT=400

# The prompts of the two turns.
export AGENTS_TURN1="Use your shell tool to run: echo ds4-agent-check. Answer in one line."
export AGENTS_TURN2="Thanks. Now say goodbye in one short sentence."

# Build (or find) ds4-server and the model; install npm packages "$@"
# into $AGENTS_DIR/npm (their binaries in $AGENTS_DIR/npm/node_modules/.bin).
agents_setup() {
  mkdir -p "$AGENTS_DIR"
  command -v unshare >/dev/null || { echo "unshare (util-linux) is required" >&2; exit 2; }
  command -v npm >/dev/null || { echo "npm (Node.js 20 or later) is required" >&2; exit 2; }
  [[ -e "$AGENTS_ROOT/ds4.gguf" ]] || "$AGENTS_ROOT/scripts/fetch-model.sh" >/dev/null
  if [[ -z "${DS4_SERVER_BIN:-}" ]]; then
    (cd "$AGENTS_ROOT" && cargo build --release -p ds4-inference-worker --bin ds4-server >&2)
    DS4_SERVER_BIN="$AGENTS_ROOT/target/release/ds4-server"
  fi
  export DS4_SERVER_BIN
  local missing=()
  for pkg in "$@"; do
    local name="${pkg%@*}" want="${pkg##*@}"
    local have
    have=$(node -p "require('$AGENTS_DIR/npm/node_modules/$name/package.json').version" 2>/dev/null || true)
    [[ "$have" == "$want" ]] || missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    echo "installing ${missing[*]} into $AGENTS_DIR/npm" >&2
    npm install --prefix "$AGENTS_DIR/npm" --no-audit --no-fund --loglevel=error "${missing[@]}" >&2
  fi
  export PATH="$AGENTS_DIR/npm/node_modules/.bin:$PATH"
}

# agents_case NAME CTX TURN_FN: one row. TURN_FN is an exported function
# called as `TURN_FN 1 PROMPT` (a new session) and `TURN_FN 2 PROMPT`
# (continue it) in the run's work folder, with $BASE (http://127.0.0.1:PORT)
# and $HOME (a fresh home for the client's configuration) set.
agents_case() {
  local name="$1" ctx="$2" fn="$3"
  local run="$AGENTS_DIR/runs/$name"
  rm -rf "$run" && mkdir -p "$run/home" "$run/work"
  local t0=$SECONDS
  unshare --map-root-user --net -- bash -c '
    set -u
    ip link set lo up
    run="$1" ctx="$2" fn="$3"
    export BASE="http://127.0.0.1:$AGENTS_PORT" HOME="$run/home"
    "$DS4_SERVER_BIN" -m "$AGENTS_ROOT/ds4.gguf" --port "$AGENTS_PORT" --ctx "$ctx" \
      --max-tokens "$AGENTS_MAX_OUTPUT" --trace "$run/trace.jsonl" >"$run/server.log" 2>&1 &
    server=$!
    for _ in $(seq 600); do
      curl -sf "$BASE/health" >/dev/null 2>&1 && break
      kill -0 $server 2>/dev/null || { echo "server died" >"$run/codes"; exit 1; }
      sleep 0.2
    done
    cd "$run/work"
    "$fn" 1 "$AGENTS_TURN1" >"$run/turn1.out" 2>&1; c1=$?
    wc -l <"$run/trace.jsonl" >"$run/turn1.lines" 2>/dev/null
    "$fn" 2 "$AGENTS_TURN2" >"$run/turn2.out" 2>&1; c2=$?
    echo "$c1/$c2" >"$run/codes"
    kill $server; wait $server 2>/dev/null
    true
  ' agents "$run" "$ctx" "$fn"
  local secs=$((SECONDS - t0))
  local codes
  codes=$(cat "$run/codes" 2>/dev/null || echo "?")
  python3 - "$run" "$name" "$codes" "$secs" <<'PY' >>"$AGENTS_DIR/results.tsv"
import json, re, sys
run, name, codes, secs = sys.argv[1:]
events = []
try:
    with open(f"{run}/trace.jsonl") as f:
        events = [json.loads(l) for l in f if l.strip()]
except FileNotFoundError:
    pass
try:
    turn1 = int(open(f"{run}/turn1.lines").read())
except (FileNotFoundError, ValueError):
    turn1 = len(events)
prompts = [e for e in events if e["event"] == "prompt"]
calls = sum(len(e["calls"]) for e in events if e["event"] == "answer")
failed = sum(e["event"] in ("failed", "dropped") for e in events)
try:
    log = open(f"{run}/server.log", errors="replace").read()
except FileNotFoundError:
    log = ""
refused = len(re.findall(r"request answered.*status=[45]\d\d", log))
# The second turn's main request: its largest prompt.
second = [e for e in events[turn1:] if e["event"] == "cache"]
second = max(second, key=lambda e: e["prompt_tokens"], default=None)
cached = f'{second["cached_tokens"]} of {second["prompt_tokens"]}' if second else "-"
print(f"{name}\t{codes}\t{len(prompts)}\t{calls}\t{cached}\t{refused}/{failed}\t{secs}")
PY
}

# Print the rows written since agents_begin.
agents_begin() { : >"$AGENTS_DIR/results.tsv"; }
agents_table() {
  {
    printf 'client\texit (turn 1/2)\trequests\ttool calls\tturn 2 cached\trefused/failed\tseconds\n'
    cat "$AGENTS_DIR/results.tsv"
  } | column -t -s $'\t'
  echo "logs: $AGENTS_DIR/runs/<client>/ (server.log, trace.jsonl, turn1.out, turn2.out)"
}
