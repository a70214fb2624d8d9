"""Generation through OpenAI-compatible ``/v1/completions`` servers (:class:`OpenAIBackend`), over httpx.

One request per prompt, sent as soon as its episode is ready (the rollout engine awaits :meth:`OpenAIBackend.agenerate`
per episode), so the server batches continuously. With several servers each request goes to the one with the fewest
requests in flight; a request that fails on a connection error, a timeout, HTTP 5xx or 429 is retried with backoff,
preferably on another server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from envkit.backends.base import (
    BackendError,
    Generation,
    GenerationTimeout,
    SamplingParams,
    _request_budgets,
    _request_seeds,
    finish_reason,
)
from envkit.util.background import DeadlinePassed, run_blocking, within

T = TypeVar("T")

_COOLDOWN_CAP_S = 30.0


class _Retryable(Exception):
    """Internal: an attempt failed in a way worth retrying (connection, timeout, HTTP 5xx or 429)."""


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


class OpenAIBackend:
    """Generate through OpenAI-compatible ``/v1/completions`` endpoints with token-id prompts.

    Works with vLLM's server (``python -m vllm.entrypoints.openai.api_server``) and ``envkit serve``. Prompts are sent
    as token ids; token ids come back through vLLM's ``return_token_ids`` (or ``token_id:N`` logprob tokens).

    Requests go through one pooled ``httpx.AsyncClient`` per event loop (made on first use in that loop and closed
    when ``asyncio.run`` ends it), at most ``max_concurrency`` in flight in all. :meth:`agenerate` sends one request;
    the rollout engine calls it per episode, so each episode's turn reaches the server as soon as it is ready.

    Several servers: ``base_url`` may be a list of base URLs or a comma-separated string. Each request goes to the
    server with the fewest requests in flight (ties: round robin); a server that just failed is passed over for a
    short cooldown (``backoff_s × 2^k`` after its k+1-th failure in a row, at most 30 s) while another is available.

    Retries: a request that fails with a connection error, a timeout, HTTP 5xx or 429 is retried up to ``retries``
    times, after a jittered backoff (between half and all of ``backoff_s × 2^n`` before retry n+1), on a server it
    has not tried yet when there is one. Any other HTTP error (4xx) raises :class:`BackendError` at once with the
    server's message. After the last attempt :class:`BackendError` names the servers tried and the last error.

    Args:
        base_url: ``http://host:port`` (a trailing ``/v1`` is dropped), a comma-separated list, or a list.
        model: The model name the server knows.
        api_key: Sent as ``Authorization: Bearer …`` when set.
        timeout_s: Read timeout of one request (connecting times out after ``min(timeout_s, connect_timeout_s)``).
        max_concurrency: Requests in flight at once, over all servers (also the connection-pool size).
        max_model_len: The model's context length, when known (caps the rollout engine's episode length).
        retries: Further attempts after a retryable failure (default 2: three attempts in all).
        backoff_s: Base of the exponential backoff between attempts.
        connect_timeout_s: Cap on the time to open a connection.

    Attributes:
        stats: Per base URL, counters since construction: ``requests`` (completion requests sent there, every attempt
            counted), ``retries`` (those of them that retried a request which had failed before) and ``failures``
            (those that failed: connection error, timeout or an HTTP error).
    """

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

    @property
    def base_url(self) -> str:
        """The base URLs, comma-separated (a single URL when there is one)."""
        return ",".join(self.base_urls)

    def __repr__(self) -> str:
        return f"OpenAIBackend(base_url={self.base_url!r}, model={self.model!r})"

    # ---- checking --------------------------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise :class:`BackendError` unless every server answers ``GET /v1/models``; the message names each one
        that does not (one line)."""
        import httpx

        problems = []
        with httpx.Client(timeout=min(10.0, self.timeout_s), headers=self._headers()) as client:
            for url in self.base_urls:
                try:
                    reply = client.get(url + "/v1/models")
                except httpx.HTTPError as error:
                    problems.append(f"the server at {url} does not answer: {_describe(error)}")
                    continue
                if reply.status_code >= 400:
                    problems.append(
                        f"the server at {url} does not answer: GET /v1/models → HTTP {reply.status_code}: "
                        f"{_detail(reply)}"
                    )
        if problems:
            raise BackendError("; ".join(problems))

    # ---- generating ------------------------------------------------------------------------------------------------
    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        *,
        seeds: list[int] | None = None,
        max_new_tokens: list[int] | None = None,
    ) -> list[Generation]:
        """Concurrent completion requests (each with its own seed and, given ``max_new_tokens``, its own token
        budget), results in prompt order.

        Runs :meth:`agenerate` for every prompt on a private event loop (``asyncio.run``; in a helper thread when
        this thread already runs a loop), so it works from any thread.
        """
        if not prompts:
            return []
        request_seeds = _request_seeds(sampling, seeds, len(prompts))
        budgets = _request_budgets(sampling, max_new_tokens, len(prompts))

        async def everything() -> list[Generation]:
            return list(
                await asyncio.gather(
                    *(
                        self.agenerate(p, dataclasses.replace(sampling, max_new_tokens=n), s)
                        for p, s, n in zip(prompts, request_seeds, budgets, strict=True)
                    )
                )
            )

        return run_blocking(everything())

    async def agenerate(
        self, prompt: list[int], sampling: SamplingParams, seed: int | None = None, *, timeout_s: float | None = None
    ) -> Generation:
        """One completion request for one token-id prompt (routed, retried as the class describes).

        ``timeout_s``: deadline of the request, retries included, from when it gets one of the ``max_concurrency``
        slots (time queued behind other requests does not count); past it :class:`GenerationTimeout`.
        """
        state = await self._loop_state()
        body = self._body(prompt, sampling, seed)
        async with state.semaphore:
            if timeout_s is None:
                return await self._attempts(state, body)
            try:
                return await within(self._attempts(state, body), timeout_s)
            except DeadlinePassed:
                raise GenerationTimeout(
                    f"generation took longer than {timeout_s:g}s (no completion from {self.base_url}: a hung server?)"
                ) from None

    async def _attempts(self, state: _LoopState, body: dict[str, Any]) -> Generation:
        """Send ``body`` until a server answers it, at most ``retries + 1`` times."""
        tried: dict[str, int] = {}
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1) * random.uniform(0.5, 1.0))
            url = self._route(tried, retry=attempt > 0, model=body.get("model"))
            tried[url] = tried.get(url, 0) + 1
            try:
                generation = self._generation(await self._post(state.client, url, body), url)
            except _Retryable as error:
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
            return generation
        attempts = self.retries + 1
        raise BackendError(
            f"completion request failed {attempts} time{'s' if attempts > 1 else ''} "
            f"(tried {', '.join(tried)}); last error: {last}"
        )

    async def aclose(self) -> None:
        """Close this event loop's connection pool now (``asyncio.run`` closes it by itself at the end)."""
        with self._lock:
            state = self._states.get(asyncio.get_running_loop())
        if state is not None:
            await state.lifetime.aclose()

    # ---- internals -------------------------------------------------------------------------------------------------
    async def _loop_state(self) -> _LoopState:
        """This loop's client and semaphore, made on first use: a client is never used outside its own loop."""
        loop = asyncio.get_running_loop()
        with self._lock:
            state = self._states.get(loop)
        if state is None:
            import httpx

            client = httpx.AsyncClient(
                headers=self._headers(),
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

    def _candidates(self, model: str | None) -> list[str]:
        """The servers a request for ``model`` may go to (all of them; a subclass that serves different models on
        different servers narrows it). Called under the routing lock; never empty."""
        return self.base_urls

    def _route(self, tried: dict[str, int], *, retry: bool, model: str | None = None) -> str:
        """The server for the next attempt: one of :meth:`_candidates`, untried by this request, not cooling down,
        fewest in flight, in turn."""
        with self._lock:
            now = time.monotonic()
            count = len(self.base_urls)
            allowed = set(self._candidates(model))
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
                self._cooldown_until[url] = time.monotonic() + min(_COOLDOWN_CAP_S, cooldown)
            elif outcome in ("ok", "error"):  # it answered
                self._failed_in_a_row[url] = 0
                self._cooldown_until[url] = 0.0

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _body(self, prompt: list[int], sampling: SamplingParams, seed: int | None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": list(prompt),
            "max_tokens": sampling.max_new_tokens,
            # Every knob, neutral ones too: a vLLM server fills an omitted one from the model's generation_config.json
            # (Qwen2.5-Instruct: top_k 20, repetition_penalty 1.05), which would sample from another distribution
            # than the one the trainer models. top_k 0 is off (vLLM >= 0.8, envkit serve).
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": int(sampling.top_k or 0),
            "min_p": sampling.min_p,
            "repetition_penalty": sampling.repetition_penalty,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "skip_special_tokens": False,
        }
        if sampling.stop:
            body["stop"] = sampling.stop
        if sampling.stop_token_ids:
            body["stop_token_ids"] = list(sampling.stop_token_ids)
        if seed is not None:
            body["seed"] = seed
        return body

    async def _post(self, client: Any, url: str, body: dict[str, Any]) -> Any:
        """One attempt: the decoded JSON reply; :class:`_Retryable` or :class:`BackendError` when it fails."""
        import httpx

        try:
            reply = await client.post(url + "/v1/completions", json=body)
        except httpx.TransportError as error:  # connecting, reading, writing, timeouts, broken connections
            raise _Retryable(_describe(error)) from None
        if reply.status_code == 429 or reply.status_code >= 500:
            raise _Retryable(f"HTTP {reply.status_code}: {_detail(reply)}")
        if reply.status_code >= 400:
            raise BackendError(f"POST {url}/v1/completions → HTTP {reply.status_code}: {_detail(reply)}")
        try:
            return reply.json()
        except ValueError:
            raise BackendError(
                f"unexpected completion response from {url}: not JSON: {_one_line(reply.text)[:300]!r}"
            ) from None

    def _generation(self, response: Any, url: str) -> Generation:
        try:
            choice = response["choices"][0]
            logprobs = choice.get("logprobs") or {}
            tokens = choice.get("token_ids")
            if tokens is None:
                tokens = [int(str(t).removeprefix("token_id:")) for t in logprobs.get("tokens", [])]
            raw = list(logprobs.get("token_logprobs", []))
            missing = next((i for i, v in enumerate(raw) if v is None), None)
            values = [float(v) for v in raw if v is not None]
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
            raise BackendError(f"unexpected completion response from {url}: {error}: {response!r:.300}") from None
        # A missing logprob would have to be invented (0.0 claims probability 1): the behaviour policy's value is
        # what importance sampling divides by, so the turn fails, as when the counts differ.
        if missing is not None:
            raise BackendError(
                f"the server at {url} returned a null logprob for token {missing} of {len(tokens)} (the behaviour "
                "policy's logprob of every sampled token is needed)"
            )
        if len(values) != len(tokens):
            raise BackendError(f"the server at {url} returned {len(tokens)} tokens but {len(values)} logprobs")
        served = response.get("model") if isinstance(response, dict) else None
        reason = finish_reason(choice.get("finish_reason"))
        return Generation(list(tokens), values, reason, model=served if isinstance(served, str) else None)


def _describe(error: BaseException) -> str:
    """An httpx error in one line (some carry no message of their own)."""
    text = _one_line(str(error))
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _detail(reply: Any) -> str:
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
    return _one_line(str(message if message else reply.text))[:500]


def _one_line(text: str) -> str:
    return " ".join(text.split())
