"""Ledger mode: a hash of every delivered sample key, per rank and epoch, appended to files.

The keys are the batches' ``__key__`` (``<shard path>/<sample key>``), which travel through
the pipeline with their samples, so the ledger records what the consumer received. Tests and
audits read it back (``check_exactly_once``) to prove a run delivered each sample exactly
once, and that an interrupted and resumed run delivered the same samples as an uninterrupted
one.
"""

from __future__ import annotations

import os
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import xxhash

if TYPE_CHECKING:
    from .doccoverage import DocumentCoverage, TokenDocuments

__all__ = [
    "EpochCheck",
    "Ledger",
    "check_exactly_once",
    "coverage",
    "epoch_records",
    "key_hash",
    "read_dropped",
    "read_ledger",
]

_NAME = re.compile(r"^epoch(\d+)-ws(\d+)-rank(\d+)\.log$")
_DROPPED = re.compile(r"^epoch(\d+)-ws(\d+)-rank(\d+)\.dropped$")


def key_hash(key: str) -> str:
    """16 hex digits identifying one sample key."""
    return xxhash.xxh3_64_hexdigest(key.encode("utf-8"))


class Ledger:
    """Appends ``key_hash`` lines to ``<directory>/epoch<E>-ws<W>-rank<R>.log``."""

    def __init__(self, directory: str, *, rank: int, world_size: int) -> None:
        self.directory = directory
        self.rank = rank
        self.world_size = world_size
        os.makedirs(directory, exist_ok=True)

    def path(self, epoch: int) -> str:
        name = f"epoch{epoch:05d}-ws{self.world_size:05d}-rank{self.rank:05d}.log"
        return os.path.join(self.directory, name)

    def record(self, epoch: int, keys: Iterable[str]) -> None:
        lines = "".join(key_hash(k) + "\n" for k in keys)
        with open(self.path(epoch), "a", encoding="ascii") as f:
            f.write(lines)

    def record_dropped(self, epoch: int, ids: Iterable[int]) -> None:
        """Samples (global ids) this rank's share of ``epoch`` drops, never delivered."""
        lines = "".join(f"{int(i)}\n" for i in ids)
        with open(self.path(epoch)[: -len(".log")] + ".dropped", "a", encoding="ascii") as f:
            f.write(lines)


def _lines(directory: str, name: re.Pattern[str]) -> dict[int, list[str]]:
    """The lines of every file matching ``name`` per epoch, all ranks and world sizes."""
    out: dict[int, list[str]] = defaultdict(list)
    for entry in sorted(os.listdir(directory)):
        m = name.match(entry)
        if m:
            with open(os.path.join(directory, entry), encoding="ascii") as f:
                out[int(m.group(1))].extend(line.strip() for line in f if line.strip())
    return dict(out)


def read_ledger(directory: str) -> dict[int, list[str]]:
    """Every recorded hash per epoch, all ranks and world sizes together."""
    return _lines(directory, _NAME)


def read_dropped(directory: str) -> dict[int, list[int]]:
    """The sample ids recorded as dropped per epoch, all ranks and world sizes together."""
    return {e: [int(x) for x in ids] for e, ids in _lines(directory, _DROPPED).items()}


@dataclass(frozen=True)
class EpochCheck:
    """One epoch of a ledger against the keys it should hold exactly once."""

    epoch: int
    delivered: int
    duplicates: dict[str, int]  # key -> times delivered (> 1)
    missing: list[str]  # expected keys never delivered
    unknown: int  # delivered hashes that are no expected key
    dropped: int = 0  # keys recorded as dropped (drop_last), each counted as accounted for
    #: per-document coverage of a token dataset (``documents=`` given), else None
    coverage: DocumentCoverage | None = None

    @property
    def ok(self) -> bool:
        return not self.duplicates and not self.missing and not self.unknown

    def __str__(self) -> str:
        if self.ok:
            return f"epoch {self.epoch}: {self.delivered} samples, each exactly once" + (
                f" ({self.dropped} dropped)" if self.dropped else ""
            )
        dup = ", ".join(f"{k} x{n}" for k, n in list(self.duplicates.items())[:5])
        return (
            f"epoch {self.epoch}: {self.delivered} delivered; {len(self.duplicates)} repeated "
            f"({dup}); {len(self.missing)} missing ({', '.join(self.missing[:5])}); "
            f"{self.unknown} not in the dataset"
        )


def check_exactly_once(
    ledger: str | dict[int, list[str]],
    keys: Iterable[str],
    *,
    epochs: Iterable[int] = (),
    dropped: dict[int, list[int]] | None = None,
    documents: TokenDocuments | None = None,
) -> dict[int, EpochCheck]:
    """Per epoch, which of ``keys`` (``<shard path>/<sample key>``) a ledger holds more than
    once or not at all, and what it holds that is no key. ``ledger`` is a ledger directory
    or ``read_ledger``'s result; ``epochs`` are checked even when the ledger has none of
    them.

    Samples recorded as dropped (``drop_last``; read from a ledger directory, or given as
    ``dropped``: epoch -> sample ids) count as accounted for, once: a key dropped and also
    delivered is a duplicate. Dropped samples are global ids, so ``keys`` must then be in
    dataset order (shard by shard, sample by sample).
    """
    ordered = list(keys)
    by_hash = {key_hash(k): k for k in ordered}
    out = {}
    for epoch, hashes, ids in epoch_records(ledger, epochs=epochs, dropped=dropped):
        gone = [key_hash(ordered[i]) for i in ids]
        counts = Counter(hashes) + Counter(gone)
        out[epoch] = EpochCheck(
            epoch=epoch,
            delivered=len(hashes),
            duplicates={by_hash.get(h, h): n for h, n in counts.items() if n > 1},
            missing=sorted(k for h, k in by_hash.items() if h not in counts),
            unknown=sum(n for h, n in counts.items() if h not in by_hash),
            dropped=len(gone),
            coverage=coverage(hashes, documents),
        )
    return out


def epoch_records(
    ledger: str | dict[int, list[str]],
    *,
    epochs: Iterable[int] = (),
    dropped: dict[int, list[int]] | None = None,
) -> Iterator[tuple[int, list[str], list[int]]]:
    """``(epoch, hashes delivered, ids dropped)`` of every epoch a ledger (a directory or
    ``read_ledger``'s result) or ``dropped`` names, and of ``epochs``, in order; the dropped
    ids are read from a ledger directory unless given."""
    recorded = read_ledger(ledger) if isinstance(ledger, str) else ledger
    if dropped is None:
        dropped = read_dropped(ledger) if isinstance(ledger, str) else {}
    for epoch in sorted(set(recorded) | set(epochs) | set(dropped)):
        yield epoch, recorded.get(epoch, []), dropped.get(epoch, [])


def coverage(hashes: Iterable[str], documents: TokenDocuments | None) -> DocumentCoverage | None:
    """Per-document coverage of delivered ``hashes`` (``documents`` given), else None."""
    if documents is None:
        return None
    from .doccoverage import document_coverage

    return document_coverage(hashes, documents)
