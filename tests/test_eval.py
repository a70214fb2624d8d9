"""envkit eval and envkit serve: a real HTTP completions server, OpenAIBackend, JSONL output, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import envkit_serve, free_port, hung_step_env_file

import envkit
from envkit.backends import OpenAIBackend, SamplingParams, TransformersBackend
from envkit.cli.app import main
from envkit.rollout import RolloutEngine

ENVKIT = str(Path(sys.executable).parent / "envkit")


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    """`envkit serve` on the tiny model, in its own process on 127.0.0.1; stopped by its pid afterwards."""
    with envkit_serve(tiny_model_dir) as url:
        yield url


def test_openai_backend_against_a_real_server(server, tiny_model_dir, local_tokenizer):
    from transformers import AutoModelForCausalLM

    backend = OpenAIBackend(server, "tiny")
    backend.check()
    prompt = local_tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, return_dict=False
    )
    sampling = SamplingParams(temperature=0.0, max_new_tokens=8)
    remote = backend.generate([prompt, prompt], sampling)
    local = TransformersBackend(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)), local_tokenizer)
    expected = local.generate([prompt], sampling)[0]
    for generation in remote:  # greedy: the server's tokens and logprobs are the model's own
        assert generation.token_ids == expected.token_ids
        assert generation.logprobs == pytest.approx(expected.logprobs, abs=1e-4)


def test_rollout_engine_over_http_with_concurrent_episodes(server, local_tokenizer):
    engine = RolloutEngine(
        lambda: envkit.make("guess-number"), OpenAIBackend(server, "tiny"), local_tokenizer, max_turns=3
    )
    episodes = engine.run([0, 1, 2], 3, SamplingParams(max_new_tokens=8, seed=1))
    assert len(episodes) == 9 and all(e.error is None and e.turns >= 1 for e in episodes)
    assert all(len(e.completion_ids) == len(e.env_mask) == len(e.logprobs) for e in episodes)
    assert all(lp < 0 or lp == 0 for e in episodes for lp in e.logprobs)


def test_eval_cli_transformers_writes_jsonl(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "episodes.jsonl"
    code = main(
        [
            "eval",
            "arithmetic",
            "--model",
            str(tiny_model_dir),
            "--tasks",
            "3",
            "--samples",
            "2",
            "--max-new-tokens",
            "16",
            "--max-turns",
            "2",
            "--out",
            str(out),
            "--json",
        ]
    )
    assert code == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["episodes"] == 6 and metrics["k"] == 2 and "pass@2" in metrics and "pass^2" in metrics
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 6 and {line["task_seed"] for line in lines} == {0, 1, 2}
    assert set(lines[0]) >= {"messages", "prompt_ids", "completion_ids", "env_mask", "logprobs", "score"}


def test_eval_is_seeded_so_a_rerun_samples_the_same_episodes(tiny_model_dir, tmp_path, capsys):
    def run(name: str, *extra: str) -> list[list[int]]:
        out = tmp_path / name
        argv = ["eval", "arithmetic", "--model", str(tiny_model_dir), "--tasks", "3", "--samples", "2", "--json"]
        assert main([*argv, "--max-new-tokens", "16", "--max-turns", "2", "--out", str(out), *extra]) == 0
        capsys.readouterr()
        episodes = [json.loads(line) for line in out.read_text().splitlines()]  # in the order they finished
        return sorted(episode["completion_ids"] for episode in episodes)

    # One episode at a time: every batch holds one request, so nothing but the seed decides a draw.
    first, again = run("a.jsonl", "--concurrency", "1"), run("b.jsonl", "--concurrency", "1")
    assert first == again
    assert len({tuple(ids) for ids in first}) > 1  # the samples of one task are not copies of each other


def test_eval_cli_openai_backend(server, tiny_model_dir, capsys):
    code = main(
        [
            "eval",
            "guess-number",
            "--backend",
            "openai",
            "--base-url",
            server,
            "--model",
            "tiny",
            "--tokenizer",
            str(tiny_model_dir),
            "--tasks",
            "2",
            "--max-new-tokens",
            "8",
            "--max-turns",
            "2",
            "--torch-threads",
            "3",
        ]
    )
    assert code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "mean_score" in out
    # generation runs on the server: a thread count given here would change nothing, and the run says so
    assert "--torch-threads 3 has no effect with --backend openai: the model runs on the server" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["eval", "arithmetic", "--model", "/no/such/model"], "model folder not found: /no/such/model"),
        (["eval", "no-such-env", "--model", "x"], "unknown env 'no-such-env'"),
        (["eval", "arithmetic", "--backend", "openai", "--model", "tiny"], "needs --base-url"),
        # Sampling and budget flags out of range: one line before the model loads (they failed every episode, raised,
        # or ran as something else: a negative temperature as greedy, top-p 2 as off, 0 turns as one).
        (["eval", "arithmetic", "--model", "x", "--temperature", "-1"], "--temperature must be 0 (greedy) or more"),
        (["eval", "arithmetic", "--model", "x", "--top-p", "2"], "--top-p must be above 0 and at most 1"),
        (["eval", "arithmetic", "--model", "x", "--top-k", "-5"], "--top-k must be 0 (off) or more, got -5"),
        (["eval", "arithmetic", "--model", "x", "--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
        (["eval", "arithmetic", "--model", "x", "--max-turns", "0"], "--max-turns must be at least 1, got 0"),
        (["eval", "arithmetic", "--model", "x", "--concurrency", "0"], "--concurrency must be at least 1, got 0"),
        (["eval", "arithmetic", "--model", "x", "--max-episode-tokens", "0"], "--max-episode-tokens must be at least"),
        # A server's flags without a remote backend: the local --model was evaluated, the server never asked.
        (
            ["eval", "arithmetic", "--model", "x", "--base-url", "http://127.0.0.1:1"],
            "--base-url goes with a remote --backend (openai, sglang, chat); --backend transformers runs --model in",
        ),
        (  # the server renders the conversation: a tokenizer (even a missing one) was silently unused
            [
                "eval",
                "arithmetic",
                "--backend",
                "chat",
                "--base-url",
                "http://127.0.0.1:1",
                "--model",
                "m",
                "--tokenizer",
                "/no/tok",
            ],
            "--tokenizer is not used by --backend chat: the server renders the conversation with its own template",
        ),
        (
            ["eval", "arithmetic", "--model", "x", "--served-model-name", "m"],
            "--served-model-name goes with a remote --backend (openai, sglang, chat); --backend transformers runs",
        ),
    ],
)
def test_eval_cli_errors(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_greedy_samples_of_one_task_are_said_to_be_one_episode(tiny_model_dir, capsys):
    """``--samples 3 --temperature 0`` plays three copies of one greedy episode: pass@3 is pass@1, said now."""
    argv = ["eval", "arithmetic", "--model", str(tiny_model_dir), "--tasks", "1", "--samples", "2"]
    assert main([*argv, "--max-new-tokens", "2", "--temperature", "0", "--json"]) == 0
    assert (
        "warning: --samples 2 with greedy decoding (--temperature 0 or --top-k 1): every sample of a task is the "
        in (capsys.readouterr().err)
    )
    assert main([*argv, "--max-new-tokens", "2", "--json"]) == 0
    assert "greedy" not in capsys.readouterr().err


def test_a_folder_that_is_not_a_model_is_one_line(tmp_path, capsys):
    """transformers' loading errors run over several lines (an empty folder: five); envkit's is one."""
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["eval", "arithmetic", "--model", str(empty), "--tasks", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot load a tokenizer from {empty}: ") and err.count("\n") == 1, err


def test_eval_cli_server_that_does_not_answer(tiny_model_dir, capsys):
    url = f"http://127.0.0.1:{free_port()}"
    code = main(
        [
            "eval",
            "arithmetic",
            "--backend",
            "openai",
            "--base-url",
            url,
            "--model",
            "tiny",
            "--tokenizer",
            str(tiny_model_dir),
        ]
    )
    assert code == 2
    assert f"the server at {url} does not answer" in capsys.readouterr().err


def test_eval_console_script_has_no_traceback_for_user_errors(tmp_path):
    result = subprocess.run(
        [ENVKIT, "eval", "hotel-booking", "--model", str(tmp_path / "missing")], capture_output=True, text=True
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr and "model folder not found" in result.stderr


def test_eval_a_tool_env_on_a_template_without_tools_is_one_line(tiny_model_dir, tmp_path, capsys):
    import shutil

    model = tmp_path / "no-tools"
    shutil.copytree(tiny_model_dir, model)
    (model / "chat_template.jinja").write_text(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    assert main(["eval", "arithmetic", "--model", str(model), "--tasks", "1", "--max-new-tokens", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: ") and "does not render tool definitions" in err and "chat_template=" in err


def test_eval_max_completion_tokens_caps_each_episode_as_training_does(tiny_model_dir, tmp_path, capsys):
    """`envkit eval --max-completion-tokens N`: no episode's completion (model + env tokens after the prompt) passes
    N, and an episode cut by it says so, as in `envkit train`; without the flag the same episodes run longer."""
    out, free = tmp_path / "capped.jsonl", tmp_path / "free.jsonl"
    argv = ["eval", "arithmetic", "--model", str(tiny_model_dir), "--tasks", "4", "--max-new-tokens", "16"]
    argv += ["--max-turns", "3", "--json"]
    assert main([*argv, "--out", str(free)]) == 0
    assert main([*argv, "--max-completion-tokens", "10", "--out", str(out)]) == 0
    capsys.readouterr()
    capped = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(len(e["completion_ids"]) <= 10 for e in capped)
    assert any(e["finish_reason"] == "max_episode_tokens" and "budget" in e["turn_finish_reasons"] for e in capped)
    assert max(len(json.loads(line)["completion_ids"]) for line in free.read_text().splitlines()) > 10
    assert main([*argv, "--max-completion-tokens", "0"]) == 2
    assert capsys.readouterr().err == "error: --max-completion-tokens must be at least 1, got 0\n"


def test_eval_step_timeout_flag_reaches_the_engine_and_its_message_names_it(tiny_model_dir, tmp_path, capsys):
    # An env whose step blocks until the test ends, evaluated with --step-timeout 10: the episode ends as a timeout
    # whose error names the flag that fixes it (if the env is really that slow). The episode's first rendering call
    # is timed too and builds the renderer (probing the template: seconds on a loaded machine; 0.3 s failed it at
    # load 7, 5 s at load 20), so the deadline is far above it: only the blocked step can pass it.
    out = tmp_path / "episodes.jsonl"
    with hung_step_env_file(tmp_path) as env:
        argv = ["eval", env, "--model", str(tiny_model_dir), "--tasks", "1"]
        argv += ["--max-new-tokens", "4", "--step-timeout", "10", "--out", str(out), "--json"]
        assert main(argv) == 1  # its one episode failed: error rate 1.0 > --max-error-rate 0.5
    (episode,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert episode["finish_reason"] == "timeout" and "took longer than 10s" in episode["error"]
    assert "--step-timeout" in episode["error"]
    assert "first: env step took longer than 10s" in capsys.readouterr().err.splitlines()[-1]
    for flag in ("--step-timeout", "--generate-timeout"):
        assert main(["eval", "arithmetic", "--model", str(tiny_model_dir), flag, "0"]) == 2
        assert capsys.readouterr().err == f"error: {flag} must be a positive number of seconds, got 0\n"
    config = tmp_path / "eval.yaml"
    config.write_text(f"env: arithmetic\nmodel: {tiny_model_dir}\ngenerate_timeout: null\n")  # null: one line too
    assert main(["eval", "--config", str(config)]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: --config {config}: generate_timeout: needs a value") and error.count("\n") == 1
    assert "leave the key out for the default, 1800.0" in error


def broken_reset_env_file(folder: Path) -> str:
    """Write ``broken_env.py``: a CounterEnv whose reset raises for task seeds below its ``failing`` argument."""
    path = folder / "broken_env.py"
    path.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from helpers import CounterEnv\n\n"
        "class BrokenReset(CounterEnv):\n"
        "    def __init__(self, failing=0):\n"
        "        super().__init__()\n"
        "        self.failing = failing\n\n"
        "    def reset(self, *, seed=None, options=None):\n"
        "        if seed is not None and seed < self.failing:\n"
        "            raise RuntimeError(f'database offline for task {seed}')\n"
        "        return super().reset(seed=seed, options=options)\n"
    )
    return f"{path}:BrokenReset"


@pytest.mark.parametrize("as_json", [False, True])
def test_eval_exits_non_zero_with_one_line_when_the_error_rate_passes_max_error_rate(
    tiny_model_dir, tmp_path, capsys, as_json
):
    # Every episode errors (seen with OpenEnv envs: error_rate 1.0, exit 0): the run exits 1 with one line naming
    # the first error, after writing every episode and printing the metrics (nothing is lost).
    out = tmp_path / "episodes.jsonl"
    argv = ["eval", broken_reset_env_file(tmp_path), "--env-config", '{"failing": 4}', "--model", str(tiny_model_dir)]
    argv += ["--tasks", "4", "--samples", "2", "--max-new-tokens", "4", "--out", str(out)]
    assert main([*argv, *(["--json"] if as_json else [])]) == 1
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("error")]  # not the progress bars
    assert len(errors) == 1 and errors[0] == captured.err.strip().splitlines()[-1], captured.err
    assert errors[0].startswith("error: 8 of 8 episodes failed (") and "Traceback" not in captured.err  # no "step"
    assert "error rate 1.00 > --max-error-rate 0.5" in errors[0] and "database offline for task 0" in errors[0]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 8 and all("database offline" in line["error"] for line in lines)
    if as_json:
        assert json.loads(captured.out)["error_rate"] == 1.0
    else:
        assert "error_rate" in captured.out and "episodes written to" in captured.out


def test_eval_error_rate_at_or_below_max_error_rate_exits_zero(tiny_model_dir, tmp_path, capsys):
    spec = broken_reset_env_file(tmp_path)
    argv = ["eval", spec, "--model", str(tiny_model_dir), "--tasks", "4", "--max-new-tokens", "4", "--json"]
    assert main([*argv, "--env-config", '{"failing": 1}']) == 0  # 1 of 4 failed: 0.25 <= the default 0.5
    assert json.loads(capsys.readouterr().out)["error_rate"] == 0.25
    assert main([*argv, "--env-config", '{"failing": 4}', "--max-error-rate", "1"]) == 0  # 1.0 allows every failure
    assert json.loads(capsys.readouterr().out)["error_rate"] == 1.0
    assert main([*argv, "--env-config", '{"failing": 1}', "--max-error-rate", "0.2"]) == 1  # 0.25 > 0.2
    assert "1 of 4 episodes failed" in capsys.readouterr().err
    for bad in ("-0.1", "1.5"):
        assert main([*argv, "--max-error-rate", bad]) == 2
        assert capsys.readouterr().err == f"error: --max-error-rate must be between 0 and 1, got {bad}\n"


def test_eval_stops_in_one_line_when_abandoned_env_threads_pass_the_limit(
    tiny_model_dir, tmp_path, capsys, monkeypatch
):
    # Thread workers cannot kill a hung step: past their limit of leaked threads the run stops, in one line that
    # recommends process workers (a traceback before). The limit is lowered to 0 so one hung step passes it.
    import envkit.workers

    original = envkit.workers.ThreadWorkers.__init__

    def no_leaks_allowed(self, concurrency=32, *, max_leaked=None):
        original(self, concurrency, max_leaked=0)

    monkeypatch.setattr(envkit.workers.ThreadWorkers, "__init__", no_leaks_allowed)
    with hung_step_env_file(tmp_path) as env:  # only the hung step can pass 10 s (see the test above)
        argv = ["eval", env, "--model", str(tiny_model_dir), "--tasks", "1"]
        assert main([*argv, "--max-new-tokens", "4", "--step-timeout", "10"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("error: 1 env calls that timed out")
    assert "use --env-workers processes" in err
