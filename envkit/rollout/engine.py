"""The rollout engine: every episode its own coroutine, generation batched continuously, env calls off the loop.

Each episode is one straight walk: task seed → ``reset`` → opening prompt tokens (the chat template's own rendering)
→ generate → parse → ``step`` → env-message tokens appended as a template suffix (masked) → … → ``score``. Model tokens
are recorded exactly as generated, never re-tokenized; ``env_mask`` marks them with 1 and the env's tokens with 0.
Before ``score`` the env is told how the episode ended (:meth:`envkit.Env.end` with an :class:`~envkit.core.env.Ending`,
in the same worker call, on every worker kind): the env's own ending, or the engine's cut (its ``max_turns``, a token
budget), so a reward that needs a finished episode never credits one the engine cut.

Scheduling: an episode waits for the model with one ``await``; the backend batches whatever is waiting whenever it is
free (:class:`~envkit.rollout.batching.MicroBatcher`, or the backend's own ``agenerate``), so an episode whose env step
finishes early is generated in the next batch, not after a full round. Env calls (construct, reset, step with its
parsing and rendering, score) run on :mod:`envkit.workers` with a deadline each.

Faults stay local: an env that raises ends its episode with ``error``; a call past ``step_timeout_s`` ends it at once
with ``finish_reason="timeout"`` (the hung call is abandoned, its worker slot given back); a generation that fails
twice ends only its own episode. Nothing is lost (``len(result) == len(tasks) * group_size``) and nothing writes to
an episode after it is returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from envkit.backends import Backend, Generation, SamplingParams, request_seed
from envkit.backends.base import (
    NOT_TOKEN_EXACT,
    AsyncBackend,
    ChatBackend,
    HasContextLength,
    ReportsTokens,
)
from envkit.chat.render import ChatRenderer, TemplateError
from envkit.core.env import Ending, Env, step_ending
from envkit.core.messages import Message
from envkit.rollout import steps
from envkit.rollout.batching import GenerationTimeout, MicroBatcher, generate_within
from envkit.rollout.episode import Episode
from envkit.rollout.progress import RunProgress, progress_bar
from envkit.rollout.renderers import OpeningPrompts, built_renderer, shared_renderer
from envkit.rollout.steps import StepResult
from envkit.util.background import run_blocking
from envkit.workers import (
    ClosingSession,
    EnvSession,
    EnvTimeout,
    EnvWorkers,
    LeakedThreadsError,
    ScoreError,
    ThreadWorkers,
    check_picklable_factory,
    checked_components,
    checked_score,
    make_workers,
)

T = TypeVar("T")

_RAISE_GENERATE_TIMEOUT = "if generations are this slow, raise generate_timeout_s / --generate-timeout"


class _Ended(Exception):
    """Internal: the episode ended (its fields are already set)."""


class RolloutEngine:
    """Run episodes of an env with a generation backend and return token-exact :class:`Episode` objects.

    Args:
        env_factory: ``env_factory()`` returns a fresh :class:`envkit.Env` (one per episode).
        backend: A :class:`~envkit.backends.Backend` (its ``generate`` batched continuously by the engine), or an
            :class:`~envkit.backends.AsyncBackend` (its ``agenerate`` awaited per episode); see :mod:`envkit.backends`.
            A :class:`~envkit.backends.ChatBackend` is refused (not token-exact: :class:`ChatRolloutEngine` plays it).
        tokenizer: The model's tokenizer (its chat template renders prompts and env messages).
        max_turns: Assistant turns per episode (default: the env's own ``max_turns``).
        max_episode_tokens: Cap on prompt + completion tokens (also capped by the backend's context length).
        max_completion_tokens: Cap on one episode's completion tokens (model and env tokens after the prompt): what
            bounds the sequence length a trainer back-propagates through.
        concurrency: Episodes in flight at once, and so envs alive at once (built and not yet closed), on every
            kind of env worker: an episode builds its env once it gets one of ``concurrency`` slots and gives the
            slot back once its env is closed, so an env that is a server session (``openenv:``, ``mcp:``) never asks
            a server for more sessions than this. The rest wait, outside any deadline.
        step_timeout_s: Deadline of each env call (construct, reset, step, score), in running time (how time spent
            waiting for a free worker counts: see :class:`~envkit.workers.ThreadWorkers`); past it the episode ends
            with ``finish_reason="timeout"``.
        generate_timeout_s: Deadline of one generation, from when the request enters the backend (its batch's call
            starts, or a server request gets its slot; time queued behind other calls does not count; None: none).
            Past it the episode ends with an ``error`` (not retried): a hung backend or server fails its episodes
            loudly instead of stalling the run.
        gather_s: Before a batch starts while env calls are still running, wait up to this long for them to join.
            A run's first batch also waits for every episode still opening its env (0: no batch waits).
        chat_template: A chat template to use instead of the tokenizer's (see :class:`envkit.ChatRenderer`).
        template_kwargs: Extra chat-template variables (e.g. ``{"enable_thinking": False}``).
        progress: Show a progress bar over episodes.
        env_workers: Where envs live and their calls run: ``"threads"`` (default: this process, ``concurrency``
            calls at once), ``"processes"`` or ``"ray"`` (a few worker processes or Ray actors, at most two per core,
            each hosting many episodes' envs; ``env_factory`` must then be picklable, e.g.
            :class:`envkit.workers.EnvFactory`), or an :class:`envkit.workers.EnvWorkers`. Out of process,
            a hung call ends its episode and retires its worker (killed once
            its other episodes end), a dead worker ends only the episodes it hosted (:mod:`envkit.workers.processes`,
            :mod:`envkit.workers.ray_actors`).
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
        generate_timeout_s: float | None = 1800.0,
        gather_s: float = 0.05,
        chat_template: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
        progress: bool = False,
        env_workers: str | EnvWorkers | None = None,
    ) -> None:
        self._check_backend(backend)
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if max_completion_tokens is not None and max_completion_tokens < 1:
            raise ValueError("max_completion_tokens must be at least 1")
        self.env_factory = env_factory
        self.backend = backend
        self.tokenizer = tokenizer
        self.max_turns = max_turns
        context = backend.max_model_len if isinstance(backend, HasContextLength) else None
        limits = [n for n in (max_episode_tokens, context) if n]
        self.max_episode_tokens = min(limits) if limits else None
        self.max_completion_tokens = max_completion_tokens
        self.concurrency = concurrency
        self.step_timeout_s = step_timeout_s
        if generate_timeout_s is not None and not generate_timeout_s > 0:
            raise ValueError("generate_timeout_s must be positive (or None for no deadline)")
        self.generate_timeout_s = generate_timeout_s
        self.gather_s = gather_s
        self.chat_template = chat_template
        self.template_kwargs = template_kwargs
        self.progress = progress
        self.workers: EnvWorkers = make_workers(env_workers or "threads", concurrency=concurrency)
        if not self.workers.in_process:  # fail here, in one line, not in every episode
            check_picklable_factory(env_factory, getattr(self.workers, "kind", str(env_workers)))
        # Rendering and parsing run in this process off the loop: on the env threads, or on threads of their own.
        self._threads = ThreadWorkers(concurrency)  # rendering never queues behind slow env calls
        self._busy = 0  # episodes inside an env call
        # Per event loop (each run() has its own): the episodes holding an env, at most `concurrency` at once.
        self._live: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )
        self._opening = 0  # episodes not yet at their first generation (opening their env, or waiting for a slot)
        self._run_batches = 0  # the batcher's call count when the current run began
        self._batcher: MicroBatcher | None = None

    def _check_backend(self, backend: Any) -> None:
        """Refuse a backend this engine cannot play episodes with, in one line."""
        if isinstance(backend, ChatBackend):  # messages out, no token ids: eval only (ChatRolloutEngine)
            raise ValueError(NOT_TOKEN_EXACT)

    def close(self) -> None:
        """Release the env workers."""
        self.workers.close()

    @property
    def leaked_threads(self) -> int:
        """Timed-out calls still running on abandoned threads of this process (env calls on ``"threads"`` workers,
        and rendering); each keeps its thread, and an env call its env (see :class:`~envkit.workers.ThreadWorkers`).
        """
        return int(getattr(self.workers, "leaked", 0)) + self._threads.leaked

    def renderer_for(self, tools: list[dict[str, Any]] | None) -> ChatRenderer:
        """A (cached) renderer for one tool set, built once per tokenizer, template and tools in this process, not once
        per engine (``make_rollout_func`` builds an engine per trainer). The template probes themselves run once per
        tokenizer and template, whatever the tool set (see :class:`~envkit.chat.ChatRenderer`); the cache keeps the
        most recently used renderers (:mod:`envkit.rollout.renderers`)."""
        return shared_renderer(
            self.tokenizer, tools, chat_template=self.chat_template, template_kwargs=self.template_kwargs
        )

    # ---- running -----------------------------------------------------------------------------------------------------
    def run(
        self,
        tasks: list[int],
        group_size: int | Sequence[int],
        sampling: SamplingParams,
        *,
        on_episode: Callable[[Episode], None] | None = None,
        on_turn: Callable[[Episode], None] | None = None,
    ) -> list[Episode]:
        """Run ``group_size`` episodes per task seed; return them grouped in task order (blocking).

        Args:
            tasks: Task seeds; every episode of a group resets its env with the same seed.
            group_size: Episodes per task (GRPO's number of generations), or one count per task (groups of unequal
                size, e.g. a trainer's per-process share of its groups); all of them run at once.
            sampling: Sampling parameters for every turn.
            on_episode: Called with each episode as soon as it finishes (e.g. to write it out).
            on_turn: Called with the episode after each model turn is recorded (``episode.turns`` counts it), on the
                event loop: keep it quick. With ``progress``, the bar counts turns as well (``N turns``), so it moves
                while long episodes are still running.

        Returns:
            ``sum`` of the group sizes episodes, always: a failed episode is returned with ``error`` or
            ``finish_reason="timeout"`` set, never dropped.
        """
        return run_blocking(self.arun(tasks, group_size, sampling, on_episode=on_episode, on_turn=on_turn))

    async def arun(
        self,
        tasks: list[int],
        group_size: int | Sequence[int],
        sampling: SamplingParams,
        *,
        on_episode: Callable[[Episode], None] | None = None,
        on_turn: Callable[[Episode], None] | None = None,
    ) -> list[Episode]:
        """:meth:`run` as a coroutine, for callers that have an event loop."""
        sizes = [group_size] * len(tasks) if isinstance(group_size, int) else [int(n) for n in group_size]
        if len(sizes) != len(tasks):
            raise ValueError(f"group_size has {len(sizes)} counts for {len(tasks)} tasks")
        if any(n < 0 for n in sizes):
            raise ValueError("group sizes must not be negative")
        episodes = [
            Episode(task_seed=int(seed), group_index=g)
            for seed, size in zip(tasks, sizes, strict=True)
            for g in range(size)
        ]
        generate = self._generator()
        self._run_batches = self._batcher.batches if self._batcher is not None else 0
        prepare = getattr(self.workers, "prepare", None)
        if prepare is not None and episodes:  # out-of-process workers start together, so episodes batch together
            await prepare(len(episodes))
        bar = progress_bar(len(episodes), self.progress)
        # With no bar shown nothing is added per step: no hooks, and the backend counts no tokens.
        shown = RunProgress(bar, self.max_turns, on_turn) if not bar.disable else None
        turn_done = shown.turn_done if shown is not None else on_turn
        counting = shown is not None and isinstance(self.backend, ReportsTokens)
        if counting:
            hook_before, self.backend.token_hook = self.backend.token_hook, shown.tokens
        openings = OpeningPrompts()  # this run's: each distinct opening prompt rendered once

        async def play(position: int, episode: Episode) -> None:
            own = sampling
            if sampling.seed is not None:
                # Each episode's own base seed, from its place in this call: (task seed, group index) alone repeats
                # when a task comes twice in one call (a dataset that repeats seeds), and its groups would be copies.
                own = dataclasses.replace(sampling, seed=request_seed(sampling.seed, position))
            await self._play(episode, own, generate, turn_done, openings, shown.generating if shown else None)
            bar.update(1)
            if on_episode is not None:
                on_episode(episode)

        tasks_ = [asyncio.ensure_future(play(i, e)) for i, e in enumerate(episodes)]
        try:
            await asyncio.gather(*tasks_)
        except BaseException:  # e.g. a TemplateError, or the caller cancelled: no episode may run on unseen
            for task in tasks_:
                task.cancel()
            await asyncio.gather(*tasks_, return_exceptions=True)
            raise
        finally:
            bar.close()
            if counting:
                self.backend.token_hook = hook_before
        return episodes

    def _generator(self) -> Callable[[list[int], SamplingParams, int | None], Awaitable[Generation]]:
        if isinstance(self.backend, AsyncBackend):  # it batches continuously itself
            return self.backend.agenerate
        if self._batcher is None:
            # Episodes waiting for a free env worker (process or Ray pools) are in no env call: batches never wait.
            self._batcher = MicroBatcher(
                self.backend,
                gather_s=self.gather_s,
                envs_busy=lambda: self._busy - getattr(self.workers, "waiting", 0),
                timeout_s=self.generate_timeout_s,
                hold=self._first_batch_waits,
            )
        return self._batcher

    def _first_batch_waits(self) -> bool:
        """A run's first batch waits for every episode that holds an env slot and is still opening it (construction,
        reset, the opening prompt), each bounded by its own deadline. Episodes whose envs open later than the others
        (a worker loading the env's code for the first time, a slow construction) would otherwise generate in
        batches of their own for the whole run: continuous batching never re-merges them (measured: 32 episodes x
        5 turns on 4 worker processes made 10-14 backend calls instead of 5)."""
        if self.gather_s <= 0 or self._batcher is None or self._batcher.batches != self._run_batches:
            return False
        return self._opening - getattr(self.workers, "waiting", 0) > 0

    # ---- one episode -------------------------------------------------------------------------------------------------
    async def _play(
        self,
        episode: Episode,
        sampling: SamplingParams,
        generate: Callable[[list[int], SamplingParams, int | None], Awaitable[Generation]],
        on_turn: Callable[[Episode], None] | None = None,
        openings: OpeningPrompts | None = None,
        on_generate: Callable[[int], None] | None = None,
    ) -> None:
        started = time.perf_counter()
        episode.timings.update(env=0.0, generate=0.0)
        live = self._live_envs()
        await live.acquire()  # the episode's env is built, played and closed while it holds one of the slots
        session: EnvSession | None = None
        unopened = True
        played = False  # the episode came to its end (not cancelled, nor failed with the run)
        self._opening += 1
        try:
            try:
                session = await self._env_call(
                    episode, "construction", lambda timeout: self.workers.open(self.env_factory, timeout_s=timeout)
                )
                episode.worker = dict(getattr(session, "placement", None) or {})
                opening, info, tools = await self._env_call(
                    episode, "reset", lambda timeout: session.reset(episode.task_seed, timeout_s=timeout)
                )
                episode.info, episode.messages, episode.tools = info, list(opening), list(tools or [])
                renderer = await self._renderer(tools)
                episode.prompt_ids = await self._local(episode, self._opening_ids, renderer, opening, openings)
                if self._over_budget(episode, 1):  # a misconfigured budget: an error, never a silent 0 reward
                    self._end(
                        episode,
                        Ending.MAX_EPISODE_TOKENS,
                        truncated=True,
                        error=f"the opening prompt is {len(episode.prompt_ids)} tokens, leaving no room under "
                        f"max_episode_tokens={self.max_episode_tokens} / max_completion_tokens="
                        f"{self.max_completion_tokens}: raise the budget",
                    )
                # The template's end-of-turn token always stops generation, whatever the model's own eos is.
                stops = sorted({renderer.end_of_turn_id, *(sampling.stop_token_ids or [])})
                turn_sampling = dataclasses.replace(sampling, stop_token_ids=stops)
                # The context so far (prompt + completion), extended in place by each turn's new tokens: a copy of
                # the whole history per turn would cost O(history) per step, and so would the garbage collector
                # sweeping the copies that every waiting episode holds while its batch is generated.
                context = list(episode.prompt_ids)
                while True:
                    if unopened:
                        unopened = False
                        self._opening -= 1
                    context += episode.completion_ids[len(context) - len(episode.prompt_ids) :]
                    if on_generate is not None:
                        on_generate(episode.turns + 1)
                    generation = await self._generate(episode, generate, turn_sampling, context)
                    said = self._take_turn(episode, renderer, generation, on_turn)
                    last = self.max_turns is not None and episode.turns >= self.max_turns
                    step = await self._turn(episode, session, renderer, said, last)
                    self._after_step(episode, step, last)
            except _Ended:
                pass
            except (TemplateError, LeakedThreadsError):
                raise
            except Exception as error:  # a bug in the engine itself: the episode is still returned, with the reason
                self._end(episode, Ending.ERROR, error=f"{type(error).__name__}: {error}", raise_=False)
            if session is not None and episode.error is None:
                await self._score(episode, session)
            played = True
        finally:  # also when the run is cancelled or fails: the env's worker is given back
            if unopened:  # ended before its first turn: a first batch waiting for it goes
                self._opening -= 1
                if self._batcher is not None:
                    self._batcher.notify()
            try:
                if session is not None:
                    await self._close(session, wait=played)
            finally:
                live.release()
        episode.timings["total"] = time.perf_counter() - started

    def _live_envs(self) -> asyncio.Semaphore:
        """The running loop's slots for episodes holding an env (``concurrency`` of them)."""
        loop = asyncio.get_running_loop()
        live = self._live.get(loop)
        if live is None:
            live = self._live[loop] = asyncio.Semaphore(self.concurrency)
        return live

    async def _close(self, session: EnvSession, *, wait: bool) -> None:
        """Close the episode's env. ``wait`` (the episode ended, rather than the run being cancelled or failing), with
        a session that can say when its env is closed: wait for it (at most ``step_timeout_s``), so the next episode's
        env is built only once this one is gone (a server session freed). A failing or hung ``close()`` is not the
        episode's fault: it is dropped."""
        if not wait or not isinstance(session, ClosingSession):
            session.close()
            return
        with contextlib.suppress(Exception):
            await session.aclose(timeout_s=self.step_timeout_s)

    async def _renderer(self, tools: list[dict[str, Any]] | None) -> ChatRenderer:
        """The renderer for ``tools``: looked up on the loop when built, else built off the loop *outside* any env
        deadline. Building probes the chat template (seconds on a loaded machine, once per process and template):
        envkit's own set-up, which must not fail an episode as "env rendering took longer than step_timeout_s"."""
        renderer = built_renderer(
            self.tokenizer, tools, chat_template=self.chat_template, template_kwargs=self.template_kwargs
        )
        if renderer is not None:
            return renderer
        return await asyncio.to_thread(self.renderer_for, tools)

    @staticmethod
    def _opening_ids(renderer: ChatRenderer, opening: list[Message], openings: OpeningPrompts | None) -> list[int]:
        """The opening prompt's token ids (``openings``: the run's, so that a group's episodes render their shared
        opening once)."""
        if openings is None:
            return renderer.prompt_ids(list(opening))
        return openings.prompt_ids(renderer, opening)

    async def _turn(
        self, episode: Episode, session: EnvSession, renderer: ChatRenderer, said: list[int], last: bool
    ) -> StepResult:
        """Parse the model's turn, step the env, render the env's reply: one worker call when the env lives in this
        process, else parsing and rendering here (off the loop) around the worker's step."""
        env = getattr(session, "env", None)
        if env is not None and self.workers.in_process:
            step = await self._env_call(
                episode,
                "step",
                lambda timeout: self.workers.call(steps.step_in_process, env, renderer, said, last, timeout_s=timeout),
            )
        else:
            message = await self._local(episode, steps.parse_turn, renderer, said)
            outcome = await self._env_call(episode, "step", lambda timeout: session.step(message, timeout_s=timeout))
            step = await self._local(episode, steps.render_step, renderer, outcome, last)
        episode.messages = step.history + step.observation
        return step

    async def _env_call(self, episode: Episode, what: str, call: Callable[[float], Awaitable[T]]) -> T:
        """``await call(timeout)`` (an env worker call), its time counted; a fault or a timeout ends the episode."""
        self._busy += 1
        start = time.perf_counter()
        try:
            return await call(self.step_timeout_s)
        except EnvTimeout as error:
            detail = f" ({error.detail})" if error.detail else ""
            self._end(
                episode,
                Ending.TIMEOUT,
                error=f"env {what} took longer than {self.step_timeout_s:g}s{detail} (if the env is this slow, raise "
                "step_timeout_s / --step-timeout)",
            )
        except (TemplateError, LeakedThreadsError):  # the chat template cannot serve this env, or thread workers
            raise  # leak hung calls past their limit: the whole run is misconfigured
        except (KeyboardInterrupt, asyncio.CancelledError):
            raise
        except BaseException as error:  # an env's sys.exit() too: it ends its own episode, not the run
            self._end(episode, Ending.ERROR, error=f"{type(error).__name__}: {error}")
        finally:
            self._busy -= 1
            episode.timings["env"] += time.perf_counter() - start
            if self._batcher is not None:
                self._batcher.notify()
        raise AssertionError("unreachable")

    async def _local(self, episode: Episode, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` in this process off the event loop (rendering, parsing), as an env call."""
        return await self._env_call(
            episode, "rendering", lambda timeout: self._threads.call(function, *args, timeout_s=timeout)
        )

    async def _score(self, episode: Episode, session: EnvSession) -> None:
        """Tell the env how the episode ended (its :class:`~envkit.core.env.Ending`, as ``finish_reason`` records it)
        and read its score, in one worker call; then its score components."""
        try:
            value = await session.score(timeout_s=self.step_timeout_s, ending=Ending(episode.finish_reason))
        except EnvTimeout:
            episode.error, episode.score = f"score() took longer than {self.step_timeout_s:g}s", 0.0
            return
        except LeakedThreadsError:
            raise
        except ScoreError as error:  # NaN, out of [0, 1], not a number: never a reward, always a counted error
            episode.error, episode.score = str(error), 0.0
            return
        except Exception as error:
            episode.error, episode.score = f"score() raised {type(error).__name__}: {error}", 0.0
            return
        try:  # the workers check it too; an EnvWorkers of the caller's own may not
            episode.score = checked_score(value, self._env_name(session))
        except ScoreError as error:
            episode.error, episode.score = str(error), 0.0
            return
        components = getattr(session, "score_components", None)
        if components is None:  # an EnvWorkers of the caller's own, without them
            return
        try:
            episode.score_components = checked_components(
                await components(timeout_s=self.step_timeout_s), self._env_name(session)
            )
        except EnvTimeout:
            episode.error, episode.score = f"score_components() took longer than {self.step_timeout_s:g}s", 0.0
        except LeakedThreadsError:
            raise
        except ScoreError as error:
            episode.error, episode.score = str(error), 0.0
        except Exception as error:
            episode.error, episode.score = f"score_components() raised {type(error).__name__}: {error}", 0.0

    def _env_name(self, session: EnvSession) -> str:
        """The env's class name (or, when the env lives elsewhere, its factory's spec or name), for messages."""
        env = getattr(session, "env", None)
        if env is not None:
            return type(env).__name__
        factory = self.env_factory
        return str(getattr(factory, "spec", None) or getattr(factory, "__name__", None) or type(factory).__name__)

    async def _generate(
        self,
        episode: Episode,
        generate: Callable[[list[int], SamplingParams, int | None], Awaitable[Generation]],
        sampling: SamplingParams,
        prompt: list[int],
    ) -> Generation:
        """The model's next turn for ``prompt`` (the episode's context: its prompt and completion so far)."""
        seed = None
        if sampling.seed is not None:  # one seed per request: group members never share a sample
            seed = request_seed(sampling.seed, episode.task_seed, episode.group_index, episode.turns)
        room = self._room(episode)
        if room < sampling.max_new_tokens:  # never ask for tokens the episode has no room for (a server refuses it)
            sampling = dataclasses.replace(sampling, max_new_tokens=max(1, int(room)))
        start = time.perf_counter()
        failures = []
        try:
            for _ in range(2):
                try:  # the deadline counts from when the request enters the backend, not time queued before
                    return await generate_within(generate, prompt, sampling, seed, self.generate_timeout_s)
                except GenerationTimeout as error:  # a hung backend or server: retrying would only wait again
                    self._end(episode, Ending.ERROR, error=f"{error} ({_RAISE_GENERATE_TIMEOUT})")
                except Exception as error:
                    failures.append(f"{type(error).__name__}: {error}")
        finally:
            episode.timings["generate"] += time.perf_counter() - start
        self._end(episode, Ending.ERROR, error=f"generation failed twice: {failures[-1]}")
        raise AssertionError("unreachable")

    def _take_turn(
        self,
        episode: Episode,
        renderer: ChatRenderer,
        generation: Generation,
        on_turn: Callable[[Episode], None] | None = None,
    ) -> list[int]:
        """Record the model's tokens (closing the turn as the template does); return the tokens it said."""
        tokens, logprobs = list(generation.token_ids), list(generation.logprobs)
        if len(logprobs) != len(tokens):  # padding them would hand TRL's importance sampling invented values
            self._end(
                episode,
                Ending.ERROR,
                error=f"the backend returned {len(tokens)} tokens but {len(logprobs)} logprobs",
            )
        if tokens and tokens[-1] != renderer.end_of_turn_id and tokens[-1] in renderer.control_token_ids:
            # Stopped on another control token (e.g. <|endoftext|> where the template closes turns with <|im_end|>):
            # drop it and close the turn exactly as the template does, so the context never leaves the template.
            tokens, logprobs = tokens[:-1], logprobs[:-1]
        room = self._room(episode)
        cut = len(tokens) > room
        if cut:
            tokens, logprobs = tokens[: int(room)], logprobs[: int(room)]
        _append(episode, tokens, logprobs, 1)
        episode.turns += 1
        episode.turn_models.append(generation.model or "")
        if cut or (generation.finish_reason == "length" and len(tokens) >= room):
            reason = "budget"  # the episode's budget bound this turn (its max_new_tokens was lowered to the room)
        elif not renderer.turn_close_ids(tokens):
            reason = "stop"
        else:
            reason = "length" if generation.finish_reason == "length" else "closed"
        episode.turn_finish_reasons.append(reason)
        if on_turn is not None:
            on_turn(episode)
        if cut:
            self._end(episode, Ending.MAX_EPISODE_TOKENS, truncated=True)
        closing = renderer.turn_close_ids(tokens)  # cut, or stopped elsewhere: close it as the template does
        if closing:
            if self._over_budget(episode, len(closing)):
                self._end(episode, Ending.MAX_EPISODE_TOKENS, truncated=True)
            _append(episode, closing, [0.0] * len(closing), 0)
            return tokens
        return tokens[: len(tokens) - len(renderer.end_of_turn_ids)]

    def _after_step(self, episode: Episode, step: StepResult, last: bool) -> None:
        """Count the step and append the env's tokens; return when the episode goes on to the model."""
        episode.rewards.append(step.reward)
        episode.num_tool_calls += int(step.info.get("tool_calls", 0))
        episode.tool_errors += int(step.info.get("tool_errors", 0))
        if step.render_error is not None:  # e.g. env messages the chat template cannot render
            self._end(episode, Ending.ERROR, error=f"rendering the env's messages failed: {step.render_error}")
        own = step_ending(step.terminated, step.truncated, step.info)  # how the env ended the episode, if it did
        ending = own is not None or last
        if step.suffix:
            if self._over_budget(episode, len(step.suffix) + (0 if ending else 1)):
                if own is not None:  # the env's last words do not fit, but the env did end the episode
                    self._end(episode, own, truncated=not own.proper)
                self._end(episode, Ending.MAX_EPISODE_TOKENS, truncated=True)
            _append(episode, step.suffix, [0.0] * len(step.suffix), 0)
        if own is not None:
            self._end(episode, own, truncated=not own.proper)
        if ending:  # the engine's turn cap
            self._end(episode, Ending.MAX_TURNS, truncated=True)

    def _room(self, episode: Episode) -> float:
        """Tokens the episode may still add under both budgets."""
        room = math.inf
        if self.max_episode_tokens is not None:
            room = self.max_episode_tokens - len(episode.prompt_ids) - len(episode.completion_ids)
        if self.max_completion_tokens is not None:
            room = min(room, self.max_completion_tokens - len(episode.completion_ids))
        return room

    def _over_budget(self, episode: Episode, extra: int) -> bool:
        return extra > self._room(episode)

    @staticmethod
    def _end(
        episode: Episode, reason: Ending, *, truncated: bool = False, error: str | None = None, raise_: bool = True
    ) -> None:
        episode.finish_reason, episode.truncated = reason.value, truncated
        if error is not None:
            episode.error, episode.score = error, 0.0
        if raise_:
            raise _Ended


def _append(episode: Episode, tokens: list[int], logprobs: list[float], mask: int) -> None:
    episode.completion_ids += tokens
    episode.logprobs += logprobs
    episode.env_mask += [mask] * len(tokens)
