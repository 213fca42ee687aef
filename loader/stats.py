"""Stall accounting: per batch, how long the consumer waited and on what.

Waits are split into storage/cache (shards not local yet), decode (the DALI pipeline not
ready) and host-to-device copy. ``StatsRecorder.summary()`` gives samples/s, wait fractions
and the source's cache hits; ``log=`` appends one JSON line per batch for ``flashfeed report``.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import IO, Any

__all__ = ["STORAGE_WAIT_THRESHOLD", "WAIT_KINDS", "BatchTiming", "StatsRecorder"]

WAIT_KINDS = ("storage", "decode", "h2d")
STORAGE_WAIT_THRESHOLD = 0.001
PER_BATCH_KEPT = 10_000


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
        self.per_batch: deque[dict[str, Any]] = deque(maxlen=PER_BATCH_KEPT)
        self.extra: Callable[[], dict[str, Any]] | None = None
        self._log: IO[str] | None = open(log, "a", encoding="utf-8") if log else None

    def record(self, timing: BatchTiming) -> None:
        self.batches += 1
        self.samples += timing.samples
        for kind in WAIT_KINDS:
            self.waits[kind] += getattr(timing, kind)
        self.step_time += timing.step
        waited = timing.waited_on_storage
        self.waited_on_storage += waited
        self.per_batch.append(
            {"epoch": timing.epoch, "batch": timing.batch, "storage_s": timing.storage,
             "waited_on_storage": waited}
        )  # fmt: skip
        if self.first_t is None:
            self.first_t = timing.t - timing.wait
        self.last_t = timing.t
        if self._log is not None:
            line = {**asdict(timing), "waited_on_storage": timing.waited_on_storage}
            self._log.write(json.dumps(line) + "\n")
            self._log.flush()
        if self.exporter is not None:
            self.exporter.observe(timing)

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
            "per_batch": list(self.per_batch),
        }
        if self.extra is not None:
            out.update(self.extra())
        if self.cache_stats is not None:
            out["cache"] = self.cache_stats()
        return out

    def close(self) -> None:
        """Close the log and stop the exporter's HTTP server."""
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.exporter is not None:
            self.exporter.close()
            self.exporter = None


def now() -> float:
    return time.perf_counter()
