"""The corpus's clean envs: one of each shape issue 38 names, each with an oracle, each passing ``envkit validate``.

Every planted bug of the corpus is one realistic edit of one of these (a subclass overriding one method), so a check
that catches the bug and passes its clean twin has found exactly what the edit broke.

* :class:`WordProblems` — a text-answer env: one word problem, answered in one message that states one number.
* :class:`Refunds` — a tool-call-answer env: find the damaged order, then ``issue_refund(order_id, amount)``.
* :class:`OrdersSql` — a DB-backed tool env: an in-memory SQLite database per seed, ``run_sql`` / ``submit_answer``,
  scored against the gold query's result (issue 38's example).
* :class:`DentistBooking` — a multi-turn env with a simulated user: ask the patient which day suits them, look the
  slots up, book the one they can make.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import sqlite3
from typing import Any, ClassVar

import envkit

NAMES = ("Ana", "Ben", "Chloe", "David", "Elif", "Farah", "Goran", "Hana", "Ivan", "Julia", "Kenji", "Lena")
"""First names the tasks draw from."""


def digest(*parts: Any) -> str:
    """A short digest of a task's content: its ``info["task_id"]`` (names the task without telling its answer)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def call(name: str, **arguments: Any) -> envkit.Message:
    """An assistant message with the one tool call ``name(**arguments)``."""
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}],
    }


# ---- a text-answer env ----------------------------------------------------------------------------------------------
class WordProblems(envkit.Env):
    """A word problem whose answer is a whole number; the agent answers in one message that states one number.

    Score: 1.0 when the reply's only number is the answer (``1,200`` is read as 1200), else 0.0.
    """

    max_turns: ClassVar[int] = 2

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[envkit.Message], dict[str, Any]]:
        """A problem drawn from ``seed``."""
        super().reset(seed=seed, options=options)
        rng = self.np_random
        name = NAMES[int(rng.integers(len(NAMES)))]
        boxes, per_box, eaten = int(rng.integers(3, 40)), int(rng.integers(6, 30)), int(rng.integers(1, 6))
        self.question = (
            f"{name} buys {boxes} boxes of {per_box} apples and eats {eaten} apples on the way home. "
            "How many apples does "
            f"{name} bring home?"
        )
        self.answer = boxes * per_box - eaten
        self.reply = ""
        opening = [
            {"role": "system", "content": "Solve the problem. Reply with the final number."},
            {"role": "user", "content": self.question},
        ]
        return opening, {"task_id": digest(self.question)}

    def step(self, action: envkit.Message) -> tuple[list[envkit.Message], float, bool, bool, dict[str, Any]]:
        """Record the reply; the episode ends with it."""
        self.reply = str(action.get("content") or "")
        return [], self.score(), True, False, {}

    def stated_numbers(self, text: str) -> list[float]:
        """The numbers a reply states, in order (thousands separators dropped)."""
        return [float(n.replace(",", "")) for n in re.findall(r"-?\d[\d,]*(?:\.\d+)?", text)]

    def score(self) -> float:
        """1.0 when the reply states exactly one number and it is the answer."""
        return float(self.stated_numbers(self.reply) == [self.answer])

    def oracle(self) -> envkit.Message | None:
        """States the answer."""
        return {"role": "assistant", "content": f"They bring home {self.answer} apples."}


# ---- a tool-call-answer env -----------------------------------------------------------------------------------------
ITEMS = ("kettle", "lamp", "backpack", "blender", "headphones", "umbrella", "toaster", "mug set", "desk fan")


class Refunds(envkit.ToolEnv):
    """A customer reports a damaged item; the agent lists their orders and refunds the damaged one in full.

    Score: 1.0 when exactly one refund was made, of the damaged order, for its full price; else 0.0.
    """

    max_turns: ClassVar[int] = 6

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[envkit.Message], dict[str, Any]]:
        """A customer, their three orders and which one arrived damaged, from ``seed``."""
        super().reset(seed=seed, options=options)
        rng = random.Random(seed)
        self.customer = f"{rng.choice(NAMES)} {rng.choice(('Reyes', 'Okafor', 'Martin', 'Kim', 'Demir', 'Novak'))}"
        self.orders = {
            f"ORD-{rng.randrange(1000, 9999)}": {"item": item, "price": round(rng.uniform(5, 300), 2)}
            for item in rng.sample(ITEMS, 3)
        }
        self.damaged = rng.choice(sorted(self.orders))
        self.refunds: list[tuple[str, float]] = []
        opening = [
            {"role": "system", "content": "You are a retail support agent. Refund damaged items in full."},
            {
                "role": "user",
                "content": f"Hi, I'm {self.customer}. The {self.orders[self.damaged]['item']} I ordered is broken.",
            },
        ]
        return opening, {"task_id": digest(self.customer, self.orders, self.damaged)}

    @envkit.tool
    def list_orders(self, customer: str) -> str:
        """List a customer's orders with their items and prices.

        Args:
            customer: The customer's full name.
        """
        if customer != self.customer:
            raise envkit.ToolError(f"no customer named {customer!r}")
        return "\n".join(f"{oid}: {o['item']}, {o['price']:.2f}" for oid, o in self.orders.items())

    @envkit.tool
    def issue_refund(self, order_id: str, amount: float) -> str:
        """Refund an order.

        Args:
            order_id: The order id, such as ORD-1234.
            amount: The amount to refund.
        """
        if order_id not in self.orders:
            raise envkit.ToolError(f"no order {order_id!r}")
        self.refunds.append((order_id, float(amount)))
        return f"Refunded {amount:.2f} on {order_id}."

    def score(self) -> float:
        """1.0 when the refunds made are exactly the damaged order's full price."""
        return float(self.refunds == [(self.damaged, self.orders[self.damaged]["price"])])

    def oracle(self) -> envkit.Message | None:
        """List the orders, then refund the damaged one."""
        if not any(m["role"] == "tool" for m in self.messages):
            return call("list_orders", customer=self.customer)
        if not self.refunds:
            return call("issue_refund", order_id=self.damaged, amount=self.orders[self.damaged]["price"])
        return None


# ---- a DB-backed tool env -------------------------------------------------------------------------------------------
SQL_QUESTIONS = (
    ("How many orders are there?", "SELECT COUNT(*) FROM orders"),
    ("What is the total amount of all orders?", "SELECT SUM(amount) FROM orders"),
    ("What is the largest single order amount?", "SELECT MAX(amount) FROM orders"),
    (
        "Which customers have placed an order over 300? List their names.",
        "SELECT DISTINCT customer FROM orders WHERE amount > 300 ORDER BY customer",
    ),
)
"""Each seed asks one of these of its own ``orders`` table (the texts repeat; the tables and answers do not)."""
SQL_CUSTOMERS = ("ana", "ben", "chloe", "david", "elif", "farah", "goran")


class OrdersSql(envkit.ToolEnv):
    """Answer a question about the ``orders`` table of an in-memory SQLite database built for the seed.

    Tools: ``run_sql(query)`` runs one SELECT; ``submit_answer(answer)`` submits the answer and ends the episode
    (a list answer as comma-separated values). The score compares the submission with the gold query's result.
    Names each task in ``info["task_id"]`` (the question and the rows), since the question texts repeat across seeds.

    Score: 1.0 when the submitted values are exactly the gold result's (one value per row; numbers compared as
    numbers, in any order), else 0.0.
    """

    max_turns: ClassVar[int] = 6

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[envkit.Message], dict[str, Any]]:
        """A question and a fresh database from ``seed``."""
        super().reset(seed=seed, options=options)
        rng = random.Random(seed)
        self.question, self.gold_sql = SQL_QUESTIONS[rng.randrange(len(SQL_QUESTIONS))]
        self.rows = [(i + 1, rng.choice(SQL_CUSTOMERS), rng.randrange(20, 500)) for i in range(rng.randrange(5, 12))]
        self.db = self.connect()
        self.gold = self.values(self.db.execute(self.gold_sql).fetchall())
        self.submitted: list[str] | None = None
        opening = [
            {
                "role": "system",
                "content": "Answer the question with SQL. Table orders(id INTEGER, customer TEXT, amount INTEGER). "
                "Call submit_answer with the answer when you have it.",
            },
            {"role": "user", "content": self.question},
        ]
        return opening, {"task_id": digest(self.question, self.rows)}

    def connect(self) -> sqlite3.Connection:
        """This episode's database: an in-memory SQLite holding :attr:`rows`."""
        db = sqlite3.connect(":memory:", check_same_thread=False)  # tools may run on another thread than reset
        db.execute("CREATE TABLE orders (id INTEGER, customer TEXT, amount INTEGER)")
        db.executemany("INSERT INTO orders VALUES (?, ?, ?)", self.rows)
        return db

    def __getstate__(self) -> dict[str, Any]:
        # A connection neither pickles nor deep-copies: copies rebuild their own from the rows.
        state = dict(self.__dict__)
        state.pop("db", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if "rows" in state:
            self.db = self.connect()

    @staticmethod
    def values(rows: list[tuple[Any, ...]]) -> list[str]:
        """A result's values as text, one per row (first column)."""
        return [str(row[0]) for row in rows]

    @envkit.tool
    def run_sql(self, query: str) -> str:
        """Run one SELECT query on the orders table and return its rows, one per line.

        Args:
            query: One SQLite SELECT statement, e.g. "SELECT COUNT(*) FROM orders".
        """
        if not query.lstrip().upper().startswith("SELECT"):
            raise envkit.ToolError("only SELECT queries are allowed")
        try:
            rows = self.db.execute(query).fetchmany(50)
        except sqlite3.Error as error:
            raise envkit.ToolError(f"SQL error: {error}") from None
        return "\n".join(", ".join(str(v) for v in row) for row in rows) or "(no rows)"

    @envkit.tool
    def submit_answer(self, answer: str) -> str:
        """Submit the answer and end the episode.

        Args:
            answer: The answer: one value, or the values of a list separated by commas.
        """
        self.submitted = [part.strip() for part in answer.split(",") if part.strip()]
        self.end_episode()
        return "Answer submitted."

    def matches(self, submitted: list[str]) -> bool:
        """Whether submitted values are exactly the gold values (numbers as numbers), in any order."""
        return sorted(map(_normal, submitted)) == sorted(map(_normal, self.gold))

    def score(self) -> float:
        """1.0 when the submission is exactly the gold query's result."""
        return float(self.submitted is not None and self.matches(self.submitted))

    def oracle(self) -> envkit.Message | None:
        """Run the gold query, then submit its values."""
        if not any(m["role"] == "tool" for m in self.messages):
            return call("run_sql", query=self.gold_sql)
        if self.submitted is None:
            return call("submit_answer", answer=", ".join(self.gold))
        return None


def _normal(value: str) -> str:
    try:
        return repr(float(value))
    except ValueError:
        return value.strip().lower()


# ---- a multi-turn env with a simulated user -------------------------------------------------------------------------
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday")


class DentistBooking(envkit.ToolEnv):
    """A patient wants a dentist appointment; only they know which day they can come (they say so when asked).

    The agent asks, lists that day's free slots with ``list_slots(day)`` and books the afternoon one with
    ``book_slot(slot_id)``; the patient then thanks it and the conversation ends. The simulated user is scripted:
    asked anything before the booking, they name their day; after it, they say goodbye.

    Score: 1.0 when exactly one booking was made, of the free afternoon slot on the patient's day; else 0.0.
    """

    max_turns: ClassVar[int] = 8

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[envkit.Message], dict[str, Any]]:
        """A patient, their day and the week's free slots, from ``seed``."""
        super().reset(seed=seed, options=options)
        rng = random.Random(seed)
        self.patient = rng.choice(NAMES)
        self.day = rng.choice(DAYS)
        self.slots = {
            day: sorted(
                {f"{day[:3].upper()}-{hour:02d}{rng.choice((0, 30)):02d}" for hour in rng.sample(range(8, 18), 3)}
            )
            for day in DAYS
        }
        afternoon = [s for s in self.slots[self.day] if int(s[4:6]) >= 13]
        if not afternoon:  # every day gets one afternoon slot
            afternoon = [f"{self.day[:3].upper()}-{rng.randrange(13, 18):02d}00"]
            self.slots[self.day] = sorted([*self.slots[self.day][:2], *afternoon])
        self.right = afternoon[0]
        self.slots[self.day] = [s for s in self.slots[self.day] if int(s[4:6]) < 13 or s == self.right]
        self.bookings: list[str] = []
        self.told_day = False
        opening = [
            {
                "role": "system",
                "content": "You book dentist appointments. Ask the patient which day suits them; they can only come "
                "in the afternoon (13:00 or later). Look the slots up, then book one.",
            },
            {"role": "user", "content": f"Hi, this is {self.patient}. I need a check-up, please."},
        ]
        return opening, {"task_id": digest(self.patient, self.day, self.slots)}

    @envkit.tool
    def list_slots(self, day: str) -> str:
        """List the free appointment slots of a weekday.

        Args:
            day: The weekday, e.g. "Tuesday".
        """
        if day not in self.slots:
            raise envkit.ToolError(f"no such day {day!r}: one of {', '.join(DAYS)}")
        return ", ".join(self.slots[day])

    @envkit.tool
    def book_slot(self, slot_id: str) -> str:
        """Book a slot for the patient.

        Args:
            slot_id: The slot id, e.g. "TUE-1430".
        """
        if not any(slot_id in slots for slots in self.slots.values()):
            raise envkit.ToolError(f"no free slot {slot_id!r}")
        self.bookings.append(slot_id)
        return f"Booked {slot_id} for {self.patient}."

    def on_text(self, message: envkit.Message) -> list[envkit.Message] | None:
        """The patient's reply: their day while nothing is booked, a goodbye (ending the episode) after."""
        if self.bookings:
            return None
        self.told_day = True
        return [{"role": "user", "content": f"I can only come on {self.day}, in the afternoon."}]

    def score(self) -> float:
        """1.0 when the bookings are exactly the afternoon slot of the patient's day."""
        return float(self.bookings == [self.right])

    def oracle(self) -> envkit.Message | None:
        """Ask, look the day up, book the afternoon slot, say goodbye."""
        if not self.told_day:
            return {"role": "assistant", "content": "Which day would suit you?"}
        if not any(m["role"] == "tool" for m in self.messages):
            return call("list_slots", day=self.day)
        if not self.bookings:
            return call("book_slot", slot_id=self.right)
        return {"role": "assistant", "content": f"You're booked for {self.right}. Goodbye!"}


CLEAN_ENVS: dict[str, type[envkit.Env]] = {
    "text": WordProblems,
    "tool-call": Refunds,
    "db": OrdersSql,
    "multi-turn": DentistBooking,
}
"""The clean env of each shape, by shape."""
