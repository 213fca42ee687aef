"""The dataset manifest: ``<prefix>/manifest.json``, written last; its presence is the commit.

Version 2 (written now; version 3 when the header lists features a reader must know, in
``requires``): ``manifest.json`` is a small JSON header and the shard table is an
Arrow IPC file beside it (``manifest-<hash>.arrow``), written first and named by the header
with its size, row count and checksum. Version 1 (one JSON object with a ``shards`` list)
is still read. See docs/FORMAT.md for the field-by-field description.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa

from flashfeed import storage
from flashfeed.errors import DatasetExistsError, ManifestError, StorageError
from flashfeed.format.manifestheader import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    READ_VERSIONS,
    SHARD_FORMATS,
    TABLE_FORMAT,
    TABLE_PREFIX,
    canonical_json,
    check_totals,
    header_kwargs,
    header_requires,
    header_version,
    parse_json,
    table_ref,
)
from flashfeed.format.shardlist import ShardList
from flashfeed.format.shardtable import (
    ShardInfo,
    ShardTable,
    check_relative_path,
    synthetic_shard_table,
)

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "READ_VERSIONS",
    "SHARD_FORMATS",
    "Manifest",
    "ShardInfo",
    "ShardTable",
    "check_relative_path",
    "commit_manifest",
    "delete_manifest",
    "is_committed",
    "manifest_files",
    "read_manifest",
    "synthetic_shard_table",
]


class Manifest:
    """What a committed dataset holds. Immutable; a new version is a new prefix.

    ``shards`` is a sequence of ``ShardInfo`` built per item on demand; the columnar
    accessors (``shard_samples``, ``shard_bytes``, ``shard_path``) build no per-shard
    objects at all, which is what a million-shard dataset needs.
    """

    def __init__(
        self,
        name: str,
        shard_format: str,
        schema: dict[str, str],
        shards: Sequence[ShardInfo] | ShardTable,
        skipped: dict[str, int] | None = None,
        source: dict[str, Any] | None = None,
        config: dict[str, Any] | None = None,
        classes: Sequence[str] | None = None,
        extra: dict[str, Any] | None = None,
        format_version: int = FORMAT_VERSION,
        requires: Sequence[str] = (),
    ) -> None:
        if shard_format not in SHARD_FORMATS:
            raise ManifestError(
                f"shard_format must be one of {SHARD_FORMATS}, got {shard_format!r}"
            )
        if shard_format in ("parquet", "jsonl") and "in-place" not in requires:
            raise ManifestError(
                f"a {shard_format} manifest indexes files in place: it must require 'in-place'"
            )
        self.name = name
        self.shard_format = shard_format
        self.schema = schema
        self.skipped = dict(skipped or {})
        self.source = source or {}
        self.config = config or {}
        self.classes = tuple(classes) if classes is not None else None
        self.extra = extra or {}
        #: features a reader must understand (docs/FORMAT.md); any makes the header version 3
        self.requires = tuple(sorted(set(requires)))
        self.format_version = 3 if self.requires and format_version == 2 else format_version
        self._table = shards if isinstance(shards, ShardTable) else ShardTable.from_infos(shards)
        self._shards = ShardList(self._table)

    # --- the shard table ------------------------------------------------------------------

    @property
    def shards(self) -> ShardList:
        """Every shard as a ``ShardInfo`` sequence (indexing, ``len``, iteration)."""
        return self._shards

    @property
    def table(self) -> ShardTable:
        return self._table

    @property
    def num_shards(self) -> int:
        return len(self._table)

    @property
    def shard_samples(self) -> np.ndarray:
        """Samples per shard: a read-only int64 array, no Python object per shard."""
        return self._table.samples

    @property
    def shard_bytes(self) -> np.ndarray:
        """Bytes per shard: a read-only int64 array."""
        return self._table.sizes

    def shard_path(self, i: int) -> str:
        return self._table.path(i)

    def shard_index(self, i: int) -> str | None:
        """The relative path of shard ``i``'s ``.idx``, or None."""
        return self._table.index(i)

    def shard(self, i: int) -> ShardInfo:
        return self._shards[i]

    def find_shard(self, path: str) -> int:
        """The number of the shard at ``path``; ``KeyError`` if there is none."""
        i = self._table.find(path)
        if i < 0:
            raise KeyError(f"dataset {self.name!r} has no shard {path!r}")
        return i

    @property
    def digest(self) -> str:
        """The dataset's identity: a hex hash of the shard table (paths, sizes, checksums,
        indexes), the same for a version-1 and a version-2 manifest of the same shards."""
        return self._table.digest

    @cached_property
    def num_samples(self) -> int:
        return int(self._table.samples.sum())

    @cached_property
    def num_bytes(self) -> int:
        return int(self._table.sizes.sum())

    def totals(self) -> dict[str, int]:
        return {
            "shards": self.num_shards,
            "samples": self.num_samples,
            "bytes": self.num_bytes,
            "skipped": sum(self.skipped.values()),
        }

    # --- equality and text ----------------------------------------------------------------

    def _header_fields(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name,
            "shard_format": self.shard_format,
            "schema": dict(self.schema),
            "totals": self.totals(),
            "skipped": dict(self.skipped),
            "source": self.source,
            "config": self.config,
        }
        if self.classes is not None:
            d["classes"] = list(self.classes)
        if self.extra:
            d["extra"] = self.extra
        return d

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Manifest):
            return NotImplemented
        return (
            self._header_fields() == other._header_fields()
            and self.requires == other.requires
            and self.digest == other.digest
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"Manifest(name={self.name!r}, shard_format={self.shard_format!r}, "
            f"shards={self.num_shards}, samples={self.num_samples}, "
            f"format_version={self.format_version})"
        )

    def header_dict(self, table: dict[str, Any]) -> dict[str, Any]:
        """The version-2 header: every field but the shards, plus ``shard_table``; version 3
        with ``requires`` when the dataset needs a reader that knows those features."""
        if self.requires:
            return {
                "format_version": 3,
                **self._header_fields(),
                "requires": list(self.requires),
                "shard_table": dict(table),
            }
        return {"format_version": 2, **self._header_fields(), "shard_table": dict(table)}

    def to_dict(self) -> dict[str, Any]:
        """The whole manifest as one version-1 object (shards inline)."""
        if self.requires:
            raise ValueError(
                f"a dataset that requires {list(self.requires)} has no version-1 manifest"
            )
        d = self._header_fields()
        d["format_version"] = 1
        d["shards"] = [
            {"path": s.path, "samples": s.samples, "bytes": s.bytes, "checksum": s.checksum,
             "index": s.index}
            for s in self._shards
        ]  # fmt: skip
        return d

    def to_json(self) -> str:
        """Canonical version-1 JSON: sorted keys, so identical datasets give identical text."""
        return canonical_json(self.to_dict())

    # --- parsing --------------------------------------------------------------------------

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = MANIFEST_NAME) -> Manifest:
        """A version-1 manifest from its text (a version-2 header needs its shard table:
        use ``read_manifest``)."""
        return cls.from_dict(parse_json(text, source), source=source)

    @classmethod
    def from_dict(cls, d: Any, *, source: str = MANIFEST_NAME) -> Manifest:
        """A version-1 manifest from its JSON object."""
        if header_version(d, source) != 1:
            raise ManifestError(
                f"{source}: a version-2 manifest keeps its shards in a separate table; "
                "open it with read_manifest(prefix) or Dataset.open(prefix)"
            )
        fields = header_kwargs(d, source)
        if "shards" not in d:
            raise ManifestError(f"{source}: manifest lacks 'shards'")
        if not isinstance(d["shards"], list):
            raise ManifestError(f"{source}: 'shards' must be a list")
        infos = [ShardInfo.from_dict(s, source=source, i=i) for i, s in enumerate(d["shards"])]
        if len({s.path for s in infos}) != len(infos):
            raise ManifestError(f"{source}: two shards share one path")
        m = cls(shards=infos, format_version=1, **fields)
        check_totals(m, d, source)
        return m

    @classmethod
    def from_header(cls, d: Any, table: ShardTable, *, source: str = MANIFEST_NAME) -> Manifest:
        """A version-2 (or 3) manifest from its header object and its (already read) shard
        table."""
        version = header_version(d, source)
        if version == 1:
            raise ManifestError(f"{source}: not a version-2 manifest header")
        requires = header_requires(d, version, source)
        m = cls(shards=table, format_version=version, requires=requires, **header_kwargs(d, source))
        check_totals(m, d, source)
        return m


def manifest_url(prefix: str) -> str:
    return storage.join(prefix, MANIFEST_NAME)


def read_manifest(prefix: str, *, storage_options: dict[str, Any] | None = None) -> Manifest:
    """Read and validate the manifest of the dataset at ``prefix`` (either version).

    A version-2 shard table on local storage is memory-mapped, not copied.
    """
    url = manifest_url(prefix)
    try:
        text = storage.read_bytes(url, storage_options=storage_options)
    except FileNotFoundError:
        raise ManifestError(
            f"no dataset at {prefix}: {url} does not exist (not committed yet, or a wrong "
            "prefix; `flashfeed index PREFIX` builds one for shards written by other tools)"
        ) from None
    d = parse_json(text, url)
    version = header_version(d, url)
    if version == 1:
        return Manifest.from_dict(d, source=url)
    header_requires(d, version, url)  # an unknown feature is refused before any table read
    ref = table_ref(d, url)
    table = read_shard_table(
        storage.join(prefix, ref["path"]), ref, header=url, storage_options=storage_options
    )
    return Manifest.from_header(d, table, source=url)


def read_shard_table(
    url: str,
    ref: dict[str, Any],
    *,
    header: str,
    storage_options: dict[str, Any] | None = None,
) -> ShardTable:
    """The shard table at ``url``, checked against the header's size, checksum and rows."""
    try:
        if storage.is_local(url):
            _, path = storage.filesystem(url, storage_options)
            with pa.memory_map(path, "r") as mapped:
                data = mapped.read_buffer()  # stays mapped while referenced
        else:
            data = pa.py_buffer(storage.read_bytes(url, storage_options=storage_options))
    except FileNotFoundError:
        raise ManifestError(
            f"{header}: its shard table {url} is missing (deleted, or copied without it)"
        ) from None
    except OSError as exc:  # a directory, no permission: local only (remote is StorageError)
        if isinstance(exc, StorageError):
            raise
        raise ManifestError(
            f"{header}: its shard table {url} cannot be read ({str(exc)[:200]})"
        ) from None
    if data.size != ref["bytes"]:
        raise ManifestError(
            f"{url}: the shard table has {data.size} bytes, {header} says "
            f"shard_table.bytes = {ref['bytes']} (truncated or replaced)"
        )
    got = storage.checksum(memoryview(data))
    if got != ref["checksum"]:
        raise ManifestError(
            f"{url}: the shard table fails its checksum ({header} says shard_table.checksum = "
            f"{ref['checksum']}, read {got}): corrupt or replaced"
        )
    table = ShardTable.read_ipc(data, source=url)
    if len(table) != ref["rows"]:
        raise ManifestError(
            f"{url}: the shard table has {len(table)} rows, {header} says "
            f"shard_table.rows = {ref['rows']}"
        )
    return table


def _committed_table(prefix: str, storage_options: dict[str, Any] | None) -> str | None:
    """The table path the committed header names, if it can be read (best effort)."""
    try:
        d = json.loads(storage.read_bytes(manifest_url(prefix), storage_options=storage_options))
        path = d["shard_table"]["path"]
        return check_relative_path(path, what="shard_table.path", source=prefix)
    except (FileNotFoundError, ValueError, KeyError, TypeError, ManifestError):
        return None


def is_committed(prefix: str, *, storage_options: dict[str, Any] | None = None) -> bool:
    """Whether a dataset is committed at ``prefix``: one HEAD of its manifest (signed where
    it can be), no listing."""
    try:
        storage.head(manifest_url(prefix), storage_options=storage_options)
    except FileNotFoundError:
        return False
    return True


def commit_manifest(
    prefix: str,
    manifest: Manifest,
    *,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
    format_version: int = FORMAT_VERSION,
    put: Callable[..., None] | None = None,
) -> str:
    """Write the manifest (the commit). Refuses to replace a committed one unless told to.

    Version 2: the shard table first, under a name made of its checksum, then the header;
    a reader sees the old dataset or the new one, never a part. ``put(url, data,
    storage_options=)`` writes each file whole (``storage.write_bytes`` unless given: ingest
    passes its signed PUT).
    """
    write = storage.write_bytes if put is None else put
    url = manifest_url(prefix)
    old_table = None
    if is_committed(prefix, storage_options=storage_options):
        if not overwrite:
            raise DatasetExistsError(
                f"a committed dataset already exists at {prefix}; datasets are immutable: "
                "write to a new prefix, or pass overwrite=True (--overwrite)"
            )
        old_table = _committed_table(prefix, storage_options)
    if format_version == 1:
        write(url, manifest.to_json().encode(), storage_options=storage_options)
        new_table = None
    elif format_version in (2, 3):  # 3 when the manifest requires features
        data = memoryview(manifest.table.to_ipc())
        digest = storage.checksum(data)
        new_table = f"{TABLE_PREFIX}{digest[len(storage.CHECKSUM_PREFIX) :][:16]}.arrow"
        write(storage.join(prefix, new_table), data, storage_options=storage_options)
        ref = {
            "path": new_table,
            "format": TABLE_FORMAT,
            "rows": manifest.num_shards,
            "bytes": len(data),
            "checksum": digest,
        }
        header = canonical_json(manifest.header_dict(ref)).encode()
        write(url, header, storage_options=storage_options)
    else:
        raise ValueError(f"format_version must be one of {READ_VERSIONS}, got {format_version}")
    if old_table is not None and old_table != new_table:
        storage.delete(storage.join(prefix, old_table), storage_options=storage_options)
    return url


def manifest_files(prefix: str, *, storage_options: dict[str, Any] | None = None) -> list[str]:
    """The committed manifest's files, relative to the prefix: ``manifest.json`` and (version 2)
    its shard table. Copied together into a local directory they open with
    ``read_manifest(directory)``: how a node can fetch a manifest once for all its ranks."""
    table = _committed_table(prefix, storage_options)
    return [MANIFEST_NAME] if table is None else [MANIFEST_NAME, table]


def delete_manifest(prefix: str, *, storage_options: dict[str, Any] | None = None) -> None:
    """Un-commit the dataset at ``prefix``: the header first, then the shard table it names."""
    table = _committed_table(prefix, storage_options)
    storage.delete(manifest_url(prefix), storage_options=storage_options)
    if table is not None:
        storage.delete(storage.join(prefix, table), storage_options=storage_options)
