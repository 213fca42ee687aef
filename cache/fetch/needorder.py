"""Need order: one priority order over the parts of every shard this process is fetching.

The loader knows which batch first needs each sample (``ShardCache.need``). A fill turns
that into a priority per part of its shard (lower = needed sooner): the first batch that
needs a sample overlapping the part; parts holding no needed sample get the last batch that
needs the shard. Until the shard's index has arrived every part has the shard's first need.
``PartQueue`` runs the parts of all fills in flight in that order, each request still
holding a slot of the ``AdaptiveLimit``. Ties go to the part nearer its object's start,
then to submission order: fills of equal need advance side by side, front first, so
fewer parts arrive ahead of a slower one of the same shard, and more of each shard's
checksum is computed as its bytes arrive instead of read back later.

``PartQueue.hold`` keeps parts needed later than a given batch waiting for a while (a cold
first batch: the bytes it needs get every request and the CPU its decode shares with the
download, instead of the rest of the window's 400 MB), all of them or all but a
``trickle`` of them at a time, so that the download does not stand idle meanwhile.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from flashfeed.format.wdsindex import SampleIndex

from .aimd import AdaptiveLimit

__all__ = ["PartPriority", "PartQueue", "ShardNeed", "part_priorities"]

URGENT = -1.0  # a blocking ``get`` without a known need: someone waits for it now
SPECULATIVE = math.inf  # fetched ahead without a known need: after everything needed


@dataclass(frozen=True)
class ShardNeed:
    """Which rows of one shard this process reads, and the batch that first needs each."""

    rows: np.ndarray
    batches: np.ndarray

    @classmethod
    def build(
        cls, rows: Sequence[int] | np.ndarray, batches: Sequence[int] | np.ndarray
    ) -> ShardNeed:
        r = np.asarray(rows, dtype=np.int64).ravel()
        b = np.asarray(batches, dtype=np.int64).ravel()
        if len(r) != len(b):
            raise ValueError(f"rows ({len(r)}) and batches ({len(b)}) must be as long")
        if len(r) == 0:
            raise ValueError("a need names at least one row; give none for a shard not needed")
        if r.min() < 0 or b.min() < 0:
            raise ValueError("rows and batches must be >= 0")
        return cls(r, b)

    @property
    def first(self) -> int:
        return int(self.batches.min())

    @property
    def last(self) -> int:
        return int(self.batches.max())


def part_priorities(
    index: Sequence[SampleIndex], need: ShardNeed, *, size: int, part_size: int
) -> np.ndarray:
    """Per part of a ``size``-byte shard: the first batch needing a sample that overlaps it,
    else the last batch that needs the shard. Rows beyond the index are ignored."""
    parts = -(-size // part_size)
    out = np.full(parts, float(need.last))
    for row, batch in zip(need.rows.tolist(), need.batches.tolist(), strict=True):
        if row >= len(index):
            continue
        sample = index[row]
        start, end = sample.start, sample.end
        if end <= start:
            continue
        lo, hi = start // part_size, min((end - 1) // part_size, parts - 1)
        if lo <= hi and out[lo : hi + 1].max() > batch:
            np.minimum(out[lo : hi + 1], batch, out=out[lo : hi + 1])
    return out


class PartPriority:
    """The priority of each part of one fill, refined once the shard's index is known."""

    def __init__(self, need: ShardNeed | None, *, default: float) -> None:
        self.need = need
        self.default = float(need.first) if need is not None else default
        self._parts: np.ndarray | None = None
        self._part_size = 1

    def learn_index(self, index: Sequence[SampleIndex], *, size: int, part_size: int) -> None:
        if self.need is not None:
            self._parts = part_priorities(index, self.need, size=size, part_size=part_size)
            self._part_size = part_size

    def __call__(self, offset: int) -> float:
        parts = self._parts
        if parts is None:
            return self.default
        i = offset // self._part_size
        return float(parts[i]) if 0 <= i < len(parts) else self.default


Run = Callable[[bool], None]  # called with True: the caller holds one slot of the limit


@dataclass
class _Item:
    seq: int
    position: int
    priority: Callable[[], float]
    run: Run

    def key(self) -> tuple[float, int, int]:
        try:
            return (float(self.priority()), self.position, self.seq)
        except Exception:  # a broken priority must not stop the fetch threads
            return (SPECULATIVE, self.position, self.seq)


class PartQueue:
    """Parts waiting to be fetched, worked by ``workers`` threads in priority order.

    A thread first takes a slot of ``limit`` and only then picks the most urgent part, so
    a part that arrives while the limit is full still goes first once a slot frees.
    """

    def __init__(self, limit: AdaptiveLimit, *, workers: int, name: str = "ff-cache-part") -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.limit = limit
        self.workers = workers
        self.name = name
        self._items: list[_Item] = []
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._hold = math.inf  # parts ranked above this wait ...
        self._hold_until = 0.0  # ... until this time.monotonic() at the latest
        self._trickle = 0  # ... but this many of them may run at once
        self._trickling = 0  # parts ranked above the hold running now

    def submit(self, priority: Callable[[], float], run: Run, *, position: int = 0) -> None:
        """Queue ``run``; ``position``: the part's place in its object (0 = first)."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the cache is closed: open a new ShardCache to fetch")
            self._items.append(_Item(next(self._seq), position, priority, run))
            if len(self._threads) < self.workers:
                t = threading.Thread(
                    target=self._work, name=f"{self.name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(t)
                t.start()
            self._cond.notify()

    def pending(self) -> int:
        with self._cond:
            return len(self._items)

    def hold(self, beyond: float, *, seconds: float, trickle: int = 0) -> None:
        """For up to ``seconds`` (or until ``release``), run at most ``trickle`` parts
        ranked above ``beyond`` at a time (0: start none); parts already running go on. A
        part ranked at or below it starts as before, and first: the trickle takes only a
        slot that no such part waits for."""
        if seconds < 0:
            raise ValueError(f"seconds must be >= 0, got {seconds}")
        if isinstance(trickle, bool) or not isinstance(trickle, int) or trickle < 0:
            raise ValueError(f"trickle must be an integer >= 0, got {trickle!r}")
        with self._cond:
            self._hold = float(beyond)
            self._hold_until = time.monotonic() + seconds
            self._trickle = trickle
            self._cond.notify_all()

    def release(self) -> None:
        """End a ``hold``: every waiting part may start again."""
        with self._cond:
            self._hold = math.inf
            self._cond.notify_all()

    def _held(self) -> float:
        """The rank above which parts wait now (infinity: none wait; a closing queue runs
        what is queued). The caller holds ``_cond``."""
        if self._hold != math.inf and (self._closed or time.monotonic() >= self._hold_until):
            self._hold = math.inf
        return self._hold

    def _startable(self, rank: float) -> bool:
        """A part of ``rank`` may start now: not held, or within the hold's trickle. The
        caller holds ``_cond``."""
        return rank <= self._held() or self._trickling < self._trickle

    def _pick(self) -> tuple[_Item, bool] | None:
        """The most urgent part allowed to start now, taken off the queue, and whether it
        runs as the hold's trickle."""
        keyed = [(item.key(), item) for item in self._items]
        if not keyed:
            return None
        key, best = min(keyed, key=lambda pair: pair[0])
        if not self._startable(key[0]):
            return None
        self._items.remove(best)
        trickle = key[0] > self._held()
        self._trickling += trickle
        return best, trickle

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (
                    not self._items or not self._startable(min(i.key()[0] for i in self._items))
                ):
                    # held parts: look again soon (a part's rank changes once its shard's
                    # index arrives, and the hold ends by itself)
                    self._cond.wait(0.02 if self._items else None)
                if not self._items:
                    return
            self.limit.acquire()
            with self._cond:
                picked = self._pick()
                if picked is None:
                    self.limit.cancel()
                    continue
            best, trickle = picked
            try:
                best.run(True)
            finally:
                if trickle:
                    with self._cond:
                        self._trickling -= 1
                        self._cond.notify_all()

    def close(self) -> None:
        """Run what is queued, then stop the threads."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            threads = list(self._threads)
        for t in threads:
            if t is not threading.current_thread():
                t.join()
