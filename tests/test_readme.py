"""The README's Python examples run as written (a tiny local model stands in for ``model``/``tokenizer``), and every
name they import exists where they import it from."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import envkit
from envkit.testing import build_tiny_model, build_tokenizer

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


def block(starting: str) -> str:
    """The README's Python block whose first line starts with ``starting``."""
    found = [b for b in BLOCKS if b.lstrip().startswith(starting)]
    assert len(found) == 1, f"expected one README block starting {starting!r}, found {len(found)}"
    return found[0]


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_every_python_block_is_valid_python_and_its_imports_resolve(index: int) -> None:
    source = BLOCKS[index]
    if source.startswith("def "):
        source = "class _Any:\n" + "\n".join("    " + line for line in source.splitlines())  # a method, shown alone
    tree = ast.parse(source)
    imports = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    for node in imports:
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "openenv":
            pytest.importorskip("openenv")
        exec(compile(ast.Module(body=[node], type_ignores=[]), "README.md", "exec"), {})


def test_the_first_env_runs_and_scores_the_right_answer_only() -> None:
    namespace: dict = {}
    exec(block("import re\n\nimport envkit"), namespace)
    env = namespace["CapitalsEnv"]()
    opening, _ = env.reset(seed=0)
    country = env.country
    assert country in opening[0]["content"]
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "lookup_capital", "arguments": {"country": country}}}],
    }
    result, _, done, _, _ = env.step(call)
    capital = namespace["CAPITALS"][country]
    assert not done and result[0]["content"] == capital
    env.step({"role": "assistant", "content": f"The capital is {capital}."})
    assert env.score() == 1.0
    env.reset(seed=0)
    env.step({"role": "assistant", "content": "Paris, Tokyo or Lima."})
    assert env.score() == 0.0


@pytest.mark.slow
def test_the_rollout_and_process_worker_blocks_run_with_a_tiny_model(capsys: pytest.CaptureFixture[str]) -> None:
    tokenizer = build_tokenizer()
    namespace: dict = {"envkit": envkit, "model": build_tiny_model(tokenizer), "tokenizer": tokenizer}
    exec(block("from envkit.backends import TransformersBackend"), namespace)
    assert len(namespace["episodes"]) == 32
    assert "score" in capsys.readouterr().out
    namespace["backend"] = namespace["engine"].backend
    exec(block("from envkit.workers import EnvFactory"), namespace)
    try:
        episodes = namespace["engine"].run([0], 2, namespace["SamplingParams"](max_new_tokens=16))
        assert len(episodes) == 2 and all(e.finish_reason != "error" for e in episodes), [e.error for e in episodes]
    finally:
        namespace["engine"].close()


def test_the_shaped_reward_block_runs() -> None:
    namespace: dict = {}
    exec(block("from envkit.adapters.trl import make_reward_funcs"), namespace)
    funcs, weights = namespace["reward_funcs"], namespace["weights"]
    assert len(funcs) == 2 and weights[1] == 0.1
    one_call = [[{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}]]
    assert funcs[1](completions=[""], envkit_messages=one_call) == [1.0]
