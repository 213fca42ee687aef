"""One shard, start to finish: read its items, transform, write tar + ``.idx`` or Arrow,
then a small done-record under ``<dest>/_work/`` that a resumed run trusts after checking
the shard's checksum. Runs inside a Ray task; pure of driver state."""

from __future__ import annotations

import json
import pickle
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from dataclasses import asdict, dataclass, field
from functools import cache
from typing import Any

import pyarrow as pa

from flashfeed import storage
from flashfeed.crypto import EncryptionKey, seal_shard
from flashfeed.format.arrowshard import write_arrow
from flashfeed.format.manifest import ShardInfo
from flashfeed.format.media import LOADER_IMAGE_EXTS, image_size
from flashfeed.format.video import VIDEO_EXTS, member_videos
from flashfeed.runtime.gcpause import gc_paused
from flashfeed.s3.putobject import put_object
from flashfeed.shardio import shard_name, tar_shard_bytes

from .sources import Item, Reject, SourceReader, StorageContext, open_reader
from .sources.base import ItemRows, item_rows
from .sources.tables import TABLE_EXTS
from .taskerrors import in_stage
from .tokenize import shared_packer, tokenizer_threads
from .transforms import TransformOptions, empty_field, table_texts, transform_record

__all__ = [
    "ShardJob",
    "ShardResult",
    "TaskSpec",
    "arrow_type",
    "done_url",
    "run_shard",
    "run_shards",
]

WORK_DIR = "_work"
_ARROW_TYPES = {
    "image": pa.binary(),
    "bytes": pa.binary(),
    "text": pa.string(),
    "int": pa.int64(),
    "float": pa.float64(),
    "json": pa.string(),
    "video": pa.binary(),
}


def arrow_type(kind: str) -> pa.DataType:
    return _ARROW_TYPES[kind]


@dataclass(frozen=True)
class TaskSpec:
    """What every shard task shares."""

    dest: str
    source_format: str
    out_format: str
    kinds: dict[str, str]
    out_fields: dict[str, str]
    transform: TransformOptions
    shared: dict[str, Any]
    ctx: StorageContext
    tokenizer: str | None = None
    seq_len: int | None = None
    eos_token: str | None = None
    packing: str = "concat"
    pack_window: int = 4096
    text_field: str | None = None
    encryption: EncryptionKey | None = None
    special_tokens: str = "text"
    #: the tokenizer may run on every core: the run has fewer tasks than CPUs
    parallel_tokenizer: bool = False


@dataclass(frozen=True)
class ShardJob:
    """One shard to make. ``recorded``: a done-record of an earlier run may be there (the
    driver's one listing of ``_work/`` found one), so the task checks it before building."""

    number: int
    items: Sequence[Item]
    fingerprint: str
    recorded: bool = True

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled as plain tuples: a dataclass per item would cost the pickler (Ray's
        cloudpickle) a Python call per item, a tenth of the tokenizer's time on short
        documents."""
        items = self.items
        if isinstance(items, ItemRows) and items.packed is not None:
            return _unpacked_job, (self.number, items.packed, self.fingerprint, self.recorded)
        return _job, (self.number, item_rows(self.items), self.fingerprint,
                      self.recorded)  # fmt: skip


def _job(number: int, items: list[tuple[Any, ...]], fingerprint: str, recorded: bool) -> ShardJob:
    return ShardJob(number, ItemRows(items), fingerprint, recorded)


def _unpacked_job(number: int, packed: bytes, fingerprint: str, recorded: bool) -> ShardJob:
    """A job whose rows the driver pickled once for its fingerprint and shipped as bytes."""
    return ShardJob(number, ItemRows(pickle.loads(packed)), fingerprint, recorded)


@dataclass
class ShardResult:
    number: int
    info: dict[str, Any] | None
    rejects: list[dict[str, Any]] = field(default_factory=list)
    bytes_in: int = 0
    stats: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    reused: bool = False
    plaintext: dict[str, Any] | None = None
    #: the shard's image widths and heights, one per sample (tar shards with images)
    image_sizes: list[list[int]] | None = None
    #: the shard's video probes, one per sample (None: no video there; tar shards)
    videos: list[dict[str, Any] | None] | None = None

    def shard_info(self) -> ShardInfo | None:
        return ShardInfo(**self.info) if self.info else None


def done_url(dest: str, number: int) -> str:
    return storage.join(dest, WORK_DIR, f"shard-{number:06d}.json")


def _reusable(spec: TaskSpec, job: ShardJob) -> ShardResult | None:
    """The finished shard's result if its done-record matches and its bytes check out."""
    url = done_url(spec.dest, job.number)
    opts = spec.ctx.options(url)
    try:
        record = json.loads(storage.read_bytes(url, storage_options=opts))
    except (FileNotFoundError, ValueError):
        return None
    if record.get("fingerprint") != job.fingerprint:
        return None
    result = ShardResult(**record["result"])
    if result.info is not None:
        shard_url = storage.join(spec.dest, result.info["path"])
        try:
            data = storage.read_bytes(shard_url, storage_options=opts)
        except FileNotFoundError:
            return None
        if storage.checksum(data) != result.info["checksum"]:
            return None
        index = result.info.get("index")
        if index and not storage.exists(storage.join(spec.dest, index), storage_options=opts):
            return None
    result.reused = True
    return result


def _samples(
    spec: TaskSpec, job: ShardJob, result: ShardResult, reader: SourceReader | None = None
) -> Iterator[tuple[Item, dict, dict[str, tuple[int, int]]]]:
    """Read and transform the shard's items, in assigned order, each with the sizes of the
    images the transform opened; rejects go to ``result``. ``reader``: one the caller
    keeps open across its shards (what it read for one shard serves the next)."""
    own = reader is None
    if reader is None:
        reader = open_reader(spec.source_format, spec.shared)
    t_read = t_transform = 0.0
    items = tuple(job.items)
    by_source = sorted(range(len(items)), key=lambda i: items[i].index)
    records: list[tuple[dict, dict[str, tuple[int, int]]] | None] = [None] * len(items)
    read, ctx, clock = reader.read, spec.ctx, time.perf_counter
    kinds, opts = spec.kinds, spec.transform
    nbytes = 0
    t0 = clock()
    try:
        for i in by_source:
            item = items[i]
            try:
                with in_stage("shard", item.source):
                    raw = read(item, ctx)
                    nbytes += _nbytes(raw)
                    t1 = clock()
                    t_read += t1 - t0
                    sizes: dict[str, tuple[int, int]] = {}
                    records[i] = (transform_record(raw, kinds, opts, sizes=sizes), sizes)
                    t0 = clock()
                    t_transform += t0 - t1
            except Reject as r:
                t0 = clock()
                records[i] = None
                result.rejects.append(
                    {
                        "index": item.index,
                        "source": item.source,
                        "reason": r.reason,
                        "detail": r.detail,
                    }
                )
    finally:
        result.bytes_in += nbytes
        if own:
            reader.close()
    result.timings["read"] = t_read
    result.timings["transform"] = t_transform
    result.rejects.sort(key=lambda d: d["index"])
    for item, done in zip(items, records, strict=True):
        if done is not None:
            yield item, done[0], done[1]


def _image_sizes(
    members: list[dict[str, bytes]], found: list[dict[str, tuple[int, int]]]
) -> list[list[int]]:
    """Widths and heights of each sample's image member (``member_image_sizes``), taken from
    what the transform found where it opened the image, else read from the header."""
    widths, heights = [], []
    for m, sizes in zip(members, found, strict=True):
        ext = next((e for e in LOADER_IMAGE_EXTS if e in m), None)
        w, h = (0, 0) if ext is None else sizes.get(ext) or image_size(m[ext])
        widths.append(w)
        heights.append(h)
    return [widths, heights]


def _nbytes(record: dict) -> int:
    n = 0
    for v in record.values():
        if isinstance(v, bytes | str):
            n += len(v)
    return n


def _member(kind: str, value: Any) -> bytes:
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if kind == "float":
        return repr(float(value)).encode()
    return str(value).encode("utf-8")


def _tokenize(spec: TaskSpec, samples: list[tuple[Item, dict]], result: ShardResult) -> pa.Table:
    """The shard's documents as packed token rows; an empty document, or one the tokenizer
    refuses, is a counted reject."""
    field_name = spec.text_field or "txt"
    docs, ids = [], []
    for it, rec in samples:
        text = rec.get(field_name)
        if not text:
            result.rejects.append(empty_field(it.index, it.source, field_name))
            continue
        docs.append(str(text))
        ids.append(it.index)
    return _pack(spec, docs, ids, cache(lambda: {it.index: it.source for it, _ in samples}), result)


def _tokenize_rows(spec: TaskSpec, job: ShardJob, result: ShardResult) -> pa.Table:
    """``_tokenize`` of a table whose one field is the text: the documents straight from
    the items' rows (``table_texts``), the same texts and rejects, no record per item."""
    rows = item_rows(job.items)
    t0 = time.perf_counter()
    docs, ids, rejects, result.bytes_in = table_texts(rows, spec.text_field or "", spec.transform)
    result.rejects += rejects
    result.timings.update(read=time.perf_counter() - t0, transform=0.0)
    return _pack(spec, docs, ids, cache(lambda: {r[0]: r[1] for r in rows}), result)


def _pack(
    spec: TaskSpec,
    docs: list[str],
    ids: list[int],
    sources: Callable[[], dict[int, str]],
    result: ShardResult,
) -> pa.Table:
    """``docs`` (named by ``ids``) as packed token rows; one the tokenizer refuses is a
    counted ``unencodable_text`` reject (``sources()``: the source of every id)."""
    packer = shared_packer(
        spec.tokenizer or "",
        seq_len=spec.seq_len or 0,
        eos_token=spec.eos_token,
        packing=spec.packing,
        window=spec.pack_window,
        special_tokens=spec.special_tokens,
    )

    def refused(index: int, why: str) -> None:
        result.rejects.append(
            {"index": index, "source": sources()[index], "reason": "unencodable_text",
             "detail": why}
        )  # fmt: skip

    t0 = time.perf_counter()
    with tokenizer_threads(spec.parallel_tokenizer):
        table, result.stats = packer.pack(docs, ids, on_skip=refused)
    result.timings["tokenize"] = time.perf_counter() - t0
    result.rejects.sort(key=lambda d: d["index"])
    return table


def _arrow_table(spec: TaskSpec, samples: list[tuple[Item, dict]]) -> pa.Table:
    columns: dict[str, Any] = {"__key__": pa.array([f"{it.index:09d}" for it, _ in samples])}
    for name, kind in spec.out_fields.items():
        values = [rec.get(name) for _, rec in samples]
        if kind == "int":
            values = [int(v) if v is not None else None for v in values]
        columns[name] = pa.array(values, type=arrow_type(kind))
    return pa.table(columns)


@dataclass
class _Built:
    """A shard made in memory, not yet uploaded: what ``_finish`` puts and records."""

    result: ShardResult
    path: str | None = None  # None: nothing to upload (every sample was skipped)
    data: bytes = b""
    samples: int = 0
    index: str | None = None


def _encoded(
    spec: TaskSpec,
    result: ShardResult,
    t0: float,
    path: str,
    data: bytes,
    samples: int,
    index: str | None = None,
) -> _Built:
    """The shard's bytes as they will be uploaded (sealed where a key is given)."""
    if spec.encryption is not None:
        data, result.plaintext = seal_shard(data, path, spec.encryption)
    result.timings["encode"] = time.perf_counter() - t0
    return _Built(result, path, data, samples, index)


def _build(
    spec: TaskSpec, job: ShardJob, check: bool = True, reader: SourceReader | None = None
) -> _Built:
    """Read, transform and encode one shard; a finished one from an earlier run or try
    comes back as it is (``result.reused``) where ``check`` asks to look for it."""
    reused = _reusable(spec, job) if check else None
    if reused is not None:
        return _Built(reused)
    result = ShardResult(number=job.number, info=None)
    # a table whose one field is the text to tokenize: no media to read, no other value
    rows_only = spec.tokenizer is not None and spec.source_format in TABLE_EXTS
    rows_only = rows_only and spec.kinds == {spec.text_field: "text"}
    found = [] if rows_only else list(_samples(spec, job, result, reader))
    samples = [(it, rec) for it, rec, _ in found]
    t0 = time.perf_counter()
    table: pa.Table | None = None
    if rows_only:
        table = _tokenize_rows(spec, job, result)
    elif spec.tokenizer is not None:
        table = _tokenize(spec, samples, result)
    elif samples and spec.out_format == "arrow":
        table = _arrow_table(spec, samples)
    if table is not None and table.num_rows:
        path = shard_name(job.number, "arrow")
        return _encoded(spec, result, t0, path, write_arrow(table), table.num_rows)
    if table is None and samples:
        members = [
            (
                f"{it.index:09d}",
                {k: _member(spec.out_fields.get(k, "bytes"), v) for k, v in rec.items()},
            )
            for it, rec in samples
        ]
        data, index, n = tar_shard_bytes(iter(members))
        if any(ext in m for _, m in members for ext in LOADER_IMAGE_EXTS):
            result.image_sizes = _image_sizes([m for _, m in members], [z for *_, z in found])
        if any(ext in m for _, m in members for ext in VIDEO_EXTS):
            result.videos = member_videos([m for _, m in members], probed=True)
        return _encoded(spec, result, t0, shard_name(job.number, "tar"), data, n, index)
    return _Built(result)


def _finish(spec: TaskSpec, job: ShardJob, built: _Built) -> ShardResult:
    """Upload a built shard (index first: the shard's presence implies its index's), then
    its done-record."""
    result = built.result
    if result.reused:
        return result
    if built.path is not None:
        t1 = time.perf_counter()
        opts = spec.ctx.options(spec.dest)
        index_path = None
        if built.index is not None:
            index_path = built.path + ".idx"
            put_object(
                storage.join(spec.dest, index_path), built.index.encode(), storage_options=opts
            )
        put_object(storage.join(spec.dest, built.path), built.data, storage_options=opts)
        result.timings["upload"] = time.perf_counter() - t1
        info = ShardInfo(
            path=built.path,
            samples=built.samples,
            bytes=len(built.data),
            checksum=storage.checksum(built.data),
            index=index_path,
        )
        result.info = asdict(info)
    record = {"fingerprint": job.fingerprint, "result": asdict(result)}
    url = done_url(spec.dest, job.number)
    put_object(
        url, json.dumps(record, sort_keys=True).encode(), storage_options=spec.ctx.options(url)
    )
    return result


def run_shard(spec: TaskSpec, job: ShardJob) -> ShardResult:
    """Build, upload and record one shard; reuse it if a previous run finished it."""
    return _finish(spec, job, _build(spec, job))


def run_shards(spec: TaskSpec, jobs: tuple[ShardJob, ...]) -> list[ShardResult]:
    """``run_shard`` for each job in turn, each shard uploading on a thread while the next
    one is built (the PUT's send holds no GIL): one upload in flight, two shards in memory
    at most. The first failure is raised once the upload in flight has ended.

    Done-records are looked up where the driver found one (``job.recorded``), and from the
    run's first shard on until one is missing: a retried task's first try finished a prefix
    of its run (uploads end in order), so a fresh run asks once per task, not per shard."""
    results: list[ShardResult] = []
    retried = True  # until a shard of this run is found unfinished
    reader = open_reader(spec.source_format, spec.shared)  # one for the run: a text
    # partition parsed for one shard serves the next shards that draw from it
    with ThreadPoolExecutor(1, thread_name_prefix="ff-upload") as uploads, closing(reader):
        pending: Future[ShardResult] | None = None
        for job in jobs:
            with gc_paused():  # a shard's documents: many small objects, no cycles
                built = _build(spec, job, check=retried or job.recorded, reader=reader)
            retried = retried and built.result.reused
            if pending is not None:
                results.append(pending.result())
            pending = uploads.submit(_finish, spec, job, built)
        if pending is not None:
            results.append(pending.result())
    return results
