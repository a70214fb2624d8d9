"""Run by ``tests/test_train.py`` under ``accelerate launch --multi_gpu --num_processes 2`` (``use_cpu``: DDP over
gloo): ``envkit train`` as ``python -m envkit.cli`` runs it, then each process records what the run left to be kept
until the process ends (:func:`envkit.util.process_exit.keep_until_exit`: freeing a DDP model when the run returns
can deadlock with gloo's threads) in ``OUT/kept-rank{N}.json``, and ends as ``envkit`` does.

Usage: ``python ddp_train_script.py OUT ENVKIT-TRAIN-ARGS...``
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from envkit.cli.app import main
from envkit.util import process_exit

out = Path(sys.argv[1])
code = main(["train", *sys.argv[2:]])
kept = [type(owner).__name__ for owner in process_exit._KEPT_UNTIL_EXIT]
(out / f"kept-rank{os.environ['RANK']}.json").write_text(json.dumps(kept))
process_exit.exit_without_finalizing(code or 0)
