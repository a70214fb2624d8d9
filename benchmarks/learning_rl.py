"""Where demonstrations fall short, does on-policy training through envkit beat SFT and rejection sampling?

Two experiments (envs in ``benchmarks/learning_rl_envs.py``), each with independent seeds; every seed builds its
own tokenizer-sized tiny Qwen2 model and its own warm start (no shared warm start), then trains five arms from it:

- ``grpo``: ``envkit train`` (GRPO, full fine-tuning) on the training condition;
- ``rft``: ``envkit rft``'s code (:mod:`envkit.adapters.trl.rft`) on the training condition, with as many env
  episodes as GRPO used;
- ``sft_plateau``: SFT on the available demonstrations continued to its plateau, the checkpoint chosen on a
  validation split of the training condition (the most favourable selection SFT can get);
- ``sft_compute``: SFT on the same demonstrations for GRPO's CPU time (compute-matched);
- ``privileged``: SFT to plateau on demonstrations that do cover the training condition (the upper bound that shows
  the comparison is fair).

Experiments:

- **A — flaky tools.** ``FlakyArithmeticEnv``: the calculator fails with probability p and says to call it again.
  Demonstrations come from the oracle in the clean env (p = 0, as a production system's logs would); GRPO and RFT
  train at p = 0.3; held out at p ∈ {0, 0.3, 0.5}.
- **B — deeper chains.** ``ChainEnv``: demonstrations for k ≤ 2 operations; GRPO and RFT train on k ≤ 4; held out
  k = 1 … 6 and chains containing operation pairs never adjacent in training.

Before the arms, two gates: the warm start trains (one optimizer, probed every ``--warm-chunk`` steps) until a probe
(the demonstrations' condition, held out) passes ``--probe-threshold`` (capped by ``--warm-max-steps``; the checkpoint
with the best probe is kept), and a pilot gate: the warm start must solve at least
``--gate`` of the hard condition at temperature 1, else GRPO and RFT would get no signal — the seed is recorded as
gated and its arms are not run (the report says so).

Evaluation: held-out tasks (seeds from ``HELD_OUT_START``) are checked disjoint by content from every training,
demonstration and validation task (the user prompt; any held-out task whose prompt is a training one is dropped and
counted, then the check asserts zero overlap). Each model (warm start and arms) gets, per condition, mean score,
format validity (the episode ended with a ``submit_answer`` call, right or wrong) and pass@k for k = 1 … 64 (the
unbiased estimator) on the pass@k condition. Learning curves: training reward against env episodes (GRPO, RFT) and
validation score against SFT steps. Canaries: ``envkit validate``'s canary check on each experiment's envs.

Results: every seed writes ``OUT/EXP/seed-N.json`` as it finishes (arms inside a seed are saved as they finish too,
under ``OUT/EXP/seed-N/``), and a rerun skips what is done, so a cut run loses at most the arm in progress.
``--report`` aggregates whatever has finished (interquartile mean with stratified-bootstrap 95 % CIs and the
probability of improvement, from ``rliable``) into ``OUT/results.md``, ``OUT/summary.json`` and PNG figures.

Usage::

    python benchmarks/learning_rl.py --experiments A B --seeds 5 --out DIR   # resumable
    python benchmarks/learning_rl.py --report --out DIR                      # tables and figures of what finished
    python benchmarks/learning_rl.py --quick                                 # the whole pipeline, tiny sizes
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import envkit

HERE = Path(__file__).resolve().parent
ENVS_FILE = HERE / "learning_rl_envs.py"
HELD_OUT_START = 1_000_000
VALIDATION_START = 500_000
ARMS = ("grpo", "rft", "sft_plateau", "sft_compute", "privileged")
MODELS = ("warm_start", *ARMS)


@dataclass
class Experiment:
    """One experiment: its env class and the env configs of each role."""

    name: str
    title: str
    env_class: str
    demo: dict[str, Any]
    """Where the available demonstrations come from (also the warm start's probe)."""
    train: dict[str, Any]
    """Where GRPO and RFT train (and the SFT arms' validation split)."""
    hard: dict[str, Any]
    """The pilot gate's condition: what GRPO and RFT must already solve now and then."""
    privileged: dict[str, Any]
    """Where the privileged arm's demonstrations come from."""
    conditions: dict[str, dict[str, Any]]
    """Held-out conditions, by label."""
    pass_at_k: str
    """The held-out condition of the pass@k curves."""
    hard_conditions: list[str] = field(default_factory=list)
    """The held-out conditions the headline aggregates (where the demonstrations fall short)."""

    @property
    def spec(self) -> str:
        """The env class as an ``envkit.make`` / ``envkit train --env`` spec."""
        return f"{ENVS_FILE}:{self.env_class}"

    def factory(self, config: dict[str, Any]) -> Callable[[], envkit.Env]:
        """A factory of fresh envs with ``config``."""
        spec = self.spec
        return lambda: envkit.make(spec, **config)


EXPERIMENTS = {
    "A": Experiment(
        name="A",
        title="flaky tools (calculator fails with probability p)",
        env_class="FlakyArithmeticEnv",
        demo={"fail_p": 0.0},
        train={"fail_p": 0.3},
        hard={"fail_p": 0.3},
        privileged={"fail_p": 0.3},
        conditions={"p=0": {"fail_p": 0.0}, "p=0.3": {"fail_p": 0.3}, "p=0.5": {"fail_p": 0.5}},
        pass_at_k="p=0.5",
        hard_conditions=["p=0.3", "p=0.5"],
    ),
    "B": Experiment(
        name="B",
        title="deeper chains than the demonstrations (k operations)",
        env_class="ChainEnv",
        demo={"depths": [1, 2]},
        train={"depths": [1, 2, 3, 4]},
        hard={"depths": [3, 4]},
        privileged={"depths": [1, 2, 3, 4]},
        conditions={
            **{f"k={k}": {"depths": [k]} for k in range(1, 7)},
            "unseen pairs": {"depths": [3, 4], "require_pair": True},
        },
        pass_at_k="k=4",
        hard_conditions=["k=3", "k=4", "k=5", "k=6", "unseen pairs"],
    ),
}


# ---- tasks and the held-out check ------------------------------------------------------------------------------------
class HeldOutOverlap(AssertionError):
    """A held-out task whose prompt is a training, demonstration or validation prompt."""


def prompt_of(factory: Callable[[], envkit.Env], seed: int) -> str:
    """The task's content: its user message (what differs between tasks; the system prompt and tools are fixed)."""
    env = factory()
    messages, _ = env.reset(seed=seed)
    return "\n".join(str(m.get("content") or "") for m in messages if m["role"] == "user")


def held_out_split(exp: Experiment, label: str, count: int, seen: set[str], offset: int) -> tuple[list[int], int]:
    """``count`` held-out task seeds of condition ``label`` whose prompts are not in ``seen``, and how many candidate
    seeds were dropped for being there."""
    factory, seeds, dropped, seed = exp.factory(exp.conditions[label]), [], 0, HELD_OUT_START + offset
    while len(seeds) < count:
        if prompt_of(factory, seed) in seen:
            dropped += 1
        else:
            seeds.append(seed)
        seed += 1
    return seeds, dropped


def check_disjoint(exp: Experiment, held_out: dict[str, list[int]], seen: set[str]) -> int:
    """Raise :class:`HeldOutOverlap` if any held-out prompt is a seen one; return the overlap (0)."""
    overlap = sum(
        prompt_of(exp.factory(exp.conditions[label]), s) in seen for label, ss in held_out.items() for s in ss
    )
    if overlap:
        raise HeldOutOverlap(f"{overlap} held-out prompts of experiment {exp.name} are training prompts")
    return overlap


# ---- models ----------------------------------------------------------------------------------------------------------
def oracle_demos(factory: Callable[[], envkit.Env], tokenizer: Any, seeds: list[int]) -> list[Any]:
    """Token-exact oracle episodes of ``seeds`` (``envkit sft``'s demonstrations)."""
    from envkit.demos import oracle_episodes

    return oracle_episodes(factory, tokenizer, seeds)


def sft_steps(
    model: Any,
    tokenizer: Any,
    episodes: list[Any],
    steps: int,
    args: argparse.Namespace,
    seed: int,
    *,
    learning_rate: float,
    cpu_seconds: float | None = None,
    every: int | None = None,
    at_every: Callable[[int], bool] | None = None,
    warmup_steps: int = 0,
) -> int:
    """``steps`` optimizer steps (or ``cpu_seconds`` of this process's CPU time) of ``envkit sft``'s masked SFT
    (:func:`envkit.adapters.trl.sft.demonstrations_dataset`) at a constant learning rate (after ``warmup_steps`` of
    linear warm-up); returns the steps run.

    With ``every`` and ``at_every``, ``at_every(steps_so_far)`` runs after every ``every`` steps (the model in eval
    mode) and training stops when it returns True; one optimizer throughout."""
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import SFTConfig, SFTTrainer

    from envkit.adapters.trl.sft import demonstrations_dataset

    deadline = time.process_time() + cpu_seconds if cpu_seconds is not None else None

    class DeadlineAndCheckpoints(TrainerCallback):
        def on_step_end(self, _args: Any, state: Any, control: Any, **_: Any) -> None:
            if deadline is not None and time.process_time() >= deadline:
                control.should_training_stop = True
            if every and at_every is not None and state.global_step % every == 0:
                model.eval()
                if at_every(state.global_step):
                    control.should_training_stop = True
                model.train()

    with tempfile.TemporaryDirectory() as tmp:
        trainer = SFTTrainer(
            model=model,
            args=SFTConfig(
                output_dir=tmp,
                max_steps=steps,
                learning_rate=learning_rate,
                lr_scheduler_type="constant_with_warmup" if warmup_steps else "constant",
                warmup_steps=warmup_steps,
                per_device_train_batch_size=args.sft_batch_size,
                save_strategy="no",
                report_to="none",
                bf16=False,
                use_cpu=True,
                max_length=None,
                activation_checkpointing=False,  # a model this small fits; recomputing would cost ~30 % per step
                logging_steps=10**6,
                disable_tqdm=True,
                seed=seed,
            ),
            train_dataset=demonstrations_dataset(episodes),
            processing_class=tokenizer,
            callbacks=[DeadlineAndCheckpoints()],
        )
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    model.eval()
    return int(trainer.state.global_step)


@dataclass
class Selection:
    """What :func:`sft_keep_best` ran and kept."""

    steps: int
    """Optimizer steps run."""
    curve: list[list[float]]
    """``[steps, score]`` of every evaluation."""
    best_step: int
    """The steps of the checkpoint kept (the best score; the earliest of equals)."""
    best: float
    """Its score."""


def sft_keep_best(
    model: Any,
    tokenizer: Any,
    episodes: list[Any],
    args: argparse.Namespace,
    seed: int,
    *,
    max_steps: int,
    every: int,
    learning_rate: float,
    score: Callable[[], float],
    stop: Callable[[float, int], bool],
    score_first: bool = False,
    on_score: Callable[[int, float], None] | None = None,
    warmup_steps: int = 0,
) -> Selection:
    """:func:`sft_steps` with one optimizer, ``score()`` after every ``every`` steps and after the last (and, with
    ``score_first``, before the first); the best-scoring weights end up in ``model``. Training stops early when
    ``stop(score, evaluations_since_the_best)`` is True."""
    curve: list[list[float]] = []
    best: tuple[float, int, dict[str, Any]] | None = None  # score, steps, weights
    since_best = 0

    def checkpoint(steps: int) -> bool:
        nonlocal best, since_best
        value = score()
        curve.append([steps, value])
        if on_score is not None:
            on_score(steps, value)
        if best is None or value > best[0]:
            best, since_best = (value, steps, {k: v.detach().clone() for k, v in model.state_dict().items()}), 0
        else:
            since_best += 1
        return stop(value, since_best)

    if score_first:
        checkpoint(0)
    steps = sft_steps(
        model,
        tokenizer,
        episodes,
        max_steps,
        args,
        seed,
        learning_rate=learning_rate,
        every=every,
        at_every=checkpoint,
        warmup_steps=warmup_steps,
    )
    if not curve or curve[-1][0] != steps:
        checkpoint(steps)
    assert best is not None
    model.load_state_dict(best[2])  # sft_steps left the model in eval mode
    return Selection(steps=steps, curve=curve, best_step=best[1], best=best[0])


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimator of one task: ``1 - C(n-c, k) / C(n, k)`` (Chen et al. 2021)."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k) if k <= n else float("nan")


def format_valid(episode: Any) -> bool:
    """Whether the episode kept the format, right or wrong: every assistant turn is a parsed tool call and one of
    them submits an answer."""
    turns = [m for m in episode.messages if m["role"] == "assistant"]
    calls = [c["function"]["name"] for m in turns for c in m.get("tool_calls") or []]
    return bool(turns) and all(m.get("tool_calls") for m in turns) and "submit_answer" in calls


def evaluate(
    model: Any,
    tokenizer: Any,
    factory: Callable[[], envkit.Env],
    seeds: list[int],
    samples: int,
    args: argparse.Namespace,
    sampling_seed: int,
) -> dict[str, Any]:
    """Episodes of ``seeds`` × ``samples`` at temperature 1: mean score, format validity (ended by a submission) and
    the per-task success counts (for pass@k)."""
    from envkit.backends import SamplingParams, TransformersBackend
    from envkit.rollout import RolloutEngine

    model.eval()
    engine = RolloutEngine(
        factory,
        TransformersBackend(model, tokenizer),
        tokenizer,
        max_turns=args.max_turns,
        max_completion_tokens=args.max_completion_tokens,
        concurrency=args.eval_concurrency,
    )
    sampling = SamplingParams(temperature=1.0, top_k=None, max_new_tokens=args.max_new_tokens, seed=sampling_seed)
    try:
        episodes = engine.run(seeds, samples, sampling)
    finally:
        engine.close()
    successes: dict[int, int] = {}
    for e in episodes:
        successes[e.task_seed] = successes.get(e.task_seed, 0) + int(e.score >= 1.0)
    return {
        "mean_score": sum(e.score for e in episodes) / len(episodes),
        "format_valid": sum(map(format_valid, episodes)) / len(episodes),
        "tool_errors": sum(e.tool_errors for e in episodes) / len(episodes),
        "episodes": len(episodes),
        "successes": [successes[s] for s in dict.fromkeys(seeds)],
        "samples": samples,
    }


def evaluate_model(
    model: Any, tokenizer: Any, exp: Experiment, held_out: dict[str, list[int]], args: argparse.Namespace, seed: int
) -> dict[str, Any]:
    """Every held-out condition (``--eval-samples`` per task) and the pass@k condition (``--pass-k-samples``)."""
    result: dict[str, Any] = {"conditions": {}}
    for i, (label, seeds) in enumerate(held_out.items()):
        if label == "pass@k":
            continue
        result["conditions"][label] = evaluate(
            model, tokenizer, exp.factory(exp.conditions[label]), seeds, args.eval_samples, args, seed * 100 + i
        )
    run = evaluate(
        model,
        tokenizer,
        exp.factory(exp.conditions[exp.pass_at_k]),
        held_out["pass@k"],
        args.pass_k_samples,
        args,
        seed * 100 + 99,
    )
    n = args.pass_k_samples
    run["pass@k"] = [sum(pass_at_k(n, c, k) for c in run["successes"]) / len(run["successes"]) for k in range(1, n + 1)]
    result["pass@k"] = run
    return result


def load(path: Path) -> tuple[Any, Any]:
    """A saved model and its tokenizer (fp32)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32), AutoTokenizer.from_pretrained(
        str(path)
    )


def save(model: Any, tokenizer: Any, path: Path) -> None:
    """Save a model and its tokenizer."""
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))


# ---- one seed --------------------------------------------------------------------------------------------------------
class Seed:
    """One seed of one experiment: its folder, its tasks, and each phase, skipped when its file already exists."""

    def __init__(self, exp: Experiment, seed: int, args: argparse.Namespace, out: Path) -> None:
        self.exp, self.seed, self.args = exp, seed, args
        self.dir = out / exp.name / f"seed-{seed}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_file = self.dir / "log.txt"
        # Task seeds: demonstrations and training from 0, validation from VALIDATION_START, held out from
        # HELD_OUT_START (checked disjoint by content below). The same for every seed: seeds differ in model, warm
        # start and sampling, as independent runs of one benchmark do.
        self.demo_seeds = list(range(args.demos))
        self.train_seeds = list(range(args.train_tasks))
        self.validation_seeds = list(range(VALIDATION_START, VALIDATION_START + args.validation_tasks))

    def log(self, text: str) -> None:
        """A line on stdout and in the seed's log."""
        line = f"[{self.exp.name} seed {self.seed} {time.strftime('%H:%M:%S')}] {text}"
        print(line, flush=True)
        with self.log_file.open("a") as f:
            f.write(line + "\n")

    def phase(self, name: str, work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """``work()``'s result, saved as ``NAME.json``; read back instead when a previous run saved it."""
        path = self.dir / f"{name}.json"
        if path.exists():
            return json.loads(path.read_text())
        started, cpu = time.perf_counter(), time.process_time()
        result = work()
        result.setdefault("seconds", time.perf_counter() - started)
        result.setdefault("cpu_seconds", time.process_time() - cpu)
        path.write_text(json.dumps(result, indent=1, default=str))
        return result

    # -- tasks --
    def tasks(self) -> dict[str, Any]:
        """Held-out splits, dropping any task whose prompt is a seen one, and the disjointness check."""
        exp, args = self.exp, self.args
        seen = {prompt_of(exp.factory(exp.demo), s) for s in self.demo_seeds}
        seen |= {prompt_of(exp.factory(exp.privileged), s) for s in self.demo_seeds}
        seen |= {prompt_of(exp.factory(exp.train), s) for s in self.train_seeds}
        seen |= {prompt_of(exp.factory(exp.train), s) for s in self.validation_seeds}
        seen |= {prompt_of(exp.factory(exp.demo), s) for s in self.validation_seeds}
        held_out, dropped = {}, {}
        for i, label in enumerate(exp.conditions):
            held_out[label], dropped[label] = held_out_split(exp, label, args.eval_tasks, seen, offset=i * 100_000)
        held_out["pass@k"], dropped["pass@k"] = held_out_split(
            exp, exp.pass_at_k, args.pass_k_tasks, seen, offset=list(exp.conditions).index(exp.pass_at_k) * 100_000
        )
        overlap = check_disjoint(exp, {k: v for k, v in held_out.items() if k != "pass@k"}, seen)
        self.log(f"held-out check: {len(seen)} seen prompts; dropped {dropped}; overlap after: {overlap}")
        return {"held_out": held_out, "dropped": dropped, "overlap": overlap, "seen_prompts": len(seen)}

    # -- warm start --
    def warm_start(self) -> dict[str, Any]:
        """Tokenizer, tiny model, SFT on the available demonstrations until the probe passes (capped); a model that
        does not pass by the cap is replaced by a fresh initialisation, up to ``--warm-attempts`` in all (some
        initialisations of a model this small never learn to copy numbers), and the best attempt is kept."""
        from envkit.testing import build_tiny_model, build_tokenizer

        exp, args = self.exp, self.args
        corpus = _corpus(exp, self.demo_seeds[:100])
        tokenizer = build_tokenizer(self.dir / "tokenizer", vocab_size=args.vocab_size, extra_corpus=corpus)
        demos = oracle_demos(exp.factory(exp.demo), tokenizer, self.demo_seeds)
        probe_seeds = self.validation_seeds[: args.probe_tasks]
        attempts: list[dict[str, Any]] = []
        best: tuple[float, dict[str, Any], int] | None = None  # the best attempt's probe, weights and index
        for attempt in range(args.warm_attempts):
            init_seed = self.seed + 1000 * attempt
            model = build_tiny_model(
                tokenizer,
                hidden_size=args.hidden_size,
                num_layers=args.num_layers,
                num_heads=args.num_heads,
                num_kv_heads=args.num_heads,
                max_position_embeddings=1024,
                seed=init_seed,
            )
            # The probe can fall between probes, so an attempt's model is its checkpoint with the best probe.
            kept = sft_keep_best(
                model,
                tokenizer,
                demos,
                args,
                self.seed,
                max_steps=args.warm_max_steps,
                every=args.warm_chunk,
                learning_rate=args.warm_learning_rate,
                warmup_steps=args.warm_warmup_steps,
                score=lambda model=model: evaluate(
                    model, tokenizer, exp.factory(exp.demo), probe_seeds, 1, args, self.seed
                )["mean_score"],
                stop=lambda probe, _: probe >= args.probe_threshold,
                on_score=lambda steps, probe, attempt=attempt: self.log(
                    f"warm start{f' (attempt {attempt + 1})' if attempt else ''}: {steps} SFT steps, probe "
                    f"{probe:.3f} (passes at {args.probe_threshold})"
                ),
            )
            attempts.append(
                {
                    "init_seed": init_seed,
                    "steps": kept.steps,
                    "selected_steps": kept.best_step,
                    "probes": kept.curve,
                    "best": kept.best,
                }
            )
            self.log(f"warm start: kept the checkpoint after {kept.best_step} steps (probe {kept.best:.3f})")
            if best is None or kept.best > best[0]:
                best = (kept.best, {k: v.detach().clone() for k, v in model.state_dict().items()}, len(attempts) - 1)
            if kept.best >= args.probe_threshold:
                break
            if attempt + 1 < args.warm_attempts:
                self.log(f"warm start: no pass by {args.warm_max_steps} steps; a fresh initialisation")
        assert best is not None
        model.load_state_dict(best[1])
        save(model, tokenizer, self.dir / "warm")
        chosen = attempts[best[2]]
        return {
            "steps": chosen["steps"],
            "selected_steps": chosen["selected_steps"],
            "probes": chosen["probes"],
            "passed": best[0] >= args.probe_threshold,
            "attempts": attempts,
            "demos": len(demos),
        }

    def gate(self) -> dict[str, Any]:
        """The pilot gate: the warm start's solve rate on the hard condition at temperature 1."""
        model, tokenizer = load(self.dir / "warm")
        exp, args = self.exp, self.args
        solved = evaluate(
            model,
            tokenizer,
            exp.factory(exp.hard),
            self.validation_seeds[: args.gate_tasks],
            args.gate_samples,
            args,
            self.seed + 7,
        )
        passed = solved["mean_score"] >= args.gate
        self.log(
            f"pilot gate: warm start solves {solved['mean_score']:.3f} of the hard condition {exp.hard} at T=1 "
            f"(needs {args.gate}): "
            + (
                "passed"
                if passed
                else "FAILED: GRPO and RFT get little or no signal; "
                + ("arms run anyway (--ignore-gate)" if args.ignore_gate else "arms not run")
            )
        )
        return {"solved": solved["mean_score"], "needed": args.gate, "passed": passed}

    # -- arms --
    def grpo(self) -> dict[str, Any]:
        """``envkit train`` (GRPO) from the warm start on the training condition."""
        from envkit.adapters.trl import train

        args = self.args
        out = self.dir / "grpo"
        started, cpu = time.perf_counter(), time.process_time()
        train.run(
            [
                "--env",
                self.exp.spec,
                "--env-config",
                json.dumps(self.exp.train),
                "--model",
                str(self.dir / "warm"),
                "--output-dir",
                str(out),
                "--no-lora",
                "--learning-rate",
                str(args.grpo_learning_rate),
                "--warmup-steps",
                "0",
                "--max-steps",
                str(args.grpo_steps),
                "--per-device-train-batch-size",
                str(args.grpo_batch_size),
                "--gradient-checkpointing",
                "false",
                "--num-iterations",
                "1",
                "--rl-num-generations",
                str(args.num_generations),
                "--rl-max-new-tokens",
                str(args.max_new_tokens),
                "--max-turns",
                str(args.max_turns),
                "--max-completion-tokens",
                str(args.max_completion_tokens),
                "--rl-kl-coef",
                "0.0",
                "--rl-top-k",
                "0",
                "--eval-tasks",
                "0",
                "--train-tasks",
                str(args.train_tasks),
                "--seed",
                str(self.seed),
                "--disable-tqdm",
                "true",
                "--logging-steps",
                "1",
                "--save-strategy",
                "no",
            ],
            log=lambda _: None,
        )
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
        history = json.loads((out / "log_history.json").read_text())
        # One optimizer step per batch of per-device-batch-size episodes (num_iterations 1, no accumulation).
        curve = [
            [e["step"] * args.grpo_batch_size, e["envkit/mean_score"]] for e in history if "envkit/mean_score" in e
        ]
        self.log(f"grpo: {args.grpo_steps} steps, {args.grpo_steps * args.grpo_batch_size} episodes, {seconds:.0f}s")
        return {
            "env_episodes": args.grpo_steps * args.grpo_batch_size,
            "curve": curve,
            "seconds": seconds,
            "cpu_seconds": cpu_seconds,
        }

    def rft(self, env_episodes: int) -> dict[str, Any]:
        """``envkit rft`` from the warm start on the training condition, with ``env_episodes`` episodes in all."""
        from envkit.adapters.trl.rft import rejection_sampling_fine_tune
        from envkit.backends import SamplingParams

        args = self.args
        model, tokenizer = load(self.dir / "warm")
        per_round = max(
            args.num_generations, env_episodes // args.rft_rounds // args.num_generations * args.num_generations
        )
        records = rejection_sampling_fine_tune(
            model,
            tokenizer,
            self.exp.factory(self.exp.train),
            seeds=self.train_seeds,
            output_dir=str(self.dir / "rft"),
            rounds=args.rft_rounds,
            episodes_per_round=per_round,
            samples_per_task=args.num_generations,
            threshold=1.0,
            steps_per_round=args.rft_steps_per_round,
            learning_rate=args.rft_learning_rate,
            batch_size=args.sft_batch_size,
            sampling=SamplingParams(temperature=1.0, top_k=None, max_new_tokens=args.max_new_tokens, seed=self.seed),
            max_turns=args.max_turns,
            max_completion_tokens=args.max_completion_tokens,
            seed=self.seed,
            log=self.log,
            disable_tqdm=True,
            activation_checkpointing=False,
        )
        return {
            "env_episodes": records[-1].env_episodes,
            "rounds": [r.__dict__ for r in records],
            "curve": [[r.env_episodes, r.mean_score] for r in records],
        }

    def sft_plateau(self, name: str, config: dict[str, Any]) -> dict[str, Any]:
        """SFT from the warm start on oracle demonstrations of ``config`` until the validation score stops improving
        (``--patience`` evaluations) or ``--plateau-max-steps``; the best checkpoint is saved."""
        exp, args = self.exp, self.args
        model, tokenizer = load(self.dir / "warm")
        demos = oracle_demos(exp.factory(config), tokenizer, self.demo_seeds)
        validation = exp.factory(exp.train)
        val_seeds = self.validation_seeds[: args.validation_tasks]

        def score() -> float:
            return evaluate(model, tokenizer, validation, val_seeds, 1, args, self.seed + 3)["mean_score"]

        kept = sft_keep_best(
            model,
            tokenizer,
            demos,
            args,
            self.seed,
            max_steps=args.plateau_max_steps,
            every=args.plateau_every,
            learning_rate=args.sft_learning_rate,
            score=score,
            stop=lambda _, since_best: since_best >= args.patience,
            score_first=True,
        )
        save(model, tokenizer, self.dir / name)
        self.log(f"{name}: best validation {kept.best:.3f} at step {kept.best_step} of {kept.steps}")
        return {
            "curve": kept.curve,
            "best_step": kept.best_step,
            "steps": kept.steps,
            "validation": kept.best,
            "demos": len(demos),
        }

    def sft_compute(self, cpu_seconds: float) -> dict[str, Any]:
        """SFT from the warm start on the available demonstrations for ``cpu_seconds`` of CPU time (GRPO's)."""
        exp, args = self.exp, self.args
        model, tokenizer = load(self.dir / "warm")
        demos = oracle_demos(exp.factory(exp.demo), tokenizer, self.demo_seeds)
        budget = cpu_seconds if args.baseline_seconds is None else min(cpu_seconds, args.baseline_seconds)
        steps = sft_steps(
            model, tokenizer, demos, 10**6, args, self.seed, learning_rate=args.sft_learning_rate, cpu_seconds=budget
        )
        save(model, tokenizer, self.dir / "sft_compute")
        self.log(f"sft_compute: {steps} steps in {budget:.0f} CPU-s (GRPO's)")
        return {"steps": steps, "cpu_budget": budget}

    def run(self) -> dict[str, Any]:
        """Every phase (each skipped when done), then the seed's JSON."""
        result: dict[str, Any] = {"experiment": self.exp.name, "seed": self.seed}
        result["tasks"] = self.phase("tasks", self.tasks)
        result["warm_start"] = self.phase("warm_start", self.warm_start)
        result["gate"] = gate = self.phase("gate", self.gate)
        result["eval"] = {"warm_start": self.phase("eval-warm_start", lambda: self._evaluate("warm"))}
        if not gate["passed"] and not self.args.ignore_gate:
            result["gated"] = True
            return result
        if not gate["passed"]:
            result["below_gate"] = True  # --ignore-gate: the arms ran on a warm start the gate failed
        result["grpo"] = grpo = self.phase("grpo", self.grpo)
        result["rft"] = self.phase("rft", lambda: self.rft(grpo["env_episodes"]))
        result["sft_plateau"] = self.phase("sft_plateau", lambda: self.sft_plateau("sft_plateau", self.exp.demo))
        result["sft_compute"] = self.phase("sft_compute", lambda: self.sft_compute(grpo["cpu_seconds"]))
        result["privileged"] = self.phase("privileged", lambda: self.sft_plateau("privileged", self.exp.privileged))
        for arm in ARMS:
            result["eval"][arm] = self.phase(f"eval-{arm}", lambda arm=arm: self._evaluate(arm))
        return result

    def _evaluate(self, folder: str) -> dict[str, Any]:
        model, tokenizer = load(self.dir / folder)
        held_out = json.loads((self.dir / "tasks.json").read_text())["held_out"]
        result = evaluate_model(model, tokenizer, self.exp, held_out, self.args, self.seed)
        summary = ", ".join(f"{k} {v['mean_score']:.3f}" for k, v in result["conditions"].items())
        curve = result["pass@k"]["pass@k"]
        self.log(f"eval {folder}: {summary}; pass@1/pass@{len(curve)} {curve[0]:.3f}/{curve[-1]:.3f}")
        return result


def _corpus(exp: Experiment, seeds: list[int]) -> list[str]:
    """Oracle episodes of the demonstration and training conditions as the chat template renders them (the
    tokenizer's corpus): the system prompt and tool schemas every sequence starts with become few tokens."""
    from envkit.models.tiny import ADDED_TOKENS, SPECIAL_TOKENS
    from envkit.testing import build_tokenizer

    renderer = build_tokenizer()  # only its chat template is used: the rendered text is what the real one must split
    corpus = []
    for config in (exp.demo, exp.train):
        for episode in oracle_demos(exp.factory(config), renderer, seeds):
            text = renderer.apply_chat_template(episode.messages, tools=episode.tools, tokenize=False)
            for token in (*SPECIAL_TOKENS, *ADDED_TOKENS):  # single tokens already: no merges spent on them
                text = text.replace(token, "\n")
            corpus.append(text)
    return corpus


def canaries(exp: Experiment) -> dict[str, Any]:
    """``envkit validate``'s canary check (17) on the experiment's demonstration, training and hardest held-out env
    configs (the other conditions differ from these only in the task parameters)."""
    result = {}
    hardest = exp.hard_conditions[-1]
    configs = {"demo": exp.demo, "train": exp.train, hardest: exp.conditions[hardest]}
    for label, config in configs.items():
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "envkit.cli",
                "validate",
                exp.spec,
                "--env-config",
                json.dumps(config),
                "--json",
                "--episodes",
                "2",
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        try:
            checks = json.loads(run.stdout)["checks"]
        except (json.JSONDecodeError, KeyError):
            result[label] = {"status": "ERROR", "reason": (run.stderr or run.stdout).strip().splitlines()[-1:]}
            continue
        (check,) = [c for c in checks if c["id"] == 17]
        result[label] = {"status": check["status"], "reason": check["reason"]}
    return result


# ---- the report ------------------------------------------------------------------------------------------------------
def finished(out: Path, exp: str) -> list[dict[str, Any]]:
    """The finished seeds' results of experiment ``exp``."""
    return [json.loads(p.read_text()) for p in sorted((out / exp).glob("seed-*.json"))]


def _kept_steps(warm: dict[str, Any]) -> int:
    """The SFT steps of the warm-start checkpoint kept (runs before the best-probe selection kept the last)."""
    return int(warm.get("selected_steps", warm["steps"]))


def _kept_probe(warm: dict[str, Any]) -> float:
    """The probe of the warm-start checkpoint kept."""
    return float(dict((int(s), p) for s, p in warm["probes"])[_kept_steps(warm)])


def report(out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Tables (IQM, stratified-bootstrap 95 % CIs, probability of improvement), pass@k and learning-curve PNGs of
    every finished seed; writes ``OUT/results.md`` and ``OUT/summary.json``."""
    import numpy as np
    from rliable import library as rly
    from rliable import metrics

    lines, summary = [], {}
    for name, exp in EXPERIMENTS.items():
        runs = finished(out, name)
        if not runs:
            continue
        gated = [r["seed"] for r in runs if r.get("gated")]
        full = [r for r in runs if not r.get("gated")]
        lines += [f"## Experiment {name}: {exp.title}", ""]
        below = [r["seed"] for r in runs if r.get("below_gate")]
        lines.append(
            f"{len(runs)} seeds finished ({len(full)} with every arm; gated by the pilot gate: {gated or 'none'}"
            + (f"; arms run below the gate with --ignore-gate: {below}" if below else "")
            + ")."
        )
        for r in runs:
            g = r["gate"]
            lines.append(
                f"- seed {r['seed']}: warm start {_kept_steps(r['warm_start'])} SFT steps (probe "
                f"{_kept_probe(r['warm_start']):.2f}, passed: {r['warm_start']['passed']}, initialisations tried: "
                f"{len(r['warm_start'].get('attempts', [None]))}); pilot gate "
                f"{g['solved']:.3f} ≥ {g['needed']}: {g['passed']}; held-out overlap {r['tasks']['overlap']} "
                f"(dropped {r['tasks']['dropped']})"
            )
        lines.append("")
        models = [m for m in MODELS if all(m in r["eval"] for r in full)] if full else ["warm_start"]
        source = full or runs
        conditions = list(exp.conditions)
        scores = {
            m: np.array([[r["eval"][m]["conditions"][c]["mean_score"] for c in conditions] for r in source])
            for m in models
        }
        validity = {
            m: np.array([[r["eval"][m]["conditions"][c]["format_valid"] for c in conditions] for r in source])
            for m in models
        }
        summary[name] = {"seeds": [r["seed"] for r in source], "models": {}}
        lines += [
            f"Held-out mean score, IQM over {len(source)} seeds [95 % stratified-bootstrap CI] "
            f"(format validity, mean):",
            "",
            "| model | " + " | ".join(conditions) + " | hard conditions (IQM) |",
            "| --- | " + " | ".join("---:" for _ in conditions) + " | ---: |",
        ]
        hard = [conditions.index(c) for c in exp.hard_conditions]
        reps = args.bootstrap_reps
        for m in models:
            cells = []
            per = {}
            for j, c in enumerate(conditions):
                point, ci = rly.get_interval_estimates(
                    {m: scores[m][:, [j]]}, lambda x: np.array([metrics.aggregate_iqm(x)]), reps=reps
                )
                lo, hi = ci[m][:, 0]
                per[c] = {
                    "iqm": float(point[m][0]),
                    "ci": [float(lo), float(hi)],
                    "format_valid": float(validity[m][:, j].mean()),
                }
                cells.append(f"{point[m][0]:.3f} [{lo:.2f}, {hi:.2f}] ({validity[m][:, j].mean():.2f})")
            point, ci = rly.get_interval_estimates(
                {m: scores[m][:, hard]}, lambda x: np.array([metrics.aggregate_iqm(x)]), reps=reps
            )
            lo, hi = ci[m][:, 0]
            per["hard"] = {"iqm": float(point[m][0]), "ci": [float(lo), float(hi)]}
            summary[name]["models"][m] = per
            lines.append(f"| {m} | " + " | ".join(cells) + f" | {point[m][0]:.3f} [{lo:.2f}, {hi:.2f}] |")
        lines.append("")
        if "grpo" in models:
            lines += ["Probability of improvement of GRPO over each arm on the hard conditions [95 % CI]:", ""]
            summary[name]["probability_of_improvement"] = {}
            for m in models:
                if m == "grpo":
                    continue
                pair = {f"grpo,{m}": (scores["grpo"][:, hard], scores[m][:, hard])}
                point, ci = rly.get_interval_estimates(pair, metrics.probability_of_improvement, reps=reps)
                key = f"grpo,{m}"
                lo, hi = ci[key][:, 0] if ci[key].ndim == 2 else ci[key]
                summary[name]["probability_of_improvement"][m] = {
                    "p": float(np.ravel(point[key])[0]),
                    "ci": [float(lo), float(hi)],
                }
                lines.append(f"- P(GRPO > {m}) = {float(np.ravel(point[key])[0]):.2f} [{lo:.2f}, {hi:.2f}]")
            lines.append("")
        lines += _pass_at_k_table(exp, source, models, summary[name])
        _plots(out, exp, source, models)
        lines += [
            f"![pass@k]({name}-pass_at_k.png)",
            f"![learning curves]({name}-learning_curves.png)",
            "",
        ]
        canary = out / name / "canaries.json"
        if canary.exists():
            lines += ["Canaries (`envkit validate` check 17, per env config):", ""]
            for label, c in json.loads(canary.read_text()).items():
                lines.append(f"- {label}: {c['status']} — {c['reason']}")
            lines.append("")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print("\n".join(lines))
    return summary


def _pass_at_k_table(exp: Experiment, runs: list[dict], models: list[str], summary: dict) -> list[str]:
    ks = [1, 2, 4, 8, 16, 32, 64]
    lines = [f"pass@k on held-out {exp.pass_at_k} (mean over seeds; unbiased estimator):", ""]
    n = len(runs[0]["eval"]["warm_start"]["pass@k"]["pass@k"])
    ks = [k for k in ks if k <= n]
    lines += [
        "| model | " + " | ".join(f"k={k}" for k in ks) + " |",
        "| --- | " + " | ".join("---:" for _ in ks) + " |",
    ]
    summary["pass@k"] = {}
    for m in models:
        curve = [sum(r["eval"][m]["pass@k"]["pass@k"][k - 1] for r in runs) / len(runs) for k in range(1, n + 1)]
        summary["pass@k"][m] = curve
        lines.append(f"| {m} | " + " | ".join(f"{curve[k - 1]:.3f}" for k in ks) + " |")
    return [*lines, ""]


def _plots(out: Path, exp: Experiment, runs: list[dict], models: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    for m in models:
        n = len(runs[0]["eval"][m]["pass@k"]["pass@k"])
        curve = [sum(r["eval"][m]["pass@k"]["pass@k"][k] for r in runs) / len(runs) for k in range(n)]
        axis.plot(range(1, n + 1), curve, label=m)
    axis.set_xscale("log", base=2)
    axis.set_xlabel("k")
    axis.set_ylabel(f"pass@k, held-out {exp.pass_at_k}")
    axis.set_title(f"Experiment {exp.name}: {exp.title}", fontsize=9)
    axis.legend(fontsize=8)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(out / f"{exp.name}-pass_at_k.png", dpi=110)
    plt.close(figure)

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for arm, color in (("grpo", "C0"), ("rft", "C1")):
        for i, r in enumerate(runs):
            if arm in r and r[arm]["curve"]:
                x, y = zip(*r[arm]["curve"], strict=True)
                left.plot(x, y, color=color, alpha=0.6, label=arm if i == 0 else None)
    left.set_xlabel("env episodes")
    left.set_ylabel("training-batch mean score")
    left.set_title("GRPO and RFT against env episodes", fontsize=9)
    for arm, color in (("sft_plateau", "C2"), ("privileged", "C3")):
        for i, r in enumerate(runs):
            if arm in r:
                x, y = zip(*r[arm]["curve"], strict=True)
                right.plot(x, y, color=color, alpha=0.6, label=arm if i == 0 else None)
    right.set_xlabel("SFT steps from the warm start")
    right.set_ylabel("validation score (training condition)")
    right.set_title("SFT arms' validation curves (checkpoint selection)", fontsize=9)
    for axis in (left, right):
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:  # a gated experiment has no arms to draw
            axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out / f"{exp.name}-learning_curves.png", dpi=110)
    plt.close(figure)


# ---- the command line ------------------------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    """The command line (``--quick`` shrinks every size for a smoke test)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--experiments", nargs="+", default=list(EXPERIMENTS), choices=list(EXPERIMENTS))
    p.add_argument("--seeds", type=int, default=5, help="independent seeds per experiment (each its own warm start)")
    p.add_argument("--seed-offset", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/learning_rl_runs)")
    p.add_argument("--report", action="store_true", help="aggregate the finished seeds; run nothing")
    p.add_argument("--quick", action="store_true", help="a few steps on a few tasks: the pipeline end to end")
    p.add_argument("--demos", type=int, default=4000, help="oracle demonstrations (task seeds 0 … N-1)")
    p.add_argument("--train-tasks", type=int, default=4000, help="GRPO/RFT training task seeds 0 … N-1")
    p.add_argument("--validation-tasks", type=int, default=64)
    p.add_argument("--eval-tasks", type=int, default=64, help="held-out tasks per condition")
    p.add_argument("--eval-samples", type=int, default=2, help="episodes per held-out task")
    p.add_argument("--pass-k-tasks", type=int, default=16)
    p.add_argument("--pass-k-samples", type=int, default=64, help="samples per task of the pass@k curves (k ≤ this)")
    p.add_argument("--probe-tasks", type=int, default=64)
    p.add_argument("--probe-threshold", type=float, default=0.5, help="the warm start's probe must reach this")
    p.add_argument("--warm-chunk", type=int, default=150, help="warm-start SFT steps between probes")
    p.add_argument("--warm-max-steps", type=int, default=2100, help="the warm start's cap")
    p.add_argument("--warm-learning-rate", type=float, default=3e-3)
    p.add_argument("--warm-warmup-steps", type=int, default=20, help="the warm start's linear learning-rate warm-up")
    p.add_argument(
        "--warm-attempts", type=int, default=3, help="fresh initialisations tried when a warm start fails its probe"
    )
    p.add_argument(
        "--gate", type=float, default=0.02, help="the pilot gate: warm start's solve rate on the hard condition"
    )
    p.add_argument("--gate-tasks", type=int, default=64)
    p.add_argument("--gate-samples", type=int, default=8, help="episodes per gate task (64 × 8: a 2 % rate is 10)")
    p.add_argument("--ignore-gate", action="store_true", help="run the arms even when the pilot gate fails")
    p.add_argument("--grpo-steps", type=int, default=80)
    p.add_argument("--grpo-batch-size", type=int, default=32, help="episodes per GRPO step")
    p.add_argument("--num-generations", type=int, default=8, help="GRPO's group size; RFT's samples per task")
    p.add_argument("--grpo-learning-rate", type=float, default=5e-4)
    p.add_argument("--rft-rounds", type=int, default=8)
    p.add_argument("--rft-steps-per-round", type=int, default=40)
    p.add_argument("--rft-learning-rate", type=float, default=5e-4)
    p.add_argument("--sft-learning-rate", type=float, default=5e-4, help="the SFT arms' (constant)")
    p.add_argument("--sft-batch-size", type=int, default=16)
    p.add_argument("--plateau-every", type=int, default=150, help="SFT steps between validation evaluations")
    p.add_argument("--patience", type=int, default=2, help="evaluations without improvement that end SFT")
    p.add_argument("--plateau-max-steps", type=int, default=1200)
    p.add_argument("--baseline-seconds", type=float, default=None, help="cap the compute-matched SFT's CPU time")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--max-turns", type=int, default=8)
    p.add_argument("--max-completion-tokens", type=int, default=512)
    p.add_argument("--eval-concurrency", type=int, default=64)
    p.add_argument("--vocab-size", type=int, default=2048, help="the tiny tokenizer's BPE vocabulary (at most)")
    p.add_argument("--hidden-size", type=int, default=128)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--bootstrap-reps", type=int, default=2000)
    return p


QUICK = {
    "seeds": 1,
    "demos": 8,
    "train_tasks": 16,
    "validation_tasks": 2,
    "eval_tasks": 2,
    "eval_samples": 1,
    "pass_k_tasks": 2,
    "pass_k_samples": 4,
    "probe_tasks": 2,
    "probe_threshold": 0.0,
    "warm_chunk": 2,
    "warm_max_steps": 2,
    "gate": 0.0,
    "gate_tasks": 2,
    "gate_samples": 1,
    "grpo_steps": 2,
    "grpo_batch_size": 4,
    "num_generations": 2,
    "rft_rounds": 2,
    "rft_steps_per_round": 1,
    "sft_batch_size": 4,
    "plateau_every": 1,
    "patience": 1,
    "plateau_max_steps": 2,
    "baseline_seconds": 1.0,
    "max_new_tokens": 8,
    "max_turns": 3,
    "max_completion_tokens": 64,
    "bootstrap_reps": 50,
}
"""``--quick``: every size shrunk so the whole pipeline runs in a few minutes (figures meaningless; the gates let
everything through)."""


RESUMABLE_WITH_OTHER = ("experiments", "seeds", "seed_offset", "out", "report")
"""Flags a resumed run may change: which experiments and seeds it runs, not how."""


def same_protocol(path: Path, args: argparse.Namespace) -> None:
    """Record an experiment's settings in ``path``; exit with one line when an earlier run there used other ones (a
    resumed run that changed a setting would mix two protocols in one experiment's seeds)."""
    settings = json.loads(
        json.dumps({k: v for k, v in vars(args).items() if k not in RESUMABLE_WITH_OTHER}, default=str)
    )
    if path.exists():
        before = json.loads(path.read_text())
        changed = [k for k in settings if k in before and before[k] != settings[k]]
        if changed:
            was = ", ".join(f"--{k.replace('_', '-')} {before[k]!r} (now {settings[k]!r})" for k in changed)
            raise SystemExit(
                f"error: {path.parent} was run with {was}: resume with the same settings, or start anew with "
                "another --out"
            )
    path.write_text(json.dumps(settings, indent=1))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run (or, with ``--report``, aggregate) the experiments; returns the report's summary."""
    args = parser().parse_args(argv)
    if args.quick:
        defaults = parser().parse_args([])
        for key, value in QUICK.items():
            if getattr(args, key) == getattr(defaults, key):
                setattr(args, key, value)
    out = args.out or (
        Path(tempfile.mkdtemp(prefix="envkit-learning-rl-")) if args.quick else HERE / "learning_rl_runs"
    )
    out.mkdir(parents=True, exist_ok=True)
    if not args.report:
        for name in args.experiments:
            exp = EXPERIMENTS[name]
            (out / name).mkdir(exist_ok=True)
            same_protocol(out / name / "args.json", args)
            if not (out / name / "canaries.json").exists():
                (out / name / "canaries.json").write_text(json.dumps(canaries(exp), indent=1))
            for seed in range(args.seed_offset, args.seed_offset + args.seeds):
                path = out / name / f"seed-{seed}.json"
                if path.exists():
                    print(f"[{name} seed {seed}] finished earlier: {path}", flush=True)
                    continue
                result = Seed(exp, seed, args, out).run()
                path.write_text(json.dumps(result, indent=1, default=str))
                print(f"[{name} seed {seed}] written: {path}", flush=True)
    return report(out, args)


if __name__ == "__main__":
    main()
