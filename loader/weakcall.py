"""A bound method held without holding its object.

A loader's parts (its stats recorder, its DALI runner) keep callbacks into the loader; a
bound method would make a cycle, and a cycle keeps a dropped loader, with its shards' memory
maps, until a full garbage collection runs."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["weakly"]

R = TypeVar("R")


def weakly(method: Callable[..., R], *, gone: Callable[[], R] | None = None) -> Callable[..., R]:
    """``method`` called through a weak reference to its object; once the object is gone,
    ``gone()`` (or ``ReferenceError``)."""
    ref = weakref.WeakMethod(method)  # type: ignore[arg-type]
    name = getattr(method, "__qualname__", repr(method))

    def call(*args: Any, **kwargs: Any) -> R:
        got = ref()
        if got is not None:
            return got(*args, **kwargs)
        if gone is not None:
            return gone()
        raise ReferenceError(f"{name}: its object is gone")

    return call
