"""The newest complete checkpoint of every run cut midway under an output folder: what a commit carries to another
machine so that the run goes on from there instead of starting again (``python -m benchmarks.learning_rl
--in-progress`` prints them, one per line, for ``git add -f``: git ignores checkpoints)."""

from __future__ import annotations

from pathlib import Path

from .arms import last_grpo_checkpoint
from .training import CPU_SPENT_FILE, RESUME_FOLDER, latest_checkpoint


def in_progress(out: Path) -> list[Path]:
    """Under ``out``: each warm-start attempt's and SFT-to-its-plateau run's newest checkpoint with its selection
    (:func:`.training.latest_checkpoint`), each compute-matched SFT run's newest with its CPU time spent
    (:data:`.training.CPU_SPENT_FILE`), each GRPO run's newest with its elapsed time
    (:func:`.arms.last_grpo_checkpoint`) and each RFT run's checkpoint folder (``envkit rft --resume``'s); what each
    run would go on from, and nothing a finished run left (a run removes its checkpoints once it is saved)."""
    from envkit.adapters.trl.rft import CHECKPOINT_FOLDER

    found = [
        latest_checkpoint(folder) or latest_checkpoint(folder, CPU_SPENT_FILE)
        for folder in sorted(out.glob(f"*/seed-*/*/{RESUME_FOLDER}"))
    ]
    found += [last_grpo_checkpoint(run) for run in sorted(out.glob("*/seed-*/grpo-*")) if run.is_dir()]
    found += [c for c in sorted(out.glob(f"*/seed-*/rft-*/{CHECKPOINT_FOLDER}")) if _rft_rounds_to_resume(c.parent)]
    return [checkpoint for checkpoint in found if checkpoint is not None]


def _rft_rounds_to_resume(run: Path) -> int:
    """The rounds an RFT run in ``run`` would go on from; 0 for a finished run (whose checkpoint folder a cut left
    part-removed)."""
    from envkit.adapters.trl.rft import RFTConfigError, resume_point

    try:
        return resume_point(str(run))
    except RFTConfigError:
        return 0
