#!/usr/bin/env bash
# The demo: benchmarks/learning.py's pipeline, shorter. A tiny model is built locally and warm-started on oracle
# demonstrations of arithmetic training tasks (envkit sft's code), then trained with GRPO (envkit train, TRL's
# GRPOTrainer) on the calculator + submit_answer env; it prints the held-out score (tasks never seen in training,
# checked disjoint by content) before and after GRPO, and after SFT given the same compute. About 13 minutes on 2 idle
# CPU cores; every phase shows a progress bar with its ETA (stderr), and the last lines are the held-out figures and
# where the reward curve is. Install first with `bash scripts/setup.sh` (run here when $VENV has no envkit yet).
# Extra arguments go to benchmarks/learning.py and win over the demo's (e.g. --grpo-steps 250).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${ENVKIT_VENV:-.venv}"
OUT="${ENVKIT_DEMO_DIR:-runs/demo}"
if [ ! -x "$VENV/bin/envkit" ]; then
    echo "envkit is not installed in $VENV: running bash scripts/setup.sh first (a few minutes, quiet)"
    bash scripts/setup.sh
fi
ENV_CONFIG='{"kinds": ["containers"]}'
export TRL_EXPERIMENTAL_SILENCE=1
echo "[1/2] envkit validate arithmetic: the env's offline checks (seconds)"
"$VENV/bin/envkit" validate arithmetic --env-config "$ENV_CONFIG" --episodes 8
echo "[2/2] SFT warm start, GRPO, SFT continuation for the same CPU time; each evaluated on 128 held-out tasks" \
    "(about 13 minutes on 2 idle cores)"
"$VENV/bin/python" benchmarks/learning.py --env-config "$ENV_CONFIG" --runs 1 --grpo-steps 100 --eval-tasks 128 \
    --eval-repeats 2 --out "$OUT" --progress "$@"
