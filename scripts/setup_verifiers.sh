#!/usr/bin/env bash
# Create .venv-verifiers (or $ENVKIT_VERIFIERS_VENV) with Prime Intellect's verifiers, for the verifiers arm of
# benchmarks/peers.py. A venv of its own: verifiers pins openai, mcp and friends apart from envkit's.
# The default is 0.3.1, the last release whose `vf.ToolEnv` / `vf.MultiTurnEnv` roll out through an OpenAI client in
# the calling process; 0.4.0 keeps only the v1 stack (Taskset / Harness / MCP Toolset servers, the agent loop run as
# a separate uv-launched program), which needs uv and network access to bootstrap. ~2 min from scratch. Safe to rerun.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${ENVKIT_VERIFIERS_VENV:-.venv-verifiers}"
VERSION="${ENVKIT_VERIFIERS_VERSION:-0.3.1}"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet "verifiers==${VERSION}"
"$VENV/bin/python" -c "import verifiers as vf; vf.StatefulToolEnv; print('verifiers', vf.__version__, 'ready in $VENV')"
