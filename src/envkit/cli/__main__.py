"""``python -m envkit.cli``: the ``envkit`` command (what ``accelerate launch -m envkit.cli train …`` runs)."""

import sys

from envkit.cli.app import main

sys.exit(main())
