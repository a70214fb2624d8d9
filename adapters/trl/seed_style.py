"""Training a seed-style class (``build_dataset`` / ``score_episode`` / ``get_tools``) with ``envkit train``: the class
generates and scores in TRL's own loop, so envkit's episode flags do not apply to it (:func:`check_seed_style_flags`);
its dataset, reward and tools become GRPOTrainer's arguments (:func:`seed_style_setup`); its held-out eval plays it as
an envkit tool env (:func:`seed_style_eval_factory`). A tool-calling class trains through TRL's tool loop, which
parses completions with the tokenizer's response template (:func:`set_bundled_response_template` for envkit's bundled
chat template)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from envkit.adapters.trl.config import TrainArguments, TrainUsageError
from envkit.util.text import one_line

ENVKIT_ENV_ONLY = (
    "max_turns",
    "max_episode_tokens",
    "max_completion_tokens",
    "concurrency",
    "step_timeout",
    "generate_timeout",
    "env_workers",
    "ray_address",
    "verify_vllm_sync",
    "train_tasks",
)
"""TrainArguments fields that only envkit envs use (seed-style classes generate and score in TRL's own loop, on all of
their build_dataset rows).
tests/test_train.py holds every field to be here or named there as one a seed-style run uses."""
SEED_STYLE_IN_FORCE = {"verify_vllm_sync": False}
"""What a seed-style run does anyway (no vLLM sync check): asking for it is not refused."""


def check_seed_style_flags(args: TrainArguments) -> None:
    """Refuse, in one line, envkit-env-only flags set (on the command line or in --config) for a seed-style class."""
    defaults = {f.name: f.default for f in dataclasses.fields(TrainArguments)}
    given = {name: getattr(args, name) for name in ENVKIT_ENV_ONLY}
    given["max_completion_tokens"] = args.max_completion_tokens_given  # the field itself may hold the auto default
    flags = [
        "--" + name.replace("_", "-")
        for name, value in given.items()
        if value != defaults[name] and value != SEED_STYLE_IN_FORCE.get(name, defaults[name])
    ]
    if flags:
        raise TrainUsageError(
            f"{', '.join(flags)} appl{'ies' if len(flags) == 1 else 'y'} to envkit envs only; seed-style classes "
            "generate and score in TRL's own loop, on all of their build_dataset rows"
        )


BUNDLED_RESPONSE_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}
"""transformers' response template (``tokenizer.response_template``) of envkit's bundled ChatML template
(:func:`envkit.chat.bundled_template`: ``<tool_call>{"name", "arguments"}</tool_call>`` blocks after the text): what
TRL's tool loop parses a completion with. envkit sets it on a tokenizer whose template is the bundled one (the tiny
models and SmolLM2 folders envkit writes), which TRL cannot recognise by name."""


def set_bundled_response_template(tokenizer: Any) -> bool:
    """Give ``tokenizer`` :data:`BUNDLED_RESPONSE_TEMPLATE` when its chat template is envkit's bundled one and it has
    no response template yet; return whether it was set."""
    import copy

    from envkit.chat.render import bundled_template

    template = getattr(tokenizer, "chat_template", None)
    if getattr(tokenizer, "response_template", None) is not None or not isinstance(template, str):
        return False
    if template.strip() != bundled_template().strip():
        return False
    tokenizer.response_template = copy.deepcopy(BUNDLED_RESPONSE_TEMPLATE)
    return True


def seed_style_setup(
    instance: Any, tokenizer: Any, log: Any = print, *, max_error_rate: float | None = 0.5
) -> dict[str, Any]:
    """Dataset from build_dataset, reward from score_episode (:func:`score_episode_reward`), tools from get_tools
    (TRL's own tool loop).

    Text prompts (build_dataset rendered them, tools included, with the chat template) train as they are, without
    TRL's tool loop, which needs conversations: one line says so."""
    dataset = instance.build_dataset(tokenizer)
    if not hasattr(dataset, "column_names"):
        from datasets import Dataset

        dataset = Dataset.from_list(list(dataset))
    if "prompt" not in dataset.column_names:
        raise TrainUsageError(f"{type(instance).__name__}.build_dataset returned no 'prompt' column")
    if "case_idx" not in dataset.column_names:
        dataset = dataset.add_column("case_idx", list(range(len(dataset))))

    reward = score_episode_reward(instance, tokenizer, max_error_rate=max_error_rate, log=log)
    kwargs: dict[str, Any] = {"reward_funcs": [reward], "train_dataset": dataset}
    tools = list(instance.get_tools() or []) if hasattr(instance, "get_tools") else []
    if tools and isinstance(dataset[0]["prompt"], str):
        log(
            f"{type(instance).__name__}: build_dataset's prompts are text with the tools already in it: training on "
            "them as they are, each completion scored by score_episode; TRL's tool loop is not used (it runs only "
            "on conversational prompts)"
        )
    elif tools:
        set_bundled_response_template(tokenizer)
        if getattr(tokenizer, "response_template", None) is None:
            from trl.chat_template_utils import add_response_schema

            try:
                add_response_schema(tokenizer)
            except ValueError:
                raise TrainUsageError(
                    "get_tools() needs TRL's tool loop, which needs a response parser for this chat template: set "
                    "tokenizer.response_template in the model folder (see transformers' chat response parsing docs)"
                ) from None
        kwargs["tools"] = tools
    return kwargs


def score_episode_reward(
    instance: Any, tokenizer: Any, *, max_error_rate: float | None = 0.5, log: Any = print
) -> Callable[..., list[float | None]]:
    """GRPOTrainer's reward function of a seed-style ``instance``: ``score_episode(model, tokenizer, completion,
    case_idx)`` of each completion (``model``: the trainer's, once the function's ``trainer`` attribute is set).

    A call that raises, or returns anything but a number in [0, 1] (NaN included; the range ``envkit validate`` and the
    held-out eval hold it to, :func:`~envkit.adapters.trl.env_classes.seed_score`), fails its episode, as an env that
    raises fails an envkit episode: its reward is ``None``, which GRPOTrainer leaves out of its group's mean and
    standard deviation (advantage 0; unlike an envkit env's failed episode, its tokens stay in TRL's loss, where only
    a KL term acts on them). The first failure is said in one line; each step's share is logged as
    ``envkit/error_rate``; past ``max_error_rate`` (``None``: never) training stops
    (:class:`~envkit.adapters.trl.metrics.ErrorRateExceeded`, naming the first error)."""
    from envkit.adapters.trl.env_classes import seed_score
    from envkit.adapters.trl.metrics import check_failures, gather_pairs, in_training, is_main_process

    spec = f"{type(instance).__name__}.score_episode"
    said: list[str] = []

    def score_episode_reward(completions: list[Any], case_idx: list[int], **kwargs: Any) -> list[float | None]:
        trainer = score_episode_reward.trainer  # type: ignore[attr-defined]
        model = trainer.model if trainer is not None else None
        rewards: list[float | None] = []
        errors: list[str] = []
        for completion, index in zip(completions, case_idx, strict=True):
            try:
                value = instance.score_episode(model, tokenizer, completion_text(completion), int(index))
                rewards.append(seed_score(value, spec))
            except Exception as error:  # the class's fault, contained: this episode fails, training goes on
                rewards.append(None)
                errors.append(f"case_idx {int(index)}: {type(error).__name__}: {error}")
        errors, total = gather_pairs(trainer, errors, len(rewards))  # all processes stop together, or none
        if errors and not said and (trainer is None or is_main_process(trainer)):
            said.append(errors[0])
            log(
                f"{spec} failed ({one_line(errors[0], 300)}): such an episode gets no reward (left out of "
                "its group, as a failed env episode) and counts in envkit/error_rate (the progress bar's 'failed'); "
                "this is said once"
            )
        metrics = getattr(trainer, "_metrics", None)
        if metrics is not None and total:
            metrics["train" if in_training(trainer) else "eval"]["envkit/error_rate"].append(len(errors) / total)
        step = getattr(getattr(trainer, "state", None), "global_step", None)
        check_failures(errors, total, max_error_rate, step=step, fix=f"{spec} (envkit validate checks it)")
        return rewards

    score_episode_reward.trainer = None  # type: ignore[attr-defined]
    return score_episode_reward


def seed_style_eval_factory(
    label: str, env_config: dict[str, Any], args: TrainArguments, kwargs: dict[str, Any]
) -> Any:
    """The env the eval of a seed-style class plays (``--eval-tasks``): the class as an envkit tool env
    (:func:`envkit.adapters.trl.env_classes.seed_style_env_class`: task seed ``s`` is build_dataset's row
    ``s % len(rows)``, built with the model's tokenizer, scored by score_episode). Text prompts cannot be played (the
    env renders the opening itself): asking for an eval of them is one line."""
    from envkit.adapters.trl.env_classes import seed_style_spec
    from envkit.workers import EnvFactory

    if args.eval_tasks > 0 and not all(isinstance(prompt, list) for prompt in kwargs["train_dataset"]["prompt"]):
        raise TrainUsageError(
            "--eval-tasks plays build_dataset's prompts as conversations, and this class's are text: use "
            '--eval-tasks 0, or return prompts as lists of {"role", "content"} messages'
        )
    return EnvFactory(seed_style_spec(label), {**env_config, "envkit_tokenizer": args.model})


def completion_text(completion: Any) -> str:
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(str(m.get("content") or "") for m in completion if isinstance(m, dict))
    return str(completion)
