"""The ``SourceFormat`` protocol: what one source format gives ingest.

A format knows how to tell itself from what lies at a URL (``detect``), how to list a
corpus into ``Item``s on the driver (``scan``), and how to read an item back inside a shard
task (``open_reader``). Options of its own (``SourceOption``) reach the CLI as
``--<format>-<option>`` and the config as ``source_options={"<format>": {...}}``.

A new format is one module that defines a ``SourceFormat`` and one line in the registry
table of ``ingest.sources``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .base import Item, Mapper, Record, SourceScan, StorageContext, list_sized, missing_source

__all__ = [
    "FolderFormat",
    "FunctionReader",
    "Listing",
    "SourceFormat",
    "SourceOption",
    "SourceReader",
]


@dataclass(frozen=True)
class SourceOption:
    """One option of one format: a choice among fixed values, or (no ``choices``) any value
    that ``check`` accepts (it raises ``ValueError`` naming what is wrong)."""

    name: str
    choices: tuple[str, ...]
    default: str
    help: str
    check: Callable[[str], object] | None = None


class SourceReader(Protocol):
    """Reads items back in one task; ``close`` frees what it holds (files, handles)."""

    def read(self, item: Item, ctx: StorageContext) -> Record: ...

    def close(self) -> None: ...


class Listing:
    """The files at a URL, listed once and only when a format's ``detect`` asks; a folder
    format then scans the same listing instead of walking the source again."""

    def __init__(self, url: str, ctx: StorageContext) -> None:
        self.url = url
        self.ctx = ctx
        self._sized: list[tuple[str, int]] | None = None
        self._paths: list[str] | None = None

    @property
    def sized(self) -> list[tuple[str, int]]:
        """Every listed file with its size (``list_sized``); a missing or empty source is
        an error."""
        if self._sized is None:
            self._sized = list_sized(self.url, self.ctx)
            if not self._sized:
                raise missing_source(self.url)
        return self._sized

    @property
    def paths(self) -> list[str]:
        """Every listed path, lowercased; a missing or empty source is an error."""
        if self._paths is None:
            self._paths = [p.lower() for p, _ in self.sized]
        return self._paths

    def any_endswith(self, suffixes: tuple[str, ...]) -> bool:
        return any(p.endswith(suffixes) for p in self.paths)


class SourceFormat(Protocol):
    """One source format. ``name`` is what ``--source-format`` and manifests call it."""

    @property
    def name(self) -> str: ...

    @property
    def options(self) -> tuple[SourceOption, ...]: ...

    def detect(self, url: str, listing: Listing) -> bool: ...

    def scan(
        self,
        url: str,
        ctx: StorageContext,
        *,
        fields: dict[str, str],
        options: dict[str, str],
        mapper: Mapper,
    ) -> SourceScan: ...

    def open_reader(self, shared: dict[str, Any]) -> SourceReader: ...


ReadFn = Callable[[Item, StorageContext, dict[str, Any]], Record]


class FunctionReader:
    """A ``SourceReader`` over a read function that keeps per-task state in a dict (the
    scan's ``shared`` under ``"shared"``, plus whatever the function caches)."""

    def __init__(self, fn: ReadFn, shared: dict[str, Any]) -> None:
        self._fn = fn
        self._cache: dict[str, Any] = {"shared": shared}

    def read(self, item: Item, ctx: StorageContext) -> Record:
        return self._fn(item, ctx, self._cache)

    def close(self) -> None:
        self._cache = {"shared": self._cache["shared"]}


@dataclass(frozen=True)
class FolderFormat:
    """A format that is a folder of files of one kind (``imagefolder``, ``videofolder``): it
    takes no options, is detected when a listed file is of its kind (``field_of`` gives the
    field a file lands in, None for other files), scanned by ``scan_fn`` and read item by item
    by ``read_fn``."""

    name: str
    field_of: Callable[[str], str | None]
    scan_fn: Callable[[str, StorageContext, list[tuple[str, int]] | None], SourceScan]
    read_fn: ReadFn
    options: tuple[SourceOption, ...] = ()

    def detect(self, url: str, listing: Listing) -> bool:
        return any(self.field_of(p) for p in listing.paths)

    def scan(
        self,
        url: str,
        ctx: StorageContext,
        *,
        fields: dict[str, str],
        options: dict[str, str],
        mapper: Mapper,
    ) -> SourceScan:
        return self.scan_fn(url, ctx, None)

    def scan_listed(self, url: str, ctx: StorageContext, listing: Listing) -> SourceScan:
        """The scan over files already listed (by format detection)."""
        return self.scan_fn(url, ctx, listing.sized)

    def open_reader(self, shared: dict[str, Any]) -> SourceReader:
        return FunctionReader(self.read_fn, shared)
