#!/usr/bin/env bash
# Set everything up, then run the demo: one episode of the example env played by its oracle.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV="${ENVKIT_VENV:-.venv}"
"$VENV/bin/envkit" list
"$VENV/bin/envkit" play examples/capitals.py:CapitalsEnv --seed 3
