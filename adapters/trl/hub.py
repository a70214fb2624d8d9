"""``envkit train --push-to-hub``, checked at start-up: transformers creates the Hub repository when the trainer is
built, after the model has loaded and the env has been set up, and a missing token or an unreachable Hub then ends
the run in a traceback. :func:`check_push_to_hub` asks the Hub who the token belongs to first, and refuses in one
line naming the fix."""

from __future__ import annotations

from typing import Any

from envkit.adapters.trl.config import TrainUsageError


def check_push_to_hub(config: Any) -> None:
    """With ``--push-to-hub``: refuse (:class:`TrainUsageError`) when there is no Hugging Face token (``--hub-token``,
    ``HF_TOKEN``, ``hf auth login``), or when the Hub does not answer to it (no network, ``HF_HUB_OFFLINE``, a
    rejected token). Without the flag: nothing, and no request."""
    if not getattr(config, "push_to_hub", False):
        return
    from huggingface_hub import HfApi, get_token

    token = config.hub_token or get_token()
    if token is None:
        raise TrainUsageError(
            "--push-to-hub needs a Hugging Face token: run `hf auth login`, set HF_TOKEN, or pass --hub-token"
        )
    try:
        HfApi().whoami(token=token)
    except Exception as error:  # whatever the reason (network, offline mode, a rejected token), the push would fail
        reason = (str(error).strip().splitlines() or [""])[0]
        raise TrainUsageError(
            f"--push-to-hub: the Hub does not answer to this token ({type(error).__name__}: {reason:.200}); train "
            f"without --push-to-hub and upload afterwards: `hf upload REPO_ID {config.output_dir}`"
        ) from None
