"""Parallel ranged reads of objects, each seen only through ``fetch(start, end) -> bytes``.

The parts of every object in flight wait in one ``PartQueue`` and are fetched in need order
(``needorder.py``), gated by an ``AdaptiveLimit``: a throttling answer shrinks the number of
requests in flight, successes grow it back. Each part retries transient failures with
exponential backoff and full jitter.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sized
from dataclasses import dataclass
from typing import TypeVar

from flashfeed.s3.retry import RetryPolicy, is_throttle, is_transient

from .aimd import AdaptiveLimit
from .needorder import SPECULATIVE, PartQueue

__all__ = ["FetchReport", "RangedFetcher", "is_retryable", "is_throttle", "split_ranges"]

#: what a part's fetch returns: its bytes, or a stand-in for bytes already landed
Data = TypeVar("Data", bound=Sized)


def is_retryable(exc: BaseException) -> bool:
    """Whether a part's fetch is worth another attempt: the storage layer's one
    classification (``flashfeed.s3.retry.is_transient``: throttling, resets, 5xx answers, never
    missing objects or refused credentials)."""
    return is_transient(exc)


def split_ranges(size: int, part_size: int) -> list[tuple[int, int]]:
    """``[start, end)`` ranges of at most ``part_size`` bytes covering ``size`` bytes."""
    if part_size <= 0:
        raise ValueError(f"part_size must be > 0, got {part_size}")
    return [(s, min(s + part_size, size)) for s in range(0, size, part_size)]


class ShortReadError(ConnectionError):
    """A range came back shorter than asked: retried like a dropped connection."""


@dataclass
class FetchReport:
    """What one object's fetch cost: requests, retries, throttling answers, seconds."""

    requests: int = 0
    retries: int = 0
    throttles: int = 0
    seconds: float = 0.0
    failed: bool = False


class RangedFetcher:
    """Fetch objects part by part, in need order, with adaptive concurrency shared by all
    callers (``limit.maximum`` fetch threads; ``close`` stops them)."""

    def __init__(self, *, part_size: int, limit: AdaptiveLimit, retry: RetryPolicy) -> None:
        self.part_size = part_size
        self.limit = limit
        self.retry = retry
        self.queue = PartQueue(limit, workers=limit.maximum)
        self._report_lock = threading.Lock()

    def close(self) -> None:
        self.queue.close()

    def __enter__(self) -> RangedFetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(
        self,
        fn: Callable[[], Data],
        report: FetchReport,
        expect: int = -1,
        gated: bool = True,
        held: bool = False,
    ) -> Data:
        """One request, retried with backoff and jitter while retryable.

        ``gated`` requests count against the adaptive limit (``held``: the caller already
        holds a slot for the first attempt); small side requests (an index next to its
        shard) skip the queue but still report throttling to it.
        """
        attempt = 0
        first = time.monotonic()
        while True:
            if gated and not held:
                self.limit.acquire()
            held = False
            try:
                data = fn()
                if expect >= 0 and len(data) != expect:
                    raise ShortReadError(f"asked for {expect} bytes, got {len(data)}")
            except Exception as exc:
                throttled = is_throttle(exc)
                if gated:
                    self.limit.release(throttled=throttled)
                elif throttled:
                    self.limit.record_throttle()
                attempt += 1
                with self._report_lock:
                    report.requests += 1
                    report.throttles += throttled
                elapsed = time.monotonic() - first
                if (
                    is_retryable(exc)
                    and attempt < self.retry.attempts
                    and elapsed < self.retry.deadline
                    and not report.failed
                ):
                    with self._report_lock:
                        report.retries += 1
                    time.sleep(self.retry.delay(attempt))
                    continue
                raise
            if gated:
                self.limit.release()
            with self._report_lock:
                report.requests += 1
            return data

    def fetch_into(
        self,
        fetch: Callable[[int, int], Data],
        size: int,
        write: Callable[[int, Data], None],
        *,
        meanwhile: Callable[[FetchReport], None] | None = None,
        before: Callable[[FetchReport], None] | None = None,
        priority: Callable[[int], float] | None = None,
    ) -> FetchReport:
        """Read ``[0, size)`` with ``fetch`` and hand each part to ``write(offset, data)``.

        ``priority(offset)`` ranks the part at ``offset`` among the parts of every object
        in flight (lower first; asked again each time a thread picks a part, so it may
        change while the part waits). ``meanwhile(report)`` runs in the calling thread
        while the parts download (the shard's index, say); ``before(report)`` runs first,
        before any part is queued (an index that sets the parts' priorities). Raises the
        first part's final error (after its retries), the other parts stop; then any
        error of ``meanwhile``.
        """
        report = FetchReport()
        start = time.monotonic()
        if before is not None:
            before(report)
        rank = priority or (lambda offset: SPECULATIVE)
        ranges = split_ranges(size, self.part_size)
        errors: list[BaseException] = []
        left = [len(ranges)]
        done = threading.Event()
        lock = threading.Lock()

        def part(lo: int, hi: int, held: bool) -> None:
            try:
                if report.failed:
                    if held:
                        self.limit.cancel()
                    return
                try:
                    data = self.call(lambda: fetch(lo, hi), report, expect=hi - lo, held=held)
                    write(lo, data)
                except BaseException as exc:
                    report.failed = True
                    with lock:
                        errors.append(exc)
            finally:
                with lock:
                    left[0] -= 1
                    if left[0] == 0:
                        done.set()

        side_error: BaseException | None = None
        if len(ranges) <= 1 and meanwhile is None:
            for lo, hi in ranges:
                part(lo, hi, False)
        else:
            if not ranges:
                done.set()
            for n, (lo, hi) in enumerate(ranges):
                self.queue.submit(
                    functools.partial(rank, lo), functools.partial(part, lo, hi), position=n
                )
            if meanwhile is not None:
                try:
                    meanwhile(report)
                except BaseException as exc:
                    side_error = exc
            done.wait()
        if errors:
            raise errors[0]
        if side_error is not None:
            raise side_error
        report.seconds = time.monotonic() - start
        return report
