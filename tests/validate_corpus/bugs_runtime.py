"""Planted bugs of issue 38's classes 4 (a crash on what a model sends), 5 (state leaking between episodes or
instances) and 6 (limits that are not what they say): each a subclass of a clean env of :mod:`validate_corpus.clean`
that changes one thing, as an env author really would."""

from __future__ import annotations

import functools
import random
import re
import sqlite3
from typing import Any, ClassVar

import envkit
from validate_corpus.clean import DentistBooking, OrdersSql, Refunds, WordProblems
from validate_corpus.planted import PlantedBug

FINAL_ANSWERS = "final answers as a model writes them"
LEAKS = "state between episodes and instances"
ISOLATION = "isolation between instances"
RESET = "reset: messages, seeding, variety"
TERMINATION = "termination by max_turns"
CUT = "score when the engine cuts the episode"
CUT_ANY_TURN = "score when an episode is cut at any turn"
"""The titles of the checks the bugs below must fail."""


# ---- class 4: the score or a tool crashes on what a model sends -----------------------------------------------------
class WordProblemsReadsWholeNumbers(WordProblems):
    """The answer is a whole number, so the stated numbers are read with int(): "301.0" raises ValueError in the
    score."""

    def stated_numbers(self, text: str) -> list[float]:
        return [int(n.replace(",", "")) for n in re.findall(r"-?\d[\d,]*(?:\.\d+)?", text)]


class RefundsNormalizesOrderIds(Refunds):
    """issue_refund forgives sloppy ids ("ord-1234", "1234") by reading the number with int(): an id without one
    ("", "N/A") raises ValueError inside the tool."""

    @envkit.tool
    def issue_refund(self, order_id: str, amount: float) -> str:
        """Refund an order.

        Args:
            order_id: The order id, such as ORD-1234.
            amount: The amount to refund.
        """
        return super().issue_refund(f"ORD-{int(order_id.upper().removeprefix('ORD-'))}", amount)


class SqlComparesNumbersAsFloats(OrdersSql):
    """Numeric answers are compared as floats, so "12 orders" or "$4,310" raises ValueError in the score."""

    def matches(self, submitted: list[str]) -> bool:
        if all(re.fullmatch(r"-?\d+(?:\.\d+)?", g) for g in self.gold):
            return sorted(float(s) for s in submitted) == sorted(float(g) for g in self.gold)
        return super().matches(submitted)


class DentistPatientReadsTheConfirmation(DentistBooking):
    """After the booking the patient reads the slot back from the agent's goodbye with a regex, assuming it names
    one: a goodbye without a slot id raises AttributeError."""

    def on_text(self, message: envkit.Message) -> list[envkit.Message] | None:
        if self.bookings:
            self.confirmed = re.search(r"[A-Z]{3}-\d{4}", str(message.get("content") or "")).group(0)
        return super().on_text(message)


class DentistBookingSplitsSlotIds(DentistBooking):
    """book_slot forgives lower-case ids ("tue-1430") by splitting them into day and time: an id without a dash
    raises ValueError inside the tool."""

    @envkit.tool
    def book_slot(self, slot_id: str) -> str:
        """Book a slot for the patient.

        Args:
            slot_id: The slot id, e.g. "TUE-1430".
        """
        day, time = slot_id.strip().split("-")
        return super().book_slot(f"{day.upper()}-{int(time):04d}")


# ---- class 5: state leaks between episodes or instances -------------------------------------------------------------
class WordProblemsRemembersReplies(WordProblems):
    """Replies are remembered per question on the class, to tell the agent what it answered last time."""

    last_replies: ClassVar[dict[str, str]] = {}

    def reset(self, *, seed=None, options=None):
        opening, info = super().reset(seed=seed, options=options)
        if self.question in self.last_replies:
            note = f" (Last time you answered: {self.last_replies[self.question]})"
            opening[1] = {**opening[1], "content": opening[1]["content"] + note}
        return opening, info

    def step(self, action):
        result = super().step(action)
        self.last_replies[self.question] = self.reply
        return result


_ASKED: set[str] = set()


class WordProblemsAvoidsRepeats(WordProblems):
    """A module-level set of the questions already asked makes reset draw again on a repeat, for variety."""

    def reset(self, *, seed=None, options=None):
        opening, info = super().reset(seed=seed, options=options)
        while self.question in _ASKED:
            opening, info = super().reset(seed=int(self.np_random.integers(10**9)), options=options)
        _ASKED.add(self.question)
        return opening, info


@functools.lru_cache(maxsize=1024)
def _orders_of(seed: int | None) -> tuple[str, dict[str, dict[str, Any]], str]:
    rng = random.Random(seed)
    names = ("Ana", "Ben", "Chloe", "David", "Elif", "Farah", "Goran", "Hana", "Ivan", "Julia", "Kenji", "Lena")
    customer = f"{rng.choice(names)} {rng.choice(('Reyes', 'Okafor', 'Martin', 'Kim', 'Demir', 'Novak'))}"
    items = ("kettle", "lamp", "backpack", "blender", "headphones", "umbrella", "toaster", "mug set", "desk fan")
    orders = {
        f"ORD-{rng.randrange(1000, 9999)}": {"item": item, "price": round(rng.uniform(5, 300), 2)}
        for item in rng.sample(items, 3)
    }
    return customer, orders, rng.choice(sorted(orders))


class RefundsCachesOrders(Refunds):
    """A seed's orders are generated once (an lru_cache) and refunded orders are marked in them, so a second episode
    of the seed finds its order already refunded."""

    def reset(self, *, seed=None, options=None):
        opening, info = super().reset(seed=seed, options=options)
        self.customer, self.orders, self.damaged = _orders_of(seed)
        return opening, info

    @envkit.tool
    def issue_refund(self, order_id: str, amount: float) -> str:
        """Refund an order.

        Args:
            order_id: The order id, such as ORD-1234.
            amount: The amount to refund.
        """
        if self.orders.get(order_id, {}).get("refunded"):
            raise envkit.ToolError(f"{order_id} was already refunded")
        result = super().issue_refund(order_id, amount)
        self.orders[order_id]["refunded"] = True
        return result


class SqlSharesOneConnection(OrdersSql):
    """One SQLite connection on the class serves every instance ("connecting is slow"); each reset recreates the
    table in it, so two instances stepped together query each other's rows."""

    shared: ClassVar[sqlite3.Connection | None] = None

    def connect(self) -> sqlite3.Connection:
        if SqlSharesOneConnection.shared is None:
            SqlSharesOneConnection.shared = sqlite3.connect(":memory:", check_same_thread=False)
        db = SqlSharesOneConnection.shared
        db.executescript("DROP TABLE IF EXISTS orders; CREATE TABLE orders (id INTEGER, customer TEXT, amount INTEGER)")
        db.executemany("INSERT INTO orders VALUES (?, ?, ?)", self.rows)
        return db


_WEEKS: dict[int | None, dict[str, list[str]]] = {}


class DentistKeepsTheWeek(DentistBooking):
    """The week's free slots are kept per seed in a module-level dict (the diary), and a booking takes its slot out
    of it, so the next episode of the seed finds the slot gone."""

    def reset(self, *, seed=None, options=None):
        opening, info = super().reset(seed=seed, options=options)
        self.slots = _WEEKS.setdefault(seed, self.slots)
        return opening, info

    @envkit.tool
    def book_slot(self, slot_id: str) -> str:
        """Book a slot for the patient.

        Args:
            slot_id: The slot id, e.g. "TUE-1430".
        """
        result = super().book_slot(slot_id)
        for slots in self.slots.values():
            if slot_id in slots:
                slots.remove(slot_id)
        return result


# ---- class 6: limits that are not what they say ---------------------------------------------------------------------
class RefundsCapsTheTranscript(Refunds):
    """The env cuts the episode itself once the transcript holds twice max_turns messages, meant as the same cap:
    with two opening messages it cuts a turn early."""

    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        if not terminated and len(self.messages) + len(observation) >= 2 * self.max_turns:
            truncated = True
        return observation, reward, terminated, truncated, info


class SqlCountsSuccessfulQueries(OrdersSql):
    """The env keeps its own budget of six queries instead of max_turns, but counts only the queries that ran: a
    policy whose queries fail never runs out."""

    max_turns: ClassVar[int] = 1000

    def reset(self, *, seed=None, options=None):
        self.queries = 0
        return super().reset(seed=seed, options=options)

    @envkit.tool
    def run_sql(self, query: str) -> str:
        """Run one SELECT query on the orders table and return its rows, one per line.

        Args:
            query: One SQLite SELECT statement, e.g. "SELECT COUNT(*) FROM orders".
        """
        result = super().run_sql(query)
        self.queries += 1
        if self.queries >= 6:
            self.end_episode(envkit.Ending.MAX_STEPS)
        return result


class RefundsCreditsTheLastRefund(Refunds):
    """An episode whose token budget ran out in the middle of the model's reply gets half credit when its last refund
    was the right one: read from the refunds without checking there is one, so a cut before any refund raises
    IndexError."""

    def score(self) -> float:
        if self.ending is envkit.Ending.MAX_EPISODE_TOKENS:
            return 0.5 * (self.refunds[-1][0] == self.damaged)
        return super().score()


class DentistCreditsACutBooking(DentistBooking):
    """A conversation whose token budget ran out in the middle of the goodbye gets full credit for its booking (the
    goodbye is a formality): the last booking is read without checking there is one, so a cut before any booking
    raises IndexError."""

    def score(self) -> float:
        if self.ending is envkit.Ending.MAX_EPISODE_TOKENS:
            return float(self.bookings[-1] == self.right)
        return super().score()


def _bug(id: str, bug_class: int, shape: str, factory: type[envkit.Env], expected: str) -> PlantedBug:
    description = " ".join((factory.__doc__ or "").split("\n\n")[0].split())
    return PlantedBug(id, bug_class, shape, description, factory, expected)


BUGS: list[PlantedBug] = [
    _bug("text-reads-whole-numbers", 4, "text", WordProblemsReadsWholeNumbers, FINAL_ANSWERS),
    _bug("refund-normalizes-order-ids", 4, "tool-call", RefundsNormalizesOrderIds, FINAL_ANSWERS),
    _bug("sql-compares-numbers-as-floats", 4, "db", SqlComparesNumbersAsFloats, FINAL_ANSWERS),
    _bug("dentist-patient-reads-the-confirmation", 4, "multi-turn", DentistPatientReadsTheConfirmation, FINAL_ANSWERS),
    _bug("dentist-splits-slot-ids", 4, "multi-turn", DentistBookingSplitsSlotIds, FINAL_ANSWERS),
    _bug("text-remembers-replies-on-the-class", 5, "text", WordProblemsRemembersReplies, LEAKS),
    _bug("text-avoids-repeated-questions", 5, "text", WordProblemsAvoidsRepeats, RESET),
    _bug("refund-orders-cached-and-marked", 5, "tool-call", RefundsCachesOrders, LEAKS),
    _bug("sql-one-connection-for-all", 5, "db", SqlSharesOneConnection, ISOLATION),
    _bug("dentist-week-kept-per-seed", 5, "multi-turn", DentistKeepsTheWeek, LEAKS),
    _bug("refund-caps-the-transcript", 6, "tool-call", RefundsCapsTheTranscript, TERMINATION),
    _bug("sql-counts-successful-queries", 6, "db", SqlCountsSuccessfulQueries, TERMINATION),
    _bug("refund-credits-the-last-refund", 6, "tool-call", RefundsCreditsTheLastRefund, CUT),
    _bug("dentist-credits-a-cut-booking", 6, "multi-turn", DentistCreditsACutBooking, CUT_ANY_TURN),
]
"""The planted bugs of classes 4, 5 and 6."""
