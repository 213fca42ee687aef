"""The one binning of batches into time steps, for both renderers (the PNG of
``flashfeed report LOG --out`` and the charts of the HTML run report).

Time starts when the first batch of the run began (its delivery time less its waits). A
bin's samples/s is its batches' samples over the bin's seconds; its wait fraction per cause
is the seconds waited by the batches delivered in it over the bin's seconds (of all the
ranks binned together: divided by their count), at most 1; its fills are the cache fills
the rank's process started in it (from the log's ``cache_fills`` counters).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np

from flashfeed.telemetry import WAIT_KINDS, StatsRecord

from .runlog import as_records

__all__ = ["Bins", "StallSeries", "bin_records", "choose_bins", "run_start", "stall_series"]

#: the HTML page's default: about this many points per chart, and never more than the cap
DEFAULT_POINTS = 80
MAX_POINTS_PER_CHART = 2000


@dataclass(frozen=True)
class Bins:
    """``n`` time steps of ``bin_s`` seconds from ``t0`` (``time.time()`` seconds)."""

    t0: float
    bin_s: float
    n: int

    @property
    def starts(self) -> np.ndarray:
        """Each bin's start, in seconds since ``t0``."""
        return np.arange(self.n) * self.bin_s


@dataclass(frozen=True)
class StallSeries:
    """Per time bin: start (s since the run began), samples/s, wait fraction per kind, and
    cache fills started."""

    t: np.ndarray
    samples_per_s: np.ndarray
    fractions: dict[str, np.ndarray]
    fills: np.ndarray


def run_start(ranks: Iterable[Sequence[StatsRecord]]) -> float:
    """When the earliest first batch of these ranks began (its time less its waits)."""
    return min(min(recs, key=lambda r: r.t).start for recs in ranks if recs)


def _by_rank(records: Sequence[StatsRecord]) -> list[list[StatsRecord]]:
    out: dict[int, list[StatsRecord]] = {}
    for r in records:
        out.setdefault(r.rank, []).append(r)
    return list(out.values())


def choose_bins(
    t0: float, t1: float, bin_s: float | None = None, *, max_points: int | None = None
) -> Bins:
    """Bins from ``t0`` through ``t1``: ``bin_s`` seconds each (None: about
    ``DEFAULT_POINTS`` of them), widened so that there are fewer than ``max_points``."""
    span = max(t1 - t0, 1e-6)
    if bin_s is None:
        bin_s = max(span / DEFAULT_POINTS, 0.01)
    if not bin_s > 0:
        raise ValueError(f"--bin must be > 0 seconds, got {bin_s}")
    if max_points is not None and span / bin_s >= max_points:  # a readable chart
        bin_s = span / (max_points - 1)
    return Bins(t0, bin_s, int(span // bin_s) + 1)


def bin_records(records: Sequence[StatsRecord], bins: Bins, *, ranks: int = 1) -> StallSeries:
    """Bin ``records`` (of ``ranks`` ranks; fills are meant for one rank's records in time
    order) by delivery time."""
    n, bin_s = bins.n, bins.bin_s
    t = np.array([r.t for r in records], dtype=float)
    idx = np.clip(np.floor((t - bins.t0) / bin_s).astype(int), 0, n - 1)
    samples = np.bincount(idx, weights=[float(r.samples) for r in records], minlength=n)
    fractions = {
        k: np.minimum(
            np.bincount(idx, weights=list(map(attrgetter(k), records)), minlength=n)
            / (bin_s * max(ranks, 1)),
            1.0,
        )
        for k in WAIT_KINDS
    }
    fills = np.zeros(n)
    last = 0  # a process's cache counters start at 0
    for i, r in zip(idx, records, strict=True):
        if r.cache_fills is not None:
            # counters going down: a new process appending to the same log
            fills[i] += r.cache_fills - last if r.cache_fills >= last else r.cache_fills
            last = r.cache_fills
    return StallSeries(bins.starts, samples / bin_s, fractions, fills)


def stall_series(
    records: Sequence[StatsRecord | Mapping[str, Any]], *, bin_s: float = 1.0
) -> StallSeries:
    """A log's batches (of any number of ranks) binned every ``bin_s`` seconds; a bin's
    stall fraction is its summed waits over ``bin_s``, divided by the ranks' count."""
    recs = as_records(records)
    per_rank = _by_rank(recs)
    t0 = run_start(per_rank)
    bins = choose_bins(t0, max(r.t for r in recs), bin_s)
    return bin_records(recs, bins, ranks=len(per_rank))
