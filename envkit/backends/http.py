"""The multi-server HTTP client every remote backend shares (:class:`HTTPBackend`), and token-id backends over it
(:class:`TokenHTTPBackend`).

:class:`HTTPBackend` knows nothing of a wire format. It owns what every remote backend needs: a pooled
``httpx.AsyncClient`` per event loop, at most ``max_concurrency`` requests in flight, routing over several base URLs
(fewest in flight, round robin on ties, a server that just failed cools down), retries with jittered backoff on
another server, a deadline per request, and :attr:`~HTTPBackend.stats`. A wire format is a thin subclass: it says
which path to POST, the JSON body of one request and how to read the reply (:class:`~envkit.backends.OpenAIBackend`:
``/v1/completions``; :class:`~envkit.backends.SGLangBackend`: ``/generate``;
:class:`~envkit.backends.ChatCompletionsBackend`: ``/v1/chat/completions``). A reply parser raises :class:`Retryable`
for a failure worth another attempt and :class:`~envkit.backends.BackendError` for one that is not.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from envkit.backends.base import (
    BackendError,
    Generation,
    GenerationTimeout,
    SamplingParams,
    request_budgets,
    request_seeds,
)
from envkit.backends.registry import BackendOptions
from envkit.util.background import DeadlinePassed, run_blocking, within
from envkit.util.text import one_line

__all__ = ["HTTPBackend", "Retryable", "TokenHTTPBackend", "parse_base_urls"]

T = TypeVar("T")

COOLDOWN_CAP_S = 30.0
"""The longest a failing server is passed over."""


class Retryable(Exception):
    """An attempt failed in a way worth retrying, preferably on another server (a connection error, a timeout, HTTP
    5xx or 429). Raise it from a reply parser for a reply that says the same (e.g. a server that aborted the request
    while restarting); raise :class:`~envkit.backends.BackendError` for one that another attempt would not fix."""


@dataclass
class _LoopState:
    """The connection pool and the in-flight cap of one event loop (both are bound to it)."""

    client: Any
    semaphore: asyncio.Semaphore
    lifetime: AsyncIterator[None]


async def _close_when_the_loop_ends(client: Any, forget: Callable[[], None]) -> AsyncIterator[None]:
    """An async generator that closes ``client`` (and forgets the loop's state) when the loop finalizes it:
    ``asyncio.run`` calls ``loop.shutdown_asyncgens()`` before closing the loop, so the pool never outlives it."""
    try:
        yield
    finally:
        forget()
        await client.aclose()


def parse_base_urls(base_url: str | Sequence[str]) -> list[str]:
    """Base URLs from one URL, a comma-separated string or a list of either; ``/v1`` and trailing ``/`` dropped.

    Raises ``ValueError`` when there is none, or one does not start with ``http://`` or ``https://``.
    """
    items = [base_url] if isinstance(base_url, str) else list(base_url)
    urls: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"a base URL must be a string, not {item!r}")
        for part in item.split(","):
            url = part.strip().rstrip("/")
            if url.endswith("/v1"):
                url = url[: -len("/v1")]
            if not url:
                continue
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"not an http(s) URL: {part.strip()!r} (e.g. http://127.0.0.1:8000)")
            if url not in urls:
                urls.append(url)
    if not urls:
        raise ValueError("no base URL given (e.g. http://127.0.0.1:8000)")
    return urls


class HTTPBackend:
    """Requests to one or several HTTP servers: routing, cooldowns, retries, deadlines, concurrency slots, stats.

    Requests go through one pooled ``httpx.AsyncClient`` per event loop (made on first use in that loop and closed
    when ``asyncio.run`` ends it), at most ``max_concurrency`` in flight in all.

    Several servers: ``base_url`` may be a list of base URLs or a comma-separated string. Each request goes to the
    server with the fewest requests in flight (ties: round robin); a server that just failed is passed over for a
    short cooldown (``backoff_s × 2^k`` after its k+1-th failure in a row, at most 30 s) while another is available.

    Retries: a request that fails with a connection error, a timeout, HTTP 5xx or 429 (or whose reply the subclass
    finds :class:`Retryable`) is retried up to ``retries`` times, after a jittered backoff (between half and all of
    ``backoff_s × 2^n`` before retry n+1), on a server it has not tried yet when there is one. Any other HTTP error
    (4xx) raises :class:`~envkit.backends.BackendError` at once with the server's message. After the last attempt
    :class:`~envkit.backends.BackendError` names the servers tried and the last error.

    A subclass sets :attr:`check_path` and sends requests with :meth:`send`.

    Args:
        base_url: ``http://host:port`` (a trailing ``/v1`` is dropped), a comma-separated list, or a list.
        model: The model name the server knows (sent by wire formats that name one).
        api_key: Sent as ``Authorization: Bearer …`` when set.
        timeout_s: Read timeout of one request (connecting times out after ``min(timeout_s, connect_timeout_s)``).
        max_concurrency: Requests in flight at once, over all servers (also the connection-pool size).
        max_model_len: The model's context length, when known (caps the rollout engine's episode length).
        retries: Further attempts after a retryable failure (default 2: three attempts in all).
        backoff_s: Base of the exponential backoff between attempts.
        connect_timeout_s: Cap on the time to open a connection.

    Attributes:
        stats: Per base URL, counters since construction: ``requests`` (requests sent there, every attempt counted),
            ``retries`` (those of them that retried a request which had failed before) and ``failures`` (those that
            failed: connection error, timeout or an HTTP error).
    """

    check_path: ClassVar[str] = "/v1/models"
    """What :meth:`check` GETs on every server (a path only this kind of server answers, when there is one)."""
    what: ClassVar[str] = "request"
    """What one request is called in messages (``"completion request"``)."""

    def __init__(
        self,
        base_url: str | Sequence[str],
        model: str,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        max_concurrency: int = 64,
        max_model_len: int | None = None,
        *,
        retries: int = 2,
        backoff_s: float = 0.5,
        connect_timeout_s: float = 10.0,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        if retries < 0 or backoff_s < 0:
            raise ValueError("retries and backoff_s must not be negative")
        self.base_urls: list[str] = parse_base_urls(base_url)
        self.model = model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.max_concurrency = max_concurrency
        self.max_model_len = max_model_len
        self.retries = retries
        self.backoff_s = backoff_s
        self.connect_timeout_s = connect_timeout_s
        self.stats: dict[str, dict[str, int]] = {
            url: {"requests": 0, "retries": 0, "failures": 0} for url in self.base_urls
        }
        self._lock = threading.Lock()
        self._in_flight = dict.fromkeys(self.base_urls, 0)
        self._failed_in_a_row = dict.fromkeys(self.base_urls, 0)
        self._cooldown_until = dict.fromkeys(self.base_urls, 0.0)
        self._next = 0  # round-robin position
        self._states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = weakref.WeakKeyDictionary()

    @classmethod
    def from_options(cls, options: BackendOptions) -> HTTPBackend:
        """A backend for ``options.base_urls`` and the model they serve (``options.served_model_name``, else
        ``options.model``), with ``options.api_key`` (``envkit eval --backend NAME --base-url …``)."""
        if not options.base_urls:
            raise ValueError(f"{cls.__name__} needs at least one base URL (e.g. http://127.0.0.1:8000)")
        return cls(options.base_urls, options.served_model_name or options.model, api_key=options.api_key)

    @property
    def base_url(self) -> str:
        """The base URLs, comma-separated (a single URL when there is one)."""
        return ",".join(self.base_urls)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r}, model={self.model!r})"

    # ---- checking --------------------------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise :class:`~envkit.backends.BackendError` unless every server answers ``GET`` :attr:`check_path`; the
        message names each one that does not (one line)."""
        import httpx

        problems = []
        with httpx.Client(timeout=min(10.0, self.timeout_s), headers=self.headers()) as client:
            for url in self.base_urls:
                try:
                    reply = client.get(url + self.check_path)
                except httpx.HTTPError as error:
                    problems.append(f"the server at {url} does not answer: {describe(error)}")
                    continue
                if reply.status_code >= 400:
                    problems.append(
                        f"the server at {url} does not answer: GET {self.check_path} → HTTP {reply.status_code}: "
                        f"{detail(reply)}"
                    )
        if problems:
            raise BackendError("; ".join(problems))

    # ---- sending ---------------------------------------------------------------------------------------------------
    async def send(
        self,
        path: str,
        body: dict[str, Any],
        parse: Callable[[Any, str], T],
        *,
        model: str | None = None,
        timeout_s: float | None = None,
    ) -> T:
        """POST ``body`` to ``path`` on a server until one answers it (routed and retried as the class describes);
        ``parse(reply_json, url)`` reads the reply.

        Args:
            path: The path under the base URL (``"/v1/completions"``).
            body: The JSON body (the same on every attempt).
            parse: Reads a decoded JSON reply; raises :class:`Retryable` or :class:`~envkit.backends.BackendError`.
            model: What :meth:`candidates` narrows the servers by (None: any server).
            timeout_s: Deadline of the request, retries included, from when it gets one of the ``max_concurrency``
                slots (time queued behind other requests does not count); past it
                :class:`~envkit.backends.GenerationTimeout`.
        """
        state = await self._loop_state()
        async with state.semaphore:
            if timeout_s is None:
                return await self._attempts(state, path, body, parse, model)
            try:
                return await within(self._attempts(state, path, body, parse, model), timeout_s)
            except DeadlinePassed:
                raise GenerationTimeout(
                    f"generation took longer than {timeout_s:g}s (no answer from {self.base_url}: a hung server?)"
                ) from None

    async def _attempts(
        self, state: _LoopState, path: str, body: dict[str, Any], parse: Callable[[Any, str], T], model: str | None
    ) -> T:
        """Send ``body`` until a server answers it, at most ``retries + 1`` times."""
        tried: dict[str, int] = {}
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1) * random.uniform(0.5, 1.0))
            url = self._route(tried, retry=attempt > 0, model=model)
            tried[url] = tried.get(url, 0) + 1
            try:
                result = parse(await self._post(state.client, url, path, body), url)
            except Retryable as error:
                self._finished(url, "down")
                last = f"{url}: {error}"
                continue
            except BackendError:
                self._finished(url, "error")
                raise
            except BaseException:  # cancelled: says nothing about the server
                self._finished(url, "cancelled")
                raise
            self._finished(url, "ok")
            return result
        attempts = self.retries + 1
        raise BackendError(
            f"{self.what} failed {attempts} time{'s' if attempts > 1 else ''} "
            f"(tried {', '.join(tried)}); last error: {last}"
        )

    async def aclose(self) -> None:
        """Close this event loop's connection pool now (``asyncio.run`` closes it by itself at the end)."""
        with self._lock:
            state = self._states.get(asyncio.get_running_loop())
        if state is not None:
            await state.lifetime.aclose()

    def close(self) -> None:
        """Nothing to release: every event loop's pool closes when the loop ends (a backend's ``close``, for
        callers that close whatever backend they made)."""

    # ---- what a subclass may narrow --------------------------------------------------------------------------------
    def headers(self) -> dict[str, str]:
        """The headers of every request (``Authorization`` when there is an ``api_key``)."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def candidates(self, model: str | None) -> list[str]:
        """The servers a request for ``model`` may go to: all of them (a subclass that serves different models on
        different servers narrows it). Called under the routing lock; never empty."""
        return self.base_urls

    # ---- internals -------------------------------------------------------------------------------------------------
    async def _loop_state(self) -> _LoopState:
        """This loop's client and semaphore, made on first use: a client is never used outside its own loop."""
        loop = asyncio.get_running_loop()
        with self._lock:
            state = self._states.get(loop)
        if state is None:
            import httpx

            client = httpx.AsyncClient(
                headers=self.headers(),
                timeout=httpx.Timeout(self.timeout_s, connect=min(self.timeout_s, self.connect_timeout_s), pool=None),
                limits=httpx.Limits(
                    max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency
                ),
            )

            def forget() -> None:
                with self._lock:
                    if self._states.get(loop) is state:
                        del self._states[loop]

            state = _LoopState(
                client, asyncio.Semaphore(self.max_concurrency), _close_when_the_loop_ends(client, forget)
            )
            with self._lock:
                self._states[loop] = state
            await state.lifetime.__anext__()  # registers the generator with this loop (it runs to its yield)
        return state

    def _route(self, tried: dict[str, int], *, retry: bool, model: str | None = None) -> str:
        """The server for the next attempt: one of :meth:`candidates`, untried by this request, not cooling down,
        fewest in flight, in turn."""
        with self._lock:
            now = time.monotonic()
            count = len(self.base_urls)
            allowed = set(self.candidates(model))
            order = [self.base_urls[(self._next + i) % count] for i in range(count)]
            order = [u for u in order if u in allowed]
            url = min(order, key=lambda u: (tried.get(u, 0), self._cooldown_until[u] > now, self._in_flight[u]))
            self._next = (self.base_urls.index(url) + 1) % count
            self._in_flight[url] += 1
            self.stats[url]["requests"] += 1
            if retry:
                self.stats[url]["retries"] += 1
            return url

    def _finished(self, url: str, outcome: str) -> None:
        """Book an attempt's end: ``"ok"``, ``"error"`` (the server answered with an error), ``"down"`` (a
        retryable failure: the server cools down) or ``"cancelled"``."""
        with self._lock:
            self._in_flight[url] -= 1
            if outcome in ("error", "down"):
                self.stats[url]["failures"] += 1
            if outcome == "down":
                self._failed_in_a_row[url] += 1
                cooldown = self.backoff_s * 2 ** min(self._failed_in_a_row[url] - 1, 16)
                self._cooldown_until[url] = time.monotonic() + min(COOLDOWN_CAP_S, cooldown)
            elif outcome in ("ok", "error"):  # it answered
                self._failed_in_a_row[url] = 0
                self._cooldown_until[url] = 0.0

    async def _post(self, client: Any, url: str, path: str, body: dict[str, Any]) -> Any:
        """One attempt: the decoded JSON reply; :class:`Retryable` or :class:`~envkit.backends.BackendError` when it
        fails."""
        import httpx

        try:
            reply = await client.post(url + path, json=body)
        except httpx.TransportError as error:  # connecting, reading, writing, timeouts, broken connections
            raise Retryable(describe(error)) from None
        if reply.status_code == 429 or reply.status_code >= 500:
            raise Retryable(f"HTTP {reply.status_code}: {detail(reply)}")
        if reply.status_code >= 400:
            raise BackendError(f"POST {url}{path} → HTTP {reply.status_code}: {detail(reply)}")
        try:
            return reply.json()
        except ValueError:
            raise BackendError(f"unexpected reply from {url}{path}: not JSON: {one_line(reply.text, 300)!r}") from None


class TokenHTTPBackend(HTTPBackend, ABC):
    """A token-in/token-out :class:`HTTPBackend`: token-id prompts in, :class:`~envkit.backends.Generation` out.

    One request per prompt: :meth:`agenerate` sends one (the rollout engine awaits it per episode, so each episode's
    turn reaches the server as soon as it is ready and the server batches continuously); :meth:`generate` sends a
    batch's requests concurrently. A wire format sets :attr:`generate_path` and implements :meth:`request_body` and
    :meth:`parse_generation`; the constructor's arguments are :class:`HTTPBackend`'s.
    """

    generate_path: ClassVar[str]
    """Where generation requests are POSTed (``"/v1/completions"``)."""
    what: ClassVar[str] = "completion request"

    @abstractmethod
    def request_body(self, prompt: list[int], sampling: SamplingParams, seed: int | None) -> dict[str, Any]:
        """The JSON body of one request: ``prompt``'s token ids, every knob of ``sampling``, ``seed`` when set."""

    @abstractmethod
    def parse_generation(self, reply: Any, url: str) -> Generation:
        """The :class:`~envkit.backends.Generation` in a decoded reply from ``url``; raises
        :class:`~envkit.backends.BackendError` (or :class:`Retryable`) for a reply it cannot use."""

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        *,
        seeds: list[int] | None = None,
        max_new_tokens: list[int] | None = None,
    ) -> list[Generation]:
        """Concurrent requests (each with its own seed and, given ``max_new_tokens``, its own token budget), results
        in prompt order.

        Runs :meth:`agenerate` for every prompt on a private event loop (``asyncio.run``; in a helper thread when
        this thread already runs a loop), so it works from any thread.
        """
        if not prompts:
            return []
        seeds_ = request_seeds(sampling, seeds, len(prompts))
        budgets = request_budgets(sampling, max_new_tokens, len(prompts))

        async def everything() -> list[Generation]:
            return list(
                await asyncio.gather(
                    *(
                        self.agenerate(p, dataclasses.replace(sampling, max_new_tokens=n), s)
                        for p, s, n in zip(prompts, seeds_, budgets, strict=True)
                    )
                )
            )

        return run_blocking(everything())

    async def agenerate(
        self, prompt: list[int], sampling: SamplingParams, seed: int | None = None, *, timeout_s: float | None = None
    ) -> Generation:
        """One request for one token-id prompt (routed and retried as :class:`HTTPBackend` describes).

        ``timeout_s``: deadline of the request, retries included, from when it gets one of the ``max_concurrency``
        slots (time queued behind other requests does not count); past it
        :class:`~envkit.backends.GenerationTimeout`.
        """
        body = self.request_body(prompt, sampling, seed)
        return await self.send(
            self.generate_path, body, self.parse_generation, model=body.get("model"), timeout_s=timeout_s
        )


def describe(error: BaseException) -> str:
    """An httpx error in one line (some carry no message of their own)."""
    text = one_line(str(error))
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def detail(reply: Any) -> str:
    """The server's error message from an HTTP error reply, in one line."""
    try:
        payload = reply.json()
    except ValueError:
        payload = None
    message = None
    if isinstance(payload, dict):
        error = payload.get("error")
        message = error.get("message") if isinstance(error, dict) else error
        message = message or payload.get("message") or payload.get("detail")
    return one_line(message if message else reply.text, 500)
