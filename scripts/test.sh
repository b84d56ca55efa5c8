#!/usr/bin/env bash
# Run every test of the workspace on this machine (no GPU needed):
# fetch the default model if missing, build the binaries the end-to-end
# tests start, then run all tests. Extra arguments go to `cargo test`.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
./scripts/fetch-model.sh >/dev/null
export DS4_TEST_MODEL="$root/ds4.gguf"
# The end-to-end tests in tests/ start these binaries.
cargo build --workspace --bins
cargo test --workspace "$@"
