"""Backends for tests and benchmarks: scripted replies, a recorder, and faults on demand.

* :class:`ScriptedBackend` — answers each prompt with a scripted reply: one text or token-id list for every prompt, or
  a function of the :class:`ScriptedRequest` (its prompt ids and text, sampling, seed, token budget). A text or
  token-id reply is cut like a model's output: after the first of ``sampling.stop_token_ids``, else at the request's
  budget (``finish_reason="length"``); a :class:`~envkit.backends.Generation` reply is returned exactly as given (to
  hand the engine what no well-behaved backend would).
* :class:`RecordingBackend` — wraps any backend and keeps every call: prompts, sampling, seeds, token budgets, the
  generations or the error, the time spent, and how many calls ran at once.
* :class:`FaultyBackend` — wraps any backend with the faults of real ones: prompts that break the batch they are in,
  calls that fail, slow calls, calls that hang until released.

They compose, outermost first: ``RecordingBackend(FaultyBackend(ScriptedBackend("Done.<|im_end|>", tokenizer=tok),
delay_s=0.5))`` records slow calls of a scripted model. Each is a :class:`~envkit.backends.base.Backend` (``generate``
with ``seeds=`` and ``max_new_tokens=``) and nothing more: no ``agenerate``, so the engine drives them through its
micro-batcher; a wrapper shows its inner backend's context length (:class:`~envkit.backends.base.HasContextLength`).
"""

from __future__ import annotations

import copy
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from envkit.backends.base import (
    Backend,
    BackendError,
    Generation,
    HasContextLength,
    SamplingParams,
    request_budgets,
    request_seeds,
)

__all__ = ["FaultyBackend", "RecordedCall", "RecordingBackend", "Reply", "ScriptedBackend", "ScriptedRequest"]

Reply = str | Sequence[int] | Generation
"""What a script gives for one prompt: text (encoded with the backend's tokenizer), token ids, or a
:class:`~envkit.backends.Generation` returned as is."""


@dataclass
class ScriptedRequest:
    """One prompt of a ``generate`` call, as a script or a fault sees it."""

    ids: list[int]
    """The prompt's token ids."""
    sampling: SamplingParams
    """The call's sampling settings."""
    seed: int | None
    """This prompt's sampling seed (given, or derived from ``sampling.seed``; ``None``: unseeded)."""
    max_new_tokens: int
    """This prompt's token budget."""
    index: int
    """The prompt's position in its call."""
    call: int
    """Which call of the backend this is (1 for the first)."""
    tokenizer: Any = field(default=None, repr=False)

    @property
    def text(self) -> str:
        """The prompt decoded, special tokens kept (needs the backend's ``tokenizer=``)."""
        if self.tokenizer is None:
            raise ValueError("decoding a prompt needs a tokenizer: pass tokenizer= to the scripted/faulty backend")
        return self.tokenizer.decode(self.ids, skip_special_tokens=False)


def _requests(
    prompts: list[list[int]],
    sampling: SamplingParams,
    seeds: list[int] | None,
    max_new_tokens: list[int] | None,
    call: int,
    tokenizer: Any,
) -> list[ScriptedRequest]:
    count = len(prompts)
    row_seeds, budgets = request_seeds(sampling, seeds, count), request_budgets(sampling, max_new_tokens, count)
    rows = zip(prompts, row_seeds, budgets, strict=True)
    return [
        ScriptedRequest(list(prompt), sampling, seed, budget, index, call, tokenizer)
        for index, (prompt, seed, budget) in enumerate(rows)
    ]


class ScriptedBackend:
    """A backend whose replies are scripted: the same for every prompt, or a function of each prompt.

    Args:
        replies: The reply to every prompt (text, token ids, or a :class:`~envkit.backends.Generation`), or a function
            ``replies(request: ScriptedRequest) -> Reply`` called once per prompt, in batch order (it may raise: the
            whole call raises, as a batch backend does on a prompt that breaks it).
        tokenizer: Encodes text replies (``add_special_tokens=False``: write the end-of-turn token, e.g.
            ``"Done.<|im_end|>"``) and decodes ``request.text``.
        logprob: The logprob of every token of a text or token-id reply.

    A text or token-id reply is the model's whole continuation, cut as a model backend cuts it: just after the first
    token in ``sampling.stop_token_ids`` (``"stop"``), else at the request's token budget (``"length"``), else
    ``"stop"`` (a stop string ended it). Stop strings (``sampling.stop``) are not searched.
    """

    def __init__(
        self,
        replies: Reply | Callable[[ScriptedRequest], Reply],
        *,
        tokenizer: Any = None,
        logprob: float = -1.0,
    ) -> None:
        self.replies = replies
        self.tokenizer = tokenizer
        self.logprob = float(logprob)
        self.calls = 0
        """How many times ``generate`` was called."""
        self._lock = threading.Lock()
        self._encoded: dict[str, list[int]] = {}
        if not callable(replies):
            self._ids_of(replies)  # a fixed reply that cannot be used fails here, not in the first episode

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        *,
        seeds: list[int] | None = None,
        max_new_tokens: list[int] | None = None,
    ) -> list[Generation]:
        """One scripted reply per prompt, in order."""
        with self._lock:
            self.calls += 1
            call = self.calls
        out = []
        for request in _requests(prompts, sampling, seeds, max_new_tokens, call, self.tokenizer):
            reply = self.replies(request) if callable(self.replies) else self.replies
            out.append(self._generation(reply, request))
        return out

    def _ids_of(self, reply: Reply) -> list[int] | Generation:
        if isinstance(reply, Generation):
            return reply
        if isinstance(reply, str):
            if reply not in self._encoded:
                if self.tokenizer is None:
                    raise ValueError("a text reply needs a tokenizer: ScriptedBackend(..., tokenizer=tokenizer)")
                self._encoded[reply] = list(self.tokenizer.encode(reply, add_special_tokens=False))
            return self._encoded[reply]
        if isinstance(reply, Sequence) and all(isinstance(t, int) and not isinstance(t, bool) for t in reply):
            return list(reply)
        raise TypeError(f"a scripted reply is text, token ids or a Generation, got {type(reply).__name__}: {reply!r}")

    def _generation(self, reply: Reply, request: ScriptedRequest) -> Generation:
        ids = self._ids_of(reply)
        if isinstance(ids, Generation):
            return Generation(list(ids.token_ids), list(ids.logprobs), ids.finish_reason)
        stops = set(request.sampling.stop_token_ids or ())
        end = next((i + 1 for i, token in enumerate(ids) if token in stops), None)
        if end is not None and end <= request.max_new_tokens:
            tokens, reason = ids[:end], "stop"
        elif len(ids) > request.max_new_tokens:
            tokens, reason = ids[: request.max_new_tokens], "length"
        else:
            tokens, reason = ids, "stop"
        return Generation(list(tokens), [self.logprob] * len(tokens), reason)


@dataclass
class RecordedCall:
    """One ``generate`` call a :class:`RecordingBackend` passed on."""

    prompts: list[list[int]]
    sampling: SamplingParams
    seeds: list[int] | None
    max_new_tokens: list[int] | None
    """The per-prompt budgets, when the engine sent them."""
    generations: list[Generation] | None = None
    """What it returned (``None`` while it runs, or when it raised)."""
    error: BaseException | None = None
    """What it raised."""
    seconds: float = 0.0
    """How long it took (0 while it runs)."""


class RecordingBackend:
    """Wraps a backend and records every ``generate`` call (a :class:`RecordedCall`, appended when the call starts).

    Args:
        inner: The backend that generates. Its ``max_model_len`` shows through (the engine checks prompts against it).
    """

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.calls: list[RecordedCall] = []
        self.inside = 0
        """Calls running now."""
        self.max_inside = 0
        """The most calls that ran at once."""
        self._lock = threading.Lock()

    @property
    def max_model_len(self) -> int | None:
        """The wrapped backend's context length (``None`` when it has none)."""
        return self.inner.max_model_len if isinstance(self.inner, HasContextLength) else None

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        *,
        seeds: list[int] | None = None,
        max_new_tokens: list[int] | None = None,
    ) -> list[Generation]:
        """The wrapped backend's generations, recorded."""
        record = RecordedCall(
            [list(p) for p in prompts],
            sampling,
            None if seeds is None else list(seeds),
            None if max_new_tokens is None else list(max_new_tokens),
        )
        with self._lock:
            self.calls.append(record)
            self.inside += 1
            self.max_inside = max(self.max_inside, self.inside)
        start = time.perf_counter()
        try:
            record.generations = self.inner.generate(prompts, sampling, seeds=seeds, max_new_tokens=max_new_tokens)
        except BaseException as error:
            record.error = error
            raise
        finally:
            record.seconds = time.perf_counter() - start
            with self._lock:
                self.inside -= 1
        return record.generations

    @property
    def prompts(self) -> list[list[int]]:
        """Every prompt asked for, in call order."""
        return [p for call in list(self.calls) for p in call.prompts]

    @property
    def batch_sizes(self) -> list[int]:
        """How many prompts each call held."""
        return [len(call.prompts) for call in list(self.calls)]

    @property
    def seeds(self) -> list[int | None]:
        """The seed sent with every prompt, in call order (``None`` where a call had none)."""
        return [s for call in list(self.calls) for s in (call.seeds or [None] * len(call.prompts))]

    @property
    def seconds(self) -> float:
        """Time spent in the wrapped backend, all calls together."""
        return sum(call.seconds for call in list(self.calls))

    @property
    def tokens(self) -> int:
        """Tokens generated, all calls together."""
        return sum(len(g.token_ids) for call in list(self.calls) for g in call.generations or ())

    def reset(self) -> None:
        """Forget the calls recorded so far."""
        with self._lock:
            self.calls = []
            self.max_inside = self.inside

    def wait_idle(self, limit_s: float = 10.0) -> bool:
        """Wait until no call runs (an abandoned call may still be running); whether none does."""
        deadline = time.monotonic() + limit_s
        while self.inside and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self.inside


class FaultyBackend:
    """Wraps a backend with the faults of real ones, checked in this order on every call:

    Args:
        inner: The backend that generates when no fault strikes (its ``max_model_len`` shows through).
        hang_calls: The first ``hang_calls`` calls (``math.inf``: all) block until :meth:`release` is called: a
            deadlocked engine, a server that stopped answering. They run on the engine's daemon threads, so an
            unreleased one never blocks the interpreter's exit.
        delay_s: Every call sleeps this long first (a slow backend).
        first_delay_s: The first call sleeps this long instead (``None``: ``delay_s``).
        fail_calls: The first ``fail_calls`` calls (``math.inf``: all) raise a copy of ``error`` (a restarting
            server, a dead engine).
        error: What those calls raise (default ``BackendError``).
        fail_if: ``fail_if(request) -> exception or None``, per prompt: the call raises the first exception returned
            (a prompt that breaks the batch it is in, e.g. a device-side assert).
        tokenizer: Decodes ``request.text`` for ``fail_if``.
    """

    def __init__(
        self,
        inner: Backend,
        *,
        hang_calls: float = 0,
        delay_s: float = 0.0,
        first_delay_s: float | None = None,
        fail_calls: float = 0,
        error: BaseException | None = None,
        fail_if: Callable[[ScriptedRequest], BaseException | None] | None = None,
        tokenizer: Any = None,
    ) -> None:
        self.inner = inner
        self.hang_calls = hang_calls
        self.delay_s = float(delay_s)
        self.first_delay_s = first_delay_s
        self.fail_calls = fail_calls
        self.error = error if error is not None else BackendError("FaultyBackend: this call fails as scripted")
        self.fail_if = fail_if
        self.tokenizer = tokenizer
        self.calls = 0
        """How many times ``generate`` was called (faulty calls included)."""
        self.released = threading.Event()
        """Set by :meth:`release`: hung calls go on."""
        self._lock = threading.Lock()
        for name, value in (("hang_calls", hang_calls), ("fail_calls", fail_calls)):
            if value < 0 or (value != math.inf and value != int(value)):
                raise ValueError(f"{name} is a whole number of calls or math.inf, got {value!r}")

    @property
    def max_model_len(self) -> int | None:
        """The wrapped backend's context length (``None`` when it has none)."""
        return self.inner.max_model_len if isinstance(self.inner, HasContextLength) else None

    def release(self) -> None:
        """Let hung calls (and later ones that would hang) go on."""
        self.released.set()

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        *,
        seeds: list[int] | None = None,
        max_new_tokens: list[int] | None = None,
    ) -> list[Generation]:
        """The wrapped backend's generations, unless a fault strikes this call."""
        with self._lock:
            self.calls += 1
            call = self.calls
        if call <= self.hang_calls:
            self.released.wait()
        delay = self.first_delay_s if call == 1 and self.first_delay_s is not None else self.delay_s
        if delay > 0:
            time.sleep(delay)
        if call <= self.fail_calls:
            raise copy.copy(self.error)
        if self.fail_if is not None:
            for request in _requests(prompts, sampling, seeds, max_new_tokens, call, self.tokenizer):
                error = self.fail_if(request)
                if error is not None:
                    raise error
        return self.inner.generate(prompts, sampling, seeds=seeds, max_new_tokens=max_new_tokens)
