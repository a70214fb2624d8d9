"""``envkit view``: one self-contained HTML page to look at the episodes that ``envkit eval --out`` wrote.

The page embeds the episodes as JSON and renders them with its own inline script, which only ever assigns
``textContent``: no episode text is ever parsed as HTML. In the embedded JSON ``<``, ``>`` and ``&`` are written as
``\\u003c``-style escapes, so no text can close the data block, and a Content-Security-Policy lets only the page's own
script and style run (pinned by their hashes) and allows no network request at all.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from string import Template
from typing import Any

from envkit.util.text import one_line

PROGRESS_MIN_BYTES = 4 * 1024 * 1024
"""Files at least this large get a progress bar (on stderr) while they are read."""

TASK_CHARS = 160
"""An episode's task is shown in the list cut to this many characters."""
ANSWER_KEYS = ("expected_answer", "answer", "ground_truth", "solution", "target", "expected")
"""Keys of an episode's reset info (or of the dataset row in it) that hold the task's expected answer, in the order
they are looked for; the page shows the first found beside the score."""
CUT_REASONS = ("max_episode_tokens",)
"""Episode finish reasons that mean its last turn was cut by a token budget (marked on that turn)."""

_NUMBER_FIELDS = ("task_seed", "group_index", "score", "turns", "num_tool_calls", "tool_errors")
_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


class ViewError(ValueError):
    """The episodes cannot be shown: a missing file, a line that is not JSON, a record that is not an episode, a
    tokenizer that does not load. The message is one line naming the file (and line)."""


def read_episodes(path: str | Path, *, progress: bool = True) -> list[dict[str, Any]]:
    """Read a JSONL file of episodes (``envkit eval --out``) into normalised records (:func:`normalize_episode`).

    Blank lines are skipped. Files of :data:`PROGRESS_MIN_BYTES` or more show a progress bar when ``progress``.

    Raises:
        ViewError: the file is missing or empty, a line is not JSON, or a record has no ``messages`` list.
    """
    path = Path(path)
    if not path.exists():
        raise ViewError(f"{path}: no such file")
    if not path.is_file():
        raise ViewError(f"{path}: not a file")
    try:
        episodes = _read_lines(path, progress=progress)
    except OSError as error:  # unreadable: permissions, a vanished file, a read error
        raise ViewError(f"{path}: cannot read it ({error.strerror or error})") from None
    if not episodes:
        raise ViewError(f"{path}: no episodes (the file is empty); write some with `envkit eval ENV --out {path}`")
    return episodes


def _read_lines(path: Path, *, progress: bool) -> list[dict[str, Any]]:
    from tqdm.auto import tqdm

    size = path.stat().st_size
    episodes: list[dict[str, Any]] = []
    with (
        path.open("rb") as handle,
        tqdm(
            total=size,
            unit="B",
            unit_scale=True,
            desc=f"reading {path.name}",
            disable=not progress or size < PROGRESS_MIN_BYTES,
            leave=False,
        ) as bar,
    ):
        for number, raw in enumerate(handle, 1):
            bar.update(len(raw))
            line = raw.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except ValueError as error:  # JSONDecodeError and UnicodeDecodeError alike
                raise ViewError(
                    f"{path}, line {number}: not a JSON line ({one_line(error, 200)}); expected JSONL"
                ) from None
            episodes.append(normalize_episode(record, where=f"{path}, line {number}"))
    return episodes


def normalize_episode(record: Any, *, where: str = "record") -> dict[str, Any]:
    """One episode record made safe to show: every field of :class:`envkit.rollout.Episode` with a known type.

    Missing or mistyped fields get neutral values (``None`` numbers, empty lists); non-finite floats become strings
    (``"nan"``, ``"-inf"``), which JSON cannot otherwise carry. Messages that are not objects are shown as text.

    Raises:
        ViewError: ``record`` is not an object or has no ``messages`` list.
    """
    if not isinstance(record, dict):
        raise ViewError(f"{where}: a JSON {type(record).__name__}, not an episode object")
    messages = record.get("messages")
    if not isinstance(messages, list):
        raise ViewError(f"{where}: the record has no 'messages' list (is this an `envkit eval --out` file?)")
    episode: dict[str, Any] = {name: _number(record.get(name)) for name in _NUMBER_FIELDS}
    episode["messages"] = [
        _finite(m) if isinstance(m, dict) else {"role": "?", "content": json.dumps(_finite(m), ensure_ascii=False)}
        for m in messages
    ]
    episode["finish_reason"] = str(record.get("finish_reason") or "")
    error = record.get("error")
    episode["error"] = None if error is None else str(error)
    episode["truncated"] = bool(record.get("truncated"))
    for name in ("prompt_ids", "completion_ids", "env_mask"):
        episode[name] = _ints(record.get(name))
    logprobs = record.get("logprobs")
    episode["logprobs"] = [_number(x) for x in logprobs] if isinstance(logprobs, list) else []
    rewards = record.get("rewards")
    episode["rewards"] = [_number(x) for x in rewards] if isinstance(rewards, list) else []
    reasons = record.get("turn_finish_reasons")
    episode["turn_finish_reasons"] = [str(x) for x in reasons] if isinstance(reasons, list) else []
    for name in ("timings", "info"):
        value = record.get(name)
        episode[name] = _finite(value) if isinstance(value, dict) else {}
    components = record.get("score_components")
    episode["score_components"] = (
        {str(k): _number(v) for k, v in components.items()} if isinstance(components, dict) else {}
    )
    episode["tools"] = tool_summaries(record.get("tools"))
    episode["task"] = task_text(episode)
    episode["expected"] = expected_answer(episode["info"])
    episode["cut_turns"] = cut_turns(episode)
    return episode


def expected_answer(info: dict[str, Any], limit: int = TASK_CHARS) -> str | None:
    """The task's expected answer when the episode's reset info carries one: the first of :data:`ANSWER_KEYS` in
    ``info``, or in the dataset row a seed-style env puts there (``info["row"]``); as text of at most ``limit``
    characters, else ``None``."""
    for where in (info, info.get("row")):
        if not isinstance(where, dict):
            continue
        for key in ANSWER_KEYS:
            if where.get(key) is not None:
                value = where[key]
                return one_line(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False), limit)
    return None


def tool_summaries(tools: Any) -> list[dict[str, Any]]:
    """The tools an episode's model was offered (OpenAI-style schemas, :attr:`envkit.rollout.Episode.tools`) as
    ``{"name", "description", "parameters": [{"name", "type", "required", "description"}]}``; entries that are not
    schemas are dropped."""
    if not isinstance(tools, list):
        return []
    summaries = []
    for tool in tools:
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            continue
        schema = function.get("parameters") if isinstance(function.get("parameters"), dict) else {}
        properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        required = schema.get("required") if isinstance(schema.get("required"), list) else []
        parameters = [
            {
                "name": str(name),
                "type": _type_name(spec),
                "required": name in required,
                "description": str(spec.get("description") or "") if isinstance(spec, dict) else "",
            }
            for name, spec in properties.items()
        ]
        description = function.get("description")
        summaries.append(
            {
                "name": function["name"],
                "description": description if isinstance(description, str) else "",
                "parameters": parameters,
            }
        )
    return summaries


def _type_name(spec: Any) -> str:
    """A JSON-schema property's type in a few characters (``number``, ``string | null``, ``array``)."""
    if not isinstance(spec, dict):
        return ""
    kind = spec.get("type")
    if isinstance(kind, str):
        return kind
    if isinstance(kind, list):
        return " | ".join(map(str, kind))
    options = spec.get("anyOf") or spec.get("oneOf")
    if isinstance(options, list):
        return " | ".join(filter(None, (_type_name(o) for o in options)))
    return "enum" if "enum" in spec else ""


def task_text(episode: dict[str, Any], limit: int = TASK_CHARS) -> str:
    """The episode's task in one line of at most ``limit`` characters: the reset info's ``task`` when it is text,
    else the first user message (``""`` when there is neither)."""
    task = episode.get("info", {}).get("task")
    if not isinstance(task, str) or not task.strip():
        user = next((m for m in episode["messages"] if m.get("role") == "user"), {})
        task = _text(user.get("content"))
    return one_line(task, limit)


def cut_turns(episode: dict[str, Any]) -> dict[str, str]:
    """The assistant turns (numbered from 1, as JSON keys) that a token budget cut, with the budget's name:
    ``max_new_tokens`` (the per-turn budget) or ``max_episode_tokens`` (the episode's).

    Read from the episode's ``turn_finish_reasons`` (``length`` / ``budget``); a record without them (written
    before envkit kept them) is marked on its last turn when the episode ended on its token budget (``turns``
    counts a cut turn that left no assistant message, only its tokens)."""
    reasons = episode.get("turn_finish_reasons")
    if isinstance(reasons, list) and reasons:
        names = {"length": "max_new_tokens", "budget": "max_episode_tokens"}
        return {str(n): names[r] for n, r in enumerate(reasons, 1) if r in names}
    said = sum(m.get("role") == "assistant" for m in episode["messages"])
    turns = episode.get("turns")
    last = turns if isinstance(turns, int) and turns >= said else said
    reason = episode.get("finish_reason")
    return {str(last): reason} if last and reason in CUT_REASONS else {}


def _text(content: Any) -> str:
    """A message's content as plain text (the text parts of a multimodal list; JSON for anything else)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        if parts:
            return " ".join(parts)
    return "" if content is None else json.dumps(content, ensure_ascii=False)


def load_view_tokenizer(path: str | Path) -> Any:
    """A Hugging Face tokenizer from a local folder (a chat template is not needed to decode tokens).

    Raises:
        ViewError: the folder is missing or holds no loadable tokenizer.
    """
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ViewError(f"--tokenizer {path}: no such folder (a local tokenizer folder, e.g. a model's)")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as error:
        reason = one_line(str(error), 200)
        raise ViewError(f"--tokenizer {path}: cannot load a tokenizer: {type(error).__name__}: {reason}") from None


def decode_tokens(tokenizer: Any, ids: Iterable[int]) -> dict[int, str | None]:
    """Each distinct token id decoded on its own (special tokens kept); ``None`` for an id the tokenizer rejects."""
    pieces: dict[int, str | None] = {}
    for token in ids:
        if token in pieces:
            continue
        try:
            pieces[token] = tokenizer.decode([token], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        except Exception:  # an id outside the vocabulary: the page shows the bare id
            pieces[token] = None
    return pieces


def build_html(
    episodes: list[dict[str, Any]], *, title: str = "envkit episodes", vocab: dict[int, str | None] | None = None
) -> str:
    """The whole page for normalised ``episodes``, with its CSS, script and data inline.

    ``vocab`` maps token ids to their decoded text (:func:`decode_tokens`); without it the token view shows ids.
    Prompts and tool sets shared by several episodes (a GRPO group, a whole eval) are stored once.
    """
    prompts: list[list[int]] = []
    prompt_index: dict[tuple[int, ...], int] = {}
    toolsets: list[list[dict[str, Any]]] = []
    toolset_index: dict[str, int] = {}
    shown = []
    for episode in episodes:
        key = tuple(episode.get("prompt_ids") or ())
        if key not in prompt_index:
            prompt_index[key] = len(prompts)
            prompts.append(list(key))
        tools = json.dumps(episode.get("tools") or [], sort_keys=True)
        if tools not in toolset_index:
            toolset_index[tools] = len(toolsets)
            toolsets.append(episode.get("tools") or [])
        rest = {k: v for k, v in episode.items() if k not in ("prompt_ids", "tools")}
        shown.append({**rest, "prompt": prompt_index[key], "toolset": toolset_index[tools]})
    payload = {
        "title": title,
        "vocab": None if vocab is None else {str(k): v for k, v in vocab.items()},
        "prompts": prompts,
        "toolsets": toolsets,
        "episodes": shown,
    }
    data = embed_json(payload)
    style, script = _asset("view.css"), _asset("view.js")
    csp = (
        f"default-src 'none'; script-src {_csp_hash(script)}; style-src {_csp_hash(style)}; img-src data:; "
        "base-uri 'none'; form-action 'none'"
    )
    page = Template(_asset("view.html"))
    return page.substitute(title=html.escape(title), csp=html.escape(csp), style=style, script=script, data=data)


def embed_json(value: Any) -> str:
    """``value`` as JSON that is safe inside ``<script type="application/json">``: no ``<``, ``>`` or ``&``."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.translate(str.maketrans(_JSON_ESCAPES))


def write_view(
    source: str | Path,
    output: str | Path | None = None,
    *,
    tokenizer: Any = None,
    progress: bool = True,
) -> tuple[Path, int]:
    """Read ``source`` (JSONL episodes) and write its page to ``output`` (default: ``source`` with ``.html``).

    Returns the page's path and the number of episodes. Raises :class:`ViewError` on bad input or an unwritable
    output.
    """
    source = Path(source)
    target = Path(output) if output is not None else source.with_suffix(".html")
    if target.resolve() == source.resolve():
        raise ViewError(f"{target}: the page would overwrite its own input; pass -o OUT.html")
    episodes = read_episodes(source, progress=progress)
    vocab = None
    if tokenizer is not None:
        ids = (t for e in episodes for t in (*e["prompt_ids"], *e["completion_ids"]))
        vocab = decode_tokens(tokenizer, ids)
    page = build_html(episodes, title=f"{source.name}: {len(episodes)} episodes", vocab=vocab)
    try:
        target.write_text(page, encoding="utf-8")
    except OSError as error:
        raise ViewError(f"cannot write {target}: {error.strerror or error}") from None
    return target, len(episodes)


def _asset(name: str) -> str:
    return resources.files("envkit.cli").joinpath("view_assets", name).read_text(encoding="utf-8")


def _csp_hash(text: str) -> str:
    digest = base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")
    return f"'sha256-{digest}'"


def _number(value: Any) -> float | int | str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _ints(value: Any) -> list[int]:
    # A list with anything but ints is dropped whole: keeping the rest would misalign ids, mask and logprobs.
    if not isinstance(value, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        return []
    return value


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by its name (JSON has no NaN or infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)
