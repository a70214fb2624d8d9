"""The Env base class: transcript keeping, string actions, max_turns, Gymnasium compatibility, envkit.make."""

from __future__ import annotations

import re
from pathlib import Path

import gymnasium as gym
import pytest
from helpers import CounterEnv

import envkit

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


class EchoEnv(envkit.Env):
    """A bare Env: the env repeats the assistant's words; the episode ends when the assistant says 'bye'."""

    max_turns = 3

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        return [{"role": "user", "content": f"Say something ({self.np_random.integers(100)})."}], {"seed": seed}

    def step(self, action):
        text = action["content"]
        done = "bye" in text
        return ([] if done else [{"role": "user", "content": f"You said: {text}"}]), 0.0, done, False, {}

    def score(self) -> float:
        return 1.0 if any("bye" in m["content"] for m in self.messages if m["role"] == "assistant") else 0.0


def test_base_class_keeps_the_transcript_and_accepts_string_actions():
    env = EchoEnv()
    opening, info = env.reset(seed=3)
    assert info == {"seed": 3}
    assert env.messages == opening
    new, reward, terminated, truncated, _ = env.step("hello")
    assert not terminated and not truncated and reward == 0.0
    assert env.messages == [*opening, {"role": "assistant", "content": "hello"}, *new]
    assert env.turns == 1
    env.step({"role": "assistant", "content": "bye now"})
    assert env.done and env.score() == 1.0
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("again")


def test_same_seed_same_task_and_reset_clears_the_transcript():
    env = EchoEnv()
    first, _ = env.reset(seed=11)
    env.step("hi")
    second, _ = env.reset(seed=11)
    assert first == second and env.messages == second and env.turns == 0


def test_max_turns_truncates():
    env = EchoEnv()
    env.reset(seed=0)
    results = [env.step("more") for _ in range(EchoEnv.max_turns)]
    assert [r[3] for r in results] == [False, False, True]
    assert results[-1][4]["truncated_by"] == "max_turns"


def test_gymnasium_spaces_and_checker():
    env = CounterEnv(render_mode="ansi")  # CounterEnv's own constructor names no render_mode: envkit.Env takes it
    observation, _ = env.reset(seed=0)
    assert env.observation_space.contains(observation)
    assert env.action_space.contains({"role": "assistant", "content": "hi"})
    assert not env.observation_space.contains([{"role": "wizard", "content": 1}])
    from gymnasium.utils.env_checker import check_env

    check_env(env)
    assert isinstance(env.render(), str)


def test_make_from_module_path_and_file_path():
    env = envkit.make("helpers:CounterEnv")
    assert isinstance(env, CounterEnv)
    capitals = envkit.make(f"{EXAMPLES / 'capitals.py'}:CapitalsEnv")
    assert type(capitals).__name__ == "CapitalsEnv"
    opening, _ = capitals.reset(seed=0)
    assert "capital" in opening[0]["content"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no-such-env", "unknown env 'no-such-env'. Registered envs:"),
        ("helpers:NoSuchClass", "has no class 'NoSuchClass'; env classes there: CounterEnv"),
        ("no_such_module:Env", "cannot import module 'no_such_module'"),
        ("missing/file.py:Env", "no such file"),
        ("helpers:call", "is not an env class"),
    ],
)
def test_make_errors_say_what_exists(spec, message):
    with pytest.raises(envkit.EnvSpecError, match=message.replace("(", r"\(").replace(".", r"\.")):
        envkit.make(spec)


def test_make_reports_bad_constructor_config():
    with pytest.raises(envkit.EnvSpecError, match="cannot build CounterEnv with config"):
        envkit.make("helpers:CounterEnv", difficulty="hard")


def test_env_is_a_gymnasium_env():
    assert issubclass(envkit.Env, gym.Env)
    assert issubclass(envkit.ToolEnv, envkit.Env)


def test_an_adapter_spec_whose_package_is_missing_names_the_extra(monkeypatch):
    from envkit.registry import ADAPTER_FAMILIES

    family = ADAPTER_FAMILIES["textarena"]
    monkeypatch.setattr(type(family), "installed", lambda self: False)
    from envkit.util.install import install_command

    needs = f"needs the 'textarena' package.*{re.escape(install_command('textarena'))}$"
    with pytest.raises(envkit.EnvSpecError, match=needs):
        envkit.make("textarena:TicTacToe-v0")


def test_envkit_list_shows_the_adapter_families(capsys):
    from envkit.cli.app import main

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "adapter families" in out and "reasoning-gym:" in out and "openenv:" in out


class _BareListReset(envkit.Env):
    """Returns the opening messages without the info dict: a common slip."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]

    def score(self) -> float:
        return 0.0


def test_a_reset_that_returns_a_bare_list_is_named_not_unpacked():
    # Two messages used to unpack silently into (['role', 'content'], {the second message}).
    with pytest.raises(TypeError, match=r"_BareListReset.reset\(\) returned a list of 2, expected \(messages, info\)"):
        _BareListReset().reset(seed=0)
