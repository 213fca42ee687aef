"""The document kernel (``docrows.py``) compiled, or loaded from numba's disk cache, in a
daemon thread started when a ``TokenLoader`` with document outputs is built, so its first
batch waits only for what is left of that work instead of all of it.

numba's compiler holds the GIL for most of its work, so the thread competes with the
constructing thread for it; what is hidden is the time until the first batch is asked for.
The thread is a daemon (it ends with the process); an error in it is kept and raised by the
first batch that waits for it, the error the kernels raise when called without it.
"""

from __future__ import annotations

import re
import threading

import numpy as np

__all__ = ["Warmup", "stored_dtype", "warm_documents", "warm_loader"]


class Warmup:
    """One kernel warm-up under way in a daemon thread; ``wait()`` for its end."""

    def __init__(self, rows: np.dtype, tokens: np.dtype | None) -> None:
        self.rows, self.tokens = rows, tokens
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="flashfeed-docwarm", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            _warm(self.rows, self.tokens)
        except BaseException as e:  # kept for the first batch (its own error, raised there)
            self.error = e
        finally:
            self.done.set()

    def wait(self) -> None:
        """Block until the warm-up has ended; raise its error, if any."""
        self.thread.join()
        if self.error is not None:
            raise self.error


#: the warm-ups started in this process, by (stored type, widened type): one per pair
_STARTED: dict[tuple[str, str | None], Warmup] = {}
_LOCK = threading.Lock()


def warm_documents(rows: np.dtype, tokens: np.dtype | None) -> Warmup:
    """The warm-up of the kernels for rows stored as ``rows`` widened into ``tokens`` (None:
    not widened), started now unless this process has started it already."""
    key = (rows.str, None if tokens is None else tokens.str)
    with _LOCK:
        got = _STARTED.get(key)
        if got is None or got.error is not None:  # a failed one is tried again
            got = _STARTED[key] = Warmup(rows, tokens)
        return got


def warm_loader(schema: dict[str, str], dtype: str | None) -> Warmup:
    """The warm-up for a ``TokenLoader`` of ``dtype`` over a dataset of manifest ``schema``:
    rows of the stored token type it names (uint16 when it does not: what flashfeed writes
    for vocabularies under 65,536), widened when ``dtype`` differs from it."""
    stored = stored_dtype(schema.get("tokens")) or np.dtype(np.uint16)
    wide = np.dtype(dtype) if dtype is not None and np.dtype(dtype) != stored else None
    return warm_documents(stored, wide)


def _warm(rows: np.dtype, tokens: np.dtype | None) -> None:
    """Import numba and run the kernel once on two rows of the loader's types (the same
    call a batch makes, so the same compiled signature)."""
    from .docrows import warm_rows

    warm_rows(rows, rows if tokens is None else tokens)


_ITEM = re.compile(r"^(?:fixed_size_)?list<(?:[^:<>]*:\s*)?(\w+)")


def stored_dtype(schema_type: str | None) -> np.dtype | None:
    """The numpy type of a token column's items from its manifest schema entry
    (``fixed_size_list<item: uint16>[2048]``), None when it does not say."""
    m = _ITEM.match(schema_type or "")
    if m is None:
        return None
    try:
        return np.dtype(m.group(1))
    except TypeError:
        return None
