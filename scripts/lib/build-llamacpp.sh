#!/usr/bin/env bash
# Build llama.cpp's `llama-bench` (CPU only, native arch) from the llama.cpp copy
# vendored in the llama-cpp-python source distribution on PyPI.
#
# Usage: scripts/lib/build-llamacpp.sh
#   prints the path of the llama-bench binary on stdout (progress goes to stderr).
#
# Environment:
#   LLAMACPP_PY_VERSION  llama-cpp-python release whose vendored llama.cpp is built
#                        (default: 0.3.36)
#   LLAMACPP_JOBS        parallel build jobs (default: nproc)
#   LLAMACPP_SRC_ONLY    when set, fetch and unpack the sources and stop (for
#                        scripts/device/pack-llamacpp.sh); nothing is printed
#
# Layout (git-ignored):
#   .cache/llama.cpp-<LLAMACPP_PY_VERSION>/src/      vendored llama.cpp sources
#   .cache/llama.cpp-<LLAMACPP_PY_VERSION>/build/    cmake build dir (bin/llama-bench)
#   .cache/llama.cpp-<LLAMACPP_PY_VERSION>/VERSION   "llama.cpp <commit> (llama-cpp-python <ver>)"
#
# Idempotent: an existing build is reused as is. Delete the directory to rebuild.
# Needs cmake and a C/C++ compiler. When cmake is missing and the script runs as
# root on a system with apt-get, it installs cmake; otherwise it tells you how.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
py_ver="${LLAMACPP_PY_VERSION:-0.3.36}"
jobs="${LLAMACPP_JOBS:-$(nproc)}"
cache="$root/.cache/llama.cpp-$py_ver"
src="$cache/src"
build="$cache/build"
bin="$build/bin/llama-bench"

log() { echo "[build-llamacpp] $*" >&2; }

if [[ -x "$bin" && -f "$cache/VERSION" ]]; then
  log "reusing $bin ($(cat "$cache/VERSION"))"
  echo "$bin"
  exit 0
fi

# --- sources ---------------------------------------------------------------
if [[ ! -f "$src/CMakeLists.txt" || ! -f "$cache/COMMIT" ]]; then
  mkdir -p "$cache"
  tmp="$(mktemp -d "$cache/dl.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  log "downloading llama-cpp-python==$py_ver source distribution ..."
  # The sdist straight from the package index's simple page: `pip download
  # --no-binary` would build cmake and ninja from source only to read its
  # metadata.
  python3 - "$py_ver" "$tmp" >&2 <<'PY'
import hashlib, os, re, sys, urllib.request
ver, dst = sys.argv[1], sys.argv[2]
name = f"llama_cpp_python-{ver}.tar.gz"
with urllib.request.urlopen("https://pypi.org/simple/llama-cpp-python/", timeout=60) as r:
    page = r.read().decode()
m = re.search(r'href="([^"#]*/' + re.escape(name) + r')#sha256=([0-9a-f]{64})"', page)
if not m:
    sys.exit(f"error: {name} is not on the index")
path = os.path.join(dst, name)
urllib.request.urlretrieve(m.group(1), path)
digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
if digest != m.group(2):
    sys.exit(f"error: {name}: sha256 {digest}, the index says {m.group(2)}")
print(f"{name}: {os.path.getsize(path)} bytes, sha256 ok", file=sys.stderr)
PY
  sdist="$(ls "$tmp"/llama_cpp_python-*.tar.gz)"
  top="llama_cpp_python-$py_ver"
  log "unpacking vendor/llama.cpp ..."
  mkdir -p "$tmp/x"
  # The sdist carries the submodule's git metadata; only its HEAD (the commit) is needed.
  tar -xzf "$sdist" -C "$tmp/x" --wildcards \
    "$top/vendor/llama.cpp/*" "$top/.git/modules/vendor/llama.cpp/HEAD"
  commit="$(head -c 40 "$tmp/x/$top/.git/modules/vendor/llama.cpp/HEAD" 2>/dev/null || true)"
  [[ "$commit" =~ ^[0-9a-f]{40}$ ]] || commit="unknown"
  rm -rf "$src" "$build"
  mv "$tmp/x/$top/vendor/llama.cpp" "$src"
  echo "$commit" > "$cache/COMMIT"
  rm -rf "$tmp"
  trap - EXIT
fi
commit="$(cat "$cache/COMMIT")"
short="${commit:0:7}"
[[ -n "${LLAMACPP_SRC_ONLY:-}" ]] && { log "sources of llama.cpp $short in $src"; exit 0; }

# --- toolchain -------------------------------------------------------------
need_apt=()
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
{ command -v c++ >/dev/null 2>&1 && command -v cc >/dev/null 2>&1; } || need_apt+=(build-essential)
if ((${#need_apt[@]})); then
  if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    log "installing ${need_apt[*]} with apt-get"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >&2
  else
    log "error: missing ${need_apt[*]}."
    log "  Debian/Ubuntu: sudo apt-get update && sudo apt-get install -y ${need_apt[*]}"
    log "  Fedora:        sudo dnf install -y cmake gcc-c++"
    log "  macOS:         brew install cmake"
    exit 1
  fi
fi

# --- build -----------------------------------------------------------------
# The sources are not a git checkout, so cmake's git probes print "not a git
# repository" and ggml reports commit "unknown"; the commit is passed explicitly.
log "configuring llama.cpp $short (CPU only, GGML_NATIVE=ON) ..."
cmake -S "$src" -B "$build" \
  -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=ON \
  -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF \
  -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_COMMON=ON \
  -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_COMMIT="$short" \
  -DLLAMA_BUILD_NUMBER=0 >&2
log "building llama-bench with $jobs job(s); this takes several minutes ..."
start=$(date +%s)
cmake --build "$build" --config Release --target llama-bench -j "$jobs" >&2
log "built in $(( $(date +%s) - start ))s: $bin"
echo "llama.cpp $short (vendored in llama-cpp-python $py_ver)" > "$cache/VERSION"
echo "$bin"
