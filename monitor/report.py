"""``flashfeed report``'s figures: a log's totals and stall fractions, a mixture's sources,
and the PNG of its stalls over time (the records come from ``runlog``, the time bins from
``binning``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import Any

from flashfeed.telemetry import WAIT_KINDS, StatsRecord

from .binning import stall_series
from .runlog import as_records, read_stats_log

__all__ = [
    "plot_stalls",
    "rank_summary",
    "read_stats_log",
    "source_totals",
    "summarize",
    "totals",
]

PLOT_HINT = "flashfeed report needs the optional package matplotlib (pip install matplotlib)"

Records = Sequence[StatsRecord | Mapping[str, Any]]


def totals(records: Sequence[StatsRecord], elapsed: float) -> dict[str, float]:
    """Batches, samples, the elapsed seconds given and samples/s over them."""
    samples = float(sum(r.samples for r in records))
    return {
        "batches": float(len(records)),
        "samples": samples,
        "elapsed_s": elapsed,
        "samples_per_s": samples / elapsed,
    }


def _elapsed(records: Sequence[StatsRecord]) -> float:
    """From the first batch's start to the last delivery."""
    first = min(records, key=lambda r: r.t)
    return max(max(r.t for r in records) - first.start, 1e-9)


def summarize(records: Records) -> dict[str, float]:
    """Totals of a log: batches, samples, samples/s and wait fraction per kind (of all the
    ranks in it: divided by their count)."""
    recs = as_records(records)
    ranks = max(len({r.rank for r in recs}), 1)
    elapsed = _elapsed(recs)
    out = totals(recs, elapsed)
    for k in WAIT_KINDS:
        out[f"{k}_fraction"] = sum(map(attrgetter(k), recs)) / (elapsed * ranks)
    return out


def rank_summary(records: Records) -> dict[str, float]:
    """One rank: samples, elapsed seconds, samples/s, wait seconds per kind, lost fraction."""
    recs = as_records(records)
    elapsed = _elapsed(recs)
    out = totals(recs, elapsed)
    for k in WAIT_KINDS:
        out[f"{k}_s"] = float(sum(map(attrgetter(k), recs)))
    out["lost_s"] = sum(out[f"{k}_s"] for k in WAIT_KINDS)
    out["lost_fraction"] = min(out["lost_s"] / elapsed, 1.0)
    return out


def source_totals(records: Records) -> dict[str, dict[str, float]]:
    """A mixture's log: per source, samples, their share and the storage wait of the batches
    shared among sources by their samples (lines without ``sources`` add nothing)."""
    out: dict[str, dict[str, float]] = {}
    for r in as_records(records):
        n = max(float(r.samples), 1.0)
        for name, k in r.sources.items():
            s = out.setdefault(name, {"samples": 0.0, "storage_s": 0.0})
            s["samples"] += float(k)
            s["storage_s"] += r.storage * float(k) / n
    total = sum(s["samples"] for s in out.values()) or 1.0
    for s in out.values():
        s["share"] = s["samples"] / total
    return out


def plot_stalls(records: Records, out: str, *, bin_s: float = 1.0) -> str:
    """Write a PNG: stacked wait fractions by kind over time, samples/s on a second axis."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(PLOT_HINT) from None
    s = stall_series(records, bin_s=bin_s)
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.stackplot(s.t, *[s.fractions[k] for k in WAIT_KINDS], labels=list(WAIT_KINDS), step="post")
    ax.set_ylim(0, 1)
    ax.set_xlabel("seconds")
    ax.set_ylabel("fraction of time the consumer waited")
    ax.legend(loc="upper left")
    rate = ax.twinx()
    rate.plot(s.t, s.samples_per_s, color="black", linewidth=1)
    rate.set_ylabel("samples/s")
    ax.set_title("flashfeed loader stalls")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
