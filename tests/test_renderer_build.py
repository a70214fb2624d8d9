"""Building a chat renderer (probing the template: seconds on a loaded machine, once per process) is envkit's own
set-up, not env work: it never counts against ``step_timeout_s``, which bounds the env's calls and rendering proper."""

from __future__ import annotations

import time

from helpers import CounterEnv
from transformers import AutoTokenizer

from envkit.backends import SamplingParams, ScriptedBackend
from envkit.chat.render import ChatRenderer
from envkit.rollout import RolloutEngine, renderers


def test_a_slow_renderer_build_does_not_time_the_episode_out(local_tokenizer_dir, monkeypatch):
    # A fresh tokenizer object: the process's renderer cache is keyed by it, so this engine must build its renderer.
    tokenizer = AutoTokenizer.from_pretrained(str(local_tokenizer_dir))
    built = []

    class SlowToBuild(ChatRenderer):
        def __init__(self, *args, **kwargs):
            time.sleep(3.0)  # a build longer than the whole step deadline (a real one took 2.5-4.2 s at load 19)
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(renderers, "ChatRenderer", SlowToBuild)
    backend = ScriptedBackend("Done.<|im_end|>", tokenizer=tokenizer)
    engine = RolloutEngine(CounterEnv, backend, tokenizer, max_turns=1, step_timeout_s=1.5)
    episodes = engine.run([0, 1], 2, SamplingParams())

    assert [e.error for e in episodes] == [None] * 4
    assert len(built) == 1  # one build, shared by the four episodes (the others waited for it)
    assert all(e.finish_reason != "timeout" and e.prompt_ids for e in episodes)
