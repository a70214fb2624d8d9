"""How an episode ended reaches the env before ``score()``, wherever the env lives: on thread, process and Ray workers
and in an env served over OpenEnv (``envkit serve-env``'s app, consumed as ``openenv:ws://…``). Each case is read back
from the score of an env that scores the ending it was told (tests/ending_envs.py): the engine's cuts (its turn cap,
a token budget) and the env's own endings (it finished, its own ``max_turns``, too many tool errors)."""

from __future__ import annotations

import pytest
from ending_envs import SCORES

import envkit
from envkit.backends import ScriptedBackend
from envkit.rollout import RolloutEngine, SamplingParams
from envkit.workers import EnvFactory

ADD = '<tool_call>{"name": "add", "arguments": {"amount": 1}}</tool_call><|im_end|>'
EXPLODE = '<tool_call>{"name": "explode", "arguments": {}}</tool_call><|im_end|>'
SAY = "The total is 1.<|im_end|>"
CASES = {  # the model's every reply, the engine's limits, and how the episode must end
    "the engine's turn cap": (ADD, {"max_turns": 2}, "max_turns"),
    "a token budget": (ADD, {"max_completion_tokens": 8}, "max_episode_tokens"),
    "the env finished": (SAY, {}, "done"),
    "the env's own max_turns": (ADD, {}, "max_turns"),
    "too many tool errors": (EXPLODE, {}, "too_many_errors"),
}
SPEC = "ending_envs:TellsItsEnding"


def played(workers, tokenizer, spec: str = SPEC) -> dict[str, list[envkit.rollout.Episode]]:
    """Every case, two episodes each, on ``workers``."""
    results = {}
    for name, (reply, limits, _) in CASES.items():
        engine = RolloutEngine(
            EnvFactory(spec),
            ScriptedBackend(reply, tokenizer=tokenizer),
            tokenizer,
            concurrency=2,
            step_timeout_s=30.0,
            env_workers=workers,
            **limits,
        )
        results[name] = engine.run([0, 1], 1, SamplingParams(max_new_tokens=64))
    return results


def assert_told(results, *, components: bool = True) -> None:
    """Every episode ended as its case says, and its env was told so (its score; its components, read after it)."""
    for name, episodes in results.items():
        ending = CASES[name][2]
        for episode in episodes:
            assert episode.error is None, (name, episode.error)
            assert (episode.finish_reason, episode.score) == (ending, SCORES[ending]), name
            if components:
                assert episode.score_components == {f"told_{ending}": 1.0}, name


@pytest.fixture(scope="module")
def process_workers():
    from envkit.workers.processes import ProcessWorkers

    workers = ProcessWorkers(concurrency=2)
    yield workers
    workers.close()


@pytest.fixture(scope="module")
def ray_workers():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")
    from envkit.workers.ray_actors import RayWorkers

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    workers = RayWorkers(2)
    yield workers
    workers.close()
    ray.shutdown()


@pytest.fixture(scope="module")
def served_url():
    """The env served by ``envkit serve-env``'s app (OpenEnv's own server), in this process."""
    from envkit.adapters.openenv.server import create_envkit_app, start_server

    server = start_server(create_envkit_app(SPEC, max_sessions=8))
    yield server.url
    server.stop()


def test_the_ending_reaches_the_env_on_threads(local_tokenizer):
    assert_told(played("threads", local_tokenizer))


def test_the_ending_reaches_the_env_on_processes(process_workers, local_tokenizer):
    results = played(process_workers, local_tokenizer)
    assert_told(results)
    assert all(e.worker.get("pid") in process_workers.pids for episodes in results.values() for e in episodes)


def test_the_ending_reaches_the_env_on_ray(ray_workers, local_tokenizer):
    results = played(ray_workers, local_tokenizer)
    assert_told(results)
    assert all(e.worker.get("node") for episodes in results.values() for e in episodes)


@pytest.mark.parametrize("kind", ["threads", "processes"])
def test_the_ending_reaches_an_env_served_over_openenv(kind, request, served_url, local_tokenizer):
    spec = f"openenv:{served_url}"
    workers = request.getfixturevalue("process_workers") if kind == "processes" else kind
    assert_told(played(workers, local_tokenizer, spec), components=False)  # OpenEnv carries no score components
    assert envkit.make(spec).requires_proper_ending  # the served env's declaration comes across


def test_the_env_records_its_own_ending_and_end_overrides_nothing_it_did_not_end():
    env = envkit.make(SPEC)
    env.reset(seed=0)
    assert env.ending is None
    env.step({"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "add", "arguments": {}}}]})
    assert env.ending is None and not env.done  # a failed call (missing argument) is one tool error of two
    *_, terminated, truncated, info = env.step(
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "explode", "arguments": {}}}]}
    )
    assert (terminated, truncated, info["ending"], env.ending) == (False, True, "too_many_errors", "too_many_errors")
    env.reset(seed=0)
    env.end("max_episode_tokens")
    assert env.done and env.ending is envkit.Ending.MAX_EPISODE_TOKENS and env.score() == 0.5
    with pytest.raises(RuntimeError, match="the episode has ended"):
        env.step("more")
    with pytest.raises(ValueError, match=r"end\('cut'\): an ending is one of: done, max_turns"):
        env.end("cut")
