"""A mixture seen by the loader as one dataset: the sources' shard tables end to end.

``MixtureDataset`` lays the sources' shards end to end (virtual shard ``v`` is shard ``v -
shard_offsets[s]`` of source ``s``), so a mixture's pass order is ordinary sample ids and the
loader's machinery (pass order, read-ahead, readers) runs unchanged. Its shard names are
``<source>:<shard path>``, so every ``__key__`` names its source. ``MixtureShardSource``
sends each shard request to the source's own ``ShardSource``; a failure names the source.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Iterator, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from flashfeed import storage
from flashfeed.dataset import Dataset
from flashfeed.errors import CorruptShardError
from flashfeed.format.wdsindex import SampleIndex
from flashfeed.plan.mixplan import SourceTable
from flashfeed.plan.mixture import Mixture

from .sources import (
    CacheShardSource,
    ShardSource,
    node_cache_dir,
    node_service,
    open_dataset,
    open_source,
    reads_in_place,
)

if TYPE_CHECKING:
    from flashfeed.cache import PartialShard
    from flashfeed.format.manifest import ShardInfo

__all__ = ["MixtureDataset", "MixtureShardSource", "open_mixture"]


class _Shards(Sequence["ShardInfo"]):
    def __init__(self, mix: MixtureDataset) -> None:
        self._mix = mix

    def __len__(self) -> int:
        return self._mix.manifest.num_shards

    def __getitem__(self, v: Any) -> Any:
        s, local = self._mix.locate_shard(int(v))
        return self._mix.datasets[s].shards[local]

    def __iter__(self) -> Iterator[ShardInfo]:
        for v in range(len(self)):
            yield self[v]


class MixtureManifest:
    """What the loader reads of a manifest, for the mixture's end-to-end shard table."""

    def __init__(self, mix: MixtureDataset) -> None:
        self._mix = mix
        first = mix.datasets[0].manifest
        self.shard_format = first.shard_format
        self.schema = first.schema
        self.shard_samples = np.concatenate(
            [np.asarray(d.manifest.shard_samples, np.int64) for d in mix.datasets]
        )
        self.shard_bytes = np.concatenate(
            [np.asarray(d.manifest.shard_bytes, np.int64) for d in mix.datasets]
        )
        self.num_shards = len(self.shard_samples)
        self.num_samples = int(self.shard_samples.sum())

    @cached_property
    def digest(self) -> str:
        """The sources' names and datasets (not the weights: a state survives a change of
        weights, see ``MixPosition``)."""
        parts = [f"{n}={d.manifest.digest}" for n, d in zip(self._mix.names, self._mix.datasets,
                                                             strict=True)]  # fmt: skip
        return "mix-" + hashlib.sha256(";".join(parts).encode()).hexdigest()[:32]

    def shard_path(self, v: int) -> str:
        s, local = self._mix.locate_shard(v)
        return f"{self._mix.names[s]}:{self._mix.datasets[s].manifest.shard_path(local)}"


#: a check that a loader can read a mixture's sources: (names, datasets), raises ValueError
SourceCheck = Callable[[Sequence[str], Sequence[Dataset]], None]


class MixtureDataset:
    """A mixture's sources opened, checked to be readable by one loader, laid end to end.
    ``check``: what the loader needs of its sources (default: one shard format and schema)."""

    def __init__(
        self, mixture: Mixture, datasets: Sequence[Dataset], *, check: SourceCheck | None = None
    ) -> None:
        self.mixture = mixture
        self.datasets = tuple(datasets)
        self.names = mixture.names
        self.url = mixture.origin or "mixture(" + ",".join(self.names) + ")"
        self.encrypted = False
        _check_distinct(self.names, self.datasets)
        (check or _check_alike)(self.names, self.datasets)
        self.shard_offsets = np.concatenate(
            [[0], np.cumsum([d.manifest.num_shards for d in self.datasets])]
        ).astype(np.int64)
        # plain ints for locate_shard, asked a dozen times a batch (numpy per call costs more)
        self._starts = [int(x) for x in self.shard_offsets[:-1]]
        self._ends = [int(x) for x in self.shard_offsets[1:]]
        self.manifest = MixtureManifest(self)
        self.shards = _Shards(self)

    def locate_shard(self, v: int) -> tuple[int, int]:
        """Virtual shard -> (source number, the source's own shard number)."""
        v = int(v)
        if not 0 <= v < self._ends[-1]:
            raise IndexError(f"shard {v} is not in this mixture of {self._ends[-1]}")
        s = bisect.bisect_right(self._ends, v)
        return s, v - self._starts[s]

    def tables(self) -> list[SourceTable]:
        return [
            SourceTable(n, str(d.manifest.digest), np.asarray(d.manifest.shard_samples, np.int64))
            for n, d in zip(self.names, self.datasets, strict=True)
        ]

    def __repr__(self) -> str:
        return f"MixtureDataset({self.url!r}, sources={list(self.names)})"


def _check_distinct(names: Sequence[str], datasets: Sequence[Dataset]) -> None:
    """No dataset twice in one mixture."""
    seen: dict[str, str] = {}
    for name, ds in zip(names, datasets, strict=True):
        m = ds.manifest
        if m.digest in seen:
            raise ValueError(
                f"sources {seen[m.digest]!r} and {name!r} are the same dataset "
                f"({ds.url}): a mixture names each dataset once"
            )
        seen[m.digest] = name


def _check_alike(names: Sequence[str], datasets: Sequence[Dataset]) -> None:
    """Sources one loader reads alike: one shard format, the same fields."""
    first, base = names[0], datasets[0].manifest
    for name, ds in zip(names, datasets, strict=True):
        m = ds.manifest
        if m.shard_format != base.shard_format:
            raise ValueError(
                f"sources {first!r} and {name!r} differ in shard format "
                f"({base.shard_format} vs {m.shard_format}): one loader reads them all"
            )
        if dict(m.schema) != dict(base.schema):
            raise ValueError(
                f"sources {first!r} and {name!r} differ in fields: {dict(base.schema)} vs "
                f"{dict(m.schema)}"
            )


class MixtureShardSource:
    """Shard requests by virtual shard number, each sent to its source's ``ShardSource``."""

    def __init__(self, dataset: MixtureDataset, sources: Sequence[ShardSource]) -> None:
        self.dataset = dataset
        self.sources = tuple(sources)
        #: every source reads local files in place (the loader then streams nothing)
        self.in_place = all(reads_in_place(s) for s in self.sources)

    @property
    def capacity(self) -> int | None:
        """The node cache's capacity, when a source reads through one."""
        for src in self.sources:
            capacity = getattr(src, "capacity", None)
            if capacity:
                return int(capacity)
        return None

    def _where(self, v: int) -> tuple[int, int, ShardSource]:
        s, local = self.dataset.locate_shard(v)
        return s, local, self.sources[s]

    def _named(self, s: int, exc: Exception) -> Exception:
        return type(exc)(f"source {self.dataset.names[s]!r}: {exc}")

    def local_path(self, shard: int) -> str:
        s, local, src = self._where(shard)
        try:
            return src.local_path(local)
        except (CorruptShardError, FileNotFoundError) as exc:
            raise self._named(s, exc) from None

    def index(self, shard: int) -> list[SampleIndex]:
        s, local, src = self._where(shard)
        try:
            return src.index(local)
        except (CorruptShardError, FileNotFoundError) as exc:
            raise self._named(s, exc) from None

    def _split(self, shards: Sequence[int]) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for v in shards:
            s, local = self.dataset.locate_shard(int(v))
            out.setdefault(s, []).append(local)
        return out

    def fetch_ahead(self, shards: Sequence[int]) -> None:
        """Each run of one source's shards goes to that source in turn: the fetches start in
        the mixture's order, not source after source."""
        run: list[int] = []
        current = -1
        for v in shards:
            s, local = self.dataset.locate_shard(int(v))
            if s != current and run:
                self.sources[current].fetch_ahead(run)
                run = []
            current = s
            run.append(local)
        if run:
            self.sources[current].fetch_ahead(run)

    def need(
        self, shard: int, rows: Sequence[int] | np.ndarray, batches: Sequence[int] | np.ndarray
    ) -> None:
        _, local, src = self._where(shard)
        src.need(local, rows, batches)

    def set_future(self, shards: Sequence[int]) -> None:
        """The pass's read order: the sources on one node cache get it merged (one clock for
        all, so eviction compares their shards); any other source its own part."""
        by_cache: dict[int, tuple[Any, list[int]]] = {}
        for s, src in enumerate(self.sources):
            if isinstance(src, CacheShardSource):
                cache = src._cache()
                by_cache.setdefault(id(cache), (cache, []))[1].append(s)
        split = self._split(shards)
        for s, src in enumerate(self.sources):
            if not isinstance(src, CacheShardSource):
                src.set_future(split.get(s, []))
        for cache, members in by_cache.values():
            number = {s: j for j, s in enumerate(members)}
            pairs = []
            for v in shards:
                s, local = self.dataset.locate_shard(int(v))
                if s in number:
                    pairs.append((number[s], local))
            cache.set_mixture_future([self.dataset.datasets[s] for s in members], pairs)

    def partial(self, shard: int) -> PartialShard | None:
        _, local, src = self._where(shard)
        return src.partial(local)

    def close(self) -> None:
        """Close each source that holds something to close (a node service's descriptors)."""
        for src in self.sources:
            closing = getattr(src, "close", None)
            if closing is not None:
                closing()

    def stats(self) -> dict[str, Any]:
        per = {
            n: src.own_stats() if isinstance(src, CacheShardSource) else src.stats()
            for n, src in zip(self.dataset.names, self.sources, strict=True)
        }
        first = next(iter(per.values()))
        caches = {id(getattr(s, "cache", None)) for s in self.sources}
        if len(caches) == 1 and isinstance(self.sources[0], CacheShardSource):
            out = self.sources[0].stats()  # one node cache: its counters are the mixture's
        else:
            out = {"kind": first.get("kind", "mixture")}
            for key in ("hits", "misses"):
                out[key] = sum(int(p.get(key, 0) or 0) for p in per.values())
        out["sources"] = per
        return out


def status_root(source: Any) -> str | None:
    """The node cache's folder, where a rank's status file goes (``flashfeed top``); for a
    mixture the cache its sources share; None without a cache."""
    if isinstance(source, MixtureShardSource):
        caches = [s for s in source.sources if isinstance(s, CacheShardSource)]
        return str(caches[0].cache.root) if caches else None
    return str(source.cache.root) if isinstance(source, CacheShardSource) else None


def open_mixture(
    mixture: Mixture,
    *,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | None = None,
    cache: Any = None,
    check: SourceCheck | None = None,
) -> tuple[MixtureDataset, MixtureShardSource]:
    """Open every source of ``mixture`` (an error names the source that fails), check they
    can be read by one loader (``check``: ``MixtureDataset``'s), and route shard requests
    to each (one node cache for all)."""
    datasets = []
    for s in mixture.sources:
        try:
            datasets.append(open_dataset(s.url, storage_options, cache_dir=cache_dir, cache=cache))
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"mixture source {s.key!r} ({s.url}) cannot be opened: {exc}"
            ) from None
    mix = MixtureDataset(mixture, datasets, check=check)
    given = cache is not None or cache_dir is not None
    if not given and node_service() is not None:  # each remote source through the service
        return mix, MixtureShardSource(
            mix, [open_source(d, storage_options=storage_options) for d in datasets]
        )
    if cache is None:  # one node cache for every source that needs one
        roots = {node_cache_dir(cache_dir, d.url) for d in datasets} - {None}
        if roots:
            from flashfeed.cache import ShardCache

            cache = ShardCache(roots.pop(), storage_options=storage_options)
    sources = [
        open_source(d, cache=cache, storage_options=storage_options)
        if given or not storage.is_local(d.url)
        else open_source(d, storage_options=storage_options)
        for d in datasets
    ]
    return mix, MixtureShardSource(mix, sources)
