"""TRL's arm: ``GRPOTrainer(environment_factory=CalculatorEnvironment)`` with ``use_vllm=True, vllm_mode="server"``
generating on the benchmark's plain vLLM OpenAI server (``--url``). Run it with the vLLM venv (TRL's server client
needs ``vllm`` importable).

TRL 1.16's server client talks to a plain ``vllm.entrypoints.openai.api_server``: generation is ``POST
/v1/completions`` with token-id prompts and ``return_token_ids``. Only its weight sync needs more (a server started
with a NCCL weight-transfer engine, and CUDA on the trainer side): ``VLLMClient.init_communicator`` raises
``NotImplementedError`` on CPU. This runner replaces it with a no-op and marks the weights as synced, which is exact
here (the trainer's model and the server's are the same checkpoint and nothing trains); the rollout is TRL's own.
Timed: ``GRPOTrainer._generate`` (TRL's tool loop) within one ``_generate_and_score_completions`` call.
"""

from __future__ import annotations

import copy
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import peers_common as common

GROUP = common.GROUP


def main() -> None:
    """Run the warm-up batch, then the timed batch; write the result JSON."""
    args = common.arm_parser(__doc__.splitlines()[0]).parse_args()
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_template
    from trl.generation.vllm_client import VLLMClient
    from trl_env import CalculatorEnvironment

    torch.set_num_threads(1)
    VLLMClient.init_communicator = lambda self, device=0: None  # CPU: no NCCL weight transfer (see module doc)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    # TRL parses tool calls with a response template; the model's ChatML template renders Hermes <tool_call> blocks,
    # which TRL's Qwen3 parser reads (TRL does not recognise the template by name).
    tokenizer.response_template = qwen3_template
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)

    def rows(path: str) -> list[dict[str, Any]]:
        tasks = common.load_tasks(path)  # TRL plays each row GROUP times
        return [
            {
                "prompt": [
                    {"role": "system", "content": common.SYSTEM_PROMPT},
                    {"role": "user", "content": t["question"]},
                ],
                **t,
            }
            for t in tasks
        ]

    timed_rows, warm_rows = rows(args.tasks), rows(args.warmup_tasks)
    generation_kwargs: dict[str, Any] = {"max_tokens": args.per_turn}
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="peers-trl-"),
        per_device_train_batch_size=len(timed_rows) * GROUP,
        num_generations=GROUP,
        max_steps=1,
        max_completion_length=args.total,
        generation_kwargs=generation_kwargs,
        max_tool_calling_iterations=args.max_turns - 1,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        use_vllm=True,
        vllm_mode="server",
        vllm_server_base_url=args.url,
        vllm_importance_sampling_correction=False,
        learning_rate=1e-6,
        beta=0.0,
        bf16=False,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        logging_strategy="no",
    )
    trainer = GRPOTrainer(
        model=model,
        args=config,
        train_dataset=Dataset.from_list(timed_rows),
        processing_class=tokenizer,
        environment_factory=CalculatorEnvironment,
    )
    trainer._last_loaded_step = trainer.state.global_step  # the server already holds these weights (module doc)
    captured: dict[str, Any] = {}
    original = trainer._generate

    def timed_generate(prompts: list) -> Any:
        with common.CpuClock() as clock:
            output = original(prompts)
        captured.update(wall_s=clock.wall_s, cpu_s=clock.cpu_s, output=output)
        return output

    trainer._generate = timed_generate

    def play(batch: list[dict[str, Any]]) -> None:
        trainer._generate_and_score_completions([copy.deepcopy(r) for r in batch for _ in range(GROUP)])

    play(warm_rows)  # discarded
    play(timed_rows)
    prompt_ids, completion_ids, tool_mask, completions, _, _, _, _ = captured["output"]
    tasks = [r for r in timed_rows for _ in range(GROUP)]
    runs = [common.model_runs(ids, mask) for ids, mask in zip(completion_ids, tool_mask, strict=True)]
    malformed = sum(
        "<tool_call>" in (m.get("content") or "")
        for episode in completions
        for m in episode
        if m.get("role") == "assistant" and not m.get("tool_calls")
    )
    tool_msgs = [m for episode in completions for m in episode if m.get("role") == "tool"]
    errors = [m for m in tool_msgs if str(m.get("content", "")).startswith("{'error'")]
    scores = [env.get_reward() for env in trainer.environments]
    result = {
        "arm": "TRL environment_factory (vllm_mode=server)",
        "wall_s": captured["wall_s"],
        "cpu_s": captured["cpu_s"],
        "episodes": len(completion_ids),
        "turns": sum(len(r) for r in runs),
        "generated_tokens": sum(sum(m) for m in tool_mask),
        "tool_calls": len(tool_msgs),
        "tool_errors": len(errors),
        "malformed_tool_calls": malformed,
        "mean_score": sum(scores) / len(scores),
        "errors": 0,
        "finish_reasons": {},
        "mean_prompt_tokens": sum(map(len, prompt_ids)) / len(prompt_ids),
        "model_turns": runs,
        "fault_outcomes": fault_outcomes(tasks, completions),
    }
    common.write_result(args.out, result)


def fault_outcomes(tasks: list[dict[str, Any]], completions: list[list[dict[str, Any]]]) -> dict[str, dict[str, int]]:
    """Per injected fault: what the model was told by the calculator (an error text, a result, or no call)."""
    outcomes: dict[str, dict[str, int]] = {}
    for task, episode in zip(tasks, completions, strict=True):
        told = [str(m.get("content")) for m in episode if m.get("role") == "tool" and m.get("name") == "calculator"]
        key = "no calculator call" if not told else ("error message" if told[0].startswith("{'error'") else "result")
        outcomes.setdefault(task["fault"], {}).setdefault(key, 0)
        outcomes[task["fault"]][key] += 1
    return outcomes


if __name__ == "__main__":
    main()
