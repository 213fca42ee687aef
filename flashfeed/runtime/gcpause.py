"""The cyclic garbage collector paused over a block that builds many small acyclic objects
(a corpus's items, a shard's documents): in a process that holds Ray, each full collection
walks every object Ray imported, and the scan of 10,000 JSON lines set off enough of them
to cost more CPU than the parse itself."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gc_paused"]

_LOCK = threading.Lock()
#: blocks open now, and whether the collector was on before the first of them
_STATE = {"depth": 0, "was_enabled": True}


@contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic collection inside the block (nested and threaded blocks included); the
    collector is on again after the last open block ends, if it was on before the first."""
    with _LOCK:
        if _STATE["depth"] == 0:
            _STATE["was_enabled"] = gc.isenabled()
            gc.disable()
        _STATE["depth"] += 1
    try:
        yield
    finally:
        with _LOCK:
            _STATE["depth"] -= 1
            if _STATE["depth"] == 0 and _STATE["was_enabled"]:
                gc.enable()
