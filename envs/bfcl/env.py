"""BFCL v4's multi-turn categories as an envkit env (``bfcl-multi-turn``): the task's stateful APIs as tools with
BFCL's own schemas, the user's later turns fed as the conversation goes, and BFCL's multi-turn verdict as the score.
See envs/bfcl/README.md."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from envkit.core.env import Ending, step_ending
from envkit.core.messages import Message
from envkit.core.tools import ArgumentValidation, ToolEnv
from envkit.envs.bfcl import data
from envkit.envs.bfcl.data import SPLITS, Task
from envkit.envs.bfcl.execution import Apis, NotPlain, plain_arguments
from envkit.envs.bfcl.scoring import MAX_STEPS_PER_TURN, Checker

MOST_TURNS = 8
"""The most user turns of any BFCL multi-turn task (a ``miss_param`` task's extra turn included)."""

UNDECODABLE = (
    "Error: not run: another call of this reply could not be decoded, and BFCL runs a reply's calls only when all "
    "of them decode"
)


class BfclMultiTurnEnv(ToolEnv):
    """BFCL v4's multi-turn tasks (short name ``bfcl-multi-turn``). A seed picks a task of the split:
    ``seed % len(tasks)``; ``reset(options={"task_id": "multi_turn_base_12"})`` plays one task by BFCL's id.

    The task's ``involved_classes`` (``GorillaFileSystem``, ``TwitterAPI``, …) are BFCL's own classes, built and
    loaded from the task's ``initial_config``; their methods are the tools, described by BFCL's own function docs as
    its function-calling handlers send them (:attr:`tools`). The conversation opens with the user's first turn; a
    reply without tool calls ends the turn, and the user's next turn follows (:meth:`on_text`) until the last turn's
    reply ends the episode. The score is BFCL's verdict (1.0 valid, 0.0 not), checked after every turn as BFCL's
    ``multi_turn_checker`` checks (:mod:`.scoring`); :meth:`score_components` says which checks passed.

    Args:
        split: ``"train"`` (``base``, the default), ``"test"`` (``miss_func``, ``miss_param`` and ``long_context``,
            held out), ``"all"``, or one category's name. The held-out categories are BFCL's variations of the
            same 200 scenarios as ``base`` (a parameter or a function missing, long API states), as in BFCL.

    A ``miss_func`` task adds functions at one turn. Changing the tool list of the system prompt mid-episode would
    change tokens the model has already seen, so envkit keeps the opening tool list and announces the new functions
    as BFCL does for prompting-mode models: their docs in the user message of that turn
    (``"{functions}\\nI have updated some more functions you can choose from. What about now?"``). Every method of
    an involved class can be called at any time, as in BFCL, whose executor maps them all.
    """

    max_turns: ClassVar[int] = (MAX_STEPS_PER_TURN + 2) * MOST_TURNS
    """Room for BFCL's own limit: at most 21 calling steps and a closing reply in each of up to 8 turns."""
    requires_proper_ending: ClassVar[bool] = True
    argument_validation: ClassVar[ArgumentValidation] = "none"
    """BFCL passes the model's JSON values to its methods unchecked; so does envkit (a wrong type fails inside the
    method, with BFCL's ``Error during execution: …`` text)."""
    max_tool_output_chars: ClassVar[int] = 200_000
    """Above any BFCL result (the longest gold result, in ``long_context``, is 31,706 characters): nothing is cut."""
    max_tool_calls_per_turn: ClassVar[int] = 64
    """BFCL runs any number of calls per reply; envkit runs 64 (the most any gold turn makes is 34)."""

    def __init__(self, split: str = "train") -> None:
        super().__init__()
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
        self.split = split
        self.tasks: list[Task] = data.split_tasks(split)
        self.task: Task | None = None
        self.apis: Apis | None = None
        self.checker: Checker | None = None
        self.turn = 0
        """The user turn the conversation is in (0-based)."""
        self.steps_in_turn = 0
        """Replies with decodable calls in the current turn (BFCL's step count)."""
        self.answered = False
        self.results: list[str] = []
        """The result text of every call the model made in this episode, in order."""
        self.finished = False
        """Every turn was closed (the last one by a reply without calls, or by BFCL's step limit)."""
        self.force_quit = False

    @property
    def tools(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """The current task's tools from the start (BFCL's function docs, Python hint added, converted as its
        OpenAI-style handlers convert them); before the first reset, those of the split's first task (``seed=0``).
        They differ from task to task, so read them after each reset. The list stays the same for the whole
        episode, a ``miss_func`` task's later functions included (they come in a user message)."""
        return copy.deepcopy((self.task or self.tasks[0]).tools)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start the task of ``seed`` (or ``options["task_id"]``): the user's first turn."""
        super().reset(seed=seed, options=options)
        options = options or {}
        if options.get("task_id") is not None:
            self.task = data.find_task(str(options["task_id"]))
        else:
            index = seed if seed is not None else int(self.np_random.integers(len(self.tasks)))
            self.task = self.tasks[index % len(self.tasks)]
        self.apis, self.checker = Apis(self.task), Checker(self.task)
        self.turn, self.steps_in_turn, self.answered = 0, 0, False
        self.results, self.finished, self.force_quit = [], False, False
        info = {
            "task_id": self.task.id,
            "category": self.task.category,
            "split": self.split,
            "turns": len(self.task.turns),
            "involved_classes": list(self.task.involved_classes),
        }
        return self._turn_messages(0), info

    def step(self, action: Message | str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """One reply. Its tool calls run in order when every one of them decodes (a known name or not, arguments a
        JSON object); when one does not, none runs and the turn ends, as in BFCL's inference. A reply without calls
        ends the turn (:meth:`on_text`). More than BFCL's 20 calling steps in one turn end the episode there: scored
        as BFCL scores it when it was the last turn, else 0 (:attr:`~envkit.core.env.Ending.MAX_STEPS`)."""
        message: Message = action if isinstance(action, dict) else {"role": "assistant", "content": action}
        calls = message.get("tool_calls") or []
        if not isinstance(calls, list):
            calls = [calls]
        malformed = message.get("malformed_tool_calls") or []
        info: dict[str, Any] = {"tool_calls": 0, "tool_errors": 0, "malformed_tool_calls": len(malformed)}
        observation: list[Message] = []
        terminated = False
        if not calls and not malformed:
            reply = self.on_text(message)
            observation, terminated = list(reply or []), reply is None
        else:
            decoded = [_decode(call) for call in calls]
            if malformed or any(error is not None for _, _, error in decoded):
                for bad in malformed:
                    observation.append(
                        self._tool_message("invalid_tool_call", f"Error: could not parse tool call: {bad}")
                    )
                for name, _, error in decoded:
                    observation.append(self._tool_message(name, error or UNDECODABLE))
                info["tool_calls"] = info["tool_errors"] = len(malformed) + len(decoded)
                reply = self._next_turn()
                observation += list(reply or [])
                terminated = reply is None
            else:
                observation, failed = self._run(decoded)
                info["tool_calls"], info["tool_errors"] = len(decoded), failed
                if self.steps_in_turn > MAX_STEPS_PER_TURN:  # BFCL's inference quits the task here
                    self.force_quit = True
                    if self.turn == len(self._task().turns) - 1:
                        self._next_turn()
                        terminated = True
                    else:
                        self.end_episode(Ending.MAX_STEPS)
        self.episode_tool_errors += info["tool_errors"]
        truncated = False
        if self._end_requested is not None and not self._end_requested.proper:
            terminated, truncated = False, True
            info["ending"] = self._end_requested.value
        if terminated or truncated:
            self.ending = step_ending(terminated, truncated, info)
        info["turn"] = self.turn
        score = self.score()
        reward, self._last_score = score - self._last_score, score
        return observation, reward, terminated, truncated, info

    def on_text(self, message: Message) -> list[Message] | None:
        """A reply without calls ends the user's turn: the next turn's messages, or ``None`` after the last."""
        return self._next_turn()

    def score(self) -> float:
        """BFCL's verdict: 1.0 when every turn was closed and every checked turn passed (:mod:`.scoring`), else 0.0;
        0.0 also while the conversation goes on and when the engine cut it (:attr:`ending`)."""
        if not self.finished or (self.ending is not None and not self.ending.proper):
            return 0.0
        return 1.0 if all(check.passed for check in self._checker().checks) else 0.0

    def score_components(self) -> dict[str, float]:
        """Which of BFCL's checks passed, as fractions of the task's checked turns (those whose ground truth has
        calls; a turn not reached counts as failed): ``answered`` (a decodable call made), ``state`` (the APIs'
        state equals the ground truth's), ``response`` (the gold results are among the model's), ``turns_passed``
        (all three); ``turns_completed`` over all turns; ``force_quit`` (BFCL's 20-step limit was reached)."""
        return self._checker().components(self.force_quit)

    def oracle(self) -> Message | None:
        """The ground truth: each turn's gold calls in one reply, then a reply without calls that ends the turn
        (at once in a turn whose ground truth is empty, where the model should say it cannot act)."""
        task = self._task()
        if self.finished:
            return None
        gold = task.ground_truth[self.turn]
        if gold and self.steps_in_turn == 0:
            apis = self._apis()
            calls = []
            for text in gold:
                name, arguments = apis.gold_call(text)
                calls.append({"type": "function", "function": {"name": name, "arguments": arguments}})
            return {"role": "assistant", "content": "", "tool_calls": calls}
        if gold:
            return {"role": "assistant", "content": "Done."}
        return {"role": "assistant", "content": "I cannot do that with the functions and information I have."}

    def canaries(self) -> dict[str, list[Message | str]]:
        """Reward hacks that must score no more than doing nothing: calling every tool in every turn (without
        arguments, which runs those that need none and reads their results), then ending the turn."""
        task = self._task()
        names = [tool["function"]["name"] for tool in task.tools]
        spray: Message = {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": n, "arguments": {}}} for n in names],
        }
        actions: list[Message | str] = []
        for _ in task.turns:
            actions += [copy.deepcopy(spray), "Done."]
        return {"every tool without arguments in every turn": actions}

    def eval_notes(self, episodes: Sequence[Mapping[str, Any]]) -> list[str]:
        """What an eval of this env measured, for ``envkit eval``'s summary: the split, its categories and how many
        of its tasks ran."""
        ids = sorted({str((e.get("info") or {}).get("task_id")) for e in episodes})
        categories = ", ".join(SPLITS[self.split])
        return [
            f"split {self.split} ({categories}): {len(ids)} of its {len(self.tasks)} tasks ran; the score is BFCL's "
            "multi-turn verdict (bfcl-eval " + data.BFCL_VERSION + "), scored per task as BFCL scores it",
        ]

    # ---- internals -------------------------------------------------------------------------------------------------
    def _run(self, decoded: list[tuple[str, dict[str, Any], str | None]]) -> tuple[list[Message], int]:
        self.steps_in_turn += 1
        self.answered = True
        apis, observation, failed = self._apis(), [], 0
        for index, (name, arguments, _) in enumerate(decoded):
            if index >= self.max_tool_calls_per_turn:
                text = (
                    f"Error: too many tool calls in one reply ({len(decoded)}); at most "
                    f"{self.max_tool_calls_per_turn} are run — this call was skipped"
                )
                failed += 1
            else:
                text, error = apis.run(name, arguments)
                self.results.append(text)
                failed += int(error)
            observation.append(self._tool_message(name, text))
        return observation, failed

    def _next_turn(self) -> list[Message] | None:
        self._checker().close_turn(self._apis(), self.results, self.answered)
        self.turn += 1
        self.steps_in_turn, self.answered = 0, False
        if self.turn >= len(self._task().turns):
            self.finished = True
            return None
        return self._turn_messages(self.turn)

    def _turn_messages(self, turn: int) -> list[Message]:
        task = self._task()
        if turn in task.missed_functions:
            text = data.ADDITIONAL_FUNCTION_PROMPT_WITH_DOCS.format(functions=task.missed_functions[turn])
            return [{"role": "user", "content": text}]
        return [dict(message) for message in task.turns[turn]]

    def _task(self) -> Task:
        if self.task is None:
            raise RuntimeError("call reset() first")
        return self.task

    def _apis(self) -> Apis:
        if self.apis is None:
            raise RuntimeError("call reset() first")
        return self.apis

    def _checker(self) -> Checker:
        if self.checker is None:
            raise RuntimeError("call reset() first")
        return self.checker


def _decode(call: Any) -> tuple[str, dict[str, Any], str | None]:
    """A tool call as ``(name, arguments, error)``: any string name (an unknown one runs into BFCL's NameError
    text), arguments as plain JSON values; ``error`` the ``Error: …`` text when BFCL could not decode it."""
    function = call.get("function", call) if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        return "invalid_tool_call", {}, f"Error: a tool call must be an object with a function name, got {call!r:.200}"
    name = function["name"]
    try:
        return name, plain_arguments(function.get("arguments")), None
    except NotPlain as error:
        return name[:100], {}, f"Error: arguments for {name[:100]} {error}"
