"""What every source gives the shard assignment (items) and the shard tasks (records).

An ``Item`` is one future sample: its position in source order (its identity and key), a
human-readable origin for error messages and rejects, an estimated size for shard
assignment, and the small reference its reader needs. A ``Record`` is the sample read
back: field -> value.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any

from flashfeed import storage
from flashfeed.format.media import IMAGE_EXTS
from flashfeed.format.video import VIDEO_EXTS

__all__ = [
    "IMAGE_EXTS",
    "Item",
    "ItemRows",
    "Mapper",
    "Record",
    "Reject",
    "RejectInfo",
    "SourceScan",
    "StorageContext",
    "item_rows",
    "kind_of_ext",
    "serial_map",
]

Record = dict[str, Any]
Mapper = Callable[[Callable[[Any], Any], list[Any]], Iterable[Any]]

_TEXT_EXTS = frozenset({"txt", "text", "caption"})
_INT_EXTS = frozenset({"cls", "label"})

#: field kinds: how a value is typed in a Record, in Arrow, and in a tar member
KINDS = ("image", "bytes", "text", "int", "float", "json", "video")


def kind_of_ext(ext: str) -> str:
    """The kind of a WebDataset-style field from its extension (``jpg`` -> ``image``)."""
    last = ext.lower().rsplit(".", 1)[-1]
    if last in IMAGE_EXTS:
        return "image"
    if last in VIDEO_EXTS:
        return "video"
    if last in _TEXT_EXTS:
        return "text"
    if last in _INT_EXTS:
        return "int"
    if last == "json":
        return "json"
    return "bytes"


@dataclass(frozen=True)
class Item:
    index: int
    source: str
    size: int
    ref: dict[str, Any] = field(default_factory=dict)


def item_from_row(values: tuple[Any, ...]) -> Item:
    """An ``Item`` from its row ``(index, source, size, ref)``, made as pickle makes one:
    its fields set without the frozen class's ``__init__`` (four ``object.__setattr__``)."""
    item = object.__new__(Item)
    item.__dict__.update(zip(_ITEM_FIELDS, values, strict=True))
    return item


_ITEM_FIELDS = tuple(f.name for f in fields(Item))
_item_fields = attrgetter(*_ITEM_FIELDS)


class ItemRows(Sequence[Item]):
    """Items as plain rows ``(index, source, size, ref)`` (how a shard job ships them), each
    made an ``Item`` only when asked for: a reader that takes the rows needs none."""

    __slots__ = ("packed", "rows")

    def __init__(self, rows: list[tuple[Any, ...]], packed: bytes | None = None) -> None:
        self.rows = rows
        #: the rows pickled already (the driver's fingerprint of a shard), shipped as they are
        self.packed = packed

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return tuple(map(item_from_row, self.rows[i]))
        return item_from_row(self.rows[i])

    def __iter__(self) -> Iterator[Item]:
        return map(item_from_row, self.rows)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(tuple(self))


def item_rows(items: Sequence[Item]) -> list[tuple[Any, ...]]:
    """The rows of ``items``: an ``ItemRows``'s own, else one tuple per item."""
    return items.rows if isinstance(items, ItemRows) else list(map(_item_fields, items))


@dataclass(frozen=True)
class RejectInfo:
    """One skipped sample: where it came from and why (a manifest ``skipped`` reason)."""

    index: int
    source: str
    reason: str
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "source": self.source,
            "reason": self.reason,
            "detail": self.detail,
        }


class Reject(Exception):
    """Raised by readers and transforms: skip this sample, count it under ``reason``."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass
class SourceScan:
    """What scanning a source found: the items in source order, their fields, and rejects
    already known (hostile tar members, for one)."""

    format: str
    items: Sequence[Item]
    fields: dict[str, str]
    classes: tuple[str, ...] | None = None
    rejects: list[RejectInfo] = field(default_factory=list)
    description: dict[str, Any] = field(default_factory=dict)
    shared: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StorageContext:
    """Storage options per URL, resolved on the driver and shipped to every task (Ray
    workers may not share the driver's environment). Never printed nor written anywhere."""

    s3: dict[str, Any] | None = None

    def options(self, url: str) -> dict[str, Any] | None:
        return None if storage.is_local(url) else self.s3

    @classmethod
    def resolve(cls, user: dict[str, Any] | None) -> StorageContext:
        opts = storage.env_storage_options()
        opts.update(user or {})
        return cls(s3=opts or None)


def serial_map(fn: Callable[[Any], Any], args: list[Any]) -> Iterator[Any]:
    """The in-process ``Mapper``: the runner passes a Ray-parallel one instead."""
    return (fn(a) for a in args)


def relative_key(path: str, root: str) -> str:
    """``path`` relative to ``root``, with forward slashes."""
    rel = path[len(root.rstrip("/")) :].lstrip("/")
    return rel.replace("\\", "/")


def list_sized(url: str, ctx: StorageContext) -> list[tuple[str, int]]:
    """Every file under ``url`` with its size, as full URLs, sorted. Empty if none."""
    opts = ctx.options(url)
    fs, path = storage.filesystem(url, opts)
    local = storage.is_local(url)

    def op() -> list[tuple[str, int]]:
        if not local:
            fs.invalidate_cache()
        if not fs.exists(path):
            return []
        if fs.isfile(path):
            return [(path, int(fs.size(path)))]
        found = fs.find(path, detail=True)
        return sorted((p, int(info.get("size") or 0)) for p, info in found.items())

    found = storage.call(op, url=url, what="list", storage_options=opts)
    if local:
        return found
    protocol = url.split("://", 1)[0]
    return [(f"{protocol}://{p}", s) for p, s in found]


def read(
    url: str, ctx: StorageContext, *, start: int | None = None, end: int | None = None
) -> bytes:
    """The bytes of a source file, or the range ``[start, end)``. A whole local file is
    read with one ``open``: fsspec's local layer costs about a third of a photo's read."""
    if start is None and end is None and storage.is_local(url):
        path = os.path.expanduser(url[7:] if url.startswith("file://") else url)
        return storage.call(lambda: _read_file(path), url=url, what="read")
    return storage.read_bytes(url, start=start, end=end, storage_options=ctx.options(url))


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def read_listed(url: str, ctx: StorageContext) -> bytes:
    """A file the scan listed; one that has gone since is a counted ``missing_media`` skip."""
    try:
        return read(url, ctx)
    except FileNotFoundError:
        raise Reject("missing_media", f"{url} vanished after listing") from None


def missing_source(url: str) -> FileNotFoundError:
    return FileNotFoundError(f"source {url} does not exist (or holds no files)")


def source_root(url: str) -> str:
    """The prefix that listed paths start with: an absolute path for local sources."""
    if storage.is_local(url):
        path = url[7:] if url.startswith("file://") else url
        return os.path.abspath(os.path.expanduser(path))
    return url.rstrip("/")
