"""Samples of local shards by shard and row, memory-mapped through their ``.idx``.

``ShardReader`` keeps shards of one process mapped: a dataset read in place as many as fit a
budget of samples, a node cache's a few. Picklable; it maps its files lazily in the process
that uses it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from flashfeed.errors import CorruptShardError
from flashfeed.format.wdsindex import SampleIndex
from flashfeed.runtime.fdpath import map_readonly

from .image.fields import FieldSpec
from .image.labels import parse_label
from .sources import LocalShardSource, ShardSource

if TYPE_CHECKING:
    from flashfeed.cache import FillView

__all__ = ["CACHED_MAX_OPEN", "LOCAL_MAX_OPEN", "LOCAL_OPEN_SAMPLES", "ShardReader"]


class _OpenShard:
    def __init__(
        self, path: str, index: list[SampleIndex], name: str, view: FillView | None = None
    ) -> None:
        self.mmap = map_readonly(path)  # a path, or a descriptor the node service handed over
        self.index = index
        self.name = name
        self.view = view  # set while the shard is still arriving: which bytes are there
        if index and index[-1].end > len(self.mmap):
            size = len(self.mmap)
            self.mmap.close()
            raise CorruptShardError(f"shard {name}: its index points past the end ({size} bytes)")
        #: the whole map as uint8: a member is a slice of it (``np.frombuffer`` per member
        #: costs a buffer export each time)
        self.array = np.frombuffer(self.mmap, dtype=np.uint8) if len(self.mmap) else None
        #: row -> what ``BatchSource`` hands on for it (views into ``array``, a parsed label,
        #: its key bytes): made once while the shard stays open, so a hot epoch reads no index
        #: entry, parses no label and encodes no key again
        self.memo: dict[int, tuple[list[Any], np.ndarray]] = {}

    def close(self) -> None:
        """Unmap, dropping what was kept first. A view still held elsewhere (a sample of the
        batch being made, from a shard evicted for a later sample of it) keeps the map until
        that view goes: then it is unmapped with the ``mmap`` object."""
        self.memo.clear()
        self.array = None
        try:
            self.mmap.close()
        except BufferError:
            pass


#: shards a reader keeps mapped by default, the least recently read going first: a node
#: cache's files, whose mapping would keep an evicted file's disk space taken
CACHED_MAX_OPEN = 16
#: a dataset read in place keeps more shards mapped, as DALI's own reader maps every file it
#: reads: with more shards than that, each pass unmapped and mapped every shard again, parsed
#: its index and made its samples' views again (on 56 shards of 8 MiB: the main thread's CPU
#: per hot epoch doubled, the epoch ran 5-7% slower)
LOCAL_MAX_OPEN = 128
#: ... and once more than ``CACHED_MAX_OPEN`` are open, they hold at most this many samples in
#: all: each open sample keeps its index entry and what ``BatchSource`` made of it (1.4 KB
#: measured: 46 MB at most), so small shards stay open and shards of many samples do not
LOCAL_OPEN_SAMPLES = 1 << 15


class ShardReader:
    """Random access to samples of local shards; at most ``max_open`` stay mapped (None: a
    dataset read in place keeps up to ``LOCAL_MAX_OPEN``, and past ``CACHED_MAX_OPEN`` shards
    at most ``LOCAL_OPEN_SAMPLES`` samples in all; a node cache's ``CACHED_MAX_OPEN``)."""

    def __init__(
        self, source: ShardSource, shard_names: Sequence[str], *, max_open: int | None = None
    ) -> None:
        self.source = source
        self.shard_names = shard_names
        local = isinstance(source, LocalShardSource)
        if max_open is None:
            max_open = LOCAL_MAX_OPEN if local else CACHED_MAX_OPEN
        self.max_open = max_open
        #: samples the open shards may hold in all, once more than ``CACHED_MAX_OPEN`` are open
        self.max_samples = LOCAL_OPEN_SAMPLES if local else None
        self._open: OrderedDict[int, _OpenShard] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_open"] = OrderedDict()
        return state

    def _shard(self, shard: int) -> _OpenShard:
        s = self._open.get(shard)
        if s is None:
            s = self._map(shard)
            self._open[shard] = s
            while len(self._open) > self.max_open or self._over_samples():
                self._evict()
        else:
            self._open.move_to_end(shard)
        return s

    @property
    def _samples(self) -> int:
        """Samples of the open shards."""
        return sum(len(s.index) for s in self._open.values())

    def _over_samples(self) -> bool:
        return (
            self.max_samples is not None
            and len(self._open) > CACHED_MAX_OPEN
            and self._samples > self.max_samples
        )

    def _evict(self, shard: int | None = None) -> None:
        """Unmap ``shard`` (None: the least recently read)."""
        s = self._open.pop(shard) if shard is not None else self._open.popitem(last=False)[1]
        s.close()

    def _map(self, shard: int, attempts: int = 3) -> _OpenShard:
        got = self.source.partial(shard)
        if got is not None:
            try:
                return _OpenShard(got.part, got.index, self.shard_names[shard], got.progress)
            except FileNotFoundError:  # renamed into place meanwhile
                got.progress.close()
        # a cache may evict a shard between handing out its path and our open: ask again
        for attempt in range(attempts):
            try:
                index = self.source.index(shard)
                return _OpenShard(self.source.local_path(shard), index, self.shard_names[shard])
            except FileNotFoundError:
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def _arrived(self, shard: int, entry: SampleIndex) -> _OpenShard:
        """Wait until the sample's bytes are in the part file; if that fill ended without
        them (it failed), map the shard again (the cache retries or names the error)."""
        s = self._open[shard]
        delay = 0.001
        while s.view is not None and not s.view.done(entry.start, entry.end):
            if s.view.ended():
                s.view.close()
                self._evict(shard)
                s = self._shard(shard)
                continue
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
        return s

    def key(self, shard: int, row: int) -> str:
        return self._shard(shard).index[row].key

    def members(self, shard: int, row: int) -> tuple[str, dict[str, np.ndarray]]:
        """``(key, {ext: uint8 view})``: views into the mapped shard, no copy."""
        s = self._shard(shard)
        if not 0 <= row < len(s.index):
            raise CorruptShardError(
                f"shard {s.name}: sample {row} requested but its index has {len(s.index)}"
            )
        entry = s.index[row]
        if s.view is not None and not s.view.done(entry.start, entry.end):
            s = self._arrived(shard, entry)
        whole = s.array
        if whole is None or entry.end > len(whole):
            raise CorruptShardError(
                f"shard {s.name}: sample {entry.key!r} ends at byte {entry.end}, past the "
                f"shard's end ({len(s.mmap)} bytes)"
            )
        return entry.key, {c.ext: whole[c.offset : c.offset + c.size] for c in entry.components}

    def name(self, shard: int) -> str:
        """The shard's path (kept with its mapping: no lookup in the shard table per sample)."""
        return self._shard(shard).name

    def picked(
        self, shard: int, row: int, specs: tuple[FieldSpec, ...]
    ) -> tuple[str, list[tuple[str, np.ndarray] | None]]:
        """One sample's ``(ext, bytes)`` per field in ``specs`` order (None for a missing
        optional field); a missing required field is a ``CorruptShardError`` naming it."""
        key, members = self.members(shard, row)
        out: list[tuple[str, np.ndarray] | None] = []
        for spec in specs:
            ext = spec.pick(members)
            if ext is None:
                if spec.optional:
                    out.append(None)
                    continue
                raise CorruptShardError(
                    f"shard {self.shard_names[shard]}: sample {key!r} has no "
                    f"{'/'.join(spec.exts)} member for field {spec.name!r} "
                    f"(it has {sorted(members)}); pass optional=[{spec.name!r}] to allow that"
                )
            out.append((ext, members[ext]))
        return key, out

    def fields(
        self, shard: int, row: int, specs: tuple[FieldSpec, ...]
    ) -> tuple[str, list[np.ndarray]]:
        """One sample's fields in ``specs`` order: labels as int64 scalars, the rest bytes
        (no bytes for a missing optional field)."""
        key, picked = self.picked(shard, row, specs)
        out = []
        for spec, got in zip(specs, picked, strict=True):
            if got is None:
                out.append(np.zeros(0, np.uint8))
            elif spec.is_label:
                out.append(self.label(shard, key, *got))
            else:
                out.append(got[1])
        return key, out

    def label(self, shard: int, key: str, ext: str, data: np.ndarray) -> np.ndarray:
        """A label member as an int64 scalar; unparsable is a ``CorruptShardError``."""
        raw = data.tobytes()
        if ext == "cls":  # the common case, without a message built per sample
            try:
                return np.array(int(raw), dtype=np.int64)
            except ValueError:
                pass  # parse_label says why, naming the sample
        where = f"shard {self.shard_names[shard]} sample {key!r}"
        try:
            label = parse_label(raw, ext, where=where)
        except ValueError as exc:
            raise CorruptShardError(str(exc)) from None
        return np.array(label, dtype=np.int64)

    def close(self) -> None:
        """Unmap every open shard (a later read maps it again)."""
        for s in self._open.values():
            s.close()
        self._open.clear()
