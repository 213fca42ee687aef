"""Ledger mode: a hash of every delivered sample key, per rank and epoch, appended to files.

Tests and audits read it back to prove a run delivered each sample exactly once, and that an
interrupted and resumed run delivered the same samples as an uninterrupted one.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Iterable

import xxhash

__all__ = ["Ledger", "key_hash", "read_ledger"]

_NAME = re.compile(r"^epoch(\d+)-ws(\d+)-rank(\d+)\.log$")


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


def read_ledger(directory: str) -> dict[int, list[str]]:
    """Every recorded hash per epoch, all ranks and world sizes together."""
    out: dict[int, list[str]] = defaultdict(list)
    for name in sorted(os.listdir(directory)):
        m = _NAME.match(name)
        if not m:
            continue
        with open(os.path.join(directory, name), encoding="ascii") as f:
            out[int(m.group(1))].extend(line.strip() for line in f if line.strip())
    return dict(out)
