"""Planted bugs about the answer (issue 38 classes 1, 2, 3) and task identity (class 7): each a subclass of a clean
env of :mod:`validate_corpus.clean` that changes one thing, as an env author really would."""

from __future__ import annotations

import json
from typing import Any

import envkit
from validate_corpus.clean import DentistBooking, OrdersSql, Refunds, WordProblems
from validate_corpus.planted import PlantedBug

VISIBLE = "answer hidden until the work is done"
TOOL_ANSWER = "score depends on a tool-call answer"
ACCEPTS_MORE = "answers padded with distractors"
RESET = "reset: messages, seeding, variety"
"""The titles of the checks the bugs below must fail."""


# ---- class 1: the answer is visible to the agent --------------------------------------------------------------------
class WordProblemsAnswerInSystemPrompt(WordProblems):
    """The system prompt keeps a debugging note with the expected answer."""

    def reset(self, *, seed=None, options=None):
        opening, info = super().reset(seed=seed, options=options)
        opening[0] = {**opening[0], "content": f"{opening[0]['content']} (expected answer: {self.answer})"}
        return opening, info


class WordProblemsRowDumped(WordProblems):
    """The user message is the dataset row dumped as JSON, answer field included."""

    def reset(self, *, seed=None, options=None):
        opening, info = super().reset(seed=seed, options=options)
        opening[1] = {**opening[1], "content": json.dumps({"question": self.question, "answer": self.answer})}
        return opening, info


class RefundsSchemaDefaults(Refunds):
    """The tool schemas are filled in per task as a convenience: issue_refund's arguments default to the damaged order
    and its price."""

    @property
    def tools(self) -> list[dict[str, Any]]:
        tools = json.loads(json.dumps(super().tools))
        damaged = getattr(self, "damaged", None)
        for tool in tools:
            if tool["function"]["name"] == "issue_refund" and damaged is not None:
                properties = tool["function"]["parameters"]["properties"]
                properties["order_id"]["default"] = damaged
                properties["amount"]["default"] = self.orders[damaged]["price"]
        return tools


class SqlWrongSubmissionShowsExpected(OrdersSql):
    """A wrong submission is answered with the expected answer ("try again"), and only the last submission counts."""

    @envkit.tool
    def submit_answer(self, answer: str) -> str:
        """Submit the answer; a wrong one may be corrected.

        Args:
            answer: The answer: one value, or the values of a list separated by commas.
        """
        self.submitted = [part.strip() for part in answer.split(",") if part.strip()]
        if self.matches(self.submitted):
            self.end_episode()
            return "Correct!"
        raise envkit.ToolError(f"incorrect: expected {', '.join(self.gold)}; try again")


class DentistSlotInSystemPrompt(DentistBooking):
    """The system prompt is written from the task record and names the slot to book."""

    def reset(self, *, seed=None, options=None):
        opening, info = super().reset(seed=seed, options=options)
        note = f" Internal note: book {self.patient} into {self.right}."
        opening[0] = {**opening[0], "content": opening[0]["content"] + note}
        return opening, info


class SqlExampleInToolSchema(OrdersSql):
    """run_sql's description is written per task, with the question's own query and its result as the example."""

    @property
    def tools(self) -> list[dict[str, Any]]:
        tools = json.loads(json.dumps(super().tools))
        if getattr(self, "gold", None) is not None:
            for tool in tools:
                if tool["function"]["name"] == "run_sql":
                    example = f" Example: {self.gold_sql} returns {', '.join(self.gold)}."
                    tool["function"]["description"] += example
        return tools


# ---- class 2: the score ignores a tool-call answer ------------------------------------------------------------------
class RefundsAnyOneRefund(Refunds):
    """issue_refund records whatever it is given, and the score checks that one refund was made."""

    @envkit.tool
    def issue_refund(self, order_id: str, amount: float) -> str:
        """Refund an order.

        Args:
            order_id: The order id, such as ORD-1234.
            amount: The amount to refund.
        """
        self.refunds.append((order_id, float(amount)))
        return f"Refunded {amount:.2f} on {order_id}."

    def score(self) -> float:
        return float(len(self.refunds) == 1)


class SqlGoldComparedWithItself(OrdersSql):
    """A typo: the score compares the gold result with itself once an answer was submitted."""

    def score(self) -> float:
        return float(self.submitted is not None and self.matches(self.gold))


class SqlScoresTheLastQuery(OrdersSql):
    """The score compares the last query's result with the gold result, not the submitted answer."""

    def reset(self, *, seed=None, options=None):
        self.last_result: list[str] = []
        return super().reset(seed=seed, options=options)

    @envkit.tool
    def run_sql(self, query: str) -> str:
        """Run one SELECT query on the orders table and return its rows, one per line.

        Args:
            query: One SQLite SELECT statement, e.g. "SELECT COUNT(*) FROM orders".
        """
        result = super().run_sql(query)
        self.last_result = [line.split(", ")[0] for line in result.splitlines()]
        return result

    def score(self) -> float:
        return float(self.submitted is not None and self.matches(self.last_result))


class DentistAnyBooking(DentistBooking):
    """book_slot books any slot id it is given, and the score checks that one booking was made."""

    @envkit.tool
    def book_slot(self, slot_id: str) -> str:
        """Book a slot for the patient.

        Args:
            slot_id: The slot id, e.g. "TUE-1430".
        """
        self.bookings.append(slot_id)
        return f"Booked {slot_id} for {self.patient}."

    def score(self) -> float:
        return float(len(self.bookings) == 1)


class SqlSubstringMatch(OrdersSql):
    """The submission is matched as a substring of the gold result (to be lenient with formatting): an empty answer
    is in every result."""

    def matches(self, submitted: list[str]) -> bool:
        return ", ".join(submitted) in ", ".join(self.gold)


class DentistSlotContained(DentistBooking):
    """book_slot checks ``slot_id in slot`` (meant ``==``) and the score ``booking in self.right``: a string test, so an
    empty slot id books and scores."""

    @envkit.tool
    def book_slot(self, slot_id: str) -> str:
        """Book a slot for the patient.

        Args:
            slot_id: The slot id, e.g. "TUE-1430".
        """
        if not any(slot_id in slot for slots in self.slots.values() for slot in slots):
            raise envkit.ToolError(f"no free slot {slot_id!r}")
        self.bookings.append(slot_id)
        return f"Booked {slot_id} for {self.patient}."

    def score(self) -> float:
        return float(len(self.bookings) == 1 and self.bookings[0] in self.right)


# ---- class 3: the score accepts more than the answer ----------------------------------------------------------------
class WordProblemsAnyNumberRight(WordProblems):
    """The score accepts a reply when the answer is among the numbers it states."""

    def score(self) -> float:
        return float(self.answer in self.stated_numbers(self.reply))


class WordProblemsFivePercentTolerance(WordProblems):
    """The score tolerates 5% (meant for rounding), so a neighbour of the answer wins too."""

    def score(self) -> float:
        numbers = self.stated_numbers(self.reply)
        return float(len(numbers) == 1 and abs(numbers[0] - self.answer) <= 0.05 * abs(self.answer))


class RefundsRightOneAmongOthers(Refunds):
    """The score accepts the refunds when the right one is among them (issue 38's hidden right-call-among-several)."""

    def score(self) -> float:
        return float((self.damaged, self.orders[self.damaged]["price"]) in self.refunds)


class RefundsAmountWithinADollar(Refunds):
    """The score compares the amount to within a dollar (meant for float noise)."""

    def score(self) -> float:
        price = self.orders[self.damaged]["price"]
        return float(
            len(self.refunds) == 1 and self.refunds[0][0] == self.damaged and abs(self.refunds[0][1] - price) < 1
        )


class RefundsAmountRounded(Refunds):
    """The score compares amounts rounded to whole units (to avoid float comparisons), so a refund cents off wins."""

    def score(self) -> float:
        price = self.orders[self.damaged]["price"]
        return float([(oid, round(amount)) for oid, amount in self.refunds] == [(self.damaged, round(price))])


class SqlComparedAsSets(OrdersSql):
    """The submitted values are compared with the gold values as sets, so duplicates pass."""

    def matches(self, submitted: list[str]) -> bool:
        return {_key(v) for v in submitted} == {_key(v) for v in self.gold}


class SqlEveryGoldValueSubmitted(OrdersSql):
    """The score checks that every gold value was submitted, so a superset passes."""

    def matches(self, submitted: list[str]) -> bool:
        keys = {_key(v) for v in submitted}
        return all(_key(v) in keys for v in self.gold)


class DentistRightSlotAmongBookings(DentistBooking):
    """The score accepts the bookings when the right slot is among them."""

    def score(self) -> float:
        return float(self.right in self.bookings)


class SqlNumbersWithinOne(OrdersSql):
    """Numbers are compared to within 1 (meant for float sums), so a neighbouring count or sum wins too."""

    def matches(self, submitted: list[str]) -> bool:
        if len(submitted) == len(self.gold) == 1:
            try:
                return abs(float(submitted[0]) - float(self.gold[0])) <= 1
            except ValueError:
                pass
        return super().matches(submitted)


class SqlFirstValueCompared(OrdersSql):
    """Only the first submitted value is compared with the first gold value (the author had single-value questions
    in mind), so extra values after it pass."""

    def matches(self, submitted: list[str]) -> bool:
        if len(self.gold) == 1:
            return bool(submitted) and _key(submitted[0]) == _key(self.gold[0])
        return super().matches(submitted)


def _key(value: str) -> str:
    try:
        return repr(float(value))
    except ValueError:
        return value.strip().lower()


# ---- class 7: what identifies a task --------------------------------------------------------------------------------
class SqlTaskIdCountsResets(OrdersSql):
    """The task id numbers the resets of the instance ("task-3"), not the task."""

    def reset(self, *, seed=None, options=None):
        self.resets = getattr(self, "resets", 0) + 1
        opening, info = super().reset(seed=seed, options=options)
        return opening, {**info, "task_id": f"task-{self.resets}"}


class SqlTaskIdAsTuple(OrdersSql):
    """The task id is the (question, rows) pair itself, not a str naming it."""

    def reset(self, *, seed=None, options=None):
        opening, info = super().reset(seed=seed, options=options)
        return opening, {**info, "task_id": (self.question, len(self.rows))}


def _bug(id: str, bug_class: int, shape: str, factory: type[envkit.Env], expected: str) -> PlantedBug:
    description = " ".join((factory.__doc__ or "").split("\n\n")[0].split())
    return PlantedBug(id, bug_class, shape, description, factory, expected)


BUGS: list[PlantedBug] = [
    _bug("text-answer-in-system-prompt", 1, "text", WordProblemsAnswerInSystemPrompt, VISIBLE),
    _bug("text-row-dumped-with-answer", 1, "text", WordProblemsRowDumped, VISIBLE),
    _bug("refund-schema-defaults", 1, "tool-call", RefundsSchemaDefaults, VISIBLE),
    _bug("sql-wrong-submission-shows-expected", 1, "db", SqlWrongSubmissionShowsExpected, VISIBLE),
    _bug("dentist-slot-in-system-prompt", 1, "multi-turn", DentistSlotInSystemPrompt, VISIBLE),
    _bug("sql-example-in-tool-schema", 1, "db", SqlExampleInToolSchema, VISIBLE),
    _bug("refund-any-one-refund", 2, "tool-call", RefundsAnyOneRefund, TOOL_ANSWER),
    _bug("sql-gold-compared-with-itself", 2, "db", SqlGoldComparedWithItself, TOOL_ANSWER),
    _bug("sql-scores-the-last-query", 2, "db", SqlScoresTheLastQuery, TOOL_ANSWER),
    _bug("dentist-any-booking", 2, "multi-turn", DentistAnyBooking, TOOL_ANSWER),
    _bug("sql-substring-match", 2, "db", SqlSubstringMatch, TOOL_ANSWER),
    _bug("dentist-slot-contained", 2, "multi-turn", DentistSlotContained, TOOL_ANSWER),
    _bug("text-any-number-right", 3, "text", WordProblemsAnyNumberRight, ACCEPTS_MORE),
    _bug("text-five-percent-tolerance", 3, "text", WordProblemsFivePercentTolerance, ACCEPTS_MORE),
    _bug("refund-right-one-among-others", 3, "tool-call", RefundsRightOneAmongOthers, ACCEPTS_MORE),
    _bug("refund-amount-within-a-dollar", 3, "tool-call", RefundsAmountWithinADollar, ACCEPTS_MORE),
    _bug("refund-amount-rounded", 3, "tool-call", RefundsAmountRounded, ACCEPTS_MORE),
    _bug("sql-compared-as-sets", 3, "db", SqlComparedAsSets, ACCEPTS_MORE),
    _bug("sql-every-gold-value-submitted", 3, "db", SqlEveryGoldValueSubmitted, ACCEPTS_MORE),
    _bug("sql-first-value-compared", 3, "db", SqlFirstValueCompared, ACCEPTS_MORE),
    _bug("sql-numbers-within-one", 3, "db", SqlNumbersWithinOne, ACCEPTS_MORE),
    _bug("dentist-right-slot-among-bookings", 3, "multi-turn", DentistRightSlotAmongBookings, ACCEPTS_MORE),
    _bug("sql-task-id-counts-resets", 7, "db", SqlTaskIdCountsResets, RESET),
    _bug("sql-task-id-as-tuple", 7, "db", SqlTaskIdAsTuple, RESET),
]
"""The planted bugs of classes 1, 2, 3 and 7."""
