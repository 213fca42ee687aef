"""Proof of a mixture from delivered keys: per source, duplicates, misses and measured share.

A mixture's ``__key__`` is ``<source>:<shard>/<key>``, so a ledger's hashes are attributed
to sources through the keys each source holds. A source read at most once over in an epoch must
show no key twice; one read several times over shows how often its keys were read (each
cycle reads a sample at most once, so no key more often than the cycles begun; with
``drop_last`` each cycle may leave a few out, so counts spread); its share of the delivered
samples is set beside its weight. What a completed cycle left unread (a world size that
does not divide the source) is in the ledger's dropped ids, counted per source. Given
``documents=`` (a token source's rows and their segments), each source also reports which
documents arrived whole, partly or not at all.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .ledger import coverage, epoch_records, key_hash

if TYPE_CHECKING:
    from .doccoverage import DocumentCoverage, TokenDocuments

__all__ = ["SourceCheck", "check_mixture"]


@dataclass(frozen=True)
class SourceCheck:
    """One source in one epoch of a mixture ledger."""

    source: str
    delivered: int
    distinct: int
    keys: int  # samples the source holds
    duplicates: dict[str, int]  # read at most once over: key -> times delivered (> 1)
    missing: int  # keys never delivered
    most: int  # the most times one key was delivered
    fewest: int  # the fewest times one key was delivered (0 if one was missed)
    share: float  # of every sample delivered in the epoch
    weight: float  # the weight it was given (normalised), for comparison
    dropped: int = 0  # samples the ledger names as left unread by a completed cycle
    #: per-document coverage (``documents=`` given for this source), else None
    coverage: DocumentCoverage | None = None

    @property
    def passes(self) -> float:
        """Samples delivered over samples held: how many times over the source was read."""
        return self.delivered / self.keys if self.keys else 0.0

    @property
    def ok(self) -> bool:
        return not self.duplicates

    def __str__(self) -> str:
        dup = ", ".join(f"{k} x{n}" for k, n in list(self.duplicates.items())[:3])
        return (
            f"{self.source}: {self.delivered} delivered ({self.distinct} distinct of "
            f"{self.keys}, {self.missing} never, each {self.fewest}-{self.most} times, "
            f"{self.dropped} dropped), share "
            f"{self.share:.4f} vs weight {self.weight:.4f}"
            + (f"; read twice within one pass: {dup}" if dup else "")
            + (f"; {self.coverage}" if self.coverage is not None else "")
        )


def check_mixture(
    ledger: str | dict[int, list[str]],
    keys: Mapping[str, Iterable[str]],
    weights: Mapping[str, float],
    *,
    epochs: Iterable[int] = (),
    dropped: dict[int, list[int]] | None = None,
    documents: Mapping[str, TokenDocuments] | None = None,
) -> dict[int, dict[str, SourceCheck | int]]:
    """Per epoch and source, a ``SourceCheck``; under ``"unknown"`` the hashes no source
    holds. ``keys``: source -> its keys (``<source>:<shard>/<key>``); ``weights``: source ->
    weight (normalised here). The dropped ids (read from a ledger directory, or given:
    epoch -> ids) are offsets into the keys laid end to end: ``keys`` in the mixture's
    source order, each source's in dataset order. ``documents``: source -> its rows'
    segments (``token_documents(url, prefix="<source>:")``) to report per-document coverage."""
    owner: dict[str, str] = {}
    named: dict[str, str] = {}
    sizes: dict[str, int] = {}
    for name, ks in keys.items():
        n = 0
        for k in ks:
            h = key_hash(k)
            owner[h], named[h] = name, k
            n += 1
        sizes[name] = n
    names = list(keys)
    ends = list(np.cumsum([sizes[n] for n in names])) if names else []
    total_w = sum(weights.values()) or 1.0
    out: dict[int, dict[str, SourceCheck | int]] = {}
    for epoch, hashes, ids in epoch_records(ledger, epochs=epochs, dropped=dropped):
        counts = Counter(hashes)
        gone = Counter(names[bisect.bisect_right(ends, int(i))] for i in ids)
        per: dict[str, Counter[str]] = {name: Counter() for name in keys}
        unknown = 0
        for h, n in counts.items():
            if h in owner:
                per[owner[h]][h] = n
            else:
                unknown += n
        delivered_all = sum(counts.values()) or 1
        checks: dict[str, SourceCheck | int] = {}
        for name, got in per.items():
            delivered = sum(got.values())
            once = delivered <= sizes[name]  # a sample without replacement: no key twice
            missing = sizes[name] - len(got)
            checks[name] = SourceCheck(
                source=name,
                delivered=delivered,
                distinct=len(got),
                keys=sizes[name],
                duplicates={named[h]: n for h, n in got.items() if n > 1} if once else {},
                missing=missing,
                most=max(got.values(), default=0),
                fewest=0 if missing else min(got.values(), default=0),
                share=delivered / delivered_all,
                weight=weights.get(name, 0.0) / total_w,
                dropped=gone[name],
                coverage=coverage(got, (documents or {}).get(name)),
            )
        checks["unknown"] = unknown
        out[epoch] = checks
    return out
