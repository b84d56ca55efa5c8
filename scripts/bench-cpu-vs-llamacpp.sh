#!/usr/bin/env bash
# Compare ds4's CPU backend with llama.cpp on the same GGUF, on the same machine,
# in the same run: prefill (ppN) and decode (tgN) throughput, median tok/s.
#
#   scripts/bench-cpu-vs-llamacpp.sh [-m MODEL] [-t THREADS] [-p N] [-n N] [-r N] [--no-build]
#
# Steps: fetch the default model if missing (scripts/fetch-model.sh), build
# ds4-bench (cargo, release), build llama.cpp's llama-bench once into .cache/
# (scripts/lib/build-llamacpp.sh), run both with the same -p/-n/-r/-t, and print
# one markdown table: test | ds4 tok/s | llama.cpp tok/s | ratio (ds4 / llama.cpp).
#
# Options (environment variable in brackets):
#   -m, --model PATH     GGUF model                      [BENCH_MODEL]   (default: ./ds4.gguf)
#   -t, --threads N      compute threads for both        [BENCH_THREADS] (default: nproc)
#   -p, --n-prompt N     prompt tokens for the pp test   [BENCH_PROMPT]  (default: 512)
#   -n, --n-gen N        generated tokens for tg test    [BENCH_GEN]     (default: 128)
#   -r, --repetitions N  repetitions per test            [BENCH_REPS]    (default: 3)
#       --no-build       use the existing target/release/ds4-bench as is
#
# llama-bench runs with flash attention off and its defaults otherwise; both tools
# do one warm-up before the timed repetitions. Raw outputs are kept in
# .cache/bench/<timestamp>/. Needs python3 (JSON), cargo, cmake and a C++ compiler.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

model="${BENCH_MODEL:-}"
threads="${BENCH_THREADS:-$(nproc)}"
n_prompt="${BENCH_PROMPT:-512}"
n_gen="${BENCH_GEN:-128}"
reps="${BENCH_REPS:-3}"
build_ds4=1

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case "$1" in
    -m|--model) model="$2"; shift 2 ;;
    -t|--threads) threads="$2"; shift 2 ;;
    -p|--n-prompt) n_prompt="$2"; shift 2 ;;
    -n|--n-gen) n_gen="$2"; shift 2 ;;
    -r|--repetitions) reps="$2"; shift 2 ;;
    --no-build) build_ds4=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
for v in threads reps; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "error: $v must be a positive integer, got '${!v}'" >&2; exit 2; }
done
for v in n_prompt n_gen; do
  [[ "${!v}" =~ ^[0-9]+$ ]] || { echo "error: $v must be a non-negative integer, got '${!v}'" >&2; exit 2; }
done

log() { echo "[bench] $*" >&2; }

# --- model -----------------------------------------------------------------
if [[ -z "$model" ]]; then
  model="$root/ds4.gguf"
  [[ -e "$model" ]] || { log "default model missing, fetching it"; scripts/fetch-model.sh >/dev/null; }
fi
[[ -f "$model" ]] || { echo "error: model not found: $model" >&2; exit 1; }
model="$(readlink -f "$model")"

# --- ds4 -------------------------------------------------------------------
ds4_bench="$root/target/release/ds4-bench"
if ((build_ds4)); then
  log "building ds4-bench (cargo build --release -p ds4-inference-worker)"
  cargo build --release -p ds4-inference-worker >&2
fi
[[ -x "$ds4_bench" ]] || { echo "error: $ds4_bench not found (build it or drop --no-build)" >&2; exit 1; }
ds4_commit="$(git -C "$root" describe --always --dirty --abbrev=7 2>/dev/null || echo unknown)"

# --- llama.cpp -------------------------------------------------------------
llama_bench="$(scripts/lib/build-llamacpp.sh)"
llama_version="$(cat "$(dirname "$(dirname "$(dirname "$llama_bench")")")/VERSION")"

# --- run -------------------------------------------------------------------
# Other processes on the machine skew both engines (llama.cpp's spinning thread
# pool suffers most). Measure how much CPU time others took during the run:
# busy ticks of the whole machine minus the ticks of this script's children.
busy_ticks() { awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat 2>/dev/null || echo 0; }
child_ticks() { awk '{print $16+$17}' "/proc/$$/stat" 2>/dev/null || echo 0; }
busy0=$(busy_ticks); kids0=$(child_ticks); t0=$(date +%s)
out="$root/.cache/bench/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out"
log "ds4-bench: -p $n_prompt -n $n_gen -r $reps -t $threads on $(basename "$model")"
if ! "$ds4_bench" -m "$model" -p "$n_prompt" -n "$n_gen" -r "$reps" -t "$threads" --json \
    >"$out/ds4.jsonl" 2>"$out/ds4.log"; then
  cat "$out/ds4.log" >&2; echo "error: ds4-bench failed (log: $out/ds4.log)" >&2; exit 1
fi
log "llama-bench: -p $n_prompt -n $n_gen -r $reps -t $threads -fa off"
if ! "$llama_bench" -m "$model" -p "$n_prompt" -n "$n_gen" -r "$reps" -t "$threads" -fa off -o json \
    >"$out/llamacpp.json" 2>"$out/llamacpp.log"; then
  tail -n 30 "$out/llamacpp.log" >&2; echo "error: llama-bench failed (log: $out/llamacpp.log)" >&2; exit 1
fi

busy1=$(busy_ticks); kids1=$(child_ticks); t1=$(date +%s)
hz=$(getconf CLK_TCK 2>/dev/null || echo 100)
others=$(( (busy1 - busy0 - (kids1 - kids0)) * 100 / (hz * $(nproc) * (t1 - t0 > 0 ? t1 - t0 : 1)) ))
((others >= 0)) || others=0
if ((others > 5)); then
  log "warning: other processes used ${others}% of the machine during the run; the numbers are skewed, rerun on a quiet machine"
fi

# --- report ----------------------------------------------------------------
cpu="$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//' || true)"
[[ -n "$cpu" ]] || cpu="$(uname -m)"
simd="$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | grep -o -w -E 'avx512f|avx2' | sort -u | paste -sd, - || true)"

info="machine: $cpu, $(nproc) logical CPUs${simd:+ ($simd)}, $(uname -sm); threads: $threads; \
date: $(date -u '+%Y-%m-%d %H:%M UTC'); model: $(basename "$model")@@WEIGHTS@@; \
ds4 $ds4_commit; $llama_version; medians of $reps repetitions; other load during run: ${others}%"

python3 - "$out/ds4.jsonl" "$out/llamacpp.json" "$info" <<'PY' | tee "$out/table.md"
import json, sys

def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]  # same convention as ds4-bench (upper median for even counts)

ds4 = {}
for line in open(sys.argv[1]):
    line = line.strip()
    if line:
        r = json.loads(line)
        ds4[r["test"]] = median(r["samples"]) if r.get("samples") else r["tokens_per_s"]

llama, weights = {}, None
for r in json.load(open(sys.argv[2])):
    if r["n_prompt"] > 0 and r["n_gen"] == 0:
        test = "pp%d" % r["n_prompt"]
    elif r["n_gen"] > 0 and r["n_prompt"] == 0:
        test = "tg%d" % r["n_gen"]
    else:
        test = "pp%d+tg%d" % (r["n_prompt"], r["n_gen"])
    llama[test] = median(r["samples_ts"])
    weights = r.get("model_size", weights)

tests = list(ds4) + [t for t in llama if t not in ds4]
print()
print("| test | ds4 tok/s | llama.cpp tok/s | ratio (ds4 / llama.cpp) |")
print("| --- | ---: | ---: | ---: |")
for t in tests:
    a, b = ds4.get(t), llama.get(t)
    fa = "%.1f" % a if a is not None else "-"
    fb = "%.1f" % b if b is not None else "-"
    ratio = "%.2f" % (a / b) if a and b else "-"
    print(f"| {t} | {fa} | {fb} | {ratio} |")
print()
w = " (%.1f MB of weights)" % (weights / 1e6) if weights else ""
print(sys.argv[3].replace("@@WEIGHTS@@", w))
PY
log "raw results: ${out#"$root"/}"
