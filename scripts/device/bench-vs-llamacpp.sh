#!/usr/bin/env bash
# ds4 against llama.cpp on one NVIDIA GPU, same GGUF, same run.
#
#   scripts/device/bench-vs-llamacpp.sh --build          # build llama.cpp (CUDA) once, ~5 min
#   scripts/device/bench-vs-llamacpp.sh MODEL [LABEL]    # run both engines, print one table
#   DS4_ONLY=1 scripts/device/bench-vs-llamacpp.sh MODEL  # ds4 alone (while iterating)
#
# The build unpacks the llama.cpp sources packed by
# scripts/device/pack-llamacpp.sh (LLAMA_SRC, default
# .device/llama.cpp-src.tar.xz) into WORK (default /tmp/ds4-llamacpp) and
# builds llama-bench and llama-batched-bench for CUDA_ARCH (default 90).
# The run uses ds4-bench from BIN (default .device/bin) with --device cuda.
# Tests: decode at batch 1 (tg128), prefill of 512 and 4,096 tokens
# (pp512, pp4096), aggregate decode of 16 and 64 concurrent streams
# (64-token prompts, 128 generated tokens each). Logs go to OUT (default
# /tmp/ds4-bench-logs). QUICK=1 runs only tg128 and pp512, once each,
# and no stream tests.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
work="${WORK:-/tmp/ds4-llamacpp}"
bin="${BIN:-$root/.device/bin}"
out="${OUT:-/tmp/ds4-bench-logs}"
arch="${CUDA_ARCH:-90}"
reps="${REPS:-3}"
mkdir -p "$out"
lbuild="$work/llama.cpp/build"

if [[ "${1:-}" == "--build" ]]; then
  rm -rf "$work"; mkdir -p "$work"
  tar -C "$work" -xJf "${LLAMA_SRC:-$root/.device/llama.cpp-src.tar.xz}"
  export PATH="/usr/local/cuda/bin:$PATH"
  cmake -S "$work/llama.cpp" -B "$lbuild" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
    -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >"$out/llama-cmake.log" 2>&1
  cmake --build "$lbuild" -j "$(nproc)" --target llama-bench llama-batched-bench >"$out/llama-build.log" 2>&1
  echo "built: $(ls "$lbuild/bin")"
  exit 0
fi

model="${1:?usage: $0 MODEL [LABEL] | --build}"
label="${2:-$(basename "$model")}"
ds4_only="${DS4_ONLY:-0}"
prompts=512,4096
[[ "${QUICK:-0}" == 1 ]] && { prompts=512; reps=1; }
if [[ "$ds4_only" != 1 ]]; then
  [[ -x "$lbuild/bin/llama-bench" ]] || { echo "error: llama.cpp is not built; run $0 --build first" >&2; exit 1; }
fi
export LD_LIBRARY_PATH="$lbuild/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
rm -f "$out"/ds4-single.jsonl "$out"/ds4-streams.jsonl "$out"/llama-bench.json "$out"/llama-batched.txt

echo "== ds4-bench (single sequence)" >&2
"$bin/ds4-bench" -m "$model" --device cuda -p "$prompts" -n 128 -r "$reps" --json >"$out/ds4-single.jsonl" 2>"$out/ds4-single.log"
if [[ "${QUICK:-0}" != 1 ]]; then
  echo "== ds4-bench (concurrent streams)" >&2
  "$bin/ds4-bench" -m "$model" --device cuda --concurrency 1,16,64 --stream-prompt 64 --gen 128 --json \
    >"$out/ds4-streams.jsonl" 2>"$out/ds4-streams.log"
fi
if [[ "$ds4_only" != 1 ]]; then
echo "== llama-bench" >&2
"$lbuild/bin/llama-bench" -m "$model" -ngl 99 -fa 1 -p 512,4096 -n 128 -r "$reps" -o json \
  >"$out/llama-bench.json" 2>"$out/llama-bench.log"
echo "== llama-batched-bench" >&2
"$lbuild/bin/llama-batched-bench" -m "$model" -ngl 99 -fa on -c 16384 -b 2048 -ub 512 \
  -npp 64 -ntg 128 -npl 1,16,64 >"$out/llama-batched.txt" 2>"$out/llama-batched.log"
fi

python3 - "$out" "$label" <<'PY'
import json, os, sys, re
out, label = sys.argv[1], sys.argv[2]
def lines(name):
    path = f"{out}/{name}"
    return open(path).read().splitlines() if os.path.exists(path) else []
ds4 = {}
for line in lines("ds4-single.jsonl"):
    r = json.loads(line); ds4[r["test"]] = r["tokens_per_s"]
for line in lines("ds4-streams.jsonl"):
    r = json.loads(line)
    if r.get("bench") == "concurrency":
        ds4[f"agg{r['streams']}"] = r["aggregate_tps"]
ll = {}
for r in json.loads("\n".join(lines("llama-bench.json")) or "[]"):
    n_p, n_g = r["n_prompt"], r["n_gen"]
    ll[f"pp{n_p}" if n_g == 0 else f"tg{n_g}"] = r["avg_ts"]
for line in lines("llama-batched.txt"):
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) >= 8 and cells[0].isdigit():
        # PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | ...
        ll[f"agg{int(cells[2])}"] = float(cells[7])
rows = [("decode, batch 1 (tg128)", "tg128"), ("prefill 512 (pp512)", "pp512"),
        ("prefill 4096 (pp4096)", "pp4096"), ("aggregate decode, 16 streams", "agg16"),
        ("aggregate decode, 64 streams", "agg64")]
print(f"\n{label}")
print("| test | ds4 tok/s | llama.cpp tok/s | ds4 / llama.cpp |")
print("| --- | ---: | ---: | ---: |")
for name, key in rows:
    a, b = ds4.get(key), ll.get(key)
    ratio = f"{a / b:.2f}" if a and b else "-"
    fa = f"{a:.1f}" if a else "-"
    fb = f"{b:.1f}" if b else "-"
    print(f"| {name} | {fa} | {fb} | {ratio} |")
PY
