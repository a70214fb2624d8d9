#!/usr/bin/env bash
# Run the test suite (sets up .venv first if it is missing).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${ENVKIT_VENV:-.venv}"
[ -x "$VENV/bin/envkit" ] || bash scripts/setup.sh
"$VENV/bin/ruff" check .
"$VENV/bin/python" -m pytest -q "$@"
# The validator over every built-in env (exit 1 on any FAIL).
for env in $("$VENV/bin/envkit" list --names); do
    "$VENV/bin/envkit" validate "$env" --episodes 8 > /dev/null
    echo "envkit validate $env: ok"
done
