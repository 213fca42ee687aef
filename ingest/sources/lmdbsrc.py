"""LMDB: key -> value records. ``raw`` values become one field (its kind sniffed from the
bytes: jpg, png, or bin); ``json`` values are objects of fields, like a JSONL row."""

from __future__ import annotations

import json
import os
from typing import Any

from flashfeed import storage

from .base import Item, Mapper, Record, Reject, SourceScan, StorageContext, kind_of_ext
from .format import Listing, SourceOption

__all__ = ["LMDB", "LmdbReader", "scan_lmdb", "sniff_field"]

DECODERS = ("raw", "json")


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


def scan_lmdb(url: str, ctx: StorageContext, decoder: str) -> SourceScan:
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
    return SourceScan(
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


class LmdbReader:
    """Reads records back by key; the LMDB environment is opened on the first read and
    closed by ``close``."""

    def __init__(self, shared: dict[str, Any]) -> None:
        self._shared = shared
        self._env: Any = None

    def read(self, item: Item, ctx: StorageContext) -> Record:
        shared = self._shared
        if self._env is None:
            self._env = _open(shared["path"])
        with self._env.begin() as txn:
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

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None


class LmdbFormat:
    name = "lmdb"
    options = (
        SourceOption(
            "decoder",
            DECODERS,
            "raw",
            "how LMDB values become fields (default: raw bytes)",
        ),
    )

    def detect(self, url: str, listing: Listing) -> bool:
        """A local ``data.mdb`` folder or an ``.mdb``/``.lmdb`` file: decided without listing."""
        if not storage.is_local(url):
            return False
        path = os.path.abspath(os.path.expanduser(url[7:] if url.startswith("file://") else url))
        return os.path.isfile(os.path.join(path, "data.mdb")) or path.endswith((".mdb", ".lmdb"))

    def scan(
        self,
        url: str,
        ctx: StorageContext,
        *,
        fields: dict[str, str],
        options: dict[str, str],
        mapper: Mapper,
    ) -> SourceScan:
        return scan_lmdb(url, ctx, options["decoder"])

    def open_reader(self, shared: dict[str, Any]) -> LmdbReader:
        return LmdbReader(shared)


LMDB = LmdbFormat()
