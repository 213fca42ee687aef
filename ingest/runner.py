"""``run(config)``: scan and assign on the driver, one Ray task per shard, commit the
manifest last.

A re-run after a crash reuses every shard whose done-record matches and whose bytes check
out; identical input and config give an identical dataset, byte for byte.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import xxhash

from flashfeed import storage
from flashfeed.crypto import encryption_record
from flashfeed.errors import DatasetExistsError
from flashfeed.manifest import (
    Manifest,
    ShardInfo,
    commit_manifest,
    delete_manifest,
    manifest_url,
)
from flashfeed.media import IMAGE_MEDIA_TYPES as _MEDIA_TYPES
from flashfeed.shardtable import ShardTable
from flashfeed.video import VIDEO_MEDIA_TYPES

from .assign import assign_shards, shard_groups
from .config import IngestConfig
from .progress import Progress
from .putobject import delete_objects, list_keys, put_object
from .raysetup import ray_map, ray_session
from .screening import exact_duplicates, screen_text
from .shardtask import (
    WORK_DIR,
    ShardJob,
    ShardResult,
    TaskSpec,
    arrow_type,
    done_url,
    run_shards,
)
from .sources import Item, RejectInfo, SourceScan, StorageContext, scan_source
from .tokenize import TOKEN_FEATURE, TokenPacker, text_field
from .transforms import TransformOptions, output_fields

__all__ = ["IngestResult", "run"]

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
        }


def _fingerprint(config: IngestConfig, out_fields: dict[str, str], items: list[Item]) -> str:
    h = xxhash.xxh3_128()
    h.update(json.dumps([config.provenance(), out_fields], sort_keys=True, default=str).encode())
    for it in items:
        h.update(
            json.dumps([it.index, it.source, it.size, it.ref], sort_keys=True, default=str).encode()
        )
    return h.hexdigest()


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


def _prepare_dest(config: IngestConfig, ctx: StorageContext) -> None:
    url = manifest_url(config.dest)
    opts = ctx.options(url)
    try:
        storage.head(url, storage_options=opts)  # one HEAD, signed where it can be
    except FileNotFoundError:
        return
    if not config.overwrite:
        raise DatasetExistsError(
            f"a committed dataset already exists at {config.dest}; datasets are "
            "immutable: write to a new prefix, or pass --overwrite"
        )
    delete_manifest(config.dest, storage_options=opts)  # and the shard table it names


def run(config: IngestConfig) -> IngestResult:
    """Ingest ``config.source`` into a committed dataset at ``config.dest``: scan, dedup,
    assign shards, dispatch one task per shard, commit. ``phases`` times each stage."""
    if not isinstance(config, IngestConfig):
        raise TypeError(f"run() takes an IngestConfig, got {type(config).__name__}")
    start = time.monotonic()
    ctx = StorageContext.resolve(config.storage_options)
    _prepare_dest(config, ctx)
    phases: dict[str, float] = {}
    t0 = _lap(phases, "prepare", start)
    with ray_session(address=config.ray_address, num_cpus=config.num_cpus):
        t0 = _lap(phases, "ray_start", t0)
        scan = _scan(config, ctx)
        t0 = _lap(phases, "scan", t0)
        items, rejects = scan.items, list(scan.rejects)
        if config.dedup:
            items, dup_rejects = exact_duplicates(scan, ctx)
            rejects += dup_rejects
            t0 = _lap(phases, "dedup", t0)
        near_dup: dict[str, Any] | None = None
        if config.near_dup_threshold is not None or config.quality_filter is not None:
            items, near_dup = screen_text(
                config, scan, items, rejects, ctx, phases, _transform_options(config)
            )
            t0 = _lap(phases, "neardup", t0)
        recorded = _recorded(config.dest, ctx)
        shards = _assign_shards(config, scan, items, ctx, recorded)
        t0 = _lap(phases, "assign", t0)
        results = _dispatch(shards.spec, shards.jobs, config.progress)
        _lap(phases, "shards", t0)
    t0 = time.monotonic()
    result = _commit(
        config, scan, shards.spec, shards.packer, results, rejects, ctx, start, near_dup,
        recorded,
    )  # fmt: skip
    _lap(phases, "commit", t0)
    result.phases = phases
    result.seconds = time.monotonic() - start
    return result


def _lap(phases: dict[str, float], name: str, since: float) -> float:
    """Record the time since ``since`` as phase ``name``; the start of the next phase."""
    now = time.monotonic()
    phases[name] = now - since
    return now


def _transform_options(config: IngestConfig) -> TransformOptions:
    return TransformOptions(
        validate=config.validate,
        max_pixels=config.max_pixels,
        max_image_side=config.max_image_side,
        jpeg_quality=config.jpeg_quality,
        keep_original_size=config.keep_original_size,
        normalize_text=config.normalize_text,
    )


def _scan(config: IngestConfig, ctx: StorageContext) -> SourceScan:
    """Stage 1: list the source on the driver (per-file scans as Ray tasks)."""
    scan = scan_source(
        config.source,
        config.source_format,
        ctx,
        fields=config.fields,
        options=config.source_options,
        mapper=ray_map,
    )
    if not scan.items:
        raise ValueError(f"source {config.source} holds no samples")
    return scan


@dataclass(frozen=True)
class _ShardJobs:
    """Stage 3's output: what every task shares, one job per shard, the token packer."""

    spec: TaskSpec
    jobs: list[ShardJob]
    packer: TokenPacker | None


def _recorded(dest: str, ctx: StorageContext) -> set[str]:
    """The names of the done-records an earlier run left under ``<dest>/_work/``: one
    listing (signed where it can be), so that shard tasks look up only these (and a retry
    its own), and the commit deletes them by name."""
    work = storage.join(dest, WORK_DIR)
    opts = ctx.options(dest)
    urls = list_keys(work, storage_options=opts)
    if urls is None:
        urls = storage.list_files(work, storage_options=opts)
    return {u.rsplit("/", 1)[-1] for u in urls}


def _assign_shards(
    config: IngestConfig,
    scan: SourceScan,
    items: list[Item],
    ctx: StorageContext,
    recorded: set[str] | None = None,
) -> _ShardJobs:
    """Stage 3: the output fields, the items of each shard, and each shard's fingerprint;
    ``recorded``: the done-records found (None: look for every shard's)."""
    opts = _transform_options(config)
    out_fields = output_fields(scan.fields, opts)
    packer = None
    txt = None
    if config.tokenizer is not None:
        txt = text_field(out_fields)
        packer = TokenPacker(
            config.tokenizer,
            seq_len=config.seq_len or 0,
            eos_token=config.eos_token,
            packing=config.packing,
            window=config.pack_window,
        )
    # a tar member costs a 512-byte header and up to 511 bytes of padding
    overhead = 768 * len(out_fields) if config.format == "webdataset" else 0
    groups = assign_shards(
        [it.size + overhead for it in items],
        target_bytes=config.shard_bytes,
        samples_per_shard=config.samples_per_shard,
        seed=config.seed,
        shuffle=config.shuffle,
    )
    spec = TaskSpec(
        dest=config.dest,
        source_format=scan.format,
        out_format=config.format,
        kinds=scan.fields,
        out_fields=out_fields,
        transform=opts,
        shared=scan.shared,
        ctx=ctx,
        tokenizer=config.tokenizer,
        seq_len=config.seq_len,
        eos_token=config.eos_token,
        packing=config.packing,
        pack_window=config.pack_window,
        text_field=txt,
        encryption=config.encryption_key(),
    )
    jobs = []
    for n, group in enumerate(groups):
        shard_items = [items[p] for p in group]
        known = recorded is None or done_url(config.dest, n).rsplit("/", 1)[-1] in recorded
        jobs.append(
            ShardJob(n, tuple(shard_items), _fingerprint(config, out_fields, shard_items), known)
        )
    return _ShardJobs(spec, jobs, packer)


def _dispatch(spec: TaskSpec, jobs: list[ShardJob], mode: str) -> list[ShardResult]:
    """Stage 4: runs of shards as Ray tasks (``shard_groups``), retried on storage errors
    (a retry reuses the shards its first try finished); results in shard order."""
    import ray

    from flashfeed.errors import StorageError

    retry: Any = {"max_retries": 3, "retry_exceptions": [StorageError]}
    task = ray.remote(**retry)(run_shards)
    spec_ref = ray.put(spec)
    slots = cpu_slots()
    groups = shard_groups(len(jobs), max(1, len(slots)))
    pending = {
        task.options(scheduling_strategy=_on(slots, k)).remote(
            spec_ref, tuple(jobs[i] for i in g)
        ): g
        for k, g in enumerate(groups)
    }
    progress = Progress(len(jobs), mode=mode)
    results: list[ShardResult] = []
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                pending.pop(ref)
                for r in ray.get(ref):
                    results.append(r)
                    progress.update(
                        samples=r.info["samples"] if r.info else 0,
                        nbytes=r.bytes_in,
                        skipped=len(r.rejects),
                        reused=r.reused,
                    )
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    finally:
        progress.close()
    return sorted(results, key=lambda r: r.number)


def cpu_slots() -> list[str]:
    """One entry per CPU of each live node (its node id), node after node. Runs of shards
    are as few as CPUs, so each is placed on a slot in turn: left to the scheduler, two runs
    could queue on the driver's node while another node idled."""
    import ray

    cpus = {
        n["NodeID"]: int(n.get("Resources", {}).get("CPU", 0))
        for n in ray.nodes()
        if n.get("Alive")
    }
    # node after node, a CPU of each at a time: fewer runs than CPUs still spread over nodes
    return [node for c in range(max(cpus.values(), default=0)) for node, n in cpus.items() if n > c]


def _on(slots: list[str], k: int) -> Any:
    """Run ``k`` on slot ``k`` (soft: anywhere else if that node is gone), or anywhere."""
    if not slots:
        return "DEFAULT"
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(slots[k % len(slots)], soft=True)


def _drop_work(dest: str, names: set[str], opts: dict[str, Any] | None) -> None:
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


def _commit(
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
    _drop_work(config.dest, names, dest_opts)
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
