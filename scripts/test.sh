#!/usr/bin/env bash
# Run the test suite: bash scripts/test.sh [pytest args]   (e.g. -m kernels_ci -x)
# Creates .venv on first use and (re)installs requirements-dev.txt whenever it changed, so it
# works on a fresh clone with nothing but python3 (3.11, with venv).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi

# The stamp records the hash of the requirements last installed: pip only runs when it differs.
stamp=.venv/.requirements-dev.sha256
want=$(sha256sum requirements-dev.txt | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    .venv/bin/python -m pip install -qq --disable-pip-version-check -r requirements-dev.txt
    echo "$want" > "$stamp"
fi

# No GPU here: Triton kernels run in the interpreter (export TRITON_INTERPRET=0 to override).
TRITON_INTERPRET="${TRITON_INTERPRET:-1}" exec .venv/bin/python -m pytest -q "$@"
