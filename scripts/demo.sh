#!/usr/bin/env bash
# Set everything up, then run the demo: one hard hotel-booking episode played by the env's oracle.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV="${ENVKIT_VENV:-.venv}"
"$VENV/bin/envkit" list
"$VENV/bin/envkit" play hotel-booking --seed 7 --options '{"tier": "hard", "kind": "hidden_confirm"}'
