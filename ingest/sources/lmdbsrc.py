"""LMDB: key -> value records. ``raw`` values become one field (its kind sniffed from the
bytes: jpg, png, or bin); ``json`` values are objects of fields, like a JSONL row."""

from __future__ import annotations

import json
import os
from typing import Any

from flashfeed import storage

from .base import Item, Record, Reject, SourcePlan, StorageContext, kind_of_ext

__all__ = ["read_lmdb_item", "scan_lmdb", "sniff_field"]


def sniff_field(value: bytes) -> str:
    if value[:3] == b"\xff\xd8\xff":
        return "jpg"
    if value[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if value[:4] == b"RIFF" and value[8:12] == b"WEBP":
        return "webp"
    return "bin"


def _open(path: str) -> Any:
    import lmdb

    return lmdb.open(
        path,
        readonly=True,
        lock=False,
        readahead=False,
        subdir=os.path.isdir(path),
        max_readers=512,
    )


def _local_path(url: str) -> str:
    if not storage.is_local(url):
        raise ValueError(
            f"{url}: an LMDB source must be a local path (LMDB maps its file into memory); "
            "copy it to local disk first"
        )
    path = url[7:] if url.startswith("file://") else url
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.exists(path):
        raise FileNotFoundError(f"source {url} does not exist")
    return path


def scan_lmdb(url: str, ctx: StorageContext, decoder: str) -> SourcePlan:
    path = _local_path(url)
    env = _open(path)
    items: list[Item] = []
    fields: dict[str, str] = {}
    try:
        with env.begin() as txn:
            for key, value in txn.cursor():
                k = bytes(key)
                shown = k.decode("utf-8", "backslashreplace")
                if decoder == "json":
                    try:
                        row = json.loads(bytes(value))
                    except ValueError as exc:
                        raise ValueError(f"{url}: key {shown!r}: not JSON ({exc})") from None
                    if not isinstance(row, dict):
                        raise ValueError(f"{url}: key {shown!r}: a JSON object is needed")
                    for name, v in row.items():
                        fields.setdefault(name, _json_kind(name, v))
                else:
                    fields.setdefault(sniff_field(bytes(value[:16])), "bytes")
                items.append(
                    Item(
                        index=len(items),
                        source=f"{url}#{shown}",
                        size=len(value),
                        ref={"key": k.hex()},
                    )
                )
    finally:
        env.close()
    if not items:
        raise ValueError(f"{url}: the LMDB source has no records")
    if decoder == "raw":
        fields = {f: kind_of_ext(f) if f != "bin" else "bytes" for f in fields}
    return SourcePlan(
        format="lmdb",
        items=items,
        fields=dict(sorted(fields.items())),
        description={"decoder": decoder},
        shared={"path": path, "decoder": decoder, "kinds": fields},
    )


def _json_kind(name: str, v: Any) -> str:
    kind = kind_of_ext(name)
    if kind != "bytes":
        return kind
    if isinstance(v, bool | int):
        return "int"
    if isinstance(v, float):
        return "float"
    return "text" if isinstance(v, str) else "json"


def read_lmdb_item(item: Item, ctx: StorageContext, cache: dict[str, Any]) -> Record:
    shared = cache["shared"]
    if "lmdb_env" not in cache:
        cache["lmdb_env"] = _open(shared["path"])
    with cache["lmdb_env"].begin() as txn:
        value = txn.get(bytes.fromhex(item.ref["key"]))
    if value is None:
        raise Reject("missing_media", "key vanished from the LMDB after listing")
    value = bytes(value)
    if shared["decoder"] == "raw":
        return {sniff_field(value[:16]): value}
    row = json.loads(value)
    out: Record = {}
    for name, v in row.items():
        kind = shared["kinds"].get(name, "json")
        out[name] = json.dumps(v) if kind == "json" else v
    return out
