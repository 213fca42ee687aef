"""``flashfeed index``: adopt uncompressed tar shards written by other tools.

WebDataset's ShardWriter, Ray's ``write_webdataset`` and GNU tar all write plain tars of
``<key>.<ext>`` members. Indexing writes a DALI ``.idx`` beside each tar and a manifest
(schema inferred from the extensions), after which the prefix is a flashfeed dataset.
Compressed tars cannot be indexed: DALI and random access need byte offsets into the tar.
"""

from __future__ import annotations

import io
import posixpath
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from flashfeed import storage
from flashfeed.errors import CorruptShardError, DatasetExistsError, FlashfeedError
from flashfeed.format.manifest import Manifest, ShardInfo, commit_manifest, manifest_url
from flashfeed.format.media import IMAGE_MEDIA_TYPES, LOADER_IMAGE_EXTS, member_image_sizes
from flashfeed.format.shardtable import ShardTable
from flashfeed.format.tarshard import scan_index
from flashfeed.format.video import VIDEO_EXTS, member_videos
from flashfeed.format.wdsindex import SampleIndex, format_index

__all__ = [
    "COMPRESSED_SUFFIXES",
    "CompressedShardError",
    "IndexReport",
    "NoShardsError",
    "index_dataset",
    "media_type",
]

COMPRESSED_SUFFIXES = (".tgz", ".tar.gz", ".taz", ".tar.bz2", ".tbz2", ".tar.xz", ".tar.zst")

RESHARD_HINT = (
    "flashfeed index reads uncompressed tars only (DALI and random access need byte offsets "
    "into the tar); re-shard them into a new prefix with "
    "`flashfeed ingest {prefix} DEST --source-format webdataset`"
)

_MEDIA_TYPES = {
    **IMAGE_MEDIA_TYPES,
    "ppm": "image/x-portable-pixmap",
    "pgm": "image/x-portable-graymap",
    "cls": "text/plain",
    "cls2": "text/plain",
    "index": "text/plain",
    "inx": "text/plain",
    "id": "text/plain",
    "txt": "text/plain",
    "text": "text/plain",
    "json": "application/json",
    "jsn": "application/json",
    "mp": "application/msgpack",
    "msgpack": "application/msgpack",
    "npy": "application/x-npy",
    "npz": "application/x-npz",
    "ten": "application/x-webdataset-tensor",
    "pth": "application/x-pytorch",
    "pyd": "application/python-pickle",
    "pickle": "application/python-pickle",
    "gz": "application/gzip",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "wav": "audio/wav",
    "mp4": "video/mp4",
    "webm": "video/webm",
}
_GZIP_MAGIC = b"\x1f\x8b"

#: one shard's image widths and heights, one entry per sample (None: no image members)
_Sizes = tuple[list[int], list[int]] | None
#: one shard's video probes, one entry per sample (None: no video members)
_Videos = list[dict[str, Any] | None] | None


class CompressedShardError(FlashfeedError, ValueError):
    """Compressed tar shards were found where uncompressed ones are needed."""


class NoShardsError(FlashfeedError, ValueError):
    """A prefix holds no tar shards to index."""


def media_type(ext: str) -> str:
    """The manifest schema's media type for a member extension: ``"seg.png"`` -> image/png.

    The last dotted part decides (``txt.gz`` is gzip data); unknown ones are opaque bytes.
    """
    return _MEDIA_TYPES.get(ext.rsplit(".", 1)[-1].lower(), "application/octet-stream")


@dataclass(frozen=True)
class IndexReport:
    """What ``index_dataset`` committed, and the tars it left out because they were empty."""

    url: str
    manifest_url: str
    manifest: Manifest
    empty: tuple[str, ...] = ()


def index_dataset(
    prefix: str,
    *,
    name: str | None = None,
    overwrite: bool = False,
    workers: int = 4,
    storage_options: dict[str, Any] | None = None,
    on_shard: Callable[[ShardInfo], None] | None = None,
) -> IndexReport:
    """Index every uncompressed ``*.tar`` under ``prefix`` and commit a manifest there.

    Raises ``CompressedShardError`` if compressed tars are present (nothing is written then),
    ``NoShardsError`` if there is no tar, ``DatasetExistsError`` if a manifest is already
    committed and ``overwrite`` is false, ``CorruptShardError`` naming a broken tar.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    prefix = prefix.rstrip("/")
    if not overwrite and storage.exists(manifest_url(prefix), storage_options=storage_options):
        raise DatasetExistsError(
            f"{prefix} already holds a committed dataset ({manifest_url(prefix)}); "
            "pass --overwrite (overwrite=True) to re-index it"
        )
    rel_paths = _relative_files(prefix, storage_options)
    compressed = [p for p in rel_paths if p.lower().endswith(COMPRESSED_SUFFIXES)]
    if compressed:
        raise CompressedShardError(_compressed_message(prefix, compressed))
    tars = [p for p in rel_paths if p.endswith(".tar")]
    if not tars:
        raise NoShardsError(
            f"no *.tar shards found under {prefix}; check the prefix (shards may lie in "
            "sub-folders, which are searched too)"
        )

    def one(path: str) -> tuple[str, ShardInfo | None, set[str], _Sizes, _Videos]:
        info, exts, sizes, videos = _index_one(prefix, path, storage_options)
        if info is not None and on_shard is not None:
            on_shard(info)
        return path, info, exts, sizes, videos

    with ThreadPoolExecutor(max_workers=min(workers, len(tars))) as pool:
        results = list(pool.map(one, tars))
    kept = [(info, sizes, videos) for _, info, _, sizes, videos in results if info is not None]
    empty = tuple(path for path, info, _, _, _ in results if info is None)
    if not kept:
        raise NoShardsError(f"every tar under {prefix} is empty: {', '.join(empty)}")
    exts = set().union(*(e for _, _, e, _, _ in results))
    table = ShardTable.from_infos(info for info, _, _ in kept)
    if any(s is not None for _, s, _ in kept):  # some image members: record their sizes
        table = table.with_image_sizes(
            [s[0] if s else None for _, s, _ in kept], [s[1] if s else None for _, s, _ in kept]
        )
    if any(v is not None for _, _, v in kept):  # some video members: record their probes
        table = table.with_videos([v for _, _, v in kept])
    manifest = Manifest(
        name=name or posixpath.basename(prefix) or "dataset",
        shard_format="webdataset",
        schema={ext: media_type(ext) for ext in sorted(exts)},
        shards=table,
        source={"kind": "external-tars", "prefix": prefix, "indexed_by": "flashfeed index"},
        config={},
        extra={"empty_tars": list(empty)} if empty else {},
    )
    url = commit_manifest(prefix, manifest, overwrite=overwrite, storage_options=storage_options)
    return IndexReport(url=prefix, manifest_url=url, manifest=manifest, empty=empty)


def _compressed_message(prefix: str, compressed: Sequence[str]) -> str:
    shown = ", ".join(compressed[:5]) + (
        f" and {len(compressed) - 5} more" if len(compressed) > 5 else ""
    )
    return f"{prefix} holds compressed tar shards ({shown}); " + RESHARD_HINT.format(prefix=prefix)


def _relative_files(prefix: str, storage_options: dict[str, Any] | None) -> list[str]:
    """Every file under the prefix as a path relative to it; hidden and temporary files out."""
    _, base = storage.filesystem(prefix, storage_options)
    base = base.rstrip("/")
    out = []
    for url in storage.list_files(prefix, storage_options=storage_options):
        _, path = storage.filesystem(url, storage_options)
        if not path.startswith(base + "/"):
            continue
        rel = path[len(base) + 1 :]
        if any(part.startswith(".") for part in rel.split("/")):
            continue
        out.append(rel)
    return sorted(out)


def _index_one(
    prefix: str, path: str, storage_options: dict[str, Any] | None
) -> tuple[ShardInfo | None, set[str], _Sizes, _Videos]:
    url = storage.join(prefix, path)
    data = storage.read_bytes(url, storage_options=storage_options)
    if data[:2] == _GZIP_MAGIC:
        raise CompressedShardError(
            f"{url} is gzip-compressed although it is named .tar; "
            + RESHARD_HINT.format(prefix=prefix)
        )
    samples = scan_index(io.BytesIO(data), source=url)
    _check_unique_keys(samples, url)
    if not samples:
        return None, set(), None, None
    index_path = path + ".idx"
    storage.write_bytes(
        storage.join(prefix, index_path),
        format_index(samples).encode(),
        storage_options=storage_options,
    )
    exts = {c.ext for s in samples for c in s.components}
    info = ShardInfo(
        path=path,
        samples=len(samples),
        bytes=len(data),
        checksum=storage.checksum(data),
        index=index_path,
    )
    return info, exts, _image_sizes(samples, data, exts), _videos(samples, data, exts)


def _image_sizes(samples: Sequence[SampleIndex], data: bytes, exts: set[str]) -> _Sizes:
    """Each sample's image width and height, read from the image headers (None when the
    shard holds no image member)."""
    if not exts & set(LOADER_IMAGE_EXTS):
        return None
    view = memoryview(data)
    members = [{c.ext: view[c.offset : c.offset + c.size] for c in s.components} for s in samples]
    return member_image_sizes(members)


def _videos(samples: Sequence[SampleIndex], data: bytes, exts: set[str]) -> _Videos:
    """Each sample's video probe (PyAV, demuxing only; None where unreadable), or None when
    the shard holds no video member. Without PyAV nothing is recorded."""
    if not exts & set(VIDEO_EXTS):
        return None
    try:
        import av  # noqa: F401
    except ImportError:
        return None
    view = memoryview(data)
    members = [{c.ext: view[c.offset : c.offset + c.size] for c in s.components} for s in samples]
    return member_videos(members)


def _check_unique_keys(samples: Sequence[SampleIndex], url: str) -> None:
    seen: set[str] = set()
    for s in samples:
        if s.key in seen:
            raise CorruptShardError(
                f"{url}: sample key {s.key!r} appears twice (its members are not adjacent); "
                "re-shard it with `flashfeed ingest --source-format webdataset`"
            )
        seen.add(s.key)
        exts = [c.ext for c in s.components]
        if len(set(exts)) != len(exts):
            raise CorruptShardError(f"{url}: sample {s.key!r} has two members of one extension")
