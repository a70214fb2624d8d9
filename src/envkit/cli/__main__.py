"""``python -m envkit.cli``: the ``envkit`` command (what ``accelerate launch -m envkit.cli train …`` runs)."""

import sys

from envkit.cli.app import main
from envkit.util.process_exit import exit_without_finalizing, in_several_processes

code = main()
if in_several_processes():  # one of several gloo processes: see envkit.util.process_exit
    exit_without_finalizing(code or 0)
sys.exit(code)
