#!/usr/bin/env bash
# Run the test suite: bash scripts/test.sh [pytest args]   (e.g. -m kernels_ci -x)
# Without a GPU the Triton kernels run in Triton's CPU interpreter (tests/conftest.py sets
# TRITON_INTERPRET=1); with one they run compiled.
source "$(dirname "$0")/_venv.sh"
exec .venv/bin/python -m pytest -q "$@"
