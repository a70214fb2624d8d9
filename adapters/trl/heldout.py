"""Held-out evaluation tasks of ``envkit train`` (the synchronous and the ``--async`` path): their seeds, whether
any of them is a training task (then the eval is not called held-out), and what evaluating them during training
(``--eval-strategy``) and keeping the best model by them need, and the eval itself before and after training
(:func:`evaluate_heldout`, sharded across training processes).

A task is what :func:`envkit.core.env.task_identity` says: the env's ``info["task_id"]`` when its reset names one
(tasks that differ in hidden state: each seed its own database), else its opening messages.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from envkit.adapters.trl.config import TrainArguments, TrainUsageError, episode_limits
from envkit.adapters.trl.metrics import ErrorRateExceeded, check_error_rate
from envkit.core.env import TASK_ID_KEY, opening_digest, task_identity

EVAL_SEED_OFFSET = 1_000_000
"""Held-out evaluation tasks use seeds from here on, far from the training seeds ``0 … train_tasks-1``."""


def eval_seeds(args: Any) -> list[int]:
    """The eval task seeds: ``--eval-tasks`` of them from :data:`EVAL_SEED_OFFSET` on."""
    return list(range(EVAL_SEED_OFFSET, EVAL_SEED_OFFSET + args.eval_tasks))


def opening_key(messages: list[dict[str, Any]]) -> str:
    """A digest of a task's opening messages (roles and contents): two tasks with one key look the same to the model."""
    return opening_digest(messages)


@dataclass(frozen=True)
class EvalOverlap:
    """How many eval tasks are training tasks.

    Args:
        seen: Eval tasks that are also training tasks.
        total: Eval tasks.
        by_task_id: Whether tasks were told apart by the env's ``info["task_id"]`` (else by opening messages).
    """

    seen: int
    total: int
    by_task_id: bool

    @property
    def label(self) -> str:
        """What to call the eval (:func:`eval_label`)."""
        return eval_label(self.seen, self.total)

    def warning(self, train_tasks: int, *, seed_style: bool = False) -> str:
        """The warning line of an eval that is not held out: how its tasks are training tasks and what to do.

        Args:
            train_tasks: ``--train-tasks``.
            seed_style: The env is a seed-style class (its tasks are its ``build_dataset`` rows).

        Returns:
            One line starting ``warning:``.
        """
        same = f"have the task id (info[{TASK_ID_KEY!r}]) of" if self.by_task_id else "open with the same messages as"
        if seed_style:
            fix = "a seed-style class's tasks are its build_dataset rows, which all train"
        else:
            fix = f"use an env with more distinct tasks, or fewer --train-tasks (now {train_tasks})"
            if not self.by_task_id:
                fix += (
                    f"; if tasks that open alike differ in hidden state (each seed its own database), name each task "
                    f"in reset()'s info[{TASK_ID_KEY!r}]"
                )
        return (
            f"warning: {self.seen} of {self.total} eval tasks (seeds from {EVAL_SEED_OFFSET}) {same} one of the "
            f"training tasks: the eval is not held out; {fix}"
        )


def eval_overlap(training_prompts: Any, factory: Any, seeds: list[int]) -> EvalOverlap:
    """How many of the eval tasks ``seeds`` are training tasks (``training_prompts``: the training dataset's opening
    conversations). Distinct seeds do not make distinct tasks: an env with 5 questions gives every eval seed a training
    twin, and its "held-out" score would measure memorisation.

    Tasks are compared by :func:`~envkit.core.env.task_identity`. When an eval task's reset names a task id, the
    training tasks' are compared (read by :func:`~envkit.adapters.trl.build_dataset` onto the prompts; a prompt without
    one is reset again from the seed it carries): one question asked of each seed's own database is then a new task
    per database. Otherwise the training prompts' openings are hashed.

    Raises:
        TrainUsageError: A reset's ``info["task_id"]`` is not a task id.
    """
    from envkit.adapters.trl.dataset import SEED_KEY, TASK_KEY

    env = factory()
    try:
        evals = [task_key(*env.reset(seed=seed)) for seed in seeds]
        by_task_id = any(key.startswith("task_id:") for key in evals)
        training = set()
        for prompt in training_prompts:
            first = prompt[0] if prompt and isinstance(prompt[0], dict) else {}
            if by_task_id and first.get(TASK_KEY) is not None:  # build_dataset read it when it reset the seed
                training.add(first[TASK_KEY])
            elif by_task_id and first.get(SEED_KEY) is not None:
                training.add(task_key(*env.reset(seed=int(first[SEED_KEY]))))
            else:
                training.add(f"opening:{opening_digest(prompt)}")
        return EvalOverlap(sum(key in training for key in evals), len(seeds), by_task_id)
    finally:
        close = getattr(env, "close", None)
        if callable(close):
            close()


def check_heldout(
    training_prompts: Any, factory: Any, args: Any, summary: dict[str, Any], *, seed_style: bool, log: Any | None
) -> str:
    """The held-out check of both training paths: how many eval tasks the training set also holds (by task identity)
    goes into ``summary["eval_tasks_seen_in_training"]`` and, when some do, a warning line to ``log`` (pass ``None``
    on every process but the main one).

    Args:
        training_prompts: The training dataset's ``prompt`` column.
        factory: Builds the env the eval plays.
        args: The run's :class:`~envkit.adapters.trl.config.TrainArguments`.
        summary: The run's summary, updated in place.
        seed_style: The env is a seed-style class.
        log: Where the warning goes, or ``None``.

    Returns:
        What to call the eval: ``"held-out"`` only when no eval task is a training task.
    """
    overlap = eval_overlap(training_prompts, factory, eval_seeds(args))
    summary["eval_tasks_seen_in_training"] = overlap.seen
    if log is not None and overlap.seen:
        log(overlap.warning(args.train_tasks, seed_style=seed_style))
    return overlap.label


def task_key(opening: list[dict[str, Any]], info: dict[str, Any]) -> str:
    """:func:`~envkit.core.env.task_identity`, a bad task id as a :class:`TrainUsageError` (one line)."""
    try:
        return task_identity(opening, info)
    except ValueError as error:
        raise TrainUsageError(str(error)) from None


def eval_tasks_seen_in_training(training_prompts: Any, factory: Any, seeds: list[int]) -> int:
    """How many of the eval tasks ``seeds`` are training tasks: :func:`eval_overlap`'s ``seen``."""
    return eval_overlap(training_prompts, factory, seeds).seen


def eval_label(seen: int, total: int) -> str:
    """What to call the eval: "held-out" only when none of its ``total`` tasks was seen in training."""
    return "held-out" if seen == 0 else f"eval ({seen} of {total} tasks seen in training)"


BEST_MODEL_METRIC = "envkit/mean_score"
"""What ``--load-best-model-at-end`` and ``--save-strategy best`` choose by unless ``--metric-for-best-model`` is given:
the evaluations' mean score (logged as ``eval_envkit/mean_score``)."""


def check_periodic_eval(args: Any, config: Any, *, seed_style: bool) -> None:
    """``--eval-strategy steps|epoch``: TRL's own evaluation, every ``--eval-steps``, on the held-out tasks of
    ``--eval-tasks`` (their episodes scored as in training; ``eval_envkit/*`` and ``eval_reward`` in the log, and so
    ``--metric-for-best-model envkit/mean_score --load-best-model-at-end``). Refuse, in one line, what has no
    held-out tasks to evaluate (``--eval-tasks 0``, a seed-style class, ``--async``), and a best model with no
    evaluations to choose it by, which Trainer would raise late or ignore. A best model is chosen by the evaluations'
    mean score unless ``--metric-for-best-model`` says otherwise (transformers' default, the loss, measures nothing
    about the policy in GRPO)."""
    best = "--save-strategy best" if config.save_strategy == "best" else "--load-best-model-at-end"
    if config.save_strategy == "best" or config.load_best_model_at_end:
        if config.eval_strategy == "no":
            raise TrainUsageError(f"{best} needs --eval-strategy steps (or epoch): the best is the best evaluation")
        if "metric_for_best_model" not in args.grpo_fields_given:
            config.metric_for_best_model = BEST_MODEL_METRIC
            if "greater_is_better" not in args.grpo_fields_given:
                config.greater_is_better = True
    if config.eval_strategy == "no":
        return
    strategy = f"--eval-strategy {config.eval_strategy.value}"
    if args.async_grpo:
        raise TrainUsageError(f"{strategy} is not supported with --async: its held-out eval runs before and after")
    if seed_style:
        raise TrainUsageError(
            f"{strategy} needs held-out tasks, and a seed-style class has none apart from its training rows"
        )
    if args.eval_tasks == 0:
        raise TrainUsageError(f"{strategy} evaluates on the held-out tasks of --eval-tasks N: give N > 0")


def eval_shard(seeds: list[int], process_index: int, num_processes: int) -> list[int]:
    """The held-out task seeds one training process evaluates: every ``num_processes``-th, from its index on."""
    return list(seeds[process_index::num_processes])


def evaluate_heldout(
    trainer: Any,
    factory: Any,
    tokenizer: Any,
    args: TrainArguments,
    env_workers: Any = None,
    when: str = "before training",
) -> dict[str, float]:
    """The held-out eval, sharded: each process plays its share of the tasks (:func:`eval_shard`), all of a task's
    samples together; the episodes of all processes are gathered and summarized on each (a collective call)."""
    from envkit.adapters.trl import gather_episodes, trainer_sampling, trainer_template_kwargs
    from envkit.backends import TransformersBackend
    from envkit.rollout import RolloutEngine, summarize

    model = trainer.accelerator.unwrap_model(trainer.model)
    # The same episode shape as training: template variables (e.g. enable_thinking) and completion budget.
    engine = RolloutEngine(
        factory,
        TransformersBackend(model, tokenizer),
        tokenizer,
        **episode_limits(args),
        template_kwargs=trainer_template_kwargs(trainer),
        env_workers=env_workers,
        # The held-out eval's own bar (turns, and tokens inside a turn): with a real model on CPU it takes minutes.
        progress=not trainer.args.disable_tqdm and trainer.accelerator.is_main_process,
    )
    accelerator = trainer.accelerator
    seeds = eval_shard(
        eval_seeds(args),
        int(accelerator.process_index),
        int(accelerator.num_processes),
    )
    # Per-request seeds derive from this seed and the task, never the process: a sharded eval samples what one
    # process evaluating every task would.
    sampling = dataclasses.replace(trainer_sampling(trainer), seed=0)
    episodes = engine.run(seeds, args.eval_samples, sampling) if seeds else []
    played = gather_episodes(trainer, episodes)
    check_heldout_errors(played, args, when)  # the same episodes on every process: all stop together
    return summarize(played)


class HeldOutEvalFailed(ErrorRateExceeded):
    """More than ``--max-error-rate`` of a held-out eval's episodes failed (its message names the eval and the first
    error)."""


def check_heldout_errors(episodes: list[Any], args: TrainArguments, when: str = "before training") -> None:
    """Raise :class:`HeldOutEvalFailed` when more than ``--max-error-rate`` of the held-out episodes failed: a failed
    episode counts 0 in the eval's mean score, so the score would report the failures as a model that learned
    nothing. ``when``: ``"before training"`` or ``"after training"``, for the message."""
    try:
        check_error_rate(episodes, args.max_error_rate)
    except ErrorRateExceeded as error:
        raise HeldOutEvalFailed(f"the held-out eval {when}: {error}") from None


def heldout_line(name: str, when: str, summary: dict[str, Any], before: dict[str, Any] | None = None) -> str:
    """The eval's log line: its mean score, how many of its episodes failed (they count 0) when any did, and the
    ``before`` eval's mean score."""
    line = f"{name} {when}: mean score {summary['mean_score']:.3f}"
    failed = round(summary.get("error_rate", 0.0) * summary.get("episodes", 0))
    if failed:
        line += f" ({failed} of {summary['episodes']:.0f} episodes failed, counted 0)"
    return line + (f" (before {before['mean_score']:.3f})" if before is not None else "")
