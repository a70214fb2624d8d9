"""What every backend shares: sampling settings, per-request seeds and budgets, the :class:`Generation` result and its
:func:`finish_reason`, :class:`BackendError` and :class:`GenerationTimeout`, and the backend contract as typed
protocols.

The contract: a token backend is a :class:`Backend` (``generate``). Whatever else it can do is declared by the
protocols it satisfies, and callers ask with ``isinstance`` (never by reading signatures):

* :class:`AsyncBackend` — ``await agenerate(prompt, sampling, seed, timeout_s=)``: one request per episode, which the
  rollout engine then awaits instead of batching (the backend batches continuously itself).
* :class:`HasContextLength` — ``max_model_len``: the rollout engine caps episodes at it.
* :class:`Closable` — ``close()``: resources to release when a run ends (an engine, its threads).
* :class:`Checkable` — ``check()``: whether the backend can serve at all (every server answers), raised as one line.
* :class:`ReportsTokens` — ``token_hook``: tokens generated so far during a call (the progress bar).

A :class:`ChatBackend` (``achat``: messages and tools in, an assistant message out) is not a token backend: it plays
episodes at the message level (evaluation, simulated users, judges) and cannot train (:data:`NOT_TOKEN_EXACT`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass
class SamplingParams:
    """How to sample one assistant turn.

    ``top_k=0`` (or ``None``), ``top_p=1.0``, ``min_p=0.0`` and ``repetition_penalty=1.0`` disable those knobs;
    ``temperature=0`` is greedy decoding. Recorded logprobs are of the distribution actually sampled from, after every
    knob (what TRL's importance-sampling correction compares against). ``stop`` lists extra stop strings;
    ``stop_token_ids`` extra stop tokens (the rollout engine adds the chat template's end-of-turn token here).

    ``seed`` makes sampling reproducible without touching global RNG state: the rollout engine derives one seed per
    request from it (:func:`request_seed`: the episode's position in the rollout call, and the turn), so no two
    episodes of one call share a sample, and hands the backend one seed per prompt.

    A value out of its range raises :class:`SamplingRangeError` on construction: a negative temperature or a top-p of
    2 would otherwise sample as something else (greedy, top-p off) without a word.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_new_tokens: int = 128
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.stop is not None and (isinstance(self.stop, str) or not all(isinstance(t, str) for t in self.stop)):
            # a str would be read as its characters: every one a stop string
            raise TypeError(f"stop must be a list of strings, got {self.stop!r} (one stop string: [{self.stop!r}])")
        for name, (allowed, requirement) in SAMPLING_RANGES.items():
            value = getattr(self, name)
            if value is not None and not allowed(value):  # None: top_k off
                shown = f"{value:g}" if isinstance(value, float) else repr(value)
                raise SamplingRangeError(name, f"must be {requirement}, got {shown}")


SAMPLING_RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "temperature": (lambda t: 0 <= t < float("inf"), "0 (greedy) or more"),
    "top_p": (lambda p: 0 < p <= 1, "above 0 and at most 1 (1 = off)"),
    "top_k": (lambda k: k >= 0, "0 (off) or more"),
    "min_p": (lambda p: 0 <= p <= 1, "between 0 (off) and 1"),
    "repetition_penalty": (lambda r: 0 < r < float("inf"), "above 0 (1 = off)"),
    "max_new_tokens": (lambda n: n >= 0, "0 or more"),
}
"""The range of each numeric :class:`SamplingParams` field, with the words that state it (NaN is in none)."""


class SamplingRangeError(ValueError):
    """A :class:`SamplingParams` field out of its range (:data:`SAMPLING_RANGES`). ``field`` names it and
    ``requirement`` says what it must be, so that a command line can name its own flag:
    ``f"--{error.flag} {error.requirement}"``."""

    def __init__(self, field: str, requirement: str) -> None:
        super().__init__(f"{field} {requirement}")
        self.field = field
        self.requirement = requirement

    @property
    def flag(self) -> str:
        """The field as a command-line flag name, without the dashes (``top_p`` → ``top-p``)."""
        return self.field.replace("_", "-")


def request_seed(seed: int, *parts: int) -> int:
    """A 63-bit seed for one generation request, derived from a base ``seed`` and the request's coordinates
    (e.g. task seed, group index, turn): distinct coordinates give independent streams."""
    digest = hashlib.blake2b(repr((int(seed), *map(int, parts))).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


@dataclass
class Generation:
    """One generated turn: the new token ids, the logprob of each, and why generation stopped."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    """``"stop"`` (an end-of-turn/stop token or string) or ``"length"`` (``max_new_tokens`` reached)."""
    model: str | None = None
    """The model (or LoRA adapter) name that generated it, when the backend knows it (a server echoes the name it
    served): with adapters hot-swapped during a run, what says which policy produced the turn."""


@runtime_checkable
class Backend(Protocol):
    """Anything that turns token-id prompts into :class:`Generation` objects: the one method every token backend
    has."""

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        *,
        seeds: list[int] | None = None,
        max_new_tokens: list[int] | None = None,
    ) -> list[Generation]:
        """Generate one continuation per prompt, in order.

        Args:
            prompts: Token ids, one list per request. They are the rollout engine's own lists, one per episode,
                extended in place after the call returns (a copy per turn would cost O(history) per step): read them
                during the call, and copy one to keep it.
            sampling: The settings of every request (:attr:`SamplingParams.max_new_tokens` is the largest budget).
            seeds: One sampling seed per prompt (None: derive them from ``sampling.seed`` with :func:`request_seeds`,
                or sample unseeded). A backend that cannot seed its samples ignores them and says so in its docs.
            max_new_tokens: One token budget per prompt, each at most ``sampling.max_new_tokens`` (None: that one for
                all; :func:`request_budgets`). Each prompt gets exactly what it would get alone with its budget.
        """
        ...


@runtime_checkable
class AsyncBackend(Protocol):
    """A backend that takes one request at a time and batches continuously itself (a server, vLLM's ``AsyncLLM``):
    the rollout engine awaits :meth:`agenerate` per episode instead of micro-batching ``generate`` calls."""

    async def agenerate(
        self, prompt: list[int], sampling: SamplingParams, seed: int | None = None, *, timeout_s: float | None = None
    ) -> Generation:
        """One continuation of ``prompt`` (read during the call, as :meth:`Backend.generate`'s prompts).

        ``timeout_s``: the request's deadline, counted from when it enters the backend (not time queued behind
        other requests); past it :class:`GenerationTimeout`. None: no deadline.
        """
        ...


@runtime_checkable
class HasContextLength(Protocol):
    """A backend that knows its model's context length."""

    @property
    def max_model_len(self) -> int | None:
        """Prompt + completion tokens the model takes (None: unknown); the rollout engine caps episodes at it."""
        ...


@runtime_checkable
class Closable(Protocol):
    """A backend that holds resources to release when a run ends (an engine process, an event-loop thread)."""

    def close(self) -> None:
        """Release them (idempotent); the backend serves no request afterwards."""
        ...


@runtime_checkable
class Checkable(Protocol):
    """A backend that can say before a run whether it can serve (every server answers)."""

    def check(self) -> None:
        """Raise :class:`BackendError` with one line naming what does not answer; return when all is well."""
        ...


@runtime_checkable
class ChatBackend(Protocol):
    """A model at the message level: messages and tools in, an assistant message out (a chat-completions endpoint).

    For evaluation (:class:`~envkit.rollout.ChatRolloutEngine`), simulated users and judges; never for training
    (:data:`NOT_TOKEN_EXACT`)."""

    async def achat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        sampling: SamplingParams | None = None,
        seed: int | None = None,
        *,
        timeout_s: float | None = None,
    ) -> Any:
        """The model's next turn: a :class:`~envkit.backends.chat_completions.ChatReply` (its ``message``,
        ``finish_reason``, ``model``)."""
        ...


NOT_TOKEN_EXACT = (
    "a chat backend cannot train: it returns messages, not the token ids the policy sampled nor their logprobs, and "
    "a text round trip through the server's template is not token-exact; train with a token backend (transformers, "
    "vllm, openai, sglang), and evaluate with this one through ChatRolloutEngine (envkit eval --backend chat)"
)
"""Why a :class:`ChatBackend` is refused for training, in one line."""


TokenHook = Callable[[int, float], None]
"""Called during a generation call with (tokens generated so far in the call, seconds since it began)."""


@runtime_checkable
class ReportsTokens(Protocol):
    """A backend that can say, while a ``generate`` call runs, how many tokens it has generated so far.

    In-process backends (:class:`~envkit.backends.transformers.TransformersBackend`) are; a server's reply comes whole,
    so the vLLM and OpenAI-compatible backends are not. The consumer is the rollout engine's progress bar, which sets
    :attr:`token_hook` for the length of a run when a bar is shown, so a long first turn does not look like a hang.
    """

    token_hook: TokenHook | None
    """None (the default): nothing is reported. Else called on the generating thread, at most a few times a second
    and once when a call ends; it must be quick and must not raise."""


def finish_reason(reported: str | None) -> str:
    """:attr:`Generation.finish_reason` for the reason an engine reported (a vLLM ``CompletionOutput``'s, an
    OpenAI-compatible server's ``choices[0].finish_reason``): ``"length"`` when the token budget cut the turn, else
    ``"stop"`` (a stop token or string, or the end of sequence, ended it)."""
    return "length" if reported == "length" else "stop"


class BackendError(RuntimeError):
    """A backend could not generate (server down, out of memory, …); the message says which and why."""


class GenerationTimeout(TimeoutError):
    """A generation did not come back within its deadline (a hung backend or server)."""


def request_seeds(sampling: SamplingParams, seeds: list[int] | None, count: int) -> list[int | None]:
    """One seed per request: the given ``seeds``, else derived from ``sampling.seed``, else ``None`` (random)."""
    if seeds is not None:
        if len(seeds) != count:
            raise ValueError(f"{len(seeds)} seeds for {count} prompts")
        return list(seeds)
    if sampling.seed is None:
        return [None] * count
    return [request_seed(sampling.seed, i) for i in range(count)]


def request_budgets(sampling: SamplingParams, max_new_tokens: list[int] | None, count: int) -> list[int]:
    """One token budget per request: the given ``max_new_tokens`` (each at least 1), else ``sampling``'s for all."""
    if max_new_tokens is None:
        return [sampling.max_new_tokens] * count
    if len(max_new_tokens) != count:
        raise ValueError(f"{len(max_new_tokens)} token budgets for {count} prompts")
    budgets = [int(n) for n in max_new_tokens]
    if any(n < 1 for n in budgets):
        raise ValueError(f"every max_new_tokens must be at least 1, got {min(budgets)}")
    return budgets
