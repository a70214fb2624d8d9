"""A text-to-SQL env whose question texts repeat across seeds while each seed has its own database (issue 39 item 4):
the tasks differ in hidden state, and only ``info["task_id"]`` tells them apart."""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from typing import Any, ClassVar

import envkit

QUESTIONS = (
    ("How many orders are there?", "SELECT COUNT(*) FROM orders"),
    ("What is the total amount of all orders?", "SELECT SUM(amount) FROM orders"),
    ("What is the largest order amount?", "SELECT MAX(amount) FROM orders"),
)
"""Each seed asks one of these of its own ``orders`` table: the text repeats, the answer does not."""
CUSTOMERS = ("ana", "ben", "chloe", "david", "elif")


class OrdersSqlEnv(envkit.ToolEnv):
    """Answer a question about the ``orders`` table (``id``, ``customer``, ``amount``) with the ``run_sql`` tool.

    Seed ``s`` asks question ``s % 3`` and draws the rows. Names each task in ``info["task_id"]``: a digest of the
    question and the rows (the answer itself stays hidden).
    """

    max_turns: ClassVar[int] = 4
    names_tasks: ClassVar[bool] = True
    """Whether ``reset`` returns ``info["task_id"]``."""

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[envkit.Message], dict[str, Any]]:
        """A question and a fresh ``orders`` table from ``seed``."""
        super().reset(seed=seed, options=options)
        rng = self.np_random
        index = seed if seed is not None else int(rng.integers(len(QUESTIONS)))
        self.question, self.gold_sql = QUESTIONS[index % len(QUESTIONS)]
        self.rows = [
            (i + 1, CUSTOMERS[int(rng.integers(len(CUSTOMERS)))], int(rng.integers(5, 500)))
            for i in range(int(rng.integers(3, 9)))
        ]
        self.answer = self._query(self.gold_sql)
        opening = [
            {"role": "system", "content": "Answer the question about the orders table with one number."},
            {"role": "user", "content": self.question},
        ]
        info: dict[str, Any] = {}
        if self.names_tasks:
            task = json.dumps([self.question, self.rows]).encode()
            info["task_id"] = hashlib.sha256(task).hexdigest()[:16]
        return opening, info

    def _query(self, sql: str) -> str:
        with sqlite3.connect(":memory:") as db:  # built per call: the env holds plain rows, so it copies and pickles
            db.execute("CREATE TABLE orders (id INTEGER, customer TEXT, amount INTEGER)")
            db.executemany("INSERT INTO orders VALUES (?, ?, ?)", self.rows)
            return "\n".join(", ".join(str(v) for v in row) for row in db.execute(sql).fetchall())

    @envkit.tool
    def run_sql(self, query: str) -> str:
        """Run a SELECT query on the orders table and return its rows, one per line.

        Args:
            query: One SQLite SELECT statement, e.g. "SELECT COUNT(*) FROM orders".
        """
        if not query.lstrip().upper().startswith("SELECT"):
            raise envkit.ToolError("only SELECT queries are allowed")
        try:
            return self._query(query)
        except sqlite3.Error as error:
            raise envkit.ToolError(f"SQL error: {error}") from None

    def score(self) -> float:
        """1.0 when the last message is the agent's and the only number it states is the answer."""
        last = self.messages[-1]
        numbers = re.findall(r"\d+", str(last.get("content") or ""))
        return float(last["role"] == "assistant" and numbers == [self.answer])

    def oracle(self) -> envkit.Message:
        """Query with the gold SQL, then state its result."""
        if self.messages[-1]["role"] == "user":
            call = {"type": "function", "function": {"name": "run_sql", "arguments": {"query": self.gold_sql}}}
            return {"role": "assistant", "content": "", "tool_calls": [call]}
        return {"role": "assistant", "content": f"The answer is {self.messages[-1]['content']}."}


class UnnamedOrdersSqlEnv(OrdersSqlEnv):
    """:class:`OrdersSqlEnv` without ``info["task_id"]``: its tasks are told apart by their opening messages only."""

    names_tasks: ClassVar[bool] = False
