"""The chat-template checks: the tool schemas are valid and render into the prompt, and every transcript played
renders through the template with each env message in place."""

from __future__ import annotations

from typing import Any

from envkit.core.messages import message_problems
from envkit.validate.context import EnvContext, ServedEnv
from envkit.validate.driver import unpack_reset
from envkit.validate.report import FAIL, PASS, SKIP, TEMPLATE_DROPS_TOOLS, WARN, Outcome, short
from envkit.validate.template import (
    TemplateTokenizer,
    as_generated,
    control_pattern,
    find_content,
    message_origins,
    message_place,
    render_failure,
    render_transcript,
)


def check_schemas(ctx: EnvContext) -> Outcome:
    """The tool schemas are valid JSON Schema and every tool appears in the rendered opening prompt."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    env, seed, chat = ctx.env, ctx.seeds[0], ctx.chat
    tools = getattr(env, "tools", None)
    problems = []
    if tools is not None:
        if not isinstance(tools, list):
            problems.append(f"tools is a {type(tools).__name__}, not a list")
            tools = []
        for tool in tools:
            function = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                problems.append(f"not an OpenAI function schema: {short(tool)}")
                continue
            parameters = function.get("parameters", {"type": "object", "properties": {}})
            try:
                Draft202012Validator.check_schema(parameters)
            except SchemaError as error:
                problems.append(f"{function['name']}: invalid JSON Schema ({error.message})")
                continue
            if parameters.get("type") != "object":
                problems.append(f"{function['name']}: parameters must be an object schema")
    if problems:
        return Outcome(
            FAIL,
            problems[0],
            "build tools with @envkit.tool (typed, docstringed methods)",
            {"problems": problems},
        )
    try:
        fresh = ctx.driver.new_env("schemas")  # the run's first instance may be closed by now (see Driver.new_env)
        if fresh is None:
            raise RuntimeError("the constructor failed (see the faults)")
        opening, _ = unpack_reset(fresh.reset(seed=seed))
        text = render_prompt(chat, opening, tools)
    except Exception as error:
        return Outcome(
            FAIL,
            f"rendering the opening prompt through the {chat.label} template failed: {error}",
            "tool schemas and messages must render in a chat template",
        )
    names = [t["function"]["name"] for t in tools or []]
    missing = [name for name in names if name not in text]
    if missing and text == render_prompt(chat, opening, None):
        return Outcome(
            FAIL,
            f"the {chat.label} template drops the tool definitions: it renders the opening prompt with tools= exactly "
            f"as without, so none of the {len(names)} tools ({', '.join(names)}) reaches the model",
            TOOLS_TEMPLATE_HINT,
            {"template": chat.label, "tools": names},
            cause=TEMPLATE_DROPS_TOOLS,
        )
    if missing:
        return Outcome(
            FAIL,
            f"the {chat.label} template renders tools but leaves out {', '.join(missing)}",
            "check those tools' schemas: the template skips a schema it cannot read",
            {"template": chat.label, "missing": missing},
        )
    count = f"{len(tools)} valid tool schemas" if tools else "no tools"
    details: dict[str, Any] = {"template": chat.label, "prompt_chars": len(text)}
    if chat.bundled:  # a byte-level tokenizer: its "token" count would be the byte count
        length = f"{len(text)} characters ({chat.label}; pass --tokenizer for a token count)"
    else:
        details["prompt_tokens"] = len(chat.tokenizer.encode(text, add_special_tokens=False))
        length = f"{details['prompt_tokens']} tokens ({chat.label})"
    warnings = list(ctx.env.client_warnings) if isinstance(ctx.env, ServedEnv) else []
    if warnings:
        more = f" (and {len(warnings) - 1} more)" if len(warnings) > 1 else ""
        hint = "rename the argument, or tell the env's OpenEnv users to send CallToolAction"
        return Outcome(WARN, warnings[0] + more, hint, {**details, "client_warnings": warnings})
    return Outcome(PASS, f"{count}; opening prompt renders to {length}", details=details)


TOOLS_TEMPLATE_HINT = (
    "the model cannot call tools it never sees: train with a tokenizer whose chat template renders tools= (the "
    "model's own, if it was trained for tool use), or set its chat_template to one that does "
    "(envkit.chat.bundled_template() is a ChatML one in the Hermes <tool_call> format)"
)
"""The hint of a chat template that drops the tool definitions."""


def render_prompt(chat: TemplateTokenizer, opening: list[Any], tools: list[Any] | None) -> str:
    """The opening prompt as the template renders it, with ``tools`` (``None``: without)."""
    return chat.tokenizer.apply_chat_template(opening, tools=tools or None, add_generation_prompt=True, tokenize=False)


def drops_tools(chat: TemplateTokenizer, tools: list[Any]) -> bool:
    """Whether the template renders a prompt with ``tools`` exactly as without (``False`` when it cannot render)."""
    probe = [{"role": "user", "content": "Hello."}]
    try:
        return render_prompt(chat, probe, tools) == render_prompt(chat, probe, None)
    except Exception:
        return False


TRANSCRIPT_HINT = (
    "env messages must be {'role': 'system'|'user'|'tool', 'content': str} (json.dumps structured data): "
    "whatever the chat template drops or cannot render never reaches the model in training"
)
"""The hint of a transcript the template drops, mangles or cannot render."""
SILENT_HINT = (
    "return a message (a user reply, a tool result) or end the episode: an empty observation gives the model a bare "
    "generation prompt right after its own turn (ToolEnv.on_text: return None to end)"
)
"""The hint of a turn whose step() returned no message while the episode went on."""
CONTROL_HINT = (
    "remove control-token strings from env text: envkit encodes them as plain text, but anything that tokenizes "
    "the rendered text (TRL's tool loop, a chat API) reads them as real turn boundaries"
)
"""The hint of env text that holds the tokenizer's control-token strings."""


def check_transcripts(ctx: EnvContext) -> Outcome:
    """Every recorded transcript, rendered once through the chat template as training renders it.

    A prefix-preserving template renders a whole transcript exactly as training's prompt + turns + env suffixes, so
    one rendering per episode shows what the model is trained on. Each env message must be found, in order, in that
    text (verbatim, trimmed, or JSON-encoded as Llama 3 renders tool results). The scripted policies' actions are
    rendered as the parser hands model output to the template (well-formed calls only): they are not under test.
    """
    from envkit.chat.render import ChatRenderer

    driver, env, chat = ctx.driver, ctx.env, ctx.chat
    if not driver.played:
        return Outcome(SKIP, "no transcripts were recorded")
    tools = getattr(env, "tools", None)
    try:
        renderer = ChatRenderer(chat.tokenizer, tools=tools or None)
    except Exception as error:
        return Outcome(
            FAIL,
            f"the {chat.label} template cannot render this env's conversations: {type(error).__name__}: {error}",
            "pass --tokenizer the folder of the tokenizer you train with; fix the tool schemas first if they fail",
            cause=TEMPLATE_DROPS_TOOLS if tools and drops_tools(chat, tools) else "",
        )
    specials = control_pattern(chat.tokenizer)
    problems: list[str] = []
    silent: list[str] = []
    control: list[str] = []
    as_text = 0
    messages_checked = 0
    for run in driver.played:
        messages = run.messages if isinstance(run.messages, list) else []
        origins = message_origins(run, messages)
        shown = [m if from_env else as_generated(m) for m, (_, from_env) in zip(messages, origins, strict=True)]
        text, culprit, error, replaced = render_transcript(
            renderer, shown, origins, add_generation_prompt=not run.ended
        )
        as_text += replaced
        if text is None:
            problems.append(render_failure(run, shown, origins, culprit, error, chat.label))
        cursor = 0
        for message, (turn, from_env) in zip(messages, origins, strict=True):
            if not from_env:
                continue
            messages_checked += 1
            where = message_place(run, turn, message)
            content = message.get("content") if isinstance(message, dict) else None
            tokens = sorted(set(specials.findall(content))) if isinstance(content, str) and specials else []
            if tokens:
                control.append(f"{where} holds {', '.join(tokens)}")
            if text is None:
                continue
            end = find_content(text, content, cursor) if isinstance(content, str) else None
            malformed = message_problems(message)
            if end is not None:
                cursor = end
            if malformed:
                dropped = f" — the {chat.label} template drops it" if isinstance(content, str) and end is None else ""
                problems.append(f"{where}: {malformed[0]}{dropped}")
            elif end is None:
                problems.append(
                    f"{where} is missing from its place in the {chat.label} rendering (dropped or rewritten by the "
                    f"template): {short(content, 80)}"
                )
        silent += [
            f"turn {turn} [{run.policy}, seed {run.seed}]: step() returned no messages and the episode went on"
            for turn in run.silent_turns
        ]
    policies = sorted({r.policy.split(":")[0] for r in driver.played})
    details: dict[str, Any] = {
        "template": chat.label,
        "template_source": getattr(renderer, "template_source", "tokenizer"),
        "transcripts": len(driver.played),
        "env_messages": messages_checked,
        "policy_turns_rendered_as_text": as_text,
    }
    for key, found in (("problems", problems), ("silent_turns", silent), ("control_tokens", control)):
        if found:
            details[key] = found[:20]
            details[f"{key}_count"] = len(found)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        hint = TRANSCRIPT_HINT + (f" / {SILENT_HINT}" if silent else "")
        return Outcome(FAIL, problems[0] + more, hint, details)
    warnings = []
    if silent:
        warnings.append((f"{len(silent)} silent turns; first: {silent[0]}", SILENT_HINT))
    if control:
        warnings.append(
            (f"{len(control)} env messages hold control tokens of the tokenizer; first: {control[0]}", CONTROL_HINT)
        )
    if warnings:
        return Outcome(WARN, "; ".join(w for w, _ in warnings), " / ".join(h for _, h in warnings), details)
    return Outcome(
        PASS,
        f"{len(driver.played)} transcripts ({', '.join(policies)}) render through the {chat.label} template with "
        f"all {messages_checked} env messages in place",
        details=details,
    )
