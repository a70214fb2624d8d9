#!/usr/bin/env bash
# Set everything up, then the demo: warm-start a tiny model on oracle demonstrations (envkit sft), train it with GRPO
# (envkit train, TRL's GRPOTrainer) on the built-in guess-number env, and print held-out scores before and after.
# A few minutes on 2 CPU cores; everything is built locally, nothing is downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV="${ENVKIT_VENV:-.venv}"
OUT="${ENVKIT_DEMO_DIR:-runs/demo}"
ENV_CONFIG='{"low": 1, "high": 32}'
export TRL_EXPERIMENTAL_SILENCE=1
"$VENV/bin/envkit" validate guess-number --env-config "$ENV_CONFIG" --episodes 8
"$VENV/bin/python" -m envkit.testing --out "$OUT/base" --env guess-number --env-config "$ENV_CONFIG"
"$VENV/bin/envkit" sft guess-number --env-config "$ENV_CONFIG" --model "$OUT/base" --output-dir "$OUT/sft" \
    --episodes 128 --steps 150
"$VENV/bin/envkit" train --env guess-number --env-config "$ENV_CONFIG" --model "$OUT/sft" --output-dir "$OUT/grpo" \
    --no-lora --learning-rate 5e-4 --warmup-steps 20 --max-steps 400 --num-iterations 2 \
    --per-device-train-batch-size 64 --rl-num-generations 8 --rl-max-new-tokens 6 --max-turns 8 --rl-kl-coef 0.0 \
    --rl-top-k 0 --train-tasks 4000 --eval-tasks 256 --eval-samples 2 --gradient-checkpointing false \
    --logging-steps 50 --disable-tqdm true
echo "demo finished: model in $OUT/grpo, summary in $OUT/grpo/eval_summary.json"
