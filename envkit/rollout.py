"""The rollout engine: many multi-turn episodes at once, interleaving generation with env steps, token-exact.

Each episode is one straight walk: task seed → ``reset`` → opening prompt tokens (the chat template's own rendering)
→ generate → parse → ``step`` → env-message tokens appended as a template suffix (masked) → … → ``score``. Model tokens
are recorded exactly as generated, never re-tokenized; ``env_mask`` marks them with 1 and the env's tokens with 0.

Scheduling: every episode waiting for the model goes to the backend in one batch; env steps run in a thread pool of
``concurrency`` workers while the backend generates for the others. An episode whose step is slow does not hold up
the rest: after a short gathering window the next batch is generated without it. Faults stay local: an env that
raises or a step past ``step_timeout_s`` ends that episode with ``error`` set and score 0; nothing is ever dropped
(``len(result) == len(tasks) * group_size``).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from typing import Any

from envkit.backends import Backend, BackendError, Generation, SamplingParams, request_seed
from envkit.chat import ChatRenderer, TemplateError
from envkit.core import Env
from envkit.messages import Message
from envkit.parsing import parse_assistant

__all__ = ["Episode", "RolloutEngine", "SamplingParams", "summarize", "teacher_forced_logprobs"]


logger = logging.getLogger(__name__)

_RENDERERS: dict[str, ChatRenderer] = {}
_RENDERER_LOCK = threading.Lock()


@dataclass
class Episode:
    """One finished episode: its transcript, its token-exact trajectory and its outcome."""

    task_seed: int
    group_index: int
    messages: list[Message] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    """The opening prompt: opening messages, tools and the generation prompt, as the chat template renders them."""
    completion_ids: list[int] = field(default_factory=list)
    """Every model token and every env-message token after the prompt, in order."""
    env_mask: list[int] = field(default_factory=list)
    """1 for a model token, 0 for an env token; same length as ``completion_ids``."""
    logprobs: list[float] = field(default_factory=list)
    """Per completion token: the sampled token's logprob (0.0 on env tokens)."""
    score: float = 0.0
    rewards: list[float] = field(default_factory=list)
    """The env's reward of each step."""
    turns: int = 0
    num_tool_calls: int = 0
    tool_errors: int = 0
    truncated: bool = False
    finish_reason: str = ""
    """``done`` (the env ended it), ``max_turns``, ``max_episode_tokens`` (either token budget), ``error`` or
    ``timeout``."""
    error: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds: ``generate`` (waiting for the model), ``env`` (reset + steps), ``total``."""
    info: dict[str, Any] = field(default_factory=dict)
    """The env's reset info."""

    def to_dict(self) -> dict[str, Any]:
        """Plain data (one JSON line of ``envkit eval --out``)."""
        return asdict(self)

    def to_json(self) -> str:
        """One JSON line."""
        return json.dumps(self.to_dict(), ensure_ascii=False, default=str)


@dataclass
class _Live:
    """An episode in flight."""

    episode: Episode
    env: Env | None = None
    renderer: ChatRenderer | None = None
    started: float = field(default_factory=time.perf_counter)
    future: Future | None = None
    deadline: float = math.inf
    pending_message: Message | None = None

    @property
    def length(self) -> int:
        return len(self.episode.prompt_ids) + len(self.episode.completion_ids)


class RolloutEngine:
    """Run episodes of an env with a generation backend and return token-exact :class:`Episode` objects.

    Args:
        env_factory: ``env_factory()`` returns a fresh :class:`envkit.Env` (one per episode).
        backend: Any object with ``generate(prompts, sampling) -> list[Generation]`` (see :mod:`envkit.backends`).
        tokenizer: The model's tokenizer (its chat template renders prompts and env messages).
        max_turns: Assistant turns per episode (default: the env's own ``max_turns``).
        max_episode_tokens: Cap on prompt + completion tokens (also capped by the backend's context length).
        max_completion_tokens: Cap on one episode's completion tokens (model and env tokens after the prompt): what
            bounds the sequence length a trainer back-propagates through.
        concurrency: Env worker threads (resets and steps run concurrently, overlapping generation).
        step_timeout_s: An env reset/step taking longer ends its episode with ``error`` (``finish_reason="timeout"``).
        gather_s: How long to wait for other episodes' env steps before generating a partial batch.
        chat_template: A chat template to use instead of the tokenizer's (see :class:`envkit.ChatRenderer`).
        template_kwargs: Extra chat-template variables (e.g. ``{"enable_thinking": False}``).
        progress: Show a progress bar over episodes.
    """

    def __init__(
        self,
        env_factory: Callable[[], Env],
        backend: Backend,
        tokenizer: Any,
        *,
        max_turns: int | None = None,
        max_episode_tokens: int | None = None,
        max_completion_tokens: int | None = None,
        concurrency: int = 32,
        step_timeout_s: float = 60.0,
        gather_s: float = 0.05,
        chat_template: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
        progress: bool = False,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.env_factory = env_factory
        self.backend = backend
        self.tokenizer = tokenizer
        self.max_turns = max_turns
        context = getattr(backend, "max_model_len", None)
        limits = [n for n in (max_episode_tokens, context) if n]
        self.max_episode_tokens = min(limits) if limits else None
        if max_completion_tokens is not None and max_completion_tokens < 1:
            raise ValueError("max_completion_tokens must be at least 1")
        self.max_completion_tokens = max_completion_tokens
        self.concurrency = concurrency
        self.step_timeout_s = step_timeout_s
        self.gather_s = gather_s
        self.chat_template = chat_template
        self.template_kwargs = template_kwargs
        self.progress = progress
        self._pool: ThreadPoolExecutor | None = None
        self._takes_seeds = "seeds" in inspect.signature(backend.generate).parameters
        self._warned_seeds = False

    def _worker_pool(self) -> ThreadPoolExecutor:
        """The env worker threads, kept across ``run`` calls (starting threads costs more than a fast env step)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="envkit-env")
            # weakref.finalize, not __del__: it also runs at interpreter exit, before module globals are torn down.
            weakref.finalize(self, self._pool.shutdown, wait=False, cancel_futures=True)
        return self._pool

    def close(self) -> None:
        """Stop the env worker threads (also done when the engine is garbage-collected or the interpreter exits)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def renderer_for(self, tools: list[dict[str, Any]] | None) -> ChatRenderer:
        """A (cached) renderer for one tool set: the prefix-preservation probe runs once per tokenizer, template and
        tools in this process, not once per engine (``make_rollout_func`` builds an engine per training step)."""
        key = json.dumps(
            [id(self.tokenizer), self.chat_template, self.template_kwargs, tools], sort_keys=True, default=str
        )
        with _RENDERER_LOCK:
            renderer = _RENDERERS.get(key)
            if renderer is None or renderer.tokenizer is not self.tokenizer:
                renderer = ChatRenderer(
                    self.tokenizer, tools, chat_template=self.chat_template, template_kwargs=self.template_kwargs
                )
                _RENDERERS[key] = renderer
        return renderer

    def run(
        self,
        tasks: list[int],
        group_size: int,
        sampling: SamplingParams,
        *,
        on_episode: Callable[[Episode], None] | None = None,
    ) -> list[Episode]:
        """Run ``group_size`` episodes per task seed; return them grouped in task order.

        Args:
            tasks: Task seeds; every episode of a group resets its env with the same seed.
            group_size: Episodes per task (GRPO's number of generations).
            sampling: Sampling parameters for every turn.
            on_episode: Called with each episode as soon as it finishes (e.g. to write it out).
        """
        episodes = [Episode(task_seed=int(seed), group_index=g) for seed in tasks for g in range(group_size)]
        live = [_Live(e) for e in episodes]
        bar = _progress_bar(len(live), self.progress)
        finished = 0

        def finish(item: _Live, reason: str, *, truncated: bool = False, error: str | None = None) -> None:
            nonlocal finished
            episode = item.episode
            episode.finish_reason, episode.truncated = reason, truncated
            if error is not None:
                episode.error, episode.score = error, 0.0
            elif item.env is not None:
                episode.score = self._final_score(item)
            if item.env is not None:
                episode.messages = list(getattr(item.env, "messages", episode.messages))
            episode.timings["total"] = time.perf_counter() - item.started
            item.env = None
            finished += 1
            bar.update(1)
            if on_episode is not None:
                on_episode(episode)

        pool = self._worker_pool()
        try:
            for item in live:
                item.future = pool.submit(self._start, item)
            waiting = list(live)  # env work in flight
            ready: list[_Live] = []  # waiting for the model
            while waiting or ready:
                ready += self._collect(waiting, block=not ready, finish=finish)
                if not ready:
                    continue
                if waiting:  # let more env steps land so the batch is fuller
                    ready += self._collect(waiting, block=False, finish=finish, window=self.gather_s)
                batch, ready = ready, []
                generations = self._generate(batch, sampling)
                for item, generation in zip(batch, generations, strict=True):
                    if self._take_turn(item, generation, finish):
                        item.deadline = math.inf  # set when a worker picks the step up
                        item.future = pool.submit(self._step, item)
                        waiting.append(item)
        finally:
            if any(e.finish_reason == "timeout" for e in episodes) or finished != len(episodes):
                # A step that hangs past its timeout cannot be killed: leave its worker behind, start a fresh pool.
                pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None
            bar.close()
        assert finished == len(episodes), f"{len(episodes) - finished} episodes were lost"
        return episodes

    # ---- env work (runs in the pool) --------------------------------------------------------------------------------
    def _start(self, item: _Live) -> None:
        start = time.perf_counter()
        item.deadline = start + self.step_timeout_s
        env = self.env_factory()
        opening, info = env.reset(seed=item.episode.task_seed)
        item.env = env
        item.episode.info = dict(info)
        item.renderer = self.renderer_for(getattr(env, "tools", None) or None)
        item.episode.prompt_ids = item.renderer.prompt_ids(list(opening))
        item.episode.timings["env"] = time.perf_counter() - start
        item.episode.timings["generate"] = 0.0

    def _step(self, item: _Live) -> tuple[list[Message], bool, bool]:
        start = time.perf_counter()
        item.deadline = start + self.step_timeout_s
        assert item.env is not None and item.pending_message is not None
        observation, reward, terminated, truncated, info = item.env.step(item.pending_message)
        episode = item.episode
        episode.rewards.append(float(reward))
        episode.num_tool_calls += int(info.get("tool_calls", 0))
        episode.tool_errors += int(info.get("tool_errors", 0))
        episode.timings["env"] += time.perf_counter() - start
        return list(observation), bool(terminated), bool(truncated)

    # ---- the loop's pieces (main thread) ---------------------------------------------------------------------------
    def _collect(
        self, waiting: list[_Live], *, block: bool, finish: Callable[..., None], window: float = 0.0
    ) -> list[_Live]:
        """Move episodes whose env work is done from ``waiting`` to the returned list (or finish them)."""
        if not waiting:
            return []
        now = time.perf_counter()
        if block:  # until one finishes, the earliest deadline, or a short poll (deadlines appear as steps start)
            timeout = max(0.0, min(min(i.deadline for i in waiting) - now, 0.5))
            wait([i.future for i in waiting], timeout=timeout, return_when=FIRST_COMPLETED)
        elif window > 0:
            wait([i.future for i in waiting], timeout=window)
        ready, still = [], []
        now = time.perf_counter()
        for item in waiting:
            assert item.future is not None
            if not item.future.done():
                if now >= item.deadline:
                    finish(item, "timeout", error=f"env step took longer than {self.step_timeout_s:g}s")
                else:
                    still.append(item)
                continue
            error = item.future.exception()
            if isinstance(error, TemplateError) and item.pending_message is None:
                # The chat template cannot serve this env (no tools rendered, no end-of-turn token, ...): a
                # misconfiguration of the whole run, not a fault of one episode, so it must not become zero rewards.
                raise error
            if error is not None:
                finish(item, "error", error=f"{type(error).__name__}: {error}")
            elif item.pending_message is None:  # a reset finished
                if self._over_budget(item, 1):
                    finish(item, "max_episode_tokens", truncated=True)
                else:
                    ready.append(item)
            elif self._after_step(item, item.future.result(), finish):
                ready.append(item)
        waiting[:] = still
        return ready

    def _generate(self, batch: list[_Live], sampling: SamplingParams) -> list[Generation]:
        prompts = [item.episode.prompt_ids + item.episode.completion_ids for item in batch]
        stops = {renderer.end_of_turn_id for renderer in (item.renderer for item in batch) if renderer is not None}
        # The template's end-of-turn token always stops generation, whatever the model's own eos is.
        sampling = dataclasses.replace(sampling, stop_token_ids=sorted(stops | set(sampling.stop_token_ids or [])))
        kwargs: dict[str, Any] = {}
        if sampling.seed is not None:
            if self._takes_seeds:
                # One seed per request: members of a group never share a sample, and runs are reproducible.
                kwargs["seeds"] = [
                    request_seed(sampling.seed, i.episode.task_seed, i.episode.group_index, i.episode.turns)
                    for i in batch
                ]
            elif not self._warned_seeds:
                self._warned_seeds = True
                logger.warning(
                    "%s.generate takes no seeds=: SamplingParams.seed cannot make its samples reproducible",
                    type(self.backend).__name__,
                )
        start = time.perf_counter()
        for attempt in (1, 2):
            try:
                generations = self.backend.generate(prompts, sampling, **kwargs)
                if len(generations) != len(prompts):
                    raise BackendError(f"returned {len(generations)} generations for {len(prompts)} prompts")
                break
            except Exception as error:
                if attempt == 2:
                    lengths = sorted(len(p) for p in prompts)
                    raise BackendError(
                        f"{type(self.backend).__name__} failed twice on a batch of {len(prompts)} prompts "
                        f"({lengths[0]}–{lengths[-1]} tokens): {type(error).__name__}: {error}"
                    ) from error
        elapsed = time.perf_counter() - start
        for item in batch:
            item.episode.timings["generate"] += elapsed
        return generations

    def _take_turn(self, item: _Live, generation: Generation, finish: Callable[..., None]) -> bool:
        """Record the model's tokens and parse them; ``True`` when the env should now step."""
        episode, renderer = item.episode, item.renderer
        assert renderer is not None
        tokens, logprobs = list(generation.token_ids), list(generation.logprobs)
        if len(logprobs) != len(tokens):
            logprobs = (logprobs + [0.0] * len(tokens))[: len(tokens)]
        if tokens and tokens[-1] != renderer.end_of_turn_id and tokens[-1] in renderer.control_token_ids:
            # Stopped on another control token (e.g. <|endoftext|> where the template closes turns with <|im_end|>):
            # drop it and close the turn exactly as the template does, so the context never leaves the template.
            tokens, logprobs = tokens[:-1], logprobs[:-1]
        room = self._room(item)
        cut = len(tokens) > room
        if cut:
            tokens, logprobs = tokens[: int(room)], logprobs[: int(room)]
        self._append(episode, tokens, logprobs, 1)
        episode.turns += 1
        if cut:
            finish(item, "max_episode_tokens", truncated=True)
            return False
        closing = renderer.turn_close_ids(tokens)  # cut, or stopped elsewhere: close it as the template does
        said = tokens[: len(tokens) - len(renderer.end_of_turn_ids)] if not closing else tokens
        item.pending_message = parse_assistant(self.tokenizer.decode(said, skip_special_tokens=False), self.tokenizer)
        if closing:
            if self._over_budget(item, len(closing)):
                finish(item, "max_episode_tokens", truncated=True)
                return False
            self._append(episode, closing, [0.0] * len(closing), 0)
        return True

    def _after_step(self, item: _Live, result: tuple[list[Message], bool, bool], finish: Callable[..., None]) -> bool:
        """Append the env's tokens; ``True`` when the episode goes on to the model."""
        observation, terminated, truncated = result
        episode, env, renderer = item.episode, item.env, item.renderer
        assert env is not None and renderer is not None
        out_of_turns = self.max_turns is not None and episode.turns >= self.max_turns
        ending = terminated or truncated or out_of_turns
        if observation or not ending:  # no new message but the episode goes on: still open the next turn
            history = env.messages[: len(env.messages) - len(observation)]
            try:
                suffix = renderer.suffix_ids(history, observation, add_generation_prompt=not ending)
            except Exception as error:  # e.g. env messages the chat template cannot render
                finish(item, "error", error=f"rendering the env's messages failed: {type(error).__name__}: {error}")
                return False
            if self._over_budget(item, len(suffix) + (0 if ending else 1)):
                finish(item, "max_episode_tokens", truncated=True)
                return False
            self._append(episode, suffix, [0.0] * len(suffix), 0)
        if terminated:
            finish(item, "done")
        elif truncated or out_of_turns:
            finish(item, "max_turns", truncated=True)
        else:
            return True
        return False

    def _room(self, item: _Live) -> float:
        """Tokens the episode may still add under both budgets."""
        room = math.inf
        if self.max_episode_tokens is not None:
            room = self.max_episode_tokens - item.length
        if self.max_completion_tokens is not None:
            room = min(room, self.max_completion_tokens - len(item.episode.completion_ids))
        return room

    def _over_budget(self, item: _Live, extra: int) -> bool:
        return extra > self._room(item)

    @staticmethod
    def _append(episode: Episode, tokens: list[int], logprobs: list[float], mask: int) -> None:
        episode.completion_ids += tokens
        episode.logprobs += logprobs
        episode.env_mask += [mask] * len(tokens)

    @staticmethod
    def _final_score(item: _Live) -> float:
        try:
            value = float(item.env.score())  # type: ignore[union-attr]
        except Exception as error:
            item.episode.error = f"score() raised {type(error).__name__}: {error}"
            return 0.0
        return value if math.isfinite(value) else 0.0


def _progress_bar(total: int, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="episodes", unit="ep", disable=not enabled, leave=False)


def teacher_forced_logprobs(model: Any, episode: Episode) -> list[float]:
    """``model``'s logprob of every completion token given all tokens before it (one forward pass, no gradient).

    The reference for an episode's recorded ``logprobs``: at the positions where ``env_mask`` is 1 a backend that
    sampled from ``model`` must have recorded these values.
    """
    import torch

    ids = torch.tensor([episode.prompt_ids + episode.completion_ids], device=model.device)
    with torch.no_grad():
        logits = model(ids).logits[0, len(episode.prompt_ids) - 1 : -1].float()
    picked = logits.log_softmax(-1).gather(1, ids[0, len(episode.prompt_ids) :, None])[:, 0]
    return picked.cpu().tolist()


def summarize(episodes: list[Episode], *, success_threshold: float = 1.0) -> dict[str, float]:
    """Mean score, pass@1, pass@k and pass^k (k = group size), turns, tool-call/error and truncation rates.

    pass@k is the unbiased estimator ``1 - C(n-c, k) / C(n, k)`` per task (``c`` successes of ``n`` samples, success
    meaning ``score >= success_threshold``); pass^k (all of k succeed) is ``C(c, k) / C(n, k)``; both averaged over
    tasks.
    """
    if not episodes:
        return {}
    groups: dict[int, list[Episode]] = {}
    for episode in episodes:
        groups.setdefault(episode.task_seed, []).append(episode)
    k = min(len(g) for g in groups.values())
    pass_at_k, pass_hat_k, pass_at_1 = [], [], []
    for group in groups.values():
        n, c = len(group), sum(e.score >= success_threshold for e in group)
        pass_at_1.append(c / n)
        pass_at_k.append(1.0 - math.comb(n - c, k) / math.comb(n, k))
        pass_hat_k.append(math.comb(c, k) / math.comb(n, k))
    turns = sum(e.turns for e in episodes)
    calls = sum(e.num_tool_calls for e in episodes)
    return {
        "episodes": float(len(episodes)),
        "tasks": float(len(groups)),
        "k": float(k),
        "mean_score": sum(e.score for e in episodes) / len(episodes),
        "pass@1": sum(pass_at_1) / len(pass_at_1),
        f"pass@{k}": sum(pass_at_k) / len(pass_at_k),
        f"pass^{k}": sum(pass_hat_k) / len(pass_hat_k),
        "mean_turns": turns / len(episodes),
        "tool_calls_per_turn": calls / turns if turns else 0.0,
        "tool_error_rate": sum(e.tool_errors for e in episodes) / calls if calls else 0.0,
        "truncation_rate": sum(e.truncated for e in episodes) / len(episodes),
        "error_rate": sum(e.error is not None for e in episodes) / len(episodes),
    }
