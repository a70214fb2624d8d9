#!/usr/bin/env bash
# Set everything up, then the demo: benchmarks/learning.py's pipeline, shorter. A tiny model is built locally and
# warm-started on oracle demonstrations of arithmetic training tasks (envkit sft's code), then trained with GRPO
# (envkit train, TRL's GRPOTrainer) on the calculator + submit_answer env; it prints the held-out score (tasks never
# seen in training, checked disjoint by content) before and after GRPO, and after SFT given the same compute.
# About 15 minutes on 2 CPU cores once installed; everything is built locally, nothing is downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV="${ENVKIT_VENV:-.venv}"
OUT="${ENVKIT_DEMO_DIR:-runs/demo}"
ENV_CONFIG='{"kinds": ["containers"]}'
export TRL_EXPERIMENTAL_SILENCE=1
"$VENV/bin/envkit" validate arithmetic --env-config "$ENV_CONFIG" --episodes 8
"$VENV/bin/python" benchmarks/learning.py --env-config "$ENV_CONFIG" --runs 1 --grpo-steps 100 --eval-tasks 128 \
    --eval-repeats 2 --out "$OUT"
echo "demo finished: figures in $OUT/learning.json, reward curve in $OUT/learning_curve.png"
