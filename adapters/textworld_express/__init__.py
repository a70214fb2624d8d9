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

Each env runs in a JVM of its own while it lives. When it closes, its JVM waits (``JVM_IDLE_SECONDS`` in
``envkit.adapters.textworld_express.java``, 5 minutes) for the next env of any TextWorldExpress game with the same
``java_heap``, which then builds its game in about 0.2 s instead of about 3 s; a waiting JVM ends when its wait runs
out or the process exits. ``java_heap="256m"`` caps its heap. A missing Java runtime is a one-line error naming the fix.
"""

from __future__ import annotations

import difflib
import json
from typing import Any, ClassVar

from envkit.core.messages import Message
from envkit.registry import EnvSpecError
from envkit.util.text import one_line

from .._adapted import class_name
from .java import SPLITS, JavaGameEnv, command_of

__all__ = [
    "GAMES",
    "PREFIX",
    "SPLITS",
    "SYSTEM_PROMPT",
    "TextWorldExpressEnv",
    "command_of",
    "env_class",
    "params_string",
]

PREFIX = "textworld-express"
GAMES = ("cookingworld", "twc", "coin", "mapreader", "arithmetic", "sorting", "simonsays", "peckingorder")
"""TextWorldExpress 1.1.0's games (``textworld_express.constants.GAME_NAMES``)."""

SYSTEM_PROMPT = (
    "You are playing a text-based game. Each of your replies is one command for the game, such as `look around`, "
    "`take coin`, `open door to north`, `move east` or `inventory`; the game answers with what happens. You may think "
    "first, then end your reply with a line `Action: <command>`. Reply `help` to see the task again."
)


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


class TextWorldExpressEnv(JavaGameEnv):
    """One TextWorldExpress game as an env; subclassed per game by :func:`env_class` (see the module docstring).

    Args:
        split: The official fold the task seeds draw from: ``"train"``, ``"dev"`` or ``"test"``.
        game_params: The game's generation parameters (see :func:`params_string`); ``None`` for its defaults.
        max_turns: Assistant turns before the episode is truncated (100 by default).
        system_prompt: Replaces :data:`SYSTEM_PROMPT`; ``""`` sends no system message.
        java_heap: The JVM's maximum heap (``"256m"``); ``None`` for Java's default.
    """

    game: ClassVar[str] = ""
    default_system_prompt: ClassVar[str] = SYSTEM_PROMPT

    def __init__(
        self,
        split: str = "train",
        game_params: str | dict[str, Any] | None = None,
        max_turns: int | None = None,
        system_prompt: str | None = None,
        java_heap: str | None = None,
    ) -> None:
        super().__init__(split, max_turns, system_prompt, java_heap, game_params=game_params)
        self.params = params_string(game_params, self.envkit_spec)
        from textworld_express.constants import JAR_PATH

        self.server = self._start_jvm(JAR_PATH).textworldexpress.runtime.PythonInterface()
        refused = self.server.load(self.game, self.params)
        if refused:
            self.close()
            raise EnvSpecError(f"{self.envkit_spec}: game_params={self.params!r} refused: {one_line(refused)}")
        fold = {"train": self.server.getSeedsTrain, "dev": self.server.getSeedsDev, "test": self.server.getSeedsTest}
        self.fold_seeds = [int(s) for s in fold[split]()]
        self.gold: list[str] = []
        self.raw_score = 0.0
        self.failed = False

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """The fold's game ``seed % len(fold)`` (a random one when ``seed`` is None): the task and the first room."""
        super().reset(seed=seed, options=options)
        self._choose(seed, options, self.fold_seeds)
        state = json.loads(self.server.generateNewGameJSON(self.variation, self.split, True))
        self.task_description = str(self.server.getTaskDescription())
        self.gold = [str(a) for a in self.server.getGoldActionSequence()]
        self.raw_score, self.failed = float(state["score"]), bool(state["taskfailure"])
        task = f"{PREFIX}:{self.game}:{self.params}:{self.split}:{self.variation}"
        return self._opening(state["observation"], {"game": self.game}, task)

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

    def _gold_path(self, played: list[str]) -> list[str]:
        """The gold path the game generated with the episode's game."""
        return self.gold
