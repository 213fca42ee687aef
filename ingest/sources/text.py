"""Text corpora (``--source-format text``): JSONL, JSONL.gz, JSONL.zst and Parquet files
whose documents are one text column, read as field ``txt``.

Unlike the table formats, nothing of a document is held on the driver: the scan runs one
Ray task per partition (a byte range of a plain JSONL file, a whole compressed file, a
Parquet row group; see ``textparts``), and each item only names its partition and ordinal.
Bad records are counted skips with a reason (``invalid_utf8``, ``lone_surrogate``,
``bad_json``, ``not_an_object``, ``missing_text``, ``empty_text``, ``too_large``,
``truncated_file``, ``corrupt_parquet``); a UTF-8 byte-order mark before a line is dropped.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from flashfeed import storage
from flashfeed.units import parse_size

from .base import (
    Item,
    Mapper,
    Record,
    Reject,
    RejectInfo,
    SourceScan,
    StorageContext,
    list_sized,
    missing_source,
)
from .format import FunctionReader, Listing, SourceOption, SourceReader
from .textparts import Part, file_kind, plan_ranges, read_part

__all__ = ["DEFAULT_MAX_DOC_BYTES", "TEXT", "TextFormat", "read_text_item", "scan_text"]

DEFAULT_MAX_DOC_BYTES = "16MiB"
DEFAULT_PART_BYTES = "64MiB"
TEXT_FIELD = "txt"


def _column(value: str) -> str:
    if not value.strip():
        raise ValueError(f"the text column must be a non-empty name, got {value!r}")
    return value


def _size(value: str) -> int:
    n = parse_size(value, name="size")
    if n <= 0:
        raise ValueError(f"must be > 0, got {value!r}")
    return n


def _row_groups(url: str, ctx: StorageContext) -> int | str:
    """How many row groups a Parquet file has (from its footer), or why it is unreadable."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    fs, path = storage.filesystem(url, ctx.options(url))
    try:
        with fs.open(path, "rb") as f:
            return int(pq.ParquetFile(f).metadata.num_row_groups)
    except (pa.ArrowException, OSError, ValueError) as exc:
        return f"not a readable Parquet file ({type(exc).__name__}: {exc})"


def _scan_part(part: Part, ctx: StorageContext, column: str, limit: int) -> dict[str, Any]:
    """One partition's good documents ``(ordinal, source, bytes)`` and rejects."""
    docs, rejects = [], []
    for d in read_part(part, ctx, column=column, limit=limit):
        if d.text is None:
            rejects.append((d.source, d.reason, d.detail))
        else:
            docs.append((d.n, d.source, len(d.text)))
    return {"docs": docs, "rejects": rejects}


def plan_parts(
    files: list[tuple[str, int]], row_groups: dict[str, int | str], part_bytes: int
) -> tuple[list[Part], list[RejectInfo]]:
    """Every partition of the corpus, in file order; unreadable Parquet files as rejects."""
    parts: list[Part] = []
    rejects: list[RejectInfo] = []
    for url, size in files:
        kind = file_kind(url)
        if kind == "jsonl":
            parts += plan_ranges(url, size, part_bytes)
        elif kind in ("gzip", "zstd"):
            parts.append(Part(url, kind, 0, size, size=size))
        elif kind == "parquet":
            groups = row_groups[url]
            if isinstance(groups, str):
                rejects.append(RejectInfo(-1, url, "corrupt_parquet", groups))
            else:
                parts += [Part(url, "parquet", row_group=g) for g in range(groups)]
    return parts, rejects


def scan_text(
    url: str,
    ctx: StorageContext,
    *,
    fields: dict[str, str],
    options: dict[str, str],
    mapper: Mapper,
) -> SourceScan:
    if fields:
        raise ValueError(
            "the text format reads one column into field txt: name it with --text-column "
            "(source_options={'text': {'column': NAME}}), not with fields"
        )
    column = _column(options["column"])
    limit = _size(options["max_doc_bytes"])
    part_bytes = _size(options["part_bytes"])
    listed = list_sized(url, ctx)
    if not listed:
        raise missing_source(url)
    files = [(p, s) for p, s in listed if file_kind(p) is not None]
    if not files:
        raise ValueError(
            f"{url} holds no text corpus files (.jsonl, .ndjson, .jsonl.gz, .jsonl.zst, .parquet)"
        )
    pq_files = [p for p, _ in files if file_kind(p) == "parquet"]
    groups = dict(zip(pq_files, mapper(partial(_row_groups, ctx=ctx), pq_files), strict=True))
    parts, rejects = plan_parts(files, groups, part_bytes)
    items: list[Item] = []
    scans = mapper(partial(_scan_part, ctx=ctx, column=column, limit=limit), parts)
    for k, found in enumerate(scans):
        rejects += [RejectInfo(-1, s, r, d) for s, r, d in found["rejects"]]
        for n, source, size in found["docs"]:
            items.append(Item(index=len(items), source=source, size=size, ref={"p": k, "n": n}))
    kinds = {p.kind for p in parts}
    return SourceScan(
        format="text",
        items=items,
        fields={TEXT_FIELD: "text"},
        rejects=rejects,
        description={
            "files": len(files),
            "partitions": len(parts),
            "column": column,
            "kinds": sorted(kinds),
        },
        shared={"parts": parts, "column": column, "limit": limit},
    )


def read_text_item(item: Item, ctx: StorageContext, cache: dict[str, Any]) -> Record:
    """One document, from its partition (read once per task while its items come in order)."""
    shared = cache["shared"]
    k = item.ref["p"]
    if cache.get("part") != k:
        docs = read_part(shared["parts"][k], ctx, column=shared["column"], limit=shared["limit"])
        cache["part"] = k
        cache["docs"] = {d.n: d.text for d in docs if d.text is not None}
    text = cache["docs"].get(item.ref["n"])
    if text is None:
        raise Reject("source_changed", f"{item.source} is no longer the document the scan saw")
    return {TEXT_FIELD: text}


class TextFormat:
    """``text``: one document per JSONL line or Parquet row, partitioned for Ray."""

    name = "text"
    options: tuple[SourceOption, ...] = (
        SourceOption(
            "column",
            (),
            "text",
            "text format: the JSON field / Parquet column holding the text (text)",
            _column,
        ),
        SourceOption(
            "max_doc_bytes",
            (),
            DEFAULT_MAX_DOC_BYTES,
            f"text format: skip (and count, too_large) longer documents ({DEFAULT_MAX_DOC_BYTES})",
            _size,
        ),
        SourceOption(
            "part_bytes",
            (),
            DEFAULT_PART_BYTES,
            "text format: bytes of plain JSONL per Ray task "
            f"({DEFAULT_PART_BYTES}); a compressed file is one task, Parquet one per row group",
            _size,
        ),
    )

    def detect(self, url: str, listing: Listing) -> bool:
        return any(file_kind(p) in ("gzip", "zstd") for p in listing.paths)

    def scan(
        self,
        url: str,
        ctx: StorageContext,
        *,
        fields: dict[str, str],
        options: dict[str, str],
        mapper: Mapper,
    ) -> SourceScan:
        return scan_text(url, ctx, fields=fields, options=options, mapper=mapper)

    def open_reader(self, shared: dict[str, Any]) -> SourceReader:
        return FunctionReader(read_text_item, shared)


TEXT = TextFormat()
