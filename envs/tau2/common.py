"""What the tools of both domains share: upstream's result serialisation and error text, and write tracking."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from datetime import date, datetime
from typing import Any, TypeVar

from pydantic import BaseModel

from envkit.core.tools import ToolError

F = TypeVar("F", bound=Callable[..., Any])

WRITE_MARK = "__tau2_write__"


def to_json_str(result: Any) -> str:
    """A tool result as tau2's ``Environment.to_json_str`` writes it (models dumped, numbers as strings inside
    containers, ``json.dumps(..., default=str)``); a string stays as it is."""

    def process(value: Any) -> Any:
        if isinstance(value, BaseModel):
            return value.model_dump()
        if isinstance(value, str) or value is None:
            return value
        if isinstance(value, (int, float, bool)):
            return str(value)
        if isinstance(value, list):
            return [process(item) for item in value]
        if isinstance(value, tuple):
            return tuple(process(item) for item in value)
        if isinstance(value, dict):
            return {k: process(v) for k, v in value.items()}
        if isinstance(value, (datetime, date)):
            return value.isoformat()
        raise ValueError(f"Unsupported type: {type(value)}")

    if isinstance(result, str):
        return result
    return json.dumps(process(result), default=str)


def upstream(func: F) -> F:
    """Run a tool as tau2 does: its result serialised by :func:`to_json_str`, any exception reported to the model as
    ``Error: <message>`` (tau2's ``Environment.get_response``), never raised out of the env."""

    @functools.wraps(func)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> str:
        if getattr(func, WRITE_MARK, False):
            self.db_dirty = True  # even a failing write may have changed something before it failed
        try:
            return to_json_str(func(self, *args, **kwargs))
        except ToolError:
            raise
        except Exception as error:
            raise ToolError(str(error)) from None

    return wrapper  # type: ignore[return-value]


def write(func: F) -> F:
    """Mark a tool that may change the database (upstream's ``ToolType.WRITE``)."""
    setattr(func, WRITE_MARK, True)
    return func


def canonical(model: BaseModel) -> str:
    """tau2's canonical text of a model: ``json.dumps(model_dump(), sort_keys=True, default=str)``."""
    return json.dumps(model.model_dump(), sort_keys=True, default=str)


def db_hash(db: BaseModel) -> str:
    """The database hash tau2 compares: sha256 of :func:`canonical` of the whole database."""
    return hashlib.sha256(canonical(db).encode()).hexdigest()


def overlay(base: BaseModel) -> Any:
    """A copy-on-write copy of a database: its top-level collections are new dicts over the base's objects, and a
    tool takes its own deep copy of an object (:meth:`ToolsBase.own`) before it can change it. Copying the whole
    airline database takes ~1 s; this takes milliseconds."""
    fields = {name: dict(getattr(base, name)) for name in type(base).model_fields}
    return type(base).model_construct(**fields)


def diff_hash(db: BaseModel, base: BaseModel) -> str:
    """A hash of how ``db`` (an :func:`overlay` of ``base``) differs from ``base``: the canonical text of every
    top-level object that is new or not the base's (and differs from it), and the keys gone. Two overlays of one
    base have equal diff hashes exactly when their whole databases have equal tau2 hashes (:func:`db_hash`), at a
    fraction of the cost."""
    parts = []
    for name in type(base).model_fields:
        mine, theirs = getattr(db, name), getattr(base, name)
        for key, value in mine.items():
            original = theirs.get(key)
            if value is not original and (original is None or canonical(value) != canonical(original)):
                parts.append(f"{name}\0{key}\0{canonical(value)}")
        parts.extend(f"{name}\0{key}\0<gone>" for key in theirs.keys() - mine.keys())
    return hashlib.sha256("\n".join(sorted(parts)).encode()).hexdigest()


class ToolsBase:
    """The database the tools act on, shared by the env and by scoring's replays."""

    db: Any
    base_db: Any
    db_dirty: bool = False

    @classmethod
    def on(cls, db: Any, base_db: Any) -> Any:
        """An instance of these tools over ``db`` (an :func:`overlay` of ``base_db``) alone, for scoring's replays."""
        tools = object.__new__(cls)
        tools.db, tools.base_db, tools.db_dirty = db, base_db, False
        return tools

    def own(self, collection: str, key: str) -> Any:
        """The object ``db.<collection>[key]``, made this database's own (a deep copy of the shared base object)
        so that changing it leaves the base as it is."""
        objects = getattr(self.db, collection)
        value = objects[key]
        if value is getattr(self.base_db, collection).get(key):
            value = objects[key] = value.model_copy(deep=True)
        return value

    @classmethod
    def write_tools(cls) -> set[str]:
        """Names of the tools that may change the database."""
        return {name for name in dir(cls) if getattr(getattr(cls, name), WRITE_MARK, False)}
