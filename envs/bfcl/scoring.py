"""BFCL's multi-turn verdict, turn by turn, with BFCL's own state and response checkers.

BFCL's ``multi_turn_checker`` replays the model's calls and the ground truth on fresh instances and, after each turn
whose ground truth has calls, requires (in this order; the first failure decides):

1. the model made at least one decodable call in that turn (``multi_turn:empty_turn_model_response``);
2. every involved instance's public attributes equal the ground truth's (``state_checker``);
3. every result of the turn's gold calls is among the results of all the model's calls so far, as a multiset,
   in any order (``response_checker``).

A turn whose ground truth is empty (the model should not be able to act: a missing parameter or function) is not
checked, but its calls still change the state the next turns are checked on. The verdict is valid when every checked
turn passes; a conversation BFCL's inference would have cut (more than 20 calling steps in a turn before the last) is
invalid. envkit runs the model's calls once, live (the env's :class:`~.execution.Apis`), and the ground truth in step
on a second set of instances; the checks are BFCL's functions, called on those instances.
"""

from __future__ import annotations

from dataclasses import dataclass

from envkit.envs.bfcl.data import Task
from envkit.envs.bfcl.execution import Apis

MAX_STEPS_PER_TURN = 20
"""BFCL's ``MAXIMUM_STEP_LIMIT``: its inference quits a task once a turn has had more calling steps than this."""


@dataclass(frozen=True)
class TurnCheck:
    """What BFCL's checker found at the end of one turn."""

    turn: int
    checked: bool
    """Whether the turn's ground truth has calls (only those turns are checked)."""
    answered: bool = True
    """The model made at least one decodable call in the turn."""
    state: bool = True
    """The instances' public state equals the ground truth's (``state_checker``)."""
    response: bool = True
    """The gold calls' results are among the model's results so far (``response_checker``)."""

    @property
    def passed(self) -> bool:
        """Whether BFCL's checker lets this turn through."""
        return not self.checked or (self.answered and self.state and self.response)


class Checker:
    """The ground truth of one conversation, run turn by turn beside the model's, and the checks made so far.

    Args:
        task: The task.
    """

    def __init__(self, task: Task) -> None:
        self.task = task
        self.gold = Apis(task)
        self.checks: list[TurnCheck] = []

    def close_turn(self, live: Apis, results: list[str], answered: bool) -> TurnCheck:
        """Check the turn that just ended, as BFCL's checker does after it.

        Args:
            live: The instances the model's calls ran on.
            results: The result text of every call the model made so far, all turns (BFCL's
                ``all_turn_model_execution_results``).
            answered: Whether the model made a decodable call in this turn.

        Returns:
            The turn's check (also appended to :attr:`checks`).
        """
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import response_checker, state_checker

        turn = len(self.checks)
        gold_calls = self.task.ground_truth[turn]
        gold_results = [self.gold.run(*self.gold.gold_call(text))[0] for text in gold_calls]
        if not gold_calls:
            check = TurnCheck(turn, checked=False)
        else:
            state = bool(state_checker(live.instances, self.gold.instances)["valid"])
            response = bool(response_checker(results, gold_results, turn)["valid"])
            check = TurnCheck(turn, checked=True, answered=answered, state=state, response=response)
        self.checks.append(check)
        return check

    def components(self, force_quit: bool) -> dict[str, float]:
        """The checks as fractions of the task's checked turns (a turn not reached counts as failed): ``answered``,
        ``state``, ``response``, ``turns_passed`` (all three); ``turns_completed`` over all turns; ``force_quit``."""
        checked = sum(1 for calls in self.task.ground_truth if calls) or 1
        made = [c for c in self.checks if c.checked]
        return {
            "turns_completed": len(self.checks) / len(self.task.ground_truth),
            "answered": sum(c.answered for c in made) / checked,
            "state": sum(c.state for c in made) / checked,
            "response": sum(c.response for c in made) / checked,
            "turns_passed": sum(c.passed for c in made) / checked,
            "force_quit": float(force_quit),
        }
