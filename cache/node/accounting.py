"""Per tenant and job: what the node cache holds for it and what it did, in figures that add
up to the node's totals (every resident byte is charged to exactly one owner, see
``ledger.py``), and as Prometheus text with ``tenant`` and ``job`` labels.

The event counters are kept in ``<state>/accounts.json`` (written every few seconds and at
exit): a restart keeps them, a SIGKILL loses the last seconds of them at most. The bytes
resident and pinned are never persisted: they come from the ledger, which comes from disk.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from ..layout import atomic_write_json, read_json
from .ledger import Ledger, Owner

__all__ = ["COUNTERS", "FIGURES", "Accounts", "prometheus_text"]

#: event counters, per (tenant, job)
COUNTERS = (
    "hits",
    "misses",
    "fetched_bytes",
    "evictions_suffered",
    "evictions_caused",
    "fill_wait_seconds",
)
#: every figure of a report row: the two the ledger gives, then the counters
FIGURES = ("resident_bytes", "pinned_bytes", *COUNTERS)

_HELP = {
    "resident_bytes": "Bytes in the node cache charged to the tenant's job",
    "pinned_bytes": "Bytes charged to the job that some job pins",
    "hits": "Shard reads served from the node cache",
    "misses": "Shard reads that waited for a fill from the store",
    "fetched_bytes": "Bytes fetched from the object store for the job",
    "evictions_suffered": "Shards charged to the job that were evicted",
    "evictions_caused": "Shards evicted to make room for the job's fills",
    "fill_wait_seconds": "Seconds the job's reads waited for fills",
}


class Accounts:
    """The counters of every owner; ``report`` joins them to the ledger's figures."""

    def __init__(self, state_dir: str, ledger: Ledger) -> None:
        self.path = os.path.join(state_dir, "accounts.json")
        self.ledger = ledger
        self._lock = threading.Lock()
        self._counts: dict[Owner, dict[str, float]] = {}
        saved = read_json(self.path, [])
        for row in saved if isinstance(saved, list) else []:
            if isinstance(row, dict) and "tenant" in row and "job" in row:
                owner = (str(row["tenant"]), str(row["job"]))
                self._counts[owner] = {c: float(row.get(c, 0)) for c in COUNTERS}
        self._flushed = time.monotonic()

    def add(self, owner: Owner, **values: float) -> None:
        with self._lock:
            row = self._counts.setdefault(owner, dict.fromkeys(COUNTERS, 0.0))
            for name, v in values.items():
                row[name] += v

    def flush(self, *, every: float = 0.0) -> None:
        """Persist the counters (at most every ``every`` seconds)."""
        now = time.monotonic()
        if now - self._flushed < every:
            return
        self._flushed = now
        with self._lock:
            rows = [{"tenant": t, "job": j, **v} for (t, j), v in sorted(self._counts.items())]
        atomic_write_json(self.path, rows)

    def report(self, tenant: str | None = None) -> dict[str, Any]:
        """Rows per (tenant, job) and their totals; ``tenant`` given: its rows only (and its
        totals: never the node's, which would tell it about the others)."""
        held = self.ledger.by_owner()
        with self._lock:
            counts = {o: dict(v) for o, v in self._counts.items()}
        rows = []
        for owner in sorted(set(held) | set(counts)):
            if tenant is not None and owner[0] != tenant:
                continue
            resident, pinned = held.get(owner, (0, 0))
            row: dict[str, Any] = {"tenant": owner[0], "job": owner[1],
                                   "resident_bytes": resident, "pinned_bytes": pinned}  # fmt: skip
            row.update(counts.get(owner, dict.fromkeys(COUNTERS, 0.0)))
            rows.append(row)
        totals = {f: sum(r[f] for r in rows) for f in FIGURES}
        return {"rows": rows, "totals": totals}


def prometheus_text(report: dict[str, Any], *, prefix: str = "flashfeed_node") -> str:
    """Prometheus text exposition of a report's rows (labels ``tenant`` and ``job``)."""
    lines: list[str] = []
    for figure in FIGURES:
        name = f"{prefix}_{figure}"
        kind = "gauge" if figure in ("resident_bytes", "pinned_bytes") else "counter"
        name = name if kind == "gauge" else name + "_total"
        lines.append(f"# HELP {name} {_HELP[figure]}")
        lines.append(f"# TYPE {name} {kind}")
        for r in report["rows"]:
            labels = f'tenant="{_label(r["tenant"])}",job="{_label(r["job"])}"'
            lines.append(f"{name}{{{labels}}} {r[figure]:g}")
    return "\n".join(lines) + "\n"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
