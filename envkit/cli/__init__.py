"""The ``envkit`` command: the parser and entry point (:mod:`envkit.cli.app`), each command's body
(:mod:`envkit.cli.commands`), ``envkit model`` (:mod:`envkit.cli.model`), ``envkit init`` (:mod:`envkit.cli.scaffold`)
and ``envkit view`` (:mod:`envkit.cli.view`)."""

from envkit.cli.app import console_main, main

__all__ = ["console_main", "main"]
