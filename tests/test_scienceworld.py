"""``scienceworld:TASK`` through the real ScienceWorld package (its JAR, on a real JVM).

Skipped, with the install command as the reason, when the package or a Java runtime is missing. A ScienceWorld env
takes seconds to start (its JVM) and its gold paths take seconds to generate, so the tests use short tasks
(``lifespan-*``, ``find-*``) and share envs where they can.
"""

from __future__ import annotations

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

pytestmark = java_game_marks("scienceworld", "scienceworld")


@pytest.fixture(autouse=True, scope="module")
def _forget_adapter_classes():
    """Drop the classes these tests resolved (the registry caches them per spec)."""
    with forgotten_adapter_classes():
        yield


@pytest.fixture(scope="module")
def package_env():
    """ScienceWorld's own Python wrapper: the reference the adapter is compared with."""
    from scienceworld import ScienceWorldEnv

    with closing(ScienceWorldEnv("", envStepLimit=100)) as env:
        yield env


@pytest.fixture(scope="module")
def animal():
    with closing(envkit.make("scienceworld:find-animal")) as env:
        yield env


def test_task_seeds_are_variations_of_the_official_split(animal, package_env):
    package_env.load("find-animal", 0)
    train, test = package_env.get_variations_train(), package_env.get_variations_test()
    opening, info = animal.reset(seed=5)
    assert [m["role"] for m in opening] == ["system", "user"] and info["variation"] == train[5]
    assert animal.reset(seed=5 + len(train))[1]["task_id"] == info["task_id"]  # seeds wrap around the split
    package_env.load("find-animal", train[5])
    observation, _ = package_env.reset()
    assert opening[1]["content"] == f"{package_env.get_task_description()}\n\n{observation.strip()}"
    with closing(envkit.make("scienceworld:1-1", split="test")) as unseen:  # boil, by its task id
        package_env.load("boil", 0)
        assert unseen.task == "boil" and unseen.variations == package_env.get_variations_test() != []
        assert set(train).isdisjoint(test)


def test_steps_agree_with_the_package_wrapper(animal, package_env):
    """The adapter calls the simulator directly; observations and scores equal ScienceWorld's own step()."""
    animal.reset(seed=2)
    package_env.load("find-animal", animal.variation)
    package_env.reset()
    commands = ["look around", "open door to kitchen", "go to kitchen", "inventory", "teleport to moon", "wait1"]
    for command in commands:
        observation, _, terminated, _, info = animal.step(say(command))
        expected, _, done, infos = package_env.step(command)
        assert observation[0]["content"] == expected.strip()
        assert info["game_score"] == infos["score"] and terminated == done


@pytest.mark.parametrize("spec", ["scienceworld:find-animal", "scienceworld:lifespan-longest-lived"])
def test_the_gold_path_scores_1(spec):
    with closing(envkit.make(spec)) as env:
        assert play_oracle(env, 0) == 1.0 and env.ending == "done"
        assert env.score_components() == {"failed": 0.0}


def test_focusing_on_the_wrong_thing_fails_the_task_and_scores_0(animal):
    animal.reset(seed=0)
    *_, terminated, _, info = animal.step(say("Thought: the air is alive.\nAction: focus on air"))
    assert info["command"] == "focus on air" and info["game_score"] == -100 and terminated
    assert animal.score() == 0.0 and animal.score_components() == {"failed": 1.0}


def test_bad_configs_fail_in_one_line():
    with pytest.raises(EnvSpecError, match="did you mean boil"):
        envkit.make("scienceworld:boils")
    with pytest.raises(EnvSpecError, match="unknown simplification 'fast'"):
        envkit.make("scienceworld:boil", simplifications="fast")
    with pytest.raises(EnvSpecError, match="needs the electrical actions"):
        envkit.make("scienceworld:power-component", simplifications="easy")


def test_a_missing_java_runtime_is_one_line_naming_the_fix(monkeypatch, tmp_path):
    check_missing_java_is_one_line("scienceworld:boil", monkeypatch, tmp_path)


def test_each_env_runs_a_new_jvm_so_a_seeds_opening_is_the_same_whatever_came_before():
    """A JVM that loaded other games lists some rooms' objects in another order: handed on to the next env, as
    TextWorldExpress's are, it gave this seed another opening (its wood cups in another order)."""
    openings, pids = [], []
    for _ in range(2):
        with closing(envkit.make("scienceworld:lifespan-longest-lived")) as env:
            openings.append(env.reset(seed=1)[0])
            pids.append(env.java.process.pid)
    assert openings[0] == openings[1]
    assert pids[0] != pids[1]


def test_rollouts_through_the_engine_are_token_exact_and_score_the_oracle(local_tokenizer):
    episodes = oracle_rollouts("scienceworld:lifespan-shortest-lived", [0], local_tokenizer)
    assert [e.error for e in episodes] == [None] and [e.score for e in episodes] == [1.0]


def test_envkit_eval_runs_a_model_on_a_task(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "episodes.jsonl"
    episodes = eval_episodes("scienceworld:lifespan-longest-lived", tiny_model_dir, out, 1, 2, capsys)
    assert len(episodes) == 1 and 0.0 <= episodes[0]["score"] <= 1.0


@pytest.mark.slow
def test_a_task_passes_envkit_validate(capsys):
    """One task: validate builds a fresh env (a JVM) for nearly every episode it plays, well over a hundred, so a
    task costs minutes; the adapter is the same for every task, and the gold-path tests above cover another one."""
    argv = ["validate", "scienceworld:lifespan-longest-lived", "--episodes", "2", "--call-timeout", "300"]
    assert cli_main(argv) == 0, capsys.readouterr().out
