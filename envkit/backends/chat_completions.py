"""Any OpenAI-compatible ``/v1/chat/completions`` endpoint as a model (:class:`ChatCompletionsBackend`): messages and
tools in, the assistant's message with its tool calls out. For evaluating an env with an API model (``envkit eval
--backend chat``) and for the models an env runs itself (τ²-bench's ``user_model=`` and ``judge_model=``:
:class:`ChatCompletionsModel`).

Not for training: the server renders the prompt with its own template and parses the reply with its own tool parser,
so no token ids and no logprobs of the policy come back. An RL trainer needs both (the loss is over the tokens the
policy sampled, weighted by their logprobs), and a text round trip through a template is not token-exact: use a
token-in/token-out backend (``openai``, ``sglang``, ``vllm``, ``transformers``) to train.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from envkit.backends.base import BackendError, SamplingParams, finish_reason
from envkit.backends.http import HTTPBackend
from envkit.util.background import run_blocking

if TYPE_CHECKING:
    from envkit.core.messages import Message

__all__ = ["ChatCompletionsBackend", "ChatCompletionsModel", "ChatReply", "to_openai_messages"]


@dataclass
class ChatReply:
    """One assistant turn from a chat endpoint."""

    message: Message
    """The assistant's message in envkit's format: ``content`` text and, when it called tools, ``tool_calls`` as
    ``[{"type": "function", "function": {"name": str, "arguments": dict}}]`` (arguments that are not a JSON object
    are passed on as the string the server sent, so the env reports them as the model's mistake)."""
    finish_reason: str
    """``"stop"`` (the model ended its turn, or called tools) or ``"length"`` (``max_new_tokens`` reached)."""
    model: str | None = None
    """The model name the server says it served."""
    usage: dict[str, int] = field(default_factory=dict)
    """The server's token counts (``prompt_tokens``, ``completion_tokens``), when it reports them."""


def to_openai_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """envkit's chat messages in the OpenAI wire format: every tool call gets an ``id`` (``call_M_I``, M the
    message's position, I the call's) and its ``arguments`` as a JSON string; each tool result answers the first
    unanswered call of the same name (else the first unanswered call) with its ``tool_call_id``. Ids already present
    are kept."""
    out: list[dict[str, Any]] = []
    open_calls: list[tuple[str, str]] = []  # (id, name) of calls not answered yet
    for position, message in enumerate(messages):
        item = {k: v for k, v in message.items() if k in ("role", "content", "name", "tool_calls", "tool_call_id")}
        if message.get("tool_calls"):
            calls = []
            open_calls = []
            for index, call in enumerate(message["tool_calls"]):
                function = call.get("function", call)
                arguments = function.get("arguments", {})
                call_id = str(call.get("id") or f"call_{position}_{index}")
                name = str(function.get("name", ""))
                calls.append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": name,
                            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                        },
                    }
                )
                open_calls.append((call_id, name))
            item["tool_calls"] = calls
            if item.get("content") == "":
                item["content"] = None
        elif message.get("role") == "tool" and "tool_call_id" not in item and open_calls:
            match = next((c for c in open_calls if c[1] == message.get("name")), open_calls[0])
            open_calls.remove(match)
            item["tool_call_id"] = match[0]
        out.append(item)
    return out


def _from_openai_message(raw: Any) -> Message:
    """An assistant message from the wire (OpenAI format) in envkit's."""
    content = raw.get("content")
    message: Message = {"role": "assistant", "content": content if isinstance(content, str) else ""}
    calls = []
    for call in raw.get("tool_calls") or []:
        function = call["function"]
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                parsed = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                parsed = arguments
            arguments = parsed if isinstance(parsed, dict) else arguments
        calls.append({"type": "function", "function": {"name": function["name"], "arguments": arguments}})
    if calls:
        message["tool_calls"] = calls
    return message


class ChatCompletionsBackend(HTTPBackend):
    """A model behind any OpenAI-compatible ``/v1/chat/completions`` endpoint (vLLM's ``--enable-auto-tool-choice
    --tool-call-parser …``, SGLang's, a hosted API): messages and tools in, the assistant's message out.

    :meth:`achat` (and the blocking :meth:`chat`) send one conversation; the rollout engine's message-level loop
    (:class:`~envkit.rollout.ChatRolloutEngine`) awaits it per episode. The body carries ``model``, ``messages``
    (:func:`to_openai_messages`), ``tools`` when there are any, ``max_tokens``, ``temperature``, ``top_p``, ``stop``
    and ``seed``; ``top_k``, ``min_p`` and ``repetition_penalty`` only when set to something other than off (vLLM
    and SGLang take them; an API that does not answers HTTP 400, naming it).

    Routing over several servers, cooldowns, retries, deadlines, ``max_concurrency`` and :attr:`stats` are
    :class:`~envkit.backends.http.HTTPBackend`'s, with its arguments. :meth:`check` asks every server for
    ``GET /v1/models``.

    Not token-exact (see the module): :attr:`token_exact` is False, and training refuses it.
    """

    check_path: ClassVar[str] = "/v1/models"
    chat_path: ClassVar[str] = "/v1/chat/completions"
    what: ClassVar[str] = "chat completion request"
    token_exact: ClassVar[bool] = False
    """No token ids nor logprobs come back: what a trainer needs."""

    def request_body(
        self, messages: list[Message], tools: list[dict[str, Any]] | None, sampling: SamplingParams, seed: int | None
    ) -> dict[str, Any]:
        """The JSON body of one chat request."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": to_openai_messages(messages),
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
        }
        if tools:
            body["tools"] = list(tools)
        if sampling.top_k:
            body["top_k"] = int(sampling.top_k)
        if sampling.min_p:
            body["min_p"] = sampling.min_p
        if sampling.repetition_penalty != 1.0:
            body["repetition_penalty"] = sampling.repetition_penalty
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if seed is not None:
            body["seed"] = seed
        return body

    def parse_reply(self, reply: Any, url: str) -> ChatReply:
        """The first choice's message, finish reason, served model and usage."""
        try:
            choice = reply["choices"][0]
            message = _from_openai_message(choice["message"])
            reason = choice.get("finish_reason")
        except (KeyError, IndexError, TypeError, AttributeError) as error:
            raise BackendError(f"unexpected chat completion response from {url}: {error}: {reply!r:.300}") from None
        served = reply.get("model")
        usage = reply.get("usage") if isinstance(reply.get("usage"), dict) else {}
        counts = {k: int(v) for k, v in usage.items() if k in ("prompt_tokens", "completion_tokens") and v is not None}
        return ChatReply(message, finish_reason(reason), served if isinstance(served, str) else None, counts)

    async def achat(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        sampling: SamplingParams | None = None,
        seed: int | None = None,
        *,
        timeout_s: float | None = None,
    ) -> ChatReply:
        """The model's next turn in ``messages`` (with ``tools`` offered), routed and retried as
        :class:`~envkit.backends.http.HTTPBackend` describes; ``timeout_s`` as its :meth:`send`."""
        body = self.request_body(messages, tools, sampling or SamplingParams(), seed)
        return await self.send(self.chat_path, body, self.parse_reply, model=self.model, timeout_s=timeout_s)

    def chat(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        sampling: SamplingParams | None = None,
        seed: int | None = None,
    ) -> ChatReply:
        """:meth:`achat`, blocking (from any thread)."""
        return run_blocking(self.achat(messages, tools, sampling, seed))


class ChatCompletionsModel:
    """A chat model over a :class:`ChatCompletionsBackend` (``reply(messages) -> str``): what an env runs as a
    simulated user or a judge (τ²-bench's ``user_model=``/``judge_model=`` with ``{"base_url": URL, "model": NAME,
    "api": "chat"}``), with no local tokenizer.

    Args:
        backend: The chat endpoint.
        temperature: 0 (the default, as τ²-bench's user and judge) decodes greedily.
        max_new_tokens: The longest reply, in tokens.
        seed: Base seed of the replies (reply ``n`` sends ``seed + n``); None sends ``n``.

    Attributes:
        last_prompt: The last conversation sent, as JSON (for debugging and tests).
        calls: Replies generated so far.
    """

    def __init__(
        self,
        backend: ChatCompletionsBackend,
        *,
        temperature: float = 0.0,
        max_new_tokens: int = 256,
        seed: int | None = None,
    ) -> None:
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        SamplingParams(temperature=temperature)  # SamplingRangeError now, not at the first reply
        self.backend = backend
        self.temperature = float(temperature)
        self.max_new_tokens = int(max_new_tokens)
        self.seed = seed
        self.last_prompt = ""
        self.calls = 0
        self._lock = threading.Lock()

    def reply(self, messages: list[dict[str, Any]]) -> str:
        """The model's reply to ``messages`` (system/user/assistant dicts), stripped of surrounding space."""
        with self._lock:
            self.last_prompt, number = json.dumps(messages), self.calls
            self.calls += 1
        sampling = SamplingParams(temperature=self.temperature, max_new_tokens=self.max_new_tokens)
        seed = self.seed + number if self.seed is not None else number
        reply = run_blocking(self.backend.achat(messages, None, sampling, seed))
        return str(reply.message.get("content") or "").strip()
