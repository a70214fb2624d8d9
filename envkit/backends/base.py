"""What every backend shares: sampling settings, per-request seeds, the :class:`Generation` result and its
:func:`finish_reason`, the :class:`Backend` protocol, :class:`BackendError` and :class:`GenerationTimeout`."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


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
    """Anything that turns token-id prompts into :class:`Generation` objects."""

    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams, *, seeds: list[int] | None = None
    ) -> list[Generation]:
        """Generate one continuation per prompt, in order; ``seeds`` (one per prompt) when ``sampling.seed`` is set.

        A backend whose ``generate`` also takes ``max_new_tokens: list[int] | None`` (one budget per prompt, each at
        most ``sampling.max_new_tokens``) gets requests with different budgets in one call; without it the rollout
        engine only batches requests with the same budget.

        The prompts are the rollout engine's own lists, one per episode, extended in place after the call returns (a
        copy per turn would cost O(history) per step): read them during the call, and copy one to keep it."""
        ...


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


def _request_seeds(sampling: SamplingParams, seeds: list[int] | None, count: int) -> list[int | None]:
    """One seed per request: the given ``seeds``, else derived from ``sampling.seed``, else ``None`` (random)."""
    if seeds is not None:
        if len(seeds) != count:
            raise ValueError(f"{len(seeds)} seeds for {count} prompts")
        return list(seeds)
    if sampling.seed is None:
        return [None] * count
    return [request_seed(sampling.seed, i) for i in range(count)]


def _request_budgets(sampling: SamplingParams, max_new_tokens: list[int] | None, count: int) -> list[int]:
    """One token budget per request: the given ``max_new_tokens`` (each at least 1), else ``sampling``'s for all."""
    if max_new_tokens is None:
        return [sampling.max_new_tokens] * count
    if len(max_new_tokens) != count:
        raise ValueError(f"{len(max_new_tokens)} token budgets for {count} prompts")
    budgets = [int(n) for n in max_new_tokens]
    if any(n < 1 for n in budgets):
        raise ValueError(f"every max_new_tokens must be at least 1, got {min(budgets)}")
    return budgets
