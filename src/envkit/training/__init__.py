"""envkit going out to trainers: the TRL bridge (:mod:`envkit.training.trl`: ``rollout_func``, dataset, rewards,
``env_mask``), ``envkit train`` (:mod:`envkit.training.train`, its config in :mod:`envkit.training.config`), the SFT
warm start (:mod:`envkit.training.sft`) and oracle demonstrations (:mod:`envkit.training.demos`)."""
