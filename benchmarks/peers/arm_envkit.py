"""envkit's arm: ``RolloutEngine`` over :class:`envkit_env.CalculatorEnv`, generating through ``OpenAIBackend``
against the benchmark's server (``--url``) or, with ``--in-process``, through ``VLLMBackend`` on an engine in this
process (run it with the vLLM venv). Training data: each episode's ``prompt_ids`` / ``completion_ids`` / ``env_mask``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import peers_common as common


def main() -> None:
    """Run the warm-up batch, then the timed batch; write the result JSON."""
    parser = common.arm_parser(__doc__.splitlines()[0])
    parser.add_argument("--in-process", action="store_true", help="VLLMBackend in this process instead of --url")
    args = parser.parse_args()
    from envkit_env import CalculatorEnv, FaultyCalculatorEnv
    from transformers import AutoTokenizer

    from envkit.backends import OpenAIBackend, SamplingParams
    from envkit.rollout import RolloutEngine

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if args.in_process:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from envkit.backends import VLLMBackend
        from envkit.backends.vllm_support import make_llm

        backend = VLLMBackend(make_llm(args.model, max_model_len=1024, dtype="float32", enforce_eager=True))
        name = "envkit VLLMBackend (in process)"
    else:
        backend = OpenAIBackend(args.url, model=args.model, max_concurrency=args.concurrency)
        name = "envkit OpenAIBackend"
    tasks = common.load_tasks(args.tasks)
    faults = any(t["fault"] != "none" for t in tasks)
    sampling = SamplingParams(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k or None, max_new_tokens=args.per_turn
    )

    def engine() -> RolloutEngine:
        return RolloutEngine(
            FaultyCalculatorEnv if faults else CalculatorEnv,
            backend,
            tokenizer,
            max_turns=args.max_turns,
            max_completion_tokens=args.total,
            concurrency=args.concurrency,
            step_timeout_s=args.tool_timeout or 60.0,
        )

    engine().run([t["seed"] for t in common.load_tasks(args.warmup_tasks)], common.GROUP, sampling)  # discarded
    timed = engine()
    with common.CpuClock() as clock:
        episodes = timed.run([t["seed"] for t in tasks], common.GROUP, sampling)
    turns = sum(e.turns for e in episodes)
    result = {
        "arm": name,
        "wall_s": clock.wall_s,
        "cpu_s": clock.cpu_s,
        "episodes": len(episodes),
        "turns": turns,
        "generated_tokens": sum(sum(e.env_mask) for e in episodes),
        "tool_calls": sum(e.num_tool_calls for e in episodes),
        "tool_errors": sum(e.tool_errors for e in episodes),
        "malformed_tool_calls": sum(
            len(m.get("malformed_tool_calls") or []) for e in episodes for m in e.messages if m["role"] == "assistant"
        ),
        "mean_score": sum(e.score for e in episodes) / len(episodes),
        "errors": sum(bool(e.error) for e in episodes),
        "finish_reasons": {r: sum(e.finish_reason == r for e in episodes) for r in {e.finish_reason for e in episodes}},
        "mean_prompt_tokens": sum(len(e.prompt_ids) for e in episodes) / len(episodes),
        # The training data, as the model turns it holds (for the fidelity check against the server's record).
        "model_turns": [common.model_runs(e.completion_ids, e.env_mask) for e in episodes],
        "fault_outcomes": fault_outcomes(tasks, episodes),
    }
    common.write_result(args.out, result)


def fault_outcomes(tasks: list[dict], episodes: list) -> dict[str, dict[str, int]]:
    """Per injected fault: how the episodes of those tasks ended (finish reason, or ``error``)."""
    by_seed = {t["seed"]: t["fault"] for t in tasks}
    outcomes: dict[str, dict[str, int]] = {}
    for e in episodes:
        fault = by_seed[e.task_seed]
        key = "error" if e.error else e.finish_reason
        outcomes.setdefault(fault, {}).setdefault(key, 0)
        outcomes[fault][key] += 1
    return outcomes


if __name__ == "__main__":
    main()
