"""TextArena games as envkit envs: ``envkit.make("textarena:GuessTheNumber-v0")``, ``"textarena:TicTacToe-v0"``.

Needs ``pip install -e '.[textarena]'``. Any game id of ``textarena.make`` (its registry, ``-train``/``-raw`` variants
included) that runs offline with one or two players.

* The agent is player 0. Its moves are the text of its replies (passed through the game's action wrappers, so
  ``ActionFormattingWrapper`` adds the brackets a reply forgot); tool calls are ignored. Each env message is one user
  message holding what the game told player 0 since the agent's last move: game messages as written, the opponent's
  moves as ``[Player 1] …``, the agent's own moves left out (they are already in the transcript), and a last
  ``Game over: …`` line with the game's reason when it ends.
* Two-player games play against a fixed scripted opponent (player 1): a uniformly random choice, from a random stream
  seeded by the task seed, among the bracketed moves the game lists for it on its last ``Available Moves:`` /
  ``Valid moves:`` line (TicTacToe, WildTicTacToe, Othello, SimpleTak, ...). A two-player game that lists no
  moves needs ``opponent=``: a callable or ``"package.module:function"`` taking ``(observation: str, rng:
  random.Random)`` and returning player 1's move. Games for three or more players are refused.
* Score in [0, 1] from the agent's final reward (``close()``), mapped linearly from the game's reward range, never
  clipped. Two-player games: TextArena's -1 (loss) to 1 (win), so win 1, draw 0.5, loss 0. Single-player games:
  TextArena's 0 to 1 (1 for a win, else the game's partial completion), and its -1 for an invalid move scores 0, as a
  loss does. Games whose rewards run elsewhere (``Set-v0`` gives one point per set found, ``UltimateTexasHoldem-v0``
  -1 when the chips run out) declare the range with ``reward_range=[lo, hi]`` (the invalid-move -1 is then mapped
  like any reward); a reward outside the range, or one that is not a finite number, fails the episode with a message
  naming ``reward_range``. A game not over yet (cut by ``max_turns``, 100 by default, ``max_turns=`` to change)
  scores 0.
* Determinism: TextArena seeds Python's process-global ``random`` in ``reset(seed=…)`` and games draw from it (and a few
  from ``numpy.random``) while they play. Every call into TextArena runs under one process-wide lock with the env's own
  saved ``random``/``numpy.random`` states swapped in and out, so the same seed and actions give the same game however
  many envs run in other threads, and the caller's global random streams are left as they were. (Other code that draws
  from the global streams in another thread at the same moment would have to hold :data:`RANDOM_LOCK` too.)
* Games that need downloads fail at construction with one line naming what is missing: word games load NLTK corpora
  (``nltk.download`` runs at import; envkit turns it into a no-op while building, so nothing is fetched from a rollout
  worker — install the data beforehand, e.g. ``python -m nltk.downloader words averaged_perceptron_tagger_eng``), and
  games judged or played by an LLM (``OpenRouterAgent``) need an API key and the network.
* Oracle: ``GuessTheNumber`` names the hidden number; games that list the agent's moves get a search oracle (a
  depth-first search over the listed moves on copies of the env, opponent included, for a line that wins), so
  ``envkit validate textarena:TicTacToe-v0`` can check scores. Other games have none.

Every other keyword of ``envkit.make`` goes to the game's constructor (``textarena.make(game_id, **kwargs)``).
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import importlib
import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import numpy as np

from envkit.adapters._adapted import SpecBuilt, class_name, reward_range_config, scaled_score
from envkit.core.env import Env
from envkit.core.messages import Message
from envkit.registry import EnvSpecError
from envkit.util.text import one_line

PREFIX = "textarena"
AGENT = 0
OPPONENT = 1

RANDOM_LOCK = threading.RLock()
"""Held around every call into TextArena (it seeds and draws from the process-global random streams)."""

_MOVES_LINE = re.compile(r"^\s*(?:available|valid) moves\s*:(.*)$", re.IGNORECASE | re.MULTILINE)
_BRACKETED = re.compile(r"\[[^\[\]\n]{1,40}\]")
_SEARCH_NODES = 2000
_SEARCH_SECONDS = 2.0


def listed_moves(text: str) -> list[str]:
    """The bracketed moves on the last ``Available Moves:`` / ``Valid moves:`` line of ``text`` (deduplicated)."""
    lines = _MOVES_LINE.findall(text)
    if not lines:
        return []
    return list(dict.fromkeys(_BRACKETED.findall(lines[-1])))


def random_listed_move(observation: str, rng: random.Random) -> str:
    """The default scripted opponent: a uniformly random move among those the game lists for it."""
    moves = listed_moves(observation)
    if not moves:
        raise RuntimeError("the game listed no moves for the scripted opponent; pass opponent=")
    return rng.choice(moves)


@contextlib.contextmanager
def _download_refused(requested: list[str]) -> Iterator[None]:
    """While building a game, ``nltk.download`` records what was asked for and fetches nothing."""
    try:
        import nltk
    except ImportError:
        yield
        return

    def refuse(info_or_id: Any = None, *args: Any, **kwargs: Any) -> bool:
        names = info_or_id if isinstance(info_or_id, list | tuple) else [info_or_id]
        requested.extend(str(n) for n in names if n)
        return False

    original = nltk.download
    nltk.download = refuse
    try:
        yield
    finally:
        nltk.download = original


def _one_line(error: BaseException) -> str:
    return one_line(re.sub(r"\*+", "", str(error)), 300) or type(error).__name__


def _nltk_resource(error: BaseException) -> str | None:
    match = re.search(r"Resource\s+(\S+)\s+not found", str(error))
    return match.group(1).strip("'\"") if match else None


def env_class(rest: str) -> type[TextArenaEnv]:
    """The env class of ``textarena:GAME_ID``."""
    with RANDOM_LOCK:  # importing TextArena draws from the global random stream: leave the caller's as it was
        saved = random.getstate()
        import textarena

        random.setstate(saved)
    game_id = rest.strip()
    registry = textarena.envs.registration.ENV_REGISTRY
    if game_id not in registry:
        close = difflib.get_close_matches(game_id, list(registry), n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise EnvSpecError(
            f"TextArena has no game {game_id!r}; {hint}{len(registry)} game ids exist "
            "(python -c 'import textarena; print(sorted(textarena.envs.registration.ENV_REGISTRY))')"
        )
    return type(
        class_name("TextArena", game_id),
        (TextArenaEnv,),
        {
            "game_id": game_id,
            "envkit_spec": f"{PREFIX}:{game_id}",
            "__module__": __name__,
            "__doc__": f"The TextArena game {game_id!r}; see {__name__}.",
        },
    )


def _resolve_opponent(opponent: Any) -> Callable[[str, random.Random], str]:
    if opponent is None:
        return random_listed_move
    if callable(opponent):
        return opponent
    if isinstance(opponent, str) and ":" in opponent:
        module_name, _, name = opponent.rpartition(":")
        try:
            function = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError) as error:
            raise EnvSpecError(f"opponent={opponent!r} cannot be imported: {_one_line(error)}") from None
        if callable(function):
            return function
    raise EnvSpecError(f"opponent must be a callable or 'package.module:function', got {opponent!r}")


class TextArenaEnv(SpecBuilt, Env):
    """One TextArena game as an env; subclassed per game id by :func:`env_class` (see the module docstring)."""

    max_turns: ClassVar[int] = 100
    game_id: ClassVar[str] = ""

    def __init__(
        self,
        max_turns: int | None = None,
        opponent: Any = None,
        reward_range: tuple[float, float] | list[float] | None = None,
        **game_kwargs: Any,
    ) -> None:
        super().__init__()
        self._remember({"max_turns": max_turns, "opponent": opponent, "reward_range": reward_range, **game_kwargs})
        self.reward_range = reward_range_config(reward_range, self.envkit_spec)
        if max_turns is not None:
            self.max_turns = int(max_turns)  # type: ignore[misc]
        self.opponent = _resolve_opponent(opponent)
        self._custom_opponent = opponent is not None
        self._py_state = random.Random(0).getstate()
        self._np_state = np.random.RandomState(0).get_state()
        self.game, self.core, self.num_players = self._build(game_kwargs)
        self.opponent_rng = random.Random(0)
        self.rewards: dict[int, float] | None = None
        self.reason = ""
        self.invalid_move = False
        self._plan: list[str] = []
        self._plan_turn = -1

    # -- TextArena under the lock ------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _own_random(self) -> Iterator[None]:
        """Run TextArena code with this env's random streams in the global ``random`` and ``numpy.random``."""
        with RANDOM_LOCK:
            saved_py, saved_np = random.getstate(), np.random.get_state()
            random.setstate(self._py_state)
            np.random.set_state(self._np_state)
            try:
                yield
            finally:
                self._py_state, self._np_state = random.getstate(), np.random.get_state()
                random.setstate(saved_py)
                np.random.set_state(saved_np)

    def _build(self, game_kwargs: dict[str, Any]) -> tuple[Any, Any, int]:
        import textarena

        requested: list[str] = []
        spec = self.envkit_spec
        with self._own_random():
            try:
                with _download_refused(requested):
                    game = textarena.make(self.game_id, **game_kwargs)
                core = game
                while isinstance(core, textarena.Wrapper):
                    core = core.env
                num_players = self._probe_players(game)
            except EnvSpecError:
                raise
            except Exception as error:
                resource = _nltk_resource(error)
                if requested or resource or type(error).__name__ == "LookupError":
                    names = " ".join(dict.fromkeys([*requested, *([resource] if resource else [])])) or "its corpora"
                    raise EnvSpecError(
                        f"{spec} needs NLTK data that TextArena downloads on first use ({names}), which is not "
                        f"installed here; envkit does not download while building envs: run `python -m nltk.downloader "
                        f"{names}` where the network is reachable (or point NLTK_DATA at a copy)"
                    ) from None
                if "OPENROUTER" in str(error).upper() or "api key" in str(error).lower():
                    raise EnvSpecError(
                        f"{spec} is played or judged by an LLM over the network (OpenRouter), not offline: "
                        f"{_one_line(error)}"
                    ) from None
                detail = f"{type(error).__name__}: {_one_line(error)}"
                raise EnvSpecError(f"{spec} cannot be built offline: {detail}") from None
        return game, core, num_players

    def _probe_players(self, game: Any) -> int:
        """1 or 2: the player count the game accepts (tried in that order)."""
        for players in (1, 2):
            try:
                game.reset(num_players=players, seed=0)
            except AssertionError:
                continue
            if players == 2 and not self._custom_opponent:
                state = self._state(game)
                text = "\n".join(m for _, m, _ in state.observations.get(OPPONENT, []))
                if not listed_moves(text):
                    raise EnvSpecError(
                        f"{self.envkit_spec} is a two-player game that lists no moves for envkit's scripted opponent "
                        "(no 'Available Moves:' / 'Valid moves:' line): pass opponent=callable(observation, rng) "
                        "returning its move"
                    )
            return players
        raise EnvSpecError(f"{self.envkit_spec}: envkit plays one- and two-player TextArena games only")

    @staticmethod
    def _state(game: Any) -> Any:
        import textarena

        core = game
        while isinstance(core, textarena.Wrapper):
            core = core.env
        return core.state

    def _take(self, player: int) -> list[tuple[int, str, Any]]:
        """The observations queued for ``player`` since it last looked (TextArena's ``get_observation`` for that
        player, also when it is not the player to move)."""
        state = self.core.state
        queued = list(state.observations.get(player, []))
        state.observations[player] = []
        return queued

    def _format(self, observations: list[tuple[int, str, Any]]) -> str:
        import textarena

        parts = []
        roles = getattr(self.core.state, "role_mapping", {}) or {}
        for sender, message, kind in observations:
            if sender == AGENT and kind == textarena.ObservationType.PLAYER_ACTION:
                continue
            text = str(message).strip()
            if not text:
                continue
            parts.append(text if sender == textarena.GAME_ID else f"[{roles.get(sender, f'Player {sender}')}] {text}")
        return "\n\n".join(parts)

    def _play_opponent(self) -> None:
        """Let the scripted opponent move until it is the agent's turn or the game is over."""
        state = self.core.state
        for _ in range(1000):
            if state.done or state.current_player_id == AGENT:
                return
            player = state.current_player_id
            observation = self._format(self._take(player)) if player == OPPONENT else ""
            action = self.opponent(observation, self.opponent_rng)
            done, _ = self.game.step(action=str(action))
            if done:
                return
        raise RuntimeError(f"{self.envkit_spec}: the opponent moved 1000 times without giving the turn back")

    def _finish(self) -> str:
        rewards, game_info = self.game.close()
        self.rewards = {int(k): v for k, v in (rewards or {}).items()}
        info = (game_info or {}).get(AGENT, {}) if isinstance(game_info, dict) else {}
        self.reason = str(info.get("reason") or "")
        self.invalid_move = bool(info.get("invalid_move"))
        return f"Game over: {self.reason}" if self.reason else "Game over."

    # -- the envkit contract -----------------------------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """A new game, seeded with ``seed`` (TextArena's own seeding; the opponent's stream is seeded from it too)."""
        super().reset(seed=seed, options=options)
        if seed is None:
            seed = int(self.np_random.integers(2**31 - 1))
        self._started(seed, options)
        self.rewards, self.reason, self.invalid_move, self._plan, self._plan_turn = None, "", False, [], -1
        self.opponent_rng = random.Random(f"textarena-opponent-{seed}")
        self._np_state = np.random.RandomState(int(seed) % 2**32).get_state()
        with self._own_random():
            self.game.reset(num_players=self.num_players, seed=int(seed))
            self._play_opponent()
            text = self._format(self._take(AGENT))
            if self.core.state.done:
                text = f"{text}\n\n{self._finish()}".strip()
        return [{"role": "user", "content": text}], {"game": self.game_id, "players": self.num_players}

    def step(self, action: Message | str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Play the reply's text as player 0's move, then the opponent's moves; the game's answer comes back."""
        content = action.get("content") if isinstance(action, dict) else action
        move = content if isinstance(content, str) else ""
        with self._own_random():
            done, info = self.game.step(action=move)
            if not done:
                self._play_opponent()
            done = bool(self.core.state.done)
            text = self._format(self._take(AGENT))
            if done:
                text = f"{text}\n\n{self._finish()}".strip()
        observation = [{"role": "user", "content": text}] if text else []
        return observation, self.score(), done, False, {"game_info": dict(info or {})}

    def score(self) -> float:
        """The agent's final reward mapped onto [0, 1] from the game's reward range (see the module docstring); 0
        while the game goes on; ``ValueError`` for a reward outside the range."""
        if self.rewards is None:
            return 0.0
        reward = self.rewards.get(AGENT, 0.0)
        if self.reward_range is None and self.num_players == 1 and self.invalid_move and reward == -1:
            return 0.0  # TextArena's invalid-move penalty: a loss
        if self.num_players == 2:
            default, default_is = (-1.0, 1.0), "TextArena's two-player range"
        else:
            default, default_is = (0.0, 1.0), "TextArena's single-player range (its -1 for an invalid move aside)"
        return scaled_score(reward, self.reward_range, self.envkit_spec, "game's final reward", default, default_is)

    def oracle(self) -> Message | None:
        """A winning move: the hidden number in GuessTheNumber, else a searched line over the listed moves."""
        if self.done:
            return None
        if type(self.core).__name__ == "GuessTheNumberEnv":
            return {"role": "assistant", "content": f"[{self.core.game_number}]"}
        said = [m.get("content") for m in self.messages if m.get("role") == "assistant"]
        if self._plan and self._plan_turn == self.turns and said and said[-1] == self._plan[0]:
            self._plan.pop(0)  # the planned move was played: the plan still holds
        else:
            self._plan = self._search() or []
        if not self._plan:
            return None
        self._plan_turn = self.turns + 1
        return {"role": "assistant", "content": self._plan[0]}

    def _last_listed_moves(self) -> list[str]:
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return listed_moves(str(message.get("content", "")))
        return []

    def _search(self) -> list[str] | None:
        """A depth-first search for moves that win (score 1.0), on deep copies of this env (at most
        :data:`_SEARCH_NODES` moves tried and :data:`_SEARCH_SECONDS` seconds; ``None`` when none is found)."""
        budget = [_SEARCH_NODES]
        deadline = time.monotonic() + _SEARCH_SECONDS

        def search(env: TextArenaEnv, depth: int) -> list[str] | None:
            for move in env._last_listed_moves():
                if budget[0] <= 0 or time.monotonic() > deadline:
                    return None
                budget[0] -= 1
                child = copy.deepcopy(env)
                _, _, terminated, truncated, _ = child.step({"role": "assistant", "content": move})
                if child.score() >= 1.0:
                    return [move]
                if terminated or truncated or depth <= 1:
                    continue
                rest = search(child, depth - 1)
                if rest:
                    return [move, *rest]
            return None

        return search(self, self.max_turns - self.turns)
