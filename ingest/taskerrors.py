"""Failures of ingest's Ray tasks as one line: the stage, the file, the cause.

Inside a task, ``in_stage`` turns an unexpected exception into a ``StageError`` naming the
stage and the document or file the task was on (storage errors pass through, so Ray
retries them). On the driver, ``get`` replaces Ray's flattened traceback (ANSI colours
included) with one ``StageError`` line, whatever the task raised or however its worker died.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from flashfeed.errors import FlashfeedError, StorageError

from .sources import Item, Reject

__all__ = ["StageError", "cause_line", "describe", "get", "in_stage", "where_items"]

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_MAX = 300


class StageError(FlashfeedError, ValueError):
    """A stage of ingest failed on a document or file: one line, picklable across Ray."""

    def __init__(self, stage: str, where: str, cause: str) -> None:
        super().__init__(f"ingest {stage} failed on {where}: {cause}")
        self.stage = stage
        self.where = where
        self.cause = cause

    def __reduce__(self) -> tuple[Any, ...]:
        return (StageError, (self.stage, self.where, self.cause))


def cause_line(exc: BaseException) -> str:
    """``Type: message``: the message's first line (a traceback some exceptions carry stays
    out), without ANSI escapes, at most 300 characters."""
    lines = [ln for ln in _ANSI.sub("", str(exc)).splitlines() if ln.strip()]
    text = " ".join(lines[0].split()) if lines else "(no message)"
    line = f"{type(exc).__name__}: {text}"
    return line if len(line) <= _MAX else line[: _MAX - 3] + "..."


def where_items(items: Sequence[Item]) -> str:
    """Where a task's items come from: one source, or the first and last."""
    if not items:
        return "no documents"
    first, last = items[0].source, items[-1].source
    return first if first == last else f"{first} .. {last}"


def describe(arg: Any) -> str:
    """Where a task's argument points: a URL, a partition's file, or items' sources."""
    if isinstance(arg, str):
        return arg
    url = getattr(arg, "url", None)
    if isinstance(url, str):
        return url
    if isinstance(arg, list | tuple) and arg and all(isinstance(a, Item) for a in arg):
        return where_items(arg)
    return type(arg).__name__


@contextmanager
def in_stage(stage: str, where: str) -> Iterator[None]:
    """Inside a task: any exception but a counted skip (``Reject``), a ``StageError`` or a
    storage error (Ray retries those) leaves as ``StageError(stage, where, ...)``."""
    try:
        yield
    except (Reject, StageError, StorageError):
        raise
    except Exception as exc:
        raise StageError(stage, where, cause_line(exc)) from None


def _one_line(stage: str, where: str, exc: BaseException) -> FlashfeedError:
    """The driver's line for a task that raised ``exc`` (a Ray error) on ``where``."""
    import ray

    cause = getattr(exc, "cause", None) if isinstance(exc, ray.exceptions.RayTaskError) else None
    if isinstance(cause, StageError):
        return StageError(cause.stage, cause.where, cause.cause)
    if isinstance(cause, StorageError):  # retried by Ray already; still a storage error
        return StorageError(f"ingest {stage} failed on {where}: {cause_line(cause)}")
    if cause is not None:
        return StageError(stage, where, cause_line(cause))
    what = type(exc).__name__
    return StageError(stage, where, f"{what}: the Ray task or its worker was lost")


def get(
    refs: Sequence[Any], *, stage: str, where: Callable[[int], str] | Sequence[str]
) -> list[Any]:
    """``ray.get(refs)``; a failed task is one ``StageError`` naming ``stage`` and where the
    failed task ``i`` worked (``where(i)``, or ``where[i]``), or the file its own
    ``StageError`` names."""
    import ray

    try:
        return list(ray.get(list(refs)))
    except ray.exceptions.RayError as exc:
        failed = _failed_index(refs)
        name = "?" if failed < 0 else where(failed) if callable(where) else where[failed]
        raise _one_line(stage, name, exc) from None


def _failed_index(refs: Sequence[Any]) -> int:
    """The first finished task among ``refs`` that failed (-1 if none is known)."""
    import ray

    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
    done = set(ready)
    for i, ref in enumerate(refs):
        if ref not in done:
            continue
        try:
            ray.get(ref)
        except ray.exceptions.RayError:
            return i
    return -1
