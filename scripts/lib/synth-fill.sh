# Sourced by the scripts/gen-synth-*.sh wrappers: the `fill` step they
# share. Needs $0 (the wrapper, for its usage line) and, as arguments, the
# default DIR and the header's file name, then the wrapper's own:
#   synth_fill DEFAULT_DIR HEADER_NAME OUT.gguf [DIR] [-- FILL_OPTIONS]
# Writes OUT with `synth_gguf fill`, then checks it with `synth_gguf check`.
synth_fill() {
    local dir="$1" header_name="$2"
    shift 2
    local out="${1:?usage: $0 fill OUT.gguf [DIR] [-- FILL_OPTIONS]}"
    shift
    if [ $# -gt 0 ] && [ "$1" != "--" ]; then
        dir="$1"
        shift
    fi
    [ "${1:-}" = "--" ] && shift
    [ -x "$dir/synth_gguf" ] && [ -f "$dir/$header_name" ] ||
        { echo "$dir lacks synth_gguf or $header_name: run '$0 prepare' on the dev machine" >&2; exit 1; }
    "$dir/synth_gguf" fill "$dir/$header_name" "$out" "$@"
    "$dir/synth_gguf" check "$out"
}
