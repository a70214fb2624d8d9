"""Deliberately broken envs, one per validator check: each must be caught by the check it is named after."""

from __future__ import annotations

import random
import threading
import time

import envkit


class GoodText(envkit.Env):
    """A correct text env the broken ones derive from: say the secret word to win."""

    max_turns = 4

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        fruit = ["apple", "pear", "plum", "fig", "kiwi", "lime", "date", "yuzu"][self.np_random.integers(8)]
        self.word = f"{fruit}-{self.np_random.integers(1000)}"
        self.said = False
        return [{"role": "user", "content": f"Say the code word {self.word}."}], {}

    def step(self, action):
        self.said = self.word in action["content"]
        reply = [] if self.said else [{"role": "user", "content": "No, try again."}]
        return reply, float(self.said), self.said, False, {}

    def score(self) -> float:
        return float(self.said)

    def oracle(self):
        return {"role": "assistant", "content": self.word}


class BadSignature(GoodText):
    """1: reset without the keyword arguments of the contract."""

    def reset(self, seed=None):  # type: ignore[override]
        return super().reset(seed=seed)


class NoStep(envkit.Env):
    """1: step() and score() never implemented."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        return [{"role": "user", "content": "hi"}], {}


class Unseeded(GoodText):
    """2: the task comes from the global random module, not from the seed."""

    def reset(self, *, seed=None, options=None):
        _observation, info = super().reset(seed=seed, options=options)
        self.word = random.choice(["apple", "pear", "plum", "fig", "kiwi", "lime"]) + str(random.random())
        return [{"role": "user", "content": f"Say {self.word}."}], info


class BadMessages(GoodText):
    """2: opening messages with an unknown role and non-string content."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        return [{"role": "narrator", "content": 42}], {}


class WrongOracle(GoodText):
    """3: the oracle says the wrong word."""

    def oracle(self):
        return {"role": "assistant", "content": "banana"}


class NoopWins(GoodText):
    """4: the goal is already met when the episode starts."""

    def score(self) -> float:
        return 1.0 if not self.said else 0.5


class NondeterministicFeedback(GoodText):
    """5: the env's replies depend on the wall clock."""

    def step(self, action):
        _observation, reward, terminated, truncated, info = super().step(action)
        return (
            [{"role": "user", "content": f"Try again ({time.perf_counter_ns()})."}],
            reward,
            terminated,
            truncated,
            info,
        )


class SharedState(GoodText):
    """6: the task lives on the class, shared between instances."""

    current_word = ""

    def reset(self, *, seed=None, options=None):
        observation, info = super().reset(seed=seed, options=options)
        SharedState.current_word = self.word
        return observation, info

    def step(self, action):
        self.said = SharedState.current_word in action["content"]
        return ([] if self.said else [{"role": "user", "content": "No."}]), float(self.said), self.said, False, {}


class CrashOnEmpty(GoodText):
    """7: indexes into the content, so an empty answer raises IndexError."""

    def step(self, action):
        first_letter = action["content"][0]
        _observation, *rest = super().step(action)
        return [{"role": "user", "content": f"Starts with {first_letter}."}], *rest


class CrashingTool(envkit.ToolEnv):
    """7: a ToolEnv whose on_text parses the text as JSON without a guard."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        return [{"role": "user", "content": "Send me JSON."}], {}

    @envkit.tool
    def ping(self) -> str:
        """Answer pong."""
        return "pong"

    def on_text(self, message):
        import json

        json.loads(message["content"])
        return None

    def score(self) -> float:
        return 0.0


class ScoreOutOfRange(GoodText):
    """8: the score is a count, not a fraction."""

    def score(self) -> float:
        return float(self.turns) * 0.6


class ScoreNaN(GoodText):
    """8: the score divides by zero-ish and returns NaN."""

    def score(self) -> float:
        return float("nan") if self.turns else 0.0


class NeverTruncates(GoodText):
    """9: max_turns so large that an episode effectively never ends."""

    max_turns = 10**9

    def step(self, action):
        return [{"role": "user", "content": "Go on."}], 0.0, False, False, {}


class BadSchema(envkit.ToolEnv):
    """10: a hand-written tools list that is not valid JSON Schema."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        return [{"role": "user", "content": f"Task {seed}."}], {}

    @property
    def tools(self):
        return [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt", "properties": 3}}}]

    def score(self) -> float:
        return 0.0


class FlatReward(GoodText):
    """11: every episode scores the same, whatever the policy."""

    def score(self) -> float:
        return 0.5


class Unpicklable(GoodText):
    """12: holds a lock, so process pools cannot ship it."""

    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()


class SlowStep(GoodText):
    """13: every step takes 40 ms."""

    max_turns = 2

    def step(self, action):
        time.sleep(0.04)
        return super().step(action)


class HangsOnEmpty(GoodText):
    """13: step() never returns when the answer is empty (waits on an event nobody sets)."""

    def step(self, action):
        if not action["content"]:
            threading.Event().wait()
        return super().step(action)
