"""Stall accounting: per batch, how long the consumer waited and on what.

Waits are split into storage/cache (shards not local yet), decode (the DALI pipeline not
ready) and host-to-device copy. ``StatsRecorder.summary()`` gives samples/s, wait fractions
and the source's cache hits; ``log=`` appends one JSON line per batch for ``flashfeed report``;
``status_dir=`` (the node cache directory, or the user's runtime directory for a loader
without one) keeps the rank's status file for ``flashfeed top``
(``status.py``); ``exporter=`` feeds the Prometheus metrics (``prometheus.py``).
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from flashfeed.telemetry import WAIT_KINDS, RankState, StatsRecord

from .status import StatusWriter

__all__ = ["STORAGE_WAIT_THRESHOLD", "WAIT_KINDS", "BatchTiming", "StatsRecorder"]

STORAGE_WAIT_THRESHOLD = 0.001
PER_BATCH_KEPT = 10_000
#: how often the status file, exporter and log pick up the cache's counters (seconds)
CACHE_STATS_EVERY_S = 2.0


@dataclass(frozen=True)
class BatchTiming:
    """One delivered batch: when, how many samples, and the consumer's waits in seconds."""

    t: float
    rank: int
    epoch: int
    batch: int
    samples: int
    storage: float
    decode: float
    h2d: float
    step: float
    #: a mixture's batch: samples per source, and the batch's storage wait shared by them
    sources: tuple[tuple[str, int], ...] = ()

    @property
    def wait(self) -> float:
        return self.storage + self.decode + self.h2d

    @property
    def waited_on_storage(self) -> bool:
        """The consumer had to wait for shard bytes before this batch (over 1 ms)."""
        return self.storage > STORAGE_WAIT_THRESHOLD


class StatsRecorder:
    """Collects ``BatchTiming``s; optionally logs them (JSON lines) and exports metrics."""

    def __init__(
        self,
        *,
        rank: int = 0,
        log: str | None = None,
        cache_stats: Callable[[], dict[str, Any]] | None = None,
        exporter: Any = None,
        status_dir: str | None = None,
        node: str | None = None,
        dataset: str = "",
        status_interval: float = 0.5,
    ) -> None:
        self.rank = rank
        self.cache_stats = cache_stats
        self.exporter = exporter
        self.batches = 0
        self.samples = 0
        self.waits = dict.fromkeys(WAIT_KINDS, 0.0)
        self.step_time = 0.0
        self.first_t: float | None = None
        self.last_t: float | None = None
        self.waited_on_storage = 0
        #: (epoch, batch, storage seconds, waited on storage) of the last batches: a tuple per
        #: batch, the dicts of ``per_batch`` made only when read
        self._per_batch: deque[tuple[int, int, float, bool]] = deque(maxlen=PER_BATCH_KEPT)
        #: a mixture's totals per source: samples, and storage wait seconds (``sources``)
        self._source_samples: dict[str, int] = {}
        self._source_storage: dict[str, float] = {}
        self.extra: Callable[[], dict[str, Any]] | None = None
        self._log: IO[str] | None = open(log, "a", encoding="utf-8") if log else None
        self.epoch = 0
        self.batch = -1
        self.epoch_samples = 0
        self._status: StatusWriter | None = None
        self._cache_at = float("-inf")
        self._cache: dict[str, Any] = {}
        self._quiet_until = float("-inf")  # monotonic time before which nothing is due
        if status_dir is not None:
            try:
                self._status = StatusWriter(
                    status_dir, rank=rank, node=node, dataset=dataset, interval=status_interval
                )
            except OSError:  # a status never costs the training (see StatusWriter.write)
                self._status = None

    def record(self, timing: BatchTiming) -> None:
        """Account for one delivered batch."""
        self.add(
            timing.t, timing.rank, timing.epoch, timing.batch, timing.samples, timing.storage,
            timing.decode, timing.h2d, timing.step, timing.sources, timing=timing,
        )  # fmt: skip

    def add(
        self,
        t: float,
        rank: int,
        epoch: int,
        batch: int,
        samples: int,
        storage: float,
        decode: float,
        h2d: float,
        step: float,
        sources: tuple[tuple[str, int], ...] = (),
        *,
        timing: BatchTiming | None = None,
    ) -> None:
        """``record`` from the batch's values: a loader's per-batch call, which builds the
        ``BatchTiming`` only for an exporter or a stats log that reads it."""
        if epoch != self.epoch:
            self.epoch, self.epoch_samples = epoch, 0
        self.batch = batch
        self.epoch_samples += samples
        self.batches += 1
        self.samples += samples
        waits = self.waits
        waits["storage"] += storage
        waits["decode"] += decode
        waits["h2d"] += h2d
        self.step_time += step
        if sources:  # a mixture's batch: a few steps per source, no dict per source
            got = self._source_samples
            for name, n in sources:
                got[name] = got.get(name, 0) + n
            if storage:  # most batches waited on nothing: no sum to add
                wait = self._source_storage
                for name, n in sources:
                    wait[name] = wait.get(name, 0.0) + storage * n / max(samples, 1)
            if self.exporter is not None:
                totals = self.sources
                self.exporter.set_sources(
                    {k: int(v["samples"]) for k, v in totals.items()},
                    {k: v["storage_s"] for k, v in totals.items()},
                )
        waited = storage > STORAGE_WAIT_THRESHOLD  # ``BatchTiming.waited_on_storage``
        self.waited_on_storage += waited
        self._per_batch.append((epoch, batch, storage, waited))
        if self.first_t is None:
            self.first_t = t - (storage + decode + h2d)
        self.last_t = t
        if self.exporter is None and self._log is None:
            if self._status is not None:
                self._publish()
            return
        if timing is None:  # built only here, where an exporter or the stats log reads it
            timing = BatchTiming(t, rank, epoch, batch, samples, storage, decode, h2d, step,
                                 sources)  # fmt: skip
        if self.exporter is not None:
            self.exporter.observe(timing)
        cache = self._publish()
        if self._log is not None:
            self._log.write(json.dumps(self._record(timing, cache).to_json()) + "\n")
            self._log.flush()

    @property
    def per_batch(self) -> list[dict[str, Any]]:
        """The last batches (``PER_BATCH_KEPT`` at most): epoch, batch, storage wait."""
        return [
            {"epoch": e, "batch": b, "storage_s": s, "waited_on_storage": w}
            for e, b, s, w in self._per_batch
        ]

    @property
    def sources(self) -> dict[str, dict[str, float]]:
        """A mixture's totals per source (in the order first seen): ``samples`` and
        ``storage_s``, the storage wait of its batches shared by their samples."""
        wait = self._source_storage
        return {
            k: {"samples": n, "storage_s": wait.get(k, 0.0)}
            for k, n in self._source_samples.items()
        }

    @staticmethod
    def _record(timing: BatchTiming, cache: dict[str, Any] | None) -> StatsRecord:
        """The batch's stats-log line (``flashfeed.telemetry``: the one schema readers use)."""
        # fills so far, for the HTML report: on the lines where the counters were read
        counters = cache if cache is not None and "misses" in cache else None
        return StatsRecord(
            t=timing.t,
            rank=timing.rank,
            epoch=timing.epoch,
            batch=timing.batch,
            samples=timing.samples,
            storage=timing.storage,
            decode=timing.decode,
            h2d=timing.h2d,
            step=timing.step,
            sources=dict(timing.sources),
            waited_on_storage=timing.waited_on_storage,
            cache_fills=None if counters is None else counters["misses"],
            cache_fetched_bytes=None if counters is None else counters.get("bytes_fetched", 0),
        )

    def _publish(self) -> dict[str, Any] | None:
        """Refresh the status file (every ``status_interval`` at most) and, every
        ``CACHE_STATS_EVERY_S`` at most, the cache's counters (its ``stats()`` may scan the
        cache directory: not a per-batch cost); returns the counters when read now."""
        if self._status is None and self.exporter is None and self._log is None:
            return None
        now = time.monotonic()
        if now < self._quiet_until:  # neither the counters nor the status file due: most batches
            return None
        cache = None
        if now - self._cache_at >= CACHE_STATS_EVERY_S:
            self._cache_at = now
            cache = self._cache = self._cache_snapshot()
            if self.exporter is not None and cache:
                self.exporter.set_cache(cache)
        quiet = self._cache_at + CACHE_STATS_EVERY_S
        if self._status is not None:
            self._status.write(lambda: self.status(self._cache))
            quiet = min(quiet, self._status.next_due())
        self._quiet_until = quiet
        return cache

    def _cache_snapshot(self) -> dict[str, Any]:
        if self.cache_stats is None:
            return {}
        try:
            return dict(self.cache_stats())
        except Exception as exc:  # the view must never stop training
            return {"error": str(exc)}

    def status(self, cache: dict[str, Any] | None = None) -> dict[str, Any]:
        """What ``flashfeed top`` shows of this rank: running totals and the position."""
        elapsed = (self.last_t - self.first_t) if self.last_t and self.first_t else 0.0
        return RankState(
            epoch=self.epoch,
            batch=self.batch,
            epoch_samples=self.epoch_samples,
            batches=self.batches,
            samples=self.samples,
            elapsed_s=elapsed,
            wait_s=dict(self.waits),
            batches_waited_on_storage=self.waited_on_storage,
            sources=self.sources,
            cache={
                k: (cache or {}).get(k) for k in ("used_bytes", "capacity") if k in (cache or {})
            },
        ).to_json()

    def source_summary(self) -> dict[str, dict[str, float]]:
        """A mixture's sources: samples, samples/s, share of the samples and storage wait (a
        batch's wait shared among its sources by their samples in it)."""
        elapsed = (self.last_t - self.first_t) if self.last_t and self.first_t else 0.0
        sources = self.sources
        total = sum(v["samples"] for v in sources.values()) or 1
        return {
            name: {
                "samples": int(v["samples"]),
                "samples_per_s": v["samples"] / elapsed if elapsed > 0 else 0.0,
                "share": v["samples"] / total,
                "storage_wait_s": v["storage_s"],
            }
            for name, v in sources.items()
        }

    def summary(self) -> dict[str, Any]:
        elapsed = (self.last_t - self.first_t) if self.last_t and self.first_t else 0.0
        total_wait = sum(self.waits.values())
        out: dict[str, Any] = {
            "batches": self.batches,
            "samples": self.samples,
            "elapsed_s": elapsed,
            "samples_per_s": self.samples / elapsed if elapsed > 0 else 0.0,
            "wait_s": {**self.waits, "total": total_wait},
            "wait_fraction": {
                k: (v / elapsed if elapsed > 0 else 0.0)
                for k, v in {**self.waits, "total": total_wait}.items()
            },
            "step_s": self.step_time,
            "batches_waited_on_storage": self.waited_on_storage,
            "per_batch": self.per_batch,
        }
        if self.extra is not None:
            out.update(self.extra())
        if self.cache_stats is not None:
            out["cache"] = self.cache_stats()
        return out

    def close(self) -> None:
        """Close the log, remove the status file and stop the exporter's HTTP server."""
        if self._status is not None:
            self._status.close()
            self._status = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.exporter is not None:
            self.exporter.close()
            self.exporter = None


def now() -> float:
    return time.perf_counter()
