"""envkit.util.options.as_flags: keyword settings as a command line, which `envkit train`'s parser reads back."""

from __future__ import annotations

import pytest

from envkit.util.options import as_flags


def test_each_setting_becomes_a_flag_and_its_value():
    assert as_flags(depths=(1, 2)) == ["--depths", "[1, 2]"]
    assert as_flags(max_steps=80, env_config={"depths": [1, 2]}, no_lora=None, gradient_checkpointing=False) == [
        "--max-steps",
        "80",
        "--env-config",
        '{"depths": [1, 2]}',
        "--gradient-checkpointing",
        "false",
    ]


def test_envkit_train_reads_the_settings_back():
    pytest.importorskip("trl")
    from envkit.adapters.trl.config import parse

    flags = as_flags(model="m", learning_rate=5e-4, rl_num_generations=4, max_turns=3, gradient_checkpointing=False)
    args, config = parse(["--env", "arithmetic", *flags])
    assert (args.model, args.max_turns, config.learning_rate, config.num_generations) == ("m", 3, 5e-4, 4)
    assert config.gradient_checkpointing is False
