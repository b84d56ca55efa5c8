#!/usr/bin/env bash
# Run the SDK compatibility tests against a real ds4-server: install the
# official openai and anthropic SDKs into a private virtualenv (git-ignored
# .cache/venv-test), then run pytest. Extra arguments go to pytest.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
here="$root/tests/python"
venv="$root/.cache/venv-test"
req="$here/requirements.txt"
stamp="$venv/.requirements"

if [ ! -f "$stamp" ] || ! cmp -s "$req" "$stamp"; then
    rm -rf "$venv"
    if python3 -m venv "$venv" 2>/dev/null; then
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
    else
        # No venv module (python3-venv missing): install into a plain folder.
        rm -rf "$venv"
        mkdir -p "$venv/site"
        python3 -m pip install --quiet --disable-pip-version-check --target "$venv/site" -r "$req"
    fi
    cp "$req" "$stamp"
fi

if [ -x "$venv/bin/python" ]; then
    py="$venv/bin/python"
else
    py=python3
    export PYTHONPATH="$venv/site${PYTHONPATH:+:$PYTHONPATH}"
fi
cd "$here"
exec "$py" -m pytest -q -p no:cacheprovider "$@"
