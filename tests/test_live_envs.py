"""``concurrency`` bounds the envs alive at once (built and not yet closed) on every kind of env worker, and
``envkit validate`` holds no more envs than a check needs: an env that is a server session (``openenv:``, ``mcp:``)
must fit a server with few session slots, such as the one ``openenv init`` scaffolds (``max_concurrent_envs=1``)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import threading
from pathlib import Path

import pytest

import envkit
from envkit.backends import Generation, ScriptedBackend
from envkit.cli.app import main as cli_main
from envkit.rollout import RolloutEngine, SamplingParams
from envkit.workers import EnvFactory

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


class CountedEnv(envkit.Env):
    """A text env that counts the instances alive (built, not yet closed) and the most ever alive, across processes,
    in the small file ``path`` (updated under an exclusive file lock)."""

    max_turns = 2

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path, self._closed = path, False
        _count(path, +1)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "user", "content": f"Say anything ({seed})."}], {}

    def step(self, action):
        self.messages.append(action if isinstance(action, dict) else {"role": "assistant", "content": action})
        return [], 1.0, True, False, {}

    def score(self) -> float:
        return 1.0

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            _count(self.path, -1)


def _count(path: str, delta: int) -> None:
    import fcntl

    with open(path, "r+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        live, peak = map(int, handle.read().split())
        live += delta
        handle.seek(0)
        handle.truncate()
        handle.write(f"{live} {max(peak, live)}")


def _counts(path: Path) -> tuple[int, int]:
    import fcntl

    with open(path) as handle:
        fcntl.flock(handle, fcntl.LOCK_SH)
        live, peak = map(int, handle.read().split())
    return live, peak


@pytest.fixture
def live_file(tmp_path):
    path = tmp_path / "live"
    path.write_text("0 0")
    return path


@pytest.fixture
def workers(request):
    """The env workers of the parameter: "threads", "processes", or "ray" (a local Ray instance of 2 CPUs)."""
    if request.param != "ray":
        yield request.param
        return
    ray = pytest.importorskip("ray", reason="ray is not installed: pip install -e '.[ray]'")
    from envkit.workers.ray_actors import RayWorkers

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    pool = RayWorkers(2)
    try:
        yield pool
    finally:
        pool.close()
        ray.shutdown()


@pytest.mark.parametrize("workers", ["threads", "processes", "ray"], indirect=True)
def test_concurrency_bounds_the_envs_alive_at_once(workers, live_file, local_tokenizer):
    backend = ScriptedBackend(lambda request: "hello<|im_end|>", tokenizer=local_tokenizer, logprob=-0.5)
    engine = RolloutEngine(
        EnvFactory("test_live_envs:CountedEnv", {"path": str(live_file)}),
        backend,
        local_tokenizer,
        concurrency=2,
        env_workers=workers,
    )
    try:
        episodes = engine.run(list(range(6)), 2, SamplingParams(max_new_tokens=4))
    finally:
        engine.close()
    assert [e.score for e in episodes] == [1.0] * 12, [e.error for e in episodes]
    live, peak = _counts(live_file)
    assert live == 0 and peak == 2  # every env closed; never more than concurrency alive, and the bound was used


def test_eval_holds_no_more_envs_than_its_concurrency(live_file, tiny_model_dir, capsys):
    """Its up-front check that the env builds closes that env before the episodes start."""
    config = json.dumps({"path": str(live_file)})
    argv = ["eval", "test_live_envs:CountedEnv", "--env-config", config, "--model", str(tiny_model_dir)]
    assert cli_main([*argv, "--tasks", "3", "--concurrency", "1", "--max-new-tokens", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["episodes"] == 3
    assert _counts(live_file) == (0, 1)


# ---- through a real OpenEnv server with one session slot ------------------------------------------------------------
@pytest.fixture(scope="module")
def one_slot_url():
    """SumToTarget (test_openenv's OpenEnv MCP env) served by OpenEnv's own ``create_app`` with one session slot, as
    the server ``openenv init`` scaffolds is."""
    pytest.importorskip("openenv", reason="openenv is not installed: pip install -e '.[openenv]'")
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
    from test_openenv import SumToTarget

    from envkit.adapters.openenv.server import start_server

    app = create_app(SumToTarget, CallToolAction, CallToolObservation, env_name="sum", max_concurrent_envs=1)
    server = start_server(app)
    yield server.url
    server.stop()


def test_eval_with_concurrency_1_runs_every_episode_on_a_one_session_server(one_slot_url, tiny_model_dir, capsys):
    argv = ["eval", f"openenv:{one_slot_url}", "--model", str(tiny_model_dir), "--tasks", "3", "--concurrency", "1"]
    code = cli_main([*argv, "--max-turns", "2", "--max-new-tokens", "4", "--json", "--max-error-rate", "1"])
    metrics = json.loads(capsys.readouterr().out)
    assert code == 0 and metrics["episodes"] == 3
    assert metrics["error_rate"] == 0.0, metrics


def test_rollouts_on_a_one_session_server_score_every_episode(one_slot_url, local_tokenizer):
    from test_openenv import solves_sum_to_target

    spec = f"openenv:{one_slot_url}"
    backend = ScriptedBackend(solves_sum_to_target, tokenizer=local_tokenizer, logprob=-0.5)
    for workers in ("threads", "processes"):
        engine = RolloutEngine(EnvFactory(spec), backend, local_tokenizer, concurrency=1, env_workers=workers)
        try:
            episodes = engine.run([0, 1, 2], 2, SamplingParams())
        finally:
            engine.close()
        assert [e.score for e in episodes] == [1.0] * 6, (workers, [e.error for e in episodes])


def test_validate_passes_on_a_one_session_server(one_slot_url):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli_main(["validate", f"openenv:{one_slot_url}", "--episodes", "3", "--json", "--call-timeout", "600"])
    report = json.loads(out.getvalue())
    failed = [c for c in report["checks"] if c["status"] == "FAIL"]
    assert code == 0 and not failed, failed
    isolation = next(c for c in report["checks"] if c["id"] == 6)  # needs two sessions: said, not failed
    assert isolation["status"] == "WARN" and "CAPACITY_REACHED" in isolation["reason"], isolation
    assert next(c for c in report["checks"] if c["id"] == 2)["status"] == "PASS"


class SlowToClose(envkit.Env):
    """A text env whose ``close()`` blocks until :data:`CLOSE_MAY_END` is set, except on task seed 0."""

    max_turns = 2

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.seed = seed
        return [{"role": "user", "content": f"Task {seed}: say anything."}], {}

    def step(self, action):
        return [], 1.0, True, False, {}

    def score(self) -> float:
        return 1.0

    def close(self) -> None:
        if self.seed != 0:
            CLOSING.set()
            CLOSE_MAY_END.wait(60)


CLOSING, CLOSE_MAY_END = threading.Event(), threading.Event()


class AnswersTaskZero:
    """A backend that answers task 0 at once and never answers the others."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    async def agenerate(self, prompt, sampling, seed=None, *, timeout_s=None):
        if "Task 0:" not in self.tokenizer.decode(prompt):
            await asyncio.Event().wait()
        tokens = self.tokenizer.encode("hi<|im_end|>", add_special_tokens=False)
        return Generation(tokens, [-0.5] * len(tokens), "stop")


class Stop(Exception):
    pass


def test_a_failing_run_does_not_wait_for_its_other_envs_to_close(local_tokenizer):
    """Waiting for close() is for an episode that came to its end: when the run fails (here: its on_episode raises),
    the episodes it cancels give their env slots back at once (a hung close() would otherwise hold the failure for
    step_timeout_s), and their envs are still closed, on threads of their own."""
    CLOSING.clear()
    CLOSE_MAY_END.clear()
    engine = RolloutEngine(SlowToClose, AnswersTaskZero(local_tokenizer), local_tokenizer, step_timeout_s=120)

    def stop(episode):
        raise Stop

    async def failing_run() -> None:
        run = engine.arun([0, 1, 2], 1, SamplingParams(max_new_tokens=4), on_episode=stop)
        with pytest.raises(Stop):
            await asyncio.wait_for(run, timeout=30)

    try:
        asyncio.run(failing_run())
        assert CLOSING.wait(30)
    finally:
        CLOSE_MAY_END.set()
        engine.close()
