#!/usr/bin/env bash
# CUDA backend tests on an NVIDIA GPU: the ignored parity tests of
# kernels/tests/cuda_parity.rs (every op against the CPU reference),
# cuda_hyper.rs (hyper-connections, tail RoPE, roundings),
# cuda_compressed.rs (compressed attention) and cuda_moe.rs (routing,
# routed experts, grouped projections, the expert weight types) and,
# when DS4_TEST_MODEL names the SmolLM2 GGUF, the end-to-end tests of
# inference-worker/tests/cuda_e2e.rs (CPU parity, CUDA graph replay), and
# when DS4_TINY_DIR names a folder of scripts/gen-ds4-tiny.sh's models,
# inference-worker/tests/cuda_ds4.rs (DeepSeek V4 against the references).
#
#   scripts/device/cuda-tests.sh --build   # dev machine: build, strip and
#                                          # copy the test binaries to .device/bin
#   scripts/device/cuda-tests.sh           # GPU machine, from the repo root
#
# On the GPU machine it runs .device/bin/cuda_compile, then cuda_parity,
# cuda_hyper, cuda_compressed, cuda_moe and cuda_perf (timings only) with `--ignored
# --test-threads=1`, writes every log under $OUT (default .device/out),
# and prints a pass/fail table last; exits non-zero if a
# test failed. No CUDA toolkit is needed there beyond the driver and
# libnvrtc.so.13 (both dlopened). Kernel PTX is cached in $DS4_KERNEL_CACHE
# (default $OUT/kernel-cache, so the log shows a cold and a warm start).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="$root/.device/bin"

if [[ "${1:-}" == "--build" ]]; then
    set -e
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target/cuda}"
    mkdir -p "$bin"
    log="$(mktemp)"
    (cd "$root" && cargo test -p ds4-kernels --features cuda --release --no-run \
        --test cuda_parity --test cuda_hyper --test cuda_compressed --test cuda_moe --test cuda_compile --test cuda_perf 2>&1 | tee "$log" >&2)
    (cd "$root" && cargo test -p ds4-inference-worker --release --no-run \
        --test cuda_e2e --test cuda_ds4 2>&1 | tee -a "$log" >&2)
    for t in cuda_parity cuda_hyper cuda_compressed cuda_moe cuda_compile cuda_perf cuda_e2e cuda_ds4; do
        exe="$(sed -n "s|.*Executable tests/$t.rs (\(.*\))|\1|p" "$log" | tail -n1)"
        [[ "$exe" = /* ]] || exe="$root/$exe"
        cp "$exe" "$bin/$t"
        strip "$bin/$t"
        ls -l "$bin/$t" >&2
    done
    rm -f "$log"
    exit 0
fi

out="${OUT:-$root/.device/out}"
mkdir -p "$out"
export DS4_KERNEL_CACHE="${DS4_KERNEL_CACHE:-$out/kernel-cache}"
export NO_COLOR=1
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv >"$out/gpu.txt" 2>&1 || true

status=0
tests=(cuda_compile cuda_parity cuda_hyper cuda_compressed cuda_moe cuda_perf)
[[ -n "${DS4_TEST_MODEL:-}" ]] && tests+=(cuda_e2e)
[[ -n "${DS4_TINY_DIR:-}" ]] && tests+=(cuda_ds4)
# DS4_CUDA_TESTS="cuda_parity cuda_ds4" runs only those.
[[ -n "${DS4_CUDA_TESTS:-}" ]] && read -ra tests <<<"$DS4_CUDA_TESTS"
for t in "${tests[@]}"; do
    exe="$bin/$t"
    if [[ ! -x "$exe" ]]; then
        echo "missing $exe (run scripts/device/cuda-tests.sh --build first)" | tee -a "$out/summary.log"
        status=1
        continue
    fi
    args=(--test-threads=1 --show-output)
    [[ "$t" != cuda_compile ]] && args+=(--ignored)
    start=$SECONDS
    DS4_REQUIRE_NVRTC=1 "$exe" "${args[@]}" >"$out/$t.log" 2>&1
    rc=$?
    echo "$t: rc=$rc in $((SECONDS - start))s" >>"$out/summary.log"
    [[ $rc -ne 0 ]] && status=1
done

# Measured tolerances, then the pass/fail table.
grep -h '^PARITY' "$out"/cuda_parity.log "$out"/cuda_hyper.log "$out"/cuda_compressed.log "$out"/cuda_moe.log >"$out/parity.txt" 2>/dev/null || true
grep -h '^PERF' "$out"/cuda_perf.log >"$out/perf.txt" 2>/dev/null || true
grep -h 'CudaBackend::new' "$out"/cuda_parity.log 2>/dev/null || true
echo
cat "$out/parity.txt"
echo
cat "$out/perf.txt"
echo
echo "test                                              result"
grep -hE '^test .* \.\.\. (ok|FAILED|ignored)' "$out"/cuda_*.log 2>/dev/null \
    | sed -E 's/^test (.*) \.\.\. (.*)$/\1|\2/' | awk -F'|' '{ printf "%-50s %s\n", $1, $2 }'
cat "$out/summary.log"
exit $status
