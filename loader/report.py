"""Turn a loader's JSON-lines stats log into stall fractions over time (and a PNG)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from .stats import WAIT_KINDS

__all__ = ["StallSeries", "plot_stalls", "read_stats_log", "stall_series", "summarize"]

PLOT_HINT = "flashfeed report needs the optional package matplotlib (pip install matplotlib)"


def read_stats_log(path: str) -> list[dict[str, float]]:
    """The per-batch records of a stats log; a malformed line is a ``ValueError`` naming it."""
    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                float(rec["t"]), float(rec["samples"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{lineno}: not a loader stats record ({exc})") from None
            out.append(rec)
    if not out:
        raise ValueError(f"{path}: no batches recorded")
    return out


@dataclass(frozen=True)
class StallSeries:
    """Per time bin: start (s since the first batch), samples/s, wait fraction per kind."""

    t: np.ndarray
    samples_per_s: np.ndarray
    fractions: dict[str, np.ndarray]


def stall_series(records: list[dict[str, float]], *, bin_s: float = 1.0) -> StallSeries:
    """Bin batches by delivery time; a bin's stall fraction is its summed waits over bin_s
    (over all ranks in the log, divided by their count)."""
    if bin_s <= 0:
        raise ValueError(f"bin_s must be > 0, got {bin_s}")
    t = np.array([r["t"] for r in records], dtype=float)
    t0 = float(t.min() - max(sum(records[0].get(k, 0.0) for k in WAIT_KINDS), 0.0))
    ranks = max(len({r.get("rank", 0) for r in records}), 1)
    bins = np.floor((t - t0) / bin_s).astype(int)
    n = int(bins.max()) + 1
    samples = np.bincount(bins, weights=[r["samples"] for r in records], minlength=n)
    fractions = {
        k: np.minimum(
            np.bincount(bins, weights=[r.get(k, 0.0) for r in records], minlength=n)
            / (bin_s * ranks),
            1.0,
        )
        for k in WAIT_KINDS
    }
    return StallSeries(np.arange(n) * bin_s, samples / bin_s, fractions)


def totals(records: list[dict[str, Any]], elapsed: float) -> dict[str, float]:
    """Batches, samples, the elapsed seconds given and samples/s over them."""
    samples = float(sum(r["samples"] for r in records))
    return {
        "batches": float(len(records)),
        "samples": samples,
        "elapsed_s": elapsed,
        "samples_per_s": samples / elapsed,
    }


def summarize(records: list[dict[str, float]]) -> dict[str, float]:
    """Totals of a log: batches, samples, samples/s and wait fraction per kind."""
    t = [r["t"] for r in records]
    ranks = max(len({r.get("rank", 0) for r in records}), 1)
    first_wait = sum(records[0].get(k, 0.0) for k in WAIT_KINDS)
    elapsed = max(max(t) - min(t) + first_wait, 1e-9)
    out = totals(records, elapsed)
    for k in WAIT_KINDS:
        out[f"{k}_fraction"] = sum(r.get(k, 0.0) for r in records) / (elapsed * ranks)
    return out


def source_totals(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """A mixture's log: per source, samples, their share and the storage wait of the batches
    shared among sources by their samples (lines without ``sources`` add nothing)."""
    out: dict[str, dict[str, float]] = {}
    for r in records:
        per = r.get("sources") or {}
        n = max(float(r.get("samples", 0)), 1.0)
        for name, k in per.items():
            s = out.setdefault(name, {"samples": 0.0, "storage_s": 0.0})
            s["samples"] += float(k)
            s["storage_s"] += float(r.get("storage", 0.0)) * float(k) / n
    total = sum(s["samples"] for s in out.values()) or 1.0
    for s in out.values():
        s["share"] = s["samples"] / total
    return out


def plot_stalls(records: list[dict[str, float]], out: str, *, bin_s: float = 1.0) -> str:
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
