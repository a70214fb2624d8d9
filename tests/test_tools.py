"""ToolEnv and @tool: schemas from type hints and docstrings, validated arguments, errors as tool messages."""

from __future__ import annotations

from typing import Literal

import pytest
from helpers import CounterEnv, call, tool_call
from transformers.utils import get_json_schema

import envkit


def started(env_cls=CounterEnv, seed=0):
    env = env_cls()
    env.reset(seed=seed)
    return env


def test_tool_schemas_come_from_type_hints_and_docstrings():
    env = CounterEnv()
    names = [t["function"]["name"] for t in env.tools]
    assert names == ["add", "get_total", "explode"]
    add = env.tools[0]
    assert add == get_json_schema(CounterEnv.add)
    assert add["type"] == "function"
    assert add["function"]["parameters"] == {
        "type": "object",
        "properties": {"amount": {"type": "integer", "description": "The whole number to add (may be negative)."}},
        "required": ["amount"],
    }
    assert add["function"]["description"] == "Add an amount to the running total."


def test_schema_types_render_through_a_real_template(qwen25_tokenizer):
    text = qwen25_tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tools=CounterEnv().tools, tokenize=False
    )
    assert '"name": "add"' in text and "<tools>" in text


def test_a_successful_call_returns_a_tool_message_and_reward_is_score_change():
    env = started()
    observation, reward, terminated, truncated, info = env.step(call("add", amount=env.target))
    assert observation == [{"role": "tool", "name": "add", "content": f"total is now {env.target}"}]
    assert info == {"tool_calls": 1, "tool_errors": 0, "malformed_tool_calls": 0}
    assert (reward, terminated, truncated) == (0.0, False, False)


def test_non_string_results_are_sent_as_json():
    env = started()
    observation, *_ = env.step(call("get_total"))
    assert observation[0]["content"] == '{"total": 0}'


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({}, "Error: invalid arguments for add: missing required argument 'amount'"),
        ({"amount": "lots"}, "Error: invalid arguments for add: 'amount': Input should be a valid integer"),
        ({"amount": 1, "unit": "kg"}, "Error: invalid arguments for add: unexpected argument 'unit'"),
        ([1, 2], "Error: arguments for add must be a JSON object, got list"),
        ('{"amount": 1', "Error: arguments for add are not valid JSON"),
    ],
)
def test_invalid_arguments_become_tool_errors(arguments, error):
    env = started()
    message = {"role": "assistant", "content": "", "tool_calls": [tool_call("add")]}
    message["tool_calls"][0]["function"]["arguments"] = arguments
    observation, _, terminated, _, info = env.step(message)
    assert observation[0]["role"] == "tool" and observation[0]["content"].startswith(error)
    assert info["tool_errors"] == 1 and not terminated
    assert env.total == 0


def test_json_string_arguments_are_accepted():
    env = started()
    message = {"role": "assistant", "content": "", "tool_calls": [tool_call("add")]}
    message["tool_calls"][0]["function"]["arguments"] = '{"amount": 7}'
    env.step(message)
    assert env.total == 7  # (a string "7" for the int: tests/test_tool_arguments.py)


def test_unknown_tool_lists_the_available_ones():
    env = started()
    observation, *_ = env.step(call("teleport", where="moon"))
    assert observation[0]["content"] == "Error: unknown tool 'teleport'. Available tools: add, get_total, explode"


def test_exception_inside_a_tool_is_reported_and_the_episode_goes_on():
    env = started()
    observation, _, terminated, _, info = env.step(call("explode", reason="boom"))
    assert observation[0]["content"] == "Error: explode failed with KeyError: 'boom'"
    assert info["tool_errors"] == 1 and not terminated
    observation, *_ = env.step(call("add", amount=2))
    assert observation[0]["content"] == "total is now 2"


def test_several_calls_in_one_turn_run_in_order():
    env = started()
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            tool_call("add", amount=3),
            tool_call("nope"),
            tool_call("add", amount=4),
            tool_call("get_total"),
        ],
    }
    observation, _, _, _, info = env.step(message)
    assert [m["name"] for m in observation] == ["add", "nope", "add", "get_total"]
    assert observation[-1]["content"] == '{"total": 7}'
    assert info == {"tool_calls": 4, "tool_errors": 1, "malformed_tool_calls": 0}


def test_malformed_calls_from_the_parser_are_answered_with_an_error():
    env = started()
    message = envkit.parse_assistant('<tool_call>{"name": "add", "arguments": {"amount": 1}</tool_call>')
    observation, _, terminated, _, info = env.step(message)
    assert observation[0]["name"] == "invalid_tool_call"
    assert observation[0]["content"].startswith("Error: could not parse tool call: invalid JSON")
    assert info["malformed_tool_calls"] == 1 and not terminated


def test_text_turn_goes_to_on_text_which_can_continue_or_end():
    env = started()
    observation, _, terminated, _, _ = env.step("All done.")
    assert observation == [{"role": "user", "content": "Great. Please double-check the total."}]
    assert not terminated
    observation, _, terminated, _, _ = env.step("Yes.")
    assert observation == [] and terminated


def test_the_oracle_solves_the_counter_env_and_rewards_sum_to_the_score():
    env = started(seed=5)
    rewards = []
    while not env.done:
        rewards.append(env.step(env.oracle())[1])
    assert env.score() == 1.0 and sum(rewards) == 1.0


def test_long_tool_output_is_cut_with_a_note():
    class Chatty(envkit.ToolEnv):
        max_tool_output_chars = 100

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed, options=options)
            return [{"role": "user", "content": "go"}], {}

        @envkit.tool
        def dump(self) -> str:
            """Return a lot of text."""
            return "x" * 1000

        def score(self) -> float:
            return 0.0

    env = started(Chatty)
    observation, *_ = env.step(call("dump"))
    assert observation[0]["content"] == "x" * 100 + "\n[output cut: 900 more characters]"


class Lookup(envkit.ToolEnv):
    """An env whose errors echo the model's arguments, as real tools' errors often do."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        return [{"role": "user", "content": "go"}], {}

    @envkit.tool
    def find(self, key: str) -> str:
        """Find an entry.

        Args:
            key: The entry's key.
        """
        raise envkit.ToolError(f"no entry {key!r}")

    @envkit.tool
    def parse(self, record: str) -> str:
        """Parse a record.

        Args:
            record: The record as text.
        """
        raise ValueError(f"unreadable record: {record}")  # a bug, reported with the whole argument

    def score(self) -> float:
        return 0.0


HUGE = "x" * 100_000


@pytest.mark.parametrize(
    ("message", "start"),
    [
        (call("find", key=HUGE), "Error: no entry 'xxx"),
        (call("parse", record=HUGE), "Error: parse failed with ValueError: unreadable record: xxx"),
        (call("find", **{"key": "a", HUGE: 1}), "Error: invalid arguments for find: unexpected argument 'xxx"),
        ({"role": "assistant", "content": "", "malformed_tool_calls": [HUGE]}, "Error: could not parse tool call: xx"),
    ],
)
def test_error_messages_are_capped_like_results(message, start):
    env = started(Lookup)
    observation, _, _, _, info = env.step(message)
    content = observation[0]["content"]
    assert content.startswith(start) and info["tool_errors"] == 1
    kept, note = content.split("\n[output cut: ")
    assert len(kept) == Lookup.max_tool_output_chars == 8000
    assert note.endswith(" more characters]") and int(note.split()[0]) > 90_000


def test_at_most_16_calls_run_in_one_turn_and_the_rest_are_told_why():
    env = started()
    message = {"role": "assistant", "content": "", "tool_calls": [tool_call("add", amount=1)] * 20}
    observation, _, terminated, _, info = env.step(message)
    assert env.total == 16  # the side effects of exactly 16 calls
    assert [m["content"] for m in observation[:16]] == [f"total is now {n}" for n in range(1, 17)]
    skipped = "Error: too many tool calls in one turn (20); at most 16 are run per turn — this call was skipped"
    assert observation[16:] == [{"role": "tool", "name": "add", "content": skipped}] * 4
    assert info == {"tool_calls": 20, "tool_errors": 4, "malformed_tool_calls": 0} and not terminated


def test_the_call_cap_is_a_class_attribute():
    class Frugal(CounterEnv):
        max_tool_calls_per_turn = 2

    env = started(Frugal)
    observation, *_ = env.step({"role": "assistant", "content": "", "tool_calls": [tool_call("add", amount=5)] * 3})
    assert env.total == 10 and observation[2]["content"].startswith("Error: too many tool calls in one turn (3)")


def test_end_episode_from_a_tool_and_literal_arguments():
    class Quiz(envkit.ToolEnv):
        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed, options=options)
            self.answer = None
            return [{"role": "user", "content": "Red or blue?"}], {}

        @envkit.tool
        def submit(self, color: Literal["red", "blue"]) -> str:
            """Submit the final answer.

            Args:
                color: The chosen color.
            """
            self.answer = color
            self.end_episode()
            return "submitted"

        def score(self) -> float:
            return float(self.answer == "blue")

    env = started(Quiz)
    observation, *_ = env.step(call("submit", color="green"))
    assert "Input should be 'red' or 'blue'" in observation[0]["content"]
    assert env.tools[0]["function"]["parameters"]["properties"]["color"]["enum"] == ["red", "blue"]
    _, reward, terminated, _, _ = env.step(call("submit", color="blue"))
    assert terminated and reward == 1.0


def test_a_tool_without_docstring_fails_at_class_definition():
    with pytest.raises(envkit.ToolDefinitionError, match=r"tool Broken\.lookup has no docstring"):

        class Broken(envkit.ToolEnv):
            @envkit.tool
            def lookup(self, key: str) -> str:
                return key


def test_a_tool_without_type_hints_fails_at_class_definition():
    with pytest.raises(envkit.ToolDefinitionError, match=r"tool Broken\.lookup:.*type hint"):

        class Broken(envkit.ToolEnv):
            @envkit.tool
            def lookup(self, key) -> str:
                """Look up a key.

                Args:
                    key: The key.
                """
                return key


def test_a_tool_with_an_undocumented_argument_fails_at_class_definition():
    with pytest.raises(envkit.ToolDefinitionError, match=r"tool Broken\.lookup:.*key"):

        class Broken(envkit.ToolEnv):
            @envkit.tool
            def lookup(self, key: str) -> str:
                """Look up a key."""
                return key
