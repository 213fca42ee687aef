"""``Dataset``: a committed dataset (manifest + shards) at any fsspec prefix."""

from __future__ import annotations

import io
import mmap
import os
from collections.abc import Iterator
from functools import cached_property
from typing import Any

import numpy as np

from flashfeed.format.arrowshard import open_arrow
from flashfeed.format.inplace import (
    InPlaceFiles,
    check_unit_bytes,
    is_in_place,
    read_files_table,
    unit_rows,
)
from flashfeed.format.manifest import Manifest, ShardInfo, read_manifest
from flashfeed.format.shardlist import ShardList
from flashfeed.format.tarshard import Sample, iter_samples
from flashfeed.format.wdsindex import SampleIndex, parse_index

from . import crypto, storage
from .errors import CorruptShardError

__all__ = ["Dataset", "TarShardReader"]


class Dataset:
    """A committed dataset. ``Dataset.open("s3://bucket/ds/")`` reads and checks its manifest.

    >>> ds = Dataset.open("/data/imagenet-wds")          # doctest: +SKIP
    >>> ds.manifest.num_samples, len(ds.shards)           # doctest: +SKIP
    (1281167, 1024)

    A relative local path is made absolute here, once: a later ``chdir`` reads the same
    files. ``shards`` builds a ``ShardInfo`` per shard asked for; ``shard_samples``,
    ``shard_url(i)`` and ``index_url(i)`` work straight off the manifest's columns.
    """

    def __init__(
        self,
        url: str,
        manifest: Manifest,
        *,
        storage_options: dict[str, Any] | None = None,
        encryption_key: crypto.EncryptionKey | None = None,
    ) -> None:
        if storage.split_protocol(url)[0] is None and not os.path.isabs(url):
            url = os.path.abspath(url)  # its identity: a later chdir must not move it
        self.url = url.rstrip("/")
        self.manifest = manifest
        self.storage_options = storage_options
        self.encryption_key = encryption_key

    @classmethod
    def open(
        cls,
        url: str,
        *,
        storage_options: dict[str, Any] | None = None,
        encryption_key: crypto.EncryptionKey | None = None,
    ) -> Dataset:
        """``encryption_key``: for an encrypted dataset; the configured key (environment)
        is used when it is None."""
        return cls(
            url,
            read_manifest(url, storage_options=storage_options),
            storage_options=storage_options,
            encryption_key=encryption_key,
        )

    @property
    def encrypted(self) -> bool:
        return crypto.is_encrypted(self.manifest)

    def __repr__(self) -> str:
        m = self.manifest
        return (
            f"Dataset({self.url!r}, format={m.shard_format}, shards={m.num_shards}, "
            f"samples={m.num_samples})"
        )

    def __len__(self) -> int:
        return self.manifest.num_samples

    @property
    def shards(self) -> ShardList:
        return self.manifest.shards

    @property
    def num_shards(self) -> int:
        return self.manifest.num_shards

    @property
    def shard_samples(self) -> np.ndarray:
        """Samples per shard: a read-only int64 array."""
        return self.manifest.shard_samples

    def _number(self, shard: int | str) -> int:
        if isinstance(shard, str):
            try:
                return self.manifest.find_shard(shard)
            except KeyError:
                raise KeyError(f"{self.url}: no shard {shard!r}") from None
        n = self.manifest.num_shards
        i = int(shard)
        if not -n <= i < n:
            raise IndexError(f"{self.url}: shard {shard} out of range (the dataset has {n})")
        return i % n

    def shard(self, shard: int | str | ShardInfo) -> ShardInfo:
        if isinstance(shard, ShardInfo):
            return shard
        return self.manifest.shard(self._number(shard))

    @cached_property
    def in_place(self) -> InPlaceFiles | None:
        """The files table of a dataset indexed in place (read once), else None."""
        if not is_in_place(self.manifest):
            return None
        return read_files_table(
            self.url, self.manifest.source, storage_options=self.storage_options
        )

    def shard_range(self, shard: int | str | ShardInfo) -> tuple[str, int]:
        """``(url, offset)``: where shard ``shard``'s bytes start; offset 0 but for a unit
        of a file indexed in place (a row group, a block of lines)."""
        files = self.in_place
        if files is None:
            return self.shard_url(shard), 0
        url, offset, _ = files.location(self.shard(shard).path)
        return url, offset

    def shard_url(self, shard: int | str | ShardInfo) -> str:
        if self.in_place is not None:
            return self.shard_range(shard)[0]
        if isinstance(shard, ShardInfo):
            return storage.join(self.url, shard.path)
        if isinstance(shard, str):
            return storage.join(self.url, self.shard(shard).path)
        return storage.join(self.url, self.manifest.shard_path(self._number(shard)))

    def index_url(self, shard: int | str | ShardInfo) -> str | None:
        if isinstance(shard, ShardInfo):
            index = shard.index
        elif isinstance(shard, str):
            index = self.shard(shard).index
        else:
            index = self.manifest.shard_index(self._number(shard))
        return storage.join(self.url, index) if index else None

    def read_shard(
        self, shard: int | str | ShardInfo, *, verify: bool = True, decrypt: bool = True
    ) -> bytes:
        """A shard's bytes, checked against the manifest's size and checksum; decrypted
        (and authenticated) if the dataset is encrypted, unless ``decrypt=False``."""
        info = self.shard(shard)
        url, offset = self.shard_range(info)
        try:
            if self.in_place is not None:  # a unit of a file indexed in place: its range
                data = storage.read_bytes(
                    url, start=offset, end=offset + info.bytes,
                    storage_options=self.storage_options,
                )  # fmt: skip
            else:
                data = storage.read_bytes(url, storage_options=self.storage_options)
        except FileNotFoundError:
            raise CorruptShardError(
                f"shard {info.path} of dataset {self.url} is missing ({url} not found)"
            ) from None
        if verify and self.in_place is not None:
            check_unit_bytes(data, info, url=url)
        elif verify:
            check_shard_bytes(data, info, dataset=self.url)
        if decrypt and self.encrypted:
            return crypto.open_shard(
                self.manifest, info, data, dataset=self.url, key=self.encryption_key
            )
        return data

    def read_index(self, shard: int | str | ShardInfo) -> list[SampleIndex]:
        info = self.shard(shard)
        url = self.index_url(info)
        if url is None:
            raise CorruptShardError(f"shard {info.path} of dataset {self.url} has no index")
        try:
            text = storage.read_bytes(url, storage_options=self.storage_options)
        except FileNotFoundError:
            raise CorruptShardError(f"index {url} of dataset {self.url} is missing") from None
        return parse_index(text, source=url)

    def iter_shard(self, shard: int | str | ShardInfo) -> Iterator[Sample]:
        """Every sample of one shard in stored order: ``(key, {field: value})``.

        Tar fields are bytes; Arrow rows come back as Python values keyed by column.
        """
        info = self.shard(shard)
        data = self.read_shard(info)
        if self.in_place is not None:  # a row group or a block of lines: its rows
            for i, row in enumerate(unit_rows(self.in_place, info.path, data)):
                yield f"{info.path}/{i}", row
            return
        if self.manifest.shard_format == "arrow":
            table = open_arrow(data, name=self.shard_url(info))
            for i, row in enumerate(table.to_pylist()):
                yield str(row.get("__key__", f"{info.path}:{i}")), row
        else:
            yield from iter_samples(io.BytesIO(data), source=self.shard_url(info))

    def __iter__(self) -> Iterator[Sample]:
        for info in self.shards:
            yield from self.iter_shard(info)

    def verify(self, shard: int | str | ShardInfo) -> None:
        """Raise ``CorruptShardError`` naming the shard if its stored bytes do not match
        (an encrypted shard is checked as stored: no key needed)."""
        self.read_shard(shard, verify=True, decrypt=False)


def check_shard_bytes(data: bytes | memoryview, info: ShardInfo, *, dataset: str) -> None:
    if len(data) != info.bytes:
        raise CorruptShardError(
            f"shard {info.path} of dataset {dataset} has {len(data)} bytes, "
            f"the manifest says {info.bytes} (truncated or replaced)"
        )
    check_shard_checksum(storage.checksum(data), info, dataset=dataset)


def check_shard_checksum(got: str, info: ShardInfo, *, dataset: str) -> None:
    """Raise ``CorruptShardError`` naming the shard unless ``got`` is its manifest checksum."""
    if got != info.checksum:
        raise CorruptShardError(
            f"shard {info.path} of dataset {dataset} fails its checksum "
            f"(manifest {info.checksum}, read {got}): corrupt or replaced"
        )


class TarShardReader:
    """Random access by sample index into one tar shard through its ``.idx``.

    A local file is memory-mapped; a remote one costs one ranged GET per sample.
    """

    def __init__(
        self,
        url: str,
        index: list[SampleIndex],
        *,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.url = url
        self.index = index
        self.storage_options = storage_options
        self._mmap: mmap.mmap | None = None
        if storage.is_local(url):
            _, path = storage.filesystem(url)
            with open(path, "rb") as f:
                self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            size = os.path.getsize(path)
            if index and index[-1].end > size:
                raise CorruptShardError(f"{url}: index points past the end of the file")

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> Sample:
        s = self.index[i]
        start, end = s.start, s.end
        if self._mmap is not None:
            view: bytes | memoryview = memoryview(self._mmap)[start:end]
        else:
            view = storage.read_bytes(
                self.url, start=start, end=end, storage_options=self.storage_options
            )
            if len(view) != end - start:
                raise CorruptShardError(f"{self.url}: sample {s.key!r} is truncated")
        return s.key, {
            c.ext: bytes(view[c.offset - start : c.offset - start + c.size]) for c in s.components
        }

    def close(self) -> None:
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None

    def __enter__(self) -> TarShardReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
