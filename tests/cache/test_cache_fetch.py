"""Fetch strategies seen only through ``fetch(start, end)``: ranged parts, retries, AIMD
under throttling; and the eviction policy (Belady with the plan's order vs LRU)."""

from __future__ import annotations

import errno
import math
import os
import threading
import time

import numpy as np
import pytest

from flashfeed import storage
from flashfeed.cache.fetch.aimd import AdaptiveLimit
from flashfeed.cache.fetch.fill import OrderedHasher
from flashfeed.cache.fetch.ranged import RangedFetcher, is_retryable, is_throttle, split_ranges
from flashfeed.cache.policy import (
    Candidate,
    FutureOrder,
    belady_hits,
    eviction_order,
    lru_hits,
)
from flashfeed.cache.progress import FillProgress, FillView, live_path
from flashfeed.plan.plan import PlanOptions, Topology, node_shard_order
from flashfeed.storage import RetryPolicy

FAST = RetryPolicy(attempts=8, base_delay=0.001, max_delay=0.01, deadline=10)


class SlowDown(OSError):
    """What s3fs raises for a 503 answer."""

    def __init__(self) -> None:
        super().__init__("SlowDown: Please reduce your request rate. (503)")


class Store:
    """An object behind a ``fetch`` function that throttles while too many are in flight."""

    def __init__(self, data: bytes, *, max_in_flight: int) -> None:
        self.data = data
        self.max_in_flight = max_in_flight
        self.in_flight = 0
        self.peak = 0
        self.lock = threading.Lock()

    def fetch(self, start: int, end: int) -> bytes:
        with self.lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            busy = self.in_flight > self.max_in_flight
        try:
            time.sleep(0.002)  # a request takes time, so requests overlap
            if busy:
                raise SlowDown()
            return self.data[start:end]
        finally:
            with self.lock:
                self.in_flight -= 1


def fetch_all(fetcher: RangedFetcher, fetch, size: int) -> tuple[bytes, object]:
    out = bytearray(size)

    def write(offset: int, data: bytes) -> None:
        out[offset : offset + len(data)] = data

    report = fetcher.fetch_into(fetch, size, write)
    return bytes(out), report


def test_split_ranges_cover_the_object_exactly():
    assert split_ranges(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert split_ranges(0, 4) == []
    assert split_ranges(8, 8) == [(0, 8)]
    with pytest.raises(ValueError, match="part_size"):
        split_ranges(8, 0)


def test_errors_are_told_apart():
    assert is_throttle(SlowDown()) and is_retryable(SlowDown())
    assert is_retryable(ConnectionResetError("reset"))
    assert is_retryable(OSError(121, "We encountered an internal error, please try again."))
    assert is_retryable(OSError(errno.EREMOTEIO, "Internal Server Error"))
    assert is_throttle(OSError(errno.EBUSY, "Please reduce your request rate."))
    assert not is_retryable(FileNotFoundError("gone"))
    assert not is_retryable(PermissionError("AccessDenied"))


def test_parts_arrive_in_place_with_bounded_concurrency():
    data = np.random.default_rng(0).bytes(1_000_003)
    store = Store(data, max_in_flight=100)
    limit = AdaptiveLimit(4)
    with RangedFetcher(part_size=10_000, limit=limit, retry=FAST) as fetcher:
        got, report = fetch_all(fetcher, store.fetch, len(data))
    assert got == data
    assert report.requests == 101 and report.throttles == 0
    assert store.peak <= 4


def test_throttling_halves_the_concurrency_and_successes_bring_it_back():
    data = np.random.default_rng(1).bytes(400_000)
    store = Store(data, max_in_flight=2)
    limit = AdaptiveLimit(8, cooldown=0.0)
    # a part may meet SlowDown many times while the limit climbs back (cooldown 0) on a
    # loaded machine: a generous attempt budget keeps the test about the limit, not luck
    patient = RetryPolicy(attempts=200, base_delay=0.001, max_delay=0.01, deadline=60)
    with RangedFetcher(part_size=5_000, limit=limit, retry=patient) as fetcher:
        got, report = fetch_all(fetcher, store.fetch, len(data))
        assert got == data
        assert report.throttles > 0 and report.retries >= report.throttles
        assert limit.throttle_events == report.throttles
        assert limit.lowest <= 2  # came down to what the store accepts
        # the store recovers: additive increase climbs back to the maximum
        store.max_in_flight = 100
        got, report = fetch_all(fetcher, store.fetch, len(data))
    assert got == data and report.throttles == 0
    assert limit.limit == 8


def test_permanent_errors_are_not_retried_and_transient_ones_give_up():
    limit = AdaptiveLimit(2)
    calls = []

    def missing(start: int, end: int) -> bytes:
        calls.append(start)
        raise FileNotFoundError("no such key")

    with RangedFetcher(part_size=10, limit=limit, retry=FAST) as fetcher:
        with pytest.raises(FileNotFoundError):
            fetch_all(fetcher, missing, 5)
        assert calls == [0]

        def reset(start: int, end: int) -> bytes:
            calls.append(start)
            raise ConnectionResetError("Connection reset by peer")

        calls.clear()
        with pytest.raises(ConnectionResetError):
            fetch_all(fetcher, reset, 5)
        assert len(calls) == FAST.attempts

        def short(start: int, end: int) -> bytes:
            return b"x" * (end - start - 1)

        with pytest.raises(ConnectionError, match="asked for"):
            fetch_all(fetcher, short, 5)
    assert limit.in_flight == 0


def test_adaptive_limit_validates_and_never_goes_below_minimum():
    with pytest.raises(ValueError):
        AdaptiveLimit(0)
    limit = AdaptiveLimit(8, minimum=2, cooldown=0.0)
    for _ in range(10):
        limit.acquire()
        limit.release(throttled=True)
    assert limit.limit == 2 and limit.lowest == 2 and limit.throttle_events == 10


def test_future_order_next_use_and_advance():
    f = FutureOrder([3, 1, 2, 3, 1, 0], active=1)
    assert f.next_use(3) == 1 and f.next_use(2) == 3 and f.next_use(9) == math.inf
    f.advance(3)
    assert f.position == 1
    assert f.next_use(3) == 0  # just read: still being read
    f.advance(3)  # a repeated read of the shard being consumed does not jump ahead
    assert f.position == 1
    f.advance(1)
    f.advance(2)
    assert f.next_use(3) == 1 and f.next_use(0) == 3
    assert f.upcoming(2) == [3, 1]
    f.advance(3)
    f.advance(1)
    f.advance(0)
    assert f.next_use(2) == math.inf


def test_eviction_order_is_furthest_next_use_then_least_recent():
    cands = [
        Candidate("a", 1, last_used=5.0, next_use=3),
        Candidate("b", 1, last_used=1.0, next_use=math.inf),
        Candidate("c", 1, last_used=0.0, next_use=3),
        Candidate("d", 1, last_used=9.0, next_use=math.inf),
    ]
    assert [c.key for c in eviction_order(cands)] == ["b", "d", "c", "a"]


def test_with_the_plans_order_belady_beats_lru_over_epochs():
    order = node_shard_order(
        [100] * 40, options=PlanOptions(), epochs=range(3), topology=Topology()
    )
    for fraction in (0.5, 0.75):
        cap = int(40 * fraction)
        assert belady_hits(order, cap) >= 1.5 * max(1, lru_hits(order, cap))
    assert belady_hits(order, 40) == lru_hits(order, 40) == 80  # all fit: only cold misses


def test_parts_hashed_in_transit_in_any_arrival_order():
    data = np.random.default_rng(2).bytes(100_000)
    parts = split_ranges(len(data), 7_000)
    for seed in range(3):
        read_back: list[tuple[int, int]] = []

        def from_file(lo: int, hi: int, read_back: list = read_back) -> list[bytes]:
            read_back.append((lo, hi))
            return [data[lo:hi]]

        hasher = OrderedHasher(from_file)
        order = np.random.default_rng(seed).permutation(parts).tolist()
        in_transit = 0
        for lo, hi in order:
            for at in range(lo, hi, 2_000):  # the chunks of a part, as they are written
                in_transit += hasher.add(at, data[at : min(at + 2_000, hi)]) * min(2_000, hi - at)
            hasher.landed(lo, hi)
        assert hasher.checksum(len(data)) == storage.checksum(data)
        # only what overtook a slower part was read back, each byte once
        assert in_transit + sum(hi - lo for lo, hi in read_back) == len(data)
        assert in_transit >= order[0][1] - order[0][0] or order[0][0] != 0
    in_order = OrderedHasher(lambda lo, hi: pytest.fail("nothing to read back"))
    for lo, hi in parts:
        in_order.add(lo, data[lo:hi])
        in_order.landed(lo, hi)
    assert in_order.checksum(len(data)) == storage.checksum(data)
    partial = OrderedHasher(lambda lo, hi: [data[lo:hi]])
    partial.add(7_000, data[7_000:14_000])
    partial.landed(7_000, 14_000)
    with pytest.raises(RuntimeError, match="missing"):
        partial.checksum(len(data))


def test_progress_marks_are_seen_by_a_reader_as_they_are_set(tmp_path):
    path = live_path(str(tmp_path), 3)
    writer = FillProgress(path, part="p", index_part="i", size=10_000, block=1000)
    reader = FillView.open(path)
    assert reader is not None and reader.size == 10_000 and reader.part == "p"
    assert not reader.index_ready() and not reader.done(0, 1)
    writer.index_ready()
    writer.written(0, 2500)  # blocks 0 and 1 whole, block 2 only in part
    assert reader.index_ready()
    assert reader.done(0, 2000) and not reader.done(1999, 2001) and not reader.complete()
    writer.written(2000, 10_000)
    assert reader.complete() and not reader.ended()
    writer.close()
    assert reader.ended() and FillView.open(path) is None
    reader.close()


def test_a_reader_in_the_fills_process_is_woken_by_its_next_mark(tmp_path):
    path = live_path(str(tmp_path), 4)
    writer = FillProgress(path, part="p", index_part=None, size=4000, block=1000)
    reader = FillView.open(path)
    assert reader is not None
    since = reader.marks()
    assert since is not None  # the fill runs here: its marks can be waited on
    woken = threading.Event()

    def wait() -> None:
        reader.wait_marked(since, 600.0)  # no mark: it would sleep ten minutes
        woken.set()

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    writer.written(0, 1000)
    waiter.join(60)
    assert woken.is_set() and reader.done(0, 1000)
    assert reader.marks() != since
    reader.wait_marked(since, 600.0)  # a mark already set since: no wait at all
    writer.close()
    assert reader.marks() is None and reader.ended()  # ended: readers poll (or stop)
    reader.close()


def test_a_forked_child_polls_its_parents_fill_and_never_waits_on_its_lock(tmp_path):
    path = live_path(str(tmp_path), 5)
    writer = FillProgress(path, part="p", index_part=None, size=2000, block=1000)
    reader = FillView.open(path)
    assert reader is not None and reader.marks() is not None
    pid = os.fork()
    if pid == 0:  # the child: the parent's fill is not its own, so it is polled
        ok = reader.marks() is None
        reader.wait_marked(reader.marks(), 0.001)
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    writer.written(0, 2000)
    assert reader.complete() and reader.marks() is not None  # still woken here
    writer.close()
    reader.close()
