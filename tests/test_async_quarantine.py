"""Weight sync against servers that hang or fail (:class:`envkit.adapters.trl.async_grpo.AdapterPublisher`): loads go to
every server at once, each within the short deadline; a server that keeps failing is quarantined (no load at a sync,
no request) until its ``/health`` answers, then gets the current adapter and rejoins; an adapter whose load timed out
on the client but finished on the server is unloaded once it is not current.

The servers are local stand-ins on 127.0.0.1 (real HTTP, vLLM's ``/v1/load_lora_adapter``,
``/v1/unload_lora_adapter`` and ``/health`` answers): one healthy, one that hangs (until the test releases it; what it
was asked meanwhile it then does, late), one that fails and later recovers. Unit tests of this component: the real
vLLM servers are in ``test_async_training.py`` (``-m vllm``). No wall-clock thresholds: the assertions are on the
requests each server received, the deadline each request carried and how many were in flight at once.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from envkit.adapters.vllm.weights import AdapterBackend, AdapterPublisher

DEADLINE_S = 1.0


class StandIn:
    """One stand-in vLLM server. ``mode``: ``ok``; ``hang`` (every request blocks until :meth:`release`, then is
    served as ``ok`` would: a late load really loads); ``fail`` (loads answer HTTP 500, ``/health`` 503)."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.held: set[str] = set()
        self.requests: list[tuple[str, str]] = []  # (path, adapter name or "")
        self.released = threading.Event()
        self.lock = threading.Lock()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                stand_in._serve(self, "")

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stand_in._serve(self, body["lora_name"])

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def release(self) -> None:
        self.mode = "ok"
        self.released.set()

    def loads(self) -> list[str]:
        with self.lock:
            return [name for path, name in self.requests if path == "/v1/load_lora_adapter"]

    def unloads(self) -> list[str]:
        with self.lock:
            return [name for path, name in self.requests if path == "/v1/unload_lora_adapter"]

    def _serve(self, handler: BaseHTTPRequestHandler, name: str) -> None:
        with self.lock:
            self.requests.append((handler.path, name))
        if self.mode == "hang":
            self.released.wait()
        status, text = 200, "Success"
        with self.lock:
            if handler.path == "/health":
                status = 503 if self.mode == "fail" else 200
            elif self.mode == "fail":
                status, text = 500, '{"error": "engine failed"}'
            elif handler.path == "/v1/load_lora_adapter":
                status = 400 if name in self.held else 200
                self.held.add(name)
            elif name in self.held:
                self.held.discard(name)
            else:
                status = 404
        data = text.encode()
        try:
            handler.send_response(status)
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data)
        except OSError:  # the client gave up long ago
            pass

    def stop(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


class CountingTransport(httpx.BaseTransport):
    """The real HTTP transport, counting load requests in flight at once and recording each request's deadline."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.read_deadlines: list[float] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        loading = request.url.path == "/v1/load_lora_adapter"
        with self.lock:
            self.read_deadlines.append(request.extensions["timeout"]["read"])
            if loading:
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            response = self.inner.handle_request(request)
            response.read()
            return response
        finally:
            if loading:
                with self.lock:
                    self.in_flight -= 1


@pytest.fixture
def stand_ins():
    made: list[StandIn] = []

    def make(*modes: str) -> list[StandIn]:
        servers = [StandIn(mode) for mode in modes]
        made.extend(servers)
        return servers

    yield make
    for server in made:
        server.stop()


def _save(publisher: AdapterPublisher, version: int) -> None:
    path = publisher.path(version)
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text("{}")


def _publish(publisher: AdapterPublisher, version: int) -> dict:
    _save(publisher, version)
    return publisher.publish(version)


def _until(condition: Any, what: str, limit_s: float = 60.0) -> None:
    """Wait for the publisher's background probe (a generous limit: this is not a speed assertion)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {limit_s:g}s: {what}")
        time.sleep(0.05)


def test_a_sync_loads_every_server_at_once_each_within_the_short_deadline(stand_ins, tmp_path):
    """Two hanging servers and a healthy one: the loads are in flight together (not one after another, which would
    cost one deadline per hanging server), each request carries the short deadline, the sync returns while both
    still hang, with the healthy server serving the new adapter."""
    hang1, hang2, ok = stand_ins("hang", "hang", "ok")
    transport = CountingTransport()
    publisher = AdapterPublisher(
        [hang1.url, hang2.url, ok.url], tmp_path / "a", run_id="r", timeout_s=DEADLINE_S, transport=transport
    )
    report = _publish(publisher, 1)
    assert not hang1.released.is_set() and not hang2.released.is_set()  # returned while both still hang
    assert transport.max_in_flight >= 2  # both hanging loads at once
    assert set(transport.read_deadlines) == {DEADLINE_S}
    assert hang1.loads() == hang2.loads() == ok.loads() == ["envkit-r-v1"]  # one attempt each
    assert sorted(line.split(": ")[0] for line in report["failed"]) == sorted([hang1.url, hang2.url])
    assert all(f"within {DEADLINE_S:g}s" in line for line in report["failed"])
    assert publisher.servers_for("envkit-r-v1") == [ok.url] and ok.held == {"envkit-r-v1"}
    publisher.close()


def test_a_load_that_timed_out_but_finished_late_is_unloaded_once_not_current(stand_ins, tmp_path):
    """The server finishes a load the client gave up on: without tracking it, it holds a LoRA slot for the rest of
    the run (and vLLM's LRU may evict an adapter in use). It is unloaded at the next sync that does not need it."""
    slow, ok = stand_ins("hang", "ok")
    publisher = AdapterPublisher([slow.url, ok.url], tmp_path / "a", run_id="r", timeout_s=DEADLINE_S)
    report = _publish(publisher, 1)
    assert report["failed"] and report["failed"][0].startswith(slow.url)
    slow.release()  # it now does the load it was asked for, late
    _until(lambda: "envkit-r-v1" in slow.held, "the late load")
    _publish(publisher, 2)
    assert slow.held == {"envkit-r-v2"} and ok.held == {"envkit-r-v2"}
    assert "envkit-r-v1" in slow.unloads()
    assert publisher.servers_for("envkit-r-v2") == [slow.url, ok.url]
    publisher.close()
    assert slow.held == ok.held == set()


def test_a_wedged_server_is_quarantined_not_retried_every_sync_and_rejoins_clean(stand_ins, tmp_path):
    """A server that hangs (loads and ``/health`` alike): after ``quarantine_after`` failed syncs it gets no load at
    the later syncs and no request. When it answers again, the adapters it loaded late are unloaded, the current one
    is loaded, and it is back in rotation."""
    ok, wedged = stand_ins("ok", "hang")
    publisher = AdapterPublisher(
        [ok.url, wedged.url],
        tmp_path / "a",
        run_id="r",
        timeout_s=DEADLINE_S,
        quarantine_after=2,
        probe_interval_s=0.05,
    )
    backend = AdapterBackend(publisher)
    _publish(publisher, 1)
    report = _publish(publisher, 2)
    assert report["quarantined"] == [wedged.url] and publisher.servers[wedged.url].quarantined
    for version in (3, 4, 5):
        report = _publish(publisher, version)
        assert report["failed"] == [] and report["quarantined"] == [wedged.url]
    assert wedged.loads() == ["envkit-r-v1", "envkit-r-v2"]  # not retried at syncs 3-5
    assert publisher.servers[wedged.url].load_requests == 2
    assert backend.candidates("envkit-r-v5") == [ok.url]  # no request goes there
    wedged.release()  # it answers again, and finishes the two loads it was given long ago
    _until(lambda: not publisher.servers[wedged.url].quarantined, "the rejoin")
    _until(lambda: wedged.held == {"envkit-r-v5"}, "the late loads unloaded")
    assert {"envkit-r-v1", "envkit-r-v2"} <= set(wedged.unloads())
    assert publisher.servers_for("envkit-r-v5") == [ok.url, wedged.url]
    assert sorted(backend.candidates("envkit-r-v5")) == sorted([ok.url, wedged.url])
    _publish(publisher, 6)  # and it takes part in syncs again
    assert wedged.held == ok.held == {"envkit-r-v6"}
    publisher.close()


def test_a_failing_server_is_quarantined_and_rejoins_when_its_health_returns(stand_ins, tmp_path):
    ok, flaky = stand_ins("ok", "fail")
    publisher = AdapterPublisher(
        [ok.url, flaky.url],
        tmp_path / "a",
        run_id="r",
        timeout_s=DEADLINE_S,
        quarantine_after=2,
        probe_interval_s=0.05,
    )
    for version in (1, 2, 3, 4):
        report = _publish(publisher, version)
    assert report["quarantined"] == [flaky.url] and flaky.loads() == ["envkit-r-v1", "envkit-r-v2"]
    assert publisher.load_failures == 2
    flaky.mode = "ok"
    _until(lambda: not publisher.servers[flaky.url].quarantined, "the rejoin")
    assert flaky.held == {"envkit-r-v4"} and flaky.loads()[-1] == "envkit-r-v4"
    assert publisher.servers_for("envkit-r-v4") == [ok.url, flaky.url]
    publisher.close()
    assert not any(Path(tmp_path / "a").iterdir())


def test_syncs_leave_no_thread_that_holds_up_the_exit_of_a_multi_process_run(stand_ins, tmp_path):
    """``python -m envkit.cli`` ends a multi-process run by joining every non-daemon thread
    (:func:`envkit.util.process_exit.exit_without_finalizing`): a thread the publisher leaves behind that never ends
    would hang that rank at exit (a thread pool's idle workers did)."""
    before = set(threading.enumerate())
    ok, wedged = stand_ins("ok", "hang")
    urls = [ok.url, wedged.url]
    publisher = AdapterPublisher(urls, tmp_path / "a", run_id="r", timeout_s=DEADLINE_S, quarantine_after=1)
    _publish(publisher, 1)
    _publish(publisher, 2)
    publisher.close()
    left = [t for t in threading.enumerate() if t not in before and not t.daemon]
    assert left == [], left
