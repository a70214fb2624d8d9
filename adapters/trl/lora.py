"""The LoRA adapter ``envkit train`` trains (sync and ``--async`` alike), and the check that its target modules name
layers of the model before anything starts."""

from __future__ import annotations

from typing import Any

from envkit.adapters.trl.config import TrainArguments, TrainUsageError


def lora_config(args: TrainArguments) -> Any:
    """The LoRA adapter both training paths train (``--lora-r``, ``--lora-alpha``, ``--lora-dropout``,
    ``--lora-target-modules``; all linear layers by default)."""
    from peft import LoraConfig

    return LoraConfig(
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=args.lora_target_modules or "all-linear",
        task_type="CAUSAL_LM",
    )


def check_lora_targets(args: TrainArguments) -> None:
    """Refuse, in one line listing the model's linear layers, a ``--lora-target-modules`` name that matches no module
    of ``--model`` (peft raised it as a traceback once the model had loaded; with ``--async``, after the vLLM servers
    had started). The model is built from its config on the meta device (no weights read) and each name is matched by
    peft's own rule (``check_target_module_exists``). A model whose config cannot be read is left to the load, which
    says why in one line."""
    if args.no_lora or not args.lora_target_modules or args.model is None:
        return
    import torch
    from peft import LoraConfig
    from peft.tuners.tuners_utils import check_target_module_exists
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        model_config = AutoConfig.from_pretrained(args.model)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(model_config)
    except Exception:  # the load reports it, in one line
        return
    names = [name for name, _ in model.named_modules() if name]
    missing = [
        target
        for target in args.lora_target_modules
        if not any(check_target_module_exists(LoraConfig(target_modules=[target]), name) for name in names)
    ]
    if missing:
        linear = sorted(
            {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
        )
        raise TrainUsageError(
            f"--lora-target-modules {' '.join(missing)}: no such module in {args.model} (its linear layers: "
            f"{', '.join(linear)}; leave the flag out for all of them)"
        )
