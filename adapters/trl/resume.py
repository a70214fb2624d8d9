"""The TrainingArguments fields that Trainer leaves to scripts, and what ``envkit train`` does with each.

transformers documents four fields as "Not directly used by Trainer; intended for training/evaluation scripts".
Every GRPOConfig field is an ``envkit train`` flag, so each of them is a flag a script must honour or refuse: a flag
parsed and then ignored is a silent failure (``--resume-from-checkpoint`` once started training from scratch).
:data:`SCRIPT_FIELDS` says what happens to each; a test derives the set from transformers' own help texts, so a
field added upstream fails CI until it is listed here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envkit.adapters.trl.config import TrainUsageError

LAST = "last"
"""``--resume-from-checkpoint last``: the newest ``checkpoint-N`` folder in ``--output-dir``."""

SCRIPT_FIELDS: dict[str, str] = {
    "resume_from_checkpoint": "honoured: training goes on from that checkpoint (or `last`)",
    "do_train": "envkit train always trains; `false` is refused (evaluate alone with envkit eval)",
    "do_eval": "refused when true: envkit train evaluates with --eval-tasks N, before and after training",
    "do_predict": "refused when true: envkit train has no test-set prediction (envkit eval scores a model)",
}
"""Each TrainingArguments field that Trainer leaves to scripts, with what ``envkit train`` does with it."""


def check_script_fields(config: Any, given: frozenset[str]) -> None:
    """Refuse, in one line, a script-only field set to what envkit train would not do (:data:`SCRIPT_FIELDS`);
    ``given``: the GRPOConfig fields the command line or ``--config`` set."""
    if "do_train" in given and not config.do_train:
        raise TrainUsageError("--do-train false: envkit train always trains; evaluate a model alone with envkit eval")
    if "do_eval" in given and config.do_eval:  # eval_strategy alone also sets it: only what the user gave
        raise TrainUsageError(
            "--do-eval is not used by envkit train: it evaluates on --eval-tasks N held-out tasks before and after "
            "training (0 turns that off)"
        )
    if "do_predict" in given and config.do_predict:
        raise TrainUsageError("--do-predict is not used by envkit train: score a model with envkit eval")


def resolve_checkpoint(config: Any, *, lora: bool) -> str | None:
    """``--resume-from-checkpoint`` as the checkpoint folder training goes on from (None: from the start), or a
    :class:`TrainUsageError` naming the fix: ``last`` with no checkpoint in ``--output-dir``, a folder that is not a
    Trainer checkpoint, or one whose weights are the other kind (a LoRA adapter for ``--no-lora``, full weights for a
    LoRA run: Trainer would only warn, and train the untouched model)."""
    value = config.resume_from_checkpoint
    if value is None or value == "":
        return None
    from transformers.trainer import TRAINER_STATE_NAME
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint
    from transformers.utils import (
        ADAPTER_SAFE_WEIGHTS_NAME,
        ADAPTER_WEIGHTS_NAME,
        SAFE_WEIGHTS_INDEX_NAME,
        SAFE_WEIGHTS_NAME,
        WEIGHTS_INDEX_NAME,
        WEIGHTS_NAME,
    )

    save_hint = "save checkpoints with --save-strategy steps --save-steps N"
    if str(value).lower() == LAST:
        output = Path(config.output_dir).expanduser()
        found = get_last_checkpoint(str(output)) if output.is_dir() else None
        if found is None:
            raise TrainUsageError(
                f"--resume-from-checkpoint last: no {PREFIX_CHECKPOINT_DIR}-N folder in --output-dir {output} "
                f"({save_hint})"
            )
        folder = Path(found)
    else:
        folder = Path(value).expanduser()
        if not (folder / TRAINER_STATE_NAME).is_file():
            what = "is not a folder" if not folder.is_dir() else f"has no {TRAINER_STATE_NAME}"
            raise TrainUsageError(
                f"--resume-from-checkpoint {value}: {what}; give a {PREFIX_CHECKPOINT_DIR}-N folder a run saved, or "
                f"`last` for the newest in --output-dir ({save_hint})"
            )
    names = {path.name for path in folder.iterdir()}
    adapter = bool(names & {ADAPTER_SAFE_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME})
    full = bool(names & {SAFE_WEIGHTS_NAME, WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_INDEX_NAME})
    if lora and full and not adapter:
        raise TrainUsageError(
            f"--resume-from-checkpoint {folder}: it holds full weights, from a --no-lora run; add --no-lora to "
            "resume it"
        )
    if not lora and adapter and not full:
        raise TrainUsageError(
            f"--resume-from-checkpoint {folder}: it holds a LoRA adapter, from a LoRA run; drop --no-lora to resume it"
        )
    return str(folder)
