"""What GRPOTrainer learns from envkit's rollouts, checked on GRPOTrainer's own tensors and logs.

* A base model's eos is not its chat template's end of turn: finished episodes must still look finished to TRL
  (``mask_truncated_completions``, ``completions/clipped_ratio``), cut ones truncated.
* Reward functions see each episode's transcript (``envkit_messages``).
* Steps in which every group scored equally (no advantage, no gradient) are counted and, a few in a row, said.
"""

from __future__ import annotations

import itertools
import os
import re
import threading
from typing import ClassVar

import pytest
from helpers import ENGINE_DEADLINE_S, RELEASE_CAP_S, CheckedOracleBackend, CounterEnv

import envkit
from envkit.adapters.trl import (
    ZERO_VARIANCE_STEPS,
    build_dataset,
    env_score_reward,
    make_rollout_func,
    zero_variance_groups,
)
from envkit.backends import Generation, ScriptedBackend
from envkit.rollout import Episode
from envkit.testing import build_tiny_model, load_shared_tokenizer

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def _config(tmp_path, **fields):
    from trl import GRPOConfig

    values = {
        "output_dir": str(tmp_path),
        "per_device_train_batch_size": 4,
        "num_generations": 2,
        "max_steps": 1,
        "bf16": False,
        "use_cpu": True,
        "report_to": "none",
        "beta": 0.0,
        "logging_steps": 1,
        "save_strategy": "no",
        "disable_tqdm": True,
    }
    values.update(fields)
    return GRPOConfig(**values)


def _trainer(model_dir, tokenizer, config, env_factory, seeds, rollout, reward_funcs=env_score_reward):
    from transformers import AutoModelForCausalLM
    from trl import GRPOTrainer

    tokenizer.padding_side = "left"
    return GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(str(model_dir)),
        args=config,
        reward_funcs=reward_funcs,
        train_dataset=build_dataset(env_factory, seeds),
        processing_class=tokenizer,
        rollout_func=rollout,
    )


# ---- a base model's eos ---------------------------------------------------------------------------------------------
class OneReply(envkit.Env):
    """One assistant turn; the score is the reply's length, so groups are not all equal."""

    max_turns = 1

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        return [{"role": "user", "content": f"Task {seed}: say hello."}], {}

    def step(self, action):
        return [], self.score(), True, False, {}

    def score(self) -> float:
        said = [m["content"] for m in self.messages if m["role"] == "assistant"]
        return len(said[-1]) / 100 if said else 0.0


def endings_backend(tokenizer, stop_token: int) -> ScriptedBackend:
    """How the reply to task ``seed`` ends: 0 on the template's ``<|im_end|>``; 1 on the base model's eos
    ``<|endoftext|>`` (another control token: the engine drops it and closes the turn with ``<|im_end|>``); 2 on an
    extra stop token from ``generation_kwargs`` (a plain token: kept, and the turn closed); 3 cut at
    ``max_new_tokens``; 4 on the extra stop token as the per-turn budget's last token (stopped, not cut)."""
    words = tokenizer.encode(" hello there", add_special_tokens=False)
    special = tokenizer.convert_tokens_to_ids

    def reply(request) -> Generation:
        task = int(re.findall(r"Task (\d+)", request.text)[-1])
        stops, budget = request.sampling.stop_token_ids, request.max_new_tokens
        assert stop_token in stops and special("<|im_end|>") in stops
        if task == 3:
            return Generation((words * budget)[:budget], [-0.5] * budget, "length")
        if task == 4:
            return Generation([*(words * budget)[: budget - 1], stop_token], [-0.5] * budget, "stop")
        tokens = [*words, [special("<|im_end|>"), special("<|endoftext|>"), stop_token][task]]
        return Generation(tokens, [-0.5] * len(tokens), "stop")

    # Generation replies, as is: each ending is stated, not left to the scripted backend's own cutting.
    return ScriptedBackend(reply, tokenizer=tokenizer)


@pytest.fixture(scope="module")
def base_model_dir(tmp_path_factory):
    """A tiny model on the real Qwen2.5 tokenizer set up as the base model's: eos ``<|endoftext|>`` (the tokenizer's
    and the generation config's), while the chat template closes turns with ``<|im_end|>``."""
    tokenizer = load_shared_tokenizer("qwen2.5-instruct")
    if tokenizer is None:
        pytest.skip("../shared/tokenizers not present (a clone outside the envkit workspace): real-tokenizer test")
    tokenizer.eos_token = "<|endoftext|>"
    path = tmp_path_factory.mktemp("qwen-base")
    build_tiny_model(tokenizer, path)
    return path


@pytest.mark.parametrize("mask_truncated", [True, False])
def test_a_base_models_finished_episodes_look_finished_to_trl_and_cut_ones_truncated(
    base_model_dir, tmp_path, mask_truncated
):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(base_model_dir))
    assert tokenizer.eos_token == "<|endoftext|>"
    im_end, endoftext = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    bang = tokenizer.encode("!", add_special_tokens=False)[0]
    per_turn = 6
    captured: list[Episode] = []
    rollout = make_rollout_func(
        OneReply, tokenizer=tokenizer, backend=endings_backend(tokenizer, bang), on_episodes=captured.extend
    )
    config = _config(
        tmp_path,
        per_device_train_batch_size=8,
        max_completion_length=per_turn,
        mask_truncated_completions=mask_truncated,
        generation_kwargs={"stop_token_ids": [bang]},
    )
    trainer = _trainer(base_model_dir, tokenizer, config, OneReply, [0, 1, 2, 3], rollout)
    assert im_end not in trainer.eos_token_ids  # TRL alone knows the base model's eos only
    trainer.model.train()
    output = trainer._generate_and_score_completions([trainer.train_dataset[i] for i in (0, 0, 1, 1, 2, 2, 3, 3)])

    assert [e.task_seed for e in captured] == [0, 0, 1, 1, 2, 2, 3, 3] and not any(e.error for e in captured)
    model_tokens = (output["completion_mask"] * output["tool_mask"]).sum(dim=1).tolist()
    if mask_truncated:  # a finished episode's tokens reach the loss; a cut one's do not
        assert all(n > 0 for n in model_tokens[:6]), model_tokens
        assert model_tokens[6:] == [0, 0]
    else:
        assert trainer._metrics["train"]["completions/clipped_ratio"][-1] == pytest.approx(2 / 8)
        assert model_tokens[6:] == [per_turn, per_turn]
    # What TRL read: the stopped turns end on the template's end of turn (for 1 and 2 the engine's closing, masked).
    rows, lengths = output["completion_ids"].tolist(), output["completion_mask"].sum(dim=1).tolist()
    assert [rows[i][lengths[i] - 1] for i in range(6)] == [im_end] * 6
    assert [output["tool_mask"][i][lengths[i] - 1].item() for i in range(6)] == [1, 1, 0, 0, 0, 0]
    assert endoftext not in [t for i in range(6) for t in rows[i][: lengths[i]]]


def test_a_turn_that_stops_on_its_last_allowed_token_looks_finished_not_cut(base_model_dir, tmp_path):
    # The engine records how each turn ended; a stop token that is also the budget's last token is a stop (looking
    # only at the turn's length, it read as cut, and mask_truncated_completions dropped the episode from the loss).
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(base_model_dir))
    bang = tokenizer.encode("!", add_special_tokens=False)[0]
    captured: list[Episode] = []
    rollout = make_rollout_func(
        OneReply, tokenizer=tokenizer, backend=endings_backend(tokenizer, bang), on_episodes=captured.extend
    )
    config = _config(
        tmp_path,
        per_device_train_batch_size=10,
        max_completion_length=6,
        mask_truncated_completions=True,
        generation_kwargs={"stop_token_ids": [bang]},
    )
    trainer = _trainer(base_model_dir, tokenizer, config, OneReply, [0, 1, 2, 3, 4], rollout)
    trainer.model.train()
    output = trainer._generate_and_score_completions([trainer.train_dataset[i // 2] for i in range(10)])
    reasons = [e.turn_finish_reasons for e in captured]
    assert reasons == [[r] for r in ("stop", "closed", "closed", "length", "closed") for _ in range(2)]
    model_tokens = (output["completion_mask"] * output["tool_mask"]).sum(dim=1).tolist()
    assert model_tokens[6:8] == [0, 0] and model_tokens[8:] == [6, 6]  # task 3 cut; task 4 stopped at token 6


# ---- reward functions see the transcript ----------------------------------------------------------------------------
def test_reward_functions_get_each_episodes_transcript_as_envkit_messages(local_tokenizer, tiny_model_dir, tmp_path):
    seen: list[list[dict]] = []

    def said_the_target(completions, envkit_messages, **kwargs):
        """A custom reward reading the transcript: 1 when a tool result reached the target the user asked for."""
        seen.extend(envkit_messages)
        rewards = []
        for messages in envkit_messages:
            target = int(re.search(r"to (\d+)", messages[1]["content"]).group(1))
            results = [m["content"] for m in messages if m["role"] == "tool"]
            rewards.append(1.0 if f"total is now {target}" in results else 0.0)
        return rewards

    captured: list[Episode] = []
    backend = CheckedOracleBackend(CounterEnv, local_tokenizer, [0, 1])
    rollout = make_rollout_func(CounterEnv, tokenizer=local_tokenizer, backend=backend, on_episodes=captured.extend)
    trainer = _trainer(tiny_model_dir, local_tokenizer, _config(tmp_path), CounterEnv, [0, 1], rollout, said_the_target)
    trainer.train()

    assert len(seen) == 4 and [m for e in captured for m in [e.messages]] == seen
    for messages in seen:  # the whole multi-turn transcript, as messages, not TRL's parse of the token stream
        roles = [m["role"] for m in messages]
        assert roles[:2] == ["system", "user"] and "tool" in roles and roles.count("user") >= 2
        assert any(m.get("tool_calls") for m in messages if m["role"] == "assistant")
    logged = trainer.state.log_history[0]
    assert logged["rewards/said_the_target/mean"] == pytest.approx(1.0)  # the oracle reaches every target


# ---- steps that cannot teach anything -------------------------------------------------------------------------------
class Graded(CounterEnv):
    """CounterEnv whose k-th instance on a seed scores 0.5 when k is odd, else 0: each group (two consecutive
    instances of a seed) has a spread."""

    _lock = threading.Lock()
    _instances: ClassVar[dict[int, itertools.count]] = {}

    def reset(self, *, seed=None, options=None):
        with self._lock:
            self.k = next(self._instances.setdefault(seed, itertools.count()))
        return super().reset(seed=seed, options=options)

    def score(self) -> float:
        return (self.k % 2) / 2


@pytest.mark.parametrize("env", [CounterEnv, Graded])
def test_steps_where_every_group_scored_equally_are_counted_and_said_in_one_line(
    local_tokenizer, tiny_model_dir, tmp_path, env
):
    Graded._instances.clear()
    lines: list[str] = []
    steps = ZERO_VARIANCE_STEPS + 1
    backend = CheckedOracleBackend(CounterEnv, local_tokenizer, [0, 1])
    rollout = make_rollout_func(env, tokenizer=local_tokenizer, backend=backend, log=lines.append)
    trainer = _trainer(tiny_model_dir, local_tokenizer, _config(tmp_path, max_steps=steps), env, [0, 1], rollout)
    trainer.train()

    logged = [entry["envkit/zero_variance_groups"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == steps
    if env is CounterEnv:  # the oracle solves every task: each group all 1.0, no advantage anywhere
        assert logged == [1.0] * steps
        assert all(entry["frac_reward_zero_std"] == 1.0 for entry in trainer.state.log_history if "loss" in entry)
        assert len(lines) == 1, lines  # once per run of flat steps, not every step
        assert "\n" not in lines[0] and lines[0].startswith("training cannot learn:")
        assert f"last {ZERO_VARIANCE_STEPS} rollouts" in lines[0] and "equal scores (this one: 1)" in lines[0]
    else:
        assert logged == [0.0] * steps and lines == []


def _episode(seed: int, score: float, error: str | None = None) -> Episode:
    return Episode(task_seed=seed, group_index=0, score=score, error=error)


def test_zero_variance_groups_leaves_failed_episodes_out_and_groups_as_trl_does():
    episodes = [_episode(0, 1.0), _episode(0, 1.0), _episode(1, 0.0), _episode(1, 0.5)]
    assert zero_variance_groups(episodes, 2) == 0.5
    # A failed member is left out (as GRPOTrainer leaves it out): the rest scored equally, so no spread.
    assert zero_variance_groups([_episode(1, 0.0), _episode(1, 0.5, "env raised"), _episode(1, 0.0)], 3) == 1.0
    # The same seed twice in a row is two groups when the group size says so.
    assert zero_variance_groups([_episode(5, 0.0), _episode(5, 0.0), _episode(5, 1.0), _episode(5, 0.0)], 2) == 0.5
    assert zero_variance_groups([_episode(5, 0.0), _episode(5, 1.0), _episode(6, 1.0)]) == 0.5  # runs of one seed


@pytest.mark.parametrize(
    "group",
    [
        [(2, 1.0, None), (2, 0.0, "env raised"), (2, 1.0, None)],  # a failed episode counts 0 in the mean
        [(3, 0.5, None), (3, 0.0, "env raised"), (3, 0.0, "env raised")],  # one scored episode: a flat group
        [(4, 0.0, None), (4, 1.0, None), (4, 0.5, None)],
    ],
)
def test_async_logs_a_groups_score_turns_and_flatness_as_the_synchronous_run_does(group):
    """--async logs per group what the synchronous run logs per step: its curves used to leave failed episodes out of
    the mean score and count a group with one scored episode as having spread."""
    import collections
    import queue
    import types

    from envkit.adapters.trl import log_metrics
    from envkit.adapters.trl.async_grpo.worker import EnvkitRolloutWorker

    episodes = [
        Episode(task_seed=seed, group_index=0, score=score, error=error, turns=2) for seed, score, error in group
    ]
    worker = types.SimpleNamespace(
        counts=collections.Counter(), metrics_queue=queue.SimpleQueue(), _recent=collections.deque(maxlen=64),
        max_error_rate=None,
    )  # fmt: skip
    EnvkitRolloutWorker._account(worker, episodes, [])
    logged_async = worker.metrics_queue.get_nowait()
    trainer = types.SimpleNamespace(_metrics={"train": collections.defaultdict(list)}, num_generations=len(group))
    log_metrics(trainer, episodes)
    logged_sync = {key: values[0] for key, values in trainer._metrics["train"].items()}
    assert logged_async["envkit/mean_score"] == logged_sync["envkit/mean_score"]
    assert logged_async["envkit/mean_turns"] == logged_sync["envkit/mean_turns"]
    assert logged_async["envkit/zero_variance_groups"] == (logged_sync["envkit/zero_variance_groups"], 1.0)


# ---- leaked threads -------------------------------------------------------------------------------------------------
class HangsOnSeedOne(CounterEnv):
    """Task 1's first step hangs until the test releases it: its call times out and its thread is left running."""

    release = threading.Event()

    def step(self, action):
        if self.np_random_seed == 1:
            self.release.wait(RELEASE_CAP_S)
        return super().step(action)


def test_timed_out_env_calls_left_running_are_logged_as_envkit_leaked_threads(
    local_tokenizer, tiny_model_dir, tmp_path
):
    HangsOnSeedOne.release.clear()
    backend = CheckedOracleBackend(CounterEnv, local_tokenizer, [0, 1])
    rollout = make_rollout_func(
        HangsOnSeedOne,
        tokenizer=local_tokenizer,
        backend=backend,
        step_timeout_s=ENGINE_DEADLINE_S,
        max_error_rate=None,
    )
    trainer = _trainer(tiny_model_dir, local_tokenizer, _config(tmp_path), HangsOnSeedOne, [0, 1], rollout)
    trainer.model.train()
    try:
        trainer._generate_and_score_completions([trainer.train_dataset[i] for i in (0, 0, 1, 1)])
        metrics = trainer._metrics["train"]
        assert metrics["envkit/error_rate"][-1] == pytest.approx(0.5)  # both episodes of task 1 timed out
        assert metrics["envkit/leaked_threads"][-1] == 2.0
    finally:
        HangsOnSeedOne.release.set()
