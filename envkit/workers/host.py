"""The worker side of process and Ray env workers: :class:`EnvHost` holds many envs (sessions) in one process and
serves pickled requests for them, each on a thread of its own (a :class:`~envkit.workers.threads.DaemonPool`), so one
session's slow call never waits for another's.

Requests are ``pickle((session_id, op, argument))``; replies ``pickle(("ok", value))`` or ``pickle(("error",
exception_or_None, type_name, message, traceback))``. A step replies with a :class:`~envkit.workers.base.StepDelta`
(only the messages the caller does not have), so its bytes do not grow with the episode's history.
"""

from __future__ import annotations

import contextlib
import pickle
import sys
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any

from envkit.workers.base import (
    EnvFactory,
    HistoryMirror,
    checked_step,
    components_outcome,
    reset_outcome,
    score_outcome,
)


class RemoteEnvError(RuntimeError):
    """An exception the env raised in a worker that could not be brought back as itself (it does not pickle): its
    message reads ``TypeName: message``; ``type_name`` and ``remote_traceback`` say more."""

    def __init__(self, message: str, type_name: str = "", remote_traceback: str = "") -> None:
        super().__init__(message)
        self.type_name = type_name
        self.remote_traceback = remote_traceback


@dataclass
class _Hosted:
    env: Any
    sent: HistoryMirror = field(default_factory=HistoryMirror)


class EnvHost:
    """Holds the envs of many sessions (``session_id -> env``) and serves pickled requests for them with pickled
    replies. :meth:`serve` never raises; it may run on several threads at once (one call per session at a time)."""

    def __init__(self) -> None:
        self.sessions: dict[int, _Hosted] = {}
        self._lock = threading.Lock()
        self._closed_before_built: set[int] = set()  # closes that found no env: its open is running, or still to run

    def serve(self, request: bytes) -> bytes:
        """One request's reply."""
        try:
            session, op, argument = pickle.loads(request)
            value = self._run(session, op, argument)
            return pickle.dumps(("ok", value), protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException as error:  # everything goes back to the caller, SystemExit included
            return _error_reply(error)

    def _run(self, session: int, op: str, argument: Any) -> Any:
        if op == "load":  # import the env's code (unpickling the factory imports its module; a spec is resolved)
            if isinstance(argument, EnvFactory):
                from envkit.registry import resolve

                resolve(argument.spec)
            return None
        if op == "open":
            # A caller that gives up on the construction (cancelled) sends close at once; each request runs on a
            # thread of its own, so the close can run before or while the env is built: the env is closed once built.
            env = None
            try:
                env = argument()
            finally:
                with self._lock:
                    closed = session in self._closed_before_built
                    self._closed_before_built.discard(session)
                    if env is not None and not closed:
                        self.sessions[session] = _Hosted(env)
            if closed:
                close = getattr(env, "close", None)
                if callable(close):
                    close()
            return None
        if op == "close":
            with self._lock:
                hosted = self.sessions.pop(session, None)
                if hosted is None:  # the caller sends close only after open: that open has not finished
                    self._closed_before_built.add(session)
            close = getattr(hosted.env if hosted else None, "close", None)
            if callable(close):
                close()
            return None
        hosted = self.sessions.get(session)
        if hosted is None:
            raise RuntimeError(f"no env for session {session} in this worker ({op}())")
        if op == "reset":
            opening, info, tools = reset_outcome(hosted.env, argument)
            hosted.sent = HistoryMirror(opening)
            return opening, info, tools
        if op == "step":
            return hosted.sent.delta(hosted.env, checked_step(hosted.env, argument))
        if op == "score":  # the argument: how the episode ended (None: not told)
            return score_outcome(hosted.env, argument)
        if op == "score_components":
            return components_outcome(hosted.env)
        if op == "transcript":
            return list(getattr(hosted.env, "messages", []))
        if op == "call":  # a caller's own request (envkit serve-env's): a picklable function of the env
            function, args = argument
            return function(hosted.env, *args)
        raise ValueError(f"unknown request {op!r}")


def _error_reply(error: BaseException) -> bytes:
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    name, message = type(error).__name__, str(error)
    error.__traceback__ = None
    try:  # the exception itself when it survives a round trip (custom __init__ signatures often do not)
        if not isinstance(error, Exception):  # SystemExit & co. would end the caller's run: sent as a message
            raise TypeError(name)
        carried = pickle.dumps(error, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(carried)
    except Exception:
        carried = None
    # The exception travels as bytes of its own: a class the parent cannot import (an env loaded from a file path
    # defines its module in the worker only) then costs the exception, not its name, message and traceback.
    return pickle.dumps(("error", carried, name, message, text), protocol=pickle.HIGHEST_PROTOCOL)


def unpack_reply(payload: bytes) -> Any:
    """The value of a reply from :class:`EnvHost`, or raise the env's exception."""
    try:
        reply = pickle.loads(payload)
    except Exception as error:  # e.g. an exception class the parent cannot import
        raise RemoteEnvError(f"the env worker's reply could not be read: {type(error).__name__}: {error}") from None
    if reply[0] == "ok":
        return reply[1]
    _, pickled, name, message, text = reply
    carried: BaseException | None = None
    if pickled is not None:
        with contextlib.suppress(Exception):  # e.g. its class is defined in a module only the worker has
            carried = pickle.loads(pickled)
    if carried is None:
        carried = RemoteEnvError(f"{name}: {message}", name, text)
    with contextlib.suppress(Exception):
        carried.remote_traceback = text  # type: ignore[union-attr]
    raise carried


def extend_sys_path(entries: list[str]) -> None:
    """Append the parent's ``sys.path`` entries this process lacks (so envs in tests' and scripts' modules import)."""
    for entry in entries:
        if entry not in sys.path:
            sys.path.append(entry)
