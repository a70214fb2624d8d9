"""``python -m envkit.cli``: the ``envkit`` command (what ``accelerate launch -m envkit.cli train …`` runs)."""

from envkit.cli.app import console_main

console_main()
