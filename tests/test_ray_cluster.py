"""Ray env workers on a real two-node Ray cluster on this machine: a head (``ray start --head``) and a second raylet
(``ray start --address``) with resources of its own, two node ids. Episodes spread over both nodes, an actor killed on
one node ends only the episodes it hosted, and the summary says which node ran what.

The cluster's processes are this test's own: both ``ray start --block`` processes and everything they started are
ended at teardown, even when the test fails. (``ray stop`` would also end Ray instances other jobs run on the same
machine.)
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import psutil
import pytest

ray = pytest.importorskip(
    "ray", reason="Ray is not installed (pip install -e '.[ray]'): the Ray cluster tests are skipped"
)

from test_process_workers import add_one  # noqa: E402

from envkit.rollout import RolloutEngine, SamplingParams, summarize  # noqa: E402
from envkit.workers import EnvFactory  # noqa: E402
from envkit.workers.ray_actors import RayWorkers  # noqa: E402

pytestmark = pytest.mark.slow  # two raylets take ~20 s to start on these cores

ACTORS = 4
EPISODES = 8


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


WORKER_PORTS = 41
"""How many ports each node's workers may use (``--min-worker-port`` … ``--max-worker-port``)."""


def _free_port_blocks(count: int, width: int, taken: set[int]) -> list[int]:
    """The first ports of ``count`` blocks of ``width`` consecutive ports, each free now and none in ``taken``: a
    node's worker ports must hold none of the ports its other components use, or ``ray start`` refuses them. The search
    starts at 20000, below Linux's ephemeral range (where :func:`_free_ports`' ports come from)."""
    starts: list[int] = []
    for low in range(20000, 65536 - width, width):
        if len(starts) == count:
            break
        if not taken.isdisjoint(range(low, low + width)):
            continue
        try:
            with contextlib.ExitStack() as stack:
                for port in range(low, low + width):
                    stack.enter_context(socket.socket()).bind(("127.0.0.1", port))
        except OSError:
            continue
        starts.append(low)
    assert len(starts) == count, f"no {count} blocks of {width} free ports"
    return starts


def _ray_start(temp_dir: str, ports: list[int], env: dict[str, str], *flags: str) -> subprocess.Popen:
    node_manager, object_manager, agent_listen, agent_grpc, runtime_env, metrics, low = ports
    command = [
        sys.executable,
        "-m",
        "ray.scripts.scripts",
        "start",
        "--block",
        "--num-cpus=1",
        "--disable-usage-stats",
        f"--node-manager-port={node_manager}",
        f"--object-manager-port={object_manager}",
        f"--dashboard-agent-listen-port={agent_listen}",
        f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--runtime-env-agent-port={runtime_env}",
        f"--metrics-export-port={metrics}",
        f"--min-worker-port={low}",
        f"--max-worker-port={low + WORKER_PORTS - 1}",
        *flags,
    ]
    if "--head" in flags:
        command += [f"--temp-dir={temp_dir}", "--include-dashboard=false"]
    log = open(os.path.join(temp_dir, f"ray-start-{ports[0]}.log"), "wb")  # noqa: SIM115 (the process owns it)
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)


def _log_tail(temp_dir: str, ports: list[int]) -> str:
    with open(os.path.join(temp_dir, f"ray-start-{ports[0]}.log"), errors="replace") as log:
        return log.read()[-2000:]


def _end(processes: list[subprocess.Popen]) -> None:
    """End the ``ray start`` processes and every process they started (raylets, GCS, workers)."""
    descendants = []
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            descendants += psutil.Process(process.pid).children(recursive=True)
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
    _, alive = psutil.wait_procs(descendants, timeout=10)
    for leftover in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            leftover.kill()
    for process in processes:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)


def _reset_ray_auth() -> None:
    """Make this process's Ray read its auth mode and token from the environment again (Ray caches both)."""
    with contextlib.suppress(ImportError, AttributeError):
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


@pytest.fixture(scope="module")
def cluster():
    """A head and a second node (resource ``second_node``) on this machine; the driver joined to it."""
    if ray.is_initialized():
        ray.shutdown()
    temp_dir = tempfile.mkdtemp(prefix="ekr-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    gcs, client, *ports = _free_ports(14)
    head_workers, second_workers = _free_port_blocks(2, WORKER_PORTS, taken={gcs, client, *ports})
    head = [*ports[:6], head_workers]  # each node: six component ports, then its first worker port
    second = [*ports[6:], second_workers]
    # Ray's token authentication with a token of this cluster's own (not the user's ~/.ray/auth_token).
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    saved = {name: os.environ.get(name) for name in (*auth, "RAY_AUTH_TOKEN_PATH")}
    os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
    os.environ.update(auth)
    _reset_ray_auth()
    env = dict(os.environ)
    processes = []
    try:
        processes.append(
            _ray_start(temp_dir, head, env, "--head", f"--port={gcs}", f"--ray-client-server-port={client}")
        )
        address = f"127.0.0.1:{gcs}"
        deadline = time.monotonic() + 60
        while True:  # the head is up when the GCS port accepts connections
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", gcs), timeout=1):
                break
            assert time.monotonic() < deadline, "the Ray head did not start within 60 s"
            assert processes[0].poll() is None, f"ray start --head exited: {_log_tail(temp_dir, head)}"
            time.sleep(0.5)
        processes.append(_ray_start(temp_dir, second, env, f"--address={address}", '--resources={"second_node": 1}'))
        ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        while len([n for n in ray.nodes() if n["Alive"]]) < 2:
            assert time.monotonic() < deadline + 60, f"the second raylet did not join: {ray.nodes()}"
            assert processes[1].poll() is None, f"ray start --address exited: {_log_tail(temp_dir, second)}"
            time.sleep(0.5)
        yield [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()
        _end(processes)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _reset_ray_auth()


def run(workers, tokenizer, factory, seeds, *, timeout_s=30.0):
    engine = RolloutEngine(
        factory,
        add_one(tokenizer),
        tokenizer,
        max_turns=3,
        concurrency=len(seeds),
        step_timeout_s=timeout_s,
        env_workers=workers,
    )
    return engine.run(seeds, 1, SamplingParams())


def test_episodes_spread_over_two_nodes_and_a_killed_actor_ends_only_its_episodes(cluster, local_tokenizer):
    assert len(set(cluster)) == 2
    workers = RayWorkers(EPISODES, actors=ACTORS)
    try:
        # Warm: all four actors up (spread over both nodes) before the timed run.
        episodes = run(workers, local_tokenizer, EnvFactory("worker_envs:Faulty"), list(range(EPISODES)))
        assert all(e.error is None for e in episodes), [e.error for e in episodes]
        # Ray's SPREAD placement is best effort: every node hosts actors, not necessarily as many each.
        assert set(workers.nodes) == set(cluster) and sum(workers.nodes.values()) == ACTORS, workers.nodes
        summary = summarize(episodes)
        per_node = {key.removeprefix("episodes/node/"): n for key, n in summary.items() if key.startswith("episodes/")}
        assert set(per_node) == set(cluster) and sum(per_node.values()) == EPISODES, summary
        assert all(e.worker["node"] in cluster and e.worker["pid"] in workers.pids for e in episodes)

        # Kill one actor mid-run (each step sleeps 0.8 s), on the node hosting the most actors (so that both nodes
        # still run episodes beside it): only the episodes it hosted end.
        busiest = max(workers.nodes, key=workers.nodes.get)
        victim = next(actor for actor in workers.pool.workers if actor.node == busiest)
        killed = threading.Event()

        def kill() -> None:
            deadline = time.monotonic() + 30
            while workers.pool.load(victim) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.0)  # mid-episode
            os.kill(victim.pid, signal.SIGKILL)
            killed.set()

        killer = threading.Thread(target=kill)
        killer.start()
        factory = EnvFactory("worker_envs:Faulty", {"delay": 0.8})
        episodes = run(workers, local_tokenizer, factory, list(range(EPISODES)))
        killer.join()
        assert killed.is_set()
        on_victim = [e for e in episodes if e.worker["pid"] == victim.pid]
        elsewhere = [e for e in episodes if e.worker["pid"] != victim.pid]
        assert len(on_victim) == 2 and len(elsewhere) == EPISODES - 2
        for episode in on_victim:
            assert episode.finish_reason == "error", episode
            assert episode.error.startswith("EnvWorkerLost: env worker Ray actor "), episode.error
        assert all(e.error is None and e.turns == 3 for e in elsewhere), [e.error for e in elsewhere]
        assert {e.worker["node"] for e in elsewhere} == set(cluster)  # the other node's and the victim's neighbours
        assert workers.pool.replaced == 1 and workers.pool.lost_sessions == 2
        deadline = time.monotonic() + 60
        while len(workers.pids) < ACTORS and time.monotonic() < deadline:  # the replacement starts in the background
            time.sleep(0.2)
        assert len(workers.pids) == ACTORS and victim.pid not in workers.pids
    finally:
        workers.close()


def test_worker_port_blocks_hold_none_of_the_other_components_ports():
    """What the cluster's ``ray start`` needs (CI's once drew a random component port inside a worker range)."""
    taken = {20000 + 41 + 7, 20000 + 3 * 41}
    starts = _free_port_blocks(2, WORKER_PORTS, taken)
    blocks = [set(range(low, low + WORKER_PORTS)) for low in starts]
    assert blocks[0].isdisjoint(blocks[1]) and all(block.isdisjoint(taken) for block in blocks)
