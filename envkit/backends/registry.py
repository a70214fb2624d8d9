"""Backends by name: what ``envkit eval --backend NAME`` builds (:func:`register_backend`, :func:`build_backend`).

A registration names the class as an import string (``"module:Class"``), so reading the registry imports no backend
(``envkit --help`` stays fast); the class is imported when a backend is built, through its
:meth:`~BuildsFromOptions.from_options`. Adding a backend is one module and one :func:`register_backend` line at the
end of this one.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "BackendOptions",
    "BackendSpec",
    "BuildsFromOptions",
    "backend_names",
    "backend_spec",
    "build_backend",
    "register_backend",
]


@dataclass
class BackendOptions:
    """What a backend is built from: the command line's ``--model``, ``--tokenizer``, ``--base-url``, … ."""

    model: str
    """A local model folder (in-process backends), or the served model's name (``--served-model-name`` wins)."""
    tokenizer: Any = None
    """The model's tokenizer, loaded (None for message-level backends, which need none)."""
    base_urls: list[str] | None = None
    """The servers of a remote backend."""
    served_model_name: str | None = None
    """The name the server knows the model by (default: ``model``)."""
    api_key: str | None = None
    """Sent as ``Authorization: Bearer …`` by remote backends."""
    max_model_len: int | None = None
    """The model's context length, when the caller bounds it (an in-process vLLM engine is built with it)."""


@runtime_checkable
class BuildsFromOptions(Protocol):
    """A backend class the registry can build."""

    @classmethod
    def from_options(cls, options: BackendOptions) -> Any:
        """A backend for ``options``; raises ``ValueError`` (or the backend's own error) with one line on a bad one."""
        ...


@dataclass(frozen=True)
class BackendSpec:
    """One registered backend."""

    name: str
    """What ``--backend`` takes."""
    target: str
    """``"module:Class"``: the class, whose ``from_options`` builds it."""
    summary: str
    """One line for ``--help``."""
    remote: bool = False
    """It talks to servers: it needs ``--base-url``."""
    token_exact: bool = True
    """Token ids in, token ids and their logprobs out (it can train); False for message-level backends."""

    def load(self) -> BuildsFromOptions:
        """The backend class (imported now)."""
        module, _, name = self.target.partition(":")
        return getattr(importlib.import_module(module), name)


_BACKENDS: dict[str, BackendSpec] = {}


def register_backend(
    name: str, target: str, summary: str, *, remote: bool = False, token_exact: bool = True
) -> BackendSpec:
    """Register a backend under ``name`` (see :class:`BackendSpec` for the arguments); a name taken twice raises
    ``ValueError``."""
    if name in _BACKENDS:
        raise ValueError(f"a backend named {name!r} is already registered ({_BACKENDS[name].target})")
    if ":" not in target:
        raise ValueError(f"a backend target is 'module:Class', got {target!r}")
    spec = BackendSpec(name, target, summary, remote=remote, token_exact=token_exact)
    _BACKENDS[name] = spec
    return spec


def backend_names() -> list[str]:
    """Every registered backend's name, in registration order."""
    return list(_BACKENDS)


def backend_spec(name: str) -> BackendSpec:
    """The backend registered as ``name``; ``ValueError`` naming the registered ones otherwise."""
    try:
        return _BACKENDS[name]
    except KeyError:
        raise ValueError(f"no backend named {name!r}; choose one of {', '.join(_BACKENDS)}") from None


def build_backend(name: str, options: BackendOptions) -> Any:
    """The backend registered as ``name``, built from ``options``. Raises ``ValueError`` with one line when a remote
    backend has no server."""
    spec = backend_spec(name)
    if spec.remote and not options.base_urls:
        raise ValueError(f"--backend {name} needs --base-url (e.g. http://127.0.0.1:8000)")
    return spec.load().from_options(options)


register_backend(
    "transformers", "envkit.backends.transformers:TransformersBackend", "a Hugging Face model in this process"
)
register_backend("vllm", "envkit.backends.vllm:AsyncVLLMBackend", "vLLM in this process (AsyncLLM)")
register_backend(
    "openai", "envkit.backends.openai:OpenAIBackend", "OpenAI-compatible /v1/completions servers", remote=True
)
register_backend("sglang", "envkit.backends.sglang:SGLangBackend", "SGLang servers (/generate)", remote=True)
register_backend(
    "chat",
    "envkit.backends.chat_completions:ChatCompletionsBackend",
    "any OpenAI-compatible /v1/chat/completions endpoint (evaluation only: not token-exact)",
    remote=True,
    token_exact=False,
)
