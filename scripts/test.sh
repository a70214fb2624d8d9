#!/usr/bin/env bash
# Run the test suite (sets up .venv first if it is missing).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${ENVKIT_VENV:-.venv}"
[ -x "$VENV/bin/envkit" ] || bash scripts/setup.sh
"$VENV/bin/ruff" check .
"$VENV/bin/python" -m pytest -q "$@"
