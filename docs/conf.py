"""Sphinx configuration of envkit's documentation site: MyST Markdown pages, the furo theme, and the API reference from
the docstrings (autodoc + napoleon, Google ``Args:`` sections). Built offline by ``bash scripts/docs.sh`` into
``docs/_build/html`` with ``-W -n``: every warning and every unresolved cross-reference fails the build."""

from __future__ import annotations

import inspect
from pathlib import Path

from docutils.nodes import Element
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.ext.napoleon.docstring import GoogleDocstring
from sphinx.util.nodes import make_refnode

import envkit

project = "envkit"
author = "envkit contributors"
copyright = "envkit contributors, Apache-2.0"
release = envkit.__version__
version = release

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
root_doc = "index"
# docs/notebook/ keeps dated session notes (measurements as they were taken): in the repository, not in the site.
exclude_patterns = ["_build", "notebook", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
autodoc_default_options = {"members": True, "undoc-members": True, "show-inheritance": True}
autodoc_class_signature = "mixed"
# Classes that subclass TRL's or Gymnasium's show envkit's docstrings, not the parents' (written for another site).
autodoc_inherit_docstrings = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
# An "Attributes:" section as fields of the class, not as attribute entries that would repeat the fields autodoc lists.
napoleon_use_ivar = True

# -n makes every unresolved reference an error. References into other projects (gymnasium, torch, transformers, TRL,
# the standard library's modules, ...) could only resolve through intersphinx, which downloads their inventories:
# the build is offline, so those are left as plain text. A broken reference to envkit itself still fails.
nitpicky = True
_OUTSIDE = (
    "gymnasium|torch|transformers|trl|peft|accelerate|datasets|numpy|np|pydantic|httpx|jinja2|vllm|openenv|mcp|ray|"
    "rich|tqdm|yaml|fastapi|starlette|uvicorn|websockets|tokenizers|jsonschema|matplotlib|reasoning_gym|textarena|"
    "py4j|scienceworld|textworld_express|"
    "tau2|argparse|asyncio|collections|concurrent|contextlib|dataclasses|enum|functools|io|json|logging|"
    "multiprocessing|os|pathlib|queue|random|re|selectors|signal|socket|subprocess|sys|threading|types|typing|"
    "typing_extensions|weakref|abc|inspect|_thread|_asyncio|builtins|http|urllib|ssl|ast|datetime|fastmcp|decimal|"
    "shlex|tempfile|time|traceback|uuid|hashlib|math|operator|copy|pickle|string|textwrap|itertools|heapq|struct"
)
# pathlib.Path in a type hint, unqualified as ``from __future__ import annotations`` left it.
nitpick_ignore = [("py:class", "Path")]
nitpick_ignore_regex = [
    (r"py:.*", rf"({_OUTSIDE})(\..*)?"),
    # Type variables and names only valid inside a signature (``T``, ``P.args``) are not documented objects.
    (r"py:.*", r"(.*\.)?[A-Z](\.(args|kwargs))?"),
]


def _attribute_docstring_as_prose(self: GoogleDocstring) -> list[str]:
    """An attribute's docstring as written: envkit writes them as prose ("The full transcript: ..."), which napoleon
    would otherwise split at the first colon and read the words before it as the attribute's type."""
    return self._format_field("", "", self._consume_to_end())


GoogleDocstring._parse_attribute_docstring = _attribute_docstring_as_prose


def _resolve_anywhere(app: Sphinx, env: BuildEnvironment, node: Element, contnode: Element) -> Element | None:
    """Resolve a Python reference the way a reader of the docstring would.

    Docstrings name things as their own module sees them (``:class:`ScriptedUser``` in a module that imports it),
    which Sphinx looks up only in the referring module. When that fails, the reference goes to the one documented
    object whose qualified name ends with it (the closest to the referring module when several do); a private name
    (``_post``) is left as code, as it is not in the reference. Anything else stays unresolved and fails the build.
    """
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip(".~")
    if target.rsplit(".", 1)[-1].startswith("_"):
        return contnode
    domain = env.domains.python_domain
    last = target.rsplit(".", 1)[-1]
    matches = domain.find_obj(env, None, None, target, node.get("reftype"), 1)
    if not matches and "." in target:  # a path the object is not documented under (envkit.core.env.Ending, re-exported)
        wanted = _import_object(target)
        if wanted is not _MISSING and wanted is not None:
            candidates = domain.find_obj(env, None, None, last, None, 1)
            matches = [m for m in candidates if _import_object(m[0]) is wanted]
    if not matches:
        return contnode if _exists(node, target) else None
    here = node.get("py:module") or ""

    def closeness(match: tuple[str, object]) -> tuple[int, int]:
        parts, ours = match[0].split("."), here.split(".")
        shared = next(
            (i for i, (a, b) in enumerate(zip(parts, ours, strict=False)) if a != b), min(len(parts), len(ours))
        )
        return (-shared, len(match[0]))

    name, entry = min(matches, key=closeness)
    return make_refnode(app.builder, node["refdoc"], entry.docname, entry.node_id, contnode, name)


def _exists(node: Element, target: str) -> bool:
    """Whether a reference names something real that the reference pages do not list (a module constant, a type alias,
    an attribute a class sets in ``__init__`` or inherits from Gymnasium): then it is shown as code. A name that exists
    nowhere (a typo, a renamed function) is not, and fails the build."""
    module, cls = node.get("py:module") or "", node.get("py:class") or ""
    for dotted in (target, f"{module}.{target}", f"{module}.{cls}.{target}"):
        if _import_object(dotted.strip(".")) is not _MISSING:
            return True
    owner = _import_object(f"{module}.{cls}") if cls else None
    if "." in target and not inspect.isclass(owner):  # ``envkit.Env.ending``: an attribute its class sets
        owner = _import_object(target.rsplit(".", 1)[0])
    if inspect.isclass(owner):
        attribute = target.rsplit(".", 1)[-1]
        try:
            sources = [inspect.getsource(k) for k in owner.__mro__ if k.__module__ != "builtins"]
        except (OSError, TypeError):
            return False
        return any(f"self.{attribute} " in source for source in sources)
    return False


_MISSING = object()
"""What :func:`_import_object` returns for a path naming nothing (``None`` is a value a class attribute may have)."""


def _import_object(dotted: str) -> object:
    """The object a dotted path names (a module, or attributes down from the longest importable module), or _MISSING."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attribute in parts[cut:]:
                value = getattr(value, attribute)
        except Exception:  # a property, a pydantic model's class attribute: anything may raise; then it is not found
            return _MISSING
        return value
    return _MISSING


def _skip_foreign(app: Sphinx, what: str, name: str, obj: object, skip: bool, options: object) -> bool | None:
    """Leave out members defined outside envkit (a TRL config class a module imports): their docs are their own."""
    module = getattr(obj, "__module__", None)
    if isinstance(module, str) and (inspect.isclass(obj) or inspect.isroutine(obj)) and not module.startswith("envkit"):
        return True
    return None


def _verbatim_upstream_tools(app: Sphinx, what: str, name: str, obj: object, options: object, lines: list[str]) -> None:
    """τ²-bench's tool docstrings are upstream's text, shown to the model as it is: render them as written."""
    if what == "method" and name.startswith("envkit.envs.tau2.") and name.split(".")[-2].endswith("Tools") and lines:
        lines[:] = ["::", "", *("   " + line for line in lines), ""]


def setup(app: Sphinx) -> None:
    """Hook the helpers above into the build."""
    app.connect("missing-reference", _resolve_anywhere)
    app.connect("autodoc-skip-member", _skip_foreign)
    app.connect("autodoc-process-docstring", _verbatim_upstream_tools)


# "more than one target found": a name documented on two classes (a field called ``type``); the first is taken.
suppress_warnings = ["ref.python"]

html_theme = "furo"
html_title = f"envkit {release}"
html_static_path: list[str] = []
html_show_sourcelink = False
html_copy_source = False
html_last_updated_fmt = None
html_theme_options = {"navigation_with_keys": True}


# ---- The API reference: one page per public subpackage, written here before Sphinx reads the sources, so a new module
# or export appears without editing a list. A package page documents what the package exports (its ``__all__``), then
# each public submodule with what it defines beyond that (so every name has one entry and every module a target).
API_PACKAGES: dict[str, str] = {
    "envkit": "The top-level API: what `import envkit` gives.",
    "envkit.core": "The env contract: `Env`, `ToolEnv`, `@tool`, messages, endings.",
    "envkit.chat": "Token-exact chat rendering and reply parsing.",
    "envkit.registry": "Env names, specs and `make`.",
    "envkit.models": "Getting a model offline.",
    "envkit.validate": "`envkit validate`'s checks.",
    "envkit.backends": "Generation backends: token ids in, tokens and logprobs out.",
    "envkit.workers": "Env workers: threads, processes, Ray.",
    "envkit.rollout": "The rollout engine and `Episode`.",
    "envkit.serving": "The OpenAI-compatible model server and hosted env workers.",
    "envkit.util": "Helpers: the background loop, options files, torch threads, child processes.",
    "envkit.testing": "Tiny local models and tokenizers for tests and examples.",
    "envkit.demos": "Oracle demonstrations as token-exact trajectories.",
    "envkit.cli": "The `envkit` command's modules (its flags: the CLI reference).",
    "envkit.adapters.trl": "TRL: `rollout_func`, datasets, rewards, `envkit train` and `--async`.",
    "envkit.adapters.vllm": "vLLM servers envkit starts: command lines, placement, LoRA kernels, weight publishing.",
    "envkit.adapters.openenv": "OpenEnv: serve an env, consume one.",
    "envkit.adapters.mcp": "MCP tool servers as envs.",
    "envkit.adapters.reasoning_gym": "reasoning-gym datasets as envs.",
    "envkit.adapters.textarena": "TextArena games as envs.",
    "envkit.adapters.textworld_express": "TextWorldExpress games as envs, and the JVMs Java games run in.",
    "envkit.adapters.scienceworld": "ScienceWorld tasks as envs.",
    "envkit.envs": "The built-in envs (each one's page: Environments).",
}


def _submodules(package: str) -> list[str]:
    """The public submodules of ``package`` (recursively, from its folder's files), in name order; none for a module."""
    import importlib

    source = Path(importlib.import_module(package).__file__ or "")
    if source.name != "__init__.py":
        return []
    found = []
    for path in sorted(source.parent.iterdir()):
        name = f"{package}.{path.stem}"
        if path.name.startswith("_") or name in API_PACKAGES:
            continue
        if path.suffix == ".py":
            found.append(name)
        elif (path / "__init__.py").exists():
            found += [name, *_submodules(name)]
    return found


def _home(value: object) -> str | None:
    """The API package that documents ``value``: the longest one its defining module lies in."""
    module = getattr(value, "__module__", None) or ""
    homes = [p for p in API_PACKAGES if module == p or module.startswith(p + ".")]
    return max(homes, key=len) if homes else None


def _api_page(package: str, summary: str) -> str:
    """The MyST source of one package's API page.

    A class or function the package exports is documented here when it is defined inside the package; one it
    re-exports from another package (``envkit.ToolEnv``, ``envkit.rollout.SamplingParams``) is listed with a link to
    where it is documented, so each object has one entry. Submodules follow, without what the package already shows.
    """
    import importlib
    import inspect

    module = importlib.import_module(package)
    exported = list(getattr(module, "__all__", []))
    routines = [n for n in exported if inspect.isclass(getattr(module, n)) or inspect.isroutine(getattr(module, n))]
    elsewhere = [n for n in routines if _home(getattr(module, n)) not in (package, None)]
    lines = [f"# `{package}`", "", summary, "", "```{eval-rst}", f".. automodule:: {package}"]
    if not exported:
        lines.append("   :no-members:")
    elif elsewhere:
        lines.append(f"   :exclude-members: {', '.join(elsewhere)}")
    lines += ["```", ""]
    if elsewhere:
        lines += [
            "Also exported here, documented where they are defined:",
            "",
            "| name | documented as |",
            "| --- | --- |",
        ]
        for name in elsewhere:
            value = getattr(module, name)
            home = _home(value)
            where = home if name in getattr(importlib.import_module(home), "__all__", []) else value.__module__
            lines.append(f"| `{package}.{name}` | {{py:obj}}`{where}.{name}` |")
        lines.append("")
    for name in _submodules(package):
        # Imported now, before Sphinx's extensions are in play: fastmcp's pydantic models (imported by the OpenEnv
        # server module) fail to build when first imported from inside autodoc.
        importlib.import_module(name)
        lines += [f"## `{name}`", "", "```{eval-rst}", f".. automodule:: {name}"]
        if routines:
            lines.append(f"   :exclude-members: {', '.join(routines)}")
        lines += ["```", ""]
    return "\n".join(lines)


def write_api_pages(folder: Path) -> None:
    """Write ``folder``/*.md (a file is rewritten only when its text changes, so Sphinx's cache stays valid)."""
    folder.mkdir(parents=True, exist_ok=True)
    pages = {
        "index": "\n".join(
            [
                "# API reference",
                "",
                "One page per public subpackage, from the docstrings. The command line is in",
                "[the CLI reference](../cli.md).",
                "",
                "```{toctree}",
                ":maxdepth: 1",
                "",
                *API_PACKAGES,
                "```",
                "",
            ]
        )
    }
    pages.update({package: _api_page(package, summary) for package, summary in API_PACKAGES.items()})
    for name, text in pages.items():
        path = folder / f"{name}.md"
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")


write_api_pages(Path(__file__).parent / "reference" / "api")
