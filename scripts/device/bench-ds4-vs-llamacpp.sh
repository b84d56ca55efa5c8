#!/usr/bin/env bash
# DeepSeek V4 Flash at full size against llama.cpp on one NVIDIA GPU: the
# synthetic q2 file (scripts/gen-synth-ds4-flash.sh) in /dev/shm, both
# engines on it in the same run, one table.
#
#   scripts/device/bench-ds4-vs-llamacpp.sh [PHASE ...]
#
# Phases, in this order when none is named:
#   build   start the llama.cpp CUDA build in the background (as
#           scripts/device/bench-vs-llamacpp.sh --build does; about 5
#           minutes) unless it is built; `llama` waits for it
#   file    write the file into /dev/shm unless it is there (about a minute)
#   ds4     ds4-bench: prefill (PROMPTS), decode of 128 tokens after a
#           one-token prompt and at each of DEPTHS, GPU memory, the copy
#           bandwidth; with PROFILE=1 also the per-kernel tables of a
#           decode step and of a prefill chunk (ds4-bench --profile)
#   llama   llama-bench on the same file: the same prefills and depths
#           (LLAMA_DEPTHS; the 128K depth is ds4's alone by default)
#   table   print the table of what the phases before measured
#
# Env: BIN (release ds4-bench and the cuda_perf test, default .device/bin),
# GEN (what `scripts/gen-synth-ds4-flash.sh prepare` wrote, default
# .cache/synth-ds4-flash), DS4_FLASH_FILE (default /dev/shm/ds4-flash-q2.gguf),
# LAYERS (write only the first N blocks: a smaller file of the same
# shapes, for kernel work), OUT (logs and results, default
# /tmp/ds4-flash-bench), REPS (default 5; medians), PROMPTS (default
# 512,4096,16384), DEPTHS (default 32768,131072), LLAMA_DEPTHS (default
# 32768), WORK (the llama.cpp build, default /tmp/ds4-llamacpp), and the
# ds4 flags in DS4_FLAGS (e.g. --cuda-kernel-dir kernels/cuda).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${BIN:-$root/.device/bin}"
gen="${GEN:-$root/.cache/synth-ds4-flash}"
file="${DS4_FLASH_FILE:-/dev/shm/ds4-flash-q2.gguf}"
out="${OUT:-/tmp/ds4-flash-bench}"
work="${WORK:-/tmp/ds4-llamacpp}"
reps="${REPS:-5}"
prompts="${PROMPTS:-512,4096,16384}"
depths="${DEPTHS-32768,131072}"
llama_depths="${LLAMA_DEPTHS:-32768}"
lbin="$work/llama.cpp/build/bin"
mkdir -p "$out"
export NO_COLOR=1
say() { echo "[$(date +%T)] $*" >&2; }

phase_build() {
  if [[ -x "$lbin/llama-bench" ]]; then say "llama.cpp is built"; return; fi
  if [[ -e "$out/llama-build.pid" ]] && kill -0 "$(cat "$out/llama-build.pid")" 2>/dev/null; then
    say "llama.cpp is building"; return
  fi
  say "building llama.cpp in the background (log $out/llama-build.out)"
  WORK="$work" OUT="$out" setsid nohup "$root/scripts/device/bench-vs-llamacpp.sh" --build \
    >"$out/llama-build.out" 2>&1 </dev/null &
  echo $! >"$out/llama-build.pid"
}

phase_file() {
  if [[ -s "$file" ]]; then say "file: $file is there"; return; fi
  local opts=(--threads "$(nproc)")
  [[ -n "${LAYERS:-}" ]] && opts+=(--layers "$LAYERS")
  local t0=$SECONDS
  "$gen/synth_gguf" fill "$gen/ds4-flash.header.gguf" "$file" "${opts[@]}" >"$out/fill.log" 2>&1 ||
    { cat "$out/fill.log" >&2; exit 1; }
  say "file written in $((SECONDS - t0)) s: $(stat -c %s "$file") bytes"
}

# The largest GPU memory use while a command runs, in MiB, into $out/$1.
watch_memory() {
  local max=0 m
  while :; do
    m=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1)
    [[ -n "$m" && "$m" -gt "$max" ]] && { max=$m; echo "$max" >"$out/$1"; }
    sleep 1
  done
}

phase_ds4() {
  [[ -s "$file" ]] || { echo "error: no $file (run the file phase)" >&2; exit 1; }
  say "ds4: copy bandwidth"
  "$bin/cuda_perf" --ignored --exact perf_copy_bandwidth --nocapture >"$out/copy.log" 2>&1
  grep '^PERF copy' "$out/copy.log" >&2
  local profile=()
  [[ "${PROFILE:-0}" == 1 ]] && profile=(--profile)
  local all_depths="0${depths:+,$depths}"
  say "ds4-bench: prefill $prompts, decode at depths $all_depths, $reps repetitions ${profile[*]}"
  watch_memory ds4-gpu-mib & local watcher=$!
  # shellcheck disable=SC2086
  "$bin/ds4-bench" -m "$file" --device cuda -p "$prompts" -n 128 -d "$all_depths" -r "$reps" \
    --json "${profile[@]}" ${DS4_FLAGS:-} >"$out/ds4.out" 2>"$out/ds4.log"
  local rc=$?
  kill "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null
  [[ $rc -eq 0 ]] || { say "ds4-bench failed (rc $rc)"; tail -20 "$out/ds4.log" >&2; }
  grep '^{' "$out/ds4.out" >"$out/ds4.jsonl" || true
  grep -v '^{' "$out/ds4.out" >"$out/ds4-profile.txt" || true
}

phase_llama() {
  [[ -s "$file" ]] || { echo "error: no $file (run the file phase)" >&2; exit 1; }
  for _ in $(seq 1 900); do
    [[ -x "$lbin/llama-bench" ]] && break
    [[ -e "$out/llama-build.pid" ]] && kill -0 "$(cat "$out/llama-build.pid")" 2>/dev/null || break
    sleep 1
  done
  [[ -x "$lbin/llama-bench" ]] || { echo "error: llama.cpp is not built (see $out/llama-build.out)" >&2; return 1; }
  export LD_LIBRARY_PATH="$lbin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  say "llama-bench: prefill $prompts and tg128, $reps repetitions"
  "$lbin/llama-bench" -m "$file" -ngl 99 -fa 1 -p "$prompts" -n 128 -r "$reps" -o json \
    >"$out/llama.json" 2>"$out/llama.log" || { say "llama-bench failed"; tail -5 "$out/llama.log" >&2; }
  if [[ -n "$llama_depths" ]]; then
    say "llama-bench: tg128 at depths $llama_depths"
    "$lbin/llama-bench" -m "$file" -ngl 99 -fa 1 -p 0 -n 128 -d "$llama_depths" -r "$reps" -o json \
      >"$out/llama-depth.json" 2>"$out/llama-depth.log" || { say "llama-bench (depth) failed"; tail -5 "$out/llama-depth.log" >&2; }
  fi
}

phase_table() {
  python3 - "$out" "$gen/ds4-flash.header.gguf" "$file" "$reps" <<'PY'
import json, os, struct, sys
out, header, model, reps = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]

def gguf_tensors(path):
    """(name, dims, type) of every tensor, and the metadata, of a GGUF header."""
    f = open(path, "rb")
    rd = lambda fmt: struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))[0]
    rs = lambda: f.read(rd("Q")).decode("utf-8", "replace")
    assert f.read(4) == b"GGUF", path
    rd("I")
    n_t, n_kv = rd("Q"), rd("Q")
    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    def val(t):
        if t == 8: return rs()
        if t == 9:
            et, n = rd("I"), rd("Q")
            return [val(et) for _ in range(n)]
        return rd(scalar[t])
    meta = {}
    for _ in range(n_kv):
        k = rs(); meta[k] = val(rd("I"))
    ts = []
    for _ in range(n_t):
        name = rs(); nd = rd("I"); dims = [rd("Q") for _ in range(nd)]; ty = rd("I"); rd("Q")
        ts.append((name, dims, ty))
    return ts, meta

# ggml type id: (values per block, bytes per block)
BLOCK = {0: (1, 4), 1: (1, 2), 8: (32, 34), 10: (256, 84), 12: (256, 144), 16: (256, 66), 26: (1, 4)}
def decode_bytes():
    """Weight bytes one decoded token reads: every tensor but the embedding
    (one row) and the routed experts (k of n per layer)."""
    if not os.path.exists(header):
        return None
    ts, meta = gguf_tensors(header)
    arch = meta.get("general.architecture", "deepseek4")
    k, n = meta[f"{arch}.expert_used_count"], meta[f"{arch}.expert_count"]
    layers = sum(1 for t in ts if t[0].endswith("attn_norm.weight"))
    if os.path.exists(model):  # a file cut to fewer blocks (LAYERS)
        try:
            layers = sum(1 for t in gguf_tensors(model)[0] if t[0].endswith("attn_norm.weight"))
        except Exception:
            pass
    total = 0.0
    for name, dims, ty in ts:
        if name.startswith("blk."):
            if int(name.split(".")[1]) >= layers:
                continue
        per, size = BLOCK[ty]
        elems = 1
        for d in dims: elems *= d
        b = elems // per * size
        if name == "token_embd.weight":
            b = b // dims[1]
        elif "_exps" in name:
            b = b * k / n
        total += b
    return total, layers

def lines(name):
    p = os.path.join(out, name)
    return open(p).read().splitlines() if os.path.exists(p) else []
ds4 = {}
for l in lines("ds4.jsonl"):
    r = json.loads(l); ds4[r["test"]] = r["tokens_per_s"]
ll = {}
for name in ("llama.json", "llama-depth.json"):
    p = os.path.join(out, name)
    if not os.path.exists(p):
        continue
    try:
        rows = json.load(open(p))
    except Exception:
        continue
    for r in rows:
        d, npp, ng = r.get("n_depth", 0), r["n_prompt"], r["n_gen"]
        test = f"pp{npp}" if ng == 0 else (f"tg{ng}" if d == 0 else f"tg{ng}@d{d}")
        if d and ng == 0:
            test += f"@d{d}"
        ll[test] = r["avg_ts"] if "samples_ts" not in r else sorted(r["samples_ts"])[len(r["samples_ts"]) // 2]
tests = ["tg128"] + sorted([t for t in set(ds4) | set(ll) if t.startswith("tg128@")],
                           key=lambda t: int(t.split("@d")[1])) \
        + sorted([t for t in set(ds4) | set(ll) if t.startswith("pp")], key=lambda t: int(t[2:]))
print(f"\n| DeepSeek V4 Flash q2 (synthetic), medians of {reps} | ds4 tok/s | llama.cpp tok/s | ds4 / llama.cpp |")
print("| --- | ---: | ---: | ---: |")
for t in tests:
    a, b = ds4.get(t), ll.get(t)
    fa = f"{a:.1f}" if a else "-"
    fb = f"{b:.1f}" if b else "-"
    fr = f"{a / b:.2f}x" if a and b else "-"
    label = t.replace("@d", " at context ")
    print(f"| {label} | {fa} | {fb} | {fr} |")
extra = []
db = decode_bytes()
copy = None
for l in lines("copy.log"):
    if l.startswith("PERF copy"):
        copy = float(l.split()[4])
if db:
    b, layers = db
    extra.append(("weight bytes a decoded token reads", f"{b / 1e9:.2f} GB ({layers} layers)"))
    if copy:
        extra.append(("copy bandwidth (device to device, read + write)", f"{copy:.0f} GB/s"))
    for t in ["tg128"] + [t for t in tests if t.startswith("tg128@")]:
        if t in ds4:
            bw = b * ds4[t] / 1e9
            share = f", {100 * bw / copy:.0f}% of the copy bandwidth" if copy else ""
            extra.append((f"ds4 {t.replace('@d', ' at context ')}: weight bytes per second",
                          f"{bw:.0f} GB/s{share}"))
        if t in ll:
            bw = b * ll[t] / 1e9
            share = f", {100 * bw / copy:.0f}%" if copy else ""
            extra.append((f"llama.cpp {t.replace('@d', ' at context ')}: weight bytes per second",
                          f"{bw:.0f} GB/s{share}"))
    if copy:
        extra.append(("decode floor at the copy bandwidth", f"{copy * 1e9 / b:.0f} tok/s"))
for l in lines("ds4-gpu-mib"):
    extra.append(("ds4: most GPU memory used during the run", f"{int(l)} MiB"))
if extra:
    print("\n| measure | value |\n| --- | --- |")
    for k, v in extra:
        print(f"| {k} | {v} |")
PY
}

phases=("$@")
[[ ${#phases[@]} -eq 0 ]] && phases=(build file ds4 llama table)
for p in "${phases[@]}"; do
  case "$p" in
    build) phase_build ;;
    file) phase_file ;;
    ds4) phase_ds4 ;;
    llama) phase_llama ;;
    table) phase_table ;;
    *) echo "unknown phase $p (build, file, ds4, llama, table)" >&2; exit 2 ;;
  esac
done
