#!/usr/bin/env bash
# A SYNTHETIC full-size DeepSeek V4 Flash GGUF for GPU performance runs:
# every metadata key and all 1,328 tensors of the published Flash layout
# (43 layers, 284 B parameters) with the q2 file's types (routed experts
# IQ2_XXS gate/up and Q2_K down, Q8_0 projections, F16 embedding and
# hyper-connection/compressor/indexer weights: 80.76 GiB of tensors) or,
# with --experts q4, the q4 file's (Q4_K experts: 153.32 GiB), DeepSeek
# V4's real tokenizer, and random but valid blocks. Speed does not depend
# on the weight values (routing aside: the hash layers send each token to
# six distinct experts spread evenly, and the random routers spread the
# other layers' tokens about uniformly, which a trained model does not);
# its outputs mean nothing, and the file says so in general.name
# ("synthetic DeepSeek V4 Flash layout (random weights)").
#
# Two steps, because the GPU machine has no network and maybe no cargo:
#
#   scripts/gen-synth-ds4-flash.sh prepare [DIR] [--experts q2|q4]
#       On the dev machine. Makes DeepSeek V4's tokenizer GGUF
#       (scripts/gen-ds4-tiny.sh), builds model/examples/synth_gguf
#       (release) and writes to DIR (default .cache/synth-ds4-flash,
#       git-ignored):
#         ds4-flash.header.gguf  the header alone (about 5 MB)
#         synth_gguf             the generator (release, stripped)
#
#   scripts/gen-synth-ds4-flash.sh fill OUT.gguf [DIR] [-- FILL_OPTIONS]
#       Anywhere DIR was carried to. Writes the file with every core
#       (--threads T), prints the rate, then validates the deepseek4
#       family contract and binds it on the CPU backend. FILL_OPTIONS go to
#       `synth_gguf fill`: --layers N (the first N blocks: a smaller file
#       of the same shapes), --seed S, --threads T. The 43-layer q2 file
#       is 86.7 GB: on a machine with a small disk and a large RAM, write
#       it into /dev/shm, and leave room there for what loads it.
#
# Example (dev machine, then GPU machine):
#   scripts/gen-synth-ds4-flash.sh prepare
#   scripts/gen-synth-ds4-flash.sh fill /dev/shm/ds4-flash-q2.gguf .cache/synth-ds4-flash -- --threads 16
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=lib/synth-fill.sh
. "$root/scripts/lib/synth-fill.sh"
header_name=ds4-flash.header.gguf

usage() { sed -n '2,36p' "$0" >&2; exit 2; }

prepare() {
    local dir="$root/.cache/synth-ds4-flash" experts=q2
    while [ $# -gt 0 ]; do
        case "$1" in
            --experts) experts="${2:?--experts q2|q4}"; shift 2 ;;
            *) dir="$1"; shift ;;
        esac
    done
    mkdir -p "$dir"
    local tiny
    tiny="$("$root/scripts/gen-ds4-tiny.sh")"
    local target="${CARGO_TARGET_DIR:-$root/target}"
    (cd "$root" && cargo build --release -p ds4-model --example synth_gguf)
    install -m 0755 "$target/release/examples/synth_gguf" "$dir/synth_gguf"
    if command -v strip >/dev/null; then strip "$dir/synth_gguf"; fi
    "$dir/synth_gguf" ds4-flash "$tiny/ds4-v4-tokenizer.gguf" "$dir/$header_name" --experts "$experts"
    ls -l "$dir"
}

case "${1:-}" in
    prepare) shift; prepare "$@" ;;
    fill) shift; synth_fill "$root/.cache/synth-ds4-flash" "$header_name" "$@" ;;
    *) usage ;;
esac
