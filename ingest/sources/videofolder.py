"""A folder of videos: every ``*.mp4``/``*.webm``/... file under the root is one sample,
its field named by its extension; ingest probes each (``<field>.json`` beside it)."""

from __future__ import annotations

from typing import Any

from flashfeed.format.video import VIDEO_EXTS

from .base import (
    Item,
    Record,
    SourceScan,
    StorageContext,
    list_sized,
    missing_source,
    read_listed,
    relative_key,
    source_root,
)
from .format import FolderFormat

__all__ = ["VIDEOFOLDER", "video_field"]


def video_field(name: str) -> str | None:
    """The field a video file lands in (``a.MP4`` -> ``mp4``), None if not a video."""
    base = name.rsplit("/", 1)[-1]
    if "." not in base or base.startswith("."):
        return None
    ext = base.rsplit(".", 1)[-1].lower()
    return ext if ext in VIDEO_EXTS else None


def scan_videofolder(
    url: str, ctx: StorageContext, files: list[tuple[str, int]] | None = None
) -> SourceScan:
    """Items of a folder of videos; ``files``: its listing when already made."""
    files = list_sized(url, ctx) if files is None else files
    if not files:
        raise missing_source(url)
    root = source_root(url)
    entries = [
        (path, field, size)
        for path, size in files
        if (field := video_field(relative_key(path, root))) is not None
        and not any(p.startswith(".") for p in relative_key(path, root).split("/"))
    ]
    if not entries:
        raise ValueError(f"{url} holds no videos ({', '.join(VIDEO_EXTS)})")
    items = [
        Item(index=i, source=path, size=size, ref={"url": path, "field": field})
        for i, (path, field, size) in enumerate(entries)
    ]
    fields = {f: "video" for f in sorted({f for _, f, _ in entries})}
    return SourceScan(
        format="videofolder", items=items, fields=fields, description={"videos": len(items)}
    )


def read_videofolder_item(item: Item, ctx: StorageContext, cache: dict[str, Any]) -> Record:
    data = read_listed(item.ref["url"], ctx)
    return {item.ref["field"]: data}


VIDEOFOLDER = FolderFormat("videofolder", video_field, scan_videofolder, read_videofolder_item)
