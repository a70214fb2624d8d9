"""Sharing a CPU-only machine between local vLLM servers and training (``envkit.adapters.vllm.cpus``).

The split itself is plain arithmetic; :func:`pin_training` is checked in a fresh interpreter (it changes the process's
core affinity and torch's thread count). The end-to-end check, a real server bound to its cores and the trainer on
the others, is in ``tests/test_async_cli.py`` (``-m vllm``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from envkit.adapters.vllm import cpus
from envkit.adapters.vllm.servers import LocalServers, ServerError


def test_two_cores_and_one_server_get_one_core_each():
    split = cpus.split_cpus([0, 1], 1)
    assert split == cpus.CpuSplit(training=(1,), servers=((0,),))
    assert split.server_bind(0) == "0"
    assert split.training_cores(0, 1) == (1,)


def test_cores_are_split_between_training_and_servers_without_overlap():
    split = cpus.split_cpus(range(16), 3)
    assert split.training == (12, 13, 14, 15)
    assert split.servers == ((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11))
    assert [split.server_bind(i) for i in range(3)] == ["0,1,2,3", "4,5,6,7", "8,9,10,11"]
    used = [*split.training, *(c for group in split.servers for c in group)]
    assert sorted(used) == list(range(16))  # every core used once
    uneven = cpus.split_cpus([3, 5, 7, 9, 11], 1)
    assert uneven.training == (9, 11) and uneven.servers == ((3, 5, 7),)


def test_more_servers_than_cores_share_cores_but_never_trainings():
    split = cpus.split_cpus([0, 1], 3)
    assert split.training == (1,)
    assert split.servers == ((0,), (0,), (0,))
    split = cpus.split_cpus([0, 1, 2, 3], 5)
    assert split.training == (3,) and split.servers == ((0,), (1,), (2,), (0,), (1,))


def test_nothing_to_split_on_one_core_or_without_servers():
    assert cpus.split_cpus([0], 1) is None
    assert cpus.split_cpus([0, 1, 2], 0) is None


def test_training_processes_get_disjoint_shares_when_there_are_enough_cores():
    split = cpus.CpuSplit(training=(4, 5, 6, 7), servers=((0, 1, 2, 3),))
    assert [split.training_cores(r, 2) for r in range(2)] == [(4, 5), (6, 7)]
    alone = cpus.CpuSplit(training=(1,), servers=((0,),))
    assert [alone.training_cores(r, 2) for r in range(2)] == [(1,), (1,)]  # too few: they share
    assert "1 thread(s) per process" in alone.describe(2)


def test_the_users_own_placement_wins(monkeypatch):
    for name in (*cpus.USER_CHOICE, "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert not cpus.user_placed_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert cpus.user_placed_threads()
    assert cpus.shared_machine_warning(["http://127.0.0.1:8000"]) is None
    # accelerate launch / torchrun set OMP_NUM_THREADS for every process they start: not the user's choice
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert not cpus.user_placed_threads()
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")
    assert cpus.user_placed_threads()


def test_processes_sharing_too_few_cores_run_one_thread_each():
    split = cpus.CpuSplit(training=(2, 3), servers=((0, 1),))
    assert split.training_threads(1) == 2 and split.training_threads(2) == 1
    assert split.training_threads(3) == 1  # 3 processes on 2 cores: one thread each, never 2 each


def test_servers_on_this_machine_given_by_url_are_warned_about(monkeypatch):
    for name in cpus.USER_CHOICE:
        monkeypatch.delenv(name, raising=False)
    warning = cpus.shared_machine_warning(["http://10.0.0.7:8000", "http://localhost:8001"])
    assert warning is not None and "http://localhost:8001" in warning and "10.0.0.7" not in warning
    assert "VLLM_CPU_OMP_THREADS_BIND" in warning and "--vllm-servers" in warning
    assert cpus.shared_machine_warning(["http://10.0.0.7:8000"]) is None  # another machine: nothing shared


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_pin_training_moves_every_thread_and_sets_torchs_thread_count():
    script = """
import json, os, threading, torch
from envkit.adapters.vllm import cpus
torch.set_num_threads(len(os.sched_getaffinity(0)))
torch.ones(512, 512) @ torch.ones(512, 512)  # torch's OpenMP pool exists before pinning
started = threading.Event(); stop = threading.Event()
def idle():
    started.set(); stop.wait()
thread = threading.Thread(target=idle); thread.start(); started.wait()
split = cpus.split_cpus(cpus.available_cpus(), 1)
threads = cpus.pin_training(split)
tids = [int(t) for t in os.listdir("/proc/self/task")]
masks = {tid: sorted(os.sched_getaffinity(tid)) for tid in tids}
torch.ones(512, 512) @ torch.ones(512, 512)
stop.set(); thread.join()
print(json.dumps({"threads": threads, "torch": torch.get_num_threads(), "training": list(split.training),
                  "masks": list(masks.values())}))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["threads"] == out["torch"] == len(out["training"])
    assert len(out["masks"]) >= 2  # the main thread and the one started before pinning
    assert all(mask == out["training"] for mask in out["masks"])


def test_local_servers_take_one_binding_per_server(tmp_path):
    with pytest.raises(ServerError, match="2 CPU sets for 1 servers"):
        LocalServers(
            "m", 1, python=sys.executable, log_dir=tmp_path, max_loras=3, max_lora_rank=16, cpu_sets=[[0], [1]]
        )
