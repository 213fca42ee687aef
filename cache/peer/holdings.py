"""A node's holdings as versions: full announcements and the deltas between them.

A server keeps its holdings (``HoldingsLog``): per dataset key, the shard count and the
complete shards. Each change of them is a new version; the log keeps the shards added and
removed at each recent version, bounded (``max_versions`` versions, ``max_changes`` shard
numbers in all). A peer that knows version V of this node (``instance.V``: ``instance`` is
new at each start of the server) asks ``/v1/have?since=instance.V`` and gets only what
changed since (``delta``), or the full announcement (``full``) when V is older than the
log, from another instance, or when the delta would be the larger by over 1 KiB. ``apply`` is the
reader's side: the holdings a body describes, from the ones it knew, each a compact
``ShardSet`` (``shardset.py``).
"""

from __future__ import annotations

import base64
import json
import os
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .announce import encode_held
from .shardset import ShardSet

__all__ = ["Held", "HoldingsLog", "apply", "since_param"]

#: a delta may exceed the full announcement by this much and still be sent: on a small
#: dataset its fixed fields outweigh the bitmap, and a delta keeps the reader's version
_SLACK = 1024


@dataclass(frozen=True)
class Held:
    """What a peer announced of one dataset: its complete shards and its fills running."""

    complete: ShardSet
    filling: ShardSet

    @property
    def count(self) -> int:
        """The dataset's shard count, as announced (the sets' own)."""
        return self.complete.count


def _blob(shards: Iterable[int], count: int) -> str:
    return base64.b64encode(encode_held(shards, count)).decode()


def _unblob(text: str, count: int) -> ShardSet:
    return ShardSet.from_blob(base64.b64decode(text, validate=True), count)


def _filling(entry: Mapping[str, Any], count: int) -> ShardSet:
    return ShardSet((s for s in map(int, entry["filling"]) if 0 <= s < count), count=count)


def since_param(instance: str, version: int) -> str:
    """The ``since`` value that asks for the changes after ``version`` of ``instance``."""
    return f"{instance}.{version}"


class HoldingsLog:
    """One node's holdings, versioned, with a bounded log of recent changes."""

    def __init__(self, *, max_versions: int = 1024, max_changes: int = 1 << 18) -> None:
        if max_versions < 1 or max_changes < 1:
            raise ValueError(
                f"max_versions and max_changes must be >= 1, got {max_versions}, {max_changes}"
            )
        self.instance = os.urandom(6).hex()
        self.version = 0
        self.max_versions = max_versions
        self.max_changes = max_changes
        self._held: dict[str, frozenset[int]] = {}
        self._count: dict[str, int] = {}
        # (version, key, added, removed, gone): the change that made ``version``
        self._log: deque[tuple[int, str, frozenset[int], frozenset[int], bool]] = deque()
        self._changes = 0

    @property
    def floor(self) -> int:
        """The oldest version a delta can start from."""
        return self._log[0][0] - 1 if self._log else self.version

    def update(self, holdings: Mapping[str, tuple[int, Iterable[int]]]) -> int:
        """Record the node's holdings now (key -> (shard count, complete shards)); a new
        version when anything changed. Returns the version."""
        changes: list[tuple[str, frozenset[int], frozenset[int], bool]] = []
        for key, (count, shards) in holdings.items():
            now = frozenset(int(s) for s in shards)
            before = self._held.get(key, frozenset())
            if self._count.get(key) != count and key in self._count:
                changes.append((key, frozenset(), before, True))  # a new version of it: anew
                before = frozenset()
            if now != before or key not in self._held:
                changes.append((key, now - before, before - now, False))
            self._held[key], self._count[key] = now, count
        for key in [k for k in self._held if k not in holdings]:
            changes.append((key, frozenset(), self._held.pop(key), True))
            self._count.pop(key)
        if not changes:
            return self.version
        self.version += 1
        for key, added, removed, gone in changes:
            self._log.append((self.version, key, added, removed, gone))
            self._changes += len(added) + len(removed)
        # drop the oldest versions, each whole, until the log is within its bounds (a
        # version over the bound alone empties it: full answers only until the next one)
        while self._log and (
            self._changes > self.max_changes or self._log[0][0] <= self.version - self.max_versions
        ):
            oldest = self._log[0][0]
            while self._log and self._log[0][0] == oldest:
                _, _, a, r, _ = self._log.popleft()
                self._changes -= len(a) + len(r)
        return self.version

    def full(self, filling: Mapping[str, Iterable[int]] | None = None) -> dict[str, Any]:
        """The full announcement (a JSON-able dict)."""
        filling = filling or {}
        return {
            "instance": self.instance,
            "version": self.version,
            "full": True,
            "datasets": {
                key: {
                    "count": self._count[key],
                    "held": _blob(held, self._count[key]),
                    "filling": sorted(int(s) for s in filling.get(key, ())),
                }
                for key, held in self._held.items()
            },
        }

    def delta(
        self, since: str, filling: Mapping[str, Iterable[int]] | None = None
    ) -> dict[str, Any] | None:
        """What changed after ``since`` (``instance.version``), or None: ask for the full."""
        instance, _, version = since.partition(".")
        if instance != self.instance or not version.isdigit():
            return None
        start = int(version)
        if start < self.floor or start > self.version:
            return None
        added: dict[str, set[int]] = {}
        removed: dict[str, set[int]] = {}
        gone: set[str] = set()
        for v, key, a, r, was_gone in self._log:
            if v <= start:
                continue
            if was_gone:
                gone.add(key)
                added.pop(key, None)
                removed.pop(key, None)
                continue
            add, rem = added.setdefault(key, set()), removed.setdefault(key, set())
            add |= a
            add -= r
            rem |= r
            rem -= a
        filling = filling or {}
        datasets: dict[str, Any] = {}
        for key in set(added) | set(filling) | gone:
            if key not in self._held:
                continue
            count = self._count[key]
            entry: dict[str, Any] = {"count": count}
            entry["filling"] = sorted(int(s) for s in filling.get(key, ()))
            if key in gone:  # gone and back (a new version of the dataset): it all
                entry["held"] = _blob(self._held[key], count)
            else:
                entry["added"] = _blob(added.get(key, ()), count)
                entry["removed"] = _blob(removed.get(key, ()), count)
            datasets[key] = entry
        return {
            "instance": self.instance,
            "version": self.version,
            "full": False,
            "since": start,
            "gone": sorted(k for k in gone if k not in self._held),
            "datasets": datasets,
        }

    def body(
        self,
        since: str | None,
        filling: Mapping[str, Iterable[int]] | None = None,
        *,
        full: bytes | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> bytes:
        """The answer to ``/v1/have`` (``since``: the asker's ``instance.version``): the
        delta when it can be given and is not larger than the full announcement by more than
        ``_SLACK`` (its few fixed fields), else the full one (``full``: its bytes, already made
        for this version). ``extra``: more fields of the answer."""
        if full is None:
            full = json.dumps({**(extra or {}), **self.full(filling)}).encode()
        if since is None:
            return full
        delta = self.delta(since, filling)
        if delta is None:
            return full
        small = json.dumps({**(extra or {}), **delta}).encode()
        return small if len(small) <= len(full) + _SLACK else full


def apply(
    known: tuple[str, int, dict[str, Held]] | None, data: Mapping[str, Any]
) -> tuple[str, int, dict[str, Held]]:
    """``(instance, version, holdings)`` after an answer ``data`` to a reader that knew
    ``known``; ValueError when a delta does not start where the reader stands."""
    instance, version = str(data["instance"]), int(data["version"])
    if data.get("full"):
        out = {}
        for key, e in data["datasets"].items():
            count = int(e["count"])
            out[str(key)] = Held(_unblob(e["held"], count), _filling(e, count))
        return instance, version, out
    if known is None or known[0] != instance or known[1] != int(data["since"]):
        raise ValueError("announcement: a delta from another version than the one asked for")
    out = {k: Held(h.complete, ShardSet(count=h.count)) for k, h in known[2].items()}
    for key in data.get("gone", ()):
        out.pop(str(key), None)
    for key, e in data["datasets"].items():
        count = int(e["count"])
        if "held" in e:
            complete = _unblob(e["held"], count)
        else:
            before = out.get(str(key))
            if before is None or before.count != count:
                base = ShardSet(count=count)  # a new version of the dataset: anew
            else:
                base = before.complete
            complete = base.updated(_unblob(e["added"], count), _unblob(e["removed"], count))
        out[str(key)] = Held(complete, _filling(e, count))
    return instance, version, out
