"""ScienceWorld tasks as envkit envs: ``envkit.make("scienceworld:boil")``, ``"scienceworld:find-animal"``.

Needs ``pip install -e '.[scienceworld]'`` and a Java runtime (17 or newer; ``scripts/setup.sh`` installs Debian's
``default-jre-headless`` when ``java`` is missing). `ScienceWorld <https://github.com/allenai/ScienceWorld>`_ (Wang et
al., EMNLP 2022; Apache-2.0) simulates 30 elementary-science tasks (boiling, growing plants, circuits, genetics, …),
each with many variations, in a JAR that its PyPI package bundles. Each task is one env, ``scienceworld:TASK``, named
as ``ScienceWorldEnv.get_task_names()`` names it (``boil``, ``find-animal``, ``mendelian-genetics-known-plant``) or by
its id (``scienceworld:1-1``). See ``README.md`` beside this module for provenance and licence.

* **Actions are the agent's messages**: each reply is one command (``open door to kitchen``, ``focus on ice``), and
  each env message is one user message with what the simulator answered. A reply with ``Action:`` lines (the ReAct
  format of ETO and AgentGym) plays the text after the last one; otherwise the whole reply, stripped. Tool calls are
  ignored.
* **Task seeds → variations of one official split**: ``split="train"`` (default), ``"dev"`` or ``"test"`` picks
  ScienceWorld's own variation split, and task seed ``s`` is the split's variation ``s % len(split)`` (over the 30
  tasks: 3,592 train, 1,796 dev, 1,819 test variations; the papers' "seen" is dev, "unseen" test).
  ``simplifications`` takes ScienceWorld's string (``"easy"``, or ``"teleportAction,openDoors"``); unset, none: the
  full game. ``info["task_id"]`` names the task, the variation and the simplifications.
* **Score**: ScienceWorld's in-game score, 0 to 100, divided by 100 (100 = solved: the episode ends). A task the agent
  failed (ScienceWorld's -100, e.g. after focusing on the wrong object) ends the episode and scores 0, as the empty
  episode does. Any other value outside [0, 100] fails the episode (nothing is clipped).
* **Oracle**: ScienceWorld's gold action sequence, while the episode has followed it. It is generated only when
  ``oracle()`` is first called in an episode (a load of its own, 1–6 s in most tasks), and the episode's game is then
  rebuilt from a plain load with the commands so far replayed (a gold-path load can play differently).
* Some tasks list a room's objects in an order that varies between loads of one variation: scores and endings repeat
  per seed and commands, observations not always byte for byte (see ``README.md``).
* ``max_turns`` (100, ScienceWorld's default step limit) truncates the episode.

Steps call the simulator directly (``step``, ``getScore``, ``getCompleted``: the calls of ScienceWorld's own
``ScienceWorldEnv.step``), without the lists that wrapper also builds every step (valid actions, look, inventory), which
take about 95% of its step time. Each env runs its own JVM (started at construction, about 4 s; ended by ``close()`` or
when the process exits). Unlike TextWorldExpress's, a closed env's JVM is not handed on to the next env: a JVM that
loaded other games lists some rooms' objects in another order, so a seed's opening would depend on what the JVM played
before. ``java_heap="512m"`` caps its heap (Java's default lets it grow to a quarter of the machine's
memory). A missing Java runtime is a one-line error naming the fix.
"""

from __future__ import annotations

import difflib
from typing import Any, ClassVar

from envkit.core.messages import Message
from envkit.registry import EnvSpecError

from .._adapted import class_name
from ..textworld_express.java import SPLITS, JavaGameEnv, command_of

__all__ = ["ELECTRICAL", "PREFIX", "SPLITS", "SYSTEM_PROMPT", "ScienceWorldEnv", "env_class", "task_names"]

PREFIX = "scienceworld"
ELECTRICAL = ("power-component", "conductivity")
"""Tasks whose names hold these words need the ``connect`` actions that ``noElectricalAction`` removes."""

SYSTEM_PROMPT = (
    "You are an agent in ScienceWorld, a text-based simulation of elementary science experiments. Each of your "
    "replies is one command for the simulator, such as `look around`, `open door to kitchen`, `go to kitchen`, "
    "`pick up thermometer`, `focus on ice` or `wait`; it answers with what happens. Focus only on the object the task "
    "names: focusing on a wrong one fails the task. You may think first, then end your reply with a line "
    "`Action: <command>`."
)


def task_names() -> list[str]:
    """ScienceWorld's 30 task names, from its package's ``tasks.json`` (no JVM needed)."""
    from scienceworld.constants import ID2TASK
    from scienceworld.utils import infer_task

    return [infer_task(name) for name in ID2TASK.values()]


def env_class(rest: str) -> type[ScienceWorldEnv]:
    """The env class of ``scienceworld:TASK``.

    Args:
        rest: A task name (``boil``) or id (``1-1``).
    """
    from scienceworld.utils import infer_task

    names = task_names()
    task = infer_task(rest.strip())
    if task not in names:
        close = difflib.get_close_matches(rest.strip(), names, n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise EnvSpecError(
            f"ScienceWorld has no task {rest.strip()!r}; {hint}its {len(names)} tasks: "
            "python -c 'import envkit.adapters.scienceworld as s; print(s.task_names())'"
        )
    return type(
        class_name("ScienceWorld", task),
        (ScienceWorldEnv,),
        {
            "task": task,
            "envkit_spec": f"{PREFIX}:{rest.strip()}",
            "__module__": __name__,
            "__doc__": f"The ScienceWorld task {task!r}; see {__name__}.",
        },
    )


class ScienceWorldEnv(JavaGameEnv):
    """One ScienceWorld task as an env; subclassed per task by :func:`env_class` (see the module docstring).

    Args:
        split: The official split the task seeds draw from: ``"train"``, ``"dev"`` or ``"test"``.
        simplifications: ScienceWorld's simplification string (``"easy"``, ``"openDoors,teleportAction"``); ``""``
            for the full game.
        max_turns: Assistant turns before the episode is truncated (100 by default).
        system_prompt: Replaces :data:`SYSTEM_PROMPT`; ``""`` sends no system message.
        java_heap: The JVM's maximum heap (``"512m"``); ``None`` for Java's default.
    """

    task: ClassVar[str] = ""
    default_system_prompt: ClassVar[str] = SYSTEM_PROMPT
    # A JVM that loaded other games lists some rooms' objects in another order (lifespan-longest-lived seed 1's wood
    # cups): a new JVM for every env keeps a seed's opening the same.
    hands_on_jvm: ClassVar[bool] = False

    def __init__(
        self,
        split: str = "train",
        simplifications: str = "",
        max_turns: int | None = None,
        system_prompt: str | None = None,
        java_heap: str | None = None,
    ) -> None:
        super().__init__(split, max_turns, system_prompt, java_heap, simplifications=simplifications)
        self.simplifications = str(simplifications).replace(" ", "")
        from scienceworld.constants import JAR_PATH

        self.server = self._start_jvm(JAR_PATH).scienceworld.runtime.pythonapi.PythonInterface()
        try:
            self._check_simplifications()
        except EnvSpecError:
            self.close()
            raise
        # The split is ScienceWorld's per task (not per variation load): read it once.
        self.server.load(self.task, 0, "", False)
        split_of = {
            "train": self.server.getVariationsTrain,
            "dev": self.server.getVariationsDev,
            "test": self.server.getVariationsTest,
        }
        self.variations = [int(v) for v in split_of[split]()]
        self.gold: list[str] | None = None
        self.raw_score = 0

    def _check_simplifications(self) -> None:
        known = ["easy", *str(self.server.getPossibleSimplifications()).split(", ")]
        for name in filter(None, self.simplifications.split(",")):
            if name not in known:
                raise EnvSpecError(
                    f"{self.envkit_spec}: unknown simplification {name!r}; ScienceWorld's: {', '.join(known)}"
                )
        electrical = any(word in self.task for word in ELECTRICAL)
        if electrical and ("noElectricalAction" in self.simplifications or "easy" in self.simplifications):
            raise EnvSpecError(
                f"{self.envkit_spec} needs the electrical actions that {self.simplifications!r} removes "
                "(noElectricalAction; 'easy' includes it): drop it"
            )

    def _load(self, gold: bool) -> str:
        """Load the variation (with its gold path when ``gold``) and play the opening ``look around``, as
        ScienceWorld's ``reset()`` does; its answer."""
        self.server.load(self.task, self.variation, self.simplifications, gold)
        self.server.reset()
        return str(self.server.step("look around"))

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """The split's variation ``seed % len(split)`` (a random one when ``seed`` is None): the task and the first
        room."""
        super().reset(seed=seed, options=options)
        self._choose(seed, options, self.variations)
        self.gold, self.raw_score = None, 0
        observation = self._load(gold=False)
        self.task_description = str(self.server.getTaskDescription())
        task = f"{PREFIX}:{self.task}:{self.simplifications}:{self.variation}"
        return self._opening(observation, {"task": self.task}, task)

    def _play(self, command: str) -> tuple[str, bool]:
        """One simulator step, scored and ended as ScienceWorld's ``ScienceWorldEnv.step`` does."""
        observation = str(self.server.step(command))
        self.raw_score = round(100 * float(self.server.getScore()))
        return observation, bool(self.server.getCompleted()) or self.raw_score < 0

    def step(self, action: Message | str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Play the reply's command; the simulator's answer comes back as a user message."""
        before = self.score()
        command = command_of(action)
        observation, done = self._play(command)
        answer: list[Message] = [{"role": "user", "content": observation.strip() or "(no answer)"}]
        return answer, self.score() - before, done, False, {"command": command, "game_score": self.raw_score}

    def score(self) -> float:
        """ScienceWorld's score / 100; its -100 for a failed task scores 0 (see the module docstring).

        Raises:
            ValueError: ScienceWorld reported a score outside [0, 100] other than its failure value.
        """
        if self.raw_score == -100:
            return 0.0
        if not 0 <= self.raw_score <= 100:
            raise ValueError(f"{self.envkit_spec}: ScienceWorld reported the score {self.raw_score}, outside [0, 100]")
        return self.raw_score / 100

    def score_components(self) -> dict[str, float]:
        """``failed``: 1.0 when ScienceWorld ended the task as failed (its score -100)."""
        return {"failed": float(self.raw_score == -100)}

    def _gold_path(self, played: list[str]) -> list[str]:
        """ScienceWorld's gold path, generated on first use in an episode (a load of its own), after which the
        episode's game is rebuilt from a plain load with the commands so far replayed."""
        if self.gold is None:
            self.server.load(self.task, self.variation, self.simplifications, True)
            self.gold = [str(a) for a in self.server.getGoldActionSequence()]
            # The gold path's load can play differently from a plain one (other first observations; in boil, gold
            # paths that score less): go on from a plain load, replaying the commands so far.
            self._load(gold=False)
            for command in played:
                self._play(command)
        return self.gold
