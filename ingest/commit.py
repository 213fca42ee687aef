"""Stage 5 of ingest, on the driver: the rejects file, then the manifest (the commit), then
``_work/`` goes. Every write is one signed PUT where the endpoint allows (``putobject.py``);
a reader sees the old dataset or the new one, never a part.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from flashfeed import storage
from flashfeed.crypto import encryption_record
from flashfeed.format.manifest import Manifest, ShardInfo, commit_manifest
from flashfeed.format.media import IMAGE_MEDIA_TYPES as _MEDIA_TYPES
from flashfeed.format.shardtable import ShardTable
from flashfeed.format.video import VIDEO_MEDIA_TYPES
from flashfeed.s3.putobject import delete_objects, put_object

from .config import IngestConfig
from .shardtask import WORK_DIR, ShardResult, TaskSpec, arrow_type, done_url
from .sources import RejectInfo, SourceScan, StorageContext
from .tokenize import TOKEN_FEATURE, TokenPacker

__all__ = ["REJECTS_NAME", "IngestResult", "commit_run", "drop_work"]

REJECTS_NAME = "rejects.jsonl"
_KIND_TYPES = {
    "text": "text/plain",
    "int": "int",
    "float": "float",
    "json": "application/json",
    "bytes": "application/octet-stream",
    "video": "video",
}


@dataclass
class IngestResult:
    """What a run did: the committed manifest plus how the run went."""

    dest: str
    manifest: Manifest
    source_format: str
    shards_reused: int
    bytes_in: int
    seconds: float
    timings: dict[str, float] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        m = self.manifest
        secs = max(self.seconds, 1e-9)
        return {
            "dest": self.dest,
            "format": m.shard_format,
            "source_format": self.source_format,
            "shards": len(m.shards),
            "shards_reused": self.shards_reused,
            "samples": m.num_samples,
            "bytes_in": self.bytes_in,
            "bytes_out": m.num_bytes,
            "skipped": dict(m.skipped),
            "seconds": round(self.seconds, 3),
            "mb_per_s": round(self.bytes_in / secs / 1e6, 2),
            "samples_per_s": round(m.num_samples / secs, 1),
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
            "phases": {k: round(v, 3) for k, v in self.phases.items()},
            **self._token_counts(),
        }

    def _token_counts(self) -> dict[str, Any]:
        """Of a token dataset: how many documents spelled a special token, and as what it
        was encoded (``text`` or ``special``)."""
        tokens = self.manifest.extra.get("tokens")
        if not isinstance(tokens, dict):
            return {}
        return {
            "documents_with_special_tokens": int(tokens.get("documents_with_special_tokens", 0)),
            "special_tokens": tokens.get("special_tokens", "special"),
        }


def _schema(
    config: IngestConfig, out_fields: dict[str, str], packer: TokenPacker | None
) -> dict[str, str]:
    if packer is not None:
        return packer.schema
    if config.format == "arrow":
        return {"__key__": "string", **{n: str(arrow_type(k)) for n, k in out_fields.items()}}
    return {
        n: {**_MEDIA_TYPES, **VIDEO_MEDIA_TYPES}.get(
            n.rsplit(".", 1)[-1], _KIND_TYPES.get(k, "application/octet-stream")
        )
        for n, k in out_fields.items()
    }


def drop_work(dest: str, names: set[str], opts: dict[str, Any] | None) -> None:
    """Remove ``<dest>/_work/`` after the commit, its done-records by ``names`` (the ones
    found before the run and the run's own: no second listing): on S3 one bulk delete per
    1,000 (signed where it can be), locally file by file and then the folder."""
    work = storage.join(dest, WORK_DIR)
    urls = [storage.join(work, n) for n in sorted(names)]
    if not urls:
        return
    if delete_objects(urls, storage_options=opts):
        return
    if not storage.is_local(work):
        fs, _ = storage.filesystem(work, opts)
        paths = [storage.filesystem(u, opts)[1] for u in urls]
        storage.call(lambda: fs.rm(paths), url=work, what="delete", storage_options=opts)
        return
    for url in urls:
        with contextlib.suppress(FileNotFoundError):
            storage.delete(url, storage_options=opts)
    if storage.is_local(work):
        _, path = storage.filesystem(work)
        with contextlib.suppress(OSError):
            os.rmdir(path)


def commit_run(
    config: IngestConfig,
    scan: SourceScan,
    spec: TaskSpec,
    packer: TokenPacker | None,
    results: list[ShardResult],
    scan_rejects: list[RejectInfo],
    ctx: StorageContext,
    start: float,
    near_dup: dict[str, Any] | None = None,
    recorded: set[str] = frozenset(),  # type: ignore[assignment]
) -> IngestResult:
    """Stage 5: rejects, then the manifest (the commit), then ``_work/`` goes; every write
    a single signed PUT where the endpoint allows (``put_object``)."""
    rejects = [r.to_dict() for r in scan_rejects]
    for r in results:
        rejects += r.rejects
    rejects.sort(key=lambda d: (d["index"], d["source"]))
    skipped = dict(sorted(Counter(d["reason"] for d in rejects).items()))
    infos = tuple(info for r in results if (info := r.shard_info()) is not None)
    shards: tuple[ShardInfo, ...] | ShardTable = infos
    sized = [r.image_sizes for r in results if r.info is not None]
    if any(s is not None for s in sized):  # image widths and heights for the loader
        shards = ShardTable.from_infos(infos).with_image_sizes(
            [s[0] if s else None for s in sized], [s[1] if s else None for s in sized]
        )
    videos = [r.videos for r in results if r.info is not None]
    if any(v is not None for v in videos):  # each video's probe, for plans and reports
        shards = shards if isinstance(shards, ShardTable) else ShardTable.from_infos(infos)
        shards = shards.with_videos(videos)
    if not shards:
        reasons = ", ".join(f"{k}: {v}" for k, v in skipped.items()) or "no samples"
        raise ValueError(
            f"nothing to commit from {config.source}: every sample was skipped ({reasons})"
        )
    extra: dict[str, Any] = {}
    dest_opts = ctx.options(config.dest)
    if rejects:
        body = "".join(json.dumps(d, sort_keys=True) + "\n" for d in rejects)
        put_object(
            storage.join(config.dest, REJECTS_NAME), body.encode(), storage_options=dest_opts
        )
        extra["rejects"] = REJECTS_NAME
    if packer is not None:
        totals: Counter[str] = Counter()
        for r in results:
            totals.update(r.stats)
        extra["tokens"] = {
            "seq_len": packer.seq_len,
            "dtype": packer.dtype.__name__,
            "eos_id": packer.eos_id,
            "pad_id": packer.pad_id,
            "packing": packer.options.mode,
            "vocab_size": packer.vocab_size,
            "field": spec.text_field,
            "special_tokens": packer.specials.mode,
            **dict(sorted(totals.items())),
        }
    if near_dup is not None:
        extra["near_dup"] = near_dup
    if spec.encryption is not None:
        plaintext = {r.info["path"]: r.plaintext for r in results if r.info and r.plaintext}
        extra["encryption"] = encryption_record(spec.encryption, plaintext)
    name = config.name or config.dest.rstrip("/").rsplit("/", 1)[-1] or "dataset"
    manifest = Manifest(
        name=name,
        shard_format=config.format,
        schema=_schema(config, spec.out_fields, packer),
        shards=shards,
        skipped=skipped,
        source={"url": config.source, "format": scan.format, **scan.description},
        config=config.provenance(),
        classes=scan.classes,
        extra=extra,
        requires=(TOKEN_FEATURE,) if packer is not None else (),
    )
    commit_manifest(
        config.dest, manifest, overwrite=config.overwrite, storage_options=dest_opts,
        put=put_object,
    )  # fmt: skip
    names = set(recorded) | {done_url(config.dest, r.number).rsplit("/", 1)[-1] for r in results}
    drop_work(config.dest, names, dest_opts)
    timings: Counter[str] = Counter()
    for r in results:
        timings.update(r.timings)
    return IngestResult(
        dest=config.dest,
        manifest=manifest,
        source_format=scan.format,
        shards_reused=sum(r.reused for r in results),
        bytes_in=sum(r.bytes_in for r in results),
        seconds=time.monotonic() - start,
        timings=dict(timings),
    )
