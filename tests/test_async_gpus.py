"""Placing local vLLM servers on GPUs beside training (``envkit train --async --vllm-servers K --vllm-server-gpus N``).

The split is plain arithmetic (:func:`~envkit.adapters.vllm.gpus.split_gpus`): servers on the last N GPUs,
training on the first ones (the GPU of each process's local rank). What a server is started with — its
``CUDA_VISIBLE_DEVICES`` and ``--tensor-parallel-size`` — is checked through :class:`LocalServers` with a stand-in
for vLLM's server that records them. Not run here: a real vLLM server on a GPU (this machine has none).
"""

from __future__ import annotations

import json

import pytest
from server_stand_in import stand_in_servers

from envkit.adapters.vllm.gpus import GpuPlacementError, GpuSplit, split_gpus, visible_gpus


def test_servers_take_the_last_gpus_and_training_the_first():
    split = split_gpus(["0", "1", "2", "3"], servers=1, server_gpus=1, training_processes=3)
    assert split == GpuSplit(training=("0", "1", "2"), servers=(("3",),))
    split = split_gpus(["0", "1", "2", "3", "4", "5", "6", "7"], servers=2, server_gpus=4, training_processes=4)
    assert split.servers == (("4", "5"), ("6", "7")) and split.training == ("0", "1", "2", "3")
    assert split.server_devices(1) == "6,7"
    assert split.as_dict() == {"training": ["0", "1", "2", "3"], "servers": [["4", "5"], ["6", "7"]]}
    assert split.describe() == "server 1 on GPU(s) ['4', '5'], server 2 on GPU(s) ['6', '7']; training on GPU(s) " + (
        "['0', '1', '2', '3']"
    )


def test_gpu_names_follow_cuda_visible_devices():
    assert visible_gpus(3, {}) == ["0", "1", "2"]
    assert visible_gpus(4, {"CUDA_VISIBLE_DEVICES": "2,3,4,5"}) == ["2", "3", "4", "5"]
    split = split_gpus(visible_gpus(4, {"CUDA_VISIBLE_DEVICES": "2,3,4,5"}), 1, 2, 1)
    assert split.servers == (("4", "5"),) and split.training == ("2", "3")


@pytest.mark.parametrize(
    ("gpus", "servers", "server_gpus", "processes", "expected"),
    [
        (4, 2, 3, 1, "give a multiple of --vllm-servers (2, 4, …)"),
        (4, 2, 1, 1, "cannot be shared by 2 server(s)"),
        (2, 1, 2, 1, "leaves no GPU for training on this machine (2 GPU(s))"),
        (4, 1, 2, 3, "launch at most 2 (accelerate launch --num_processes 2)"),
    ],
)
def test_placements_that_cannot_work_are_refused_in_one_line(gpus, servers, server_gpus, processes, expected):
    with pytest.raises(GpuPlacementError) as error:
        split_gpus([str(i) for i in range(gpus)], servers, server_gpus, processes)
    assert expected in str(error.value) and "\n" not in str(error.value)


RECORDING = """
with open(os.environ["RECORD_DIR"] + f"/{port}.json", "w") as f:
    json.dump({"argv": argv, "devices": os.environ.get("CUDA_VISIBLE_DEVICES")}, f)
"""


def test_each_local_server_sees_only_its_gpus_tensor_parallel_over_them(tmp_path, monkeypatch):
    """LocalServers with a GPU split: the stand-in for ``python -m vllm.entrypoints.openai.api_server`` records the
    environment and arguments each server process was started with."""
    records = tmp_path / "records"
    records.mkdir()
    monkeypatch.setenv("RECORD_DIR", str(records))
    split = split_gpus(["0", "1", "2", "3", "4"], servers=2, server_gpus=4, training_processes=1)
    servers = stand_in_servers(tmp_path, RECORDING, 2, gpu_sets=split.servers)
    with servers:
        seen = sorted((json.loads(p.read_text()) for p in records.glob("*.json")), key=lambda r: r["devices"])
    assert [r["devices"] for r in seen] == ["1,2", "3,4"]
    for record in seen:
        argv = record["argv"]
        assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
