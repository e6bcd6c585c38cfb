# Sourced by scripts/run.sh and scripts/test.sh: make sure the project venv (.venv) exists and holds
# requirements-dev.txt. The stamp records the hash of the requirements last installed, so pip only
# runs when they changed. Works on a fresh clone with nothing but python3 (3.11, with venv).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
stamp=.venv/.requirements-dev.sha256
want=$(sha256sum requirements-dev.txt | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    .venv/bin/python -m pip install -qq --disable-pip-version-check -r requirements-dev.txt
    echo "$want" > "$stamp"
fi
