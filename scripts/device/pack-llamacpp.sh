#!/usr/bin/env bash
# Pack the llama.cpp sources vendored in llama-cpp-python (PyPI source
# package) into a small tarball for a GPU machine without network: only
# what a CUDA build of llama-bench and llama-batched-bench needs.
#
# Usage: scripts/device/pack-llamacpp.sh [OUT.tar.xz]
#   default OUT: .device/llama.cpp-src.tar.xz (git-ignored)
# Env: LLAMACPP_PY_VERSION (default 0.3.36).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ver="${LLAMACPP_PY_VERSION:-0.3.36}"
out="${1:-$root/.device/llama.cpp-src.tar.xz}"
src="$root/.cache/llama.cpp-$ver/src"
if [[ ! -f "$src/CMakeLists.txt" ]]; then
  # The CPU benchmark's build script downloads and unpacks the sources.
  LLAMACPP_SRC_ONLY=1 "$root/scripts/lib/build-llamacpp.sh" >/dev/null || true
fi
[[ -f "$src/CMakeLists.txt" ]] || { echo "error: no llama.cpp sources under $src (run scripts/lib/build-llamacpp.sh once)" >&2; exit 1; }
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
dst="$stage/llama.cpp"
mkdir -p "$dst/tools" "$dst/ggml/src"
cp -a "$src"/{CMakeLists.txt,cmake,src,include,common,vendor,licenses,LICENSE} "$dst/"
cp -a "$src/ggml/CMakeLists.txt" "$src/ggml/cmake" "$src/ggml/include" "$dst/ggml/"
# ggml core files plus the CPU and CUDA backends only.
find "$src/ggml/src" -maxdepth 1 -type f -exec cp -a {} "$dst/ggml/src/" \;
cp -a "$src/ggml/src/ggml-cpu" "$src/ggml/src/ggml-cuda" "$dst/ggml/src/"
for d in "$src"/ggml/src/*/; do
  n="$(basename "$d")"
  case "$n" in ggml-*) ;; *) cp -a "$d" "$dst/ggml/src/" ;; esac
done
cp -a "$src/tools/llama-bench" "$src/tools/batched-bench" "$dst/tools/"
cat > "$dst/tools/CMakeLists.txt" <<'CMAKE'
# Trimmed for benchmarking: only llama-bench and llama-batched-bench.
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(llama-bench)
add_subdirectory(batched-bench)
CMAKE
cp "$root/.cache/llama.cpp-$ver/COMMIT" "$dst/COMMIT" 2>/dev/null || true
echo "llama.cpp from llama-cpp-python $ver" > "$dst/VERSION"
mkdir -p "$(dirname "$out")"
tar -C "$stage" -cJf "$out" llama.cpp
echo "$out ($(du -h "$out" | cut -f1))"
