"""``textworld-express:GAME`` through the real TextWorldExpress package (its JAR, on a real JVM).

Skipped, with the install command as the reason, when the package or a Java runtime is missing. Each env starts its
own JVM (about a second here), so the tests share envs where they can.
"""

from __future__ import annotations

import copy
import pickle
import random
from contextlib import closing

import pytest
from helpers import (
    check_missing_java_is_one_line,
    eval_episodes,
    forgotten_adapter_classes,
    java_game_marks,
    oracle_rollouts,
    play_oracle,
    say,
)

import envkit
from envkit.cli.app import main as cli_main
from envkit.registry import EnvSpecError

pytestmark = java_game_marks("textworld_express", "textworld-express")

GAMES = ("cookingworld", "twc", "coin", "mapreader", "arithmetic", "sorting", "simonsays", "peckingorder")


@pytest.fixture(autouse=True, scope="module")
def _forget_adapter_classes():
    """Drop the classes these tests resolved (the registry caches them per spec)."""
    with forgotten_adapter_classes():
        yield


@pytest.fixture(scope="module")
def package_env():
    """TextWorldExpress's own Python wrapper: the reference the adapter is compared with."""
    from textworld_express import TextWorldExpressEnv

    with closing(TextWorldExpressEnv(envStepLimit=100)) as env:
        yield env


@pytest.fixture(scope="module")
def coin():
    with closing(envkit.make("textworld-express:coin")) as env:
        yield env


def test_task_seeds_are_the_games_of_the_official_fold(coin, package_env):
    """Seed s is entry s % 1000 of the fold's seed list; the opening is the package's task and first observation."""
    opening, info = coin.reset(seed=7)
    assert [m["role"] for m in opening] == ["system", "user"] and info["variation"] == 7
    observation, infos = package_env.reset(seed=7, gameFold="train", gameName="coin", gameParams="")
    assert opening[1]["content"] == f"{infos['taskDescription']}\n\n{observation.strip()}"
    assert coin.reset(seed=1007)[1]["task_id"] == info["task_id"]  # seeds wrap around the fold
    assert len({coin.reset(seed=s)[1]["task_id"] for s in range(10)}) == 10
    with closing(envkit.make("textworld-express:coin", split="test")) as test_fold:
        opening, info = test_fold.reset(seed=7)
        assert info["variation"] == package_env.getValidSeedsTest()[7] == 20007
        observation, infos = package_env.reset(seed=20007, gameFold="test", gameName="coin", gameParams="")
        assert opening[1]["content"].endswith(observation.strip())


@pytest.mark.parametrize("game", GAMES)
def test_the_gold_path_scores_1_on_every_game(game):
    with closing(envkit.make(f"textworld-express:{game}", game_params=None)) as env:
        assert [play_oracle(env, seed) for seed in (0, 1)] == [1.0, 1.0]
        assert env.ending == "done" and env.score_components() == {"failed": 0.0}


def test_game_params_reach_the_generator_and_bad_ones_fail_in_one_line(package_env):
    with closing(envkit.make("textworld-express:coin", game_params={"numLocations": 1, "includeDoors": False})) as env:
        opening, _ = env.reset(seed=2)
        observation, _ = package_env.reset(
            seed=2, gameFold="train", gameName="coin", gameParams="numLocations=1,includeDoors=0"
        )
        assert opening[1]["content"].endswith(observation.strip())
        assert play_oracle(env, 2) == 1.0
    with pytest.raises(EnvSpecError, match=r"refused: Unrecognized property name \(bogus\)") as raised:
        envkit.make("textworld-express:coin", game_params="bogus=3")
    assert "\n" not in str(raised.value)
    with pytest.raises(EnvSpecError, match="did you mean coin"):
        envkit.make("textworld-express:coins")
    with pytest.raises(EnvSpecError, match="split must be one of train, dev, test"):
        envkit.make("textworld-express:coin", split="valid")


def test_replies_play_their_command_and_help_shows_the_task(coin):
    opening, _ = coin.reset(seed=3)
    task = opening[1]["content"].split("\n\n")[0]
    observation, reward, terminated, *_ = coin.step(say("help"))
    assert observation == [{"role": "user", "content": task}] and (reward, terminated) == (0.0, False)
    observation, reward, terminated, _, info = coin.step(say("The coin is here.\nThought: grab it.\nAction: take coin"))
    assert info["command"] == "take coin" and observation[0]["content"] == "You take the coin."
    assert (reward, terminated, coin.score()) == (1.0, True, 1.0)
    coin.reset(seed=3)
    observation, *_ = coin.step(say("  dance wildly  "))
    assert observation[0]["content"].startswith("Unknown action") and coin.score() == 0.0


def failing_commands(package_env, game: str, seed: int) -> list[str]:
    """Commands that make the game fail the task, found by a seeded random walk on the package's own wrapper."""
    rng = random.Random(0)
    for _ in range(200):
        _, infos = package_env.reset(seed=seed, gameFold="train", gameName=game, gameParams="")
        commands: list[str] = []
        for _ in range(30):
            commands.append(rng.choice(sorted(infos["validActions"])))
            _, _, done, infos = package_env.step(commands[-1])
            if done:
                break
        if infos["taskfailure"]:
            return commands
    raise AssertionError(f"no failing walk found for {game} seed {seed}")


def test_a_failed_task_scores_0_where_the_game_says_minus_1(package_env):
    with closing(envkit.make("textworld-express:arithmetic")) as env:
        commands = failing_commands(package_env, "arithmetic", seed=4)
        assert package_env.runHistory[-1]["score"] == -1.0  # TextWorldExpress's own value for the failure
        env.reset(seed=4)
        for command in commands:
            *_, terminated, _, info = env.step(say(command))
        assert terminated and info["game_score"] == -1.0
        assert env.score() == 0.0 and env.score_components() == {"failed": 1.0}
        assert env.oracle() is None


def test_envs_copy_and_pickle_mid_episode_with_a_jvm_of_their_own():
    env = envkit.make("textworld-express:cookingworld")
    clones = []
    try:
        env.reset(seed=5)
        for _ in range(6):
            env.step(env.oracle())
        clones = [copy.deepcopy(env), pickle.loads(pickle.dumps(env))]
        expected = env.step(say("read cookbook"))
        for clone in clones:
            assert clone.messages == env.messages[:-2] and clone.java.process.pid != env.java.process.pid
            assert clone.step(say("read cookbook")) == expected
    finally:
        for made in [env, *clones]:
            made.close()


def test_a_missing_java_runtime_is_one_line_naming_the_fix(monkeypatch, tmp_path):
    check_missing_java_is_one_line("textworld-express:coin", monkeypatch, tmp_path)


def test_rollouts_through_the_engine_are_token_exact_and_score_the_oracle(local_tokenizer):
    episodes = oracle_rollouts("textworld-express:arithmetic", [0, 1], local_tokenizer)
    assert [e.error for e in episodes] == [None, None]
    assert [e.score for e in episodes] == [1.0, 1.0] and all(e.turns == 5 for e in episodes)


def test_envkit_eval_runs_a_model_on_a_game(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "episodes.jsonl"
    episodes = eval_episodes("textworld-express:simonsays", tiny_model_dir, out, 2, 3, capsys)
    assert len(episodes) == 2 and all(0.0 <= e["score"] <= 1.0 for e in episodes)


@pytest.mark.slow
def test_a_game_passes_envkit_validate(capsys):
    """One game, arithmetic (its answer brings the answer checks in): validate builds a fresh env for nearly every
    episode it plays (on JVMs handed on from env to env); the adapter is the same for every game, and the gold-path
    test above plays them all."""
    assert cli_main(["validate", "textworld-express:arithmetic", "--episodes", "2"]) == 0, capsys.readouterr().out
