"""ToolEnv.argument_validation: ``"strict"`` (the default: the model's JSON as written, so ``"2"`` is not an int),
``"lax"`` (pydantic's coercion) and ``"none"`` (the values reach the tool as they are, as in τ²-bench)."""

from __future__ import annotations

import enum

import pytest
from helpers import CounterEnv, call

import envkit


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class TypedEnv(envkit.ToolEnv):
    """One tool whose arguments cover the JSON types and the ones JSON lacks."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        self.received = None
        return [{"role": "user", "content": "Record something."}], {}

    @envkit.tool
    def record(
        self,
        count: int,
        ratio: float = 1.0,
        flag: bool = False,
        label: str = "",
        color: Color = Color.RED,
        pair: tuple[int, int] | None = None,
    ) -> str:
        """Record the values.

        Args:
            count: A whole number.
            ratio: A number.
            flag: A yes/no.
            label: A text.
            color: A color.
            pair: Two whole numbers.
        """
        self.received = {"count": count, "ratio": ratio, "flag": flag, "label": label, "color": color}
        self.received["pair"] = pair
        return "recorded"

    def score(self) -> float:
        return 0.0


class LaxTypedEnv(TypedEnv):
    argument_validation = "lax"


class UncheckedTypedEnv(TypedEnv):
    argument_validation = "none"


def run(env_cls, **arguments):
    env = env_cls()
    env.reset(seed=0)
    observation, _, _, _, info = env.step(call("record", **arguments))
    return env.received, observation[0]["content"], info["tool_errors"]


def test_strict_is_the_default():
    assert envkit.ToolEnv.argument_validation == "strict" and CounterEnv.argument_validation == "strict"


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"count": "2"}, "'count': Input should be a valid integer (got '2')"),
        ({"count": 2.0}, "'count': Input should be a valid integer (got 2.0)"),
        ({"count": True}, "'count': Input should be a valid integer (got True)"),
        ({"count": 1, "flag": "true"}, "'flag': Input should be a valid boolean (got 'true')"),
        ({"count": 1, "flag": 1}, "'flag': Input should be a valid boolean (got 1)"),
        ({"count": 1, "label": 5}, "'label': Input should be a valid string (got 5)"),
    ],
)
def test_strict_rejects_a_value_of_another_json_type(arguments, problem):
    received, content, errors = run(TypedEnv, **arguments)
    assert content == f"Error: invalid arguments for record: {problem}"
    assert received is None and errors == 1


def test_strict_converts_where_json_has_no_such_type():
    arguments = {"count": 2, "ratio": 3, "flag": True, "label": "x", "color": "blue"}
    received, content, errors = run(TypedEnv, **arguments, pair=[1, 2])
    assert (content, errors) == ("recorded", 0)
    assert received == {
        "count": 2,
        "ratio": 3.0,
        "flag": True,
        "label": "x",
        "color": Color.BLUE,
        "pair": (1, 2),
    }
    assert type(received["ratio"]) is float


def test_lax_coerces_what_strict_rejects():
    received, content, errors = run(LaxTypedEnv, count="2", flag="true", ratio="0.5")
    assert (content, errors) == ("recorded", 0)
    assert (received["count"], received["flag"], received["ratio"]) == (2, True, 0.5)
    received, _, _ = run(LaxTypedEnv, count=2.0)
    assert type(received["count"]) is int
    _, content, errors = run(LaxTypedEnv, count=2.5)  # lax still refuses to lose a fraction
    assert content.startswith("Error: invalid arguments for record: 'count'") and errors == 1


def test_none_passes_the_values_as_they_are():
    received, content, errors = run(UncheckedTypedEnv, count="2", color="blue", pair=[1, 2])
    assert (content, errors) == ("recorded", 0)
    assert (received["count"], received["color"], received["pair"]) == ("2", "blue", [1, 2])
    assert received["ratio"] == 1.0  # the tool's own defaults
    _, content, errors = run(UncheckedTypedEnv, ratio=1.0)  # a missing argument fails as Python's call does
    assert content.startswith("Error: record failed with TypeError:") and "'count'" in content and errors == 1


@pytest.mark.parametrize("env_cls", [TypedEnv, LaxTypedEnv])
def test_missing_and_unexpected_arguments_are_errors_in_both_checked_modes(env_cls):
    _, content, _ = run(env_cls, ratio=1.0)
    assert content == "Error: invalid arguments for record: missing required argument 'count'"
    _, content, _ = run(env_cls, count=1, colour="red")
    assert content == "Error: invalid arguments for record: unexpected argument 'colour'"


def test_strict_refuses_values_no_json_could_hold():
    env = TypedEnv()
    env.reset(seed=0)
    _, content, failed = env.call_tool({"function": {"name": "record", "arguments": {"count": object()}}})
    assert failed and content.startswith("Error: arguments for record are not JSON values")
