"""TextWorldExpress games as envkit envs: ``envkit.make("textworld-express:coin")``, ``"textworld-express:twc"``.

Needs ``pip install -e '.[textworld-express]'`` and a Java runtime (17 or newer; ``scripts/setup.sh`` installs
Debian's ``default-jre-headless`` when ``java`` is missing). `TextWorldExpress <https://github.com/cognitiveailab/
TextWorldExpress>`_ (Jansen & Côté, 2022; Apache-2.0) simulates eight procedurally generated text games in a JAR that
its PyPI package bundles: ``cookingworld``, ``twc`` (TextWorld Commonsense), ``coin``, ``mapreader``, ``arithmetic``,
``sorting``, ``simonsays``, ``peckingorder``. Each is one env, ``textworld-express:GAME``. See ``README.md`` beside
this module for provenance and licence.

* **Actions are the agent's messages**: each reply is one game command (``take coin``, ``open door to north``), and
  each env message is one user message with what the game answered. A reply with ``Action:`` lines (the ReAct format
  of ETO and AgentGym: ``Thought: … Action: …``) plays the text after the last one; otherwise the whole reply
  (stripped) is the command. Tool calls are ignored. ``help`` repeats the task description without a move, as
  TextWorldExpress's own wrapper does.
* **Task seeds → games of one official fold**: ``split="train"`` (default), ``"dev"`` or ``"test"`` picks
  TextWorldExpress's fold, and task seed ``s`` is the fold's seed list entry ``s % 1000`` (its train seeds are 0–999,
  dev 10000–10999, test 20000–20999; the fold also selects the game's object sets). ``game_params`` sets the game's
  generation parameters (TextWorldExpress's ``"numLocations=3,includeDoors=0"`` string, or a dict); unset, each game's
  defaults. ``info["task_id"]`` names the game, its parameters, the fold and the TextWorldExpress seed.
* **Score**: the game's normalized score, which runs 0 → 1.0 as the task's subgoals are done (1.0 = solved; a solved
  or failed game ends the episode). ``arithmetic``, ``sorting``, ``simonsays`` and ``peckingorder`` set it to -1 when
  the task fails: that scores 0, as the empty episode does; ``cookingworld`` keeps its partial score when it fails.
  Any other value outside [0, 1] fails the episode (nothing is clipped).
* **Oracle**: the game's gold action sequence, while the episode has followed it (off it, no oracle).
* ``max_turns`` (100, TextWorldExpress's default step limit) truncates the episode.

Each env runs its own JVM (started at construction, about 0.3 s; ended by ``close()`` or when the process exits);
``java_heap="256m"`` caps its heap. A missing Java runtime is a one-line error naming the fix.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from typing import Any, ClassVar

from envkit.core.env import Env
from envkit.core.messages import Message
from envkit.registry import EnvSpecError

from .._adapted import SpecBuilt, class_name, rebuild
from .java import JavaGame

PREFIX = "textworld-express"
GAMES = ("cookingworld", "twc", "coin", "mapreader", "arithmetic", "sorting", "simonsays", "peckingorder")
"""TextWorldExpress 1.1.0's games (``textworld_express.constants.GAME_NAMES``)."""
SPLITS = ("train", "dev", "test")

SYSTEM_PROMPT = (
    "You are playing a text-based game. Each of your replies is one command for the game, such as `look around`, "
    "`take coin`, `open door to north`, `move east` or `inventory`; the game answers with what happens. You may think "
    "first, then end your reply with a line `Action: <command>`. Reply `help` to see the task again."
)

_ACTION_LINE = re.compile(r"^\s*action\s*:\s*(.*?)\s*$", re.IGNORECASE | re.MULTILINE)


def command_of(action: Message | str) -> str:
    """The game command in an assistant reply: the text after its last ``Action:`` line, else the whole content,
    stripped (``""`` for a reply with no text content).

    Args:
        action: The assistant message (or its text).
    """
    content = action.get("content") if isinstance(action, dict) else action
    if not isinstance(content, str):
        return ""
    lines = _ACTION_LINE.findall(content)
    return lines[-1] if lines else content.strip()


def env_class(rest: str) -> type[TextWorldExpressEnv]:
    """The env class of ``textworld-express:GAME``.

    Args:
        rest: The game's name, one of :data:`GAMES`.
    """
    game = rest.strip()
    if game not in GAMES:
        close = difflib.get_close_matches(game, GAMES, n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise EnvSpecError(f"TextWorldExpress has no game {game!r}; {hint}its games: {', '.join(GAMES)}")
    return type(
        class_name("TextWorldExpress", game),
        (TextWorldExpressEnv,),
        {
            "game": game,
            "envkit_spec": f"{PREFIX}:{game}",
            "__module__": __name__,
            "__doc__": f"The TextWorldExpress game {game!r}; see {__name__}.",
        },
    )


def params_string(game_params: str | dict[str, Any] | None, spec: str) -> str:
    """TextWorldExpress's ``gameParams`` string (``"numLocations=3,includeDoors=0"``) from a string or a dict.

    Args:
        game_params: ``None`` (the game's defaults), the string itself, or ``{name: value}`` (booleans as 0/1).
        spec: The env spec, for error messages.
    """
    if game_params is None:
        return ""
    if isinstance(game_params, str):
        return game_params.replace(" ", "")
    if isinstance(game_params, dict):
        return ",".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in game_params.items())
    raise EnvSpecError(f"{spec}: game_params must be a 'name=value,...' string or a dict, got {game_params!r}")


class TextWorldExpressEnv(SpecBuilt, Env):
    """One TextWorldExpress game as an env; subclassed per game by :func:`env_class` (see the module docstring).

    Args:
        split: The official fold the task seeds draw from: ``"train"``, ``"dev"`` or ``"test"``.
        game_params: The game's generation parameters (see :func:`params_string`); ``None`` for its defaults.
        max_turns: Assistant turns before the episode is truncated (100 by default).
        system_prompt: Replaces :data:`SYSTEM_PROMPT`; ``""`` sends no system message.
        java_heap: The JVM's maximum heap (``"256m"``); ``None`` for Java's default.
    """

    max_turns: ClassVar[int] = 100
    game: ClassVar[str] = ""

    def __init__(
        self,
        split: str = "train",
        game_params: str | dict[str, Any] | None = None,
        max_turns: int | None = None,
        system_prompt: str | None = None,
        java_heap: str | None = None,
    ) -> None:
        super().__init__()
        self._remember(
            {
                "split": split,
                "game_params": game_params,
                "max_turns": max_turns,
                "system_prompt": system_prompt,
                "java_heap": java_heap,
            }
        )
        if split not in SPLITS:
            raise EnvSpecError(f"{self.envkit_spec}: split must be one of {', '.join(SPLITS)}, got {split!r}")
        self.split = split
        self.params = params_string(game_params, self.envkit_spec)
        if max_turns is not None:
            self.max_turns = int(max_turns)  # type: ignore[misc]
        self.system_prompt = SYSTEM_PROMPT if system_prompt is None else system_prompt
        from textworld_express.constants import JAR_PATH

        self.java = JavaGame(JAR_PATH, self.envkit_spec, heap=java_heap)
        self.server = self.java.jvm.textworldexpress.runtime.PythonInterface()
        refused = self.server.load(self.game, self.params)
        if refused:
            self.close()
            raise EnvSpecError(f"{self.envkit_spec}: game_params={self.params!r} refused: {' '.join(refused.split())}")
        fold = {"train": self.server.getSeedsTrain, "dev": self.server.getSeedsDev, "test": self.server.getSeedsTest}
        self.fold_seeds = [int(s) for s in fold[split]()]
        self.variation = -1
        self.task_description = ""
        self.gold: list[str] = []
        self.raw_score = 0.0
        self.failed = False

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """The fold's game ``seed % len(fold)`` (a random one when ``seed`` is None): the task and the first room."""
        super().reset(seed=seed, options=options)
        if seed is None:
            seed = int(self.np_random.integers(len(self.fold_seeds)))
        self._started(seed, options)
        self.variation = self.fold_seeds[int(seed) % len(self.fold_seeds)]
        state = json.loads(self.server.generateNewGameJSON(self.variation, self.split, True))
        self.task_description = str(self.server.getTaskDescription())
        self.gold = [str(a) for a in self.server.getGoldActionSequence()]
        self.raw_score, self.failed = float(state["score"]), bool(state["taskfailure"])
        task = f"{PREFIX}:{self.game}:{self.params}:{self.split}:{self.variation}"
        opening: list[Message] = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        opening.append({"role": "user", "content": f"{self.task_description}\n\n{state['observation'].strip()}"})
        info = {
            "game": self.game,
            "split": self.split,
            "variation": self.variation,
            "task_id": hashlib.sha256(task.encode()).hexdigest()[:16],
        }
        return opening, info

    def step(self, action: Message | str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Play the reply's command (see :func:`command_of`); the game's answer comes back as a user message."""
        before = self.score()
        command = command_of(action)
        if command == "help":  # the package's wrapper answers it from the task description, without a move
            return [{"role": "user", "content": self.task_description}], 0.0, False, False, {"command": command}
        state = json.loads(self.server.stepJSON(command))
        self.raw_score, self.failed = float(state["score"]), bool(state["taskfailure"])
        done = bool(state["tasksuccess"] or state["taskfailure"] or self.raw_score >= 1.0)
        text = str(state["observation"]).strip() or "(no answer)"
        info = {"command": command, "game_score": self.raw_score, "success": bool(state["tasksuccess"])}
        return [{"role": "user", "content": text}], self.score() - before, done, False, info

    def score(self) -> float:
        """The game's normalized score in [0, 1]; its -1 for a failed task scores 0 (see the module docstring).

        Raises:
            ValueError: The game reported a score outside [0, 1] other than its failure value.
        """
        value = self.raw_score
        if value == -1.0 and self.failed:
            return 0.0
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{self.envkit_spec}: TextWorldExpress reported the score {value!r}, outside [0, 1]")
        return value

    def score_components(self) -> dict[str, float]:
        """``failed``: 1.0 when the game ended the task as failed."""
        return {"failed": float(self.failed)}

    def oracle(self) -> Message | None:
        """The next command of the game's gold path, while the episode has followed it; else ``None``."""
        played = [command_of(m) for m in self.messages if m.get("role") == "assistant"]
        if self.done or len(played) >= len(self.gold) or played != self.gold[: len(played)]:
            return None
        return {"role": "assistant", "content": self.gold[len(played)]}

    def close(self) -> None:
        """End the env's JVM."""
        java = getattr(self, "java", None)
        if java is not None:
            java.close()

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        """A copy with a JVM of its own, rebuilt from the spec and the episode so far (the game is deterministic given
        its seed and commands)."""
        actions = [m for m in self.messages if m.get("role") == "assistant"]
        return rebuild(self.envkit_spec, self._config, self._task_seed, self._options, actions)
