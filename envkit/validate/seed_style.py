"""The checks of seed-style env classes (``build_dataset(tokenizer)``, ``score_episode(model, tokenizer, completion,
case_idx)``, optional ``get_tools()``): the dataset builds, scores of any completion are in [0, 1], tools are valid."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from envkit.validate.report import FAIL, PASS, SKIP, Outcome, short
from envkit.validate.template import TemplateTokenizer

GARBAGE_COMPLETIONS = [
    "",
    "The answer is 42.",
    "\x00\ufffd garbage \u202e ###",
    '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
    "<tool_call>{broken",
    "word " * 5000,
]
"""The dummy completions ``score_episode`` must score in [0, 1] without raising."""

NON_ANSWERS = ["", "I don't know.", "\x00\ufffd garbage \u202e ###"]
"""Completions that answer nothing: a ``score_episode`` giving one of them the maximum (1.0) does not check answers."""


def is_seed_style(cls: Any) -> bool:
    """Whether ``cls`` follows the seed-style interface (``build_dataset`` and ``score_episode``)."""
    return callable(getattr(cls, "build_dataset", None)) and callable(getattr(cls, "score_episode", None))


@dataclass
class SeedContext:
    """The state one :func:`envkit.validate.validate_seed_style` run shares between its checks.

    Args:
        cls: The class under test.
        config: Its constructor arguments.
        instance: ``cls(**config)``.
        chat: The tokenizer handed to ``build_dataset`` and ``score_episode``.
        rows: The dataset's length, once the dataset check has read it.
        halted: Set when the later checks cannot run (the dataset could not be built).
    """

    cls: type
    config: dict[str, Any]
    instance: Any
    chat: TemplateTokenizer
    rows: int | None = None
    halted: bool = False


def check_construction(ctx: SeedContext) -> Outcome:
    """The class builds with the config (the runner has built it: a constructor that raises stops validation)."""
    return Outcome(PASS, f"{ctx.cls.__name__}(**{ctx.config}) builds")


def check_dataset(ctx: SeedContext) -> Outcome:
    """``build_dataset(tokenizer)`` returns rows with a ``prompt`` column."""
    ctx.halted = True  # until the rows are known: an exception escaping this check must stop the run too
    try:
        dataset = ctx.instance.build_dataset(ctx.chat.tokenizer)
        rows = len(dataset)
        columns = list(getattr(dataset, "column_names", None) or (dataset[0].keys() if rows else []))
    except Exception as error:
        return Outcome(
            FAIL,
            f"build_dataset(tokenizer) raised {type(error).__name__}: {error}",
            "build_dataset must return a datasets.Dataset (or list of dicts) with a prompt column",
        )
    ctx.rows, ctx.halted = rows, False
    if "prompt" not in columns or rows == 0:
        return Outcome(
            FAIL, f"{rows} rows, columns {columns}: no 'prompt' column or empty", "return rows with a 'prompt' column"
        )
    return Outcome(PASS, f"{rows} rows built with the {ctx.chat.label} tokenizer; columns {columns}")


def check_scoring(ctx: SeedContext) -> Outcome:
    """``score_episode`` returns a finite value in [0, 1] for dummy completions, garbage included, and less than the
    maximum for an empty or non-answer completion (:data:`NON_ANSWERS`)."""
    tokenizer, rows = ctx.chat.tokenizer, ctx.rows or 0
    model = scoring_model(tokenizer)
    bad = []
    cases = sorted({0, max(0, rows - 1)})
    for case in cases:
        for completion in GARBAGE_COMPLETIONS:
            try:
                value = ctx.instance.score_episode(model, tokenizer, completion, case)
            except Exception as error:
                bad.append(f"case {case}, completion {short(completion, 40)}: raised {type(error).__name__}: {error}")
                continue
            if not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 <= value <= 1:
                bad.append(f"case {case}, completion {short(completion, 40)}: returned {value!r}")
    if bad:
        return Outcome(FAIL, bad[0], "return a finite float in [0, 1] for any completion", {"problems": bad})
    maxed = []
    for case in cases:
        for completion in NON_ANSWERS:
            try:
                value = ctx.instance.score_episode(model, tokenizer, completion, case)
            except Exception as error:
                return Outcome(FAIL, f"case {case}, completion {short(completion, 40)}: raised {error!r:.120}")
            if float(value) >= 1.0:
                maxed.append(f"case {case}: {short(completion, 40) if completion else 'the empty completion'}")
    if maxed:
        return Outcome(
            FAIL,
            f"score_episode gives the maximum (1.0) to a completion that answers nothing ({maxed[0]}): every "
            "rollout would score it, so GRPO has nothing to learn",
            "score the completion's answer against the case's: an empty or non-answer completion must score below 1",
            {"maxed": maxed},
        )
    count = len(GARBAGE_COMPLETIONS) * len(cases)
    return Outcome(PASS, f"finite values in [0, 1] for {count} dummy completions; non-answers score below 1")


def check_tools(ctx: SeedContext) -> Outcome:
    """``get_tools()``, when there is one, returns typed functions or valid OpenAI function schemas."""
    get_tools = getattr(ctx.instance, "get_tools", None)
    if get_tools is None:
        return Outcome(SKIP, "no get_tools()")
    from jsonschema import Draft202012Validator
    from transformers.utils import get_json_schema

    try:
        tools = list(get_tools() or [])
        schemas = [t if isinstance(t, dict) else get_json_schema(t) for t in tools]
        for schema in schemas:
            Draft202012Validator.check_schema(schema.get("function", schema).get("parameters", {}))
    except Exception as error:
        return Outcome(
            FAIL,
            f"get_tools(): {type(error).__name__}: {error}",
            "return typed, docstringed functions or OpenAI function schemas",
        )
    return Outcome(PASS, f"{len(schemas)} valid tool schemas")


def scoring_model(tokenizer: Any) -> Any:
    """A tiny randomly initialised Qwen2-architecture causal LM sized to ``tokenizer``: ``score_episode`` gets a real
    model object, without a download (its generations are noise; scores must still be finite and in [0, 1])."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    model = Qwen2ForCausalLM(config).eval()
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True
    )
    return model
