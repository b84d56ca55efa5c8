#!/usr/bin/env bash
# Run every test of the workspace on this machine (no GPU needed):
# fetch the default model if missing, build the binaries the end-to-end
# tests start, then run all tests, then the API compatibility tests with
# the official Python SDKs (tests/python/run.sh: needs python3; installs
# the SDKs into the git-ignored .cache/venv-test). Extra arguments go to
# `cargo test`.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
./scripts/fetch-model.sh >/dev/null
export DS4_TEST_MODEL="$root/ds4.gguf"
# The deepseek4 tests run on a miniature model generated from a committed script.
DS4_TINY_DIR="$(./scripts/gen-ds4-tiny.sh)"
export DS4_TINY_DIR
# The end-to-end tests in tests/ start these binaries.
cargo build --workspace --bins
cargo test --workspace "$@"
# The CUDA kernels compile with NVRTC for sm_90 and sm_120 (no GPU needed:
# NVRTC 13.0 comes from PyPI into the git-ignored .cache/venv-nvrtc).
NVRTC_DIR="$(./scripts/lib/fetch-nvrtc.sh)"
LD_LIBRARY_PATH="$NVRTC_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" DS4_REQUIRE_NVRTC=1 \
    cargo test -p ds4-kernels --features cuda --test cuda_compile
# The official openai/anthropic SDKs against a real ds4-server.
DS4_SERVER_BIN="$root/target/debug/ds4-server" ./tests/python/run.sh
