"""``run(config)``: scan and assign on the driver, one Ray task per shard, commit the
manifest last.

A re-run after a crash reuses every shard whose done-record matches and whose bytes check
out; identical input and config give an identical dataset, byte for byte.
"""

from __future__ import annotations

import io
import json
import pickle
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

import xxhash

from flashfeed import storage
from flashfeed.errors import DatasetExistsError
from flashfeed.format.manifest import delete_manifest, is_committed, manifest_url
from flashfeed.runtime.gcpause import gc_paused
from flashfeed.s3.putobject import list_keys

from .assign import assign_shards, shard_groups
from .commit import IngestResult, commit_run
from .config import IngestConfig
from .progress import Progress
from .raysetup import ray_map, ray_session
from .screening import exact_duplicates, screen_text
from .shardtask import WORK_DIR, ShardJob, ShardResult, TaskSpec, done_url, run_shards
from .sources import Item, SourceScan, StorageContext, scan_source
from .sources.base import ItemRows, item_rows
from .taskerrors import get as get_results
from .tokenize import TokenPacker, shared_packer, text_field
from .transforms import TransformOptions, output_fields

__all__ = ["IngestResult", "run"]


def _fingerprints(
    config: IngestConfig, out_fields: dict[str, str], shards: list[list[tuple[Any, ...]]]
) -> list[tuple[str, bytes | None]]:
    """Per shard, its fingerprint (the run's settings and the shard's item rows) and the rows
    pickled for it, which the shard's job ships as they are (None: not picklable so)."""
    head = json.dumps([config.provenance(), out_fields], sort_keys=True, default=str).encode()
    out = []
    for rows in shards:
        h = xxhash.xxh3_128(head)
        # the rows in one call: a call per item cost more than the encoding itself
        blob = _content_bytes(rows)
        h.update(blob)
        out.append((h.hexdigest(), None if blob.startswith(_JSON) else blob))
    return out


_JSON = b"json:"


def _content_bytes(value: Any) -> bytes:
    """``value`` as bytes that follow its content only: pickled without the memo, so equal
    values give equal bytes however their objects are shared. A ninth of the CPU of the JSON
    it replaces (an item's text is in its ``ref``; on the driver, for every item of a run);
    JSON where pickle refuses a value."""
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=5)
    pickler.fast = True  # no memo: no back-references that depend on object identity
    try:
        pickler.dump(value)
    except (pickle.PicklingError, TypeError, ValueError, AttributeError, RecursionError):
        return _JSON + json.dumps(value, sort_keys=True, default=str).encode()
    return out.getvalue()


def _prepare_dest(config: IngestConfig, ctx: StorageContext) -> None:
    opts = ctx.options(manifest_url(config.dest))
    if not is_committed(config.dest, storage_options=opts):
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
        with gc_paused():  # a corpus's items: many small objects, no cycles
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
        with gc_paused():
            shards = _assign_shards(config, scan, items, ctx, recorded)
        t0 = _lap(phases, "assign", t0)
        results = _dispatch(shards.spec, shards.jobs, config.progress)
        _lap(phases, "shards", t0)
    t0 = time.monotonic()
    result = commit_run(
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
    items: Sequence[Item],
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
        packer = shared_packer(
            config.tokenizer,
            seq_len=config.seq_len or 0,
            eos_token=config.eos_token,
            packing=config.packing,
            window=config.pack_window,
            special_tokens=config.special_tokens,
        )
    # a tar member costs a 512-byte header and up to 511 bytes of padding
    overhead = 768 * len(out_fields) if config.format == "webdataset" else 0
    rows = item_rows(items)  # (index, source, size, ref): no Item per sample on the driver
    groups = assign_shards(
        [r[2] + overhead for r in rows],
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
        special_tokens=config.special_tokens,
    )
    shards = [[rows[p] for p in group] for group in groups]
    jobs = []
    for n, (shard, (fingerprint, packed)) in enumerate(
        zip(shards, _fingerprints(config, out_fields, shards), strict=True)
    ):
        known = recorded is None or done_url(config.dest, n).rsplit("/", 1)[-1] in recorded
        jobs.append(ShardJob(n, ItemRows(shard, packed), fingerprint, known))
    return _ShardJobs(spec, jobs, packer)


@cache
def _shard_task() -> Any:
    """``run_shards`` as a Ray task, retried on storage errors; made once per process: Ray
    exports it at its first call in each session, and a new one each run cost the driver
    its code's disassembly again."""
    import ray

    from flashfeed.errors import StorageError

    retry: Any = {"max_retries": 3, "retry_exceptions": [StorageError]}
    return ray.remote(**retry)(run_shards)


def _dispatch(spec: TaskSpec, jobs: list[ShardJob], mode: str) -> list[ShardResult]:
    """Stage 4: runs of shards as Ray tasks (``shard_groups``), retried on storage errors
    (a retry reuses the shards its first try finished); results in shard order."""
    import ray

    task = _shard_task()
    slots = cpu_slots()
    groups = shard_groups(len(jobs), max(1, len(slots)))
    # fewer runs than CPUs: a run's tokenizer may spread over the CPUs no run holds
    spec = replace(spec, parallel_tokenizer=len(groups) < len(slots))
    spec_ref = ray.put(spec)
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
                group = pending.pop(ref)
                names = f"shards {group[0]}-{group[-1]}" if group else "no shards"
                for r in get_results([ref], stage="shard", where=[names])[0]:
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
