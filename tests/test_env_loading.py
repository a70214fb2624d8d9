"""Loading envs from files and modules (issue 23 item 6): multi-file envs, the current directory, a file without
``:Class``, and a negative ``--seed``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import envkit
from envkit.cli.app import main
from envkit.registry import EnvSpecError

ENVKIT = str(Path(sys.executable).with_name("envkit"))

WORLD = "TARGET = 'forty-two'\n"
ENV_BODY = (
    "\n\nclass {name}(envkit.Env):\n"
    "    max_turns = 2\n\n"
    "    def reset(self, *, seed=None, options=None):\n"
    "        super().reset(seed=seed, options=options)\n"
    "        return [{{'role': 'user', 'content': 'Say ' + TARGET}}], {{}}\n\n"
    "    def step(self, action):\n"
    "        return [], self.score(), True, False, {{}}\n\n"
    "    def score(self):\n"
    "        said = [m['content'] for m in self.messages if m['role'] == 'assistant']\n"
    "        return float(bool(said) and said[-1] == TARGET)\n\n"
    "    def oracle(self):\n"
    "        return TARGET\n"
)


def write_env(folder: Path, import_line: str, name: str = "SayEnv", file: str = "env.py") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "world.py").write_text(WORLD)
    path = folder / file
    path.write_text("import envkit\n" + import_line + "\n" + ENV_BODY.format(name=name))
    return path


def played(spec: str) -> float:
    env = envkit.make(spec)
    env.reset(seed=0)
    env.step(env.oracle())
    return env.score()


def test_a_file_spec_imports_its_sibling_module(tmp_path):
    path = write_env(tmp_path / "plain_env", "from world import TARGET")
    assert played(f"{path}:SayEnv") == 1.0


def test_a_file_spec_in_a_package_imports_its_siblings_relatively_and_absolutely(tmp_path):
    folder = tmp_path / "say_pkg"
    write_env(folder, "from .world import TARGET")
    (folder / "__init__.py").write_text("from .env import SayEnv\n")
    assert played(f"{folder / 'env.py'}:SayEnv") == 1.0
    absolute = write_env(tmp_path / "say_abs", "from say_abs.world import TARGET", file="absolute.py")
    (absolute.parent / "__init__.py").write_text("")
    assert played(f"{absolute}:SayEnv") == 1.0


def test_a_file_that_imports_no_sibling_leaves_sys_path_alone(tmp_path):
    """Else every loaded file's folder would shadow modules for the rest of the process (envkit init refuses a NAME
    whose module is importable)."""
    path = tmp_path / "lonely" / "lonely_env.py"
    path.parent.mkdir()
    path.write_text("import envkit\nTARGET = 'forty-two'\n" + ENV_BODY.format(name="SayEnv"))
    before = list(sys.path)
    assert played(f"{path}:SayEnv") == 1.0
    assert sys.path == before


def test_a_multi_file_env_file_runs_in_process_workers(tmp_path):
    """Workers resolve the spec themselves: the sibling import must work there too (episodes would all error)."""
    import asyncio

    from envkit.workers import EnvFactory
    from envkit.workers.processes import ProcessWorkers

    path = write_env(tmp_path / "proc_env", "from world import TARGET")
    factory = EnvFactory(f"{path}:SayEnv")
    workers = ProcessWorkers(concurrency=1)
    try:

        async def episode() -> float:
            session = await workers.open(factory, timeout_s=60)
            try:
                await session.reset(0, timeout_s=30)
                await session.step({"role": "assistant", "content": "forty-two"}, timeout_s=30)
                return await session.score(timeout_s=30)
            finally:
                session.close()

        assert asyncio.run(episode()) == 1.0
    finally:
        workers.close()


def test_a_file_with_one_env_class_needs_no_class_name(tmp_path):
    path = write_env(tmp_path / "one", "from world import TARGET")
    assert envkit.registry.resolve(str(path)).__name__ == "SayEnv"
    assert played(str(path)) == 1.0


def test_a_file_with_several_env_classes_names_them(tmp_path):
    path = write_env(tmp_path / "two", "from world import TARGET")
    path.write_text(path.read_text() + ENV_BODY.format(name="OtherEnv"))
    with pytest.raises(EnvSpecError, match=r"2 env classes \(OtherEnv, SayEnv\): name one, e.g. .*two/env.py:OtherEnv"):
        envkit.registry.resolve(str(path))
    empty = tmp_path / "empty.py"
    empty.write_text("import envkit\n")
    with pytest.raises(EnvSpecError, match="defines no env class"):
        envkit.registry.resolve(str(empty))


def run_console(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([ENVKIT, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_module_spec_resolves_from_the_current_directory_in_the_console_script(tmp_path):
    write_env(tmp_path, "from world import TARGET", file="say_here.py")
    result = run_console(["play", "say_here:SayEnv"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "forty-two" in result.stdout
    # A file with one env class, given without ':Class', through the console script as well
    result = run_console(["play", "say_here.py"], tmp_path)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("command", [["play", "arithmetic"], ["validate", "arithmetic"], ["eval", "arithmetic"]])
def test_a_negative_seed_is_one_line_naming_the_flag(command, capsys):
    assert main([*command, "--seed", "-1", *(["--model", "x"] if command[0] == "eval" else [])]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "error: --seed must be 0 or more (a task seed; gymnasium refuses negative seeds), got -1"
    ]
