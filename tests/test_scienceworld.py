"""``scienceworld:TASK`` through the real ScienceWorld package (its JAR, on a real JVM).

Skipped, with the install command as the reason, when the package or a Java runtime is missing. A ScienceWorld env
takes seconds to start (its JVM) and its gold paths take seconds to generate, so the tests use short tasks
(``lifespan-*``, ``find-*``) and share envs where they can.
"""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
from helpers import CheckedOracleBackend

import envkit
from envkit.backends import SamplingParams
from envkit.cli.app import main as cli_main
from envkit.registry import EnvSpecError
from envkit.rollout import RolloutEngine

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("scienceworld") is None,
        reason="scienceworld is not installed: pip install -e '.[scienceworld]'",
    ),
    pytest.mark.skipif(
        shutil.which("java") is None, reason="no Java runtime: sudo apt-get install default-jre-headless"
    ),
]


@pytest.fixture(autouse=True, scope="module")
def _forget_adapter_classes():
    """Drop the classes these tests resolved (the registry caches them per spec)."""
    from envkit.registry import families as registry

    before = set(registry._ADAPTER_CLASSES)
    yield
    for spec in set(registry._ADAPTER_CLASSES) - before:
        del registry._ADAPTER_CLASSES[spec]


@pytest.fixture(scope="module")
def package_env():
    """ScienceWorld's own Python wrapper: the reference the adapter is compared with."""
    from scienceworld import ScienceWorldEnv

    env = ScienceWorldEnv("", envStepLimit=100)
    yield env
    env.close()


@pytest.fixture(scope="module")
def animal():
    env = envkit.make("scienceworld:find-animal")
    yield env
    env.close()


def say(content: str) -> dict:
    return {"role": "assistant", "content": content}


def play_oracle(env, seed: int) -> float:
    env.reset(seed=seed)
    while not env.done:
        action = env.oracle()
        assert action is not None, f"{env.envkit_spec}: no oracle action on seed {seed}"
        env.step(action)
    return env.score()


def test_task_seeds_are_variations_of_the_official_split(animal, package_env):
    package_env.load("find-animal", 0)
    train, test = package_env.get_variations_train(), package_env.get_variations_test()
    opening, info = animal.reset(seed=5)
    assert [m["role"] for m in opening] == ["system", "user"] and info["variation"] == train[5]
    assert animal.reset(seed=5 + len(train))[1]["task_id"] == info["task_id"]  # seeds wrap around the split
    package_env.load("find-animal", train[5])
    observation, _ = package_env.reset()
    assert opening[1]["content"] == f"{package_env.get_task_description()}\n\n{observation.strip()}"
    unseen = envkit.make("scienceworld:1-1", split="test")  # boil, by its task id
    try:
        package_env.load("boil", 0)
        assert unseen.task == "boil" and unseen.variations == package_env.get_variations_test() != []
        assert set(train).isdisjoint(test)
    finally:
        unseen.close()


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
    env = envkit.make(spec)
    try:
        assert play_oracle(env, 0) == 1.0 and env.ending == "done"
        assert env.score_components() == {"failed": 0.0}
    finally:
        env.close()


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
    monkeypatch.setenv("PATH", str(tmp_path))  # no java on PATH
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(EnvSpecError) as raised:
        envkit.make("scienceworld:boil")
    message = str(raised.value)
    assert "\n" not in message and "no Java runtime was found" in message
    assert "apt-get install default-jre-headless" in message


def test_rollouts_through_the_engine_are_token_exact_and_score_the_oracle(local_tokenizer):
    seeds = [0]

    def factory():
        return envkit.make("scienceworld:lifespan-shortest-lived")

    backend = CheckedOracleBackend(factory, local_tokenizer, seeds)
    episodes = RolloutEngine(factory, backend, local_tokenizer).run(seeds, 1, SamplingParams())
    assert [e.error for e in episodes] == [None] and [e.score for e in episodes] == [1.0]


def test_envkit_eval_runs_a_model_on_a_task(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "episodes.jsonl"
    argv = ["eval", "scienceworld:lifespan-longest-lived", "--model", str(tiny_model_dir), "--tasks", "1"]
    argv += ["--max-turns", "2", "--max-new-tokens", "8", "--out", str(out)]
    assert cli_main(argv) == 0, capsys.readouterr().out
    episodes = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(episodes) == 1 and 0.0 <= episodes[0]["score"] <= 1.0


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["scienceworld:lifespan-longest-lived", "scienceworld:find-plant"])
def test_tasks_pass_envkit_validate(spec, capsys):
    argv = ["validate", spec, "--episodes", "2", "--call-timeout", "300"]  # a JVM start + load is seconds per env
    assert cli_main(argv) == 0, capsys.readouterr().out
