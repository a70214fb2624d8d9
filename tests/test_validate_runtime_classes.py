"""``envkit validate`` on three kinds of env bug (issue #38, classes 4–6), each caught by one check that names the
cause: an answer a model really writes crashes the score or the answering tool (check 21), state leaks between
episodes or instances (checks 22 and 6), and limits that are not what they say (checks 9 and 23). Each broken env is
one realistic edit of a correct one, and the correct ones pass."""

from __future__ import annotations

import copy
import re
import sqlite3

import pytest
from validate_corpus.bugs_runtime import RefundsCreditsTheLastRefund, SqlSharesOneConnection, WordProblemsAvoidsRepeats

import envkit
from envkit.validate import FAIL, PASS, SKIP, validate_env

QUESTIONS = [(12, 104), (7, 1250), (33, 61), (5, 2200), (48, 19), (21, 730), (9, 4100), (64, 45), (3, 999), (15, 88)]


class Product(envkit.Env):
    """A correct text env: multiply two numbers; the reply's last number is the answer, commas allowed."""

    max_turns = 3

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        self.a, self.b = QUESTIONS[int(self.np_random.integers(len(QUESTIONS)))]
        self.reply = ""
        return [{"role": "user", "content": f"What is {self.a} times {self.b}?"}], {}

    def step(self, action):
        self.reply = str(action.get("content") or "")
        return [], self.score(), True, False, {}

    def answer(self) -> float | None:
        """The reply's last number, thousands separators dropped; ``None`` when it has none."""
        found = re.findall(r"-?\d[\d,]*(?:\.\d+)?", self.reply)
        return float(found[-1].replace(",", "")) if found else None

    def score(self) -> float:
        return float(self.answer() == self.a * self.b)

    def oracle(self):
        return {"role": "assistant", "content": str(self.a * self.b)}


class ProductParsesWithoutCommas(Product):
    """4: the number pattern allows commas but the parser does not drop them: "1,250" raises ValueError."""

    def answer(self) -> float | None:
        found = re.findall(r"-?\d[\d,]*(?:\.\d+)?", self.reply)
        return float(found[-1]) if found else None


class Ledger(envkit.ToolEnv):
    """A correct tool-call-answer env on a SQLite database of its own: look an account up, then submit its balance
    with ``submit_balance`` (a string, as a model writes money), which ends the episode."""

    max_turns = 5

    def __init__(self) -> None:
        super().__init__()
        self.db = sqlite3.connect(":memory:", check_same_thread=False)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        self.db.executescript("DROP TABLE IF EXISTS accounts; CREATE TABLE accounts (name TEXT, cents INTEGER)")
        rng = self.np_random
        rows = [(f"acct-{int(rng.integers(100, 999))}", int(rng.integers(100, 10**7))) for _ in range(3)]
        self.db.executemany("INSERT INTO accounts VALUES (?, ?)", rows)
        self.target, self.submitted = rows[int(rng.integers(3))][0], None
        return [{"role": "user", "content": f"What is the balance of {self.target}?"}], {}

    def balance(self, name: str) -> int | None:
        """The account's balance in cents."""
        row = self.db.execute("SELECT cents FROM accounts WHERE name = ?", (name,)).fetchone()
        return row[0] if row else None

    @envkit.tool
    def lookup(self, name: str) -> str:
        """Show an account.

        Args:
            name: The account name.
        """
        cents = self.balance(name)
        if cents is None:
            raise envkit.ToolError(f"no account {name!r}")
        return f"{name}: {cents / 100:.2f}"

    @envkit.tool
    def charge_fee(self, name: str) -> str:
        """Charge the monthly fee of 1.00 to an account.

        Args:
            name: The account name.
        """
        self.db.execute("UPDATE accounts SET cents = cents - 100 WHERE name = ?", (name,))
        return "charged"

    @envkit.tool
    def submit_balance(self, balance: str) -> str:
        """Submit the balance; this ends the episode.

        Args:
            balance: The balance, e.g. "1234.50".
        """
        self.submitted = self.parse(balance)
        self.end_episode()
        return "submitted"

    def parse(self, text: str) -> int | None:
        """Cents from a money string (``$1,234.50``); ``None`` when it is not one."""
        cleaned = text.strip().replace(",", "").removeprefix("$")
        if not re.fullmatch(r"-?\d{1,15}(?:\.\d+)?", cleaned):  # at most a trillion dollars: a float holds it
            return None
        return round(float(cleaned) * 100)

    def score(self) -> float:
        return float(self.submitted is not None and self.submitted == self.balance(self.target))

    def oracle(self):
        if not any(m["role"] == "tool" for m in self.messages):
            name, arguments = "lookup", {"name": self.target}
        else:
            name, arguments = "submit_balance", {"balance": f"{self.balance(self.target) / 100:.2f}"}
        call = {"type": "function", "function": {"name": name, "arguments": arguments}}
        return {"role": "assistant", "content": "", "tool_calls": [call]}


class LedgerParsesUnits(Ledger):
    """4: the money parser strips a leading "$" and trusts the rest: "1234.50 dollars" raises inside the tool."""

    def parse(self, text: str) -> int | None:
        return round(float(text.strip().removeprefix("$")) * 100)


_CONNECTIONS: dict[int, sqlite3.Connection] = {}


class LedgerCachesDatabases(Ledger):
    """5: each seed's database is built once and kept in a module-level cache, so an episode's writes (the fee it
    charged) are there when the seed is played again."""

    def reset(self, *, seed=None, options=None):
        if seed not in _CONNECTIONS:
            _CONNECTIONS[seed] = sqlite3.connect(":memory:", check_same_thread=False)
            self.db = _CONNECTIONS[seed]
            return super().reset(seed=seed, options=options)
        self.db = _CONNECTIONS[seed]
        envkit.ToolEnv.reset(self, seed=seed, options=options)
        rng = self.np_random
        rows = [(f"acct-{int(rng.integers(100, 999))}", int(rng.integers(100, 10**7))) for _ in range(3)]
        self.target, self.submitted = rows[int(rng.integers(3))][0], None
        return [{"role": "user", "content": f"What is the balance of {self.target}?"}], {}

    def oracle(self):
        if len(self.messages) == 1:  # charge the fee first: the oracle writes
            call = {"type": "function", "function": {"name": "charge_fee", "arguments": {"name": self.target}}}
            return {"role": "assistant", "content": "", "tool_calls": [call]}
        return super().oracle()


class LedgerWithFees(Ledger):
    """A correct ledger whose oracle writes: it charges the monthly fee before looking the balance up."""

    def oracle(self):
        if len(self.messages) == 1:
            call = {"type": "function", "function": {"name": "charge_fee", "arguments": {"name": self.target}}}
            return {"role": "assistant", "content": "", "tool_calls": [call]}
        return super().oracle()


class LedgerCopiesShareTheDatabase(LedgerWithFees):
    """5: made copyable (a SQLite connection is not) by a ``__deepcopy__`` that copies everything but the
    connection, which the copy shares: an episode on the copy charges the original's accounts."""

    def __deepcopy__(self, memo):
        clone = copy.copy(self)
        clone.__dict__ = {k: v if k == "db" else copy.deepcopy(v, memo) for k, v in vars(self).items()}
        return clone


class ProductWithHistory(Product):
    """5: the replies are kept on the class to "remember" answers, and a repeated question gets a hint from it."""

    seen: dict = {}  # noqa: RUF012 - the bug: one dict for every instance

    def reset(self, *, seed=None, options=None):
        observation, info = super().reset(seed=seed, options=options)
        if (self.a, self.b) in self.seen:
            observation[0]["content"] += f" (last time you said {self.seen[self.a, self.b]})"
        return observation, info

    def step(self, action):
        result = super().step(action)
        self.seen[self.a, self.b] = self.reply
        return result


class LedgerCountsMessages(Ledger):
    """6: cuts the episode itself when the transcript reaches max_turns messages, so it ends after about half the
    turns it says."""

    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        if not terminated and len(self.messages) + len(observation) >= self.max_turns:
            truncated = True
        return observation, reward, terminated, truncated, info


class LedgerScoresCutEpisodesByProgress(Ledger):
    """6: gives a cut episode partial credit per lookup made, dividing by the lookups: a cut before any raises."""

    def score(self) -> float:
        if self.ending is None or self.ending.proper:
            return super().score()
        lookups = sum(m["role"] == "tool" and m.get("name") == "lookup" for m in self.messages)
        return 0.5 * lookups / lookups


def checks_of(env_cls, episodes=4):
    report = validate_env(env_cls, target=env_cls.__name__, episodes=episodes, call_timeout_s=10)
    return {c.id: c for c in report.checks}, report


@pytest.mark.parametrize("env_cls", [Product, Ledger, LedgerWithFees])
def test_the_correct_envs_pass_every_check(env_cls):
    found, report = checks_of(env_cls)
    assert not report.failed, [(c.id, c.reason) for c in report.checks if c.status == FAIL]
    assert {found[i].status for i in (9, 21, 22, 23)} == {PASS}, report.summary()


@pytest.mark.parametrize(
    ("env_cls", "check", "says"),
    [
        (ProductParsesWithoutCommas, 21, "raised ValueError: could not convert string to float: '2,997' (in answer()"),
        (LedgerParsesUnits, 21, "submit_balance() raised ValueError"),
        (LedgerCachesDatabases, 22, "total_changes"),
        (ProductWithHistory, 22, "ProductWithHistory.seen (on the class)"),
        (LedgerCopiesShareTheDatabase, 12, "shares self.db (a Connection"),
        (LedgerCountsMessages, 9, "but max_turns=5"),
        (LedgerScoresCutEpisodesByProgress, 23, "score() raised ZeroDivisionError"),
    ],
)
def test_each_bug_is_one_fail_that_names_its_cause(env_cls, check, says):
    found, report = checks_of(env_cls)
    failed = [c.id for c in report.checks if c.status == FAIL]
    assert failed == [check], [(c.id, c.status, c.reason) for c in report.checks if c.status != PASS]
    assert says in found[check].reason, found[check].reason


def test_check_9_plays_on_without_the_tool_that_ends_the_episode():
    found, _ = checks_of(Ledger)
    assert "without submit_balance" in found[9].reason
    assert "truncated (max_turns) after 5 turns" in found[9].reason


def test_a_leak_is_reported_once_and_the_replay_check_defers_to_it():
    found, _ = checks_of(LedgerCachesDatabases)
    assert found[5].status in (PASS, SKIP)
    if found[5].status == SKIP:
        assert "see check 22" in found[5].reason


def test_the_isolation_and_reset_checks_name_the_state_instances_share():
    found, _ = checks_of(SqlSharesOneConnection)
    assert found[6].status == FAIL and "they share self.db (a Connection)" in found[6].reason, found[6].reason
    found, _ = checks_of(WordProblemsAvoidsRepeats)
    assert found[2].status == FAIL, found[2].reason
    assert "reset() writes into validate_corpus.bugs_runtime._ASKED (a module global)" in found[2].reason


def test_a_crash_in_a_cut_episode_is_reported_once_by_the_first_check_that_finds_it():
    found, _ = checks_of(RefundsCreditsTheLastRefund)
    assert found[18].status == FAIL and "IndexError" in found[18].reason
    assert found[23].status == SKIP and "as an earlier check reported" in found[23].reason, found[23].reason
