"""A generation backend whose "model" is the env's ``oracle()`` (:class:`OracleBackend`): each reply is the chat
template's own text of the oracle's next message, so the "model tokens" are what a model that had learned the template
would emit. Run through :class:`~envkit.rollout.RolloutEngine` like any model: it gives token-exact demonstrations
(``envkit sft``, :mod:`envkit.demos`) and serves tests and benchmarks as a scripted policy."""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from envkit.backends import Generation, SamplingParams
from envkit.chat.parsing import parse_assistant
from envkit.chat.render import ChatRenderer
from envkit.core.env import Env
from envkit.core.messages import Message


class NoOracle(ValueError):
    """The env has no ``oracle()``, so it cannot demonstrate its tasks."""


class UnknownPrompt(LookupError):
    """An :class:`OracleBackend` got a prompt that is neither a task's opening nor the continuation it expects."""


@dataclass
class OracleReplica:
    """One env an :class:`OracleBackend` plays: reset with ``seed`` and stepped with every reply it was given."""

    seed: int
    env: Env
    renderer: ChatRenderer
    generated: list[list[int]] = field(default_factory=list)
    """The token ids of each reply played so far (one list per assistant turn)."""


class OracleBackend:
    """A generation backend that plays the env's ``oracle()`` policy, token-exactly through the chat template.

    It keeps *replica* envs beside the episodes it is asked to continue. A prompt it has not seen must be the opening
    prompt of one of ``seeds`` (``renderer.prompt_ids(opening)``, as the rollout engine renders it): a new replica is
    reset with that seed. Any other prompt must be exactly the prompt a replica expects next (its last prompt + its
    reply + the template suffix of the env's answer); a prompt that is one token off raises :class:`UnknownPrompt`.
    For each prompt the replica's ``oracle()`` gives the action; the reply is the template's text of that assistant
    message up to and including the end-of-turn token (the template rendered with and without it), encoded. The
    replica is then stepped with the reply parsed back (:func:`envkit.parse_assistant`), exactly as the engine steps
    its own env. Group members with identical prompts each get their own replica. A replica is dropped when its episode
    ends or its env raises in ``step`` (the episode's own env raises too); those of episodes the engine ends early (its
    ``max_turns``, a timeout) stay queued while the backend lives: build one per run.

    Prompts do not say which task they belong to, so the task seeds are given here: on the first call one replica per
    seed is reset to index the opening prompts (and then plays the first episode of its seed). The engine's per-request
    ``seeds=`` cannot serve: they are sampling seeds, derived by hashing and only sent when ``SamplingParams.seed`` is
    set, and passing task seeds to backends would tie every model backend to envs. When several seeds render the same
    opening (an env whose prompt does not depend on the seed), their replicas are played together until the env's
    answers tell them apart; if their oracles act differently on the same conversation the backend cannot know which
    task it is playing and raises ``ValueError``. Correct for envs that are random only through their seed (replicas
    reset with the same seed as the engine's env evolve identically).

    Args:
        env_factory: ``env_factory()`` returns a fresh env (one per replica).
        tokenizer: The tokenizer the episodes are rendered with.
        seeds: The task seeds it may be asked to play.
        logprob: The logprob reported for every generated token.
        renderer: A :class:`ChatRenderer` to use for every replica (default: one per tool set, built with
            ``renderer_kwargs``).
        renderer_kwargs: :class:`ChatRenderer` options (``chat_template=``, ``template_kwargs=``, ``end_of_turn=``):
            the same as the engine's.

    Raises (from :meth:`generate`): :class:`NoOracle` when ``oracle()`` returns ``None``, :class:`UnknownPrompt`, or
    what the oracle or the template raises. The rollout engine keeps only the message in ``episode.error``;
    :attr:`last_error` holds the exception itself.
    """

    def __init__(
        self,
        env_factory: Callable[[], Env],
        tokenizer: Any,
        seeds: Iterable[int],
        *,
        logprob: float = 0.0,
        renderer: ChatRenderer | None = None,
        **renderer_kwargs: Any,
    ) -> None:
        self.env_factory = env_factory
        self.tokenizer = tokenizer
        self.seeds = [int(s) for s in seeds]
        self.logprob = float(logprob)
        self.renderer = renderer
        self.renderer_kwargs = renderer_kwargs
        self.last_error: Exception | None = None
        """The last exception :meth:`generate` raised."""
        self._renderers: dict[str, ChatRenderer] = {}
        self._openings: dict[tuple[int, ...], list[int]] | None = None  # opening prompt -> the seeds rendering it
        self._spare: dict[int, list[OracleReplica]] = collections.defaultdict(list)  # reset, not yet played
        self._waiting: dict[tuple[int, ...], collections.deque[list[OracleReplica]]] = collections.defaultdict(
            collections.deque
        )  # expected prompt -> queue of tracks (replicas that render the same conversation, one per candidate seed)
        self._lock = threading.Lock()

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams | None = None,
        *,
        seeds: list[int] | None = None,
        max_new_tokens: list[int] | None = None,
    ) -> list[Generation]:
        """The oracle's next reply to each prompt, whole (``sampling``, ``seeds`` and ``max_new_tokens`` are ignored:
        the oracle is greedy, and the rollout engine cuts a reply that overruns the episode's room).

        A batch that raises leaves the backend as it was, so each prompt can be retried alone.
        """
        with self._lock:
            try:
                return self._generate(prompts)
            except Exception as error:
                self.last_error = error
                raise

    def on_prompt(self, prompt: list[int], replica: OracleReplica) -> None:
        """Called with each prompt and a replica that answers it, before the oracle acts (a hook for subclasses,
        e.g. to check the prompt against the template's own rendering of ``replica.env.messages``)."""

    # ---- internals ---------------------------------------------------------------------------------------------------
    def _generate(self, prompts: list[list[int]]) -> list[Generation]:
        taken: list[tuple[tuple[int, ...] | None, list[OracleReplica]]] = []
        replies: list[list[int]] = []
        try:  # first every lookup and action, which change nothing that cannot be put back...
            for prompt in prompts:
                key = tuple(prompt)
                queue = self._waiting.get(key)
                if queue:
                    taken.append((key, queue.popleft()))
                else:
                    taken.append((None, self._open(key)))
                replies.append(self._act(list(prompt), taken[-1][1]))
        except Exception:
            for key, track in reversed(taken):
                if key is None:
                    for replica in track:
                        self._spare[replica.seed].append(replica)
                else:
                    self._waiting[key].appendleft(track)
            raise
        for prompt, (_, track), reply in zip(prompts, taken, replies, strict=True):  # ...then the steps
            self._step(list(prompt), track, reply)
        return [Generation(list(reply), [self.logprob] * len(reply), "stop") for reply in replies]

    def _renderer_for(self, env: Env) -> ChatRenderer:
        if self.renderer is not None:
            return self.renderer
        tools = getattr(env, "tools", None) or None
        key = json.dumps(tools, sort_keys=True, default=str)
        if key not in self._renderers:
            self._renderers[key] = ChatRenderer(self.tokenizer, tools, **self.renderer_kwargs)
        return self._renderers[key]

    def _reset(self, seed: int) -> tuple[OracleReplica, tuple[int, ...]]:
        env = self.env_factory()
        opening, _ = env.reset(seed=seed)
        renderer = self._renderer_for(env)
        return OracleReplica(seed, env, renderer), tuple(renderer.prompt_ids(list(opening)))

    def _open(self, key: tuple[int, ...]) -> list[OracleReplica]:
        """Fresh replicas for an opening prompt: one per seed that renders it."""
        if self._openings is None:
            self._openings = {}
            for seed in dict.fromkeys(self.seeds):
                replica, opening = self._reset(seed)
                self._openings.setdefault(opening, []).append(seed)
                self._spare[seed].append(replica)
        seeds = self._openings.get(key)
        if not seeds:
            text = self.tokenizer.decode(list(key[-60:]))
            raise UnknownPrompt(
                f"a prompt of {len(key)} tokens is neither the opening of seeds {self.seeds} nor the continuation of "
                f"an episode this OracleBackend played (the template's rendering drifted?): ...{text!r}"
            )
        track = []
        for seed in seeds:
            if self._spare[seed]:
                track.append(self._spare[seed].pop())
                continue
            replica, opening = self._reset(seed)
            if opening != key:
                raise ValueError(
                    f"{type(replica.env).__name__}.reset(seed={seed}) gave another opening prompt the second time: "
                    "an OracleBackend needs envs that are random only through their seed"
                )
            track.append(replica)
        return track

    def _act(self, prompt: list[int], track: list[OracleReplica]) -> list[int]:
        """The oracle's reply, the same for every replica of the track."""
        replies = []
        for replica in track:
            self.on_prompt(prompt, replica)
            action = replica.env.oracle()
            if action is None:
                raise NoOracle(f"{type(replica.env).__name__}.oracle() returned None on seed {replica.seed}")
            replies.append(_reply_ids(replica.renderer, replica.env.messages, action))
        if any(reply != replies[0] for reply in replies):
            raise ValueError(
                f"seeds {[r.seed for r in track]} render the same conversation but their oracles act differently: "
                "the prompt does not say which task it is. Give these seeds separate OracleBackends"
            )
        return replies[0]

    def _step(self, prompt: list[int], track: list[OracleReplica], reply: list[int]) -> None:
        """Step the track's replicas with the reply; queue them under the prompt each expects next."""
        tracks: dict[tuple[int, ...], list[OracleReplica]] = {}
        for replica in track:
            renderer = replica.renderer
            replica.generated.append(list(reply))
            said = reply[: len(reply) - len(renderer.end_of_turn_ids)]
            text = renderer.tokenizer.decode(said, skip_special_tokens=False)
            message = parse_assistant(text, renderer.tokenizer, chat_template=renderer.chat_template)
            try:
                observation, _reward, terminated, truncated, _info = replica.env.step(message)
                if terminated or truncated:
                    continue  # the episode ends here: nothing more to expect
                observation = list(observation)
                history = replica.env.messages[: len(replica.env.messages) - len(observation)]
                suffix = renderer.suffix_ids(history, observation, add_generation_prompt=True)
            except Exception:  # the episode's own env fails the same way on the same action: it ends there
                continue
            tracks.setdefault((*prompt, *reply, *suffix), []).append(replica)
        for key, replicas in tracks.items():
            self._waiting[key].append(replicas)


def _reply_ids(renderer: ChatRenderer, messages: list[Message], action: Message) -> list[int]:
    """The token ids the template gives the assistant message ``action`` after ``messages``, through its
    end-of-turn token."""
    prompt = renderer.render(messages, add_generation_prompt=True)
    full = renderer.render([*messages, action])
    end = full.rfind(renderer.end_of_turn)
    if not full.startswith(prompt) or end < len(prompt):
        raise ValueError(
            f"the chat template does not render the oracle's message {action!r} as a continuation of its generation "
            f"prompt ending {prompt[-80:]!r}"
        )
    return renderer.encode(full[len(prompt) : end + len(renderer.end_of_turn)])
