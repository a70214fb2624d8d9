"""Unit test of :class:`envkit.adapters.trl.async_grpo.AdapterPublisher` and :class:`AdapterBackend`'s routing: which
server holds which adapter after loads that succeed or fail, where requests may go, when adapters are unloaded and
their folders deleted. The servers are fake (``httpx.MockTransport`` answering as vLLM's ``/v1/load_lora_adapter`` and
``/v1/unload_lora_adapter`` do); the real servers are in ``test_async_training.py`` (``-m vllm``)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from envkit.adapters.vllm.weights import AdapterBackend, AdapterPublisher, SyncError
from envkit.backends.base import BackendError

A, B = "http://server-a:8000", "http://server-b:8000"


class FakeServers:
    """vLLM's adapter endpoints for several servers: what each holds; ``down`` servers refuse connections, ``broken``
    ones answer a load with HTTP 500."""

    def __init__(self) -> None:
        self.held: dict[str, set[str]] = {A: set(), B: set()}
        self.down: set[str] = set()
        self.broken: set[str] = set()
        self.calls: list[tuple[str, str, str]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        url = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        body = json.loads(request.content)
        self.calls.append((url, request.url.path, body["lora_name"]))
        if url in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/v1/load_lora_adapter":
            if url in self.broken:
                return httpx.Response(500, json={"error": {"message": "engine failed", "code": 500}})
            if body["lora_name"] in self.held[url]:
                return httpx.Response(400, json={"error": {"message": "already loaded", "code": 400}})
            self.held[url].add(body["lora_name"])
            return httpx.Response(200, text="Success")
        if body["lora_name"] not in self.held[url]:
            return httpx.Response(404, json={"error": {"message": "cannot be found", "code": 404}})
        self.held[url].discard(body["lora_name"])
        return httpx.Response(200, text="Success")


@pytest.fixture
def servers() -> FakeServers:
    return FakeServers()


def _publisher(servers: FakeServers, tmp_path: Path) -> AdapterPublisher:
    return AdapterPublisher([A, B], tmp_path / "adapters", run_id="r1", transport=httpx.MockTransport(servers))


def _save(publisher: AdapterPublisher, version: int) -> None:
    path = publisher.path(version)
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text("{}")


def _publish(publisher: AdapterPublisher, version: int) -> dict:
    _save(publisher, version)
    return publisher.publish(version)


def test_names_and_versions_are_the_runs_own(tmp_path, servers):
    publisher = _publisher(servers, tmp_path)
    assert publisher.name(3) == "envkit-r1-v3" and publisher.version_of("envkit-r1-v3") == 3
    assert publisher.version_of("envkit-other-v3") is None and publisher.version_of("envkit-r1-vx") is None
    assert publisher.path(3) == (tmp_path / "adapters" / "envkit-r1-v3").resolve()


def test_a_published_version_is_current_everywhere_and_the_previous_one_is_unloaded_and_deleted(tmp_path, servers):
    publisher = _publisher(servers, tmp_path)
    with pytest.raises(BackendError, match="no policy adapter"):
        publisher.acquire()  # nothing published yet: no request can be sent
    _publish(publisher, 1)
    assert servers.held == {A: {"envkit-r1-v1"}, B: {"envkit-r1-v1"}}
    assert publisher.servers_for("envkit-r1-v1") == [A, B]
    report = _publish(publisher, 2)
    assert report["failed"] == [] and report["unloaded"] == ["envkit-r1-v1"]
    assert servers.held == {A: {"envkit-r1-v2"}, B: {"envkit-r1-v2"}}
    assert not publisher.path(1).exists() and publisher.path(2).exists()


def test_an_adapter_in_use_stays_loaded_until_its_last_request_ends(tmp_path, servers):
    publisher = _publisher(servers, tmp_path)
    _publish(publisher, 1)
    name = publisher.acquire()
    assert name == "envkit-r1-v1"
    assert _publish(publisher, 2)["unloaded"] == []  # a request still samples from v1
    assert servers.held[A] == {"envkit-r1-v1", "envkit-r1-v2"}
    assert publisher.acquire() == "envkit-r1-v2"  # new requests name the new version
    publisher.release("envkit-r1-v2")
    publisher.release(name)
    assert publisher.unload_unused() == ["envkit-r1-v1"]
    assert servers.held == {A: {"envkit-r1-v2"}, B: {"envkit-r1-v2"}}
    assert not publisher.path(1).exists()


def test_a_server_whose_load_failed_gets_no_request_until_a_later_sync_succeeds_there(tmp_path, servers):
    publisher = _publisher(servers, tmp_path)
    backend = AdapterBackend(publisher)
    _publish(publisher, 1)
    servers.broken.add(B)
    report = _publish(publisher, 2)
    assert len(report["failed"]) == 1 and report["failed"][0].startswith(B) and "HTTP 500" in report["failed"][0]
    assert publisher.servers_for("envkit-r1-v2") == [A]
    assert publisher.servers[B].last_error is not None and publisher.load_failures == 1
    # B no longer serves v1 either (unloaded: not current, unused), so it serves nothing: every request goes to A
    assert servers.held[B] == set()
    routed = {backend._route({}, retry=False, model="envkit-r1-v2") for _ in range(6)}
    for url in routed:
        backend._finished(url, "ok")
    assert routed == {A}
    servers.broken.clear()
    _publish(publisher, 3)
    assert publisher.servers_for("envkit-r1-v3") == [A, B] and publisher.servers[B].last_error is None
    routed = {backend._route({}, retry=False, model="envkit-r1-v3") for _ in range(6)}
    assert routed == {A, B}


def test_a_sync_no_server_can_take_raises_and_keeps_the_previous_version(tmp_path, servers):
    publisher = _publisher(servers, tmp_path)
    _publish(publisher, 1)
    servers.down.update({A, B})
    with pytest.raises(SyncError, match="no vLLM server could load policy v2"):
        _publish(publisher, 2)
    assert publisher.version == 1 and publisher.servers_for("envkit-r1-v1") == [A, B]


def test_a_request_waits_for_a_server_with_the_current_adapter_and_fails_in_one_line_without(tmp_path, servers):
    import asyncio

    from envkit.backends import SamplingParams

    publisher = _publisher(servers, tmp_path)
    servers.broken.add(B)
    _publish(publisher, 1)
    with publisher._lock:  # A lost it too (e.g. restarted): no server holds the current adapter
        publisher.servers[A].loaded.clear()
    backend = AdapterBackend(publisher, wait_s=0.3)
    with pytest.raises(BackendError, match="no vLLM server holds the current policy adapter envkit-r1-v1"):
        asyncio.run(backend.agenerate([1, 2], SamplingParams(max_new_tokens=2)))
    assert publisher._uses["envkit-r1-v1"] == 0  # the failed wait released what it acquired


def test_close_unloads_everything_the_run_loaded_and_deletes_its_folders(tmp_path, servers):
    publisher = _publisher(servers, tmp_path)
    _publish(publisher, 1)
    publisher.acquire()
    _publish(publisher, 2)  # v1 still in use: both loaded
    servers.held[A].add("someone-elses")
    publisher.close()
    assert servers.held == {A: {"someone-elses"}, B: set()}
    assert list((tmp_path / "adapters").iterdir()) == [] and publisher.version is None


def test_timeline_overlap_counts_only_the_time_both_were_busy():
    from envkit.adapters.vllm.timeline import Activity, overlap

    generation, training = Activity(), Activity()
    generation.intervals = [(0.0, 4.0), (6.0, 9.0)]
    training.intervals = [(3.0, 7.0), (8.5, 12.0)]
    result = overlap(generation, training, 0.0, 10.0)
    assert result["both_s"] == pytest.approx(1.0 + 1.0 + 0.5)
    assert result["generation_s"] == pytest.approx(7.0) and result["training_s"] == pytest.approx(5.5)
    assert result["fraction"] == pytest.approx(0.25)
    nested = Activity()  # two requests at once are one busy interval
    nested.enter()
    nested.enter()
    nested.exit()
    assert nested.intervals == []
    nested.exit()
    assert len(nested.intervals) == 1
