"""WebDataset tar shards (``.tar``, gzip-compressed ``.tgz``/``.tar.gz``) to re-shard.

Scanning reads each input shard once (one Ray task per shard) and records where every
member's bytes lie; hostile members (absolute paths, ``..``, links, devices) are refused and
named in the rejects. Uncompressed shards are then read per sample with one ranged read;
compressed ones are decompressed once per task that needs them.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from functools import partial
from typing import Any

from flashfeed.format.tarshard import StrictTarInfo, TarHeaderError
from flashfeed.format.wdsindex import split_name

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

__all__ = ["TAR_SUFFIXES", "WEBDATASET", "member_problem", "read_wds_item", "scan_wds", "to_value"]

TAR_SUFFIXES = (".tar", ".tgz", ".tar.gz")


def member_problem(m: tarfile.TarInfo) -> str | None:
    """Why a tar member is refused (it names the member), or None if it is a plain file."""
    name = m.name
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        shown = name.encode("utf-8", "surrogateescape")
        return f"member name {shown!r} is not UTF-8; refused"
    if m.issym() or m.islnk():
        return f"member {name!r} is a link to {m.linkname!r}; links are refused"
    if m.ischr() or m.isblk() or m.isfifo() or not (m.isfile() or m.isdir()):
        return f"member {name!r} is a device, fifo or other special file; refused"
    if name.startswith("/") or (len(name) > 2 and name[1] == ":" and name[2] in "/\\"):
        return f"member {name!r} has an absolute path; refused"
    if ".." in name.replace("\\", "/").split("/"):
        return f"member {name!r} contains '..'; refused"
    return None


def _scan_one(url: str, ctx: StorageContext) -> dict[str, Any]:
    data = read(url, ctx)
    compressed = data[:2] == b"\x1f\x8b"
    samples: dict[str, list[tuple[str, int, int]]] = {}
    order: list[str] = []
    rejects: list[tuple[str, str, str]] = []
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r|*", tarinfo=StrictTarInfo) as tar:
            for m in tar:
                problem = member_problem(m)
                if problem is not None:
                    rejects.append((f"{url}:{m.name}", "hostile_member", problem))
                    continue
                if m.isdir():
                    continue
                name = m.name[2:] if m.name.startswith("./") else m.name
                key, ext = split_name(name)
                if not ext or not key:
                    continue
                if key not in samples:
                    samples[key] = []
                    order.append(key)
                if any(e == ext for e, _, _ in samples[key]):
                    problem = f"member {name!r} repeats a member of sample {key!r}; refused"
                    rejects.append((f"{url}:{name}", "duplicate_member", problem))
                    continue
                samples[key].append((ext, m.offset_data, m.size))
    except TarHeaderError as exc:
        raise ValueError(f"{url}: a truncated or corrupt tar shard ({exc})") from None
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ValueError(f"{url}: not a readable tar shard ({exc})") from None
    return {
        "url": url,
        "compressed": compressed,
        "samples": [(k, samples[k]) for k in order],
        "rejects": rejects,
    }


def scan_wds(url: str, ctx: StorageContext, mapper: Mapper) -> SourceScan:
    listed = list_sized(url, ctx)
    if not listed:
        raise missing_source(url)
    shards = [p for p, _ in listed if p.lower().endswith(TAR_SUFFIXES)]
    if not shards:
        raise ValueError(f"{url} holds no WebDataset shards ({', '.join(TAR_SUFFIXES)})")
    items: list[Item] = []
    rejects: list[RejectInfo] = []
    exts: set[str] = set()
    for found in mapper(partial(_scan_one, ctx=ctx), shards):
        for source, reason, problem in found["rejects"]:
            rejects.append(RejectInfo(-1, source, reason, problem))
        for key, members in found["samples"]:
            exts.update(e for e, _, _ in members)
            items.append(
                Item(
                    index=len(items),
                    source=f"{found['url']}:{key}",
                    size=sum(s for _, _, s in members) + 512 * len(members),
                    ref={
                        "url": found["url"],
                        "key": key,
                        "members": members,
                        "compressed": found["compressed"],
                    },
                )
            )
    fields = {e: kind_of_ext(e) for e in sorted(exts)}
    return SourceScan(
        format="webdataset",
        items=items,
        fields=fields,
        rejects=rejects,
        description={"shards": len(shards)},
    )


def to_value(ext: str, data: bytes, kind: str) -> Any:
    """A member's bytes as the Record value of its kind."""
    try:
        if kind == "text":
            return data.decode("utf-8")
        if kind == "int":
            return int(data.decode("ascii").strip())
        if kind == "json":
            text = data.decode("utf-8")
            json.loads(text)
            return text
    except (UnicodeDecodeError, ValueError) as exc:
        raise Reject("bad_value", f"field {ext!r} is not valid {kind} ({exc})") from None
    return data


def read_wds_item(item: Item, ctx: StorageContext, cache: dict[str, Any]) -> Record:
    url, members = item.ref["url"], item.ref["members"]
    if item.ref["compressed"]:
        if cache.get("wds_url") != url:
            cache["wds_url"] = url
            cache["wds_data"] = gzip.decompress(read(url, ctx))
        blob, base = cache["wds_data"], 0
    else:
        base = min(off for _, off, _ in members)
        end = max(off + size for _, off, size in members)
        blob = read(url, ctx, start=base, end=end)
    record: Record = {}
    for ext, off, size in members:
        data = bytes(blob[off - base : off - base + size])
        record[ext] = to_value(ext, data, kind_of_ext(ext))
    return record


class WebDatasetFormat:
    name = "webdataset"
    options: tuple[SourceOption, ...] = ()

    def detect(self, url: str, listing: Listing) -> bool:
        return listing.any_endswith(TAR_SUFFIXES)

    def scan(
        self,
        url: str,
        ctx: StorageContext,
        *,
        fields: dict[str, str],
        options: dict[str, str],
        mapper: Mapper,
    ) -> SourceScan:
        return scan_wds(url, ctx, mapper)

    def open_reader(self, shared: dict[str, Any]) -> SourceReader:
        return FunctionReader(read_wds_item, shared)


WEBDATASET = WebDatasetFormat()
