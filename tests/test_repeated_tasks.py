"""A task that comes twice in one rollout call (a dataset that repeats seeds: oversampling, curricula) gets its own
sampling seed in each group: the groups are not copies of each other. The same call with the same seed still
reproduces its samples."""

from __future__ import annotations

import os

from helpers import VerbosityEnv

from envkit.adapters.trl import build_dataset, env_score_reward, make_rollout_func
from envkit.backends import RecordingBackend, ScriptedBackend
from envkit.rollout import RolloutEngine, SamplingParams

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def test_every_episode_of_one_call_gets_its_own_seed_and_the_call_reproduces(local_tokenizer):
    backend = RecordingBackend(ScriptedBackend("Done.<|im_end|>", tokenizer=local_tokenizer))  # keeps the seeds
    engine = RolloutEngine(VerbosityEnv, backend, local_tokenizer)
    sampling = SamplingParams(seed=7)
    engine.run([5, 6, 5], [2, 1, 2], sampling)  # task 5 twice: as TRL's rollout hands over a repeated row
    first = list(backend.seeds)
    assert len(first) == 5 and None not in first
    assert len(set(first)) == 5, "two episodes of one call shared a sampling seed"
    backend.reset()
    engine.run([5, 6, 5], [2, 1, 2], sampling)
    assert sorted(backend.seeds) == sorted(first)  # the same call, the same seeds (batches may order them otherwise)


def test_grpo_groups_of_the_same_task_in_one_batch_are_sampled_independently(local_tokenizer, tiny_model_dir, tmp_path):
    """Through GRPOTrainer with a real tiny model (TransformersBackend on the trainer's model, seeded as the trainer
    always seeds): a batch holding task 3 twice gives its two groups different completions."""
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    local_tokenizer.padding_side = "left"
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=9,
        num_generations=3,
        max_completion_length=8,
        max_steps=1,
        bf16=False,
        use_cpu=True,
        report_to="none",
        beta=0.0,
        seed=11,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)),
        args=args,
        reward_funcs=env_score_reward,
        train_dataset=build_dataset(VerbosityEnv, [3, 4, 3]),
        processing_class=local_tokenizer,
        rollout_func=make_rollout_func(VerbosityEnv, max_error_rate=None),
    )
    inputs = [trainer.train_dataset[i] for i in (0, 0, 0, 1, 1, 1, 2, 2, 2)]
    output = trainer._generate_and_score_completions(inputs)
    rows = [
        [t for t, m in zip(ids, mask, strict=True) if m]
        for ids, mask in zip(output["completion_ids"].tolist(), output["completion_mask"].tolist(), strict=True)
    ]
    assert all(rows), rows
    assert output["prompt_ids"][0].tolist() == output["prompt_ids"][6].tolist()  # the same task, the same prompt
    assert rows[0:3] != rows[6:9], "the two groups of task 3 are copies of each other"
    assert len({tuple(r) for r in rows[0:3] + rows[6:9]}) == 6  # no sample repeats across the two groups
