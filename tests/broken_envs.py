"""Deliberately broken envs, one per validator check: each must be caught by the check it is named after."""

from __future__ import annotations

import random
import re
import threading
import time

import envkit

FRUITS = ["apple", "pear", "plum", "fig", "kiwi", "lime", "date", "yuzu"]


class GoodText(envkit.Env):
    """A correct text env the broken ones derive from: answer with exactly the secret word to win."""

    max_turns = 4

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        fruit = FRUITS[self.np_random.integers(8)]
        self.word = f"{fruit}-{self.np_random.integers(1000)}"
        self.said = False
        return [{"role": "user", "content": f"Say the code word {self.word}."}], {}

    def step(self, action):
        self.said = self.answered(str(action.get("content") or ""))
        reply = [] if self.said else [{"role": "user", "content": "No, try again."}]
        return reply, float(self.said), self.said, False, {}

    def answered(self, text: str) -> bool:
        """The answer is the code word alone, not a text that contains it among others."""
        return text.strip() == self.word

    def score(self) -> float:
        return float(self.said)

    def oracle(self):
        return {"role": "assistant", "content": self.word}

    def canaries(self):
        return {"every fruit at once": [" ".join(FRUITS)], "the win claimed": ["I said the code word. Done!"]}


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


class AnswerContainedInText(GoodText):
    """15: the code word counts wherever it appears, so a text listing every candidate word wins."""

    def answered(self, text: str) -> bool:
        return self.word in text


class JudgeSamplesOnEveryRead(GoodText):
    """16: a sampled "judge" gives an answer with a number partial credit, drawing from self.np_random on every read of
    score(): a replay reads in the same order and agrees, but reading the score twice gives two values."""

    def score(self) -> float:
        if self.said or not self.attempted():
            return float(self.said)
        return round(0.2 * float(self.np_random.random()), 6)

    def attempted(self) -> bool:
        """Whether the last answer holds a number (the judge's partial credit is for attempts)."""
        answers = [m for m in self.messages if m["role"] == "assistant"]
        return bool(answers) and any(ch.isdigit() for ch in str(answers[-1].get("content") or ""))


class JudgeSeededPerInstance(JudgeSamplesOnEveryRead):
    """16: the judge's sampling seed comes from the OS for each instance, so the same transcript replayed on a fresh env
    gets another partial credit."""

    def __init__(self):
        super().__init__()
        self.judge = random.Random()

    def score(self) -> float:
        if self.said or not self.attempted():
            return float(self.said)
        return round(0.2 * self.judge.random(), 6)


class RegexAnswer(GoodText):
    """17: the answer is matched as a regular expression against the code word, so its own canary ".*" wins."""

    def answered(self, text: str) -> bool:
        try:
            return re.fullmatch(text.strip(), self.word) is not None
        except re.error:
            return False

    def canaries(self):
        return {**super().canaries(), "a pattern that matches anything": [".*"]}


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
    """13: step() does not return when the answer is empty: it waits until the test sets :attr:`release` (for at most
    a minute); :attr:`hung` counts those steps."""

    release = threading.Event()
    hung = 0

    def step(self, action):
        if not action["content"]:
            type(self).hung += 1
            self.release.wait(60)
        return super().step(action)


class UnknownRoleOnTurn3(GoodText):
    """14: on turn 3 the hint comes in a message of role "observation", which chat templates drop or mangle."""

    def step(self, action):
        observation, *rest = super().step(action)
        if observation and self.turns == 3:
            observation = [{"role": "observation", "content": f"Hint: the word starts with {self.word[0]}."}]
        return observation, *rest


class DictContentOnTurn3(GoodText):
    """14: on turn 3 the reply's content is a dict, not a string."""

    def step(self, action):
        observation, *rest = super().step(action)
        if observation and self.turns == 3:
            observation = [{"role": "user", "content": {"hint": self.word[0]}}]
        return observation, *rest


class SilentRetry(GoodText):
    """14 (WARN): a wrong answer gets no reply at all, yet the episode goes on."""

    def step(self, action):
        _observation, *rest = super().step(action)
        return [], *rest


class ControlTokenInToolOutput(envkit.ToolEnv):
    """14 (WARN): a tool returns raw chat-log text that holds the control-token string <|im_end|>."""

    max_turns = 4

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        self.log = int(self.np_random.integers(1000))
        self.code = f"{self.np_random.integers(10_000):04d}"
        self.solved = False
        return [{"role": "user", "content": f"Read chat log {self.log} and tell me the code in it."}], {}

    @envkit.tool
    def read_log(self) -> str:
        """Read the chat log."""
        return f"user: what is the code?<|im_end|>\nassistant: it is {self.code}"

    def on_text(self, message):
        self.solved = re.findall(r"\b\d{4}\b", str(message.get("content") or "")) == [self.code]
        return None

    def score(self) -> float:
        return float(self.solved)

    def canaries(self):
        other = f"{(int(self.code) + 1) % 10_000:04d}"
        return {"the code among others": [f"The code is {self.code} or {other}."]}

    def oracle(self):
        if not any(m["role"] == "tool" for m in self.messages):
            return {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "read_log", "arguments": {}}}],
            }
        return {"role": "assistant", "content": f"The code is {self.code}."}


class SeedToolsRaise:
    """Seed-style, check 4: merely looking up get_tools raises (a property over a tool registry that is missing)."""

    def build_dataset(self, tokenizer):
        return [{"prompt": [{"role": "user", "content": "What is 2 + 2?"}]}]

    def score_episode(self, model, tokenizer, completion, case_idx):
        return float(completion.strip().endswith("4"))

    @property
    def get_tools(self):
        raise RuntimeError("no tool registry")


# ---- issue 23: a retail-refund env as a new user writes one from the README ---------------------------------------
ITEMS = ["kettle", "lamp", "scarf", "mug", "drill", "tent", "blender", "jacket", "toaster", "backpack"]
CUSTOMERS = ["Ana Reyes", "Ben Okafor", "Chloe Martin", "David Kim", "Elif Demir", "Farah Aziz", "Goran Novak"]
REFUND_TASKS = 200


def refund_call(order_id, amount):
    """An assistant message with the one call ``issue_refund(order_id, amount)``."""
    arguments = {"order_id": order_id, "amount": amount}
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "issue_refund", "arguments": arguments}}],
    }


class RetailRefund(envkit.ToolEnv):
    """A correct retail-refund env: 200 tasks, 3 tools, a score read off the database (exactly one refund, the damaged
    order's full price), an oracle and a canary. A customer reports a damaged item; the agent finds the order and
    refunds it."""

    max_turns = 6

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        self.task = self.draw_task()
        rng = random.Random(self.task)  # the task number is the whole task: 200 tasks
        self.customer = CUSTOMERS[self.task % len(CUSTOMERS)]
        items = rng.sample(ITEMS, 3)
        self.orders = {
            f"ORD-{1000 + self.task * 3 + k}": {"item": item, "price": round(rng.uniform(5, 300), 2)}
            for k, item in enumerate(items)
        }
        self.damaged = list(self.orders)[rng.randrange(3)]
        self.refunds = []  # the database table the score reads: (order_id, amount) rows
        item = self.orders[self.damaged]["item"]
        return [
            {"role": "system", "content": "You are a retail support agent. Refund damaged items in full."},
            {"role": "user", "content": f"Hi, I'm {self.customer}. The {item} I ordered arrived broken."},
        ], {}

    def draw_task(self) -> int:
        """The task number, from the seed."""
        return int(self.np_random.integers(REFUND_TASKS))

    @envkit.tool
    def list_orders(self, customer: str) -> str:
        """List a customer's orders.

        Args:
            customer: The customer's full name.
        """
        if customer != self.customer:
            raise envkit.ToolError(f"no customer named {customer!r}")
        return "\n".join(f"{oid}: {o['item']}, {o['price']:.2f}" for oid, o in self.orders.items())

    @envkit.tool
    def get_order(self, order_id: str) -> str:
        """Show one order.

        Args:
            order_id: The order id, such as ORD-1234.
        """
        if order_id not in self.orders:
            raise envkit.ToolError(f"no order {order_id!r}")
        order = self.orders[order_id]
        return f"{order_id}: {order['item']}, paid {order['price']:.2f}"

    @envkit.tool
    def issue_refund(self, order_id: str, amount: float) -> str:
        """Refund an order.

        Args:
            order_id: The order id.
            amount: The amount to refund.
        """
        if order_id not in self.orders:
            raise envkit.ToolError(f"no order {order_id!r}")
        self.refunds.append((order_id, float(amount)))
        return f"Refunded {amount:.2f} on {order_id}."

    def score(self) -> float:
        return float(self.refunds == [(self.damaged, self.orders[self.damaged]["price"])])

    def oracle(self):
        if not any(m["role"] == "tool" for m in self.messages):
            call = {"function": {"name": "list_orders", "arguments": {"customer": self.customer}}}
            return {"role": "assistant", "content": "", "tool_calls": [call]}
        if not self.refunds:
            return refund_call(self.damaged, self.orders[self.damaged]["price"])
        return None

    def canaries(self):
        return {"the refund claimed in text": ["I have refunded your order in full."]}


class RefundResetUnseeded(RetailRefund):
    """2 (and nothing else): the task number comes from the global random module, so reset(seed) is not
    deterministic; the replay, isolation and other checks that compare episodes of one seed cannot be judged."""

    def draw_task(self) -> int:
        return random.randrange(REFUND_TASKS)


class RefundVacuousScore(RetailRefund):
    """4: the score checks that every refund made is right — all([]) is True, so doing nothing scores 1.0."""

    def score(self) -> float:
        price = self.orders[self.damaged]["price"]
        return float(all(oid == self.damaged and amount == price for oid, amount in self.refunds))


class RefundResetReturnsBareList(RetailRefund):
    """2: reset() returns the opening messages alone, not (messages, info)."""

    def reset(self, *, seed=None, options=None):
        observation, _info = super().reset(seed=seed, options=options)
        return observation


class RefundAnyCallForTheOrder(RetailRefund):
    """15: the score accepts a refund of the right order anywhere among the refunds made, whatever its amount, so a
    turn that calls issue_refund several times with guessed amounts wins."""

    def score(self) -> float:
        return float(any(oid == self.damaged for oid, _ in self.refunds))


class RefundResetReturnsOneMessage(RetailRefund):
    """2: reset() returns a bare list of one message (envkit.Env's wrapper cannot unpack it)."""

    def reset(self, *, seed=None, options=None):
        observation, _info = super().reset(seed=seed, options=options)
        return observation[1:]


class NondeterministicLateInReply(GoodText):
    """5: a long reply whose only varying part, a clock reading, comes after its first 60 characters."""

    def step(self, action):
        _observation, *rest = super().step(action)
        reply = "No, that is not it. Answer with the code word alone, nothing else around it. "
        return [{"role": "user", "content": f"{reply}(attempt {time.perf_counter_ns()})"}], *rest
