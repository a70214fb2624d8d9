"""``envkit init NAME``: a new env module, its tests and a README snippet, from templates shipped in the package.

The templates live in ``envkit/scaffold_templates`` (``string.Template`` files, installed as package data); nothing
outside the package is read. The generated env passes ``envkit validate`` and its generated tests as written, so a
new env starts from a working example of the contract rather than from an empty class.
"""

from __future__ import annotations

import importlib.util
import keyword
import re
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_][A-Za-z0-9]+)*")
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+|[0-9]+")
# Module names the generated files import themselves: a module of the same name would shadow them.
_TAKEN = {"envkit", "pytest", "gymnasium", "numpy", "pydantic", "transformers", "torch", "trl", "conftest"}

_SUMMARIES = {
    True: "a tool env where the agent prices a shopping question with `lookup_price` and ends it with `submit_answer`.",
    False: "a multi-turn text env without tools where the agent adds up numbers, with a hint after each wrong answer.",
}


class ScaffoldError(ValueError):
    """``envkit init`` cannot write the env: a bad NAME or a file that already exists (one line, naming it)."""


@dataclass(frozen=True)
class EnvNames:
    """The names derived from ``envkit init NAME``: e.g. ``weather-lookup`` gives module ``weather_lookup``,
    class ``WeatherLookupEnv`` and short name ``weather-lookup``."""

    module: str
    """snake_case: the module file ``<module>.py`` and its test ``test_<module>.py``."""
    class_name: str
    """CamelCase, ending in ``Env``."""
    name: str
    """kebab-case, for ``envkit.register``."""
    title: str
    """Words for headings: ``Weather lookup``."""


def env_names(name: str) -> EnvNames:
    """Derive the module, class and short names from NAME (kebab-case, snake_case or CamelCase).

    Raises:
        ScaffoldError: NAME is not letters and digits in words joined by ``-`` or ``_``, or its module name is a
            Python keyword or shadows a standard-library or required module.
    """
    if not _NAME.fullmatch(name):
        raise ScaffoldError(
            f"NAME {name!r} must start with a letter and hold only letters, digits and single - or _ between words "
            "(e.g. weather-lookup, weather_lookup or WeatherLookup)"
        )
    words = [word.lower() for part in re.split(r"[-_]", name) for word in _WORD.findall(part)]
    module = "_".join(words)
    if (
        keyword.iskeyword(module)
        or module in _TAKEN
        or module in getattr(sys, "stdlib_module_names", ())
        or importlib.util.find_spec(module) is not None  # an installed package (datasets, tokenizers, ...)
    ):
        raise ScaffoldError(f"NAME {name!r} gives module {module!r}, which would shadow another module; pick another")
    class_words = [word.capitalize() for word in words]
    if class_words[-1] != "Env":
        class_words.append("Env")
    return EnvNames(
        module=module,
        class_name="".join(class_words),
        name="-".join(words),
        title=" ".join(words).capitalize(),
    )


def render_scaffold(names: EnvNames, *, tools: bool = True) -> dict[str, str]:
    """The generated files' names (relative to the target folder) and contents."""
    values = {
        "module": names.module,
        "class_name": names.class_name,
        "name": names.name,
        "title": names.title,
        "summary": _SUMMARIES[tools],
    }
    extra_tests = _render("tool_tests.py.tmpl", values) if tools else ""
    return {
        f"{names.module}.py": _render("tool_env.py.tmpl" if tools else "text_env.py.tmpl", values),
        f"test_{names.module}.py": _render("test_env.py.tmpl", {**values, "extra_tests": extra_tests}),
        f"{names.module}_README.md": _render("README.md.tmpl", values),
    }


def write_scaffold(
    name: str, directory: str | Path | None = None, *, tools: bool = True
) -> tuple[EnvNames, list[Path]]:
    """Write the env module, its test file and a README snippet for NAME into ``directory``.

    ``directory`` defaults to a new folder named after the module in the current directory; it is created when
    missing. Nothing is ever overwritten: when any target file exists, nothing is written.

    Returns the derived names and the written paths. Raises :class:`ScaffoldError` for a bad NAME, an existing
    file or a folder that cannot be written.
    """
    names = env_names(name)
    folder = Path(directory) if directory is not None else Path(names.module)
    if folder.exists() and not folder.is_dir():
        raise ScaffoldError(f"{folder} exists and is not a folder")
    files = {folder / relative: text for relative, text in render_scaffold(names, tools=tools).items()}
    for path in files:
        if path.exists() or path.is_symlink():
            raise ScaffoldError(f"{path} already exists; not overwriting it (pick another NAME or --dir)")
    written: list[Path] = []
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for path, text in files.items():
            with path.open("x", encoding="utf-8") as handle:  # "x": never clobber a file created meanwhile
                handle.write(text)
            written.append(path)
    except OSError as error:
        for path in written:  # all or nothing: a half-written scaffold would not pass its own tests
            path.unlink(missing_ok=True)
        raise ScaffoldError(f"cannot write {error.filename or folder}: {error.strerror or error}") from None
    return names, written


def _render(template: str, values: dict[str, str]) -> str:
    text = resources.files("envkit.cli").joinpath("scaffold_templates", template).read_text(encoding="utf-8")
    return Template(text).substitute(values)
