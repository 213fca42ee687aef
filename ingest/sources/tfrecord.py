"""TFRecord files of ``tf.train.Example``: CRCs checked, features mapped to fields."""

from __future__ import annotations

import json
import re
from functools import partial
from typing import Any

from .base import (
    Item,
    Mapper,
    Record,
    Reject,
    RejectInfo,
    SourceScan,
    StorageContext,
    kind_of_ext,
    list_sized,
    missing_source,
    read,
)
from .format import FunctionReader, Listing, SourceOption, SourceReader
from .tfrecord_format import iter_records, parse_example

__all__ = ["TFRECORD", "TFRECORD_SUFFIXES", "read_tfrecord_item", "scan_tfrecord"]

TFRECORD_SUFFIXES = (".tfrecord", ".tfrecords", ".tfrec")
DEFAULT_NAMES = {
    "image/encoded": "jpg",
    "image": "jpg",
    "image/class/label": "cls",
    "label": "cls",
    "text": "txt",
    "caption": "txt",
}
_BAD = re.compile(r"[^A-Za-z0-9_\-]+")


def _scan_one(url: str, ctx: StorageContext) -> dict[str, Any]:
    data = read(url, ctx)
    records: list[tuple[int, int]] = []
    rejects: list[tuple[str, str, str]] = []
    types: dict[str, str] = {}
    for n, (start, length, ok) in enumerate(iter_records(data, source=url)):
        where = f"{url}#{n}"
        if not ok:
            rejects.append((where, "bad_crc", f"data CRC mismatch in record {n} at byte {start}"))
            continue
        try:
            features = parse_example(data[start : start + length])
        except (ValueError, UnicodeDecodeError) as exc:
            rejects.append((where, "bad_record", f"not a tf.train.Example ({exc})"))
            continue
        for k, (t, _) in features.items():
            types.setdefault(k, t)
        records.append((start, length))
    return {"url": url, "records": records, "rejects": rejects, "types": types}


def scan_tfrecord(
    url: str, ctx: StorageContext, mapper: Mapper, fields: dict[str, str]
) -> SourceScan:
    listed = list_sized(url, ctx)
    if not listed:
        raise missing_source(url)
    files = [p for p, _ in listed if p.lower().endswith(TFRECORD_SUFFIXES)]
    if not files:
        raise ValueError(f"{url} holds no TFRecord files ({', '.join(TFRECORD_SUFFIXES)})")
    items: list[Item] = []
    rejects: list[RejectInfo] = []
    types: dict[str, str] = {}
    for found in mapper(partial(_scan_one, ctx=ctx), files):
        for k, t in found["types"].items():
            types.setdefault(k, t)
        rejects += [RejectInfo(-1, s, r, d) for s, r, d in found["rejects"]]
        for n, (start, length) in enumerate(found["records"]):
            items.append(
                Item(
                    index=len(items),
                    source=f"{found['url']}#{n}",
                    size=length,
                    ref={"url": found["url"], "start": start, "length": length},
                )
            )
    if fields:
        unknown = sorted(set(fields.values()) - set(types))
        if unknown:
            raise ValueError(f"{url}: no feature {unknown[0]!r}; the features are {sorted(types)}")
        mapping = dict(fields)
    else:
        mapping = {}
        for k in sorted(types):
            mapping.setdefault(DEFAULT_NAMES.get(k) or _BAD.sub("_", k).strip("_") or "f", k)
    kinds = {}
    for name, feature in mapping.items():
        kind = kind_of_ext(name)
        kinds[name] = kind if kind != "bytes" else types[feature]
    return SourceScan(
        format="tfrecord",
        items=items,
        fields=kinds,
        rejects=rejects,
        description={"files": len(files), "features": mapping},
        shared={"mapping": mapping, "kinds": kinds},
    )


def _value(kind: str, values: list[Any]) -> Any:
    if not values:
        return None
    if len(values) > 1:
        if kind in ("int", "float"):
            return json.dumps(values)
        if kind in ("bytes", "image"):
            raise Reject("bad_value", f"{len(values)} values in a single-valued field")
        return json.dumps([v.decode("utf-8", "replace") for v in values])
    v = values[0]
    if kind == "text":
        try:
            return v.decode("utf-8") if isinstance(v, bytes) else str(v)
        except UnicodeDecodeError:
            raise Reject("bad_value", "text feature is not UTF-8") from None
    if kind == "int":
        return int(v) if not isinstance(v, bytes) else int(v.decode().strip() or 0)
    return v


def read_tfrecord_item(item: Item, ctx: StorageContext, cache: dict[str, Any]) -> Record:
    start, length = item.ref["start"], item.ref["length"]
    data = read(item.ref["url"], ctx, start=start, end=start + length)
    try:
        features = parse_example(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Reject("bad_record", f"not a tf.train.Example ({exc})") from None
    shared = cache["shared"]
    record: Record = {}
    for name, feature in shared["mapping"].items():
        if feature in features:
            record[name] = _value(shared["kinds"][name], features[feature][1])
    return record


class TFRecordFormat:
    name = "tfrecord"
    options: tuple[SourceOption, ...] = ()

    def detect(self, url: str, listing: Listing) -> bool:
        return listing.any_endswith(TFRECORD_SUFFIXES)

    def scan(
        self,
        url: str,
        ctx: StorageContext,
        *,
        fields: dict[str, str],
        options: dict[str, str],
        mapper: Mapper,
    ) -> SourceScan:
        return scan_tfrecord(url, ctx, mapper, fields)

    def open_reader(self, shared: dict[str, Any]) -> SourceReader:
        return FunctionReader(read_tfrecord_item, shared)


TFRECORD = TFRecordFormat()
