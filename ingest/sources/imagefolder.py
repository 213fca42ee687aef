"""ImageFolder: ``root/<class>/<image>``; class folders, sorted, become integer labels."""

from __future__ import annotations

from typing import Any

from .base import (
    IMAGE_EXTS,
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

__all__ = ["IMAGEFOLDER", "read_imagefolder_item", "scan_imagefolder"]


def image_field(name: str) -> str | None:
    """The field an image file lands in (``a.JPEG`` -> ``jpg``), None if not an image."""
    if "." not in name or name.rsplit("/", 1)[-1].startswith("."):
        return None
    ext = name.rsplit(".", 1)[-1].lower()
    if ext not in IMAGE_EXTS:
        return None
    return "jpg" if ext == "jpeg" else ext


def scan_imagefolder(
    url: str, ctx: StorageContext, files: list[tuple[str, int]] | None = None
) -> SourceScan:
    """Items and labels of an ImageFolder; ``files``: its listing when already made."""
    files = list_sized(url, ctx) if files is None else files
    if not files:
        raise missing_source(url)
    root = source_root(url)
    entries: list[tuple[str, str, str, int]] = []
    for path, size in files:
        rel = relative_key(path, root)
        parts = rel.split("/")
        field = image_field(rel)
        if len(parts) < 2 or field is None or any(p.startswith(".") for p in parts):
            continue
        entries.append((parts[0], path, field, size))
    if not entries:
        raise ValueError(
            f"{url} holds no images in class folders; an ImageFolder source looks like "
            "ROOT/<class>/<image>.jpg"
        )
    classes = tuple(sorted({c for c, _, _, _ in entries}))
    label = {c: i for i, c in enumerate(classes)}
    items = [
        Item(
            index=i, source=path, size=size, ref={"url": path, "field": field, "label": label[cls]}
        )
        for i, (cls, path, field, size) in enumerate(entries)
    ]
    fields = {f: "image" for f in sorted({e[2] for e in entries})}
    fields["cls"] = "int"
    return SourceScan(
        format="imagefolder",
        items=items,
        fields=fields,
        classes=classes,
        description={"classes": len(classes)},
    )


def read_imagefolder_item(item: Item, ctx: StorageContext, cache: dict[str, Any]) -> Record:
    data = read_listed(item.ref["url"], ctx)
    return {item.ref["field"]: data, "cls": item.ref["label"]}


IMAGEFOLDER = FolderFormat("imagefolder", image_field, scan_imagefolder, read_imagefolder_item)
