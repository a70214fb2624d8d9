"""verifiers' arm: :class:`verifiers_env.CalculatorToolEnv` rolled out with ``env.generate`` through verifiers' OpenAI
chat-completions client against the benchmark's server (``--url``). Run it with ``.venv-verifiers``.

A plain vLLM server has no ``/v1/chat/completions/tokens`` route (prime-rl's server adds it for verifiers' token
client), so every turn is a chat request the server renders itself; ``return_token_ids`` and ``logprobs`` make each
trajectory step carry the server's ``prompt_ids`` and ``completion_ids``. Training data: each step's tokens; an
episode is faithful when each step's ``prompt_ids + completion_ids`` is a prefix of the next step's ``prompt_ids``
(the re-rendered conversation re-tokenizes to what the model generated), which is what lets a trainer join the steps
into one sequence.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import peers_common as common


def main() -> None:
    """Run the warm-up batch, then the timed batch; write the result JSON."""
    args = common.arm_parser(__doc__.splitlines()[0]).parse_args()
    import verifiers as vf
    from verifiers_env import CalculatorToolEnv

    os.environ.setdefault("PEERS_API_KEY", "none")
    client = vf.ClientConfig(
        client_type="openai_chat_completions",
        api_base_url=args.url.rstrip("/") + "/v1",
        api_key_var="PEERS_API_KEY",
        max_retries=0,
        timeout=600.0,
    )
    sampling = {
        "temperature": args.temperature,
        "top_p": args.top_p,
        "max_tokens": args.per_turn,
        "logprobs": True,
        "extra_body": {"return_token_ids": True, "top_k": args.top_k or -1},
    }
    timeout_s = args.tool_timeout * args.max_turns if args.tool_timeout else None

    def prepare(path: str) -> tuple[list[dict[str, Any]], Any, list[dict[str, Any]], list[Any]]:
        tasks = common.load_tasks(path)
        env = CalculatorToolEnv(tasks, args.max_turns, timeout_s)
        env.set_max_total_completion_tokens(args.total)
        states: list[Any] = []  # the live rollout states (generate() returns them serialized, without tokens)
        run_group_states = env._run_group_states

        async def keep(*a: Any, **k: Any) -> list[Any]:
            group = await run_group_states(*a, **k)
            states.extend(group)
            return group

        env._run_group_states = keep
        inputs = [row for row in env.get_dataset().to_list() for _ in range(common.GROUP)]
        return tasks, env, inputs, states

    def play(env: Any, inputs: list[dict[str, Any]]) -> None:
        env.generate_sync(
            inputs, client=client, model=args.model, sampling_args=sampling, max_concurrent=args.concurrency
        )

    _, env, inputs, _ = prepare(args.warmup_tasks)
    play(env, inputs)  # discarded
    tasks, env, inputs, states = prepare(args.tasks)
    with common.CpuClock() as clock:
        play(env, inputs)
    common.write_result(args.out, describe(states, tasks, clock))


def describe(states: Any, tasks: list[dict[str, Any]], clock: common.CpuClock) -> dict[str, Any]:
    """The arm's result from verifiers' rollout outputs."""
    episodes = list(states)
    turns = generated = calls = tool_errors = malformed = errors = 0
    model_turns, prompt_lens, scores, rendered_ok, steps_total, steps_bad = [], [], [], 0, 0, 0
    rerender_bad: list[int] = []
    outcomes: dict[str, dict[str, int]] = {}
    for state in episodes:
        trajectory = state["trajectory"]
        turns += len(trajectory)
        runs, bad = [], 0
        for k, step in enumerate(trajectory):
            tokens = step.get("tokens") or {}
            completion = list(tokens.get("completion_ids") or [])
            generated += len(completion)
            runs.append(completion)
            if k == 0:
                prompt_lens.append(len(tokens.get("prompt_ids") or []))
            if k + 1 < len(trajectory):
                nxt = (trajectory[k + 1].get("tokens") or {}).get("prompt_ids") or []
                joined = list(tokens.get("prompt_ids") or []) + completion
                steps_total += 1
                if nxt[: len(joined)] != joined:
                    bad += 1
        steps_bad += bad
        rerender_bad.append(bad)
        rendered_ok += bad == 0
        model_turns.append(runs)
        scores.append(float(state.get("reward") or 0.0))
        errors += state.get("error") is not None
        told = []
        for message in state.get("completion") or []:
            role = _get(message, "role")
            if role == "assistant":
                calls += len(_get(message, "tool_calls") or [])
                if "<tool_call>" in str(_get(message, "content") or "") and not _get(message, "tool_calls"):
                    malformed += 1
            elif role == "tool":
                content = str(_get(message, "content"))
                told.append(content)
                tool_errors += not (content.startswith("Answer ") or content.lstrip("-").isdigit())
        info = state.get("info") or {}
        fault = info.get("fault", "none") if isinstance(info, dict) else "none"
        key = (
            "error: " + type(state["error"]).__name__
            if state.get("error") is not None
            else (
                "no calculator result" if not told else ("result" if told[0].lstrip("-").isdigit() else "error message")
            )
        )
        outcomes.setdefault(fault, {}).setdefault(key, 0)
        outcomes[fault][key] += 1
    return {
        "arm": "verifiers ToolEnv (OpenAI chat client)",
        "wall_s": clock.wall_s,
        "cpu_s": clock.cpu_s,
        "episodes": len(episodes),
        "turns": turns,
        "generated_tokens": generated,
        "tool_calls": calls,
        "tool_errors": tool_errors,
        "malformed_tool_calls": malformed,
        "mean_score": sum(scores) / max(len(scores), 1),
        "errors": errors,
        "finish_reasons": {},
        "mean_prompt_tokens": sum(prompt_lens) / max(len(prompt_lens), 1),
        "model_turns": model_turns,
        "rerender_bad_steps": rerender_bad,
        "rerender": {"episodes_prefix_exact": rendered_ok, "steps_checked": steps_total, "steps_not_prefix": steps_bad},
        "fault_outcomes": outcomes,
    }


def _get(message: Any, key: str) -> Any:
    return message.get(key) if isinstance(message, dict) else getattr(message, key, None)


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
