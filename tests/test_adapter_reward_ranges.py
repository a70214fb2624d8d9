"""Adapter envs never clip a reward into [0, 1]: a declared ``reward_range`` is mapped linearly, and a reward outside
the range fails the episode with a message naming ``reward_range`` (issue 22, item 10).

Through the real dependencies: TRL classes the real ``GRPOTrainer`` accepts (rewards -1..0, and TRL's grpo_2048 reward
shape, 20..32), reasoning-gym's own datasets and registry, TextArena's ``Set-v0`` (one point per set found)."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import itertools
import json
import re
from typing import Any

import pytest
from helpers import CheckedOracleBackend, call, forgotten_adapter_classes

import envkit
from envkit.backends import SamplingParams
from envkit.cli.app import main as cli_main
from envkit.registry import EnvSpecError, resolve
from envkit.rollout import RolloutEngine

FIX = r"reward_range=\[LO, HI\].*--env-config '\{\"reward_range\": \[LO, HI\]\}'"


@pytest.fixture(autouse=True, scope="module")
def _forget_adapter_classes():
    with forgotten_adapter_classes():
        yield


def text(content: str) -> dict:
    return {"role": "assistant", "content": content}


# -- TRL classes ----------------------------------------------------------------------------------------------------


def penalty_episode(env, seed: int, guesses: list[int]) -> float:
    env.reset(seed=seed)
    target = env.instance.target
    for guess in guesses:
        env.step(call("guess", digit=target if guess < 0 else guess))
    return env.score()


def test_trl_class_rewarding_minus_one_to_zero_fails_loudly_and_keeps_its_distinctions_with_a_declared_range():
    spec = "trl:trl_reward_range_envs:PenaltyGuess"
    env = envkit.make(spec)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=rf"reward \(what TRL would sum\) -1 is outside \[0, 1\].*{FIX}"):
        env.step(call("guess", digit=(env.instance.target + 1) % 10))  # TRL's reward -1 was 0.0 here, silently

    ranged = envkit.make(spec, reward_range=[-1, 0])
    wrong = [(t + 1) % 10 for t in range(10)]
    scores = {
        "first guess": penalty_episode(ranged, 0, [-1]),
        "second guess": penalty_episode(ranged, 0, [wrong[ranged.instance.target], -1]),
        "never": penalty_episode(ranged, 0, [wrong[ranged.instance.target]]),
    }
    assert scores == {"first guess": 1.0, "second guess": 0.75, "never": 0.0}


def test_trl_grpo_2048_reward_shape_is_an_error_without_a_range_and_a_signal_with_one(local_tokenizer):
    """Rollouts through the engine: TRL's grpo_2048 reward (the game score, 20..32 here) scored 1.0 on every episode
    before; now each episode fails naming reward_range, and with the range declared the scores differ as TRL's
    rewards do."""
    spec = "trl:trl_reward_range_envs:Game2048"
    config = {"reward_funcs": ["trl_reward_range_envs:reward_score"], "max_turns": 12}
    moves = ["left", "down"] * 5
    base = resolve(spec)

    class WithOracle(base):  # the backend's replicas play ten fixed moves; the engine's envs are the plain adapter
        def oracle(self):
            return call("move", direction=moves[self.turns]) if self.turns < len(moves) else text("Done.")

    seeds = [0, 1, 2, 3, 5]
    replicas = lambda: WithOracle(**config, reward_range=[0, 64])  # noqa: E731
    game_scores = []
    for seed in seeds:
        replica = replicas()
        replica.reset(seed=seed)
        while not replica.done:
            replica.step(replica.oracle())
        game_scores.append(replica.instance.score)
    assert min(game_scores) >= 20 and max(game_scores) <= 32 and len(set(game_scores)) == 3

    def run(**extra: Any) -> list:
        factory = lambda: envkit.make(spec, **config, **extra)  # noqa: E731
        backend = CheckedOracleBackend(replicas, local_tokenizer, seeds)
        return RolloutEngine(factory, backend, local_tokenizer).run(seeds, 1, SamplingParams())

    unranged = run()
    assert [e.score for e in unranged] == [0.0] * len(seeds)
    assert all(re.search(rf"reward \(what TRL would sum\) \d+ is outside \[0, 1\].*{FIX}", e.error) for e in unranged)
    ranged = run(reward_range=[0, 64])
    assert [e.error for e in ranged] == [None] * len(seeds)
    assert [e.score for e in ranged] == [s / 64 for s in game_scores]


def test_trls_own_reward_is_what_the_declared_range_maps(tiny_model_dir, local_tokenizer, tmp_path, monkeypatch):
    """The real GRPOTrainer takes both classes; the reward it computes for an instance (its env-owned get_reward,
    and the grpo_2048-style reward function) is what envkit maps linearly from reward_range."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_template
    from trl_reward_range_envs import Game2048, PenaltyGuess, reward_score, rows_2048

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    tokenizer = copy.deepcopy(local_tokenizer)
    tokenizer.padding_side = "left"
    tokenizer.response_template = qwen3_template
    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2, max_steps=1, bf16=False,
        use_cpu=True, report_to="none", beta=0.0,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    for factory, reward_funcs, config, reward_range in [
        (PenaltyGuess, None, {}, [-1, 0]),
        (Game2048, reward_score, {"reward_funcs": [reward_score]}, [0, 64]),
    ]:
        trainer = GRPOTrainer(
            model=model,
            args=args,
            train_dataset=Dataset.from_list(rows_2048()),
            processing_class=tokenizer,
            environment_factory=factory,
            **({"reward_funcs": reward_funcs} if reward_funcs else {}),
        )
        env = envkit.make(f"trl:trl_reward_range_envs:{factory.__name__}", **config, reward_range=reward_range)
        trl_rewards, scores = [], []
        for seed, plays in enumerate([[0], [1], [2], [0, 1, 2], [3, 4, 5, 6, 7, 8, 9], [9, 8, 7, 6]]):
            env.reset(seed=seed)
            for index in plays:
                if factory is PenaltyGuess:
                    env.step(call("guess", digit=index))
                else:
                    env.step(call("move", direction=["left", "down", "right", "up"][index % 4]))
            (trl_reward,) = trainer.reward_funcs[-1](environments=[env.instance], prompts=[None], completions=[None])
            trl_rewards.append(trl_reward)
            scores.append(env.score())
        lo, hi = reward_range
        assert len(set(trl_rewards)) > 1 and scores == [(r - lo) / (hi - lo) for r in trl_rewards]


def test_reward_range_config_mistakes_are_one_line():
    finite = r"two finite numbers \[lo, hi\] with lo < hi, got"
    two = r"two numbers \[lo, hi\], got"
    cases = [([1, 0], finite), ([0], f"{two} \\[0\\]"), ("0-1", f"{two} '0-1'"), ([0, 1e999], finite)]
    for bad, why in cases:
        with pytest.raises(EnvSpecError, match=f"reward_range must be {why}") as error:
            envkit.make("trl:trl_reward_range_envs:PenaltyGuess", reward_range=bad)
        assert "\n" not in str(error.value)


def test_envkit_validate_names_the_fix_and_takes_the_range_from_env_config(capsys):
    def range_check(*flags: str) -> dict:
        cli_main(["validate", "trl:trl_reward_range_envs:PenaltyGuess", "--episodes", "2", "--json", *flags])
        checks = json.loads(capsys.readouterr().out)["checks"]
        return next(c for c in checks if c["name"] == "scores finite and in [0, 1]")

    unranged = range_check()
    assert unranged["status"] == "FAIL" and re.search(rf"-1 is outside \[0, 1\].*{FIX}", unranged["reason"])
    assert range_check("--env-config", '{"reward_range": [-1, 0]}')["status"] == "PASS"


# -- reasoning-gym ---------------------------------------------------------------------------------------------------

needs_reasoning_gym = pytest.mark.skipif(
    importlib.util.find_spec("reasoning_gym") is None,
    reason="reasoning-gym is not installed: pip install -e '.[reasoning-gym]'",
)


@pytest.fixture(scope="module")
def points_dataset():
    """A dataset registered in reasoning-gym's own registry whose scorer gives points, 0 to 10 (one per matching
    character of a 10-character answer), as a user's procedural dataset may."""
    from reasoning_gym.dataset import ProceduralDataset
    from reasoning_gym.factory import DATASETS, register_dataset

    @dataclasses.dataclass
    class PointsConfig:
        seed: int | None = None
        size: int = 20

        def validate(self) -> None:
            assert self.size > 0

    class PointsDataset(ProceduralDataset):
        def __init__(self, config: PointsConfig):
            super().__init__(config=config, seed=config.seed, size=config.size)

        def __getitem__(self, idx: int) -> dict:
            answer = "".join("abcdefghij"[(idx * 7 + i * 3) % 10] for i in range(10))
            return {"question": f"Write {answer}.", "answer": answer, "metadata": {}}

        def score_answer(self, answer: str | None, entry: dict) -> float:
            return float(sum(a == b for a, b in zip(answer or "", entry["answer"], strict=False)))

    name = "envkit_test_points"
    if name not in DATASETS:
        register_dataset(name, PointsDataset, PointsConfig)
    yield f"reasoning-gym:{name}"
    DATASETS.pop(name, None)


@needs_reasoning_gym
def test_reasoning_gym_scorer_with_points_fails_loudly_and_maps_a_declared_range(points_dataset):
    env = envkit.make(points_dataset)
    env.reset(seed=0)
    answer = env.entry["answer"]
    with pytest.raises(ValueError, match=rf"score_answer value of item 0 3 is outside \[0, 1\].*{FIX}"):
        env.step(text(f"<answer>{answer[:3]}</answer>"))  # 3 points: 1.0 here before, like 10
    ranged = envkit.make(points_dataset, reward_range=[0, 10])
    scores = []
    for prefix in (3, 7, 10):
        ranged.reset(seed=0)
        scores.append(ranged.step(text(f"<answer>{answer[:prefix]}</answer>"))[1])
    assert scores == [0.3, 0.7, 1.0]


@needs_reasoning_gym
def test_reasoning_gym_float_rounding_above_one_is_one_not_an_error():
    """reasoning-gym's spell_backward scores an answer with extra characters 1.0000000000000002 (float rounding in
    its prefix count): within rounding of 1, so 1.0, not an error (reasoning-gym's scorers are in [0, 1])."""
    env = envkit.make("reasoning-gym:spell_backward", size=4)
    for seed in range(4):
        env.reset(seed=seed)
        answer = env.entry["answer"]
        raw = env.dataset.score_answer(answer + " 0", env.entry)
        if raw > 1.0:
            break
    else:
        pytest.fail("no spell_backward item scores above 1.0 here: reasoning-gym changed")
    env.step(text(f"<answer>{answer} 0</answer>"))
    assert env.score() == 1.0


# -- TextArena -------------------------------------------------------------------------------------------------------

needs_textarena = pytest.mark.skipif(
    importlib.util.find_spec("textarena") is None, reason="textarena is not installed: pip install -e '.[textarena]'"
)

_CARD = re.compile(r"^(\d+): (\S+) (\S+) (\S+) (\S+)$", re.MULTILINE)


def set_move(transcript: str, want_set: bool) -> str:
    """Three card indices of the last board shown: a Set when ``want_set`` (and one exists), else three that are not."""
    board = transcript.rsplit("=== BOARD ===", 1)[-1]
    cards = [(int(m[0]), m[1:]) for m in _CARD.findall(board)]
    for trio in itertools.combinations(cards, 3):
        is_set = all(len({card[1][i] for card in trio}) in (1, 3) for i in range(4))
        if is_set == want_set:
            return "[" + ", ".join(str(card[0]) for card in trio) + "]"
    raise AssertionError("no such three cards on the board")


def play_set(env, seed: int, sets: int) -> None:
    """Find ``sets`` Sets, then waste the remaining turns of the game's 20."""
    observation, _ = env.reset(seed=seed)
    transcript = observation[0]["content"]
    while not env.done:
        observation = env.step(text(set_move(transcript, want_set=env.turns < sets)))[0]
        transcript += "".join(m["content"] for m in observation)


@needs_textarena
def test_textarena_set_points_fail_loudly_and_map_a_declared_range():
    """TextArena's Set-v0 rewards the number of Sets found in 20 turns; 2 and 6 Sets both scored 1.0 here before."""
    env = envkit.make("textarena:Set-v0")
    with pytest.raises(ValueError, match=rf"game's final reward 2 is outside \[0, 1\].*{FIX}"):
        play_set(env, 0, 2)
    ranged = envkit.make("textarena:Set-v0", reward_range=[0, 20])
    scores = []
    for sets in (0, 2, 6):
        play_set(ranged, 0, sets)
        scores.append(ranged.score())
        assert ranged.rewards == {0: sets}
    assert scores == [0.0, 0.1, 0.3]


@needs_textarena
def test_textarena_invalid_move_scores_zero_and_a_declared_range_maps_it_like_any_reward():
    """TextArena's single-player -1 for an invalid move (Bandit-v0: a button that does not exist) scores 0, as a loss
    does; with reward_range=[-1, 1] it is mapped like any reward (and a win is 1)."""
    for config in ({}, {"reward_range": [-1, 1]}):
        env = envkit.make("textarena:Bandit-v0", **config)
        env.reset(seed=0)
        while not env.done:
            env.step(text("[no such button]"))
        assert env.invalid_move and env.rewards == {0: -1.0} and env.score() == 0.0
    env = envkit.make("textarena:GuessTheNumber-v0", reward_range=[-1, 1])
    env.reset(seed=0)
    env.step(env.oracle())
    assert env.rewards == {0: 1} and env.score() == 1.0
