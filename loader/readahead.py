"""Plan-driven read-ahead and serving samples from shards that are still arriving.

``StreamFeeder`` walks one pass in plan order. For the batches the pipeline will ask for
next it starts the fills of their shards and waits only until *those samples'* bytes have
arrived (the cache publishes each part of a fill as it lands, ``ShardSource.partial``),
not for whole shards: the first batch does not wait for its shard (a tar sample's bytes by
its ``.idx``, an Arrow row's record batch by the layout its schema records or, without one,
once the walk of its messages has found it, ``flashfeed.format.ipcwalk``). It tells the source
which batch first needs each sample of a shard (``ShardSource.need``), so the node cache
fetches the parts of all shards in flight in that order. Beyond that it asks the
cache to fetch the shards of the next N batches, N covering the measured fetch time at the
measured batch rate (twice over), never more bytes ahead than ``budget``.
"""

from __future__ import annotations

import math
import os
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from itertools import accumulate
from typing import TYPE_CHECKING, Any

import numpy as np

from flashfeed.units import parse_size

from .passorder import PassOrder
from .sources import ShardSource, reads_in_place
from .tokens.arrowstream import rows_landed

if TYPE_CHECKING:
    from flashfeed.cache import PartialShard

__all__ = ["StreamFeeder", "readahead_budget_bytes"]

_MARGIN = 2.0  # fetch ahead for twice the time a fill takes
_PRIOR_SHARDS = 4  # read-ahead before anything is measured
_HOLD_SECONDS = 3.0  # the longest a first batch keeps the rest of the download waiting
_HOLD_TRICKLE = 0  # GETs of that rest that may run meanwhile (1 measured: see hold_ahead)
_START_WAIT = 0.25  # the longest a loader waits for its first GETs before building


class StreamFeeder:
    """Keeps the samples of batches ``[k, k + lookahead]`` readable; read-ahead beyond.

    ``readahead``: ``None`` sizes it from measurements, an int fixes it in shards; either
    way the shards fetched ahead of need never hold more than ``budget`` bytes.
    """

    def __init__(
        self,
        source: ShardSource,
        pass_order: PassOrder,
        *,
        shard_bytes: Sequence[int],
        shard_samples: Sequence[int],
        lookahead: int,
        readahead: int | None,
        budget: int,
        workers: int = 4,
    ) -> None:
        if budget < 0:
            raise ValueError(f"budget must be >= 0 bytes, got {budget}")
        self.source = source
        self.pass_order = pass_order
        self.lookahead = lookahead
        self.fixed = readahead
        self.budget = budget
        self.order, self.first_batch = pass_order.shard_order()
        self.bytes = [int(b) for b in shard_bytes]
        #: bytes of ``order[:i]``: the bytes ahead are one difference, not a sum per batch
        self._order_bytes = [0, *accumulate(self.bytes[s] for s in self.order)]
        per_sample = np.asarray(shard_bytes, np.float64) / np.maximum(shard_samples, 1)
        self._cum = np.concatenate([[0.0], np.cumsum(per_sample[pass_order.shards])])
        self.pid = os.getpid()  # its threads run in this process only
        self.streaming = not reads_in_place(source)  # read in place: no fills
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="ff-need")
        self._by_shard: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._told: set[int] = set()
        self._needed: dict[int, Future[str]] = {}
        self._ready: set[int] = set()  # shards whose fill completed: no more waiting on them
        self._ready_upto = 0  # shards order[:_ready_upto] are all in ``_ready``
        self._asked: dict[int, float] = {}
        self._partials: dict[int, PartialShard] = {}
        self._pos = 0  # shards order[:_pos] are needed (their fills started)
        self._hinted = 0  # shards order[_pos:_hinted] are fetched ahead of need
        self._next_batch = 0
        self._k = 0
        self._seen: deque[tuple[float, float, int]] = deque(maxlen=16)
        self._fill_times: deque[float] = deque(maxlen=16)
        self._cache_at = -1e9
        self._cache_latency: float | None = None
        self._fill_median: tuple[int, float | None] = (-1, None)  # (fills seen, their median)
        self._fills = 0
        self.streamed_batches = 0
        self.max_ahead_bytes = 0
        self.target_batches: int | None = None
        self._holding = False
        if self.order:
            source.set_future(self.order)

    # -- the consumer's side ----------------------------------------------------------------
    def ask(self, k: int) -> int:
        """Start fetching the shards of batches up to ``k + lookahead`` without waiting
        (a loader builds its pipeline meanwhile); the last batch asked for."""
        limit = min(k + self.lookahead, self.pass_order.num_batches - 1)
        start = self._pos
        while self._pos < len(self.order) and self.first_batch[self._pos] <= limit:
            self._pos += 1
        self._need(self.order[start : self._pos])
        self._hinted = max(self._hinted, self._pos)
        return limit

    def hold_ahead(
        self, k: int = 0, *, seconds: float = _HOLD_SECONDS, trickle: int | None = None
    ) -> bool:
        """Until ``release_ahead`` (at most ``seconds``), the source runs at most
        ``trickle`` GETs at a time (None: ``_HOLD_TRICKLE``, none) for bytes that batches
        up to ``k + lookahead + 1`` do not need: a cold first batch gets the requests
        and the CPU that the rest of its window's download would take, and the batches
        asked for right after it find their bytes. A trickle keeps the download from
        standing idle while the first batch is made, at the cost of that batch (measured
        on 2 busy cores: BENCHMARKS.md). True if the source holds (a node cache does; a
        dataset read in place fetches nothing)."""
        hold = getattr(self.source, "hold_fetches", None)
        if hold is None or not self.streaming or not self.pass_order.num_batches:
            return False
        # the first run reads batches k..k + lookahead; the wait right after it asks for
        # batch k + lookahead + 1 too: its bytes are not held either (held, batch k + 1
        # waited for parts asked for only at the release)
        last = min(k + self.lookahead + 1, self.pass_order.num_batches - 1)
        hold(last, seconds=seconds, trickle=_HOLD_TRICKLE if trickle is None else trickle)
        self._holding = True
        return True

    def wait_started(self, k: int = 0, *, timeout: float = _START_WAIT) -> float:
        """Until the first bytes of each of batch ``k``'s shards have landed (at most
        ``timeout`` seconds); the seconds waited. A loader waits here before it builds its
        pipeline: the build keeps the fetch threads from running (on 2 busy cores their
        first ranged GETs went out only as it ended), so the first GETs go out before it."""
        if not self.streaming:
            return 0.0
        sl = self.pass_order.batch_slice(k)
        shards = np.unique(self.pass_order.shards[sl]).tolist()
        t0 = time.perf_counter()
        delay = 0.0005
        waited = False
        while time.perf_counter() - t0 < timeout:
            waiting = False
            for shard in shards:
                future = self._needed.get(shard)
                if future is None or future.done() or self._present(shard):
                    continue  # nothing to wait for: a complete copy is not a fill to start
                got = self._partial(shard)
                if got is None or not got.progress.started():
                    waiting = True
            if not waiting:
                break
            waited = True
            time.sleep(delay)
            delay = min(delay * 2, 0.005)
        return time.perf_counter() - t0 if waited else 0.0

    def release_ahead(self) -> None:
        """End ``hold_ahead``: the rest of the download goes on."""
        if self._holding:
            self._holding = False
            self.source.release_fetches()  # type: ignore[attr-defined]

    def shards_asked(self) -> int:
        """Shards whose fills this feeder has started (needed or fetched ahead)."""
        return len(self._needed)

    def wait_ready(self, k: int) -> float:
        """Make the samples of batches up to ``k + lookahead`` readable.

        Returns the seconds spent blocked on bytes that had not arrived: looking up,
        verifying or opening shards already on local storage is not a storage wait."""
        self._k = k
        limit = self.ask(k)
        blocked = 0.0
        while self._next_batch <= limit:
            blocked += self._wait_batch(self._next_batch)
            self._next_batch += 1
        now = time.perf_counter()
        self._seen.append((now, float(self._cum[self.pass_order.batch_slice(k).start]), k))
        self._hint()
        return blocked

    def _tell_need(self, shard: int) -> None:
        """Tell the source which rows of ``shard`` which batches need (once per pass), so
        that its fetches put the bytes needed sooner first, across shards."""
        if not self.streaming or shard in self._told:
            return
        self._told.add(shard)
        if self._by_shard is None:
            pos = np.argsort(self.pass_order.shards, kind="stable")
            self._by_shard = (
                pos,
                self.pass_order.shards[pos],
                np.asarray(self.pass_order.rows)[pos],
            )
        pos, shards, rows = self._by_shard
        lo, hi = np.searchsorted(shards, [shard, shard + 1])
        if hi > lo:
            batches = self.pass_order.batch_of(pos[lo:hi])
            self.source.need(shard, rows[lo:hi], batches)

    def _need(self, shards: Sequence[int]) -> None:
        """Start the fills of these shards (their needs told first), side by side in the
        pool. Read in place, a shard's first use checks it instead: the first one here (a
        lone shard starts no thread), the rest side by side (reading and hashing let go of
        the interpreter lock: 4 x 100 MiB in 0.050 s on 2 cores, not 0.096 s)."""
        new = [s for s in dict.fromkeys(shards) if s not in self._needed]
        for shard in new:
            self._tell_need(shard)
        self._asked.update(dict.fromkeys(new, time.perf_counter()))
        here = [] if self.streaming else new[:1]
        for shard in new[len(here) :]:
            self._needed[shard] = self._pool.submit(self.source.local_path, shard)
        for shard in here:
            self._needed[shard] = _done(self.source.local_path, shard)

    def _wait_batch(self, j: int) -> float:
        """Until batch ``j``'s samples are readable; the seconds blocked on their bytes."""
        # the common case, once shards are local: batch j reads only shards first needed by
        # batches up to j (``order`` is in order of first need), and those are all ready
        if bisect_right(self.first_batch, j) <= self._ready_upto:
            return 0.0
        sl = self.pass_order.batch_slice(j)
        shards, rows = self.pass_order.shards[sl], self.pass_order.rows[sl]
        streamed = False
        blocked = 0.0
        if self._ready.issuperset(shards.tolist()):  # some earlier shard it skips is not
            return 0.0
        for shard in np.unique(shards).tolist():
            if shard in self._ready:
                continue
            early, waited = self._wait_rows(shard, rows[shards == shard].tolist())
            streamed |= early
            blocked += waited
        self.streamed_batches += streamed
        return blocked

    def _mark_ready(self, shard: int) -> None:
        """The shard's fill completed; ``_ready_upto`` moves past the ready prefix of
        ``order`` (each shard passed once a pass: amortised O(1) per batch)."""
        self._ready.add(shard)
        order, ready, i = self.order, self._ready, self._ready_upto
        while i < len(order) and order[i] in ready:
            i += 1
        self._ready_upto = i

    def _present(self, shard: int) -> bool:
        """The shard's bytes are all on local storage (a complete cached copy)."""
        ready = getattr(self.source, "ready_path", None)
        return ready is not None and ready(shard) is not None

    def _wait_rows(self, shard: int, rows: list[int]) -> tuple[bool, float]:
        """Until the shard is cached or these rows have arrived: (served early, seconds
        blocked on bytes). Waiting for a shard already complete locally (its lookup or
        first checksum) is not blocking on bytes; a local dataset read in place counts its
        first read (the checksum pass over the file) as storage."""
        future = self._needed[shard]
        if future.done() or (self.streaming and self._present(shard)):
            future.result()  # a failed fill raises here, naming the shard
            self._done(shard)
            self._mark_ready(shard)
            return False, 0.0
        t0 = time.perf_counter()
        early = self._stream_rows(shard, rows, future)
        if not early:
            future.result()
            self._done(shard)
            self._mark_ready(shard)
        return early, time.perf_counter() - t0

    def _stream_rows(self, shard: int, rows: list[int], future: Future[str]) -> bool:
        """Watch the live fill until these rows have arrived (True) or the fill ended: woken
        by each mark a fill of this process sets, else polled."""
        delay = 0.0005
        while self.streaming and not future.done():
            got = self._partial(shard)
            since = None
            if got is not None:
                since = got.progress.marks()  # before the look: no mark set after it is missed
                index, view, layout = got.index, got.progress, got.located()
                if layout is not None:  # an Arrow shard: recorded, or walked as it lands
                    if rows_landed(layout, view, rows):
                        return True
                elif all(r < len(index) for r in rows) and all(
                    view.done(index[r].start, index[r].end) for r in rows
                ):
                    return True
                if view.ended():
                    view.close()
                    self._partials.pop(shard, None)
                    got = None
            if got is None:  # no live fill (yet, or any more): until the future is done
                wait((future,), timeout=delay)
            else:
                got.progress.wait_marked(since, delay)
            delay = min(delay * 2, 0.01 if since is not None else 0.001)
        return False

    def _partial(self, shard: int) -> PartialShard | None:
        got = self._partials.get(shard)
        if got is None:
            got = self.source.partial(shard)
            if got is None:
                return None
            self._partials[shard] = got
        return got

    def _done(self, shard: int) -> None:
        asked = self._asked.pop(shard, None)
        if asked is not None:
            self._fill_times.append(time.perf_counter() - asked)
            self._fills += 1
        got = self._partials.pop(shard, None)
        if got is not None:
            got.progress.close()

    # -- read-ahead sizing ------------------------------------------------------------------
    def consume_rate(self) -> float | None:
        """Bytes of samples the consumer takes per second, over the last few batches."""
        if len(self._seen) < 2:
            return None
        (t0, b0, _), (t1, b1, _) = self._seen[0], self._seen[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 and b1 > b0 else None

    def fetch_latency(self) -> float | None:
        """Seconds one shard takes to fetch: the cache's fills of this process, else the
        time from asking for a needed shard to having it."""
        now = time.perf_counter()
        if now - self._cache_at > 0.5:
            self._cache_at = now
            stats = self.source.stats()
            misses, seconds = stats.get("misses", 0), stats.get("fetch_seconds", 0.0)
            self._cache_latency = seconds / misses if misses and seconds else None
        if self._cache_latency is not None:
            return self._cache_latency
        if self._fill_median[0] != self._fills:  # a median per new fill, not per batch
            slow = [t for t in self._fill_times if t > 0.001]
            self._fill_median = (self._fills, float(np.median(slow)) if slow else None)
        return self._fill_median[1]

    def horizon(self) -> int | None:
        """Batches to fetch ahead: the measured fetch time of a shard, twice over, at the
        measured batch rate. None until both are measured."""
        latency = self.fetch_latency()
        if latency is None or len(self._seen) < 2:
            return None
        (t0, _, k0), (t1, _, k1) = self._seen[0], self._seen[-1]
        if t1 <= t0 or k1 <= k0:
            return None
        return math.ceil(latency * _MARGIN * (k1 - k0) / (t1 - t0))

    def _hint(self) -> None:
        horizon = None if self.fixed is not None else self.horizon()
        self.target_batches = horizon
        until = self._k + self.lookahead + (horizon or 0)
        ahead = self._order_bytes[self._hinted] - self._order_bytes[self._pos]
        start = self._hinted
        while self._hinted < len(self.order):
            size = self.bytes[self.order[self._hinted]]
            if ahead + size > self.budget:
                break
            count = self._hinted - self._pos
            if self.fixed is not None:
                if count >= self.fixed:
                    break
            elif horizon is None:
                if count >= _PRIOR_SHARDS:
                    break
            elif self.first_batch[self._hinted] > until and count > 0:
                break
            ahead += size
            self._hinted += 1
        if self._hinted > start:
            for shard in self.order[start : self._hinted]:
                self._tell_need(shard)
            self.source.fetch_ahead(self.order[start : self._hinted])
        self.max_ahead_bytes = max(self.max_ahead_bytes, ahead)

    def snapshot(self) -> dict[str, Any]:
        """What the read-ahead does now: shards, bytes and batches ahead, and why."""
        k = self._k
        ahead = self.order[self._pos : self._hinted]
        last = self.first_batch[self._hinted - 1] if ahead else k
        return {
            "shards_ahead": len(ahead),
            "bytes_ahead": self._order_bytes[self._hinted] - self._order_bytes[self._pos],
            "batches_ahead": max(0, last - k),
            "target_batches": self.target_batches,
            "budget_bytes": self.budget,
            "max_bytes_ahead": self.max_ahead_bytes,
            "consume_bytes_per_s": self.consume_rate(),
            "fetch_latency_s": self.fetch_latency(),
            "batches_served_while_arriving": self.streamed_batches,
        }

    def finish(self) -> None:
        """At the end of a pass: wait until the fills of its shards have landed, verified.
        Samples served while a shard arrived are checked here, with the whole shard
        (a checksum mismatch raises, naming it)."""
        for shard, future in self._needed.items():
            future.result()
            self._done(shard)

    def close(self) -> None:
        self.release_ahead()
        for got in self._partials.values():
            got.progress.close()
        self._partials.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _done(fn: Any, *args: Any) -> Future[str]:
    """``fn(*args)`` run here, as a finished future (its error kept for ``result()``)."""
    future: Future[str] = Future()
    try:
        future.set_result(fn(*args))
    except Exception as exc:
        future.set_exception(exc)
    return future


def readahead_budget_bytes(budget: int | str | None, source: ShardSource) -> int:
    """The read-ahead budget in bytes: as given (``"2GiB"`` works), else half the node
    cache's capacity up to 4 GiB (1 GiB without a cache)."""
    if budget is None:
        capacity = getattr(source, "capacity", None)
        return min(int(capacity) // 2, 4 << 30) if capacity else 1 << 30
    if isinstance(budget, bool) or not isinstance(budget, int | str):
        raise ValueError(f"readahead_budget must be a byte count or size string, got {budget!r}")
    value = parse_size(budget, name="readahead_budget")
    if value < 0:
        raise ValueError(f"readahead_budget must be >= 0, got {budget!r}")
    return value
