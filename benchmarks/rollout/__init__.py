"""Rollout throughput, like-for-like: envkit's rollout engine vs TRL 1.16's own ``environment_factory`` tool loop.

Every arm gets its own copy of one saved checkpoint (fresh ``from_pretrained``, its own tokenizer instance) and the
same generation backend, sampling (temperature 1, no top-k/top-p), per-turn token budget, per-episode completion
budget and turn cap. Arms, for each workload and episode count:

``trl``
    ``GRPOTrainer(environment_factory=to_environment_factory(Env))``: TRL's tool loop (lockstep generation, tools run
    one sample after another). Its ``max_completion_length`` is the episode budget, ``generation_kwargs`` caps each
    generate call at the per-turn budget, ``max_tool_calling_iterations`` is the turn cap minus one.
``envkit_trl``
    The same ``GRPOTrainer`` class fed by ``make_rollout_func(Env, max_completion_tokens=<episode budget>)`` on the
    trainer's own generator. Both trainer arms are timed over the same call, ``_generate_and_score_completions`` on
    one batch (prompts → scored rollouts, TRL's post-processing paid by both): ``ratio_vs_trl``. ``_generate`` (the
    rollout alone) is timed too: ``ratio_vs_trl_generate``.
``envkit``
    The bare ``RolloutEngine.run`` (reference; ``ratio_bare_vs_trl`` compares it with TRL's ``_generate``).
``limit``
    The backend's raw generation of the token sequences the ``envkit`` run produced: every batch the engine sent to
    ``backend.generate`` is replayed in the same batch shapes, one after another, nothing else running. Transformers:
    same prompts and per-request seeds, so the same tokens (checked). vLLM: each request forced to its recorded length.
    ``overhead_fraction`` is ``1 - limit / envkit`` per repeat: the share of the engine's wall time not explained by
    generating its tokens (env work, rendering, scheduling, tool waits it could not hide).

Protocol: a discarded warm-up of every arm, then ``--repeats`` rounds with the arms in rotated order; median and min-max
reported. Workloads: ``instant`` (the quickstart's capitals env, examples/capitals.py), ``latency50ms`` (every tool call
sleeps 50 ms) and ``hetero`` (a chain env: 1-6 turns decided by the task seed, answers of varied length, tool latency
log-normal with a 20 ms median drawn from the task seed). The same turns in every arm: a tool call that does not parse
ends the episode in envkit's arms too, as TRL's loop does (``--malformed end``, the default; ``--malformed answer``
keeps envkit's rule, an error message and the episode goes on, which plays more turns than TRL's loop on the same
model).

Usage (from the repository root)::

    python -m benchmarks.rollout [--episodes 32,128] [--repeats 3] [--workloads instant,latency50ms,hetero] [--json]
    .venv-vllm/bin/python -m benchmarks.rollout --backend vllm   # TRL's use_vllm colocate loop vs envkit on vLLM
    python -m benchmarks.rollout --pool run1.json run2.json ...   # several runs' --out files: per run and pooled

Modules: :mod:`.workloads` (the envs and budgets), :mod:`.model` (the checkpoint every arm loads), :mod:`.arms` (the
four arms), :mod:`.protocol` (warm-up, rotated repeats, the ratios), :mod:`.profiling` (where one bare engine run's
time goes), :mod:`.report` (printing and pooling runs) and :mod:`.cli`.
"""

import os

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
# One OpenMP thread in every thread (set before torch loads): see run_benchmark's torch_threads.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from .arms import EngineArm, TrainerArm, envkit_backend, quiet
from .cli import main
from .model import RECIPE, load, prepare_checkpoint
from .protocol import bench_one, run_benchmark, summary
from .report import pool_runs, print_pool, print_profile, print_report
from .workloads import GROUP, ROOT, WORKLOADS, ChainEnv, Workload, capitals_class

__all__ = [
    "GROUP",
    "RECIPE",
    "ROOT",
    "WORKLOADS",
    "ChainEnv",
    "EngineArm",
    "TrainerArm",
    "Workload",
    "bench_one",
    "capitals_class",
    "envkit_backend",
    "load",
    "main",
    "pool_runs",
    "prepare_checkpoint",
    "print_pool",
    "print_profile",
    "print_report",
    "quiet",
    "run_benchmark",
    "summary",
]
