"""The ``envkit`` command: the parser and entry point (:mod:`envkit.cli.app`), the short commands' bodies and the
helpers all share (:mod:`envkit.cli.commands`), ``envkit eval`` (:mod:`envkit.cli.evaluate`), ``envkit serve`` and
``serve-env`` (:mod:`envkit.cli.serve`), ``envkit play`` (:mod:`envkit.cli.play`), ``envkit rft``
(:mod:`envkit.cli.rft`), ``envkit model`` (:mod:`envkit.cli.model`), ``envkit init`` (:mod:`envkit.cli.scaffold`)
and ``envkit view`` (:mod:`envkit.cli.view`)."""

from envkit.cli.app import console_main, main

__all__ = ["console_main", "main"]
