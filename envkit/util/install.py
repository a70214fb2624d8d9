"""How this envkit was installed, and the command that adds one of its extras to it.

envkit's distribution is ``envkit-rl`` (``envkit`` on PyPI is an unrelated package); the import name and the command
stay ``envkit``. Messages that ask for an optional dependency name the command that works for *this* install: from a
clone installed with ``pip install -e .``, ``pip install -e '/path/to/clone[EXTRA]'``; from a wheel or an index,
``pip install 'envkit-rl[EXTRA]'``. Read from the installed metadata (PEP 610's ``direct_url.json``), never assumed.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
from urllib.parse import unquote, urlparse

DISTRIBUTION = "envkit-rl"
"""envkit's distribution name (``pip install envkit-rl``; the import name is ``envkit``)."""


def version() -> str:
    """The installed envkit's version (``"unknown"`` when it runs from a source tree that was never installed)."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@functools.cache
def _editable_source() -> str | None:
    """The folder envkit was installed from with ``pip install -e``, or ``None`` (a wheel, an index, not installed)."""
    # Every copy of the metadata, not the first: Python started in the clone's root finds the ``envkit_rl.egg-info``
    # an editable build leaves there before the installed dist-info, and only the latter says where it came from.
    texts = [d.read_text("direct_url.json") for d in importlib.metadata.distributions(name=DISTRIBUTION)]
    text = next((t for t in texts if t), None)
    if not text:
        return None
    try:
        direct = json.loads(text)
    except json.JSONDecodeError:
        return None
    url = direct.get("url", "")
    if not direct.get("dir_info", {}).get("editable") or not url.startswith("file://"):
        return None
    return unquote(urlparse(url).path)


def install_command(extra: str) -> str:
    """The command that installs envkit's optional ``extra`` (``"tau2"``, ``"ray"``, …) into this install.

    Returns:
        ``pip install -e '/path/to/clone[extra]'`` for an editable install from a clone, else
        ``pip install 'envkit-rl[extra]'``.
    """
    source = _editable_source()
    if source is not None:
        return f"pip install -e '{source}[{extra}]'"
    return f"pip install '{DISTRIBUTION}[{extra}]'"
