"""A ``TokenLoader`` batch's rows copied by one compiled pass (``rowkernel.py``) that
locates each row in its open shards and copies it straight to its place in the batch, at
the stored or a wider type: no Python step per row, and no second pass to widen.

The ``np.concatenate`` of one row view per row it replaces paid Python per row (a view made
and listed); this pass takes about 0.6 of its CPU time over an epoch's batches, on one
dataset as on a 3-source mixture. Reading a batch's rows in address order (sorted by shard
and row) instead of batch order was measured too and kept out: it cost 11% more in the
pass and the same through the loader (``docs/MIXTURES.md``).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .tokenrows import RowTable

__all__ = ["RowAddresses", "copy_rows", "gather_rows", "kernel_ready"]


class RowAddresses:
    """Where the rows of one column lie in every record batch of a ``RowTable``'s shards (in
    its ``firsts`` order): address, row stride in bytes and rows of each, as the kernel
    reads them. ``ok`` is False when some record batch's rows are not 2-D with contiguous
    items (the kernel reads a row as ``length`` items one after the other)."""

    def __init__(
        self, firsts: np.ndarray, numbers: np.ndarray, views: Mapping[int, Sequence[np.ndarray]]
    ) -> None:
        info: list[tuple[int, int, int]] = []
        keep: list[np.ndarray] = []  # what the addresses point into
        like: np.ndarray | None = None
        self.ok = True
        for s, c in zip((firsts >> 32).tolist(), numbers.tolist(), strict=True):
            chunks = views[s]
            arr = chunks[c] if c < len(chunks) else None
            if arr is None or arr.size == 0:
                info.append((0, 0, 0))  # a record batch not landed yet: no rows
                continue
            if arr.ndim != 2 or arr.strides[1] != arr.itemsize:
                self.ok = False
                break
            if like is None:
                like = np.empty((0, arr.shape[1]), arr.dtype)
            elif arr.dtype != like.dtype or arr.shape[1] != like.shape[1]:
                self.ok = False
                break
            info.append((arr.ctypes.data, arr.strides[0], len(arr)))
            keep.append(arr)
        self.ok = self.ok and like is not None
        self.like = like if like is not None else np.empty((0, 0), np.uint8)
        self.firsts = np.ascontiguousarray(firsts, np.int64)
        self.info = np.asarray(info, np.int64).reshape(-1, 3)
        self._keep = keep


def gather_rows(
    table: RowTable,
    column: str,
    shards: np.ndarray,
    rows: np.ndarray,
    out: np.ndarray,
    *,
    wait: bool = False,
) -> bool:
    """Rows ``rows`` of shards ``shards`` of ``column`` written into ``out`` (a C-contiguous
    ``(B, length)`` buffer of any integer type) in batch order by the compiled pass;
    False (nothing written) where the kernel cannot read the rows (``RowAddresses.ok``)
    or, unless ``wait``, is still being loaded for these types (``kernel_ready``)."""
    where = table.addresses(column)
    if not where.ok or out.ndim != 2 or where.like.shape[1] != out.shape[1]:
        return False
    if not out.flags.c_contiguous or not kernel_ready(where.like.dtype, out.dtype, wait=wait):
        return False
    from .docrows import streams
    from .rowkernel import gather_jit

    shards = np.ascontiguousarray(shards, np.int64)
    rows = np.ascontiguousarray(rows, np.int64)
    at, held = gather_jit(where.like, shards, rows, where.firsts, where.info, out,
                          streams(out.nbytes))  # fmt: skip
    if at >= 0:
        raise IndexError(
            f"column {column!r}: row {int(rows[at])} of shard number {int(shards[at])} is "
            f"not within its record batch of {held} rows"
        )
    return True


def copy_rows(
    table: RowTable, column: str, shards: np.ndarray, rows: np.ndarray, out: np.ndarray
) -> None:
    """Rows ``rows`` of shards ``shards`` of ``column`` copied into ``out`` (their stored
    type) in batch order: one ``np.concatenate`` of row views, for rows the kernel does not
    read (1-D columns, rows whose items are not contiguous)."""
    arrays = table.columns[column]  # shard -> its record batches' views of ``column``
    sl = shards.tolist()
    if table.several:  # some shard holds several record batches: (shard, record batch, row)
        chunks, inner = table.locate(shards, rows)
        at = zip(sl, chunks.tolist(), inner.tolist(), strict=True)
    else:
        at = zip(sl, itertools.repeat(0), rows.tolist())  # one record batch a shard
    np.concatenate([arrays[s][c][i : i + 1] for s, c, i in at], out=out)


class _Warmup:
    """numba imported and the kernel compiled (or loaded from its disk cache) for rows of
    ``stored`` written as ``out``, in a daemon thread; ``error``: what it raised."""

    def __init__(self, stored: np.dtype, out: np.dtype) -> None:
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(
            target=self._run, args=(stored, out), name="flashfeed-rowwarm", daemon=True
        )
        self.thread.start()

    def _run(self, stored: np.dtype, out: np.dtype) -> None:
        try:
            from .rowkernel import gather_jit

            rows = np.arange(8, dtype=stored).reshape(2, 4)
            info = np.array([[rows.ctypes.data, rows.strides[0], 2]], np.int64)
            got = np.empty((2, 4), out)
            zero = np.zeros(2, np.int64)
            gather_jit(rows[:0].copy(), zero, np.arange(2), zero[:1], info, got, False)
            if not np.array_equal(got, rows):
                raise RuntimeError(f"the row gather's warm-up copied {got.tolist()}")
        except BaseException as e:  # kept for the batch that asks next (raised there)
            self.error = e
        finally:
            self.done.set()


#: the warm-ups started in this process, by (stored type, batch type): one per pair
_WARM: dict[tuple[str, str], _Warmup] = {}
_LOCK = threading.Lock()


def kernel_ready(stored: np.dtype, out: np.dtype, *, wait: bool = False) -> bool:
    """Whether the kernel for rows of ``stored`` written as ``out`` is ready; the first ask
    starts loading it in a daemon thread (numba's import alone takes about 0.4 s), so a
    loader's first batches are copied by ``copy_rows`` meanwhile instead of waiting.
    ``wait``: until it is. Raises what loading it raised."""
    key = (stored.str, out.str)
    with _LOCK:
        got = _WARM.get(key)
        if got is None:
            got = _WARM[key] = _Warmup(stored, out)
    if wait:
        got.thread.join()
    if got.error is not None:
        raise got.error
    return got.done.is_set()
